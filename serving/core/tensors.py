"""Conversions between TensorProtos, REST JSON values and numpy, bounded before allocation.

A request may cost only what its size justifies. Every TensorProto is checked against
the signature (dtype, rank, fixed dimensions) and against its own payload (dimensions
>= 0, element count against the values it carries, per-request element limit) before
any array is allocated; only then is it decoded, straight from the typed field or
`tensor_content`. Failures are INVALID_ARGUMENT naming the input and the limit.

Responses fill the typed repeated fields (float_val, int64_val, string_val, ...) as
TF Serving 2.15's Predict does (Tensor::AsProtoField), so clients reading
`response.outputs[k].float_val` work; tf.make_ndarray reads them too.
"""
import base64

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from slimserve.serving.core import errors

# Elements one request may carry, summed over its inputs. 2**26 = 67,108,864: 256 MiB as
# float32, an eighth of what gRPC's 2 GiB message limit could carry, and ~1.8x a batch
# of 128 images at 299x299x3 (34M). Strings cost ~40 bytes of host memory each however
# short they are on the wire, so this also bounds a string payload to a few GB.
DEFAULT_MAX_REQUEST_ELEMENTS = 1 << 26
# A TensorProto may carry fewer values than its shape has elements: TF repeats the last
# value (tf.make_tensor_proto(0.5, shape=[2, 3]) sends one float_val), or fills zeros when
# there are none. That expansion costs memory the request did not pay for in bytes, so it
# has its own, smaller limit: 2**20 = 1,048,576 elements (4 MiB of float32; one
# 512x512x3 image).
DEFAULT_MAX_BROADCAST_ELEMENTS = 1 << 20
# Deepest REST JSON nesting accepted when the signature does not fix the rank.
MAX_JSON_RANK = 32

_FIELDS = tensor_pb2.TensorProto.DESCRIPTOR.fields_by_name
_META_FIELDS = ("dtype", "tensor_shape", "version_number")

# dtype -> (typed field, numpy type the field's values are read as, values per element).
_TYPED = {
    tf.float32: ("float_val", np.float32, 1),
    tf.float64: ("double_val", np.float64, 1),
    tf.int32: ("int_val", np.int32, 1),
    tf.int16: ("int_val", np.int32, 1),
    tf.int8: ("int_val", np.int32, 1),
    tf.uint8: ("int_val", np.int32, 1),
    tf.uint16: ("int_val", np.int32, 1),
    tf.int64: ("int64_val", np.int64, 1),
    tf.uint32: ("uint32_val", np.uint32, 1),
    tf.uint64: ("uint64_val", np.uint64, 1),
    tf.bool: ("bool_val", np.bool_, 1),
    tf.float16: ("half_val", np.int32, 1),
    tf.bfloat16: ("half_val", np.int32, 1),
    tf.complex64: ("scomplex_val", np.float32, 2),
    tf.complex128: ("dcomplex_val", np.float64, 2),
    tf.string: ("string_val", object, 1),
}
_SUPPORTED = ", ".join(sorted(d.name for d in _TYPED))
# Typed fields whose values are fixed-width little-endian on the wire: packed, they are
# the array's bytes, so a response encodes them without a per-element Python loop.
_FIXED_WIDTH = {np.dtype(np.float32): "float_val", np.dtype(np.float64): "double_val"}


_NUMPY_DTYPES = {}  # numpy dtype -> tf.DType, likewise
_DTYPES = {}  # DataType enum -> tf.DType, filled on first use (as_dtype is slow per call)


def as_dtype(enum_value):
    """tf.dtypes.as_dtype, memoised for the request path; TypeError for an unknown enum."""
    dtype = _DTYPES.get(enum_value)
    if dtype is None:
        dtype = _DTYPES[enum_value] = tf.dtypes.as_dtype(enum_value)
    return dtype


def signature_dtype(tensor_info):
    return as_dtype(tensor_info.dtype)


def _dtype_name(enum_value):
    try:
        return tf.dtypes.as_dtype(enum_value).name
    except TypeError:
        return "dtype enum %d" % enum_value


def _check_shape_against_signature(key, dims, tensor_info):
    if tensor_info is None or tensor_info.tensor_shape.unknown_rank:
        return
    expected = [d.size for d in tensor_info.tensor_shape.dim]
    if len(dims) != len(expected) or any(e >= 0 and e != d for e, d in zip(expected, dims)):
        raise errors.invalid("input %r has shape %s; the signature expects %s (-1: any)",
                             key, dims, expected)


