"""The embedded server over real gRPC and HTTP on loopback, against a real export."""
import base64
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from slimserve.estimator import splits
from slimserve.export import signatures
from slimserve.export import verify
from slimserve.serving.clients import client as client_lib
from slimserve.serving.config import messages
from slimserve.serving.config import model_config
from slimserve.serving.core import batching
from slimserve.serving.observability import metrics
from slimserve.testing.servers import serve_in_process, wait_until
from tests.helpers import rest_json, start_server_process


def _images(data_dir, count):
    return splits.read_images(data_dir, "validation", count)[0]


@pytest.fixture(scope="module")
def base_path(tmp_path_factory, export_dir):
    base = tmp_path_factory.mktemp("models") / "resnet"
    base.mkdir()
    shutil.copytree(export_dir, base / "1")
    return str(base)


@pytest.fixture(scope="module")
def server(base_path):
    instance = serve_in_process(
        [model_config.ServedModel("resnet", base_path)], file_system_poll_wait_seconds=0.2,
        batching_parameters=batching.BatchingParameters(max_batch_size=16,
                                                        batch_timeout_micros=2000),
        monitoring_config=messages.prometheus_monitoring("/monitoring/prometheus/metrics"))
    yield instance
    instance.stop()


def _rss_mb():
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no VmRSS")



@pytest.fixture(scope="module")
def client(server):
    instance = client_lib.Client("127.0.0.1:%d" % server.port, retries=0)
    yield instance
    instance.close()


def _in_process(export_dir, images):
    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        return verify.run_signature(session, meta, signatures.DEFAULT,
                                    {signatures.IMAGE_BYTES: np.array(images, dtype=object)})


def _rest(server, path, body=None):
    return rest_json(server.rest_api_port, path, body)


def test_grpc_predictions_equal_in_process_results(client, export_dir, digits_data):
    images = _images(digits_data, 8)
    served = client.predict_images(images)
    local = _in_process(export_dir, images)
    np.testing.assert_allclose(served["probabilities"], local["probabilities"], atol=1e-6)
    assert served["classes"].tolist() == local["classes"].tolist()
    classified = client.classify(images)
    assert [max(pairs, key=lambda p: p[1])[0] for pairs in classified] == [
        n.decode() for n in served["class_names"]]
    assert set(client.metadata()) == {"serving_default", "predict_images", "classify",
                                      "embeddings"}
    assert client.status() == [(1, "AVAILABLE", "")]


def test_rest_b64_row_and_columnar_match_grpc(server, client, digits_data):
    images = _images(digits_data, 4)
    grpc_classes = client.predict_images(images)["classes"].tolist()
    b64 = [{"b64": base64.b64encode(i).decode()} for i in images]
    status, rows = _rest(server, "/v1/models/resnet:predict", {"instances": b64})
    assert status == 200
    assert [r["classes"] for r in rows["predictions"]] == grpc_classes
    assert [r["class_names"] for r in rows["predictions"]] == [str(c) for c in grpc_classes]
    status, columns = _rest(server, "/v1/models/resnet/versions/1:predict",
                            {"inputs": {"image_bytes": b64}})
    assert status == 200 and columns["outputs"]["classes"] == grpc_classes
    status, classified = _rest(server, "/v1/models/resnet:classify", {
        "signature_name": "classify",
        "examples": [{"image/encoded": item} for item in b64]})
    assert status == 200
    assert [max(r, key=lambda p: p[1])[0] for r in classified["results"]] == [
        str(c) for c in grpc_classes]
    status, meta = _rest(server, "/v1/models/resnet/metadata")
    assert status == 200 and "classify" in meta["metadata"]["signature_def"]["signature_def"]
    status, state = _rest(server, "/v1/models/resnet")
    assert state["model_version_status"][0]["state"] == "AVAILABLE"


