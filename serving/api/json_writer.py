"""The bytes TF Serving 2.15's REST API writes, reproduced (its sources read at tag 2.15.1;
none copied): predict / classify / regress / error bodies come from rapidjson 1.1.0's
PrettyWriter as util/json_tensor.cc drives it, status and metadata from protobuf's C++
JSON printer (MessageToJsonString, add_whitespace, always_print_primitive_fields).

What that means on the wire:
- 4-space indentation; arrays a row writes are single-line (`[2.5, 3.0]`), but the outer
  `predictions` array of a row-format answer closes on its own line (TF Serving sets the
  single-line option after opening it and clears it before closing it), and columnar
  answers are fully multi-line. An object ({"b64": ...}, a row of several outputs) always
  breaks lines, even inside a single-line array.
- floats as absl::StrCat prints them (6 significant digits, `%g`), or with 9 (float) / 17
  (double) when 6 do not round-trip; whole numbers get `.0`; NaN, Infinity, -Infinity.
- strings escaped as rapidjson does (only `"`, `\\` and control characters; other bytes,
  invalid UTF-8 included, pass through).
- status / metadata: 1-space indentation, fields in declaration order with defaults,
  int64 as strings, enums by name, a trailing newline.
"""
import base64
import codecs
import math
import re

import numpy as np
import tensorflow as tf
from google.protobuf import descriptor

from slimserve.serving.core import errors
from slimserve.serving.core import tensors

INDENT = 4  # rapidjson PrettyWriter's default
_ESCAPE = re.compile(r'[\x00-\x1f"\\]')
_SHORT = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"',
          "\\": "\\\\"}


def _raw_surrogates(error):
    """Encoding error handler: a surrogate U+DC80..U+DCFF stands for a request byte that
    was not UTF-8 (json_reader reads bodies with surrogateescape) and is that byte again;
    any other surrogate came from a `\\u` escape and is written as rapidjson writes a
    lone surrogate, its three UTF-8-style bytes."""
    out = bytearray()
    for char in error.object[error.start:error.end]:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(code - 0xDC00)
        elif 0xD800 <= code <= 0xDFFF:
            out += bytes((0xE0 | code >> 12, 0x80 | (code >> 6) & 0x3F, 0x80 | code & 0x3F))
        else:
            raise error
    return bytes(out), error.end


codecs.register_error("slimserve.raw_surrogates", _raw_surrogates)


def to_bytes(text):
    """A str read from a request (or written from bytes) -> the bytes it stands for."""
    return text.encode("utf-8", "slimserve.raw_surrogates")


def _escape_char(match):
    char = match.group(0)
    return _SHORT.get(char) or "\\u%04X" % ord(char)