def element_count(key, dims, limit):
    """Product of `dims`, refusing (before multiplying further) once it passes `limit`."""
    count = 1
    for dim in dims:
        if dim == 0:
            return 0
    for dim in dims:
        count *= dim
        if count > limit:
            raise errors.invalid(
                "input %r has shape %s, over this server's limit of %d elements per request "
                "(max_request_elements)", key, dims, limit)
    return count


def check_proto(key, proto, tensor_info=None, max_elements=DEFAULT_MAX_REQUEST_ELEMENTS,
                max_broadcast=DEFAULT_MAX_BROADCAST_ELEMENTS):
    """Validates `proto` without allocating its array; returns (dtype, dims, count).

    tensor_info: the signature's TensorInfo for `key` (None: payload checks only).
    """
    try:
        dtype = as_dtype(proto.dtype)
    except TypeError:
        dtype = None
    if dtype not in _TYPED:
        raise errors.invalid("input %r has %s, which this server does not accept (takes %s)",
                             key, _dtype_name(proto.dtype), _SUPPORTED)
    if tensor_info is not None and as_dtype(tensor_info.dtype) != dtype:
        raise errors.invalid("Expects arg[%s] to be %s but %s is provided", key,
                             signature_dtype(tensor_info).name, dtype.name)
    shape = proto.tensor_shape
    if shape.unknown_rank:
        raise errors.invalid("input %r has an unknown rank; a TensorProto sent as input needs "
                             "its dimensions", key)
    dims = [d.size for d in shape.dim]
    if any(d < 0 for d in dims):
        raise errors.invalid("input %r has a negative dimension in shape %s", key, dims)
    _check_shape_against_signature(key, dims, tensor_info)
    count = element_count(key, dims, max_elements)

    field, _, per_element = _TYPED[dtype]
    present = {f.name for f, _ in proto.ListFields()} - set(_META_FIELDS)
    stray = present - {field, "tensor_content"}
    if stray:
        raise errors.invalid("input %r is %s but carries values in %s (%s takes %s or "
                             "tensor_content)", key, dtype.name, ", ".join(sorted(stray)),
                             dtype.name, field)
    if "tensor_content" in present:
        if dtype == tf.string:
            raise errors.invalid("input %r: a string tensor cannot use tensor_content", key)
        if field in present:
            raise errors.invalid("input %r carries both tensor_content and %s; send one",
                                 key, field)
        size = len(proto.tensor_content)
        if size != count * dtype.size:
            raise errors.invalid("input %r has shape %s (%d elements of %d bytes) but "
                                 "tensor_content holds %d bytes", key, dims, count,
                                 dtype.size, size)
        return dtype, dims, count
    values = len(getattr(proto, field))
    if values % per_element:
        raise errors.invalid("input %r: %s needs %d numbers per element, got %d", key, field,
                             per_element, values)
    values //= per_element
    if values > count:
        raise errors.invalid("input %r has shape %s (%d elements) but carries %d values in %s",
                             key, dims, count, values, field)
    if values < count and count > max_broadcast:
        raise errors.invalid(
            "input %r has shape %s (%d elements) but carries %d values in %s; filling the "
            "rest with the last value is limited to %d elements (max_broadcast_elements)",
            key, dims, count, values, field, max_broadcast)
    return dtype, dims, count


def _read_varint(data, pos):
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _packed_fixed_width(proto, field, read_as):
    """The values of a fixed-width repeated field (float_val, double_val) as an array,
    read from the message's wire bytes: serializing and viewing the packed payload takes
    ~1 ms for a million floats, iterating the repeated field ~100 ms. None when the field
    is not packed (protobuf writes it packed; a hand-made message may not)."""
    wire = proto.SerializeToString()
    number, chunks, pos = _FIELDS[field].number, [], 0
    while pos < len(wire):
        key, pos = _read_varint(wire, pos)
        kind = key & 7
        if kind == 0:
            _, pos = _read_varint(wire, pos)
        elif kind == 1 or kind == 5:
            if key >> 3 == number:
                return None
            pos += 8 if kind == 1 else 4
        elif kind == 2:
            length, pos = _read_varint(wire, pos)
            if key >> 3 == number:
                chunks.append(wire[pos:pos + length])
            pos += length
        else:
            return None
    raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return np.frombuffer(raw, dtype=np.dtype(read_as).newbyteorder("<"))


