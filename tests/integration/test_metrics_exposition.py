"""The Prometheus exposition (issue 20, item 4): prometheus_client's registry and format,
TF Serving 2.15.1's metric names, labels and fixed bucket boundaries, HELP and TYPE lines,
read back with prometheus_client's own parser. Real gRPC and REST on loopback."""
import http.client

import numpy as np
import pytest
from prometheus_client import parser

from slimserve.serving.clients import client as client_lib
from slimserve.serving.config import messages
from slimserve.serving.config import model_config
from slimserve.serving.core import batching
from slimserve.serving.observability import metrics as metrics_lib
from slimserve.testing import tiny_models
from slimserve.testing.servers import serve_in_process

# monitoring::Buckets::Exponential(scale, growth, count) as TF Serving's exporter prints
# its bounds (absl::StrCat: six significant digits), then +Inf.
LATENCY_LE = ["%.6g" % (10 * 1.8 ** i) for i in range(33)] + ["+Inf"]
BATCH_SIZE_LE = [str(2 ** i) for i in range(14)] + ["+Inf"]


def _families(text):
    """{name: family} by prometheus_client's own parser."""
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def _scrape(port):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", metrics_lib.PATH)
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    assert response.status == 200
    return text


def _le(family, sample_name, **labels):
    return [s.labels["le"] for s in family.samples if s.name == sample_name and
            {k: v for k, v in s.labels.items() if k != "le"} == labels]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("tiny") / "tiny")
    tiny_models.write_tiny_model(base, 1)
    instance = serve_in_process(
        [model_config.ServedModel("tiny", base)], enable_model_warmup=False,
        batching_parameters=batching.BatchingParameters(max_batch_size=64,
                                                        batch_timeout_micros=0),
        monitoring_config=messages.prometheus_monitoring(metrics_lib.PATH))
    yield instance
    instance.stop()


def test_exposition_has_tf_serving_names_labels_buckets_help_and_type(server):
    client = client_lib.Client("127.0.0.1:%d" % server.port, model_name="tiny", retries=0)
    try:
        for rows in (1, 2, 5):  # one at a time: three batches, eight rows
            client.predict({"x": np.ones([rows, 2], np.float32)})
        first = _scrape(server.rest_api_port)
        client.predict({"x": np.ones([40, 2], np.float32)})  # a size no bucket is named for
        with pytest.raises(Exception):
            client.predict({"x": np.ones([1, 2], np.float32)}, signature_name="nope")
    finally:
        client.close()
    second = _scrape(server.rest_api_port)

    families = _families(second)
    for name in (metrics_lib.REQUEST_COUNT, metrics_lib.REQUEST_LATENCY,
                 metrics_lib.BATCH_SIZE, metrics_lib.QUEUING_LATENCY,
                 metrics_lib.MODEL_STATE, metrics_lib.LOAD_ATTEMPTS):
        assert families[name].documentation, name  # HELP
        assert "# TYPE %s " % name in second and "# HELP %s " % name in second
    # TF Serving's counter names, without prometheus_client's _total in the text.
    assert "# TYPE :tensorflow:serving:request_count counter" in second
    count = families[metrics_lib.REQUEST_COUNT]
    assert count.type == "counter"
    assert {frozenset(s.labels) for s in count.samples} == {frozenset({"model_name",
                                                                       "status"})}
    assert {(s.labels["status"], s.value) for s in count.samples} == {
        ("OK", 4), ("FAILED_PRECONDITION", 1)}
    latency = families[metrics_lib.REQUEST_LATENCY]
    assert latency.type == "histogram"
    labels = {"model_name": "tiny", "API": "Predict", "entrypoint": "GRPC"}
    assert _le(latency, metrics_lib.REQUEST_LATENCY + "_bucket", **labels) == LATENCY_LE
    # Only the four served requests are timed, as TF Serving does.
    assert [s.value for s in latency.samples
            if s.name == metrics_lib.REQUEST_LATENCY + "_count"] == [4]

    # The batch-size histogram has TF Serving's fixed buckets: the same series before and
    # after a batch of a new size, so nothing appears or vanishes between scrapes.
    before = _families(first)[metrics_lib.BATCH_SIZE]
    after = families[metrics_lib.BATCH_SIZE]
    bucket = metrics_lib.BATCH_SIZE + "_bucket"
    assert _le(before, bucket) == _le(after, bucket) == BATCH_SIZE_LE
    assert metrics_lib.batch_totals(first) == (8, 3)
    assert metrics_lib.batch_totals(second) == (48, 4)
    values = {s.labels["le"]: s.value for s in after.samples if s.name == bucket}
    assert (values["1"], values["2"], values["4"], values["8"], values["32"],
            values["64"]) == (1, 2, 2, 3, 3, 4)


def test_each_server_has_its_own_registry(server, tmp_path):
    base = str(tmp_path / "tiny")
    tiny_models.write_tiny_model(base, 1)
    other = serve_in_process([model_config.ServedModel("tiny", base)],
                             enable_model_warmup=False,
                             monitoring_config=messages.prometheus_monitoring("/m"))
    try:
        assert other.metrics.registry is not server.metrics.registry
        text = other.metrics.render()
        count = _families(text)[metrics_lib.REQUEST_COUNT]
        assert count.samples == []  # the first server's requests are not counted here
    finally:
        other.stop()


def test_batch_totals_reads_a_tf_serving_style_exposition():
    """The tuner's and bench-serve's reader also takes TF Serving's own text (no HELP,
    integer values)."""
    text = ("# TYPE :tensorflow:serving:batching_session:processed_batch_size histogram\n"
            ':tensorflow:serving:batching_session:processed_batch_size_bucket{le="1"} 2\n'
            ':tensorflow:serving:batching_session:processed_batch_size_bucket{le="+Inf"} 5\n'
            ":tensorflow:serving:batching_session:processed_batch_size_sum 17\n"
            ":tensorflow:serving:batching_session:processed_batch_size_count 5\n")
    assert metrics_lib.batch_totals(text) == (17, 5)
    assert metrics_lib.batch_totals("# TYPE x counter\nx 1\n") == (0, 0)
