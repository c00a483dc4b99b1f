"""The converter stores the pixels the serving graph decodes from the same file.

Serving runs `tf.io.decode_image(channels=3, expand_animations=False)` on the bytes a
client sends; these tests write real files in every pixel mode Pillow opens and compare
the converter's RGB with TensorFlow's decode of the same file, pixel for pixel
(tolerance 0). Where TensorFlow cannot decode the format (TIFF, WebP, PGM), the
reference is TensorFlow's decode of the same samples stored as PNG.
"""
import io
import json
import os
import pickle
import struct
import zlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageCms

from slimserve.estimator import dataset
from slimserve.estimator import image_files
from slimserve.estimator import schema
from slimserve.estimator import splits

_RNG = np.random.RandomState(7)
_RGB = _RNG.randint(0, 256, (23, 31, 3), np.uint8)
_ALPHA = _RNG.randint(0, 256, (23, 31), np.uint8)
_SAMPLES16 = _RNG.randint(0, 65536, (23, 31, 4)).astype(np.uint16)


def _encode(image, image_format, **options):
    out = io.BytesIO()
    image.save(out, format=image_format, **options)
    return out.getvalue()


def _png16(samples):
    """A 16-bit PNG written by hand (Pillow cannot save 16-bit RGB/RGBA/LA)."""
    height, width, channels = samples.shape
    color_type = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    raw = b"".join(b"\0" + samples[row].astype(">u2").tobytes() for row in range(height))

    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))

    header = struct.pack(">IIBBBBB", width, height, 16, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))


def _palette():
    return Image.fromarray(_RGB).convert("P", palette=Image.ADAPTIVE, colors=16)


# Every file TensorFlow decodes, by the pixel mode Pillow opens it in.
TF_DECODES = {
    "png_1": lambda: _encode(Image.fromarray(_RGB[..., 0] > 127), "PNG"),
    "png_L": lambda: _encode(Image.fromarray(_RGB[..., 0]), "PNG"),
    "png_LA": lambda: _encode(Image.fromarray(np.dstack([_RGB[..., 0], _ALPHA]), "LA"), "PNG"),
    "png_P": lambda: _encode(_palette(), "PNG"),
    "png_P_transparent": lambda: _encode(_palette(), "PNG", transparency=3),
    "png_RGB": lambda: _encode(Image.fromarray(_RGB), "PNG"),
    "png_RGBA": lambda: _encode(Image.fromarray(np.dstack([_RGB, _ALPHA])), "PNG"),
    "png_I;16": lambda: _png16(_SAMPLES16[..., :1]),
    "png_LA_16bit": lambda: _png16(_SAMPLES16[..., :2]),
    "png_RGB_16bit": lambda: _png16(_SAMPLES16[..., :3]),
    "png_RGBA_16bit": lambda: _png16(_SAMPLES16),
    "gif_P": lambda: _encode(_palette(), "GIF"),
    "gif_P_transparent": lambda: _encode(_palette(), "GIF", transparency=3),
    "bmp_L": lambda: _encode(Image.fromarray(_RGB[..., 0]), "BMP"),
    "bmp_RGB": lambda: _encode(Image.fromarray(_RGB), "BMP"),
    "bmp_RGBA_32bit": lambda: _encode(Image.fromarray(np.dstack([_RGB, _ALPHA])), "BMP"),
}


def _served(data):
    """What the serving graph decodes (preprocessing.decode_image does exactly this)."""
    return tf.io.decode_image(data, channels=3, expand_animations=False).numpy()


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def _converter_rgb(path):
    with Image.open(path) as image:
        image.load()
        return np.asarray(image_files.serving_rgb(image)), image.mode


@pytest.mark.parametrize("case", sorted(TF_DECODES))
def test_rgb_equals_tf_decode_image_of_the_same_file(tmp_path, case):
    path = _write(tmp_path, case.replace(";", "") + "." + case.split("_")[0], TF_DECODES[case]())
    ours, mode = _converter_rgb(path)
    served = _served(open(path, "rb").read())
    assert ours.shape == served.shape and ours.dtype == np.uint8
    differing = int(np.sum(np.any(ours != served, axis=-1)))
    assert differing == 0, "%s (Pillow mode %s): %d of %d pixels differ from TF, max %d" % (
        case, mode, differing, served.shape[0] * served.shape[1],
        np.abs(ours.astype(int) - served).max())
    assert image_files.convert_file(path).image.note is None  # nothing to warn about


