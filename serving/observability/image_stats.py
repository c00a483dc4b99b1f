"""Untrusted image bytes opened safely, and the statistics drift detection compares.

Request bytes are whatever a client sent. `open_image` opens only JPEG, PNG, GIF and BMP
(what the served model decodes), with Pillow told that format only, checks the size the
header claims against `max_pixels` before a pixel is decoded (decompression bombs:
slimserve/testing/image_bombs.py), decodes JPEGs at a reduced scale when that is enough
(`draft`), and returns the first frame. Anything else is NotAnImage with the reason.
serving/observability/thumbnails.py makes the report's and labelling page's thumbnails
through it.

`statistics` is one row of what the export's reference records for each validation image
and drift detection computes for each served one (serving/observability/reference.py):
width and height as the header gives them, channels, brightness (mean grey level in
[0, 1]) and contrast (standard deviation of the grey level), the last two computed on
the image reduced to at most STATS_SIDE pixels a side, so both sides measure alike and
a large image costs no more than a small one. Pure Pillow and numpy, no TensorFlow.
"""
import io
import warnings

import numpy as np
from PIL import Image

from slimserve import conventions

# What the served model's own guard decodes at most (estimator/preprocessing.py's default).
DEFAULT_MAX_PIXELS = 50_000_000
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
STATS_SIDE = 64
NAMES = ("width", "height", "channels", "brightness", "contrast")
_CHANNELS = {"1": 1, "L": 1, "P": 3, "LA": 2, "PA": 4, "I": 1, "I;16": 1, "F": 1,
             "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3, "RGBA": 4, "RGBX": 4, "CMYK": 4}


class NotAnImage(Exception):
    """Bytes that are not decoded; the message says why."""


def open_image(data, reduce_to=None, max_pixels=DEFAULT_MAX_PIXELS,
               max_bytes=DEFAULT_MAX_BYTES):
    """(decoded first frame as a PIL image, (width, height) the header claims, format
    name, mode before any conversion) of encoded image `data`; NotAnImage with the
    reason for anything not decoded. reduce_to: a JPEG may be decoded at a DCT scale
    down to this many pixels a side (the returned image is then smaller)."""
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
            mode = image.mode
            if image_format == "JPEG" and reduce_to:
                image.draft("RGB" if mode != "L" else "L", (reduce_to, reduce_to))
            image.load()
            if image.size[0] * image.size[1] > max_pixels:  # a frame larger than claimed
                raise NotAnImage("decoded frame larger than %d pixels" % max_pixels)
    except NotAnImage:
        raise
    except Image.DecompressionBombError as error:
        raise NotAnImage("decompression bomb: %s" % error) from None
    except MemoryError:
        raise NotAnImage("out of memory while decoding") from None
    except Exception as error:  # pylint: disable=broad-except  (any damage: not decoded)
        raise NotAnImage("undecodable %s: %s" % (image_format, str(error)[:200])) from None
    return image, (width, height), image_format, mode


def statistics(data, max_pixels=DEFAULT_MAX_PIXELS, max_bytes=DEFAULT_MAX_BYTES):
    """float64 [5]: width, height, channels, brightness, contrast (NAMES) of encoded
    image `data`; NotAnImage when it is not decoded."""
    image, (width, height), _, mode = open_image(data, STATS_SIDE, max_pixels, max_bytes)
    try:
        grey = image.convert("L")
        grey.thumbnail((STATS_SIDE, STATS_SIDE), Image.BOX)
        pixels = np.asarray(grey, np.float64) / 255.0
    except Exception as error:  # pylint: disable=broad-except
        raise NotAnImage("undecodable: %s" % str(error)[:200]) from None
    return np.array([width, height, _CHANNELS.get(mode, 3), pixels.mean(), pixels.std()])
