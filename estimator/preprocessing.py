"""Image preprocessing for training, evaluation and serving: the single source.

`export/receivers.py` and the evaluation input_fn both call `decode_eval_pixels`, so a
served prediction sees exactly the pixels evaluation sees.

Every decode is preceded by `check_image_size`, which reads the size an image claims
from its header (no decoding) and fails with InvalidArgument above `max_image_pixels`:
a 700-byte JPEG may claim 13000x13000 and a decoder allocates what the header says.

Evaluation geometry and normalisation follow slim's conventions by preprocessing style:
- "vgg" (resnet_v1, vgg; slim's vgg_preprocessing): keep the aspect ratio. slim resizes
  the shorter side to 256 and crops the central 224x224; that is the central square
  whose side is 224/256 = 0.875 of the shorter side, resized to image_size (done here
  in that order, so a JPEG decodes only the square). Pixels: subtract the ImageNet
  channel means, no scaling.
- "inception" (resnet_v2, inception; slim's inception_preprocessing): crop the central
  `central_fraction` of each side and resize it to image_size x image_size (the aspect
  ratio of the crop is not kept, as in slim). Pixels: scale to [-1, 1].
"""
import dataclasses

import tensorflow as tf

from slimserve import errors

VGG = "vgg"
INCEPTION = "inception"
STYLES = (VGG, INCEPTION)
_VGG_MEANS = (123.68, 116.78, 103.94)

# 50 MP admits the full-resolution output of 48-50 MP phone sensors (8160x6120 = 49.9 MP)
# and of 45 MP full-frame cameras, 4x a common 12 MP photo; a decoded image at the limit
# costs 150 MB (uint8 RGB). The reported JPEG bomb claims 169 MP, the PNG one 256 MP.
DEFAULT_MAX_IMAGE_PIXELS = 50_000_000

_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_GIF_MAGIC = b"GIF8"
_BMP_MAGIC = b"BM"


@dataclasses.dataclass(frozen=True)
class Spec:
    """How an image becomes the net's input in evaluation and serving: the one carrier of
    size, style, crop and pixel limit, made from the net (nets.preprocessing_spec) and
    shared by the eval input_fn, the exporters and all three export signatures."""
    image_size: int
    style: str
    central_fraction: float = 0.875
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS

    def __post_init__(self):
        check_style(self.style)
        if not (isinstance(self.image_size, int) and self.image_size > 0):
            raise errors.UserError("--image_size must be > 0, got %r" % (self.image_size,))
        if not 0.0 < self.central_fraction <= 1.0:
            raise errors.UserError("--eval_central_fraction must be in (0, 1], got %r"
                             % (self.central_fraction,))
        if not self.max_image_pixels > 0:
            raise errors.UserError("--max_image_pixels must be > 0, got %r" % (self.max_image_pixels,))

    @classmethod
    def from_dict(cls, settings):
        """From a run's slimserve.json (runs older than max_image_pixels get the default)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in settings.items() if k in known})

    def to_dict(self):
        return dataclasses.asdict(self)


def check_style(style):
    if style not in STYLES:
        raise ValueError("unknown preprocessing style %r; expected one of %s" % (style, STYLES))
    return style


def normalize(image, style):
    """float pixels in 0..255 -> the net's input range."""
    check_style(style)
    image = tf.cast(image, tf.float32)
    if style == VGG:
        return image - tf.constant(_VGG_MEANS, dtype=tf.float32)
    return image / 127.5 - 1.0


def _starts_with(encoded, magic):
    return tf.equal(tf.strings.substr(encoded, 0, len(magic)), magic)


def _header_ints(encoded, offset, count, dtype, little_endian, kind):
    """`count` integers of `dtype` at byte `offset`, after checking the header is there
    (substr past the end would fail with the raw bytes in its message)."""
    needed = offset + count * dtype.size
    present = tf.debugging.Assert(
        tf.strings.length(encoded) >= needed,
        [tf.strings.format("truncated %s header: {} bytes, its size fields end at byte %d"
                           % (kind, needed), [tf.strings.length(encoded)])])
    with tf.control_dependencies([present]):
        raw = tf.io.decode_raw(tf.strings.substr(encoded, offset, count * dtype.size), dtype,
                               little_endian=little_endian)
    return tf.cast(raw, tf.int64)


def _with_pixels(height_width):
    return tf.concat([height_width, [height_width[0] * height_width[1]]], 0)


