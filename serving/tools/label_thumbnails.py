"""Untrusted image bytes -> a small PNG a browser may be shown.

Logged request bytes are whatever a client sent; example files are whatever lies in a
folder. They never reach a page as they are: only JPEG, PNG, GIF and BMP (what the served
model decodes) are opened, with Pillow told that format only; the size the header claims
is checked against `max_pixels` before a pixel is decoded (decompression bombs:
slimserve/testing/image_bombs.py); JPEGs are decoded at a reduced scale when that is
enough; and the first frame is re-encoded as an RGB PNG of at most `size` pixels a side.
Anything else is NotAnImage with the reason. Pure Pillow, no TensorFlow.
"""
import io
import warnings

from PIL import Image

from slimserve import conventions

# What the served model's own guard decodes at most (estimator/preprocessing.py's default).
DEFAULT_MAX_PIXELS = 50_000_000
DEFAULT_SIZE = 256
DEFAULT_MAX_BYTES = 32 * 1024 * 1024


class NotAnImage(Exception):
    """Bytes that are not shown; the message says why."""


def thumbnail(data, size=DEFAULT_SIZE, max_pixels=DEFAULT_MAX_PIXELS,
              max_bytes=DEFAULT_MAX_BYTES):
    """(PNG bytes, (width, height) of the original, format name) of encoded image
    `data`; NotAnImage with the reason for anything that is not shown."""
    if not data:
        raise NotAnImage("empty")
    if len(data) > max_bytes:
        raise NotAnImage("%d bytes, more than %d" % (len(data), max_bytes))
    image_format = conventions.image_format(data)
    if image_format is None:
        raise NotAnImage("not a JPEG, PNG, GIF or BMP")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=[image_format])
            width, height = image.size
            if width < 1 or height < 1:
                raise NotAnImage("no pixels")
            if width * height > max_pixels:
                raise NotAnImage("header claims %dx%d pixels, more than %d"
                                 % (width, height, max_pixels))
            if image_format == "JPEG":
                image.draft("RGB", (size, size))  # DCT scaling: decode at 1/2..1/8
            image.load()
            if image.size[0] * image.size[1] > max_pixels:  # a frame larger than claimed
                raise NotAnImage("decoded frame larger than %d pixels" % max_pixels)
            image = image.convert("RGB")
            image.thumbnail((size, size), Image.BICUBIC)
            out = io.BytesIO()
            image.save(out, "PNG")
    except NotAnImage:
        raise
    except Image.DecompressionBombError as error:
        raise NotAnImage("decompression bomb: %s" % error) from None
    except MemoryError:
        raise NotAnImage("out of memory while decoding") from None
    except Exception as error:  # pylint: disable=broad-except  (any damage: not shown)
        raise NotAnImage("undecodable %s: %s" % (image_format, str(error)[:200])) from None
    return out.getvalue(), (width, height), image_format
