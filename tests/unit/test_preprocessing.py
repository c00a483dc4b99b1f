"""Evaluation geometry per preprocessing style, measured on 500x375 images."""
import numpy as np
import tensorflow as tf

from slimserve.estimator import nets
from slimserve.estimator import preprocessing
from slimserve.testing import image_bombs


def _disc_width_over_height(pixels):
    rows, cols = np.nonzero(pixels.mean(axis=2) > 127)
    return (cols.max() - cols.min() + 1) / (rows.max() - rows.min() + 1)


def test_vgg_eval_keeps_a_circle_round_and_inception_squashes_it_as_slim_does():
    disc = image_bombs.circle(500, 375, radius=120)
    for encoded in (image_bombs.encode(disc, "PNG"), image_bombs.encode(disc, "JPEG")):
        vgg = preprocessing.decode_eval_pixels(encoded, 224, preprocessing.VGG).numpy()
        assert abs(_disc_width_over_height(vgg) - 1.0) < 0.02
        inception = preprocessing.decode_eval_pixels(encoded, 224,
                                                     preprocessing.INCEPTION).numpy()
        assert abs(_disc_width_over_height(inception) - 375 / 500) < 0.02


def _slim_vgg_eval(encoded, size):
    """slim's vgg_preprocessing.preprocess_for_eval (resize_side 256 for 224): resize
    the shorter side to size*256/224 keeping the aspect ratio, crop the centre."""
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    height, width = image.shape[0], image.shape[1]
    scale = round(size * 256 / 224) / min(height, width)
    new_height, new_width = int(height * scale), int(width * scale)
    resized = tf.image.resize(tf.cast(image, tf.float32), [new_height, new_width])
    top, left = (new_height - size) // 2, (new_width - size) // 2
    return resized[top:top + size, left:left + size].numpy()


def test_vgg_eval_is_slims_resize_then_central_crop_up_to_sampling_phase():
    """Same region and scale as slim (crop first, so JPEG decodes only the crop); pixel
    values differ only by where bilinear samples fall (measured: mean 4.2 levels here,
    against 32.6 for the former squash)."""
    encoded = image_bombs.encode(image_bombs.photo(500, 375), "JPEG", quality=90)
    slim = _slim_vgg_eval(encoded, 224)
    ours = preprocessing.decode_eval_pixels(encoded, 224, preprocessing.VGG).numpy()
    squashed = preprocessing.decode_eval_pixels(encoded, 224, preprocessing.INCEPTION).numpy()
    assert np.abs(ours - slim).mean() < 6.0
    assert np.abs(squashed - slim).mean() > 25.0


def test_crop_windows_per_style():
    window = lambda style, fraction=0.875: preprocessing.eval_crop_window(  # noqa: E731
        375, 500, style, fraction).numpy().tolist()
    # tf.image.central_crop rounding: margin int((375 - 328.125) / 2) = 23 -> 329 kept
    assert window(preprocessing.VGG) == [23, 85, 329, 329]
    assert window(preprocessing.INCEPTION) == [23, 31, 329, 438]
    assert window(preprocessing.VGG, 1.0) == [0, 62, 375, 375]
    assert window(preprocessing.INCEPTION, 1.0) == [0, 0, 375, 500]


def test_eval_pixels_of_decoded_images_match_the_bytes_path():
    """predict_images takes pixels after the geometry: eval_pixels gives them."""
    pixels = image_bombs.photo(300, 200)
    encoded = image_bombs.encode(pixels, "PNG")
    for style in preprocessing.STYLES:
        from_bytes = preprocessing.decode_eval_pixels(encoded, 64, style).numpy()
        np.testing.assert_array_equal(preprocessing.eval_pixels(pixels, 64, style).numpy(),
                                      from_bytes)
        np.testing.assert_array_equal(
            preprocessing.eval_pixels(np.stack([pixels] * 2), 64, style).numpy()[1], from_bytes)


def test_net_image_sizes_and_styles_follow_slims_published_checkpoints():
    assert (nets.get_net("resnet_v1_50").default_image_size,
            nets.get_net("resnet_v1_50").style) == (224, preprocessing.VGG)
    assert (nets.get_net("resnet_v2_50").default_image_size,
            nets.get_net("resnet_v2_50").style) == (299, preprocessing.INCEPTION)
    assert nets.get_net("vgg_16").style == preprocessing.VGG