def _jpeg_size(encoded):
    # libjpeg reads only the markers up to the frame header (SOFn).
    return _with_pixels(tf.cast(tf.image.extract_jpeg_shape(encoded)[:2], tf.int64))


def _png_size(encoded):
    # Signature (8), then the IHDR chunk: length (4), "IHDR", width, height (big-endian).
    width_height = _header_ints(encoded, 16, 2, tf.int32, False, "PNG")
    ihdr = tf.debugging.Assert(tf.equal(tf.strings.substr(encoded, 12, 4), b"IHDR"),
                               ["PNG without an IHDR chunk first: not a valid PNG"])
    with tf.control_dependencies([ihdr]):
        return _with_pixels(tf.reverse(width_height, [0]))


# GIFs are walked block by block (see _gif_frame_pixels); more blocks than this are
# refused rather than walked (a legitimate GIF has about 3 per frame plus its data).
GIF_MAX_BLOCKS = 4096


def _color_table_bytes(flags):
    """Size of the colour table a GIF screen or image descriptor's flags announce."""
    present = tf.bitwise.bitwise_and(flags, 0x80) > 0
    return tf.where(present, 3 * tf.bitwise.left_shift(2, tf.bitwise.bitwise_and(flags, 7)), 0)


def _gif_frame_pixels(encoded):
    """Sum of width*height over every frame's image descriptor, and whether the walk
    finished within GIF_MAX_BLOCKS.

    The GIF library reads every frame, each at the size its own descriptor claims,
    before TensorFlow looks at the logical screen: a 47 KB GIF whose screen says 16x16
    decodes to 8000x8000. Frames are found by following the blocks: an extension
    (0x21) or image (0x2C, after its 10-byte descriptor, colour table and LZW code
    size) is followed by data sub-blocks (a length byte, then that many bytes) up to a
    zero length. Where each sub-block chain ends is computed for every byte at once by
    pointer doubling (log2(size) vector gathers), so the loop takes one step per block.
    """
    data = tf.cast(tf.io.decode_raw(encoded, tf.uint8), tf.int32)
    size = tf.size(data)
    positions = tf.range(size)
    # hop[i]: the next length byte of a chain at i; a zero length ends it (fixed point);
    # `size` stands for "ran past the end".
    hop = tf.concat([tf.where(tf.equal(data, 0), positions,
                              tf.minimum(positions + 1 + data, size)), [size]], 0)
    rounds = tf.cast(tf.math.ceil(tf.math.log(tf.cast(size, tf.float32) + 2.0)
                                  / tf.math.log(2.0)), tf.int32)
    _, chain_end = tf.while_loop(lambda i, _: i < rounds,
                                 lambda i, h: (i + 1, tf.gather(h, h)), [0, hop])
    padded = tf.concat([data, tf.zeros([16], tf.int32)], 0)

    def byte(position):
        return tf.gather(padded, tf.clip_by_value(position, 0, size))

    def u16(position):
        return tf.cast(byte(position) + 256 * byte(position + 1), tf.int64)

    def walking(position, total, steps, done):
        del total
        return tf.logical_not(done) & (position < size) & (steps < GIF_MAX_BLOCKS)

    def step(position, total, steps, done):
        kind = byte(position)
        is_extension, is_image = tf.equal(kind, 0x21), tf.equal(kind, 0x2C)
        chain = tf.where(is_extension, position + 2,
                         position + 11 + _color_table_bytes(byte(position + 9)))
        frame = tf.where(is_image, u16(position + 5) * u16(position + 7),
                         tf.constant(0, tf.int64))
        after = tf.gather(chain_end, tf.clip_by_value(chain, 0, size)) + 1
        # The trailer (0x3B) or anything unknown ends the walk (the decoder stops there too).
        return after, total + frame, steps + 1, tf.logical_not(is_extension | is_image)

    start = 13 + _color_table_bytes(byte(10))
    position, total, steps, done = tf.while_loop(
        walking, step, [start, tf.constant(0, tf.int64), 0, tf.constant(False)])
    return total, done | (position >= size) | (steps < GIF_MAX_BLOCKS)


