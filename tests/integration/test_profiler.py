"""tensorflow.ProfilerService on the gRPC port (--enable_profiler, on by default as in TF
Serving 2.15): TensorFlow's own profiler clients collect a trace of the model runs. The
server writes a trace only inside --profiler_log_dir (else it returns it in the
response), and no request makes it write anywhere else."""
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


def _profile_request(repository_root, session_id="run", duration_ms=10):
    """A ProfileRequest as TF's profiler client sends it, for host `here`."""
    request = profiler_service.ProfileRequest(
        repository_root=str(repository_root), session_id=session_id, host_name="here")
    request.opts.duration_ms = duration_ms
    return request


def test_tensorflows_profiler_clients_trace_the_served_model(tiny_base, tmp_path):
    """TF Serving's test_profiler_service_with_valid_trace_request, plus what it leaves
    unchecked: the trace lands in <logdir>/plugins/profile/<run>/ (the logdir inside
    --profiler_log_dir) and holds the ops the model's session ran (its MatMul and add)
    while requests came in."""
    server = serve_in_process([ServedModel("tiny", tiny_base)], rest_api_port=0,
                              profiler_log_dir=str(tmp_path))
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


def test_without_a_log_dir_the_trace_comes_back_and_nothing_is_written(tiny_base,
                                                                        tmp_path):
    """TF's clients still succeed (TF Serving's suite traces this way) and save the trace
    they receive in ProfileResponse.tool_data themselves; the server writes nothing, even
    where a request's repository_root points."""
    server = serve_in_process([ServedModel("tiny", tiny_base)], rest_api_port=0)
    logdir, elsewhere = tmp_path / "logs", tmp_path / "elsewhere"
    request = _profile_request(elsewhere / "plugins" / "profile", duration_ms=500)
    try:
        with _Traffic(server.port):
            profiler_client.trace("localhost:%d" % server.port, str(logdir), 300, "", 10)
            response = _call(server.port, "Profile", request,
                             profiler_service.ProfileResponse)
    finally:
        server.stop()
    assert [entry.name for entry in response.tool_data] == ["here.xplane.pb"]
    assert not response.empty_trace
    trace = tmp_path / "trace.xplane.pb"
    trace.write_bytes(response.tool_data[0].data)
    assert any(name.startswith("MatMul:") for name in _traced_ops(str(trace)))
    assert not elsewhere.exists()
    saved = glob.glob(str(logdir / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert len(saved) == 1 and _traced_ops(saved[0])  # the client's own copy


def test_terminate_ends_a_profile_early(tiny_base, tmp_path):
    server = serve_in_process([ServedModel("tiny", tiny_base)], rest_api_port=0,
                              profiler_log_dir=str(tmp_path))
    request = _profile_request(tmp_path / "plugins" / "profile", "run1", duration_ms=50000)
    request.opts.version = 1
    request.opts.host_tracer_level = 2
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
    server = serve_in_process([ServedModel("tiny", tiny_base)], rest_api_port=0,
                              profiler_log_dir=str(tmp_path))
    request = _profile_request(tmp_path / "plugins" / "profile")
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


@pytest.fixture
def escape(tmp_path):
    """--profiler_log_dir `allowed`, a directory `outside` beside it holding a file the
    server must not touch, and symlinks inside `allowed` that lead out."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    (outside / "plugins" / "profile" / "run").mkdir(parents=True)
    (outside / "plugins" / "profile" / "run" / "here.xplane.pb").write_bytes(b"precious")
    (allowed / "logs" / "plugins" / "profile").mkdir(parents=True)
    os.symlink(outside, allowed / "link")
    os.symlink(outside / "plugins" / "profile" / "run",
               allowed / "logs" / "plugins" / "profile" / "linked_run")
    return allowed, outside


def _snapshot(folder):
    return {str(path): (path.read_bytes() if path.is_file() and not path.is_symlink()
                        else None) for path in folder.rglob("*")}


@pytest.mark.parametrize("root, session", [
    ("{allowed}/../outside/plugins/profile", "run"),
    ("logs/../../outside/plugins/profile", "run"),
    ("{outside}/plugins/profile", "run"),
    ("/plugins/profile", "run"),
    ("{allowed}/link/plugins/profile", "run"),
    ("link/plugins/profile", "run"),
    ("{allowed}/logs/plugins/profile", "linked_run"),
])
def test_no_repository_root_leads_out_of_the_log_dir(tiny_base, escape, root, session):
    """`..`, absolute paths outside and symlinks out are PERMISSION_DENIED before the
    profiler starts; nothing outside changes (a file there keeps its bytes)."""
    allowed, outside = escape
    before = _snapshot(outside)
    server = serve_in_process([ServedModel("tiny", tiny_base)], rest_api_port=0,
                              profiler_log_dir=str(allowed))
    request = _profile_request(root.format(allowed=allowed, outside=outside), session)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            _call(server.port, "Profile", request, profiler_service.ProfileResponse)
    finally:
        server.stop()
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "--profiler_log_dir" in refused.value.details()
    if str(allowed) not in request.repository_root:  # the server names none of its paths
        assert str(allowed) not in refused.value.details()
    assert _snapshot(outside) == before


def test_a_relative_root_lands_inside_and_a_planted_symlink_is_replaced(tiny_base, escape):
    allowed, outside = escape
    planted = allowed / "logs" / "plugins" / "profile" / "run2"
    planted.mkdir()
    os.symlink(outside / "plugins" / "profile" / "run" / "here.xplane.pb",
               planted / "here.xplane.pb")
    before = _snapshot(outside)
    server = serve_in_process([ServedModel("tiny", tiny_base)], rest_api_port=0,
                              profiler_log_dir=str(allowed))
    try:
        for session in ("run1", "run2"):
            request = _profile_request("logs/plugins/profile", session, duration_ms=50)
            response = _call(server.port, "Profile", request,
                             profiler_service.ProfileResponse)
            assert not response.tool_data  # written, not returned
    finally:
        server.stop()
    for session in ("run1", "run2"):
        trace = allowed / "logs" / "plugins" / "profile" / session / "here.xplane.pb"
        assert trace.is_file() and not trace.is_symlink()
        xplane_pb2.XSpace.FromString(trace.read_bytes())
    assert _snapshot(outside) == before
    assert not list(allowed.rglob(".xplane-*"))  # no temporary left


def test_profiler_log_dir_must_be_a_directory(tiny_base, tmp_path):
    from slimserve import errors  # pylint: disable=import-outside-toplevel
    with pytest.raises(errors.UserError, match="--profiler_log_dir .*: not a directory"):
        serve_in_process([ServedModel("tiny", tiny_base)], rest_api_port=0,
                         profiler_log_dir=str(tmp_path / "missing"))


def test_enable_profiler_false_leaves_the_service_out(tiny_base, tmp_path):
    server = serve_in_process([ServedModel("tiny", tiny_base)], rest_api_port=0,
                              enable_profiler=False)
    request = _profile_request(tmp_path / "plugins" / "profile")
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
                              prefer_tflite_model=True, profiler_log_dir=str(tmp_path))
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
