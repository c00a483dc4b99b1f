"""Reads one image file for the dataset builders and turns it into the RGB JPEG that
training reads, with the pixels the serving graph would decode from the same file.

The serving graph decodes with `tf.io.decode_image(channels=3)`, which drops alpha
(never composites), shifts 16-bit samples right by 8, expands palettes, and paints a
GIF's transparent pixels black. `serving_rgb` reproduces that with Pillow (checked
pixel-exactly against TensorFlow in tests/test_converter_pixels.py), so a model never
trains on pixels it will not be served. JPEGs TensorFlow decodes itself (RGB,
grayscale, CMYK; baseline, extended or progressive Huffman, 8-bit) are kept
byte-for-byte, so training decodes them exactly as serving does.

Only regular files up to `max_file_bytes` are read: a FIFO would block forever and
`/dev/zero` would fill memory. `convert_file` (path), `convert_read` (any reader,
such as Beam's filesystems for gs://) and `convert_bytes` (bytes) are pure; the first
two return every problem as a skip reason (a string naming what is wrong) in a
picklable ImageResult, never as an exception, so they suit process pools and Apache
Beam workers. Free of TensorFlow so that worker processes start fast and fork safely.
"""
import collections
import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from slimserve import regular_files

# Larger than any camera JPEG or 8-bit PNG of a 50-megapixel photo (~25-50 MB), small
# enough that a pool of workers holding one file each plus its decoded pixels stays
# within a laptop's memory. A hostile or mistaken input (a disk image named .jpg)
# is skipped instead of read.
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024

# Pixel modes whose samples are 16 bits wide: mapped as TF maps a 16-bit PNG (>> 8).
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
# JPEG frames TF's libjpeg decodes: SOF0 baseline, SOF1 extended, SOF2 progressive.
_TF_JPEG_FRAMES = (0xC0, 0xC1, 0xC2)
# Pillow names camera JPEGs with extra pictures (multi-picture format) "MPO".
_JPEG_FORMATS = ("JPEG", "MPO")
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}

LoadedImage = collections.namedtuple(
    "LoadedImage", "encoded height width converted note")
LoadedImage.__doc__ = """A converted image: `encoded` RGB JPEG bytes, its size, whether
it was re-encoded, and `note` (None, or why serving this original file would decode
differently, e.g. a format TF cannot decode)."""

ImageResult = collections.namedtuple("ImageResult", "image skip_reason")
ImageResult.__doc__ = """Exactly one of `image` (a LoadedImage) or `skip_reason` (str)."""


class SkippedImage(Exception):
    """An input file that cannot become a training example; the message is the reason."""


def read_file(path, max_file_bytes=DEFAULT_MAX_FILE_BYTES):
    """The bytes of `path` if it is a regular file of at most `max_file_bytes` bytes;
    SkippedImage with the reason otherwise (slimserve/regular_files.py, which bulk
    inference shares)."""
    try:
        return regular_files.read_regular(path, max_file_bytes)
    except regular_files.NotReadable as reason:
        raise SkippedImage(str(reason)) from None


def shrunk_size(width, height, max_shorter_side):
    """(width, height) with the shorter side at most `max_shorter_side`, aspect kept."""
    shorter = min(width, height)
    if not max_shorter_side or shorter <= max_shorter_side:
        return width, height
    scale = max_shorter_side / float(shorter)
    return (max(1, int(round(width * scale))), max(1, int(round(height * scale))))


def _jpeg_frame(data):
    """(SOF marker, sample precision) of a JPEG stream, or (None, None)."""
    position = 2
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            return None, None
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:
            position += 2
            continue
        length = int.from_bytes(data[position + 2:position + 4], "big")
        if marker in _SOF_MARKERS:
            precision = data[position + 4] if position + 4 < len(data) else None
            return marker, precision
        position += 2 + length
    return None, None


def tf_decodes_jpeg_as_is(data, image):
    """Whether TF's decoder reads this JPEG itself (so its bytes can be kept)."""
    if image.format not in _JPEG_FORMATS or image.mode not in ("RGB", "L", "CMYK"):
        return False
    marker, precision = _jpeg_frame(data)
    return marker in _TF_JPEG_FRAMES and precision == 8


