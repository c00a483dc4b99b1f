"""Errors in layers, over the real sockets: a UserError (what the client can fix) answers
INVALID_ARGUMENT / 400; a bug inside the server (a plain RuntimeError, ValueError or KeyError
from a servable, or from the reload path) answers INTERNAL / 500 with one log line naming
the request, and the server goes on serving. TF Serving maps the same codes
(model_servers/http_server.cc ToHTTPStatusCode: INTERNAL -> 500, INVALID_ARGUMENT -> 400)."""
import logging

import grpc
import pytest
from tensorflow_serving.apis import model_management_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc
import tensorflow as tf

from slimserve import errors as user_errors
from slimserve.serving.config import model_config
from slimserve.testing.servers import serve_in_process
from slimserve.testing.tiny_models import write_tiny_model
from tests.helpers import rest_json

MODEL = "tiny"
ROWS = [[1.0, 2.0]]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("models") / MODEL)
    write_tiny_model(base, 1)
    instance = serve_in_process([model_config.ServedModel(MODEL, base)])
    yield instance
    instance.stop()


@pytest.fixture
def broken(server, monkeypatch):
    """Makes the served version's run raise what the test gives it (None: run as it is)."""
    servable = server.manager.acquire(MODEL)
    servable.release()
    raising = {}
    real_run = servable.run

    def run(*args, **kwargs):
        if "error" in raising:
            raise raising["error"]
        return real_run(*args, **kwargs)

    monkeypatch.setattr(servable, "run", run)
    return raising


def _grpc_predict(server, rows=ROWS, key="x"):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    request.inputs[key].CopyFrom(tf.make_tensor_proto(rows, tf.float32))
    with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
        return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            request, timeout=30)


def _rest_predict(server, rows=ROWS, key="x"):
    return rest_json(server.rest_api_port, "/v1/models/%s:predict" % MODEL,
                     {"inputs": {key: rows}})


def _serves(server):
    assert list(_grpc_predict(server).outputs["y"].float_val) == [5.5]
    assert _rest_predict(server) == (200, {"outputs": {"doubled": [[2.0, 4.0]],
                                                       "y": [[5.5]]}})


@pytest.mark.parametrize("bug", [RuntimeError("lost the plot"), ValueError("lost the plot"),
                                 KeyError("lost the plot")], ids=lambda e: type(e).__name__)
def test_a_bug_inside_a_servable_is_internal_logged_and_the_server_serves_on(
        server, broken, caplog, bug):
    broken["error"] = bug
    with caplog.at_level(logging.ERROR):
        with pytest.raises(grpc.RpcError) as caught:
            _grpc_predict(server)
        status, body = _rest_predict(server)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert type(bug).__name__ in caught.value.details() and "lost the plot" in \
        caught.value.details()
    assert status == 500 and "lost the plot" in body["error"]
    failed = [r for r in caplog.records if r.exc_info and r.exc_info[1] is bug]
    assert len(failed) == 2, [r.getMessage() for r in caplog.records]
    assert "Predict" in failed[0].getMessage() and MODEL in failed[0].getMessage()
    assert "/v1/models/%s:predict" % MODEL in failed[1].getMessage()
    del broken["error"]
    _serves(server)


def test_a_user_error_is_invalid_argument_not_internal(server, broken, caplog):
    broken["error"] = user_errors.UserError("x: expected two numbers per row")
    with caplog.at_level(logging.ERROR):
        with pytest.raises(grpc.RpcError) as caught:
            _grpc_predict(server)
        status, body = _rest_predict(server)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "x: expected two numbers per row"
    assert (status, body) == (400, {"error": "x: expected two numbers per row"})
    assert not [r for r in caplog.records if r.exc_info], "a user error is not a bug"
    del broken["error"]
    _serves(server)


def test_a_request_the_server_refuses_is_still_invalid_argument(server):
    with pytest.raises(grpc.RpcError) as caught:
        _grpc_predict(server, key="nope")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status, body = _rest_predict(server, key="nope")
    assert (status, body) == (400, {"error": "Missing named input: x in 'inputs' object."})


def _reload(server, base_path):
    request = model_management_pb2.ReloadConfigRequest()
    entry = request.config.model_config_list.config.add()
    entry.name, entry.base_path, entry.model_platform = MODEL, base_path, "tensorflow"
    with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
        call = model_service_pb2_grpc.ModelServiceStub(channel).HandleReloadConfigRequest
        try:
            response = call(request, timeout=60)
        except grpc.RpcError as error:
            return error.code(), error.details()
    return grpc.StatusCode(next(c for c in grpc.StatusCode
                                if c.value[0] == response.status.error_code)), \
        response.status.error_message


def test_a_bug_in_the_reload_path_is_internal_a_bad_config_invalid(server, monkeypatch,
                                                                    caplog):
    base = server.manager.acquire(MODEL)
    base.release()
    base_path = base.path.rsplit("/", 1)[0]
    code, message = _reload(server, "relative/path")  # the config's fault
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "relative/path" in message

    def plan(*_):
        raise ValueError("a bug in the request-log plan")

    monkeypatch.setattr(server.request_logs, "plan", plan)
    with caplog.at_level(logging.ERROR):
        code, message = _reload(server, base_path)
    assert code == grpc.StatusCode.INTERNAL and "a bug in the request-log plan" in message
    assert [r for r in caplog.records if r.exc_info and "reload failed" in r.getMessage()]
    monkeypatch.undo()
    _serves(server)