def string(value):
    """A JSON string as rapidjson's Writer writes it. `value`: bytes (written as they are,
    valid UTF-8 or not) or str."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    return '"' + _ESCAPE.sub(_escape_char, value) + '"'


_WHOLE = re.compile("(?:^|(?<=\0))(-?[0-9]+)(?=\0)")  # "3" -> "3.0"
_NON_FINITE = re.compile("(?:^|(?<=\0))-?(?:nan|inf)(?=\0)")
_NON_FINITE_TEXT = {"nan": "NaN", "-nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def decimals(flat):
    """[JSON number text] of a float32 / float64 array, as json_tensor.cc's WriteDecimal:
    `%g`, or `%.9g` / `%.17g` when six digits do not read back as the value; `.0` after
    whole numbers; NaN / Infinity / -Infinity. Formatted, checked and fixed up over the
    whole array at once (C loops), not value by value."""
    flat = np.asarray(flat).ravel()
    count = flat.size
    if not count:
        return []
    values = flat.tolist()
    text = "%g\0" * count % tuple(values)
    finite = np.isfinite(flat)
    with np.errstate(all="ignore"):
        back = np.array(text.split("\0")[:-1], dtype=np.float64).astype(flat.dtype,
                                                                        copy=False)
    wrong = np.flatnonzero(finite & (back != flat))
    if wrong.size:
        tokens = text.split("\0")
        wide = ("%.9g\0" if flat.dtype == np.float32 else "%.17g\0") * wrong.size % tuple(
            flat[wrong].tolist())
        for index, token in zip(wrong.tolist(), wide.split("\0")):
            tokens[index] = token
        text = "\0".join(tokens)
    text = _WHOLE.sub("\\1.0", text)
    if not finite.all():
        text = _NON_FINITE.sub(lambda m: _NON_FINITE_TEXT[m.group(0)], text)
    return text.split("\0")[:-1]


def decimal(value, dtype=np.float32):
    return decimals(np.array([value], dtype))[0]


def _tokens(array, bytes_name, depth):
    """JSON texts of every element of `array` (C order) for a value written when `depth`
    levels are open (a {"b64": ...} object's line breaks depend on it)."""
    dtype = tensors.array_dtype(array)
    flat = array.ravel()
    if dtype in (tf.float32, tf.float64):
        return decimals(flat)
    if dtype in (tf.int32, tf.int16, tf.int8, tf.uint8, tf.int64, tf.uint32, tf.uint64):
        return ("%d\0" * flat.size % tuple(flat.tolist())).split("\0")[:-1] if flat.size \
            else []
    if dtype == tf.bool:
        return ["true" if v else "false" for v in flat.tolist()]
    if dtype == tf.string:
        items = [v if isinstance(v, bytes) else to_bytes(str(v)) for v in flat.tolist()]
        if not bytes_name:
            return [string(v) for v in items]
        inner, outer = " " * (INDENT * (depth + 1)), " " * (INDENT * depth)
        return ['{\n%s"b64": "%s"\n%s}' % (inner, base64.b64encode(v).decode("ascii"), outer)
                for v in items]
    raise errors.invalid("Failed to write JSON value for tensor type: %s",
                         tensors.type_string(dtype))


def _join(items, depth, single_line):
    """An array whose elements' texts are `items`, opened with `depth` levels already open
    (so its elements sit at depth + 1), in rapidjson's layout."""
    if not items:
        return "[]"
    if single_line:
        return "[" + ", ".join(items) + "]"
    inner = "\n" + " " * (INDENT * (depth + 1))
    return "[" + inner + ("," + inner).join(items) + "\n" + " " * (INDENT * depth) + "]"


def tensor(array, name, depth, single_line, start_dim=0):
    """AddTensorValues: `array` from dimension `start_dim` on, written with `depth` levels
    open; a rank below start_dim + 1 is one bare value. -> [text per index of the
    dimensions before start_dim] (one text when start_dim is 0)."""
    shape = array.shape
    bytes_name = name.endswith("_bytes") and tensors.array_dtype(array) == tf.string
    leading = int(np.prod(shape[:start_dim])) if start_dim else 1
    rank = len(shape) - start_dim
    tokens = _tokens(array, bytes_name, depth + rank)
    if rank <= 0:
        return tokens if start_dim else tokens[:1]
    level = tokens
    for dim in range(len(shape) - 1, start_dim - 1, -1):
        size = shape[dim]
        groups = len(level) // size if size else int(np.prod(shape[:dim]))
        open_levels = depth + (dim - start_dim)
        level = [_join(level[i * size:(i + 1) * size], open_levels, single_line)
                 for i in range(groups)]
    return level if start_dim else level[:leading]


def _object_member(depth, first):
    return ("\n" if first else ",\n") + " " * (INDENT * depth)


def predictions(outputs, row_format):
    """MakeJsonFromTensors: {alias: ndarray} -> the body's text. Several outputs are
    written in sorted alias order (TF Serving's map has no defined order)."""
    keys = sorted(outputs)
    if not keys:
        raise errors.invalid("Cannot convert empty tensor map to JSON")
    if not row_format:
        if len(keys) == 1:
            value = tensor(outputs[keys[0]], keys[0], 1, False)[0]
        else:
            value = "{" + "".join(
                _object_member(2, i == 0) + string(k) + ": " +
                tensor(outputs[k], k, 2, False)[0] for i, k in enumerate(keys)) + \
                "\n" + " " * INDENT + "}"
        return '{\n    "outputs": ' + value + "\n}"
    batch = -1
    for key in keys:
        if outputs[key].ndim == 0:
            raise errors.invalid("Tensor name: %s has no shape information ", key)
        rows = outputs[key].shape[0]
        if batch >= 0 and rows != batch:
            raise errors.invalid("Tensor name: %s has inconsistent batch size: %d expecting: "
                                 "%d", key, rows, batch)
        batch = rows
    if len(keys) == 1:
        items = tensor(outputs[keys[0]], keys[0], 2, True, start_dim=1)
        body = ", ".join(items)
    else:
        columns = {k: tensor(outputs[k], k, 3, True, start_dim=1) for k in keys}
        body = ",".join(
            "\n        {" + "".join(_object_member(3, j == 0) + string(k) + ": " + columns[k][i]
                                    for j, k in enumerate(keys)) + "\n        }"
            for i in range(batch))
    return '{\n    "predictions": [' + body + ("\n    ]" if batch else "]") + "\n}"


def classifications(rows):
    """MakeJsonFromClassificationResult: rows = [[(label bytes or str, score)]]."""
    if not rows:
        raise errors.invalid("Cannot convert empty ClassificationResults to JSON")
    items = []
    for classes in rows:
        items.append("[" + ", ".join("[%s, %s]" % (string(label), decimal(score))
                                     for label, score in classes) + "]")
    return '{\n    "results": [' + ", ".join(items) + "\n    ]\n}"


def regressions(values):
    """MakeJsonFromRegressionResult."""
    values = np.asarray(values, np.float32).reshape(-1)
    if not values.size:
        raise errors.invalid("Cannot convert empty RegressionResults to JSON")
    return '{\n    "results": [' + ", ".join(decimals(values)) + "]\n}"


def error(message):
    """MakeJsonFromStatus."""
    return '{\n    "error": ' + string(message) + "\n}"


# --- any JSON value (TF Serving quotes the request's values in its error messages) ----

def _dtoa(number):
    """rapidjson's Writer::Double: the shortest round-trip digits (Python's repr finds the
    same ones), laid out by its Prettify: 1e21 -> 1e21, 1234e-2 -> 12.34, 1e-7 -> 1e-7."""
    if not math.isfinite(number):
        return "NaN" if math.isnan(number) else ("-Infinity" if number < 0 else "Infinity")
    sign = "-" if math.copysign(1.0, number) < 0 else ""
    digits, exponent = _digits(abs(number))
    length, point = len(digits), len(digits) + exponent  # value = 0.digits * 10^point
    if 0 <= exponent and point <= 21:
        text = digits + "0" * exponent + ".0"
    elif 0 < point <= 21:
        text = digits[:point] + "." + digits[point:]
    elif -6 < point <= 0:
        text = "0." + "0" * -point + digits
    elif length == 1:
        text = digits + "e" + str(point - 1)
    else:
        text = digits[0] + "." + digits[1:] + "e" + str(point - 1)
    return sign + text


def _digits(number):
    """(shortest significant digits, exponent) with number == int(digits) * 10**exponent."""
    if number == 0:
        return "0", 0
    mantissa, _, exp = repr(number).partition("e")
    whole, _, fraction = mantissa.partition(".")
    fraction = fraction.rstrip("0")
    digits = (whole + fraction).lstrip("0") or "0"
    exponent = (int(exp) if exp else 0) - len(fraction)
    stripped = digits.rstrip("0")
    return stripped, exponent + len(digits) - len(stripped)


def value(item, depth=0, top=True):
    """JsonValueToString: a parsed JSON value written by PrettyWriter. A top-level number
    holding a float-range double is written as WriteDecimal writes a float; numbers
    inside arrays and objects by rapidjson's own dtoa."""
    if isinstance(item, bool):
        return "true" if item else "false"
    if item is None:
        return "null"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, float):
        if top and (abs(item) <= 3.4028234e38 or not math.isfinite(item)):
            return decimal(item, np.float32)
        if top:
            return decimal(item, np.float64)
        return _dtoa(item)
    if isinstance(item, str):
        return string(item)
    if isinstance(item, list):
        return _join([value(v, depth + 1, False) for v in item], depth, False)
    if isinstance(item, dict):
        if not item:
            return "{}"
        return "{" + "".join(_object_member(depth + 1, i == 0) + string(k) + ": " +
                             value(v, depth + 1, False) for i, (k, v) in
                             enumerate(item.items())) + "\n" + " " * (INDENT * depth) + "}"
    return string(str(item))