def test_sixteen_bit_png_is_scaled_not_clipped(tmp_path):
    """The reported bug: a mid-grey 16-bit PNG became 99% white."""
    ramp = np.tile(np.linspace(16384, 49151, 64).astype(np.uint16), (48, 1))
    path = _write(tmp_path, "grey16.png", _png16(ramp[..., None]))
    with Image.open(path) as image:
        assert image.mode == "I;16"
    result = image_files.convert_file(path)
    assert pickle.loads(pickle.dumps(result)) == result  # travels to pool / Beam workers
    loaded = result.image
    stored = tf.io.decode_jpeg(loaded.encoded, channels=3).numpy().astype(int)
    served = _served(open(path, "rb").read()).astype(int)
    assert 60 <= served.mean() <= 195  # mid-grey, as serving sees it
    assert np.abs(stored - served).mean() < 1.0  # only JPEG quality-95 loss remains


def test_jpegs_tf_decodes_are_stored_byte_for_byte(tmp_path):
    """Pillow's JPEG decoder differs from TF's default (INTEGER_FAST) by up to ~5 levels,
    so grayscale, CMYK and progressive JPEGs are kept as they are, not re-encoded."""
    for mode, options in (("L", {}), ("CMYK", {}), ("RGB", {"progressive": True})):
        path = _write(tmp_path, "%s.jpg" % mode, _encode(Image.fromarray(_RGB).convert(mode),
                                                         "JPEG", **options))
        loaded = image_files.convert_file(path).image
        assert loaded.encoded == open(path, "rb").read(), mode
        assert not loaded.converted and loaded.note is None


def test_cmyk_conversion_is_tf_conversion(tmp_path):
    """With the IDCT difference removed (INTEGER_ACCURATE is Pillow's ISLOW), TF's CMYK
    JPEG colours equal the converter's exactly: the reference for CMYK TIFFs below."""
    data = _encode(Image.fromarray(_RGB).convert("CMYK"), "JPEG", quality=90)
    ours, mode = _converter_rgb(_write(tmp_path, "cmyk.jpg", data))
    accurate = tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE").numpy()
    assert mode == "CMYK"
    np.testing.assert_array_equal(ours, accurate)


def _tf_cannot_decode(data):
    with pytest.raises(tf.errors.InvalidArgumentError):
        _served(data)


def test_formats_tf_cannot_decode_match_tf_on_the_same_samples_as_png(tmp_path):
    grey16 = _SAMPLES16[..., 0]
    png_reference = _served(_png16(grey16[..., None]))
    for name, data, mode in (
            ("grey16.tif", _encode(Image.fromarray(grey16), "TIFF"), "I;16"),
            ("grey16be.tif", _encode(Image.frombytes("I;16B", grey16.shape[::-1],
                                                     grey16.astype(">u2").tobytes()), "TIFF"),
             "I;16B"),
            ("grey16.pgm", _encode(Image.fromarray(grey16), "PPM"), "I"),
            ("grey16_int32.tif", _encode(Image.fromarray(grey16.astype(np.int32)), "TIFF"), "I")):
        _tf_cannot_decode(data)
        ours, opened = _converter_rgb(_write(tmp_path, name, data))
        assert opened == mode, name
        np.testing.assert_array_equal(ours, png_reference, err_msg=name)
        assert "TF cannot decode" in image_files.convert_file(str(tmp_path / name)).image.note

    rgba = np.dstack([_RGB, _ALPHA])
    webp = _encode(Image.fromarray(rgba), "WEBP", lossless=True, exact=True)
    _tf_cannot_decode(webp)
    ours, opened = _converter_rgb(_write(tmp_path, "rgba.webp", webp))
    assert opened == "RGBA"
    np.testing.assert_array_equal(ours, _served(_encode(Image.fromarray(rgba), "PNG")))

    cmyk = np.asarray(Image.fromarray(_RGB).convert("CMYK")).astype(int)
    ours, opened = _converter_rgb(_write(tmp_path, "cmyk.tif",
                                         _encode(Image.fromarray(_RGB).convert("CMYK"), "TIFF")))
    inverse = 255 - cmyk  # TF's CMYK JPEG formula, exact per the test above
    expected = np.round(inverse[..., :3] * inverse[..., 3:] / 255.0)
    assert opened == "CMYK"
    np.testing.assert_array_equal(ours, expected)


def test_lab_tiff_is_converted_by_colour_management_not_reinterpreted(tmp_path):
    """No TF format holds LAB; the reference is littlecms's LAB -> sRGB transform."""
    path = _write(tmp_path, "lab.tif", _encode(Image.fromarray(_RGB).convert("LAB"), "TIFF"))
    ours, opened = _converter_rgb(path)
    assert opened == "LAB"
    with Image.open(path) as lab:
        transform = ImageCms.buildTransform(ImageCms.createProfile("LAB"),
                                            ImageCms.createProfile("sRGB"), "LAB", "RGB")
        reference = np.asarray(ImageCms.applyTransform(lab, transform))
    assert np.abs(ours.astype(int) - reference).max() <= 1