def serving_rgb(image):
    """8-bit RGB with the pixels `tf.io.decode_image(channels=3)` gives for the same
    file, or for formats TF cannot decode, what it gives for the same samples in a PNG.

    Raises SkippedImage for sample types no TF-decodable format can hold.
    """
    mode = image.mode
    if mode in _SIXTEEN_BIT_MODES:
        return _grey16_to_rgb(np.asarray(image))
    if mode == "I":
        values = np.asarray(image)
        if values.size and (values.min() < 0 or values.max() > 0xFFFF):
            raise SkippedImage(
                "32-bit integer samples outside 0..65535 (mode I, range %d..%d): no "
                "8-bit mapping that serving shares; save it with 8- or 16-bit samples"
                % (values.min(), values.max()))
        return _grey16_to_rgb(values)
    if mode == "F":
        raise SkippedImage("floating-point samples (mode F): no 8-bit mapping that "
                           "serving shares; save it with 8- or 16-bit samples")
    if image.format == "GIF" and mode in ("P", "L") and "transparency" in image.info:
        # TF's GIF decoder leaves transparent pixels of the first frame black.
        transparent = np.asarray(image) == image.info["transparency"]
        pixels = np.array(image.convert("RGB"))
        pixels[transparent] = 0
        return Image.fromarray(pixels, "RGB")
    if mode == "RGB":
        return image
    try:
        # Alpha is dropped, not composited: TF decodes RGBA with channels=3 the same way.
        return image.convert("RGB")
    except (ValueError, OSError) as error:
        raise SkippedImage("pixel mode %s cannot become RGB: %s" % (mode, error)) from None


def _grey16_to_rgb(values):
    grey = (values.astype(np.uint32) >> 8).astype(np.uint8)
    return Image.fromarray(np.repeat(grey[:, :, None], 3, axis=2), "RGB")


def _serving_note(image):
    """Why serving the original file would see different pixels, or None."""
    if image.format not in _JPEG_FORMATS + ("PNG", "GIF", "BMP"):
        return "TF cannot decode %s; send JPEG or PNG to the served model" % image.format
    extent = getattr(image, "dispose_extent", None)
    if image.format == "GIF" and extent and tuple(extent) != (0, 0) + image.size:
        return ("TF decodes a GIF whose first frame is smaller than its canvas wrongly "
                "(frame-sized, misplaced); stored as the full canvas")
    if image.format == "BMP" and image.mode in ("P", "1"):
        return ("TF decodes %s BMPs wrongly (palette indices as grey, or not at all); "
                "stored with the true colours" % ("palette" if image.mode == "P" else "1-bit"))
    return None


def convert_bytes(data, jpeg_quality=95, max_shorter_side=0):
    """Encoded image bytes -> LoadedImage; raises SkippedImage with the reason.

    With `max_shorter_side`, larger images are shrunk (never enlarged) before encoding:
    decoding a 500x375 photo for a 32x32 model costs far more than the training step
    needs. The whole image is decoded once here, so truncated files are caught now,
    not during training.
    """
    if not data:
        raise SkippedImage("empty file")
    image_format = None
    try:
        image = Image.open(io.BytesIO(data))
        image_format = image.format
        image.load()
    except UnidentifiedImageError:
        raise SkippedImage("not an image (unrecognised format)") from None
    except Image.DecompressionBombError as error:
        raise SkippedImage("too many pixels to decode safely: %s" % error) from None
    except (OSError, SyntaxError, ValueError, EOFError) as error:
        kind = (image_format + " image") if image_format else "image"
        raise SkippedImage("corrupt or truncated %s: %s" % (kind, error)) from None
    width, height = image.size
    if width < 1 or height < 1:
        raise SkippedImage("image has no pixels")
    size = shrunk_size(width, height, max_shorter_side)
    if size == (width, height) and tf_decodes_jpeg_as_is(data, image):
        return LoadedImage(data, height, width, False, None)
    note = _serving_note(image)
    rgb = serving_rgb(image)
    if size != (width, height):
        rgb = rgb.resize(size, Image.BICUBIC, reducing_gap=3.0)
        width, height = size
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=jpeg_quality)
    return LoadedImage(out.getvalue(), height, width, True, note)


def load_image(path, jpeg_quality=95, max_shorter_side=0,
               max_file_bytes=DEFAULT_MAX_FILE_BYTES):
    """Returns (encoded_jpeg, height, width, converted) or raises SkippedImage."""
    loaded = convert_bytes(read_file(path, max_file_bytes), jpeg_quality, max_shorter_side)
    return loaded.encoded, loaded.height, loaded.width, loaded.converted


def convert_file(path, jpeg_quality=95, max_shorter_side=0,
                 max_file_bytes=DEFAULT_MAX_FILE_BYTES):
    """One file -> ImageResult; never raises for a bad input file (the reason is data)."""
    return convert_read(lambda: read_file(path, max_file_bytes), jpeg_quality,
                        max_shorter_side)


def convert_read(read, jpeg_quality=95, max_shorter_side=0):
    """ImageResult of the bytes `read()` returns (it raises SkippedImage for a file it
    refuses): convert_file for any reader, e.g. Beam's filesystems for gs:// paths.
    Never raises for a bad input file (the reason is data)."""
    try:
        return ImageResult(convert_bytes(read(), jpeg_quality, max_shorter_side), None)
    except SkippedImage as skipped:
        return ImageResult(None, str(skipped))
    except MemoryError:
        return ImageResult(None, "out of memory while decoding")
    except Exception as error:  # pylint: disable=broad-except  (never crash a conversion)
        return ImageResult(None, "unreadable image: %s: %s" % (type(error).__name__, error))
