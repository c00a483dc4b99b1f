"""The unit layer: REST routes, the inference service and the gRPC servicers called in
process over one ModelManager (slimserve/testing/inprocess.py), no socket, as TF
Serving's http_rest_api_handler_test drives its handler against one ServerCore."""
import json

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import model_management_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.config import model_server_config_pb2

from slimserve.serving.api import rest_api
from slimserve.serving.config.model_config import ServedModel
from slimserve.serving.core import errors
from slimserve.serving.core.version_policy import VersionPolicy
from slimserve.testing import tiny_models
from slimserve.testing.inprocess import Aborted, Context, InProcess

ROWS = [[1.0, 2.0], [-3.0, 0.5]]


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("tiny") / "tiny")
    tiny_models.write_tiny_model(base, 1)
    tiny_models.write_tiny_model(base, 2, bias=1.5)
    return base


@pytest.fixture(scope="module")
def stack(tiny_base):
    with InProcess([ServedModel("tiny", tiny_base, VersionPolicy("all"))]) as instance:
        yield instance


def test_row_format_predict_answers_the_latest_version(stack):
    status, body = stack.rest_json("POST", "/v1/models/tiny:predict", {"instances": ROWS})
    assert status == 200
    y = [row["y"][0] for row in body["predictions"]]
    assert y == pytest.approx([value + 1.0 for value in tiny_models.expected_y(ROWS)])


def test_status_and_metadata_routes(stack):
    assert stack.rest_json("GET", "/v1/models/tiny/versions/1") == (200, {
        "model_version_status": [{"version": "1", "state": "AVAILABLE",
                                  "status": {"error_code": "OK", "error_message": ""}}]})
    status, body = stack.rest_json("GET", "/v1/models/tiny/metadata")
    assert status == 200 and body["model_spec"]["version"] == "2"
    assert set(body["metadata"]["signature_def"]["signature_def"]) == {
        "serving_default", "classify", "regress"}


@pytest.mark.parametrize("method, path, body, code, text", [
    ("POST", "/v1/models/nope:predict", {"instances": ROWS}, 404,
     "Servable not found for request: Latest(nope)"),
    ("POST", "/v1/models/tiny/versions/7:predict", {"instances": ROWS}, 404,
     "Specific(tiny, 7)"),
    ("POST", "/v1/models/tiny:predict", b"{not json", 400, "JSON Parse error"),
    ("PUT", "/v1/models/tiny", None, 400, "Malformed request: PUT /v1/models/tiny"),
    ("POST", "/v1/models/tiny:explain", {}, 400, "Malformed request"),
])
def test_errors_are_json_with_the_http_status_of_their_code(stack, method, path, body, code,
                                                            text):
    status, headers, payload = stack.rest(method, path, body)
    assert status == code and ("Content-Type", "application/json") in headers
    assert text in json.loads(payload)["error"]


def test_paths_outside_the_api_get_tf_servings_404_and_the_status_page(stack, tiny_base):
    assert stack.rest("GET", "/nothing/here")[0] == 404
    for path in ("/", "/status"):  # TF Serving has no page there: 404 unless --status_page
        assert stack.rest("GET", path)[:3:2] == (404, rest_api.NOT_FOUND_BODY)
    with InProcess([ServedModel("tiny", tiny_base)], status_page=True) as paged:
        status, headers, page = paged.rest("GET", "/status")
    assert status == 200 and b"tiny" in page
    status, _, text = stack.rest("GET", "/monitoring/prometheus/metrics")
    assert status == 200 and b":tensorflow:serving:request_count" in text


def test_the_service_and_the_predict_servicer_in_process(stack):
    version, signature, outputs = stack.service.predict(
        "tiny", 1, None, "", {"x": np.array(ROWS, np.float32)})
    assert (version, signature) == (1, "serving_default")
    assert outputs["y"].ravel().tolist() == pytest.approx(tiny_models.expected_y(ROWS))
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(ROWS, np.float32)))
    response = stack.prediction.Predict(request, Context(timeout=30))
    assert response.model_spec.version.value == 2
    request.model_spec.name = "nope"
    with pytest.raises(Aborted) as caught:
        stack.prediction.Predict(request, Context())
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(errors.ServingError) as missing:
        stack.service.predict("tiny", None, None, "nope", {"x": np.array(ROWS, np.float32)})
    assert missing.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_model_service_status_and_reload(tiny_base):
    with InProcess([ServedModel("tiny", tiny_base)]) as stack:
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = "tiny"
        states = stack.model.GetModelStatus(request, Context()).model_version_status
        assert [(s.version, s.state) for s in states] == [
            (2, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]
        config = model_server_config_pb2.ModelServerConfig()
        entry = config.model_config_list.config.add(name="renamed", base_path=tiny_base)
        entry.model_version_policy.specific.versions.append(1)
        reload = model_management_pb2.ReloadConfigRequest(config=config)
        context = Context()
        assert stack.model.HandleReloadConfigRequest(reload, context).status.error_code == 0
        assert context.code is None
        assert stack.rest_json("GET", "/v1/models/renamed")[1]["model_version_status"][0][
            "version"] == "1"
        assert stack.rest("POST", "/v1/models/tiny:predict", {"instances": ROWS})[0] == 404
