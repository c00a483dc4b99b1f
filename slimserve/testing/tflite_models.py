"""TFLite models made by the tests with TensorFlow's own converter, shaped like TF
Serving's testdata (saved_model_half_plus_two_tflite and ..._with_sigdef): y = x / 2 + 2
on a float input of shape [1, 1], which TF Serving resizes to whatever a request sends.

    half_plus_two(base, signature_defs=False)  -> <base>/123/model.tflite, tensors x, y,
                                                  no SignatureDefs (TF Serving makes one)
    half_plus_two(base, signature_defs=True)   -> input tensor `tflite_input` under key x,
                                                  SignatureDefs serving_default and
                                                  half_plus_two in the model's metadata
"""
import os

import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from slimserve.serving.core import tflite_model

VERSION = 123
NAMED_SIGNATURE = "half_plus_two"


def half_plus_two_bytes(input_name="x"):
    """The converted model (tf.compat.v1.lite.TFLiteConverter.from_session, as TF
    Serving's testdata was made): tensors `input_name` and `y`."""
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        x = tf.compat.v1.placeholder(tf.float32, [1, 1], name=input_name)
        y = tf.add(tf.multiply(x, 0.5), 2.0, name="y")
        return tf.compat.v1.lite.TFLiteConverter.from_session(session, [x], [y]).convert()


def signature_def(input_tensor, output_tensor="y:0", shape=(1, 1)):
    """A predict SignatureDef x -> y naming these tensors (TF's `name:0` style)."""
    proto = meta_graph_pb2.SignatureDef(method_name=tf.saved_model.PREDICT_METHOD_NAME)
    for infos, key, name in ((proto.inputs, "x", input_tensor),
                             (proto.outputs, "y", output_tensor)):
        infos[key].name = name
        infos[key].dtype = tf.float32.as_datatype_enum
        infos[key].tensor_shape.SetInParent()  # a scalar's shape is present and empty
        for size in shape:
            infos[key].tensor_shape.dim.add().size = size
    return proto


def half_plus_two(base, signature_defs=False, version=VERSION):
    """Writes <base>/<version>/model.tflite; returns the version directory."""
    path = os.path.join(str(base), str(version))
    os.makedirs(path, exist_ok=True)
    if signature_defs:
        data = tflite_model.with_signature_defs(
            half_plus_two_bytes("tflite_input"),
            {tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY: signature_def("tflite_input:0"),
             NAMED_SIGNATURE: signature_def("tflite_input:0")})
    else:
        data = half_plus_two_bytes()
    with open(os.path.join(path, tflite_model.MODEL_FILENAME), "wb") as handle:
        handle.write(data)
    return path