# --- protobuf's C++ JSON printer ------------------------------------------------------

_PROTO_ESCAPE = re.compile("[\x00-\x1f\"\\\\<>\x7f-\x9f\u00ad\u0600-\u0603\u06dd\u070f"
                           "\u17b4\u17b5\u200b-\u200f\u2028-\u202e\u2060-\u2064"
                           "\u206a-\u206f\ufeff\ufff9-\ufffb]")
_PROTO_SHORT = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r",
                '"': '\\"', "\\": "\\\\"}
_WRAPPERS = {"google.protobuf.Int64Value", "google.protobuf.UInt64Value",
             "google.protobuf.Int32Value", "google.protobuf.UInt32Value",
             "google.protobuf.BoolValue", "google.protobuf.StringValue",
             "google.protobuf.BytesValue", "google.protobuf.FloatValue",
             "google.protobuf.DoubleValue"}
_FD = descriptor.FieldDescriptor


def _proto_string(text):
    """JsonEscaping::Escape: as JSON, plus < > and invisible / separator code points."""
    return '"' + _PROTO_ESCAPE.sub(
        lambda m: _PROTO_SHORT.get(m.group(0)) or "\\u%04x" % ord(m.group(0)), text) + '"'


def _proto_float(number, double):
    if math.isnan(number):
        return '"NaN"'
    if math.isinf(number):
        return '"Infinity"' if number > 0 else '"-Infinity"'
    short = "%.15g" % number if double else "%.6g" % number
    cast = float(short) if double else float(np.float32(float(short)))
    if cast != (number if double else float(np.float32(number))):
        short = "%.17g" % number if double else "%.9g" % number
    return short


