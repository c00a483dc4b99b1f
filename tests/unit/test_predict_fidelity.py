"""Predict, Classify, Regress and GetModelMetadata as TF Serving 2.15.1 answers them: every
wire-observable expectation of servables/tensorflow/predict_util_test.cc,
predict_impl_test.cc, classifier_test.cc, regressor_test.cc and
get_model_metadata_impl_test.cc, through slimserve's gRPC servicers in process. Where
TF Serving's tests compare with EqualsProto, the whole response is compared here as
serialized bytes (deterministic map order) with the response TF Serving builds: its
TensorProtos from Tensor::AsProtoField (tensor_shape always present, rank 0 too)."""
import grpc
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.framework import tensor_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import classification_pb2
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import regression_pb2

from slimserve.serving.config.model_config import ServedModel
from slimserve.testing import half_plus_two
from slimserve.testing import identity_models
from slimserve.testing.inprocess import Aborted, Context, InProcess

MODEL, VERSION = "test_model", 123


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    half_plus_two.write_half_plus(str(root / "half_plus_two"))
    identity_models.write_counter_model(str(root / "counter"), VERSION)
    identity_models.write_scoring_model(str(root / "scoring"), VERSION)
    return root


def _served(bases):
    return [ServedModel(MODEL, str(bases / "half_plus_two")),
            ServedModel("counter", str(bases / "counter")),
            ServedModel("scoring", str(bases / "scoring"))]


@pytest.fixture(scope="module")
def stack(bases):
    with InProcess(_served(bases)) as instance:
        yield instance


@pytest.fixture(scope="module")
def checked(bases):
    """The same models with --enable_signature_method_name_check."""
    with InProcess(_served(bases), method_name_check=True) as instance:
        yield instance


def _bytes(message):
    return message.SerializeToString(deterministic=True)


def _tensor(text):
    return text_format.Parse(text, tensor_pb2.TensorProto())


def _predict(name=MODEL, signature="", inputs=None, version=VERSION, output_filter=()):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    if signature:
        request.model_spec.signature_name = signature
    for key, text in (inputs or {}).items():
        request.inputs[key].CopyFrom(_tensor(text))
    request.output_filter.extend(output_filter)
    return request


def _expected_predict(request, outputs, signature):
    response = predict_pb2.PredictResponse()
    response.model_spec.CopyFrom(request.model_spec)
    response.model_spec.signature_name = signature
    for key, text in outputs.items():
        response.outputs[key].CopyFrom(_tensor(text))
    return response


def _fails(call, request, code, text=None):
    with pytest.raises(Aborted) as caught:
        call(request, Context())
    assert caught.value.code == code, caught.value.details
    if text is not None:
        assert text in caught.value.details, caught.value.details
    return caught.value.details


SCALAR_2 = "dtype: DT_FLOAT float_val: 2.0"


@pytest.mark.parametrize("signature, input_key, output_key, value, answer", [
    ("", "x", "y", 2.0, "serving_default:3"),
    ("regress_x2_to_y3", "inputs", "outputs", 2.0, "regress_x2_to_y3:4"),
    ("classify_x2_to_y3", "inputs", "scores", 2.0, "classify_x2_to_y3:4"),
])
def test_prediction_success_is_tf_servings_response_byte_for_byte(stack, signature, input_key,
                                                                  output_key, value, answer):
    """A scalar in, a scalar out: its tensor_shape is present though empty
    (AsProtoField), and the model spec names the signature that ran."""
    request = _predict(signature=signature, inputs={input_key: "dtype: DT_FLOAT float_val: %g"
                                                    % value})
    response = stack.prediction.Predict(request, Context())
    ran, number = answer.split(":")
    expected = _expected_predict(request, {output_key: "dtype: DT_FLOAT tensor_shape {} "
                                           "float_val: %s" % number}, ran)
    assert _bytes(response) == _bytes(expected)
    assert response.outputs[output_key].HasField("tensor_shape")


def test_customized_signatures_of_the_counter_model(stack):
    """Signatures with only outputs, or one input, stateful between calls."""
    steps = [("get_counter", None, (), 0), ("incr_counter", None, (), 1),
             ("reset_counter", None, (), 0), ("incr_counter", None, ("output",), 1),
             ("incr_counter_by", "dtype: DT_FLOAT float_val: 3", (), 4)]
    for signature, delta, output_filter, value in steps:
        request = _predict("counter", signature, {"delta": delta} if delta else None,
                           output_filter=output_filter)
        response = stack.prediction.Predict(request, Context())
        expected = _expected_predict(request, {"output": "dtype: DT_FLOAT tensor_shape {} "
                                               "float_val: %d" % value}, signature)
        assert _bytes(response) == _bytes(expected), signature


