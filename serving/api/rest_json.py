"""TF Serving's REST JSON <-> requests and responses, read as util/json_tensor.cc reads them
(tag 2.15.1) and written byte for byte as it writes them (json_writer.py).

Reading follows FillPredictRequestFromJson / FillClassifyRegressRequestFromJson: a tensor's
shape is the JSON's (first elements down), every value must be the JSON kind its dtype
takes (numbers for floats, integers in range for integers, which then narrow as TF's
static_cast does, strings or {"b64": ...} for strings), and the statuses and messages are
TF Serving's. The signature's shapes are not consulted: the graph decides, as there.
Transport-free: rest_api.py calls these with the body bytes.
"""
import base64
import binascii

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import get_model_status_pb2

from slimserve.serving.api import json_reader
from slimserve.serving.api import json_writer
from slimserve.serving.core import errors
from slimserve.serving.core import tensors

_INT32 = (-2 ** 31, 2 ** 31 - 1)
_RANGES = {  # rapidjson's IsInt / IsInt64 / IsUint / IsUint64 per dtype
    tf.int32: _INT32, tf.int16: _INT32, tf.int8: _INT32, tf.uint8: _INT32,
    tf.int64: (-2 ** 63, 2 ** 63 - 1), tf.uint32: (0, 2 ** 32 - 1),
    tf.uint64: (0, 2 ** 64 - 1),
}
_FLOATS = (tf.float32, tf.float64)
# TF Serving quotes request values in its messages whole; here at most this many
# characters of each (an error answer stays small whatever the request).
MAX_QUOTED = 1024


def quoted(item):
    """JsonValueToString of a request value, cut at MAX_QUOTED characters."""
    text = json_writer.value(item)
    return text if len(text) <= MAX_QUOTED else text[:MAX_QUOTED] + "..."


def _json_type(item):
    """JsonTypeString."""
    if item is None:
        return "Null"
    if isinstance(item, bool):
        return "True" if item else "False"
    if isinstance(item, dict):
        return "Object"
    if isinstance(item, list):
        return "Array"
    if isinstance(item, str):
        return "String"
    return "Number"


def _status(error):
    """tensorflow::Status::ToString() of an INVALID_ARGUMENT ServingError."""
    return "%s: %s" % (error.code.name, error.message)


def _first_wins(pairs):
    """An object's members as rapidjson's FindMember sees them: the first of a repeated
    name (Python's json would keep the last)."""
    obj = {}
    for key, item in pairs:
        obj.setdefault(key, item)
    return obj


class Body(dict):
    """A request's top-level JSON object, with the text it came from (`text`): a double
    tensor is read again from it with rapidjson's own arithmetic (json_reader)."""
    text = ""


def parse_body(raw, exact=False):
    """Body bytes -> the top-level JSON object (ParseJson); failures INVALID_ARGUMENT
    with rapidjson's messages (json_reader.py)."""
    if not raw:
        raise errors.invalid("JSON Parse error: The document is empty")
    try:
        body = json_reader.parse(raw, object_pairs_hook=_first_wins, exact=exact)
    except RecursionError:
        raise errors.invalid("JSON Parse error: nested too deeply") from None
    except json_reader.JsonError as error:
        raise errors.invalid("%s", error) from None
    if not isinstance(body, dict):
        raise errors.invalid("JSON Value: %s Is not object", quoted(body))
    body = Body(body)
    body.text = raw
    return body


def signature_name(body, default):
    """FillSignature: the optional "signature_name"; not a string is INVALID_ARGUMENT."""
    if "signature_name" not in body:
        return default
    name = body["signature_name"]
    if not isinstance(name, str):
        raise errors.invalid("JSON Value: %s not formatted correctly. 'signature_name' key "
                             "must be a string value.", quoted(body))
    return name or default


# --- JSON -> tensors ------------------------------------------------------------------

def _dense_shape(item):
    """GetDenseTensorShape: the sizes of the first elements, down to a non-list."""
    dims = []
    while isinstance(item, list):
        dims.append(len(item))
        if not item:
            break
        item = item[0]
    return dims


def _is_b64(item):
    return isinstance(item, dict) and len(item) == 1 and isinstance(item.get("b64"), str)


def _b64(item):
    """JsonDecodeBase64Object."""
    if not _is_b64(item):
        raise errors.invalid("JSON Value: %s not formatted correctly for base64 data",
                             quoted(item))
    text = item["b64"]
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise errors.invalid("Unable to base64 decode") from None


def _type_error(item, dtype):
    return errors.invalid("JSON Value: %s Type: %s is not of expected type: %s",
                          quoted(item), _json_type(item), tensors.type_string(dtype))


