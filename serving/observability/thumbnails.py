"""Untrusted image bytes -> a small PNG a browser may be shown.

Logged request bytes are whatever a client sent; example files are whatever lies in a
folder. They never reach a page as they are: only JPEG, PNG, GIF and BMP (what the served
model decodes) are opened, with Pillow told that format only; the size the header claims
is checked against `max_pixels` before a pixel is decoded (decompression bombs:
slimserve/testing/image_bombs.py); JPEGs are decoded at a reduced scale when that is
enough (serving/observability/image_stats.py `open_image`, shared with drift detection);
and the first frame is re-encoded as an RGB PNG of at most `size` pixels a side.
Anything else is NotAnImage with the reason. Pure Pillow, no TensorFlow. It lives beside
image_stats.py because the export's reference (export/reference.py), the drift report and
the labelling page (flywheel/) all make their thumbnails here.
"""
import io

from PIL import Image

from slimserve.serving.observability import image_stats

DEFAULT_MAX_PIXELS = image_stats.DEFAULT_MAX_PIXELS
DEFAULT_SIZE = 256
DEFAULT_MAX_BYTES = image_stats.DEFAULT_MAX_BYTES
NotAnImage = image_stats.NotAnImage  # Bytes that are not shown; the message says why.


def thumbnail(data, size=DEFAULT_SIZE, max_pixels=DEFAULT_MAX_PIXELS,
              max_bytes=DEFAULT_MAX_BYTES):
    """(PNG bytes, (width, height) of the original, format name) of encoded image
    `data`; NotAnImage with the reason for anything that is not shown."""
    image, (width, height), image_format, _ = image_stats.open_image(
        data, size, max_pixels, max_bytes)
    try:
        image = image.convert("RGB")
        image.thumbnail((size, size), Image.BICUBIC)
        out = io.BytesIO()
        image.save(out, "PNG")
    except MemoryError:
        raise NotAnImage("out of memory while decoding") from None
    except Exception as error:  # pylint: disable=broad-except  (any damage: not shown)
        raise NotAnImage("undecodable %s: %s" % (image_format, str(error)[:200])) from None
    return out.getvalue(), (width, height), image_format
