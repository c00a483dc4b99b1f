"""Reads one image file for the dataset builder: keep valid RGB JPEGs as they are,
convert everything else PIL can decode to RGB JPEG, shrink oversized images when asked,
and say why anything else is skipped.

Kept free of TensorFlow so that worker processes start fast and fork safely.
"""
import io

from PIL import Image, UnidentifiedImageError


class SkippedImage(Exception):
    """An input file that cannot become a training example; the message is the reason."""


def _to_rgb(image):
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.split()[-1])
        return background
    return image.convert("RGB")


def shrunk_size(width, height, max_shorter_side):
    """(width, height) with the shorter side at most `max_shorter_side`, aspect kept."""
    shorter = min(width, height)
    if not max_shorter_side or shorter <= max_shorter_side:
        return width, height
    scale = max_shorter_side / float(shorter)
    return (max(1, int(round(width * scale))), max(1, int(round(height * scale))))


def load_image(path, jpeg_quality=95, max_shorter_side=0):
    """Returns (encoded_jpeg, height, width, converted) or raises SkippedImage.

    A valid baseline/progressive RGB JPEG is returned byte-for-byte; PNG, GIF, BMP,
    CMYK or grayscale images are decoded and re-encoded as RGB JPEG. With
    `max_shorter_side`, larger images are shrunk (never enlarged) before encoding:
    decoding a 500x375 photo for a 32x32 model costs far more than the training step
    needs. The whole image is decoded once here, so truncated files are caught now,
    not during training.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise SkippedImage("unreadable: %s" % (error.strerror or error)) from None
    if not data:
        raise SkippedImage("empty file")
    image_format = None
    try:
        image = Image.open(io.BytesIO(data))
        image_format = image.format
        image.load()
    except UnidentifiedImageError:
        raise SkippedImage("not an image (unrecognised format)") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        kind = (image_format + " image") if image_format else "image"
        raise SkippedImage("corrupt or truncated %s: %s" % (kind, error)) from None
    width, height = image.size
    if width < 1 or height < 1:
        raise SkippedImage("image has no pixels")
    size = shrunk_size(width, height, max_shorter_side)
    if image_format == "JPEG" and image.mode == "RGB" and size == (width, height):
        return data, height, width, False
    rgb = _to_rgb(image)
    if size != (width, height):
        rgb = rgb.resize(size, Image.BICUBIC, reducing_gap=3.0)
        width, height = size
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=jpeg_quality)
    return out.getvalue(), height, width, True