def _leaf(item, dtype):
    """AddValueToTensor for one JSON value (objects: base64 strings only)."""
    if isinstance(item, dict):
        if dtype == tf.string:
            return _b64(item)
        raise _type_error(item, dtype)
    if dtype in _FLOATS:
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            return item
        raise _type_error(item, dtype)
    if dtype in _RANGES:
        low, high = _RANGES[dtype]
        if isinstance(item, int) and not isinstance(item, bool) and low <= item <= high:
            return item
        raise _type_error(item, dtype)
    if dtype == tf.string:
        if isinstance(item, str):
            return json_writer.to_bytes(item)
        raise _type_error(item, dtype)
    if dtype == tf.bool:
        if isinstance(item, bool):
            return item
        raise _type_error(item, dtype)
    raise errors.ServingError(grpc.StatusCode.UNIMPLEMENTED, "Conversion of JSON Value: %s "
                              "to type: %s" % (quoted(item), tensors.type_string(dtype)))


def _walk(item, dims, dtype):
    """FillTensorProto, depth first as TF walks it: -> the leaves in order, or TF's error
    for the first value out of place."""
    rank, leaves, stack = len(dims), [], [(iter([item]), 0)]
    while stack:
        items, level = stack[-1]
        current = next(items, _walk)
        if current is _walk:
            stack.pop()
            continue
        if not isinstance(current, list):
            if level != rank:
                raise errors.invalid("JSON Value: %s found at incorrect level: %d in the JSON "
                                     "DOM. Expected at level: %d", quoted(current), level + 1,
                                     rank)
            leaves.append(_leaf(current, dtype))
            continue
        if level >= rank:
            raise errors.invalid("Encountered list at unexpected level: %d expected < %d",
                                 level, rank)
        if len(current) != dims[level]:
            raise errors.invalid("Encountered list at unexpected size: %d at level: %d "
                                 "expected size: %d", len(current), level, dims[level])
        stack.append((iter(current), level + 1))
    return leaves


def _kinds_fit(kinds, dtype):
    if dtype in _FLOATS:
        return kinds <= {int, float}
    if dtype in _RANGES:
        return kinds <= {int}
    if dtype == tf.bool:
        return kinds <= {bool}
    if dtype == tf.string:
        return kinds <= {str, dict}
    return False


def _array(key, item, dtype, max_elements):
    """One JSON value -> (ndarray of `dtype`, its shape). A fast pass (numpy over the
    nested lists) serves well-formed values; anything it does not vouch for is walked
    as TF walks it, for TF's error."""
    dims = _dense_shape(item)
    tensors.element_count(key, dims, max_elements)
    leaves = None
    if dims:
        try:
            grid = np.array(item, dtype=object)
        except ValueError:  # ragged
            grid = None
        if grid is not None and list(grid.shape) == dims:
            flat = grid.ravel()
            kinds = set(map(type, flat))
            if _kinds_fit(kinds, dtype):
                leaves = flat
                if dtype in _RANGES and flat.size:
                    low, high = _RANGES[dtype]
                    if min(flat) < low or max(flat) > high:
                        leaves = None
                elif dtype == tf.string and dict in kinds:
                    leaves = None  # b64 objects: decoded by the walk
    if leaves is None:
        leaves = _walk(item, dims, dtype)
    if len(dims) > tensors.MAX_DIMENSIONS:
        raise tensors.parsing_error(key)
    tensors.check_rank(key, dims)
    return _to_numpy(leaves, dims, dtype), dims


def _to_numpy(leaves, dims, dtype):
    if dtype == tf.string:
        flat = np.empty(len(leaves), dtype=object)
        flat[:] = [json_writer.to_bytes(v) if isinstance(v, str) else v for v in leaves]
        return flat.reshape(dims)
    if dtype in _RANGES:
        wide = np.uint64 if dtype == tf.uint64 else np.int64
        return np.array(list(leaves), dtype=wide).astype(dtype.as_numpy_dtype).reshape(dims)
    try:
        with np.errstate(over="ignore"):  # a double past float's range is inf, as in TF
            return np.array(list(leaves), dtype=dtype.as_numpy_dtype).reshape(dims)
    except OverflowError:
        raise errors.invalid("JSON Parse error: Number too big to be stored in double") \
            from None