@pytest.mark.parametrize("case, feeds, spec, code", [
    ("wrong dtype", {"image_bytes": np.zeros([1], np.float32)}, {}, "INVALID_ARGUMENT"),
    # Shapes are the graph's to judge, as in TF Serving: [1, 5, 5, 3] images run (the
    # graph resizes them); a rank its ops cannot take is their INVALID_ARGUMENT.
    ("wrong rank", {"images": np.zeros([5, 5, 3], np.float32)},
     {"signature_name": "predict_images"}, "INVALID_ARGUMENT"),
    ("non-image bytes", {"image_bytes": np.array([b"hello"], dtype=object)}, {},
     "INVALID_ARGUMENT"),
    ("wrong input key", {"pixels": np.array([b"x"], dtype=object)}, {}, "INVALID_ARGUMENT"),
    ("unknown model", {"image_bytes": np.array([b"x"], dtype=object)}, {"name": "nope"},
     "NOT_FOUND"),
    ("unknown version", {"image_bytes": np.array([b"x"], dtype=object)}, {"version": 99},
     "NOT_FOUND"),
    ("unknown signature", {"image_bytes": np.array([b"x"], dtype=object)},
     {"signature_name": "nope"}, "FAILED_PRECONDITION"),  # as TF Serving's predict_util.cc
])
def test_grpc_error_battery(server, client, digits_data, case, feeds, spec, code):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(client.channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = spec.get("name", "resnet")
    if "version" in spec:
        request.model_spec.version.value = spec["version"]
    request.model_spec.signature_name = spec.get("signature_name", "serving_default")
    for key, value in feeds.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(request, timeout=30)
    assert caught.value.code().name == code, (case, caught.value.details())
    assert caught.value.details()
    # and the server keeps serving
    assert client.predict_images(_images(digits_data, 1))["classes"].shape == (1,)


@pytest.mark.parametrize("signature, feeds", [
    ("serving_default", {"image_bytes": np.array([], dtype=object)}),
    ("predict_images", {"images": np.zeros([0, 32, 32, 3], np.float32)}),
])
def test_an_empty_batch_answers_empty_outputs_on_every_cpu(server, client, signature, feeds):
    """Zero rows answer OK with zero-row outputs shaped as the signature declares, as TF
    Serving's Eigen kernels do; oneDNN's (on here on every x86 CPU) would answer a wrong
    shape or INVALID_ARGUMENT (serving/core/empty_batch.py)."""
    stub = prediction_service_pb2_grpc.PredictionServiceStub(client.channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "resnet"
    request.model_spec.signature_name = signature
    for key, value in feeds.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    response = stub.Predict(request, timeout=30)
    outputs = {key: tf.make_ndarray(value) for key, value in response.outputs.items()}
    assert outputs["classes"].shape == (0,) and outputs["classes"].dtype == np.int64
    assert outputs["probabilities"].shape == (0, 10)
    assert outputs["probabilities"].dtype == np.float32
    assert response.outputs["class_names"].dtype == tf.string.as_datatype_enum


def test_unknown_output_filter_is_invalid(client, digits_data):
    with pytest.raises(grpc.RpcError) as caught:
        client.predict({"image_bytes": _images(digits_data, 1)}, output_filter=["nope"])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    only = client.predict({"image_bytes": _images(digits_data, 1)}, output_filter=["classes"])
    assert set(only) == {"classes"}


@pytest.mark.parametrize("case, path, body, status", [
    ("malformed JSON", "/v1/models/resnet:predict", b"{not json", 400),
    ("b64 garbage", "/v1/models/resnet:predict", {"instances": [{"b64": "***"}]}, 400),
    ("non-image bytes", "/v1/models/resnet:predict",
     {"instances": [{"b64": base64.b64encode(b"hello").decode()}]}, 400),
    ("unknown model", "/v1/models/nope:predict", {"instances": [{"b64": "aGk="}]}, 404),
    ("unknown version", "/v1/models/resnet/versions/7:predict",
     {"instances": [{"b64": "aGk="}]}, 404),
    ("rows and columns", "/v1/models/resnet:predict",
     {"instances": [{"b64": "aGk="}], "inputs": [{"b64": "aGk="}]}, 400),
    ("bad path", "/v1/nothing", {"instances": []}, 400),  # TF Serving: Malformed request
])
def test_rest_error_battery(server, case, path, body, status):
    code, payload = _rest(server, path, body)
    assert code == status, (case, payload)
    assert payload["error"]


def test_oversized_message_is_resource_exhausted(base_path, digits_data):
    small = serve_in_process([model_config.ServedModel("resnet", base_path)], rest_api_port=0,
                             grpc_channel_arguments="grpc.max_receive_message_length=65536")
    try:
        client = client_lib.Client("127.0.0.1:%d" % small.port, retries=0)
        with pytest.raises(grpc.RpcError) as caught:
            client.predict({"images": np.zeros([40, 32, 32, 3], np.float32)},
                           signature_name="predict_images")
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert client.predict_images(_images(digits_data, 1))["classes"].shape == (1,)
    finally:
        small.stop()


def test_200_concurrent_requests_with_batching_all_succeed(server, client, digits_data):
    images = _images(digits_data, 20)
    before = server.batcher.batches_run, server.batcher.rows_run
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        results = list(pool.map(lambda i: client.predict_images([images[i % 20]]), range(200)))
    assert len(results) == 200
    # two requests: one of 20 rows is above max_batch_size, which TF Serving refuses
    reference = (client.predict_images(images[:10])["classes"].tolist() +
                 client.predict_images(images[10:])["classes"].tolist())
    assert [r["classes"][0] for r in results] == [reference[i % 20] for i in range(200)]
    batches = server.batcher.batches_run - before[0]
    rows = server.batcher.rows_run - before[1]
    assert rows >= 200 and batches < 200  # requests really were merged
    with urllib.request.urlopen("http://127.0.0.1:%d/monitoring/prometheus/metrics"
                                % server.rest_api_port) as response:
        text = response.read().decode()
    # the histogram a dashboard reads (and the tuner, through metrics.batch_totals)
    assert metrics.batch_totals(text) == (server.batcher.rows_run,
                                          server.batcher.batches_run)


def test_full_queue_answers_unavailable_and_recovers(base_path, digits_data):
    tight = serve_in_process(
        [model_config.ServedModel("resnet", base_path)], rest_api_port=0,
        batching_parameters=batching.BatchingParameters(
            max_batch_size=1, batch_timeout_micros=0, max_enqueued_batches=1,
            num_batch_threads=1))
    try:
        client = client_lib.Client("127.0.0.1:%d" % tight.port, retries=0)
        image = _images(digits_data, 1)

        def call(_):
            try:
                client.predict_images(image)
                return "OK"
            except grpc.RpcError as error:
                return error.code().name

        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            codes = list(pool.map(call, range(96)))
        assert set(codes) <= {"OK", "UNAVAILABLE"}
        assert "UNAVAILABLE" in codes and "OK" in codes
        assert call(0) == "OK"
    finally:
        tight.stop()


@pytest.mark.cost(9)
def test_new_version_under_load_is_picked_up_with_zero_failures(server, client, base_path,
                                                                export_dir, digits_data):
    images = _images(digits_data, 4)
    stop = threading.Event()
    failures, versions = [], []

    def load():
        stub = prediction_service_pb2_grpc.PredictionServiceStub(client.channel)
        while not stop.is_set():
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "resnet"
            request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto(images))
            try:
                versions.append(stub.Predict(request, timeout=30).model_spec.version.value)
            except grpc.RpcError as error:
                failures.append(error.code().name)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(versions) >= 20, timeout=60, message="traffic on version 1")
    staging = os.path.join(base_path, ".incoming")
    shutil.copytree(export_dir, staging)
    os.rename(staging, os.path.join(base_path, "2"))
    wait_until(lambda: versions and versions[-1] == 2, timeout=60, message="version 2")
    swapped = len(versions)
    # Soak on the new version for a fixed amount of work, not of time: memory stays flat.
    wait_until(lambda: len(versions) >= swapped + 20, timeout=60, message="20 requests on v2")
    served_before, rss_before = len(versions), _rss_mb()
    wait_until(lambda: len(versions) >= served_before + 100, timeout=120,
               message="the 100-request soak")
    served_after, rss_after = len(versions), _rss_mb()
    stop.set()
    for thread in threads:
        thread.join()
    assert failures == []
    assert versions[0] == 1 and versions[-1] == 2
    assert served_after - served_before >= 100
    assert rss_after - rss_before < 40, (rss_before, rss_after)
    assert client.status() == [(2, "AVAILABLE", ""), (1, "END", "")]


