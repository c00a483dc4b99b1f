"""What TF Serving users ask for, end to end on loopback: request logging from both
APIs into warmup for the next version, finer metrics, and the status page (over plain
HTTP and in a real headless Chromium)."""
import base64
import http.client
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
from google.protobuf import text_format
from tensorflow_serving.config import logging_config_pb2

from slimserve import errors as user_errors
from slimserve.estimator import splits
from slimserve.export import warmup
from slimserve.flywheel import compare
from slimserve.serving.clients import client as client_lib
from slimserve.serving.config import messages
from slimserve.serving.config import model_config
from slimserve.serving.core import batching
from slimserve.serving.core import servable as servable_lib
from slimserve.serving.core import version_policy
from slimserve.serving.observability import metrics as metrics_lib
from slimserve.serving.observability import request_log
from slimserve.testing import tiny_models
from slimserve.testing.servers import serve_in_process
from tests.helpers import require_tool, run_cli



def _logging_config(prefix, rate=1.0):
    return text_format.Parse(
        'log_collector_config { type: "file" filename_prefix: "%s" } '
        'sampling_config { sampling_rate: %g }' % (prefix, rate),
        logging_config_pb2.LoggingConfig())


def _http(port, method, path, body=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(method, path, body=json.dumps(body) if body is not None else None)
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, response.getheader("Content-Type"), payload


@pytest.mark.cost(20)
def test_logged_traffic_of_both_apis_builds_the_next_versions_warmup(
        trained_run, export_dir, digits_data, tmp_path):
    base = tmp_path / "models"
    shutil.copytree(export_dir, base / "1")
    prefix = str(tmp_path / "logs" / "resnet")
    server = serve_in_process(
        [model_config.ServedModel("resnet", str(base), logging_config=_logging_config(prefix))])
    images, _ = splits.read_images(digits_data, "validation", 6)
    try:
        client = client_lib.Client("127.0.0.1:%d" % server.port, retries=0)
        client.predict_images(images[:1])           # one image
        client.predict_images(images[1:3])          # a batch of two
        client.close()
        status, _, _ = _http(server.rest_api_port, "POST", "/v1/models/resnet:predict", {
            "instances": [{"b64": base64.b64encode(images[3]).decode()}]})
        assert status == 200
    finally:
        server.stop()  # flushes and publishes the log files
    logs = request_log.read_logs(prefix + "*")
    assert len(logs) == 3
    assert {log.log_metadata.model_spec.version.value for log in logs} == {1}
    assert all(log.predict_log.response.outputs["probabilities"].float_val for log in logs)

    # The next version's warmup comes from that traffic: one request per input shape.
    # (--noverify: the reload-and-compare is tests/test_export.py's; ~8 CPU seconds here)
    out = run_cli("slimserve.cli.export", "--model_dir", trained_run, "--export_base", base,
                  "--warmup_from", prefix + "*", "--noverify")
    new_version = out.stdout.strip().splitlines()[-1]
    assert os.path.basename(new_version) != "1"
    servable = servable_lib.Servable("resnet", 2, new_version)
    try:
        assert servable.warm_up() == 2  # batch of 1 and batch of 2; the REST one repeats 1
    finally:
        servable.retire()
    # And a canary check of the new version against the old one on the same traffic.
    report = compare.compare(logs, str(base / "1"), new_version)
    assert report["agreement"] == 1.0 and report["predictions"] == 4


def test_metrics_are_per_version_and_signature_with_queue_waits_and_log_counts(tmp_path):
    base = str(tmp_path / "tiny")
    tiny_models.write_tiny_model(base, 3)
    prefix = str(tmp_path / "logs" / "tiny")
    server = serve_in_process(
        [model_config.ServedModel("tiny", base, logging_config=_logging_config(prefix))],
        enable_model_warmup=False,
        batching_parameters=batching.BatchingParameters(max_batch_size=4,
                                                        batch_timeout_micros=1000),
        monitoring_config=messages.prometheus_monitoring("/metrics"))
    try:
        client = client_lib.Client("127.0.0.1:%d" % server.port, model_name="tiny", retries=0)
        assert client.predict({"x": np.ones([2, 2], np.float32)})["y"].shape == (2, 1)
        client.close()
        status, _, _ = _http(server.rest_api_port, "POST", "/v1/models/tiny:regress", {
            "signature_name": "regress", "examples": [{"x": [1.0, 2.0]}]})
        assert status == 200
        _, content_type, text = _http(server.rest_api_port, "GET", "/metrics")
        text = text.decode()
    finally:
        server.stop()
    assert content_type.startswith("text/plain")
    families = metrics_lib.families_from_text(text)  # prometheus_client's own parser

    def value(name, sample, **labels):
        return next((s.value for s in families[name].samples
                     if s.name == sample and s.labels == labels), None)

    by_version = metrics_lib.LATENCY_BY_VERSION
    assert value(by_version, by_version + "_count", model_name="tiny", version="3",
                 signature_name="serving_default", API="Predict", entrypoint="GRPC") == 1
    assert value(by_version, by_version + "_count", model_name="tiny", version="3",
                 signature_name="regress", API="regress", entrypoint="REST") == 1
    queuing = metrics_lib.QUEUING_LATENCY
    assert value(queuing, queuing + "_count", thread_pool_name="batch") == 2  # both batched
    log_count = metrics_lib.REQUEST_LOG_COUNT
    assert value(log_count, log_count + "_total", model_name="tiny", status_code="OK") \
        is not None
    logs = request_log.read_logs(prefix + "*")
    assert sorted(log.WhichOneof("log_type") for log in logs) == ["predict_log", "regress_log"]


def test_status_page_over_http_and_in_headless_chromium(tmp_path):
    base = str(tmp_path / "tiny")
    tiny_models.write_tiny_model(base, 1)
    os.makedirs(os.path.join(base, "2"))
    open(os.path.join(base, "2", "saved_model.pb"), "wb").write(b"junk <b>bold</b>")
    server = serve_in_process([model_config.ServedModel("tiny<script>", base,
                                                  version_policy.VersionPolicy("all"))],
                              enable_model_warmup=False, status_page=True)
    try:
        client = client_lib.Client("127.0.0.1:%d" % server.port, model_name="tiny<script>",
                                   version=1, retries=0)
        for _ in range(5):
            client.predict({"x": np.ones([1, 2], np.float32)})
        client.close()
        status, content_type, page = _http(server.rest_api_port, "GET", "/")
        page = page.decode()
        assert status == 200 and content_type.startswith("text/html")
        assert "tiny&lt;script&gt;" in page and "<script>" not in page  # escaped
        assert 'class="AVAILABLE">AVAILABLE' in page and 'class="END">END' in page
        assert "http-equiv=\"refresh\"" in page and "src=" not in page  # no external assets
        assert _http(server.rest_api_port, "GET", "/status")[0] == 200
        browser = require_tool("chromium", "chromium-browser")
        shot = tmp_path / "status.png"
        common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync",
                  "--user-data-dir=%s" % (tmp_path / "chromium-profile")]
        url = "http://127.0.0.1:%d/" % server.rest_api_port
        dom = subprocess.run(common + ["--dump-dom", url], capture_output=True, text=True,
                             timeout=120)
        assert "<table id=\"models\">" in dom.stdout and "tiny&lt;script&gt;" in dom.stdout
        assert "predict" in dom.stdout  # the traffic table has the five requests
        subprocess.run(common + ["--screenshot=%s" % shot, "--window-size=1000,700", url],
                       capture_output=True, timeout=120)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
        print("status page screenshot: %s" % shot)
    finally:
        server.stop()


def test_warmup_falls_back_without_logs_and_refuses_a_broken_log(tmp_path):
    assert warmup.traffic_warmup(str(tmp_path / "nothing-here*")) == []
    (tmp_path / "bad.tfrecord").write_bytes(b"\x00" * 40)
    with pytest.raises(user_errors.UserError, match="bad.tfrecord"):
        warmup.traffic_warmup(str(tmp_path / "bad*"))
