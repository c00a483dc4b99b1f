"""Conversions between TensorProtos, REST JSON values and numpy, checked against a
signature's TensorInfo so that wrong dtypes and shapes are INVALID_ARGUMENT."""
import base64

import numpy as np
import tensorflow as tf

from serving import errors


def signature_dtype(tensor_info):
    return tf.dtypes.as_dtype(tensor_info.dtype)


def check_input(key, array, tensor_info):
    """Raises INVALID_ARGUMENT unless `array` fits the signature input `key`."""
    expected = signature_dtype(tensor_info)
    got = tf.dtypes.as_dtype(array.dtype) if array.dtype != object else tf.string
    if expected != got:
        raise errors.invalid("Expects arg[%s] to be %s but %s is provided", key,
                             expected.name, got.name)
    if not tensor_info.tensor_shape.unknown_rank:
        dims = [d.size for d in tensor_info.tensor_shape.dim]
        shape = list(array.shape)
        if len(dims) != len(shape) or any(d >= 0 and d != s for d, s in zip(dims, shape)):
            raise errors.invalid("input %r has shape %s; the signature expects %s (-1: any)",
                                 key, shape, dims)
    if array.ndim == 0:
        raise errors.invalid("input %r is a scalar; a batch dimension is required", key)
    if array.shape[0] == 0:
        raise errors.invalid("input %r has an empty batch (0 rows)", key)


def from_proto(key, proto):
    try:
        return tf.make_ndarray(proto)
    except (TypeError, ValueError) as error:
        raise errors.invalid("input %r is not a valid TensorProto: %s", key, error) from None


def to_proto(array):
    return tf.make_tensor_proto(array)


def _decode_strings(value, key):
    if isinstance(value, dict):
        if set(value) != {"b64"}:
            raise errors.invalid("input %r: an object value must be {\"b64\": ...}", key)
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (ValueError, TypeError):
            raise errors.invalid("input %r: \"b64\" value is not valid base64", key) from None
    if isinstance(value, list):
        return [_decode_strings(v, key) for v in value]
    if isinstance(value, str):
        return value.encode("utf-8")
    raise errors.invalid("input %r expects strings, got %s", key, type(value).__name__)


def from_json(key, value, tensor_info):
    """A REST JSON value (already batched) -> ndarray of the signature's dtype."""
    dtype = signature_dtype(tensor_info)
    if dtype == tf.string:
        decoded = _decode_strings(value, key)
        array = np.empty(len(decoded) if isinstance(decoded, list) else (), dtype=object)
        if isinstance(decoded, list) and decoded and isinstance(decoded[0], list):
            array = np.array(decoded, dtype=object)
        elif isinstance(decoded, list):
            array[:] = decoded
        else:
            array[()] = decoded
        return array
    try:
        return np.array(value, dtype=dtype.as_numpy_dtype)
    except (TypeError, ValueError) as error:
        raise errors.invalid("input %r cannot be read as %s: %s", key, dtype.name,
                             error) from None


def to_json(key, array):
    """ndarray -> JSON-ready lists; strings are UTF-8 text, or {"b64"} for *_bytes keys."""
    if array.dtype == object or array.dtype.kind in ("S", "O"):
        def convert(value):
            if isinstance(value, bytes):
                if key.endswith("_bytes"):
                    return {"b64": base64.b64encode(value).decode("ascii")}
                return value.decode("utf-8", "replace")
            return value
        return np.vectorize(convert, otypes=[object])(array).tolist() if array.size else []
    return array.tolist()