def test_metrics_endpoint_counts_requests(server, client, digits_data):
    client.predict_images(_images(digits_data, 1))
    with urllib.request.urlopen("http://127.0.0.1:%d/monitoring/prometheus/metrics"
                                % server.rest_api_port) as response:
        text = response.read().decode()
    families = metrics.families_from_text(text)
    assert any(s.labels == {"model_name": "resnet", "status": "OK"} and s.value >= 1
               for s in families[metrics.REQUEST_COUNT].samples)
    assert any(s.labels.get("model_name") == "resnet" and s.labels["API"] == "Predict"
               for s in families[metrics.REQUEST_LATENCY].samples)


@pytest.mark.cost(8)
def test_model_config_file_and_sigterm(tmp_path, base_path, digits_data):
    config = tmp_path / "models.config"
    config.write_text("""
model_config_list {
  config {
    name: "digits"
    base_path: "%s"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 } }
    version_labels { key: "stable" value: 1 }
  }
}
""" % base_path)
    process, port, _ = start_server_process(
        ["--rest_api_port", "0", "--model_config_file", config,
         "--file_system_poll_wait_seconds", "0"])
    try:
        client = client_lib.Client("127.0.0.1:%d" % port, model_name="digits",
                                   version_label="stable")
        assert client.predict_images(_images(digits_data, 2))["classes"].shape == (2,)
        assert client_lib.Client("127.0.0.1:%d" % port, model_name="digits").status()[0][:2] \
            == (1, "AVAILABLE")
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=40)  # the server's own deadline is 25 s
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        errors = process.stderr.read()
        assert code == 0, errors[-6000:]
        assert "shutting down gracefully" in errors
    finally:
        if process.poll() is None:
            process.kill()


