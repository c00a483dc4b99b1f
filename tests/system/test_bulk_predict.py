"""Bulk inference on the digits export: image for image the predictions the server gives
(gRPC, in process), the accuracy the estimator's evaluation measured, an error row for
an undecodable image without failing its batch, and the same rows on Beam's
RunInference (DirectRunner)."""
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from tensorflow_serving.apis import prediction_log_pb2

from slimserve.cli import beam as beam_cli
from slimserve.serving.bulk import beam as beam_inference
from slimserve.serving.bulk import inputs as bulk_inputs
from slimserve.serving.bulk import predict as bulk_predict
from slimserve.serving.bulk import report as bulk_report
from slimserve.serving.clients import client as client_lib
from slimserve.serving.config import model_config
from slimserve.testing.commands import run_command
from slimserve.testing.servers import serve_in_process
from tests.helpers import ROOT


# What bulk inference promises whatever the batches it forms (local, Beam, served): the
# same rows in the same order, the same classes, and probabilities within this absolute
# tolerance. Not the same float bits: oneDNN's kernels (on on every x86 CPU) sum in an
# order that depends on the batch (relative 1.2e-5 seen on an AVX2 EPYC).
PROBABILITY_TOLERANCE = 1e-4


def assert_same_row(got, expected):
    """Rows equal in all but float bits: the same class, top-k probabilities within
    PROBABILITY_TOLERANCE, and the same top-k classes except where two of them are a
    near-tie that a batch may order either way."""
    strip = lambda row: {k: v for k, v in row.items() if k != "top_k"}  # noqa: E731
    assert strip(got) == strip(expected)
    got_top, expected_top = got.get("top_k", []), expected.get("top_k", [])
    probabilities = [t["probability"] for t in expected_top]
    np.testing.assert_allclose([t["probability"] for t in got_top], probabilities, rtol=0,
                               atol=PROBABILITY_TOLERANCE)
    for i, (mine, theirs) in enumerate(zip(got_top, expected_top)):
        gaps = [abs(probabilities[i] - probabilities[j]) for j in (i - 1, i + 1)
                if 0 <= j < len(probabilities)]
        if min(gaps, default=1.0) > 2 * PROBABILITY_TOLERANCE:
            assert mine["class_id"] == theirs["class_id"], (got, expected)


def read_rows(path):
    with open(path) as handle:
        return {row["path"]: row for row in map(json.loads, handle)}


