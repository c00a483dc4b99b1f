"""Nothing a client chooses grows the server (issue 21, class 3): model names (one huge,
or thousands of distinct ones), signature names and version labels cost neither memory,
nor metric series, nor status-page rows. A real slimserve-server process under a memory
cap, real gRPC and REST on loopback."""
import concurrent.futures
import http.client
import subprocess
import urllib.parse

import grpc
import numpy as np
import pytest
import tensorflow as tf
from prometheus_client import parser
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from slimserve.serving.observability import metrics as metrics_lib
from slimserve.testing import tiny_models
from tests.helpers import start_server_process, stop_process

CAP = ["prlimit", "--as=%d" % (3 * 1024 ** 3)]


def _rss_mb(pid):
    with open("/proc/%d/status" % pid) as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no VmRSS for %d" % pid)


def _request(name, signature="", label=""):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = signature
    if label:
        request.model_spec.version_label = label
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones([1, 2], np.float32)))
    return request


def _code(predict, request):
    try:
        predict(request, timeout=60)
        return grpc.StatusCode.OK
    except grpc.RpcError as error:
        return error.code()


def _families(text):
    """{name: family} by prometheus_client's own parser."""
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def _get(port, path):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", path)
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response.status, body


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("growth")
    tiny_models.write_tiny_model(str(root / "tiny"), 1)
    monitoring = root / "monitoring.config"
    monitoring.write_text("prometheus_config { enable: true }")
    process, port, rest_port = start_server_process(
        ["--model_name=tiny", "--model_base_path=%s" % (root / "tiny"),
         "--monitoring_config_file=%s" % monitoring, "--file_system_poll_wait_seconds=0",
         "--enable_model_warmup=false", "--status_page"], prefix=CAP,
        stderr=subprocess.DEVNULL)
    yield process, port, rest_port
    stop_process(process, timeout=60)


def test_one_huge_unknown_model_name_keeps_no_memory(server):
    process, port, _ = server
    huge = "m" * (8 << 20)  # 8 MiB
    with grpc.insecure_channel("127.0.0.1:%d" % port, options=[
            ("grpc.max_send_message_length", 64 << 20)]) as channel:
        predict = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict
        for _ in range(5):  # first-call allocations are not growth
            _code(predict, _request(huge))
        before = _rss_mb(process.pid)
        codes = {_code(predict, _request(huge)) for _ in range(40)}
        after = _rss_mb(process.pid)
        assert _code(predict, _request("tiny")) == grpc.StatusCode.OK
    assert process.poll() is None, "server died"
    print("RSS %.0f -> %.0f MB over 40 requests naming an 8 MiB model" % (before, after))
    assert after - before < 100, (before, after)
    assert codes == {grpc.StatusCode.INVALID_ARGUMENT}, codes  # name too long, said early


def test_distinct_client_names_add_no_series_and_no_rows(server):
    process, port, rest_port = server
    names = ["unknown-model-%05d" % i for i in range(3000)]
    with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
        predict = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = set(pool.map(lambda n: _code(predict, _request(n)), names))
            codes |= set(pool.map(lambda i: _code(predict, _request(
                "tiny", signature="sig-%d" % i)), range(300)))
            codes |= set(pool.map(lambda i: _code(predict, _request(
                "tiny", label="label-%d" % i)), range(300)))
        assert _code(predict, _request("tiny")) == grpc.StatusCode.OK
    assert grpc.StatusCode.OK not in codes
    for i in range(200):  # and over REST, names in the URL
        status, _ = _get(rest_port, "/v1/models/%s/metadata" % urllib.parse.quote(
            "rest-unknown-%d" % i))
        assert status == 404
    status, body = _get(rest_port, metrics_lib.PATH)
    assert status == 200 and len(body) < 200_000, len(body)
    text = body.decode()
    assert "unknown-model-" not in text and "sig-1" not in text and "label-1" not in text
    families = _families(text)
    count = families[metrics_lib.REQUEST_COUNT]
    models = {s.labels["model_name"] for s in count.samples}
    assert models == {"tiny", metrics_lib.UNKNOWN_MODEL}
    unknown = sum(s.value for s in count.samples
                  if s.labels["model_name"] == metrics_lib.UNKNOWN_MODEL)
    assert unknown >= 3200
    assert {s.labels["model_name"]
            for s in families[metrics_lib.REQUEST_LATENCY].samples} == {"tiny"}
    status, page = _get(rest_port, "/")
    assert status == 200 and len(page) < 20_000, len(page)
    assert b"unknown-model-" not in page and b"rest-unknown" not in page
    with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:  # and bounded in length
        predict = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict
        assert _code(predict, _request("tiny", signature="s" * 5000)) == \
            grpc.StatusCode.INVALID_ARGUMENT
        assert _code(predict, _request("tiny", label="l" * 5000)) == \
            grpc.StatusCode.INVALID_ARGUMENT
    assert process.poll() is None