def test_predict_errors(stack):
    predict = stack.prediction.Predict
    _fails(predict, _predict(inputs={}), grpc.StatusCode.INVALID_ARGUMENT,
           "input size does not match signature")
    details = _fails(predict, _predict(inputs={
        "unknown_key1": 'dtype: DT_STRING tensor_shape { dim { size: 1 } } '
                        'string_val: "any_value"',
        "unknown_key2": "dtype: DT_FLOAT tensor_shape { dim { size: 1 } } float_val: 1"}),
        grpc.StatusCode.INVALID_ARGUMENT)
    assert "Sent extra: {unknown_key1,unknown_key2}" in details
    assert "Missing but required: {x}" in details
    _fails(predict, _predict(inputs={"x": "dtype: DT_BOOL bool_val: true"}),
           grpc.StatusCode.INVALID_ARGUMENT, "Expects arg[0] to be float but bool is provided")
    _fails(predict, _predict(inputs={"x": 'dtype: DT_STRING tensor_shape { dim { size: 1 } } '
                                          'string_val: "any_value"'}, output_filter=["y"]),
           grpc.StatusCode.INVALID_ARGUMENT, "to be float but string is provided")
    _fails(predict, _predict(inputs={"x": SCALAR_2}, output_filter=["output_filter"]),
           grpc.StatusCode.INVALID_ARGUMENT,
           "output tensor alias not found in signature: output_filter Outputs expected to "
           "be in the set {y}.")
    assert predict(_predict(inputs={"x": SCALAR_2}, output_filter=["y"]), Context())
    _fails(predict, _predict(inputs={"x": SCALAR_2}, output_filter=["y", "y"]),
           grpc.StatusCode.INVALID_ARGUMENT, "duplicate output tensor alias: y")
    _fails(predict, _predict(signature="nope", inputs={"x": SCALAR_2}),
           grpc.StatusCode.FAILED_PRECONDITION, 'Serving signature key "nope" not found.')


@pytest.mark.parametrize("call", ["Predict", "Classify", "Regress", "GetModelMetadata"])
def test_unknown_model_version_and_label(stack, call):
    """ServerCore's order: a label is resolved first (INVALID_ARGUMENT for a model it
    has no labels of); then Specific(name, version) or Latest(name) is NOT_FOUND."""
    kinds = {"Predict": predict_pb2.PredictRequest,
             "Classify": classification_pb2.ClassificationRequest,
             "Regress": regression_pb2.RegressionRequest,
             "GetModelMetadata": get_model_metadata_pb2.GetModelMetadataRequest}
    method = getattr(stack.prediction, call)

    def request(name, version=None, label=None):
        message = kinds[call]()
        message.model_spec.name = name
        if version is not None:
            message.model_spec.version.value = version
        if label is not None:
            message.model_spec.version_label = label
        if call == "GetModelMetadata":
            message.metadata_field.append("signature_def")
        else:
            getattr(message, "inputs" if call == "Predict" else "input")  # any input
        return message

    assert _fails(method, request("nope", version=99), grpc.StatusCode.NOT_FOUND) == \
        "Servable not found for request: Specific(nope, 99)"
    assert _fails(method, request("nope"), grpc.StatusCode.NOT_FOUND) == \
        "Servable not found for request: Latest(nope)"
    for name in ("nope", MODEL):
        assert _fails(method, request(name, label="latest!#$%&'()*+,/:;=?@[]"),
                      grpc.StatusCode.INVALID_ARGUMENT) == \
            "Unrecognized servable version label: latest!#$%&'()*+,/:;=?@[]"
    assert _fails(method, request(MODEL, version=99), grpc.StatusCode.NOT_FOUND) == \
        "Servable not found for request: Specific(%s, 99)" % MODEL


def test_method_name_check_on_predict(stack, checked):
    request = _predict("scoring", "odd_method", {"x": SCALAR_2})
    assert stack.prediction.Predict(request, Context()).outputs["y"].float_val == [2.0]
    _fails(checked.prediction.Predict, request, grpc.StatusCode.INTERNAL,
           "Expected prediction signature method_name to be one of "
           "{tensorflow/serving/predict, tensorflow/serving/classify, "
           "tensorflow/serving/regress}. Was: not/supported/method")


# --- GetModelMetadata -----------------------------------------------------------------

def test_metadata_returns_the_signatures_of_the_version(stack, bases):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = MODEL
    request.model_spec.version.value = VERSION
    response = stack.prediction.GetModelMetadata(request, Context())
    assert _bytes(response.model_spec) == _bytes(request.model_spec)
    assert list(response.metadata) == ["signature_def"]
    received = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(received)
    saved = saved_model_pb2.SavedModel.FromString(
        (bases / "half_plus_two" / "00000123" / "saved_model.pb").read_bytes())
    expected = get_model_metadata_pb2.SignatureDefMap()
    for key, value in saved.meta_graphs[0].signature_def.items():
        expected.signature_def[key].CopyFrom(value)
    assert _bytes(received) == _bytes(expected)


