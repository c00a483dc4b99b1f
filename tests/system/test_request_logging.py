"""Request logging (TF Serving's logging_config with a collector that writes), warmup
built from logged traffic, and the canary comparison of two versions on that traffic."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import classification_pb2
from tensorflow_serving.apis import model_pb2
from tensorflow_serving.apis import predict_pb2

from slimserve import errors as user_errors
from slimserve.export import warmup
from slimserve.flywheel import compare
from slimserve.serving.core import servable as servable_lib
from slimserve.serving.observability import request_log
from slimserve.testing import tiny_models
from tests.helpers import ROOT


def _predict(x, signature="serving_default"):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    request.model_spec.signature_name = signature
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(x, np.float32)))
    response = predict_pb2.PredictResponse()
    response.model_spec.name = "tiny"
    response.model_spec.version.value = 1
    return request, response


def _classify(rows):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "tiny"
    request.model_spec.signature_name = "classify"
    request.model_spec.version.value = 7
    for x0, x1 in rows:
        request.input.example_list.examples.add().CopyFrom(tiny_models.tiny_example(x0, x1))
    return request, classification_pb2.ClassificationResponse()


def _spec():
    spec = model_pb2.ModelSpec(name="tiny", signature_name="serving_default")
    spec.version.value = 1
    return spec


def test_logs_rotate_by_size_are_published_whole_and_flush_on_close(tmp_path):
    prefix = str(tmp_path / "logs" / "tiny")
    logger = request_log.RequestLogger(
        prefix, 1.0, request_log.RequestLogOptions(max_file_bytes=2000), seed=0)
    for index in range(40):
        request, response = _predict([[index, index + 1.0]])
        assert logger.maybe_log("predict", request, response, _spec())
    logger.close()
    names = sorted(os.listdir(tmp_path / "logs"))
    assert names and all(n.startswith("tiny-") and n.endswith(".tfrecord") for n in names)
    assert len(names) > 1  # rotated by size
    logs = request_log.read_logs(prefix + "*")
    assert len(logs) == logger.written == 40
    first = logs[0]
    assert first.log_metadata.model_spec.name == "tiny"
    assert first.log_metadata.sampling_config.sampling_rate == 1.0
    assert first.log_metadata.timestamp_secs > 0
    assert tf.make_ndarray(first.predict_log.request.inputs["x"]).tolist() == [[0.0, 1.0]]


def test_an_open_file_is_hidden_until_its_age_closes_it(tmp_path):
    prefix = str(tmp_path / "tiny")
    logger = request_log.RequestLogger(
        prefix, 1.0, request_log.RequestLogOptions(max_file_seconds=0.3))
    request, response = _predict([[1.0, 2.0]])
    logger.maybe_log("predict", request, response, _spec())
    from slimserve.testing.servers import wait_until  # pylint: disable=import-outside-toplevel
    # While open, only a hidden temporary exists, which readers skip.
    wait_until(lambda: os.listdir(tmp_path), timeout=10, message="the log file to open")
    wait_until(lambda: [n for n in os.listdir(tmp_path) if not n.startswith(".")],
               timeout=10, message="the file to close by age")
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []
    logger.close()


def test_sampling_and_a_full_queue_never_block_and_are_counted(tmp_path):
    sampled = request_log.RequestLogger(str(tmp_path / "a" / "s"), 0.05, seed=1)
    request, response = _predict(np.zeros([1, 2]))
    queued = sum(sampled.maybe_log("predict", request, response, _spec()) for _ in range(2000))
    sampled.close()
    assert 50 <= queued <= 160 and sampled.written == queued and sampled.dropped == 0

    # One slot and big records: the writer cannot keep up, records are dropped and
    # counted, the caller is never blocked.
    full = request_log.RequestLogger(str(tmp_path / "b" / "f"), 1.0,
                                     request_log.RequestLogOptions(queue_records=1))
    big, big_response = _predict(np.zeros([20000, 2]))
    accepted = sum(full.maybe_log("predict", big, big_response, _spec()) for _ in range(300))
    full.close()
    assert full.dropped > 0 and full.written == accepted and accepted + full.dropped == 300


def test_bad_logging_configs_name_the_field(tmp_path):
    with pytest.raises(user_errors.UserError, match="sampling_rate"):
        request_log.RequestLogger(str(tmp_path / "x"), 1.5)
    with pytest.raises(user_errors.UserError, match="filename_prefix"):
        request_log.RequestLogger("", 1.0)
    (tmp_path / "junk.tfrecord").write_bytes(b"not a tfrecord at all")
    with pytest.raises(user_errors.UserError, match="junk.tfrecord"):
        request_log.read_logs(str(tmp_path / "junk*"))


def test_warmup_from_traffic_keeps_one_request_per_signature_and_shape(tmp_path):
    prefix = str(tmp_path / "t")
    logger = request_log.RequestLogger(prefix, 1.0)
    for batch in (1, 1, 4, 4, 1):
        request, response = _predict(np.ones([batch, 2]))
        logger.maybe_log("predict", request, response, _spec())
    request, response = _classify([(1, 2), (3, 4)])
    logger.maybe_log("classify", request, response, _spec())
    logger.close()
    records = warmup.traffic_warmup(prefix + "*")
    shapes = [tuple(d.size for d in r.predict_log.request.inputs["x"].tensor_shape.dim)
              for r in records if r.WhichOneof("log_type") == "predict_log"]
    assert sorted(shapes) == [(1, 2), (4, 2)]
    classify = [r for r in records if r.WhichOneof("log_type") == "classify_log"]
    assert len(classify) == 1
    assert not classify[0].classify_log.request.model_spec.HasField("version")  # unpinned
    assert warmup.traffic_warmup(str(tmp_path / "none*")) == []  # falls back

    # The records are a valid warmup file for the model that served the traffic.
    base = tmp_path / "models"
    path = tiny_models.write_tiny_model(str(base))
    os.makedirs(os.path.join(path, "assets.extra"))
    warmup.write_warmup(os.path.join(path, servable_lib.WARMUP_PATH), records)
    servable = servable_lib.Servable("tiny", 1, path)
    try:
        assert servable.warm_up() == len(records) == 3
    finally:
        servable.retire()


def test_compare_reports_agreement_flips_and_refuses_by_exit_code(tmp_path):
    base = str(tmp_path / "models")
    tiny_models.write_tiny_model(base, 1)
    tiny_models.write_tiny_model(base, 2, scale=(1.0, 1.0))
    tiny_models.write_tiny_model(base, 3, scale=(3.0, 1.0))  # disagrees where x0 > x1 / 3
    prefix = str(tmp_path / "logs" / "tiny")
    logger = request_log.RequestLogger(prefix, 1.0)
    rows = [(float(i % 7) - 3.0, float(i % 5) - 2.0) for i in range(60)]
    for start in range(0, 60, 6):
        request, response = _classify(rows[start:start + 6])
        logger.maybe_log("classify", request, response, _spec())
    logger.close()
    logs = request_log.read_logs(prefix + "*")

    same = compare.compare(logs, os.path.join(base, "1"), os.path.join(base, "2"))
    assert same["agreement"] == 1.0 and same["flips"] == []
    assert same["max_abs_dp"]["max"] == 0.0 and same["predictions"] == 60

    # Where softmax(x) and softmax(x * [3, 1]) pick different classes, by hand:
    expected_flips = sum(1 for x0, x1 in rows if (x1 > x0) != (x1 > 3 * x0))
    different = compare.compare(logs, os.path.join(base, "1"), os.path.join(base, "3"))
    assert expected_flips > 0
    assert different["agreement"] == pytest.approx(1 - expected_flips / 60)
    assert sum(f["count"] for f in different["flips"]) == expected_flips
    assert different["latency_ms_baseline"]["p50"] > 0

    command = [sys.executable, "-m", "slimserve.cli.compare", "--logs", prefix + "*",
               "--baseline", os.path.join(base, "1"), "--candidate", base,
               "--min_agreement", "0.99", "--noprogress", "--json_output",
               str(tmp_path / "report.json")]
    refused = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert "REFUSED" in refused.stderr and "flips" in refused.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["passed"] is False and report["agreement"] < 0.99
