"""TensorProto decoding and encoding of serving/core/tensors.py (bounded, typed-field aware)
against tf.make_ndarray and extend(tolist()), best of 5; and how fast a bomb is refused.

    python benchmarks/tensor_codec.py
"""
import time

import numpy as np

import common  # noqa: F401  pylint: disable=unused-import  (puts the repository on sys.path)
import tensorflow as tf  # pylint: disable=wrong-import-order
from google.protobuf import json_format
from tensorflow.core.framework import tensor_pb2
from slimserve.serving.core import tensors
from slimserve.serving.core import errors

def best(f, n=5):
    t = 1e9
    for _ in range(n):
        s = time.perf_counter(); f(); t = min(t, time.perf_counter() - s)
    return t * 1e3

a = np.random.default_rng(0).random((1000, 1000), dtype=np.float32)
typed = tensors.to_proto(a)
content = tf.make_tensor_proto(a)
print("decode 1M float32, float_val:      ours %.2f ms, tf.make_ndarray %.1f ms" % (
    best(lambda: tensors.from_proto("x", typed)), best(lambda: tf.make_ndarray(typed))))
print("decode 1M float32, tensor_content: ours %.2f ms, tf.make_ndarray %.2f ms" % (
    best(lambda: tensors.from_proto("x", content)), best(lambda: tf.make_ndarray(content))))
def naive():
    p = tensor_pb2.TensorProto(dtype=1); p.float_val.extend(a.ravel().tolist()); return p
print("encode 1M float32 into float_val:  ours %.2f ms, extend(tolist()) %.1f ms; "
      "tensor_content (make_tensor_proto) %.2f ms" % (
    best(lambda: tensors.to_proto(a)), best(naive), best(lambda: tf.make_tensor_proto(a))))
print("wire size: float_val %d bytes, tensor_content %d bytes" % (
    typed.ByteSize(), content.ByteSize()))
i = np.arange(1000000, dtype=np.int64)
print("encode 1M int64 into int64_val: %.1f ms" % best(lambda: tensors.to_proto(i), 3))
bomb = json_format.ParseDict({"dtype": "DT_STRING", "tensor_shape": {"dim": [{"size": 100000000}]},
                              "string_val": ["eA=="]}, tensor_pb2.TensorProto())
def reject():
    try:
        tensors.from_proto("image_bytes", bomb)
    except errors.ServingError:
        pass
print("string bomb [1e8] (TensorProto of %d bytes): rejected in %.3f ms" % (bomb.ByteSize(), best(reject)))
