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

from slimserve.serving.clients import client as client_lib
from slimserve.serving.config import model_config
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


@pytest.mark.cost(11)
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


def _labelled_folder(root, layout):
    """layout: {folder name: [(file name, bytes)]}."""
    for label, entries in layout.items():
        (root / label).mkdir(parents=True)
        for name, data in entries:
            (root / label / name).write_bytes(data)
    return str(root)


def test_accuracy_through_the_server_with_recall_matrix_and_bad_files_named(server,
                                                                            tmp_path):
    png = _image("red", "PNG")
    folder = _labelled_folder(tmp_path / "held_out", {
        "red": [("r1.png", png), ("r2.jpg", _image("red", "JPEG"))],
        "green": [("g1.png", _image("green", "PNG")), ("g2.png", png)],  # g2 is red: wrong
        "blue": [("b1.bmp", _image("blue", "BMP")), ("notes.txt", b"not an image\n"),
                 ("cut.png", png[:len(png) // 2])]})
    target = "--server=127.0.0.1:%d" % server.port
    picture, summary = tmp_path / "confusion.png", tmp_path / "summary.json"
    out = run_command("slimserve.cli.client", "accuracy", target, "--model_name=colours",
                      "--batch_size=4", "--noprogress", "--confusion_matrix=%s" % picture,
                      "--summary=%s" % summary, folder)
    assert out.code == 0, out.output[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "7 images: 5 answered, 2 errors"
    assert lines[1] == "accuracy 0.8000 (4 of 5 labelled images)"
    assert lines[2:4] == ["per-class recall:", "  class      recall  support"]
    recall = {line.split()[0]: line.split()[1:] for line in lines[4:7]}
    assert recall == {"blue": ["1.0000", "1"], "green": ["0.5000", "2"],
                      "red": ["1.0000", "2"]}
    assert lines[7] == "confusion matrix (rows: true class, columns: predicted):"
    assert lines[9].split() == ["0", "blue", "1", ".", "."]
    assert lines[10].split() == ["1", "green", ".", "1", "1"]
    # The files that got no answer are named and skipped, in the shared words.
    skipped = {line.split(": error: ")[0]: line.split(": error: ")[1]
               for line in out.stderr.splitlines() if ": error: " in line}
    assert skipped[os.path.join(folder, "blue", "notes.txt")] == (
        "not a JPEG, PNG, GIF or BMP image (the formats the model decodes) (skipped)")
    assert skipped[os.path.join(folder, "blue", "cut.png")].startswith(
        "the server refused it: INVALID_ARGUMENT")
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = json.loads(summary.read_text())
    assert written["accuracy"] == 0.8 and written["confusion_matrix"] == [
        [1, 0, 0], [0, 1, 1], [0, 0, 2]]
    # A CSV of path,label scores the same way.
    listed = tmp_path / "list.csv"
    listed.write_text("path,label\nheld_out/red/r1.png,red\nheld_out/green/g2.png,green\n")
    from_csv = run_command("slimserve.cli.client", "accuracy", target, "--model_name=colours",
                           "--noprogress", str(listed))
    assert "accuracy 0.5000 (1 of 2 labelled images)" in from_csv.stdout


def test_folder_names_that_are_not_classes_get_no_accuracy(server, tmp_path):
    """Folders named in another language than the model's classes: said, no accuracy
    (it would be 0.0, every image counted wrong)."""
    folder = _labelled_folder(tmp_path / "french", {
        "rouge": [("r.png", _image("red", "PNG"))], "vert": [("v.png", _image("green", "PNG"))]})
    out = run_command("slimserve.cli.client", "accuracy", "--server=127.0.0.1:%d" % server.port,
                      "--model_name=colours", "--noprogress", folder)
    assert out.code == 1
    assert "accuracy" not in out.stdout.replace("no accuracy", "")
    assert out.stderr.strip().splitlines()[-1] == (
        "slimserve-client: no accuracy: no folder name (true label) is a class of the model: "
        "rouge, vert; its classes are blue, green, red. Accuracy would count every such image "
        "as wrong, so none is reported: name the folders (or the CSV's labels) as the "
        "model's classes")
    partly = _labelled_folder(tmp_path / "partly", {
        "red": [("r.png", _image("red", "PNG"))], "vert": [("v.png", _image("green", "PNG"))]})
    out = run_command("slimserve.cli.client", "accuracy", "--server=127.0.0.1:%d" % server.port,
                      "--model_name=colours", "--noprogress", partly)
    assert out.code == 1 and "1 of 2 folder names (true labels) are not classes of the " \
        "model: vert" in out.stderr
