"""Decompression bombs and valid images of every decoded format, built by the tests.

Each bomb is a small file whose header claims a huge image: a decoder allocates what
the header says, so these cost hundreds of MB to GBs if anything decodes them.
"""
import functools
import importlib.util
import io
import os
import struct
import zlib

import numpy as np
from PIL import Image


def jpeg_bomb(side=13000):
    """A real 16x16 JPEG whose frame header (SOF0) is patched to claim side x side."""
    buffer = io.BytesIO()
    Image.fromarray(np.full((16, 16, 3), 128, np.uint8)).save(buffer, "JPEG", quality=90)
    data = bytearray(buffer.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", side, side)  # height, width
    return bytes(data)


def _png_chunk(kind, payload):
    return (struct.pack(">I", len(payload)) + kind + payload
            + struct.pack(">I", zlib.crc32(kind + payload) & 0xffffffff))


def png_bomb(side=16000):
    """A valid 1-bit greyscale PNG of side x side black pixels (~30 KB): its zlib stream
    really inflates to 32 MB, and a decoder asked for RGB allocates side*side*3 bytes."""
    row = b"\x00" * (1 + (side + 7) // 8)  # filter byte + packed bits
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", idat)
            + _png_chunk(b"IEND", b""))


def gif_bomb(side=60000):
    """A GIF whose logical screen claims side x side (every output frame has that size)."""
    return b"GIF89a" + struct.pack("<HHBBB", side, side, 0, 0, 0) + b"\x3b"


def gif_frames_bomb(side=6000, frames=2):
    """A GIF whose screen says 16x16 but whose frames each claim side x side (the GIF
    library allocates every frame at its own size; TensorFlow then outputs the first
    at that size). Each frame holds one pixel of LZW data (clear, 0, end)."""
    frame = (b"\x2c" + struct.pack("<HHHHB", 0, 0, side, side, 0)
             + b"\x02" + b"\x02\x44\x01" + b"\x00")
    return (b"GIF89a" + struct.pack("<HHBBB", 16, 16, 0x80, 0, 0) + b"\x00" * 6
            + frame * frames + b"\x3b")


def bmp_bomb(side=20000):
    """A BMP header claiming side x side, top-down (negative height), 24 bits."""
    info = struct.pack("<IiiHHIIiiII", 40, side, -side, 1, 24, 0, 0, 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(info), 0, 0, 14 + len(info)) + info


BOMBS = {"jpeg": (jpeg_bomb, "13000x13000"), "png": (png_bomb, "16000x16000"),
         "gif": (gif_bomb, "60000x60000"), "gif_frames": (gif_frames_bomb, "16x16"),
         "bmp": (bmp_bomb, "20000x20000")}


def encode(pixels, image_format, **options):
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, image_format, **options)
    return buffer.getvalue()


@functools.lru_cache(maxsize=1)
def _china():
    # scikit-learn's bundled photograph (640x427), read without importing scikit-learn.
    package = importlib.util.find_spec("sklearn").submodule_search_locations[0]
    return np.asarray(Image.open(os.path.join(package, "datasets", "images", "china.jpg"))
                      .convert("RGB"))


def photo(width=500, height=375):
    """A crop of a real photograph, uint8 RGB."""
    return np.ascontiguousarray(_china()[:height, :width])


def circle(width=500, height=375, radius=120):
    """A white disc centred on a black width x height image, uint8 RGB."""
    y, x = np.mgrid[:height, :width]
    inside = (x - (width - 1) / 2) ** 2 + (y - (height - 1) / 2) ** 2 <= radius ** 2
    return np.repeat((inside * 255).astype(np.uint8)[..., None], 3, axis=2)