def _proto_scalar(field, item):
    kind = field.type
    if kind == _FD.TYPE_ENUM:
        enum = field.enum_type.values_by_number.get(item)
        return _proto_string(enum.name) if enum else str(item)
    if kind in (_FD.TYPE_INT64, _FD.TYPE_SINT64, _FD.TYPE_SFIXED64, _FD.TYPE_UINT64,
                _FD.TYPE_FIXED64):
        return '"%d"' % item
    if kind == _FD.TYPE_BOOL:
        return "true" if item else "false"
    if kind in (_FD.TYPE_FLOAT, _FD.TYPE_DOUBLE):
        return _proto_float(item, kind == _FD.TYPE_DOUBLE)
    if kind == _FD.TYPE_STRING:
        return _proto_string(item)
    if kind == _FD.TYPE_BYTES:
        return '"%s"' % base64.b64encode(item).decode("ascii")
    return str(item)


def _proto_members(members, depth, opening="{", closing="}"):
    if not members:
        return opening + closing
    pad = "\n" + " " * (depth + 1)
    return opening + pad + ("," + pad).join(members) + "\n" + " " * depth + closing


def _proto_value(field, item, depth):
    if field.type == _FD.TYPE_MESSAGE:
        return _proto_message(item, depth)
    return _proto_scalar(field, item)


def _proto_message(message, depth):
    """One message: its fields in declaration order, every primitive, repeated and map
    field (defaults too), set sub-messages, then the set oneof members."""
    full_name = message.DESCRIPTOR.full_name
    if full_name in _WRAPPERS:
        return _proto_scalar(message.DESCRIPTOR.fields_by_name["value"], message.value)
    members, oneofs = [], []
    set_fields = {f.name for f, _ in message.ListFields()}
    for field in message.DESCRIPTOR.fields:
        name = field.name
        if field.containing_oneof is not None:
            if name in set_fields:
                oneofs.append(field)
            continue
        item = getattr(message, name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            key_field = field.message_type.fields_by_name["key"]
            entries = [_proto_string(str(key) if key_field.type != _FD.TYPE_BOOL else
                                     ("true" if key else "false")) + ": " +
                       _proto_value(value_field, item[key], depth + 2)
                       for key in sorted(item)]
            text = _proto_members(entries, depth + 1)
        elif field.label == _FD.LABEL_REPEATED:
            text = _proto_members([_proto_value(field, v, depth + 2) for v in item],
                                  depth + 1, "[", "]")
        elif field.type == _FD.TYPE_MESSAGE:
            if name not in set_fields:
                continue
            text = _proto_message(item, depth + 1)
        else:
            text = _proto_scalar(field, item)
        members.append('"%s": %s' % (name, text))
    for field in oneofs:
        members.append('"%s": %s' % (field.name, _proto_value(
            field, getattr(message, field.name), depth + 1)))
    return _proto_members(members, depth)


def proto(message):
    """MessageToJsonString(add_whitespace, always_print_primitive_fields,
    preserve_proto_field_names): the text TF Serving's ToJsonString writes."""
    return _proto_message(message, 0) + "\n"


def metadata(model_spec, signature_def_map):
    """ToJsonString(GetModelMetadataResponse): two printed messages joined as TF Serving
    joins them (http_rest_api_util.cc)."""
    return ('{\n"model_spec":' + proto(model_spec) + ',\n"metadata": {"signature_def": ' +
            proto(signature_def_map) + "}\n}\n")