def _from_typed_field(proto, dtype, dims, count):
    field, read_as, _ = _TYPED[dtype]
    values = getattr(proto, field)
    if field in _FIXED_WIDTH.values() and len(values) == count and count > 64:
        flat = _packed_fixed_width(proto, field, read_as)
        if flat is not None and flat.size == count:
            return flat.astype(read_as, copy=False).reshape(dims)
    if dtype == tf.string:
        flat = np.empty(count, dtype=object)
        if len(values) == count:
            flat[:] = list(values)
        elif count:
            # TF's fill: the given values, then the last repeated (b"" when there are none).
            given = list(values)
            flat[:len(given)] = given
            flat[len(given):] = given[-1] if given else b""
        return flat.reshape(dims)
    flat = np.fromiter(values, dtype=read_as, count=len(values))
    if dtype in (tf.float16, tf.bfloat16):
        flat = flat.astype(np.uint16).view(dtype.as_numpy_dtype)
    elif flat.dtype != dtype.as_numpy_dtype:
        flat = flat.astype(dtype.as_numpy_dtype)  # int_val narrows like TF's static_cast
    if flat.size != count:
        fill = np.zeros(count, dtype=flat.dtype)
        fill[:flat.size] = flat
        if flat.size:
            fill[flat.size:] = flat[-1]
        flat = fill
    return flat.reshape(dims)


def from_proto(key, proto, tensor_info=None, max_elements=DEFAULT_MAX_REQUEST_ELEMENTS,
               max_broadcast=DEFAULT_MAX_BROADCAST_ELEMENTS):
    """TensorProto -> ndarray, validated (check_proto) before anything is allocated."""
    dtype, dims, count = check_proto(key, proto, tensor_info, max_elements, max_broadcast)
    return _decode(key, proto, dtype, dims, count)


def _decode(key, proto, dtype, dims, count):
    """The array of a proto check_proto has passed as (dtype, dims, count)."""
    if proto.tensor_content:
        # Host byte order, as TF itself reads tensor_content. Read-only, which feeding
        # TF and batching (np.concatenate) never mind.
        return np.frombuffer(proto.tensor_content, dtype=dtype.as_numpy_dtype).reshape(dims)
    if dtype in (tf.complex64, tf.complex128):
        try:  # rare; validated above, so make_ndarray allocates at most `count` elements
            return tf.make_ndarray(proto)
        except (TypeError, ValueError) as error:
            raise errors.invalid("input %r is not a valid TensorProto: %s", key,
                                 error) from None
    return _from_typed_field(proto, dtype, dims, count)


def decode_inputs(inputs, signature_inputs, max_elements=DEFAULT_MAX_REQUEST_ELEMENTS,
                  max_broadcast=DEFAULT_MAX_BROADCAST_ELEMENTS):
    """{key: TensorProto} -> {key: ndarray}; every proto is checked, and the request's
    total element count bounded, before the first array is allocated."""
    total, checked = 0, []
    for key, proto in inputs.items():
        dtype, dims, count = check_proto(key, proto, signature_inputs.get(key), max_elements,
                                         max_broadcast)
        total += count
        if total > max_elements:
            raise errors.invalid("request inputs total more than %d elements, over this "
                                 "server's limit of %d elements per request "
                                 "(max_request_elements)", max_elements, max_elements)
        checked.append((key, proto, dtype, dims, count))
    return {key: _decode(key, proto, dtype, dims, count)
            for key, proto, dtype, dims, count in checked}


def check_request_size(feeds, max_elements=DEFAULT_MAX_REQUEST_ELEMENTS):
    """Bounds decoded feeds (REST, in-process) by the same per-request element limit."""
    total = sum(int(array.size) for array in feeds.values())
    if total > max_elements:
        raise errors.invalid("request inputs total %d elements, over this server's limit of "
                             "%d elements per request (max_request_elements)", total,
                             max_elements)


def check_input(key, array, tensor_info):
    """Raises INVALID_ARGUMENT unless `array` fits the signature input `key`."""
    expected = signature_dtype(tensor_info)
    got = _NUMPY_DTYPES.get(array.dtype) if array.dtype != object else tf.string
    if got is None:
        got = _NUMPY_DTYPES[array.dtype] = tf.dtypes.as_dtype(array.dtype)
    if expected != got:
        raise errors.invalid("Expects arg[%s] to be %s but %s is provided", key,
                             expected.name, got.name)
    _check_shape_against_signature(key, list(array.shape), tensor_info)
    if array.ndim == 0:
        raise errors.invalid("input %r is a scalar; a batch dimension is required", key)
    if array.shape[0] == 0:
        raise errors.invalid("input %r has an empty batch (0 rows)", key)