def test_server_cli_names_a_bad_flag_combination():
    out = subprocess.run([sys.executable, "-m", "slimserve.cli.server", "--model_base_path", "/x",
                          "--model_config_file", "/y"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0
    assert "exactly one of --model_base_path or --model_config_file" in out.stderr


def _invalid_count(server):
    """The server's request_count of INVALID_ARGUMENT answers for the model."""
    with urllib.request.urlopen("http://127.0.0.1:%d/monitoring/prometheus/metrics"
                                % server.rest_api_port) as response:
        family = metrics.families_from_text(response.read().decode())[metrics.REQUEST_COUNT]
    return int(sum(sample.value for sample in family.samples
                   if sample.labels.get("status") == "INVALID_ARGUMENT"))


def test_client_retries_unavailable_only(server):
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        nowhere = client_lib.Client("127.0.0.1:%d" % bound.getsockname()[1], retries=2,
                                    backoff_seconds=0.1, timeout=5)
        started = time.time()
        with pytest.raises(grpc.RpcError) as caught:
            nowhere.predict_images([b"x"])
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.time() - started >= 0.3  # waited 0.1 + 0.2 between three attempts
    retrying = client_lib.Client("127.0.0.1:%d" % server.port, retries=3, backoff_seconds=0.1)
    before = _invalid_count(server)
    with pytest.raises(grpc.RpcError) as caught:
        retrying.predict_images([b"not an image"])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _invalid_count(server) == before + 1  # sent once, not retried


@pytest.mark.cost(16)
def test_client_and_loadtest_clis(server, digits_dir):
    target = "127.0.0.1:%d" % server.port
    files = sorted(os.path.join(digits_dir, "7", n) for n in os.listdir(
        os.path.join(digits_dir, "7")))[:3]
    out = subprocess.run([sys.executable, "-m", "slimserve.cli.client", "predict", "--server", target,
                          "--json", "--top_k", "2"] + files, capture_output=True, text=True,
                         timeout=120, check=True)
    rows = json.loads(out.stdout)
    assert [r["file"] for r in rows] == files and all(len(r["top_k"]) == 2 for r in rows)
    status = subprocess.run([sys.executable, "-m", "slimserve.cli.client", "status", "--server",
                             target], capture_output=True, text=True, timeout=120, check=True)
    assert "AVAILABLE" in status.stdout
    missing = subprocess.run([sys.executable, "-m", "slimserve.cli.client", "status", "--server",
                              target, "--model_name", "nope"], capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode != 0 and "NOT_FOUND" in missing.stderr
    load = subprocess.run([sys.executable, "-m", "slimserve.cli.loadtest", "--server", target,
                           "--images", os.path.join(digits_dir, "7"), "--concurrency", "1,4",
                           "--requests", "20", "--json"], capture_output=True, text=True,
                          timeout=300, check=True)
    levels = [json.loads(line) for line in load.stdout.splitlines()]
    assert [(l["concurrency"], l["requests"], l["errors"]) for l in levels] == [
        (1, 20, {}), (4, 20, {})]
