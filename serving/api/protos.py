"""TF Serving's request and response protos built from arrays: shared by the gRPC
service (its answers) and the REST API (the records it hands to request logging, which
TF Serving also writes as protos whatever the transport)."""
import tensorflow as tf
from google.protobuf import wrappers_pb2
from tensorflow_serving.apis import classification_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import regression_pb2

from slimserve.serving.core import tensors


def fill_spec(spec, name, version, signature_name=None):
    spec.name = name
    if version is not None:
        spec.version.CopyFrom(wrappers_pb2.Int64Value(value=version))
    if signature_name:
        spec.signature_name = signature_name


def fill_classifications(result, classes, scores):
    rows = len(scores) if scores is not None else len(classes)
    width = scores.shape[1] if scores is not None else classes.shape[1]
    for row in range(rows):
        entry = result.classifications.add()
        for column in range(width):
            item = entry.classes.add()
            if classes is not None:
                item.label = classes[row][column].decode("utf-8", "replace")
            if scores is not None:
                item.score = float(scores[row][column])


def _example_input(input_proto, serialized_examples):
    for data in serialized_examples:
        input_proto.example_list.examples.add().CopyFrom(tf.train.Example.FromString(data))


def predict_pair(name, version, signature_name, feeds, outputs):
    """(PredictRequest, PredictResponse) of a predict answered from arrays."""
    request = predict_pb2.PredictRequest()
    fill_spec(request.model_spec, name, None, signature_name)
    for key, value in feeds.items():
        tensors.fill_proto(request.inputs[key], value)
    response = predict_pb2.PredictResponse()
    fill_spec(response.model_spec, name, version, signature_name)
    for key, value in outputs.items():
        tensors.fill_proto(response.outputs[key], value)
    return request, response


def classify_pair(name, version, signature_name, serialized_examples, classes, scores):
    request = classification_pb2.ClassificationRequest()
    fill_spec(request.model_spec, name, None, signature_name)
    _example_input(request.input, serialized_examples)
    response = classification_pb2.ClassificationResponse()
    fill_spec(response.model_spec, name, version, signature_name)
    fill_classifications(response.result, classes, scores)
    return request, response


def regress_pair(name, version, signature_name, serialized_examples, values):
    request = regression_pb2.RegressionRequest()
    fill_spec(request.model_spec, name, None, signature_name)
    _example_input(request.input, serialized_examples)
    response = regression_pb2.RegressionResponse()
    fill_spec(response.model_spec, name, version, signature_name)
    for value in values:
        response.result.regressions.add().value = float(value)
    return request, response