def _varint(value):
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _packed_field(name, raw):
    """Wire bytes of a packed repeated field (tag, length, payload); merged into a message
    they are exactly what protobuf itself would write for those values."""
    tag = (_FIELDS[name].number << 3) | 2  # wire type 2: length-delimited
    return _varint(tag) + _varint(len(raw)) + raw


def fill_proto(proto, array):
    """Writes `array` into the (empty) TensorProto `proto` with the typed repeated field
    TF Serving uses (AsProtoField). float32/float64 go in as packed bytes; other dtypes
    through the repeated field's extend; dtypes without a typed field via TF."""
    array = np.asarray(array)
    dtype = tf.string if array.dtype == object or array.dtype.kind in "SU" else \
        _NUMPY_DTYPES.get(array.dtype)
    if dtype is None:
        dtype = _NUMPY_DTYPES[array.dtype] = tf.dtypes.as_dtype(array.dtype)
    proto.dtype = dtype.as_datatype_enum
    dims = proto.tensor_shape.dim
    for size in array.shape:
        dims.add(size=size)
    flat = array.ravel()
    if array.dtype in _FIXED_WIDTH:
        if flat.size:
            raw = flat.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            proto.MergeFromString(_packed_field(_FIXED_WIDTH[array.dtype], raw))
        return proto
    if dtype == tf.string:
        proto.string_val.extend(v if isinstance(v, bytes) else str(v).encode("utf-8")
                                for v in flat.tolist())
    elif dtype in (tf.float16, tf.bfloat16):
        proto.half_val.extend(flat.view(np.uint16).tolist())
    elif dtype in _TYPED and dtype not in (tf.complex64, tf.complex128):
        getattr(proto, _TYPED[dtype][0]).extend(flat.tolist())
    else:
        proto.CopyFrom(tf.make_tensor_proto(array))
    return proto


def to_proto(array):
    return fill_proto(tensor_pb2.TensorProto(), array)


def _json_shape(key, value, max_rank, max_elements):
    """Shape of a nested JSON list, checked rectangular and bounded level by level
    (iteratively: no recursion for a client to exhaust)."""
    dims = []
    level = [value]
    while level and isinstance(level[0], list):
        width = len(level[0])
        for item in level:
            if not isinstance(item, list) or len(item) != width:
                raise errors.invalid(
                    "input %r is ragged: at depth %d lists have different lengths (or mix "
                    "lists and values); a tensor needs every row the same length", key,
                    len(dims))
        dims.append(width)
        if len(dims) > max_rank:
            raise errors.invalid("input %r nests lists deeper than %d levels", key, max_rank)
        count = 1
        for dim in dims:
            count *= dim
        if count > max_elements:
            raise errors.invalid("input %r has more than %d elements, over this server's "
                                 "limit (max_request_elements)", key, max_elements)
        level = [x for item in level for x in item]
    if any(isinstance(item, list) for item in level):
        raise errors.invalid("input %r is ragged: lists and values mixed at depth %d", key,
                             len(dims))
    return dims, level


def _decode_string(value, key):
    if isinstance(value, dict):
        if set(value) != {"b64"}:
            raise errors.invalid("input %r: an object value must be {\"b64\": ...}", key)
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (ValueError, TypeError):
            raise errors.invalid("input %r: \"b64\" value is not valid base64", key) from None
    if isinstance(value, str):
        return value.encode("utf-8")
    raise errors.invalid("input %r expects strings, got %s", key, type(value).__name__)


def from_json(key, value, tensor_info, max_elements=DEFAULT_MAX_REQUEST_ELEMENTS):
    """A REST JSON value (already batched) -> ndarray of the signature's dtype.

    Nesting depth (the signature's rank, else MAX_JSON_RANK), raggedness and the element
    count are checked before the array is built.
    """
    dtype = signature_dtype(tensor_info)
    shape = tensor_info.tensor_shape
    max_rank = MAX_JSON_RANK if shape.unknown_rank else len(shape.dim)
    dims, leaves = _json_shape(key, value, max_rank, max_elements)
    if dtype == tf.string:
        flat = np.empty(len(leaves), dtype=object)
        flat[:] = [_decode_string(leaf, key) for leaf in leaves]
        return flat.reshape(dims)
    for leaf in leaves:
        if not isinstance(leaf, (int, float)):  # bool is an int
            raise errors.invalid("input %r cannot be read as %s: %r is not a number", key,
                                 dtype.name, leaf if not isinstance(leaf, (dict, str))
                                 else type(leaf).__name__)
    try:
        return np.array(leaves, dtype=dtype.as_numpy_dtype).reshape(dims)
    except (TypeError, ValueError, OverflowError) as error:
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
