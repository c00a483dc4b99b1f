"""slimserve-client predict for many files: class names printed, one bad file one error
line (checked before sending, or split out of a batch the server refused) while the rest
of its batch is answered, and --signature_name used. Against a real server and a tiny
real image classifier (decode, resize, mean colour, softmax)."""
import io
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from slimserve.serving.config import model_config
from slimserve.serving.tools import client as client_lib
from slimserve.testing.commands import run_command
from slimserve.testing.servers import serve_in_process
from tests.helpers import run_cli

COLOURS = ("red", "green", "blue")


def write_colour_model(base_path, version=1):
    """A SavedModel that names an image's dominant colour: serving_default (encoded
    image -> classes, probabilities, class_names as slimserve's exports), `bgr` (the same
    with the classes in reverse order), `pixels` (float input, which predict cannot
    feed) and `classify` (tf.Example with image/encoded -> every class name and score)."""
    path = os.path.join(base_path, str(version))
    graph = tf.Graph()
    with graph.as_default():
        def mean_colour(encoded):
            image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
            image = tf.image.resize(tf.cast(image, tf.float32), [8, 8])
            return tf.reduce_mean(image, axis=[0, 1])

        def head(rgb, names):
            probabilities = tf.nn.softmax(rgb / 32.0)
            classes = tf.argmax(probabilities, axis=1)
            return {"classes": classes, "probabilities": probabilities,
                    "class_names": tf.gather(tf.constant(names), classes)}

        image_bytes = tf.compat.v1.placeholder(tf.string, [None], name="image_bytes")
        rgb = tf.map_fn(mean_colour, image_bytes, fn_output_signature=tf.float32)
        pixels = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 3], name="pixels")
        examples = tf.compat.v1.placeholder(tf.string, [None], name="examples")
        parsed = tf.io.parse_example(examples, {
            "image/encoded": tf.io.FixedLenFeature([], tf.string)})["image/encoded"]
        classify_rgb = tf.map_fn(mean_colour, parsed, fn_output_signature=tf.float32)
        classify_scores = tf.nn.softmax(classify_rgb / 32.0)

        info = tf.compat.v1.saved_model.utils.build_tensor_info
        build = tf.compat.v1.saved_model.signature_def_utils.build_signature_def
        predict = tf.saved_model.PREDICT_METHOD_NAME

        def outputs(tensors):
            return {key: info(value) for key, value in tensors.items()}

        signatures = {
            "serving_default": build({"image_bytes": info(image_bytes)},
                                     outputs(head(rgb, list(COLOURS))), predict),
            "bgr": build({"image_bytes": info(image_bytes)},
                         outputs(head(tf.reverse(rgb, [1]), list(COLOURS[::-1]))), predict),
            "pixels": build({"pixels": info(pixels)},
                            outputs(head(tf.reduce_mean(pixels, axis=[1, 2]), list(COLOURS))),
                            predict),
            "classify": build(
                {tf.saved_model.CLASSIFY_INPUTS: info(examples)},
                {tf.saved_model.CLASSIFY_OUTPUT_CLASSES: info(tf.tile(
                    tf.constant([list(COLOURS)]), [tf.shape(parsed)[0], 1])),
                 tf.saved_model.CLASSIFY_OUTPUT_SCORES: info(classify_scores)},
                tf.saved_model.CLASSIFY_METHOD_NAME),
        }
        with tf.compat.v1.Session(graph=graph) as session:
            builder = tf.compat.v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(session, [tf.saved_model.SERVING],
                                                 signature_def_map=signatures)
            builder.save()
    return path


