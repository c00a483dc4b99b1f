"""No background thread dies silently: a failure injected into each (the config-file
poller, the version poller, a request log's writer, the load and unload workers, a
reload, a TFLite interpreter pool: a method monkeypatched to raise inside the running
thread) is logged naming the component, fails with INTERNAL what it held, lets the
thread carry on (or is restarted), and, while the component cannot do its job, the
health service answers NOT_SERVING, GetModelStatus and the status page say what fails;
once the failure goes, all of them say so. Real servers on loopback, in process."""
import logging
import shutil

import grpc
import numpy as np
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import model_management_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tensorflow_serving.config import logging_config_pb2
from google.protobuf import text_format

from slimserve.serving import server as server_lib
from slimserve.serving.api import rest_api
from slimserve.serving.config.model_config import ServedModel
from slimserve.serving.core import health as health_lib
from slimserve.serving.core import tflite_servable
from slimserve.serving.observability import metrics as metrics_lib
from slimserve.serving.observability import request_log
from slimserve.testing import tflite_models
from slimserve.testing import tiny_models
from slimserve.testing.servers import serve_in_process, wait_until

INJECTED = "injected failure"


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    base = tmp_path_factory.mktemp("tiny_source")
    tiny_models.write_tiny_model(str(base), 1)
    return base


def _copy(source, base, version):
    shutil.copytree(source / "1", base / str(version))


class _Server:
    """A started in-process server with the health service, and a channel to it."""

    def __init__(self, models, **options):
        options.setdefault("enable_grpc_healthcheck_service", True)
        self.server = serve_in_process(models, **options)
        self.channel = grpc.insecure_channel("127.0.0.1:%d" % self.server.port)

    def health(self):
        stub = health_pb2_grpc.HealthStub(self.channel)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(
            stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=30).status)

    def predict(self, model="tiny", rows=((1.0, 2.0),), dtype=np.float32):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(rows, dtype)))
        stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        try:
            return stub.Predict(request, timeout=60).model_spec.version.value
        except grpc.RpcError as error:
            return error.code(), error.details()

    def status(self, model="tiny"):
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = model
        stub = model_service_pb2_grpc.ModelServiceStub(self.channel)
        response = stub.GetModelStatus(request, timeout=30)
        return [(s.version, get_model_status_pb2.ModelVersionStatus.State.Name(s.state),
                 s.status.error_code, s.status.error_message)
                for s in response.model_version_status]

    def page(self):
        return rest_api.RestApi(self.server.service, status_page=True).status_page()

    def close(self):
        self.channel.close()
        self.server.stop()


def _said(caplog, text):
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def _injected(*_, **__):
    raise RuntimeError(INJECTED)