def _gif_size(encoded):
    # "GIF89a" (6), then the logical screen's width and height (little-endian uint16),
    # then every frame's own size (what the GIF library allocates).
    height_width = tf.reverse(_header_ints(encoded, 6, 2, tf.uint16, True, "GIF"), [0])
    frames, walked = _gif_frame_pixels(encoded)
    complete = tf.debugging.Assert(walked, [
        "GIF with more than %d blocks (frames, extensions): not accepted" % GIF_MAX_BLOCKS])
    with tf.control_dependencies([complete]):
        return tf.concat([height_width, [tf.maximum(height_width[0] * height_width[1],
                                                    frames)]], 0)


def _bmp_size(encoded):
    # File header (14), DIB header size (4), width, height (little-endian int32; a
    # negative height marks a top-down bitmap), as TensorFlow's decoder reads them.
    return _with_pixels(
        tf.abs(tf.reverse(_header_ints(encoded, 18, 2, tf.int32, True, "BMP"), [0])))


def check_image_size(encoded, max_image_pixels=DEFAULT_MAX_IMAGE_PIXELS):
    """(height, width) int32 from the image's header, checked before anything decodes it.

    "Pixels in all" is width*height, or for a GIF the larger of its screen and the sum
    of its frames' sizes (every frame is read).

    Raises InvalidArgument (at run time) for a format other than JPEG, PNG, GIF or BMP,
    a truncated header, or a claimed size above `max_image_pixels`. Decode only under
    `tf.control_dependencies` on the result (the functions below do).
    """
    if not max_image_pixels or max_image_pixels <= 0:
        raise ValueError("max_image_pixels must be a positive number of pixels, got %r"
                         % (max_image_pixels,))
    encoded = tf.convert_to_tensor(encoded, tf.string)
    known = [(_starts_with(encoded, _JPEG_MAGIC), _jpeg_size),
             (_starts_with(encoded, _PNG_MAGIC), _png_size),
             (_starts_with(encoded, _GIF_MAGIC), _gif_size),
             (_starts_with(encoded, _BMP_MAGIC), _bmp_size)]
    is_known = tf.reduce_any(tf.stack([condition for condition, _ in known]))
    supported = tf.debugging.Assert(is_known, [tf.strings.format(
        "unsupported image format ({} bytes): not JPEG, PNG, GIF or BMP",
        [tf.strings.length(encoded)])])
    with tf.control_dependencies([supported]):
        size = tf.case([(condition, (lambda read=read: read(encoded)))
                        for condition, read in known],
                       default=lambda: tf.constant([0, 0, 0], tf.int64), exclusive=False)
    height, width, pixels = size[0], size[1], size[2]
    limit = tf.constant(int(max_image_pixels), tf.int64, name="max_image_pixels")
    within = tf.debugging.Assert(
        (height > 0) & (width > 0) & (pixels <= limit),
        [tf.strings.format("image header claims {}x{} (width x height) and {} pixels in all; "
                           "max_image_pixels is {}", [width, height, pixels, limit])])
    with tf.control_dependencies([within]):
        return tf.cast(size[:2], tf.int32)


def decode_image(encoded, max_image_pixels=DEFAULT_MAX_IMAGE_PIXELS):
    """Encoded JPEG/PNG/GIF/BMP -> uint8 [H, W, 3] (first frame of a GIF), size-checked."""
    with tf.control_dependencies([check_image_size(encoded, max_image_pixels)]):
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image


def eval_crop_window(height, width, style, central_fraction=0.875):
    """The central region evaluation keeps: int32 (top, left, crop_height, crop_width).

    inception: `central_fraction` of each side, rounded exactly as tf.image.central_crop.
    vgg: a square whose side is `central_fraction` of the shorter side (same rounding).
    """
    check_style(style)
    if not 0.0 < central_fraction <= 1.0:
        raise ValueError("central_fraction must be in (0, 1], got %r" % (central_fraction,))
    height = tf.cast(height, tf.int32)
    width = tf.cast(width, tf.int32)

    def kept(side):
        side64 = tf.cast(side, tf.float64)
        margin = tf.cast((side64 - side64 * central_fraction) / 2, tf.int32)
        return side - 2 * margin

    if style == INCEPTION:
        crop_height, crop_width = kept(height), kept(width)
    else:
        crop_height = crop_width = kept(tf.minimum(height, width))
    return tf.stack([(height - crop_height) // 2, (width - crop_width) // 2,
                     crop_height, crop_width])


def _resize(image, image_size):
    # Bilinear straight from uint8 (same values as from float32, a quarter of the memory).
    return tf.image.resize(image, [image_size, image_size], method="bilinear")


