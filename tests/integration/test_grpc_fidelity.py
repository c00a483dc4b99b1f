"""TF Serving 2.15.1's gRPC semantics, on real gRPC over loopback against the tiny model:
status codes and messages of Predict / Classify / Regress / MultiInference, GetModelStatus
with a label, HandleReloadConfigRequest, the health service and the Unix socket."""
import os

import grpc
import numpy as np
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc
from tensorflow_serving.apis import classification_pb2
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import inference_pb2
from tensorflow_serving.apis import model_management_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tensorflow_serving.apis import regression_pb2

from slimserve.serving.config import model_config  # pylint: disable=import-outside-toplevel

from slimserve.serving.core import version_policy  # pylint: disable=import-outside-toplevel
from slimserve.serving import server as server_lib
from slimserve.testing import tiny_models
from slimserve.testing.servers import serve_in_process, wait_until

ROWS = [(1.0, 2.0), (-3.0, 0.5), (0.0, 0.0)]


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return tiny_models.write_tiny_versions(str(tmp_path_factory.mktemp("tiny") / "tiny"), 1, 2)


@pytest.fixture(scope="module")
def server(tiny_base, tmp_path_factory):
    socket_path = str(tmp_path_factory.mktemp("sock") / "grpc.sock")
    instance = serve_in_process(
        [model_config.ServedModel("tiny", tiny_base, version_policy.VersionPolicy("all"), {"stable": 1})],
        rest_api_port=0, grpc_socket_path=socket_path, enable_grpc_healthcheck_service=True)
    yield instance
    instance.stop()


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel("127.0.0.1:%d" % server.port) as chan:
        yield chan


@pytest.fixture(scope="module")
def stub(channel):
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def model_stub(channel):
    return model_service_pb2_grpc.ModelServiceStub(channel)


def _spec(request_spec, name="tiny", signature_name="", version=None, label=None):
    request_spec.name = name
    request_spec.signature_name = signature_name
    if version is not None:
        request_spec.version.value = version
    if label is not None:
        request_spec.version_label = label


def _predict_request(output_filter=(), **spec):
    request = predict_pb2.PredictRequest()
    _spec(request.model_spec, **spec)
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(ROWS, np.float32)))
    request.output_filter.extend(output_filter)
    return request


def _examples(input_proto, rows=ROWS):
    for x0, x1 in rows:
        input_proto.example_list.examples.add().CopyFrom(tiny_models.tiny_example(x0, x1))


def _classify_request(**spec):
    request = classification_pb2.ClassificationRequest()
    _spec(request.model_spec, **spec)
    _examples(request.input)
    return request


def _regress_request(**spec):
    request = regression_pb2.RegressionRequest()
    _spec(request.model_spec, **spec)
    _examples(request.input)
    return request


def _fails(call, request, code, text):
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=30)
    assert caught.value.code() == code, caught.value.details()
    assert text in caught.value.details()
    return caught.value.details()


def test_predict_unknown_signature_is_failed_precondition(stub):
    _fails(stub.Predict, _predict_request(signature_name="nope"),
           grpc.StatusCode.FAILED_PRECONDITION, 'Serving signature key "nope" not found.')


def test_classify_and_regress_unknown_signature_are_invalid_argument(stub):
    _fails(stub.Classify, _classify_request(signature_name="nope"),
           grpc.StatusCode.INVALID_ARGUMENT, "No signature was found with the name: nope")
    _fails(stub.Regress, _regress_request(signature_name="nope"),
           grpc.StatusCode.INVALID_ARGUMENT, "No signature was found with the name: nope")


def test_output_filter_naming_an_alias_twice_is_invalid(stub):
    _fails(stub.Predict, _predict_request(output_filter=["y", "y"]),
           grpc.StatusCode.INVALID_ARGUMENT, "duplicate output tensor alias: y")
    _fails(stub.Predict, _predict_request(output_filter=["z"]),
           grpc.StatusCode.INVALID_ARGUMENT, "output tensor alias not found in signature: z")
    only = stub.Predict(_predict_request(output_filter=["y"]), timeout=30)
    assert set(only.outputs) == {"y"}
    np.testing.assert_allclose(tf.make_ndarray(only.outputs["y"]).ravel(),
                               tiny_models.expected_y(ROWS), rtol=1e-6)


def test_empty_model_name_is_invalid_argument(stub):
    message = "ModelSpec has no name specified."
    _fails(stub.Predict, _predict_request(name=""), grpc.StatusCode.INVALID_ARGUMENT, message)
    _fails(stub.Classify, _classify_request(name=""), grpc.StatusCode.INVALID_ARGUMENT, message)
    _fails(stub.Regress, _regress_request(name=""), grpc.StatusCode.INVALID_ARGUMENT, message)
    metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    metadata.model_spec.SetInParent()
    _fails(stub.GetModelMetadata, metadata, grpc.StatusCode.INVALID_ARGUMENT, message)