def test_the_config_file_poller(tiny_source, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    config = tmp_path / "models.config"
    config.write_text('model_config_list { config { name: "tiny" base_path: "%s" '
                      'model_platform: "tensorflow" } }' % tiny_source)
    server = server_lib.ModelServer(model_config_file=str(config),
                                    model_config_file_poll_wait_seconds=1,
                                    port=server_lib.PICK_FREE_PORT, rest_api_port=0,
                                    enable_grpc_healthcheck_service=True,
                                    file_system_poll_wait_seconds=0).start()
    client = _Server.__new__(_Server)
    client.server, client.channel = server, grpc.insecure_channel("127.0.0.1:%d" % server.port)
    try:
        assert client.health() == "SERVING"
        poller = server._config_poller  # pylint: disable=protected-access
        monkeypatch.setattr(poller, "poll_once", _injected)
        wait_until(lambda: client.health() == "NOT_SERVING", timeout=60,
                   message="three failed polls to make the server unhealthy")
        assert len(_said(caplog, "model config poller failed: RuntimeError: %s; it carries "
                         "on" % INJECTED)) == 1
        assert "model config poller" in client.page() and INJECTED in client.page()
        assert client.predict() == 1  # serving goes on
        monkeypatch.undo()
        wait_until(lambda: client.health() == "SERVING", timeout=60,
                   message="the poller to work again")
        assert _said(caplog, "model config poller works again")
        # the thread carried on: an edit is applied
        config.write_text('model_config_list { config { name: "other" base_path: "%s" '
                          'model_platform: "tensorflow" } }' % tiny_source)
        wait_until(lambda: client.predict("other") == 1, timeout=60,
                   message="the edit to be applied")
    finally:
        client.close()


def test_the_version_poller(tiny_source, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    base = tmp_path / "tiny"
    _copy(tiny_source, base, 1)
    client = _Server([ServedModel("tiny", str(base))], rest_api_port=0,
                     file_system_poll_wait_seconds=1)
    try:
        manager = client.server.manager
        monkeypatch.setattr(manager, "poll", _injected)
        wait_until(lambda: client.health() == "NOT_SERVING", timeout=60,
                   message="three failed polls")
        assert len(_said(caplog, "version poller failed: RuntimeError: %s" % INJECTED)) == 1
        assert client.predict() == 1
        _copy(tiny_source, base, 2)
        monkeypatch.undo()
        wait_until(lambda: client.predict() == 2, timeout=60,
                   message="the poller, alive, to serve the new version")
        assert client.health() == "SERVING"
        assert _said(caplog, "version poller works again")
    finally:
        client.close()


def test_a_request_log_writer(tiny_source, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    logging_config = text_format.Parse(
        'log_collector_config { type: "file" filename_prefix: "%s" } '
        'sampling_config { sampling_rate: 1.0 }' % (tmp_path / "logs" / "tiny"),
        logging_config_pb2.LoggingConfig())
    client = _Server([ServedModel("tiny", str(tiny_source), logging_config=logging_config)],
                     rest_api_port=0)
    try:
        logger = client.server.request_logs.get("tiny")
        monkeypatch.setattr(logger, "_write", _injected)
        for _ in range(3):
            assert client.predict() == 1  # the request itself is answered
        wait_until(lambda: logger.drops.get("INTERNAL") == 3, timeout=60,
                   message="the three records the writer held to be counted lost")
        assert len(_said(caplog, "request log writer of model tiny failed: RuntimeError: "
                         "%s" % INJECTED)) == 1
        assert client.health() == "NOT_SERVING"
        (version, state, code, message), = client.status()
        assert (version, state, code) == (1, "AVAILABLE", grpc.StatusCode.INTERNAL.value[0])
        assert message == ("request log writer of model tiny failing: RuntimeError: %s"
                           % INJECTED)
        assert "request log writer of model tiny" in client.page()
        families = metrics_lib.families_from_text(client.server.metrics.render())
        counts = {s.labels["status_code"]: s.value
                  for s in families[metrics_lib.REQUEST_LOG_COUNT].samples}
        assert counts["INTERNAL"] == 3
        monkeypatch.undo()
        assert client.predict() == 1
        wait_until(lambda: logger.written == 1, timeout=60, message="a record written again")
        wait_until(lambda: client.health() == "SERVING", timeout=30,
                   message="the writer to count as healthy")
        assert client.status() == [(1, "AVAILABLE", 0, "")]
    finally:
        client.close()
    assert len(request_log.read_logs(str(tmp_path / "logs" / "tiny*"))) == 1


def test_the_load_and_unload_workers(tiny_source, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    base = tmp_path / "tiny"
    _copy(tiny_source, base, 1)
    client = _Server([ServedModel("tiny", str(base))], rest_api_port=0, num_load_threads=2,
                     num_unload_threads=1)
    try:
        manager = client.server.manager
        # the loader fails: the version ends with the loader's error, never stuck LOADING
        monkeypatch.setattr(manager, "_load_version", _injected)
        _copy(tiny_source, base, 2)
        manager.poll()
        assert client.status()[0] == (2, "END", grpc.StatusCode.INTERNAL.value[0],
                                      "model loader failed: RuntimeError: %s" % INJECTED)
        assert _said(caplog, "model loader failed: RuntimeError: %s" % INJECTED)
        assert client.predict() == 1  # the old version serves
        monkeypatch.undo()
        wait_until(lambda: (manager.poll(), client.predict() == 2)[1], timeout=60,
                   message="version 2 to load once the loader works")
        # the unload worker fails retiring version 2 (when 3 replaces it): logged, the
        # version ends with its error
        serving = manager._models["tiny"].versions[2].servable  # pylint: disable=protected-access
        monkeypatch.setattr(serving, "retire", _injected)
        _copy(tiny_source, base, 3)
        wait_until(lambda: (manager.poll(), client.predict() == 3)[1], timeout=60,
                   message="version 3 to serve")
        wait_until(lambda: dict((v, (s, c, m)) for v, s, c, m in client.status())[2] == (
            "END", grpc.StatusCode.INTERNAL.value[0],
            "unload worker failed: RuntimeError: %s" % INJECTED), timeout=60,
            message="version 2 to end with the unload worker's error")
        assert _said(caplog, "unload worker failed: RuntimeError: %s" % INJECTED)
        monkeypatch.undo()
        _copy(tiny_source, base, 4)  # the worker thread carried on: 3 unloads cleanly
        wait_until(lambda: (manager.poll(), client.predict() == 4)[1], timeout=60,
                   message="version 4 to serve")
        wait_until(lambda: dict((v, (s, c)) for v, s, c, _ in client.status())[3] == (
            "END", 0), timeout=60, message="version 3 unloaded cleanly")
        assert client.health() == "SERVING"
    finally:
        client.close()


def test_a_reload_whose_worker_fails_answers_internal_and_changes_nothing(tiny_source,
                                                                         monkeypatch):
    client = _Server([ServedModel("tiny", str(tiny_source))], rest_api_port=0)
    try:
        monkeypatch.setattr(client.server.manager, "reload", _injected)
        request = model_management_pb2.ReloadConfigRequest()
        entry = request.config.model_config_list.config.add(name="other",
                                                            base_path=str(tiny_source))
        entry.model_platform = "tensorflow"
        stub = model_service_pb2_grpc.ModelServiceStub(client.channel)
        with pytest.raises(grpc.RpcError) as failed:
            stub.HandleReloadConfigRequest(request, timeout=60)
        assert failed.value.code() == grpc.StatusCode.INTERNAL
        assert INJECTED in failed.value.details()
        assert client.predict() == 1 and client.predict("other")[0] == \
            grpc.StatusCode.NOT_FOUND
        monkeypatch.undo()
        stub.HandleReloadConfigRequest(request, timeout=60)
        assert client.predict("other") == 1
    finally:
        client.close()


def test_a_tflite_interpreter_pool(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    base = tmp_path / "lite"
    tflite_models.half_plus_two(str(base))
    client = _Server([ServedModel("lite", str(base))], rest_api_port=0,
                     prefer_tflite_model=True, num_tflite_pools=1,
                     file_system_poll_wait_seconds=0, load_retry_interval_micros=0)
    component = "TFLite interpreter pool of model lite version 123"
    try:
        assert client.predict("lite", [[1.0]]) == 123
        # one interpreter fails: its request is INTERNAL, a new one takes its place
        monkeypatch.setattr(tflite_servable._Interpreter, "run", _injected)  # pylint: disable=protected-access
        code, details = client.predict("lite", [[1.0]])
        assert code == grpc.StatusCode.INTERNAL
        assert details == "%s: the interpreter failed (%s); it was replaced" % (component,
                                                                                INJECTED)
        assert _said(caplog, "%s failed: RuntimeError: %s" % (component, INJECTED))
        monkeypatch.undo()
        assert client.predict("lite", [[1.0]]) == 123
        # no interpreter can be built any more: the pool empties, the version cannot serve
        monkeypatch.setattr(tflite_servable._Interpreter, "run", _injected)  # pylint: disable=protected-access
        monkeypatch.setattr(tflite_servable._Interpreter, "__init__", _injected)  # pylint: disable=protected-access
        assert client.predict("lite", [[1.0]])[0] == grpc.StatusCode.INTERNAL
        assert _said(caplog, "%s cannot recover: every interpreter failed" % component)
        assert client.health() == "NOT_SERVING"
        assert client.predict("lite", [[1.0]])[0] == grpc.StatusCode.NOT_FOUND  # no hang
        client.server.manager.poll()  # the manager retires it and loads it again: fails
        version, state, code, message = client.status("lite")[0]
        assert (version, state) == (123, "END") and code != 0, message
        assert "lite" in client.page() and component in client.page()
        monkeypatch.undo()
        client.server.manager.poll()  # the version loads again: a new pool
        assert client.predict("lite", [[1.0]]) == 123
        assert client.status("lite") == [(123, "AVAILABLE", 0, "")]
        assert client.health() == "SERVING"
        assert _said(caplog, "%s works again" % component)
    finally:
        client.close()


def test_health_counts_failures_in_a_row_and_clears_on_success(caplog):
    caplog.set_level(logging.INFO)
    changes = []
    health = health_lib.Health(on_change=changes.append)
    for _ in range(health_lib.FAILING_AFTER - 1):
        with health.guard("worker", "m"):
            raise ValueError("boom")
    assert health.healthy and not health.failing()
    with health.guard("worker", "m"):
        raise ValueError("boom")
    assert not health.healthy and list(health.failing("m")) == ["worker"]
    with health.guard("worker", "m"):
        pass
    assert health.healthy and changes == [False, True]
    assert len(_said(caplog, "worker failed: ValueError: boom")) == 1
