"""Decompression bombs are refused from their headers, before any decode, in the
exported graph and the input pipelines; valid images keep their pixels."""
import dataclasses
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from slimserve.estimator import nets
from slimserve.estimator import preprocessing
from slimserve.export import receivers
from slimserve.testing import image_bombs
from tests.helpers import ROOT

WORKER = os.path.join(ROOT, "tests", "guard_worker.py")
# Address-space cap of the worker: TensorFlow plus a loaded SavedModel reserve ~2.5 GB
# of it; a bomb that got decoded would touch 0.5-10 GB more.
ADDRESS_SPACE = 4_000_000_000


def test_bombs_fail_every_decoding_signature_and_pipeline_before_decoding(export_dir,
                                                                          tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    process = subprocess.run(["prlimit", "--as=%d" % ADDRESS_SPACE, sys.executable, WORKER,
                              export_dir, str(tmp_path)], capture_output=True, text=True,
                             timeout=600, cwd=ROOT, env=env)
    assert process.returncode == 0, process.stderr[-4000:]
    result = json.loads(process.stdout.strip().splitlines()[-1])
    assert result["warm"] == [3, 3, "decoded", "decoded"]
    limit = "max_image_pixels is %d" % preprocessing.DEFAULT_MAX_IMAGE_PIXELS
    for name, (_, claimed) in image_bombs.BOMBS.items():
        assert result["bytes"][name] < 64_000
        for signature, outcome in result[name].items():
            assert outcome.startswith("InvalidArgument"), (name, signature, outcome)
            assert "claims %s" % claimed in outcome and limit in outcome, outcome
    # ignore_errors drops exactly the four bombs, in evaluation and in training.
    assert result["eval_records"] == 2 and result["train_records"] == 2
    # Nothing was decoded: the peak RSS did not move by even one bomb's worth.
    assert result["rss_after_mb"] - result["rss_before_mb"] < 100, result


def test_the_png_bomb_is_a_real_png_that_inflates():
    """The fixture is not a mere header: its zlib stream is valid and expands ~1000x."""
    import zlib  # pylint: disable=import-outside-toplevel
    data = image_bombs.png_bomb()
    start = data.index(b"IDAT") + 4
    raw = zlib.decompress(data[start:data.index(b"IEND") - 8])
    assert len(raw) == 16000 * 2001 and len(data) < 64_000


@pytest.mark.parametrize("data, message", [
    (b"", "unsupported image format"),
    (b"RIFF\x10\x00\x00\x00WEBPVP8 ", "unsupported image format"),
    (b"\xff\xd8\xff\xe0\x00\x10JFIF", "JPEG"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00", "truncated PNG header"),
    (b"GIF89a\x10", "truncated GIF header"),
    (b"BM" + b"\x00" * 20, "truncated BMP header"),
    (image_bombs.png_bomb(16)[:12] + b"IHDX" + image_bombs.png_bomb(16)[16:], "IHDR"),
    (b"GIF89a\x01\x00\x01\x00\x00\x00\x00" + b"\x21\xfe\x00" * 5000 + b"\x3b",
     "GIF with more than 4096 blocks"),
])
def test_unknown_formats_and_truncated_headers_are_invalid_argument(data, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _eval_pixels_graph(tf.constant(data))


# One graph for every case, as in serving (a GIF block walk is ~40x slower eagerly).
_eval_pixels_graph = tf.function(
    lambda encoded: preprocessing.decode_eval_pixels(encoded, 32, preprocessing.VGG))


def _formats(pixels):
    return {"jpeg": image_bombs.encode(pixels, "JPEG", quality=90),
            "jpeg444": image_bombs.encode(pixels, "JPEG", quality=90, subsampling=0),
            "png": image_bombs.encode(pixels, "PNG"), "gif": image_bombs.encode(pixels, "GIF"),
            "bmp": image_bombs.encode(pixels, "BMP")}


def _previous_eval_pixels(encoded, size, central_fraction):
    """What evaluation and serving computed before: decode, float, central_crop, resize."""
    image = tf.cast(tf.io.decode_image(encoded, channels=3, expand_animations=False),
                    tf.float32)
    if central_fraction < 1.0:
        image = tf.image.central_crop(image, central_fraction)
    return tf.image.resize(image, [size, size], method="bilinear").numpy()


def test_valid_images_of_every_format_keep_their_pixels():
    for name, encoded in _formats(image_bombs.photo(211, 157)).items():
        plain = tf.io.decode_image(encoded, channels=3, expand_animations=False).numpy()
        np.testing.assert_array_equal(preprocessing.decode_image(encoded).numpy(), plain,
                                      err_msg=name)
        # inception geometry is the one used before; JPEG decodes only the window, which
        # libjpeg reproduces bit for bit without chroma subsampling or without a crop.
        fraction = 1.0 if name == "jpeg" else 0.875
        np.testing.assert_array_equal(
            preprocessing.decode_eval_pixels(encoded, 64, preprocessing.INCEPTION, fraction)
            .numpy(), _previous_eval_pixels(encoded, 64, fraction), err_msg=name)


def test_max_image_pixels_is_baked_into_the_serving_graph():
    encoded = image_bombs.encode(image_bombs.photo(53, 37), "PNG")  # 1,961 pixels
    settings = nets.preprocessing_spec("resnet_v1_50", 32, max_image_pixels=1000)
    assert settings.max_image_pixels == 1000
    for limit, fails in ((1000, True), (1961, False)):
        graph = tf.Graph()
        with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
            serving = receivers.build_serving_inputs(
                dataclasses.replace(settings, max_image_pixels=limit))
            feed = {serving.image_bytes: [encoded]}
            if fails:
                with pytest.raises(tf.errors.InvalidArgumentError, match=(
                        "claims 53x37 .* 1961 pixels in all; max_image_pixels is 1000")):
                    session.run(serving.images, feed)
            else:
                assert session.run(serving.images, feed).shape == (1, 32, 32, 3)


def test_animated_gif_frames_are_summed_and_the_first_frame_decodes_unchanged():
    frames = [Image.fromarray(image_bombs.photo(120, 90)[:, ::-1] if i % 2 else
                              image_bombs.photo(120, 90)).convert("P") for i in range(6)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=50)
    encoded = buffer.getvalue()
    np.testing.assert_array_equal(
        preprocessing.decode_image(encoded).numpy(),
        tf.io.decode_image(encoded, channels=3, expand_animations=False).numpy())
    # every frame is read: 6 frames of 120x90 = 64,800 pixels in all, not 10,800.
    preprocessing.check_image_size(encoded, 64_800)
    with pytest.raises(tf.errors.InvalidArgumentError, match="120x90 .* 64800 pixels in all"):
        preprocessing.check_image_size(encoded, 64_799)