def _instances(instances, signature_inputs, max_elements):
    """FillTensorMapFromInstancesList -> {alias: ndarray}."""
    names = sorted(signature_inputs)
    first = instances[0]
    if not isinstance(first, dict) and len(names) > 1:
        raise errors.invalid("instances is a plain list, but expecting list of objects as "
                             "multiple input tensors required as per tensorinfo_map")
    as_objects = isinstance(first, dict) and not _is_b64(first)
    columns = {}
    if not as_objects:
        for index, element in enumerate(instances):
            if isinstance(element, dict) and not _is_b64(element):
                raise errors.invalid("Expecting value/list but got object at item %d of "
                                     "input list", index)
        columns[names[0]] = instances
    else:
        for index, element in enumerate(instances):
            if not isinstance(element, dict) or _is_b64(element):
                raise errors.invalid("Expecting object but got list at item %d of input "
                                     "list", index)
            for key, item in element.items():
                if key not in signature_inputs:
                    raise errors.invalid(
                        "Failed to process element: %d key: %s of 'instances' list. Error: "
                        "%s", index, key, _status(errors.invalid(
                            "JSON object: does not have named input: %s", key)))
                columns.setdefault(key, []).append(item)
            if set(element) != set(names):
                raise errors.invalid("Failed to process element: %d of 'instances' list. "
                                     "JSON object: %s keys must be equal to: %s", index,
                                     quoted(element), ",".join(names))
    feeds, total = {}, 0
    for key, rows in columns.items():
        dtype = tensors.signature_dtype(signature_inputs[key])
        feeds[key] = _stacked(key, rows, dtype, max_elements - total, as_objects)
        total += feeds[key].size
    return feeds


def _stacked(key, rows, dtype, max_elements, as_objects):
    """The instances' values of one input batched into one tensor [rows, ...]. When they
    do not make one, the rows are read one by one as AddInstanceItem reads them (each
    row the first row's size and shape) for TF Serving's message."""
    try:
        return _array(key, rows, dtype, max_elements)[0]
    except errors.ServingError as whole:
        size = shape = None
        for index, row in enumerate(rows):
            try:
                row_dims = _dense_shape(row)
                leaves = _walk(row, row_dims, dtype)
                if size is None:
                    size, shape = len(leaves), row_dims
                elif len(leaves) != size:
                    raise errors.invalid("Expecting tensor size: %d but got: %d", size,
                                         len(leaves))
                elif row_dims != shape:
                    raise errors.invalid("Expecting shape %s but got: %s", _shape(shape),
                                         _shape(row_dims))
            except errors.ServingError as error:
                raise errors.invalid(
                    "Failed to process element: %d %sof 'instances' list. Error: %s", index,
                    "key: %s " % key if as_objects else "", _status(error)) from None
        raise whole from None


def _shape(dims):
    return "[" + ",".join(str(d) for d in dims) + "]"


def _inputs(inputs, signature_inputs, max_elements):
    """FillTensorMapFromInputsMap -> {alias: ndarray}."""
    names = sorted(signature_inputs)
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(names) > 1:
            raise errors.invalid("inputs is a plain value/list, but expecting an object as "
                                 "multiple input tensors required as per tensorinfo_map")
        columns = {names[0]: inputs}
    else:
        columns = {}
        for name in names:
            if name not in inputs:
                raise errors.invalid("Missing named input: %s in 'inputs' object.", name)
            columns[name] = inputs[name]  # other members are ignored, as in TF Serving
    feeds, total = {}, 0
    for key in names:
        feeds[key] = _array(key, columns[key], tensors.signature_dtype(signature_inputs[key]),
                            max_elements - total)[0]
        total += feeds[key].size
    return feeds


def predict_feeds(body, sig, signature_name_given="",
                  max_elements=tensors.DEFAULT_MAX_REQUEST_ELEMENTS):
    """FillPredictRequestFromJson: a :predict body against a SignatureDef -> (feeds
    {alias: ndarray}, row_format). Elements past max_elements are refused before the
    arrays are built."""
    if not sig.inputs:
        raise errors.invalid("Failed to get input map for signature: %s",
                             signature_name_given or "DEFAULT")
    if isinstance(body, Body) and body.text and any(
            info.dtype == tf.float64.as_datatype_enum for info in sig.inputs.values()) and \
            json_reader.needs_exact(body.text):
        body = parse_body(body.text, exact=True)  # doubles as rapidjson computes them
    if "instances" in body:
        if "inputs" in body:
            raise errors.invalid("JSON Value: %s Not formatted correctly expecting only one "
                                 "of 'inputs' or 'instances' keys to exist ", quoted(body))
        instances = body["instances"]
        if not isinstance(instances, list):
            raise errors.invalid("JSON Value: %s Expecting 'instances' to be an list/array",
                                 quoted(body))
        if not instances:
            raise errors.invalid("JSON Value: %s No values in 'instances' array",
                                 quoted(body))
        return _instances(instances, sig.inputs, max_elements), True
    if "inputs" in body:
        return _inputs(body["inputs"], sig.inputs, max_elements), False
    raise errors.invalid("Missing 'inputs' or 'instances' key")