def test_metadata_errors(stack):
    metadata = stack.prediction.GetModelMetadata
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    _fails(metadata, request, grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
    request.model_spec.name = MODEL
    _fails(metadata, request, grpc.StatusCode.INVALID_ARGUMENT,
           "GetModelMetadataRequest must specify at least one metadata_field")
    request.metadata_field.append("some_stuff")
    _fails(metadata, request, grpc.StatusCode.INVALID_ARGUMENT,
           "Metadata field some_stuff is not supported")
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.SetInParent()
    _fails(metadata, request, grpc.StatusCode.INVALID_ARGUMENT,
           "ModelSpec has no name specified.")
    request.model_spec.name = "test"
    _fails(metadata, request, grpc.StatusCode.NOT_FOUND)


# --- Classify and Regress ---------------------------------------------------------------

def _example(**features):
    """{"class": [...], "score": [...], "value": [...]} -> tf.train.Example."""
    feature = {}
    for key, values in features.items():
        if key == "class":
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[v.encode() for v in values]))
        else:
            feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def _scoring_request(kind, signature="", examples=(), context=None):
    request = kind()
    request.model_spec.name = "scoring"
    if signature:
        request.model_spec.signature_name = signature
    if context is not None:
        request.input.example_list_with_context.context.CopyFrom(context)
        target = request.input.example_list_with_context.examples
    else:
        target = request.input.example_list.examples
    for example in examples:
        target.add().CopyFrom(example)
    return request


def _classifications(request, rows):
    """The ClassificationResponse TF Serving builds: rows [[(label, score)]]."""
    response = classification_pb2.ClassificationResponse()
    response.model_spec.name = "scoring"
    response.model_spec.version.value = VERSION
    response.model_spec.signature_name = request.model_spec.signature_name or \
        "serving_default"
    for row in rows:
        entry = response.result.classifications.add()
        for label, score in row:
            item = entry.classes.add()
            item.label, item.score = label, score
    return response


TWO = [_example(**{"class": ["dos", "uno"], "score": [2, 1]}),
       _example(**{"class": ["cuatro", "tres"], "score": [4, 3]})]


@pytest.mark.parametrize("signature, examples, context, rows", [
    ("", TWO, None, [[("dos", 2), ("uno", 1)], [("cuatro", 4), ("tres", 3)]]),
    ("", [tf.train.Example(), tf.train.Example()],
     _example(**{"class": ["dos", "uno"], "score": [2, 1]}),
     [[("dos", 2), ("uno", 1)], [("dos", 2), ("uno", 1)]]),
    # a feature in both the context and the example: the example's wins
    ("", [tf.train.Example(), _example(**{"class": ["tres", "cuatro"], "score": [3, 4]})],
     _example(**{"class": ["uno", "dos"], "score": [1, 2]}),
     [[("uno", 1), ("dos", 2)], [("tres", 3), ("cuatro", 4)]]),
    ("classes_only", TWO, None, [[("dos", 0), ("uno", 0)], [("cuatro", 0), ("tres", 0)]]),
    ("scores_only", TWO, None, [[("", 2), ("", 1)], [("", 4), ("", 3)]]),
    ("scores_only", [_example(score=[-1, 0, 1])], None, [[("", -1), ("", 0), ("", 1)]]),
    ("output_plus_one", TWO, None, [[("dos", 3), ("uno", 2)], [("cuatro", 5), ("tres", 4)]]),
])
def test_classify_answers_byte_for_byte(stack, signature, examples, context, rows):
    request = _scoring_request(classification_pb2.ClassificationRequest, signature, examples,
                               context)
    response = stack.prediction.Classify(request, Context())
    assert _bytes(response) == _bytes(_classifications(request, rows))
    assert [len(c.classes) for c in response.result.classifications] == [len(r) for r in rows]