def _image(colour, fmt):
    rgb = [255 if c == colour else 0 for c in COLOURS]
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), tuple(rgb)).save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("colours")
    write_colour_model(str(base))
    instance = serve_in_process([model_config.ServedModel("colours", str(base))],
                                rest_api_port=0)
    yield instance
    instance.stop()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Three good images and, between them, four files that cannot be answered."""
    folder = tmp_path_factory.mktemp("files")
    made = {}
    for name, data in [("red.png", _image("red", "PNG")), ("green.jpg", _image("green", "JPEG")),
                       ("blue.bmp", _image("blue", "BMP")), ("notes.txt", b"not an image\n"),
                       ("empty.png", b"")]:
        (folder / name).write_bytes(data)
        made[name] = str(folder / name)
    png = _image("red", "PNG")
    (folder / "truncated.png").write_bytes(png[:len(png) // 2])  # a PNG by its first bytes
    made["truncated.png"] = str(folder / "truncated.png")
    (folder / "a_folder.jpg").mkdir()
    made["a_folder.jpg"] = str(folder / "a_folder.jpg")
    made["missing.png"] = str(folder / "missing.png")
    order = ["red.png", "notes.txt", "truncated.png", "green.jpg", "missing.png",
             "a_folder.jpg", "empty.png", "blue.bmp"]
    return [made[name] for name in order]


def test_one_bad_file_costs_one_error_line_and_names_are_printed(server, files):
    out = run_cli("slimserve.cli.client", "predict", "--server=127.0.0.1:%d" % server.port,
                  "--model_name=colours", "--batch_size=8", *files, check=False)
    assert out.returncode == 1
    lines = out.stdout.strip().splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [files[0], files[3], files[7]]
    for line, colour in zip(lines, ("red", "green", "blue")):
        ranked = [part.split() for part in line.split(": ", 1)[1].split(", ")]
        assert ranked[0][0] == colour and float(ranked[0][1]) > 0.9, line
        assert sorted(name for name, _ in ranked) == sorted(COLOURS), line  # names, not ids
    errors = out.stderr.strip().splitlines()
    reasons = {line.split(": error: ")[0]: line.split(": error: ")[1] for line in errors
               if ": error: " in line}
    assert reasons == {  # in the words every tool uses (slimserve/image_listing.py)
        files[1]: "not a JPEG, PNG, GIF or BMP image (the formats the model decodes)",
        files[2]: reasons[files[2]],
        files[4]: "unreadable: No such file or directory",
        files[5]: "not a regular file: a directory",
        files[6]: "empty file"}
    assert reasons[files[2]].startswith("the server refused it: INVALID_ARGUMENT: ")
    assert errors[-1] == "slimserve-client: 5 of 8 files got no answer (see the error lines " \
        "above)"


def test_json_rows_and_the_signature_flag(server, files):
    target = "--server=127.0.0.1:%d" % server.port
    default = json.loads(run_cli("slimserve.cli.client", "predict", target, "--json",
                                 "--model_name=colours", files[0], files[3]).stdout)
    assert [(r["file"], r["class_id"], r["class"]) for r in default] == [
        (files[0], 0, "red"), (files[3], 1, "green")]
    assert [e["name"] for e in default[0]["top_k"]][0] == "red"
    assert [e["id"] for e in default[0]["top_k"]] == [0, 1, 2]
    reversed_ = json.loads(run_cli("slimserve.cli.client", "predict", target, "--json",
                                   "--model_name=colours", "--signature_name=bgr",
                                   files[0], files[3]).stdout)
    assert [(r["class_id"], r["class"]) for r in reversed_] == [(2, "red"), (1, "green")]
    # Its classes are in another order than classify's: only the name it answered is shown.
    assert [e["name"] for e in reversed_[0]["top_k"]] == ["red", None, None]
    # error paths that stop before any image is sent: run in this process
    refused = run_command("slimserve.cli.client", "predict", target, "--model_name=colours",
                          "--signature_name=pixels", files[0])
    assert refused.code == 1 and refused.stdout == ""
    assert refused.stderr.strip().splitlines()[-1] == (
        "slimserve-client: --signature_name pixels of model colours takes pixels (DT_FLOAT); "
        "encoded image files need a signature with one string input (e.g. "
        "--signature_name=serving_default)")
    missing = run_command("slimserve.cli.client", "predict", target, "--model_name=colours",
                          "--signature_name=nope", files[0])
    assert missing.stderr.strip().splitlines()[-1] == (
        "slimserve-client: --signature_name nope: model colours has no such signature (it has "
        "bgr, classify, pixels, serving_default)")


def test_a_refused_batch_is_split_until_the_bad_image_is_alone(server, files):
    """In the library: the truncated PNG passes the client's checks, fails the server's
    decode, and its batch is halved until it is alone; every other image is answered,
    and the answers equal those of the images sent one by one."""
    client = client_lib.Client("127.0.0.1:%d" % server.port, model_name="colours", retries=0)
    good = [files[0], files[3], files[7]]
    batch = [files[0], files[3], files[2], files[7]]
    together = list(client.predict_files(batch, batch_size=4, top_k=3))
    assert [r.path for r in together] == batch
    assert [r.error is None for r in together] == [True, True, False, True]
    alone = {r.path: r for p in good for r in client.predict_files([p], top_k=3)}
    for result in together:
        if result.error is None:
            expected = alone[result.path]
            assert (result.class_id, result.class_name) == (expected.class_id,
                                                           expected.class_name)
            np.testing.assert_allclose([p for _, _, p in result.top_k],
                                       [p for _, _, p in expected.top_k], rtol=1e-6)
    client.close()
