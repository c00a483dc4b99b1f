"""tensorflow.ProfilerService on the gRPC port (--enable_profiler, on by default as in TF
Serving 2.15): TensorFlow's own profiler clients collect a trace of the model runs."""
import glob
import os
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.profiler import profiler_client
from tensorflow.tsl.profiler.protobuf import xplane_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from slimserve.serving.api import profiler_service
from slimserve.serving.config.model_config import ServedModel
from slimserve.testing import tiny_models
from slimserve.testing.servers import serve_in_process


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("tiny"))
    tiny_models.write_tiny_model(base)
    return base


class _Traffic:
    """Predict requests in a loop on a thread while a trace is captured."""

    def __init__(self, port):
        self.port = port
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "tiny"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones([2, 2], np.float32)))
        with grpc.insecure_channel("127.0.0.1:%d" % self.port) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            while not self._stop.is_set():
                stub.Predict(request, timeout=30)
                self.count += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=60)


def _traced_ops(path):
    space = xplane_pb2.XSpace.FromString(open(path, "rb").read())
    return {m.name for plane in space.planes for m in plane.event_metadata.values()}


def _call(port, method, request, response_class, timeout=60):
    with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
        call = channel.unary_unary("/tensorflow.ProfilerService/" + method,
                                   request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=response_class.FromString)
        return call(request, timeout=timeout)


def test_tensorflows_profiler_clients_trace_the_served_model(tiny_base, tmp_path):
    """TF Serving's test_profiler_service_with_valid_trace_request, plus what it leaves
    unchecked: the trace lands in <logdir>/plugins/profile/<run>/ and holds the ops the
    model's session ran (its MatMul and add) while requests came in."""
    server = serve_in_process([ServedModel("tiny", tiny_base)], rest_api_port=0)
    logdir = str(tmp_path / "logs")
    try:
        with _Traffic(server.port) as traffic:
            profiler_client.trace("localhost:%d" % server.port, logdir, 1000, "", 10)
            tf.profiler.experimental.client.trace("grpc://localhost:%d" % server.port,
                                                  logdir, 300)
        assert traffic.count > 0
    finally:
        server.stop()
    traces = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
    assert len(traces) == 2, traces
    ops = set().union(*(_traced_ops(path) for path in traces))
    assert any(name.startswith("MatMul:") for name in ops), sorted(ops)[:50]
    assert any(name.startswith("add:") for name in ops), sorted(ops)[:50]


def test_terminate_ends_a_profile_early(tiny_base, tmp_path):
    server = serve_in_process([ServedModel("tiny", tiny_base)], rest_api_port=0)
    request = profiler_service.ProfileRequest(
        repository_root=str(tmp_path / "plugins" / "profile"), session_id="run1",
        host_name="here")
    request.opts.version = 1
    request.opts.host_tracer_level = 2
    request.opts.duration_ms = 50000
    answers = []
    try:
        started = time.monotonic()
        caller = threading.Thread(target=lambda: answers.append(_call(
            server.port, "Profile", request, profiler_service.ProfileResponse)))
        caller.start()
        time.sleep(1.0)
        _call(server.port, "Terminate", profiler_service.TerminateRequest(session_id="run1"),
              profiler_service.TerminateResponse)
        caller.join(timeout=40)
        assert answers and time.monotonic() - started < 40
        assert os.path.exists(tmp_path / "plugins" / "profile" / "run1" / "here.xplane.pb")
        with pytest.raises(grpc.RpcError) as monitor:
            _call(server.port, "Monitor", profiler_service.MonitorRequest(duration_ms=1),
                  profiler_service.MonitorResponse)
        assert monitor.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop()


@pytest.mark.parametrize("field, value, message", [
    ("duration_ms", 120000, "above --profiler_max_duration_ms=60000"),
    ("repository_root", "/etc", "is not <logdir>/plugins/profile"),
    ("session_id", "../../escape", "is not one path component"),
    ("host_name", "a/b", "is not one path component"),
])
def test_a_profile_request_cannot_run_long_or_write_elsewhere(tiny_base, tmp_path, field,
                                                              value, message):
    server = serve_in_process([ServedModel("tiny", tiny_base)], rest_api_port=0)
    request = profiler_service.ProfileRequest(
        repository_root=str(tmp_path / "plugins" / "profile"), session_id="run",
        host_name="here")
    request.opts.duration_ms = 10
    if field == "duration_ms":
        request.opts.duration_ms = value
    else:
        setattr(request, field, value)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            _call(server.port, "Profile", request, profiler_service.ProfileResponse)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in refused.value.details()
        assert not glob.glob(str(tmp_path / "**" / "*.xplane.pb"), recursive=True)
    finally:
        server.stop()


def test_enable_profiler_false_leaves_the_service_out(tiny_base, tmp_path):
    server = serve_in_process([ServedModel("tiny", tiny_base)], rest_api_port=0,
                              enable_profiler=False)
    request = profiler_service.ProfileRequest(
        repository_root=str(tmp_path / "plugins" / "profile"), session_id="run",
        host_name="here")
    request.opts.duration_ms = 10
    try:
        with pytest.raises(grpc.RpcError) as missing:
            _call(server.port, "Profile", request, profiler_service.ProfileResponse)
        assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop()


def test_tflite_runs_show_in_the_trace(tmp_path):
    """TFLite kernels are not TensorFlow ops: each interpreter run is one event."""
    from slimserve.testing import tflite_models  # pylint: disable=import-outside-toplevel
    base = tmp_path / "lite"
    tflite_models.half_plus_two(base)
    server = serve_in_process([ServedModel("tiny", str(base))], rest_api_port=0,
                              prefer_tflite_model=True)
    logdir = str(tmp_path / "logs")
    stop = threading.Event()

    def traffic():
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "tiny"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones([1, 1], np.float32)))
        with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            while not stop.is_set():
                stub.Predict(request, timeout=30)

    thread = threading.Thread(target=traffic, daemon=True)
    try:
        thread.start()
        tf.profiler.experimental.client.trace("grpc://localhost:%d" % server.port, logdir, 500)
    finally:
        stop.set()
        thread.join(timeout=60)
        server.stop()
    traces = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
    assert traces and "TfLiteSession::Run" in _traced_ops(traces[0])
