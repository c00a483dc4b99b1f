"""Conversions between TensorProtos and numpy, as TF's Tensor::FromProto reads them and
bounded before allocation.

TF Serving does not check a request's tensors against the SignatureDef: it parses each
TensorProto (Tensor::FromProto) and feeds it to Session::Run, so the graph decides which
shapes it takes. `check_proto` accepts exactly the protos FromProto accepts, with its
rules (rank <= 254, dimensions >= 0 whose running product fits int64, tensor_content of
exactly the shape's bytes, else the typed field: extra values ignored, missing ones filled
with the last value, or zeros when there are none, values in other fields ignored), and a
proto FromProto refuses is INVALID_ARGUMENT "tensor parsing error: <alias>" as there. On
top of that, and before any array is allocated, a request may cost only what its size
justifies: the per-request element limit, and a smaller limit on elements filled from
fewer values (max_request_elements / max_broadcast_elements).

Responses fill the typed repeated fields (float_val, int64_val, string_val, ...) as
TF Serving 2.15's Predict does (Tensor::AsProtoField), so clients reading
`response.outputs[k].float_val` work; tf.make_ndarray reads them too.
"""
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
MAX_DIMENSIONS = 254  # TensorShape::MaxDimensions(): deeper protos do not parse in TF
MAX_ARRAY_RANK = 32  # numpy's (1.x) limit: what this server can feed TensorFlow
_INT64_MAX = 2 ** 63 - 1

_FIELDS = tensor_pb2.TensorProto.DESCRIPTOR.fields_by_name

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
# TF's DataTypeString() where it differs from the Python name (its error messages use it).
_CPP_NAMES = {"float32": "float", "float64": "double", "float16": "half"}


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


def type_string(dtype):
    """TF's C++ DataTypeString of a tf.DType ("float", "double", "int32", "string"...)."""
    return _CPP_NAMES.get(dtype.name, dtype.name)


def array_dtype(array):
    """The tf.DType of an ndarray (object and bytes arrays are strings)."""
    if array.dtype == object or array.dtype.kind in "SU":
        return tf.string
    dtype = _NUMPY_DTYPES.get(array.dtype)
    if dtype is None:
        dtype = _NUMPY_DTYPES[array.dtype] = tf.dtypes.as_dtype(array.dtype)
    return dtype


def parsing_error(key):
    """What TF Serving answers for a TensorProto Tensor::FromProto refuses."""
    return errors.invalid("tensor parsing error: %s", key)


def element_count(key, dims, limit):
    """Elements of a tensor of `dims` -> int; refuses (before multiplying further) once the
    product passes `limit`, INVALID_ARGUMENT naming the limit."""
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


def _valid_shape(dims):
    """TensorShape::IsValid for a fully defined shape: rank, no negative dimension, and a
    running product that never overflows int64 (a 0 early keeps it 0)."""
    if len(dims) > MAX_DIMENSIONS:
        return False
    product = 1
    for dim in dims:
        if dim < 0:
            return False
        product *= dim
        if product > _INT64_MAX:
            return False
    return True


def check_rank(key, dims):
    """Ranks TF takes (up to 254) but numpy arrays, which carry every tensor here, do not."""
    if len(dims) > MAX_ARRAY_RANK:
        raise errors.invalid("input %r has %d dimensions; this server takes at most %d "
                             "(numpy's limit; TensorFlow allows %d)", key, len(dims),
                             MAX_ARRAY_RANK, MAX_DIMENSIONS)


def _representable(key, dims, itemsize):
    """numpy needs the product of the non-zero dimensions (times the item size) to fit its
    index type even when a 0 makes the tensor empty; TF does not. Such shapes are refused
    here (the one shape TF Serving takes that this server cannot)."""
    product = itemsize
    for dim in dims:
        product *= dim or 1
        if product > _INT64_MAX:
            raise errors.invalid(
                "input %r has shape %s: it holds no elements, but its non-zero dimensions "
                "multiply past 2^63 bytes, which this server cannot represent", key, dims)


def _string_content(content, count):
    """The strings of a DT_STRING tensor_content (TF's EncodeStringList: `count` varint32
    lengths, then the bytes), or None when it is not exactly that."""
    pos, lengths = 0, []
    try:
        for _ in range(count):
            length, pos = _read_varint(content, pos)
            lengths.append(length)
    except IndexError:
        return None
    if pos + sum(lengths) != len(content):
        return None
    out = []
    for length in lengths:
        out.append(bytes(content[pos:pos + length]))
        pos += length
    return out


def check_proto(key, proto, max_elements=DEFAULT_MAX_REQUEST_ELEMENTS,
                max_broadcast=DEFAULT_MAX_BROADCAST_ELEMENTS):
    """Validates `proto` as Tensor::FromProto would, and against this server's bounds,
    without allocating its array; returns (dtype, dims, count)."""
    try:
        dtype = as_dtype(proto.dtype) if proto.dtype else None
    except TypeError:
        dtype = None
    if dtype is None:  # DT_INVALID or an enum TF does not know: FromProto fails
        raise parsing_error(key)
    if dtype not in _TYPED:
        raise errors.invalid("input %r has %s, which this server does not accept (takes %s)",
                             key, dtype.name, _SUPPORTED)
    # A non-partial TensorShape ignores unknown_rank and reads the dimensions.
    dims = [d.size for d in proto.tensor_shape.dim]
    if not _valid_shape(dims):
        raise parsing_error(key)
    check_rank(key, dims)
    count = element_count(key, dims, max_elements)
    if count == 0:
        _representable(key, dims, dtype.size if dtype != tf.string else 8)
        return dtype, dims, 0
    if proto.tensor_content:  # used whenever present; the typed fields are then ignored
        if dtype == tf.string:
            if _string_content(proto.tensor_content, count) is None:
                raise parsing_error(key)
        elif len(proto.tensor_content) != count * dtype.size:
            raise parsing_error(key)
        return dtype, dims, count
    field, _, per_element = _TYPED[dtype]
    values = len(getattr(proto, field)) // per_element
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


