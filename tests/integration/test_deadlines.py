"""Deadlines cancel work, as in TF Serving: a gRPC deadline and --rest_api_timeout_in_ms
become the session run's RunOptions.timeout_in_ms, so a request that runs out of time
stops using a core. The spin model counts its loop iterations in a variable: a run that
was cancelled stops counting, one that was not would count for minutes."""
import concurrent.futures
import json
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from slimserve.serving.config import model_config
from slimserve.serving.core import batching
from slimserve.serving.core import deadlines
from slimserve.serving.core import errors
from slimserve.serving.core import servable as servable_lib
from slimserve.testing import tiny_models
from slimserve.testing.servers import serve_in_process, wait_until

ONE = np.ones([1, 1], np.float32)


@pytest.fixture(scope="module")
def spin_base(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("spin") / "spin")
    tiny_models.write_spin_model(base)
    return base


@pytest.fixture
def spin(spin_base):
    servable = servable_lib.Servable("spin", 1, spin_base + "/1")
    yield servable
    servable.retire()


def _count(servable):
    _, sig = servable.signature("count")
    return int(servable.run(sig, {"x": ONE}, ["count"])["count"][0])


def _stopped(read, pause=0.5):
    """The counter `read()` returns stays put for `pause` seconds (nothing still runs)."""
    before = read()
    time.sleep(pause)
    return read() == before


def test_run_past_its_deadline_is_cancelled(spin):
    _, sig = spin.signature("spin")
    started = time.monotonic()
    with pytest.raises(errors.ServingError) as raised:
        spin.run(sig, {"x": ONE}, ["y"], deadlines.Deadline(0.3, "a test deadline"))
    assert raised.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "a test deadline" in raised.value.message
    assert time.monotonic() - started < tiny_models.SPIN_ITERATIONS * 1e-6  # not run out
    assert 0 < _count(spin) < tiny_models.SPIN_ITERATIONS
    assert _stopped(lambda: _count(spin))
    # a deadline already past: refused before anything runs
    counted = _count(spin)
    with pytest.raises(errors.ServingError) as raised:
        spin.run(sig, {"x": ONE}, ["y"], deadlines.Deadline(-1.0, "gone"))
    assert raised.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert _count(spin) == counted


def test_callables_and_timed_runs_answer_alike(tmp_path):
    """Without a deadline a run takes the cached callable, with one Session::Run with
    RunOptions: both give the same answer."""
    servable = servable_lib.Servable("tiny", 1, tiny_models.write_tiny_model(str(tmp_path)))
    try:
        _, sig = servable.signature("serving_default")
        rows = np.array([[1.0, 2.0], [3.0, -4.0]], np.float32)
        plain = servable.run(sig, {"x": rows}, ["doubled", "y"])
        timed = servable.run(sig, {"x": rows}, ["doubled", "y"],
                             deadlines.Deadline(30, "test"))
        for key in plain:
            np.testing.assert_array_equal(plain[key], timed[key])
        np.testing.assert_allclose(plain["y"][:, 0], tiny_models.expected_y(rows.tolist()))
    finally:
        servable.retire()


def test_batch_runs_until_the_latest_deadline_of_its_requests(spin):
    """batching_session.cc: a batch runs with the latest deadline of its tasks. The
    earlier request is answered at its own deadline; the run goes on for the later one
    and is cancelled at that one's."""
    _, sig = spin.signature("spin")
    batcher = batching.Batcher(batching.BatchingParameters(
        max_batch_size=2, batch_timeout_micros=10 * 1000 * 1000))
    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        def call(seconds):
            started = time.monotonic()
            try:
                batcher.run(spin, "spin", sig, {"x": ONE}, ["y"],
                            deadlines.Deadline(seconds, "%g s" % seconds))
            except errors.ServingError as error:
                return error.code, time.monotonic() - started
            return grpc.StatusCode.OK, time.monotonic() - started

        early, late = pool.submit(call, 0.5), pool.submit(call, 4.0)
        code, took = early.result(timeout=60)
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED and took < 3.0
        assert not _stopped(lambda: _count(spin), 0.3)  # still running for the later one
        code, took = late.result(timeout=60)
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED
        # the caller is answered at its deadline, TensorFlow cancels the run just after
        wait_until(lambda: _stopped(lambda: _count(spin), 0.3), timeout=10,
                   message="the batch's run to stop")
        assert batcher.batches_run == 1
    finally:
        pool.shutdown()
        batcher.stop()


def test_request_out_of_time_in_the_queue_never_runs(spin):
    _, sig = spin.signature("spin")
    batcher = batching.Batcher(batching.BatchingParameters(
        max_batch_size=8, batch_timeout_micros=1000 * 1000))
    try:
        with pytest.raises(errors.ServingError) as raised:
            batcher.run(spin, "spin", sig, {"x": ONE}, ["y"], deadlines.Deadline(0.2, "t"))
        assert raised.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        time.sleep(1.5)  # past the batch's timeout: it was taken, and found abandoned
        assert _count(spin) == 0 and batcher.batches_run == 0
    finally:
        batcher.stop()


@pytest.fixture
def spin_server(spin_base):
    server = serve_in_process([model_config.ServedModel("spin", spin_base)],
                              enable_model_warmup=False, rest_api_timeout_in_ms=500)
    yield server
    server.stop()


def _grpc_count(stub):
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "spin", "count"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(ONE))
    return int(tf.make_ndarray(stub.Predict(request, timeout=30).outputs["count"])[0])


def test_grpc_deadline_stops_the_run_and_the_server_stays_healthy(spin_server):
    channel = grpc.insecure_channel("127.0.0.1:%d" % spin_server.port)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    try:
        request = predict_pb2.PredictRequest()
        request.model_spec.name, request.model_spec.signature_name = "spin", "spin"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(ONE))
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as raised:
                stub.Predict(request, timeout=0.4)
            assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(lambda: _stopped(lambda: _grpc_count(stub), 0.3), timeout=30,
                   message="the timed-out runs to stop")
        assert _grpc_count(stub) < tiny_models.SPIN_ITERATIONS
        # the server answers normally afterwards, and with no deadline the count is exact
        assert _grpc_count(stub) == _grpc_count(stub)
    finally:
        channel.close()


def test_rest_timeout_stops_the_run(spin_server):
    body = json.dumps({"signature_name": "spin", "instances": [[1.0]]}).encode()
    request = urllib.request.Request("http://127.0.0.1:%d/v1/models/spin:predict"
                                     % spin_server.rest_api_port, body)
    started = time.monotonic()
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=60)
    assert raised.value.code == 504
    assert "rest_api_timeout_in_ms=500" in json.loads(raised.value.read())["error"]
    assert time.monotonic() - started < 30

    def count():
        query = json.dumps({"signature_name": "count", "instances": [[1.0]]}).encode()
        with urllib.request.urlopen(urllib.request.Request(
                "http://127.0.0.1:%d/v1/models/spin:predict" % spin_server.rest_api_port,
                query), timeout=30) as response:
            return json.loads(response.read())["predictions"][0]
    wait_until(lambda: _stopped(count, 0.3), timeout=10, message="the run to stop")
