"""slimserve-compare as a canary that can fail: a candidate that refuses requests the
baseline answers is refused by default, error rates are reported for both models, and
flips are listed by class name from each model's labels.txt."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from slimserve.flywheel import compare
from slimserve.testing.saved_models import signature, write_saved_model
from tests.helpers import ROOT

LABELS = ("cat", "dog")


def _write_model(base, version, scale=(1.0, 1.0), refuse_from=None, labels=LABELS,
                 swap=False):
    """serving_default: x float [-1, 2] -> probabilities softmax(x * scale) (columns
    swapped when `swap`), classes argmax; with `refuse_from`, a request holding a row whose
    x0 >= refuse_from fails (InvalidArgument), as a candidate with a new input check
    would. assets/labels.txt names the classes."""
    def build():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        logits = x * tf.constant([scale], tf.float32)
        if swap:
            logits = tf.reverse(logits, axis=[1])
        if refuse_from is not None:
            check = tf.debugging.Assert(tf.reduce_all(x[:, 0] < refuse_from), ["x0 too large"])
            with tf.control_dependencies([check]):
                logits = tf.identity(logits)
        probabilities = tf.nn.softmax(logits)
        classes = tf.argmax(probabilities, axis=1)
        return {"serving_default": signature(
            {"x": x}, {"probabilities": probabilities, "classes": classes})}

    path = write_saved_model(os.path.join(base, str(version)), build)
    os.makedirs(os.path.join(path, "assets"), exist_ok=True)
    with open(os.path.join(path, "assets", "labels.txt"), "w") as handle:
        handle.write("".join("%d:%s\n" % item for item in enumerate(labels)))
    return path


def _logs(rows):
    """One logged Predict per row, as the server's request log holds them."""
    logs = []
    for row in rows:
        log = prediction_log_pb2.PredictionLog()
        request = log.predict_log.request
        request.model_spec.name = "m"
        request.model_spec.signature_name = "serving_default"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([row], np.float32)))
        logs.append(log)
    return logs


ROWS = [(i / 10.0, 5.0 - i / 20.0) for i in range(100)]  # x0 in 0 .. 9.9


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("canary"))
    return {"baseline": _write_model(base, 1),
            "refuses_90": _write_model(base, 2, refuse_from=1.0),
            "renumbered": _write_model(base, 3, labels=LABELS[::-1], swap=True),
            "flips": _write_model(base, 4, scale=(3.0, 1.0))}


def test_a_candidate_refusing_requests_the_baseline_answers_fails_the_canary(models, tmp_path):
    """Today: 90 refusals out of 100 were "skipped", agreement 1.0 over the other 10,
    and --min_agreement=0.99 passed."""
    report = compare.compare(_logs(ROWS), models["baseline"], models["refuses_90"])
    assert report["requests"] == 100 and report["predictions"] == 100
    assert report["agreement"] == pytest.approx(0.1)
    assert report["candidate_error_rate"] == pytest.approx(0.9)
    assert report["baseline_error_rate"] == 0.0
    assert report["errors_candidate"] == {"INVALID_ARGUMENT": 90}
    assert report["refused_by_candidate_only"] == 90
    assert sum(f["count"] for f in report["flips"]
               if f["candidate"] == "(refused: INVALID_ARGUMENT)") == 90
    assert compare.verdict(report, 0.05, 0.95) == []
    assert len(compare.verdict(report, 0.99)) == 2

    # The reverse (the baseline refuses what the candidate answers) is reported, not
    # compared: those requests say nothing about the candidate's classes.
    reverse = compare.compare(_logs(ROWS), models["refuses_90"], models["baseline"])
    assert reverse["refused_by_baseline_only"] == 90 and reverse["predictions"] == 10
    assert reverse["baseline_error_rate"] == pytest.approx(0.9)
    assert reverse["candidate_error_rate"] == 0.0 and reverse["agreement"] == 1.0

    # The command: refused by default (exit 1), naming the gate; passes when allowed.
    logs_dir = tmp_path / "logs"
    logs_dir.mkdir()
    with tf.io.TFRecordWriter(str(logs_dir / "m-0.tfrecord")) as writer:
        for log in _logs(ROWS):
            writer.write(log.SerializeToString())
    command = [sys.executable, "-m", "slimserve.cli.compare", "--logs",
               str(logs_dir / "m-*"), "--baseline", models["baseline"], "--candidate",
               models["refuses_90"], "--noprogress", "--json_output",
               str(tmp_path / "report.json")]
    refused = subprocess.run(command + ["--min_agreement=0.99"], capture_output=True,
                             text=True, cwd=ROOT, timeout=300)
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert ("candidate REFUSED: candidate error rate 0.9000 > --max_candidate_error_rate "
            "0.0000 (INVALID_ARGUMENT: 90); agreement 0.1000 < --min_agreement 0.9900"
            ) in refused.stderr
    assert "candidate error rate: 0.9000" in refused.stdout
    assert json.loads((tmp_path / "report.json").read_text())["passed"] is False
    allowed = subprocess.run(command + ["--min_agreement=0.05",
                                        "--max_candidate_error_rate=0.95"],
                             capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert allowed.returncode == 0, allowed.stderr[-2000:]


def test_classes_are_compared_and_listed_by_name(models):
    """Two exports that number their classes differently agree when they name the same
    class (by id they would disagree everywhere), and flips read as class names."""
    same = compare.compare(_logs(ROWS), models["baseline"], models["renumbered"])
    assert same["agreement"] == 1.0 and same["flips"] == []
    flipped = compare.compare(_logs(ROWS), models["baseline"], models["flips"])
    expected = sum(1 for x0, x1 in ROWS if (x1 > x0) != (x1 > 3 * x0))
    assert expected and flipped["flips"] == [
        {"baseline": "dog", "candidate": "cat", "count": expected}]
    assert set(flipped["flip_rate_by_baseline_class"]) == {"cat", "dog"}
    assert "dog -> cat: %d" % expected in compare.format_report(flipped)