@pytest.fixture(scope="module")
def validation_predictions(export_dir, digits_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("bulk")
    output, log = str(out / "validation.jsonl"), str(out / "validation.predlog")
    summary = bulk_predict.predict_local(
        os.path.dirname(export_dir), os.path.join(digits_data, "validation-*-of-*"), output,
        batch_size=32, top_k=3, prediction_log=log, show_progress=False)
    return summary, read_rows(output), log


def test_bulk_equals_served_predictions_and_estimator_accuracy(
        validation_predictions, export_dir, digits_data):
    summary, rows, _ = validation_predictions
    examples = []
    for path in sorted(glob.glob(os.path.join(digits_data, "validation-*-of-*"))):
        for index, record in enumerate(tf.compat.v1.io.tf_record_iterator(path)):
            examples.append(("%s:%d" % (path, index), tf.train.Example.FromString(record)))
    assert sorted(rows) == sorted(key for key, _ in examples)
    assert summary["errors"] == 0 and summary["labelled"] == len(examples)

    server = serve_in_process([model_config.ServedModel("resnet", os.path.dirname(export_dir))],
                              rest_api_port=0)
    client = client_lib.Client("127.0.0.1:%d" % server.port)
    try:
        for start in range(0, len(examples), 50):
            chunk = examples[start:start + 50]
            served = client.predict_images([
                e.features.feature["image/encoded"].bytes_list.value[0] for _, e in chunk])
            for i, (key, _) in enumerate(chunk):
                row = rows[key]
                assert row["class_id"] == int(served["classes"][i]), key
                assert row["class_name"] == served["class_names"][i].decode()
                best = np.sort(served["probabilities"][i])[::-1][:3]
                np.testing.assert_allclose([t["probability"] for t in row["top_k"]], best,
                                           rtol=0, atol=PROBABILITY_TOLERANCE)
    finally:
        client.close()
        server.stop()

    labels = {key: e.features.feature["image/class/text"].bytes_list.value[0].decode()
              for key, e in examples}
    correct = sum(rows[key]["class_name"] == labels[key] for key in rows)
    assert summary["correct"] == correct
    assert summary["accuracy"] == pytest.approx(correct / len(rows))
    recall = summary["per_class"]["3"]["recall"]
    assert recall == pytest.approx(np.mean([rows[k]["class_name"] == "3"
                                            for k in rows if labels[k] == "3"]))
    # The final exporter records the estimator's evaluation of the exported checkpoint.
    with open(os.path.join(export_dir, "assets.extra", "eval_result.json")) as handle:
        assert summary["accuracy"] == pytest.approx(json.load(handle)["accuracy"], abs=1e-6)


def test_prediction_log_holds_request_and_response(validation_predictions):
    _, rows, log = validation_predictions
    logs = [prediction_log_pb2.PredictionLog.FromString(r)
            for r in tf.compat.v1.io.tf_record_iterator(log)]
    assert len(logs) == len(rows)
    first = logs[0].predict_log
    assert first.request.model_spec.signature_name == "serving_default"
    probabilities = tf.make_ndarray(first.response.outputs["probabilities"])
    assert probabilities.shape == (1, 10)
    assert int(np.argmax(probabilities)) in {row["class_id"] for row in rows.values()}


@pytest.fixture(scope="module")
def folder_with_corrupt_image(digits_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("bulk_images") / "images"
    for label in ("4", "7"):
        (root / label).mkdir(parents=True)
        for name in sorted(os.listdir(os.path.join(digits_dir, label)))[:9]:
            shutil.copy(os.path.join(digits_dir, label, name), root / label / name)
    victim = sorted(os.listdir(root / "7"))[0]
    data = (root / "7" / victim).read_bytes()
    (root / "7" / victim).write_bytes(data[:40])  # a PNG header, then nothing
    (root / "4" / "readme.png").write_bytes(b"plain text, not a PNG")
    return str(root), str(root / "7" / victim), str(root / "4" / "readme.png")


def test_corrupt_images_give_error_rows_not_failed_batches(
        folder_with_corrupt_image, export_dir, tmp_path):
    root, truncated, text = folder_with_corrupt_image
    base = os.path.dirname(export_dir)
    batched, single = str(tmp_path / "batched.jsonl"), str(tmp_path / "single.jsonl")
    summary = bulk_predict.predict_local(base, root, batched, batch_size=32,
                                         show_progress=False)
    bulk_predict.predict_local(base, root, single, batch_size=1, show_progress=False)
    rows, alone = read_rows(batched), read_rows(single)
    assert len(rows) == 19 and summary["errors"] == 2 and summary["labelled"] == 17
    for bad in (truncated, text):
        assert "error" in rows[bad] and "class_id" not in rows[bad]
    for path, row in rows.items():  # good images in a batch with bad ones: as if alone
        assert row.keys() == alone[path].keys()
        if "error" not in row:
            assert row["class_id"] == alone[path]["class_id"]
            np.testing.assert_allclose(row["top_k"][0]["probability"],
                                       alone[path]["top_k"][0]["probability"], rtol=0,
                                       atol=PROBABILITY_TOLERANCE)
    listed = tmp_path / "list.csv"  # a CSV of path,label; relative paths from the CSV
    chosen = [truncated] + sorted(p for p in rows if p != truncated and p != text)[:3]
    listed.write_text("path,label\n" + "".join(
        "%s,%s\n" % (os.path.relpath(p, str(tmp_path)), rows[p]["label"]) for p in chosen))
    from_csv = str(tmp_path / "csv.jsonl")
    bulk_predict.predict_local(base, str(listed), from_csv, show_progress=False)
    csv_rows = read_rows(from_csv)
    assert [os.path.normpath(p) for p in csv_rows] == chosen
    for path, row in csv_rows.items():
        assert_same_row(row, rows[os.path.normpath(path)] | {"path": path})
    png = str(tmp_path / "confusion.png")
    bulk_report.write_summary(summary, str(tmp_path / "summary.json"), png)
    with open(png, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


def test_beam_runinference_gives_the_local_rows(folder_with_corrupt_image, export_dir,
                                                 tmp_path):
    root, truncated, _ = folder_with_corrupt_image
    base = os.path.dirname(export_dir)
    local, beam = str(tmp_path / "local.jsonl"), str(tmp_path / "beam.jsonl")
    bulk_predict.predict_local(base, root, local, batch_size=8, show_progress=False)
    summary = beam_inference.predict_beam(base, root, beam,
                                          beam_cli.pipeline_options("DirectRunner"), batch_size=8)
    local_rows, beam_rows = read_rows(local), read_rows(beam)
    assert sorted(beam_rows) == sorted(local_rows)
    assert "error" in beam_rows[truncated] and summary["errors"] == 2
    for path, row in local_rows.items():
        assert beam_rows[path].get("class_id") == row.get("class_id"), path
        if "top_k" in row:
            np.testing.assert_allclose([t["probability"] for t in beam_rows[path]["top_k"]],
                                       [t["probability"] for t in row["top_k"]], rtol=0,
                                       atol=PROBABILITY_TOLERANCE)


def test_model_version_and_missing_input_are_named(export_dir, tmp_path):
    base = os.path.dirname(export_dir)
    with pytest.raises(bulk_predict.BulkPredictError, match="--model_version 999 not found"):
        bulk_predict.model_path(base, 999)
    with pytest.raises(bulk_predict.BulkPredictError, match="matches no file"):
        bulk_inputs.list_inputs(str(tmp_path / "nothing-*.png"))


def _predict_cli(*args, timeout=600, prefix=(), env=None):
    command = list(prefix) + [sys.executable, "-m", "slimserve.cli.predict"] + [
        str(a) for a in args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env)


@pytest.mark.cost(10)
def test_a_long_input_list_is_read_ahead_boundedly_under_a_memory_cap(export_dir, tmp_path):
    """3,000 rows naming a 2 MiB image: every file read at once took 6 GB (a 40,000-row CSV
    reached 4.2 GB and SIGSEGV); read ahead --read_ahead at a time it fits a 4.5 GB
    address-space cap, TensorFlow and the model included."""
    image = io.BytesIO()
    Image.fromarray(np.random.RandomState(0).randint(0, 255, (32, 32, 3), np.uint8)).save(
        image, "JPEG")
    padded = tmp_path / "padded.jpg"  # decoders stop at the JPEG's end: cheap to score
    padded.write_bytes(image.getvalue() + b"\0" * (2 << 20))
    listing = tmp_path / "many.csv"
    listing.write_text("path,label\n" + "padded.jpg,7\n" * 3000)
    output = tmp_path / "many.jsonl"
    env = dict(os.environ, MALLOC_ARENA_MAX="2")  # the cap measures data, not arenas
    out = _predict_cli("--model_base_path", os.path.dirname(export_dir), "--input", listing,
                       "--output", output, "--noprogress",
                       prefix=["prlimit", "--as=%d" % (4500 * 1024 ** 2)], env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "many.jsonl.summary.json").read_text())
    assert summary["images"] == summary["predicted"] == 3000


@pytest.mark.cost(11)
def test_pipes_and_folders_are_error_rows_and_the_bar_counts_predictions(
        export_dir, digits_data, digits_dir, tmp_path):
    """A named pipe blocked the run forever; now it is an error row with the reason, as
    the converter skips it. With TFRecord shards the bar counted 2 shards, not 359
    predictions."""
    root = tmp_path / "images"
    (root / "3").mkdir(parents=True)
    good = sorted(os.listdir(os.path.join(digits_dir, "3")))[0]
    shutil.copy(os.path.join(digits_dir, "3", good), root / "3" / good)
    os.mkfifo(root / "3" / "pipe.png")
    listing = tmp_path / "list.csv"
    listing.write_text("images/3/pipe.png,3\nimages/3\nimages/3/%s,3\n" % good)
    base = os.path.dirname(export_dir)
    for source in (root, listing):
        output = tmp_path / "out.jsonl"
        out = _predict_cli("--model_base_path", base, "--input", source, "--output", output,
                           "--noprogress", timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        rows = [json.loads(line) for line in output.read_text().splitlines()]
        errors = {os.path.basename(r["path"]): r["error"] for r in rows if "error" in r}
        assert errors.pop("pipe.png") == "not a regular file: a FIFO (named pipe)"
        assert errors == ({} if source == root else {"3": "not a regular file: a directory"})
        assert [os.path.basename(r["path"]) for r in rows if "error" not in r] == [good]

    shards = os.path.join(digits_data, "validation-*-of-*")
    out = _predict_cli("--model_base_path", base, "--input", shards, "--output",
                       tmp_path / "shards.jsonl", "--progress")
    assert out.returncode == 0, out.stderr[-3000:]
    count = len((tmp_path / "shards.jsonl").read_text().splitlines())
    assert re.search(r"predicting: %dimg \[" % count, out.stderr), out.stderr[-1000:]


def test_an_output_that_is_a_folder_fails_before_any_inference(export_dir, digits_dir,
                                                               tmp_path):
    """Today every image was scored, then the run died with a traceback at the rename."""
    out = run_command("slimserve.cli.predict", "--model_base_path",
                      os.path.dirname(export_dir), "--input", digits_dir, "--output", tmp_path)
    assert out.code == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "slimserve-predict: --output %s is a directory; give the path of a file to write"
        % tmp_path)
    assert not os.path.exists(str(tmp_path) + ".partial")  # nothing was scored
    with pytest.raises(bulk_predict.BulkPredictError, match="--prediction_log .*folder "
                       ".*missing does not exist"):
        bulk_predict.check_settings(str(tmp_path / "x.jsonl"),
                                    str(tmp_path / "missing" / "log"), 32)


def test_folder_names_that_are_not_the_model_classes_get_no_accuracy(export_dir, digits_dir,
                                                                      tmp_path):
    """Digits filed under words ("four", "seven"): the predictions are written, but no
    accuracy is reported (it was 0.0), and the command says which folders are not classes."""
    root = tmp_path / "words"
    for label, word in (("4", "four"), ("7", "seven")):
        (root / word).mkdir(parents=True)
        for name in sorted(os.listdir(os.path.join(digits_dir, label)))[:3]:
            shutil.copy(os.path.join(digits_dir, label, name), root / word / name)
    output = tmp_path / "preds.jsonl"
    out = run_command("slimserve.cli.predict", "--model_base_path", os.path.dirname(export_dir),
                      "--input", root, "--output", output, "--noprogress")
    assert out.code == 0, out.output[-3000:]
    assert len(read_rows(str(output))) == 6
    assert '"accuracy"' not in out.stdout
    assert ("slimserve-predict: no accuracy: no folder name (true label) is a class of the "
            "model: four, seven; its classes are 0, 1, 2, 3, 4, 5, 6, 7, 8, 9.") in out.stderr
    summary = json.loads((tmp_path / "preds.jsonl.summary.json").read_text())
    assert "accuracy" not in summary and summary["not_classes"] == ["four", "seven"]