def predict_response(outputs, row_format):
    """MakeJsonFromTensors -> body bytes."""
    return json_writer.to_bytes(json_writer.predictions(outputs, row_format))


# --- classify / regress ---------------------------------------------------------------

def _feature_error(name, feature):
    kind = feature.WhichOneof("kind")
    return errors.invalid("Unexpected element type in feature: %s expecting type: %s", name,
                          {"bytes_list": "bytes", "float_list": "float",
                           "int64_list": "int64"}.get(kind, "UNKNOWN"))


def _add_to_feature(item, name, feature):
    """AddValueToFeature: a value's JSON kind picks the list (a list keeps one kind)."""
    kind = feature.WhichOneof("kind")
    if item is None or isinstance(item, list) or (isinstance(item, dict)
                                                   and not _is_b64(item)):
        raise errors.invalid("Feature: %s has element with unexpected JSON type: %s", name,
                             _json_type(item))
    if isinstance(item, bool) or (isinstance(item, int) and -2 ** 63 <= item < 2 ** 64):
        if kind not in (None, "int64_list"):
            raise _feature_error(name, feature)
        if not isinstance(item, bool) and item >= 2 ** 63:
            raise errors.invalid("Feature: %s has uint64_t element. Only int64_t is "
                                 "supported.", name)
        feature.int64_list.value.append(int(item))
    elif isinstance(item, (int, float)):
        if kind not in (None, "float_list"):
            raise _feature_error(name, feature)
        feature.float_list.value.append(float(item))
    else:
        if kind not in (None, "bytes_list"):
            raise _feature_error(name, feature)
        feature.bytes_list.value.append(_b64(item) if isinstance(item, dict)
                                        else json_writer.to_bytes(item))


def _example(item, example):
    """MakeExampleFromJsonObject."""
    if not isinstance(item, dict):
        raise errors.invalid("Example must be JSON object but got JSON %s", _json_type(item))
    for name, content in item.items():
        feature = tf.train.Feature()
        for element in content if isinstance(content, list) else [content]:
            _add_to_feature(element, name, feature)
        example.features.feature[name].CopyFrom(feature)
    return example


def serialized_examples(body):
    """FillClassifyRegressRequestFromJson -> serialized tf.Examples, the context merged
    into each as TF Serving's ExampleListWithContext input does."""
    context = None
    if "context" in body:
        context = _example(body["context"], tf.train.Example())
    if "examples" not in body:
        raise errors.invalid("JSON Value: %s When method is classify, key 'examples' is "
                             "expected and was not found", quoted(body))
    examples = body["examples"]
    if not isinstance(examples, list):
        raise errors.invalid("JSON Value: %s Expecting 'examples' value to be an list/array",
                             quoted(body))
    if not examples:
        raise errors.invalid("JSON Value: %s 'examples' value is an empty array",
                             quoted(body))
    prefix = context.SerializeToString() if context is not None else b""
    return [prefix + _example(item, tf.train.Example()).SerializeToString()
            for item in examples]


def classify_response(classes, scores):
    """MakeJsonFromClassificationResult over the signature's outputs: a missing `classes`
    output leaves every label "" and a missing `scores` every score 0, as the gRPC
    ClassificationResult (protos.fill_classifications) does."""
    present = classes if classes is not None else scores
    rows = []
    for row in range(present.shape[0]):
        rows.append([(classes[row][c] if classes is not None else b"",
                      float(scores[row][c]) if scores is not None else 0.0)
                     for c in range(present.shape[1])])
    return json_writer.to_bytes(json_writer.classifications(rows))


def regress_response(values):
    return json_writer.regressions(values).encode("utf-8")


# --- status and metadata --------------------------------------------------------------

def metadata_response(name, version, signature_defs):
    """GetModelMetadata over REST, laid out as TF Serving's ToJsonString writes it."""
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    response.model_spec.name = name
    response.model_spec.version.value = version
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    for key, value in signature_defs.items():
        signature_map.signature_def[key].CopyFrom(value)
    return json_writer.metadata(response.model_spec, signature_map).encode("utf-8")


def status_response(statuses):
    """[(version, state name, error message, error code)] -> GetModelStatusResponse as
    TF Serving's ToJsonString writes it."""
    response = get_model_status_pb2.GetModelStatusResponse()
    for version, state, message, code in statuses:
        entry = response.model_version_status.add()
        entry.version = version
        entry.state = get_model_status_pb2.ModelVersionStatus.State.Value(state)
        entry.status.SetInParent()  # TF Serving always prints it, {"error_code": "OK", ...}
        if message or code:
            entry.status.error_code = code
            entry.status.error_message = message
    return json_writer.proto(response).encode("utf-8")