def test_samples_with_no_8bit_meaning_are_skipped_with_the_reason(tmp_path):
    floats = _write(tmp_path, "float.tif", _encode(Image.fromarray(
        _SAMPLES16[..., 0].astype(np.float32) / 65535), "TIFF"))
    wide = _write(tmp_path, "int32.tif", _encode(Image.fromarray(
        _SAMPLES16[..., 0].astype(np.int32) * 4), "TIFF"))
    assert "mode F" in image_files.convert_file(floats).skip_reason
    assert "outside 0..65535" in image_files.convert_file(wide).skip_reason


def test_palette_bmp_keeps_true_colours_and_notes_that_tf_misreads_it(tmp_path):
    path = _write(tmp_path, "palette.bmp", _encode(_palette(), "BMP"))
    ours, opened = _converter_rgb(path)
    assert opened == "P"
    np.testing.assert_array_equal(ours, np.asarray(_palette().convert("RGB")))
    served = _served(open(path, "rb").read())
    np.testing.assert_array_equal(served[..., 0], np.asarray(_palette()))  # indices as grey
    assert "palette indices" in image_files.convert_file(path).image.note


def _gif_with_small_first_frame():
    """An 8x6 GIF canvas whose only frame covers 4x3 pixels at (2, 1), written by hand
    (LZW with a clear code before every 3-bit code, so no dictionary is needed)."""
    codes = []
    for index in [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]:
        codes += [4, index]
    bits = "".join(format(code, "03b")[::-1] for code in codes + [5])
    packed = bytes(int(bits[i:i + 8][::-1], 2) for i in range(0, len(bits), 8))
    return (b"GIF89a" + struct.pack("<HHBBB", 8, 6, 0xF1, 3, 0)
            + bytes([10, 20, 30, 200, 100, 50, 0, 255, 0, 90, 90, 90])
            + b"\x2c" + struct.pack("<HHHHB", 2, 1, 4, 3, 0)
            + bytes([2, len(packed)]) + packed + b"\0\x3b")


def test_gif_with_a_small_first_frame_keeps_the_canvas_and_says_tf_differs(tmp_path):
    path = _write(tmp_path, "offset.gif", _gif_with_small_first_frame())
    ours, _ = _converter_rgb(path)
    assert ours.shape == (6, 8, 3) and _served(open(path, "rb").read()).shape == (3, 4, 3)
    np.testing.assert_array_equal(ours[1:4, 2:6, 0], [[200, 0, 90, 200], [0, 90, 200, 0],
                                                      [90, 200, 0, 90]])
    assert (ours[0] == [10, 20, 30]).all()  # background colour outside the frame
    assert "smaller than its canvas" in image_files.convert_file(path).image.note


def test_built_records_decode_to_the_served_pixels(tmp_path, digits_dir):
    """End to end: shards hold what serving decodes (up to JPEG loss), per mode."""
    source = tmp_path / "in"
    for label in ("a", "b"):
        os.makedirs(source / label)
        for name in sorted(os.listdir(os.path.join(digits_dir, "1")))[:2]:
            (source / label / name).write_bytes(
                open(os.path.join(digits_dir, "1", name), "rb").read())
    smooth = np.tile(np.linspace(0, 65535, 40).astype(np.uint16), (30, 1))
    (source / "a" / "grey16.png").write_bytes(_png16(smooth[..., None]))
    rgba = np.dstack([np.tile(np.linspace(0, 255, 40).astype(np.uint8), (30, 1))] * 3
                     + [np.full((30, 40), 0, np.uint8)])  # fully transparent
    (source / "b" / "clear.png").write_bytes(_encode(Image.fromarray(rgba), "PNG"))
    out = str(tmp_path / "out")
    dataset.build_dataset(str(source), out, 0.0, train_shards=1, show_progress=False)
    files = {"grey16.png": "a", "clear.png": "b"}
    seen = set()
    for example in splits.read_examples(out, "train"):
        feature = example.features.feature
        name = feature[schema.FILENAME].bytes_list.value[0].decode()
        if name in files:
            stored = tf.io.decode_jpeg(feature[schema.ENCODED].bytes_list.value[0],
                                       channels=3).numpy().astype(int)
            served = _served((source / files[name] / name).read_bytes()).astype(int)
            assert np.abs(stored - served).mean() < 2.0, name  # measured 1.07 (JPEG q95)
            seen.add(name)
    assert seen == set(files)
    info = json.load(open(os.path.join(out, schema.INFO_FILE)))
    assert info["splits"]["train"]["converted_to_jpeg"] == 2