def _fill(flat, count):
    """TF's FromProtoField: the first `count` values, the last one repeated past the
    end, zeros when there are none."""
    if flat.size >= count:
        return flat[:count]
    fill = np.zeros(count, dtype=flat.dtype)
    fill[:flat.size] = flat
    if flat.size:
        fill[flat.size:] = flat[-1]
    return fill


def _from_typed_field(proto, dtype, dims, count):
    field, read_as, per_element = _TYPED[dtype]
    values = getattr(proto, field)
    if field in _FIXED_WIDTH.values() and len(values) >= count > 64:
        flat = _packed_fixed_width(proto, field, read_as)
        if flat is not None and flat.size == len(values):
            return flat[:count].astype(read_as, copy=False).reshape(dims)
    if dtype == tf.string:
        flat = np.empty(count, dtype=object)
        given = list(values[:count])
        flat[:len(given)] = given
        if len(given) < count:  # TF's fill: the last value repeated (b"" when none)
            flat[len(given):] = given[-1] if given else b""
        return flat.reshape(dims)
    if per_element == 2:  # complex: (real, imaginary) pairs; an odd last number ignored
        pairs = np.fromiter(values, dtype=read_as,
                            count=len(values) // 2 * 2).reshape(-1, 2)
        flat = (pairs[:, 0] + 1j * pairs[:, 1]).astype(dtype.as_numpy_dtype)
        return _fill(flat, count).reshape(dims)
    given = min(len(values), count)
    flat = np.fromiter(values[:given] if given < len(values) else values, dtype=read_as,
                       count=given)
    if dtype in (tf.float16, tf.bfloat16):
        flat = flat.astype(np.uint16).view(dtype.as_numpy_dtype)
    elif flat.dtype != dtype.as_numpy_dtype:
        flat = flat.astype(dtype.as_numpy_dtype)  # int_val narrows like TF's static_cast
    return _fill(flat, count).reshape(dims)


def from_proto(key, proto, max_elements=DEFAULT_MAX_REQUEST_ELEMENTS,
               max_broadcast=DEFAULT_MAX_BROADCAST_ELEMENTS):
    """TensorProto -> ndarray, validated (check_proto) before anything is allocated."""
    dtype, dims, count = check_proto(key, proto, max_elements, max_broadcast)
    return _decode(proto, dtype, dims, count)


def _decode(proto, dtype, dims, count):
    """The array of a proto check_proto has passed as (dtype, dims, count)."""
    if count == 0:
        return np.empty(dims, dtype=object if dtype == tf.string else dtype.as_numpy_dtype)
    if proto.tensor_content:
        if dtype == tf.string:
            flat = np.empty(count, dtype=object)
            flat[:] = _string_content(proto.tensor_content, count)
            return flat.reshape(dims)
        # Host byte order, as TF itself reads tensor_content. Read-only, which feeding
        # TF and batching (np.concatenate) never mind.
        return np.frombuffer(proto.tensor_content, dtype=dtype.as_numpy_dtype).reshape(dims)
    return _from_typed_field(proto, dtype, dims, count)


def decode_inputs(inputs, signature_inputs=None, max_elements=DEFAULT_MAX_REQUEST_ELEMENTS,
                  max_broadcast=DEFAULT_MAX_BROADCAST_ELEMENTS):
    """{key: TensorProto} -> {key: ndarray}; every proto is checked, and the request's
    total element count bounded, before the first array is allocated.

    signature_inputs: accepted for callers that have it; as in TF Serving, the protos
    are not checked against the signature (the graph decides when they run)."""
    del signature_inputs
    total, checked = 0, []
    for key, proto in inputs.items():
        dtype, dims, count = check_proto(key, proto, max_elements, max_broadcast)
        total += count
        if total > max_elements:
            raise errors.invalid("request inputs total more than %d elements, over this "
                                 "server's limit of %d elements per request "
                                 "(max_request_elements)", max_elements, max_elements)
        checked.append((key, proto, dtype, dims, count))
    return {key: _decode(proto, dtype, dims, count)
            for key, proto, dtype, dims, count in checked}


def check_request_size(feeds, max_elements=DEFAULT_MAX_REQUEST_ELEMENTS):
    """Bounds decoded feeds (REST, in-process) by the same per-request element limit."""
    total = sum(int(array.size) for array in feeds.values())
    if total > max_elements:
        raise errors.invalid("request inputs total %d elements, over this server's limit of "
                             "%d elements per request (max_request_elements)", total,
                             max_elements)


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
    proto.tensor_shape.SetInParent()  # set even for a scalar, as AsProtoField sets it
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
    elif dtype in (tf.complex64, tf.complex128):  # (real, imaginary) pairs, as TF's Fill
        parts = np.empty(flat.size * 2, dtype=flat.real.dtype)
        parts[0::2], parts[1::2] = flat.real, flat.imag
        getattr(proto, _TYPED[dtype][0]).extend(parts.tolist())
    elif dtype in _TYPED:
        getattr(proto, _TYPED[dtype][0]).extend(flat.tolist())
    else:
        proto.CopyFrom(tf.make_tensor_proto(array))
    return proto


def to_proto(array):
    return fill_proto(tensor_pb2.TensorProto(), array)