def test_a_request_without_model_spec_is_missing_model_spec(stub):
    """predict_impl.cc, classification_service.cc, regression_service.cc and
    get_model_metadata_impl.cc check for the ModelSpec before anything else."""
    for call, request in ((stub.Predict, predict_pb2.PredictRequest()),
                          (stub.Classify, classification_pb2.ClassificationRequest()),
                          (stub.Regress, regression_pb2.RegressionRequest()),
                          (stub.GetModelMetadata, get_model_metadata_pb2.GetModelMetadataRequest())):
        _fails(call, request, grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")


def test_get_model_status_ignores_a_label_and_lists_all_versions(model_stub):
    request = get_model_status_pb2.GetModelStatusRequest()
    _spec(request.model_spec, label="stable")
    response = model_stub.GetModelStatus(request, timeout=30)
    assert [(s.version, s.state) for s in response.model_version_status] == [
        (2, get_model_status_pb2.ModelVersionStatus.AVAILABLE),
        (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]


def test_classify_without_signature_name_uses_serving_default(server, stub):
    # serving_default is a predict signature: TF Serving (method check off) rejects its shape
    _fails(stub.Classify, _classify_request(), grpc.StatusCode.INVALID_ARGUMENT,
           "No classification inputs found in SignatureDef: inputs {\n  key: \"x\"\n")
    server.service.method_name_check = True  # --enable_signature_method_name_check
    try:
        _fails(stub.Classify, _classify_request(), grpc.StatusCode.INVALID_ARGUMENT,
               "Expected classification signature method_name to be "
               "tensorflow/serving/classify. Was: tensorflow/serving/predict")
        _fails(stub.Regress, _regress_request(signature_name="classify"),
               grpc.StatusCode.INVALID_ARGUMENT,
               "Expected regression signature method_name to be tensorflow/serving/regress")
    finally:
        server.service.method_name_check = False
    response = stub.Classify(_classify_request(signature_name="classify"), timeout=30)
    assert response.model_spec.signature_name == "classify"
    first = response.result.classifications[0].classes
    assert [c.label for c in first] == ["a", "b"]
    np.testing.assert_allclose([c.score for c in first],
                               tf.nn.softmax(np.array(ROWS[0], np.float32)).numpy(), rtol=1e-5)


def test_regress_answers_one_value_per_example(stub):
    response = stub.Regress(_regress_request(signature_name="regress", version=1), timeout=30)
    assert (response.model_spec.name, response.model_spec.version.value,
            response.model_spec.signature_name) == ("tiny", 1, "regress")
    np.testing.assert_allclose([r.value for r in response.result.regressions],
                               tiny_models.expected_y(ROWS), rtol=1e-6)
    # context features are merged into every example, as TF Serving's util.cc does
    request = regression_pb2.RegressionRequest()
    _spec(request.model_spec, signature_name="regress")
    context = request.input.example_list_with_context
    context.context.CopyFrom(tiny_models.tiny_example(5.0, 5.0))
    context.examples.add().CopyFrom(tiny_models.tiny_example(1.0, 1.0))
    context.examples.add()
    values = [r.value for r in stub.Regress(request, timeout=30).result.regressions]
    np.testing.assert_allclose(values, tiny_models.expected_y([(1, 1), (5, 5)]), rtol=1e-6)
    # a predict signature is not a regression one
    _fails(stub.Regress, _regress_request(), grpc.StatusCode.INVALID_ARGUMENT,
           "Expected one output Tensor.")
    empty = regression_pb2.RegressionRequest()
    _spec(empty.model_spec, signature_name="regress")
    _fails(stub.Regress, empty, grpc.StatusCode.INVALID_ARGUMENT, "Input is empty.")


def _multi(tasks, rows=ROWS, version=None):
    request = inference_pb2.MultiInferenceRequest()
    for name, signature_name, method in tasks:
        task = request.tasks.add(method_name=method)
        _spec(task.model_spec, name=name, signature_name=signature_name, version=version)
    _examples(request.input, rows)
    return request


def test_multi_inference_runs_classify_and_regress_over_one_input(stub):
    response = stub.MultiInference(_multi([
        ("tiny", "classify", tiny_models.CLASSIFY_METHOD),
        ("tiny", "regress", tiny_models.REGRESS_METHOD)], version=1), timeout=30)
    classify, regress = response.results
    assert (classify.model_spec.signature_name, classify.model_spec.version.value) == (
        "classify", 1)
    assert [c.label for c in classify.classification_result.classifications[1].classes] == [
        "a", "b"]
    np.testing.assert_allclose(
        [c.score for c in classify.classification_result.classifications[1].classes],
        tf.nn.softmax(np.array(ROWS[1], np.float32)).numpy(), rtol=1e-5)
    np.testing.assert_allclose([r.value for r in regress.regression_result.regressions],
                               tiny_models.expected_y(ROWS), rtol=1e-6)


@pytest.mark.parametrize("tasks, code, text", [
    ([("tiny", "classify", tiny_models.CLASSIFY_METHOD),
      ("other", "regress", tiny_models.REGRESS_METHOD)], grpc.StatusCode.INVALID_ARGUMENT,
     "All ModelSpecs in a MultiInferenceRequest must access the same model name."),
    ([("tiny", "regress", tiny_models.REGRESS_METHOD),
      ("tiny", "regress", tiny_models.REGRESS_METHOD)], grpc.StatusCode.INVALID_ARGUMENT,
     "Duplicate evaluation of signature: regress"),
    ([("tiny", "nope", tiny_models.REGRESS_METHOD)], grpc.StatusCode.INVALID_ARGUMENT,
     "Requested signature not found in model graph: nope"),
    ([("tiny", "serving_default", tiny_models.PREDICT_METHOD)],
     grpc.StatusCode.UNIMPLEMENTED, "Unsupported signature method_name: "),
    ([("tiny", "classify", tiny_models.CLASSIFY_METHOD),
      ("", "regress", tiny_models.REGRESS_METHOD)], grpc.StatusCode.INVALID_ARGUMENT,
     "Found ModelSpec with an empty model name."),
    ([], grpc.StatusCode.INVALID_ARGUMENT, "ModelSpec has no name specified."),
])
def test_multi_inference_validates_as_tf_serving(stub, tasks, code, text):
    _fails(stub.MultiInference, _multi(tasks), code, text)


def test_health_service_and_unix_socket(server, channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "tensorflow.serving.PredictionService", "PredictionService",
                    "ModelService"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.RpcError) as caught:
        health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=30)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert os.path.exists(server.grpc_socket_path)
    with grpc.insecure_channel("unix:" + server.grpc_socket_path) as unix:
        response = prediction_service_pb2_grpc.PredictionServiceStub(unix).Predict(
            _predict_request(), timeout=30)
    assert response.model_spec.version.value == 2


def _model_config(entries):
    return "model_config_list {\n%s}\n" % "".join(
        '  config { name: "%s" base_path: "%s" model_platform: "tensorflow" }\n' % entry
        for entry in entries)


def _states(model_stub, name):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    try:
        return [s.state for s in model_stub.GetModelStatus(request, timeout=30)
                .model_version_status]
    except grpc.RpcError:
        return None


def test_reload_config_request_and_config_file_polling(tiny_base, tmp_path):
    other = str(tmp_path / "other")
    tiny_models.write_tiny_model(other, 7)
    config_file = tmp_path / "models.config"
    config_file.write_text(_model_config([("tiny", tiny_base)]))
    instance = server_lib.ModelServer(
        port=server_lib.PICK_FREE_PORT, rest_api_port=0, file_system_poll_wait_seconds=0,
        model_config_file=str(config_file), model_config_file_poll_wait_seconds=1).start()
    try:
        with grpc.insecure_channel("127.0.0.1:%d" % instance.port) as chan:
            predict = prediction_service_pb2_grpc.PredictionServiceStub(chan).Predict
            model = model_service_pb2_grpc.ModelServiceStub(chan)
            # ReloadConfigRequest: serve "other" instead of "tiny"
            request = model_management_pb2.ReloadConfigRequest()
            entry = request.config.model_config_list.config.add(name="other", base_path=other)
            entry.model_platform = "tensorflow"
            response = model.HandleReloadConfigRequest(request, timeout=60)
            assert response.status.error_code == 0
            assert predict(_predict_request(name="other"), timeout=30) \
                .model_spec.version.value == 7
            _fails(predict, _predict_request(name="tiny"), grpc.StatusCode.NOT_FOUND, "tiny")
            # a config of another kind is refused, as TF Serving does
            bad = model_management_pb2.ReloadConfigRequest()
            bad.config.custom_model_config.Pack(request)
            _fails(model.HandleReloadConfigRequest, bad, grpc.StatusCode.INVALID_ARGUMENT,
                   "Only ModelConfigList is currently supported")
            bad = model_management_pb2.ReloadConfigRequest()
            bad.config.model_config_list.config.add(name="x")
            _fails(model.HandleReloadConfigRequest, bad, grpc.StatusCode.INVALID_ARGUMENT,
                   "every config needs name and base_path")
            # --model_config_file_poll_wait_seconds: the edited file is applied
            config_file.write_text(_model_config([("tiny", tiny_base), ("other", other)]))
            wait_until(lambda: get_model_status_pb2.ModelVersionStatus.AVAILABLE in (
                _states(model, "tiny") or ()), timeout=60,
                       message="the edited config file to bring tiny back")
            assert predict(_predict_request(name="tiny"), timeout=30) \
                .model_spec.version.value == 2
            assert predict(_predict_request(name="other"), timeout=30) \
                .model_spec.version.value == 7
    finally:
        instance.stop()