@pytest.mark.parametrize("signature, examples, context, code, text", [
    ("nope", TWO, None, grpc.StatusCode.INVALID_ARGUMENT,
     "No signature was found with the name: nope"),
    ("improperly_sized_scores", TWO, None, grpc.StatusCode.INVALID_ARGUMENT,
     "Expected Tensor shape: [batch_size num_classes] but got [4]"),
    ("empty", TWO, None, grpc.StatusCode.INVALID_ARGUMENT, "Expected one input Tensor."),
    ("", (), None, grpc.StatusCode.INVALID_ARGUMENT, "Input is empty."),
    ("", (), tf.train.Example(), grpc.StatusCode.INVALID_ARGUMENT, "Input is empty."),
    ("run_fails", TWO, None, grpc.StatusCode.INVALID_ARGUMENT, "Run totally failed"),
    ("classes_batch_1", TWO, None, grpc.StatusCode.INVALID_ARGUMENT,
     "Expected classes output batch size of 2. Got: 1"),
    ("classes_float", TWO, None, grpc.StatusCode.INVALID_ARGUMENT,
     "Expected classes Tensor of DT_STRING. Got: DT_FLOAT"),
    ("scores_batch_1", TWO, None, grpc.StatusCode.INVALID_ARGUMENT,
     "Expected scores output batch size of 2. Got: 1"),
    ("scores_double", TWO, None, grpc.StatusCode.INVALID_ARGUMENT,
     "Expected scores Tensor of DT_FLOAT. Got: DT_DOUBLE"),
    ("mismatched", TWO, None, grpc.StatusCode.INVALID_ARGUMENT,
     "Tensors class and score should match in dim_size(1). Got 1 vs. 2"),
])
def test_classify_errors(stack, signature, examples, context, code, text):
    request = _scoring_request(classification_pb2.ClassificationRequest, signature, examples,
                               context)
    _fails(stack.prediction.Classify, request, code, text)


def test_a_signature_is_printed_as_tf_serving_prints_it(stack):
    """Messages quoting a SignatureDef carry its DebugString (protobuf's text format)."""
    request = _scoring_request(classification_pb2.ClassificationRequest, "regress", TWO)
    details = _fails(stack.prediction.Classify, request, grpc.StatusCode.INVALID_ARGUMENT)
    saved = stack.manager.acquire("scoring")
    try:
        printed = text_format.MessageToString(saved.signatures["regress"])
    finally:
        saved.release()
    assert details == ('Expected classification signature outputs to contain at least one '
                       'of "classes" or "scores". Signature was: ' + printed)
    assert printed.startswith('inputs {\n  key: "inputs"\n  value {\n    name: "examples:0"')


def test_method_name_check_on_classify_and_regress(stack, checked):
    request = _scoring_request(classification_pb2.ClassificationRequest, "regress_as_classify",
                               TWO)
    _fails(checked.prediction.Classify,
           _scoring_request(classification_pb2.ClassificationRequest, "regress", TWO),
           grpc.StatusCode.INVALID_ARGUMENT,
           "Expected classification signature method_name to be tensorflow/serving/classify."
           " Was: tensorflow/serving/regress")
    regress = _scoring_request(regression_pb2.RegressionRequest, "regress_as_classify", TWO)
    assert stack.prediction.Regress(regress, Context())
    _fails(checked.prediction.Regress, regress, grpc.StatusCode.INVALID_ARGUMENT,
           "Expected regression signature method_name to be tensorflow/serving/regress. "
           "Was: tensorflow/serving/classify")
    del request


def _regressions(request, values):
    response = regression_pb2.RegressionResponse()
    response.model_spec.name = "scoring"
    response.model_spec.version.value = VERSION
    response.model_spec.signature_name = request.model_spec.signature_name
    for value in values:
        response.result.regressions.add().value = value
    return response


VALUES = [_example(value=[2.0]), _example(value=[3.0])]


@pytest.mark.parametrize("signature, examples, context, values", [
    ("regress", VALUES, None, [2.0, 3.0]),
    ("regress", [tf.train.Example(), tf.train.Example()], _example(value=[4.0]), [4.0, 4.0]),
    ("regress_plus_one", VALUES, None, [3.0, 4.0]),
])
def test_regress_answers_byte_for_byte(stack, signature, examples, context, values):
    request = _scoring_request(regression_pb2.RegressionRequest, signature, examples, context)
    response = stack.prediction.Regress(request, Context())
    assert _bytes(response) == _bytes(_regressions(request, values))


@pytest.mark.parametrize("signature, examples, context, text", [
    ("nope", VALUES, None, "No signature was found with the name: nope"),
    ("regress_two_columns", VALUES, None, "Expected output Tensor shape to be either "
     "[batch_size] or [batch_size, 1] but got [2,2]"),
    ("regress", (), None, "Input is empty."),
    ("regress", (), tf.train.Example(), "Input is empty."),
    ("regress_batch_1", VALUES, None, "Input batch size did not match output batch size: "
     "2 vs. 1"),
    ("regress_double", VALUES, None, "Expected output Tensor of DT_FLOAT.  Got: DT_DOUBLE"),
    ("empty", VALUES, None, "Expected one input Tensor."),
])
def test_regress_errors(stack, signature, examples, context, text):
    request = _scoring_request(regression_pb2.RegressionRequest, signature, examples, context)
    _fails(stack.prediction.Regress, request, grpc.StatusCode.INVALID_ARGUMENT, text)
