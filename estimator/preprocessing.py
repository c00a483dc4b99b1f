"""Image preprocessing for training, evaluation and serving: the single source.

`export/receivers.py` calls `decode_image` and `eval_image` from here, so a served
prediction sees exactly the pixels evaluation sees.

Normalisation follows slim's conventions by preprocessing style:
- "vgg" (resnet_v1, vgg): subtract the ImageNet channel means, no scaling.
- "inception" (resnet_v2, inception): scale to [-1, 1].
"""
import tensorflow as tf

VGG = "vgg"
INCEPTION = "inception"
STYLES = (VGG, INCEPTION)
_VGG_MEANS = (123.68, 116.78, 103.94)


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


def decode_image(encoded):
    """Encoded JPEG/PNG/GIF/BMP -> uint8 [H, W, 3] (first frame of a GIF)."""
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image


def eval_pixels(image, image_size, central_fraction=0.875):
    """Central crop + bilinear resize, still 0..255 float; [H,W,3] or [B,H,W,3].

    This is what the `predict_images` signature takes as input, so clients that
    resize themselves get the same pixels as the image-bytes path.
    """
    image = tf.cast(image, tf.float32)
    if central_fraction < 1.0:
        image = tf.image.central_crop(image, central_fraction)
    return tf.image.resize(image, [image_size, image_size], method="bilinear")


def eval_image(image, image_size, style, central_fraction=0.875):
    """The evaluation (and serving) preprocessing: `eval_pixels` then `normalize`."""
    return normalize(eval_pixels(image, image_size, central_fraction), style)


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
                           aspect_ratio_range=(3 / 4, 4 / 3), seed=None):
    """Samples a crop box and decodes only that crop (JPEG); other formats decode whole."""

    def jpeg():
        begin, size = _random_box(tf.image.extract_jpeg_shape(encoded), area_range,
                                  aspect_ratio_range, seed)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        return tf.image.decode_and_crop_jpeg(encoded, window, channels=3)

    def other():
        image = decode_image(encoded)
        begin, size = _random_box(tf.shape(image), area_range, aspect_ratio_range, seed)
        return tf.slice(image, begin, size)

    image = tf.cond(tf.io.is_jpeg(encoded), jpeg, other)
    image.set_shape([None, None, 3])
    return image


def train_image(encoded, image_size, style, area_range=(0.25, 1.0),
                aspect_ratio_range=(3 / 4, 4 / 3), random_flip=True, seed=None):
    """Random crop (decoding only the crop) + resize + optional flip + normalise."""
    image = decode_and_random_crop(encoded, area_range, aspect_ratio_range, seed)
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