def eval_pixels(image, image_size, style, central_fraction=0.875):
    """Decoded pixels [H,W,3] or [B,H,W,3] -> the evaluation geometry, float 0..255
    [image_size, image_size, 3] (or batched).

    This is the input of the `predict_images` signature: clients that decode and resize
    themselves apply this (or its description in the module docstring) first.
    """
    shape = tf.shape(image)
    top, left, crop_height, crop_width = tf.unstack(
        eval_crop_window(shape[-3], shape[-2], style, central_fraction))
    image = image[..., top:top + crop_height, left:left + crop_width, :]
    return _resize(image, image_size)


def decode_eval_pixels(encoded, image_size, style, central_fraction=0.875,
                       max_image_pixels=DEFAULT_MAX_IMAGE_PIXELS):
    """Encoded image -> float 0..255 [image_size, image_size, 3] in the evaluation geometry.

    The one function behind evaluation and every serving signature. The header is
    size-checked first; a JPEG decodes only the kept window (libjpeg may then differ
    from a whole decode by a few levels in the window's edge columns, where chroma is
    upsampled without its neighbours), other formats decode whole and are sliced.
    """
    size = check_image_size(encoded, max_image_pixels)
    window = eval_crop_window(size[0], size[1], style, central_fraction)

    def jpeg():
        return tf.image.decode_and_crop_jpeg(encoded, window, channels=3)

    def other():
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        shape = tf.shape(image)
        top, left, height, width = tf.unstack(
            eval_crop_window(shape[0], shape[1], style, central_fraction))
        return image[top:top + height, left:left + width, :]

    with tf.control_dependencies([size]):
        image = tf.cond(tf.io.is_jpeg(encoded), jpeg, other)
    image.set_shape([None, None, 3])
    return _resize(image, image_size)


def eval_image(encoded, image_size, style, central_fraction=0.875,
               max_image_pixels=DEFAULT_MAX_IMAGE_PIXELS):
    """The evaluation (and serving) preprocessing: `decode_eval_pixels` then `normalize`."""
    return normalize(decode_eval_pixels(encoded, image_size, style, central_fraction,
                                        max_image_pixels), style)


def _random_box(shape, area_range, aspect_ratio_range, seed):
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4]),
        seed=seed or 0,
        min_object_covered=area_range[0],
        aspect_ratio_range=aspect_ratio_range,
        area_range=area_range,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    return begin, size


def decode_and_random_crop(encoded, area_range=(0.25, 1.0),
                           aspect_ratio_range=(3 / 4, 4 / 3), seed=None,
                           max_image_pixels=DEFAULT_MAX_IMAGE_PIXELS):
    """Samples a crop box and decodes only that crop (JPEG); other formats decode whole.
    The header is size-checked first."""
    size = check_image_size(encoded, max_image_pixels)

    def jpeg():
        begin, size_ = _random_box(tf.concat([size, [3]], 0), area_range,
                                   aspect_ratio_range, seed)
        window = tf.stack([begin[0], begin[1], size_[0], size_[1]])
        return tf.image.decode_and_crop_jpeg(encoded, window, channels=3)

    def other():
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        begin, size_ = _random_box(tf.shape(image), area_range, aspect_ratio_range, seed)
        return tf.slice(image, begin, size_)

    with tf.control_dependencies([size]):
        image = tf.cond(tf.io.is_jpeg(encoded), jpeg, other)
    image.set_shape([None, None, 3])
    return image


def train_image(encoded, image_size, style, area_range=(0.25, 1.0),
                aspect_ratio_range=(3 / 4, 4 / 3), random_flip=True, seed=None,
                max_image_pixels=DEFAULT_MAX_IMAGE_PIXELS):
    """Random crop (decoding only the crop) + resize + optional flip + normalise."""
    image = decode_and_random_crop(encoded, area_range, aspect_ratio_range, seed,
                                   max_image_pixels)
    image = tf.image.resize(tf.cast(image, tf.float32), [image_size, image_size],
                            method="bilinear")
    if random_flip:
        image = tf.image.random_flip_left_right(image, seed=seed)
    return normalize(image, style)


def denormalize(image, style):
    """The inverse of `normalize`, for image summaries (0..255 float)."""
    check_style(style)
    if style == VGG:
        return image + tf.constant(_VGG_MEANS, dtype=tf.float32)
    return (image + 1.0) * 127.5
