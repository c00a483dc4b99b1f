"""TF Serving's REST JSON <-> requests and responses, checked as util/json_tensor.cc checks
them: the body must be an object, `signature_name` a string, and every value of the JSON
type its tensor's dtype calls for (no silent coercion of "1.5", true or 1.5 into a number
of another kind). Transport-free: rest_api.py calls these with the body bytes."""
import base64
import json

import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import get_model_status_pb2

from slimserve.serving.core import errors
from slimserve.serving.core import tensors

_NUMBER = (int, float)
_FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
_INT_DTYPES = (tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32,
               tf.uint64)


def _describe(value, limit=80):
    text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def parse_body(raw):
    """Body bytes -> the top-level JSON object; any failure is INVALID_ARGUMENT."""
    if not raw:
        raise errors.invalid("JSON Parse error: The document is empty")
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise errors.invalid("JSON Parse error: body is not UTF-8 (%s)", error) from None
    except RecursionError:
        raise errors.invalid("JSON Parse error: nested too deeply") from None
    except ValueError as error:
        raise errors.invalid("JSON Parse error: %s", error) from None
    if not isinstance(body, dict):
        raise errors.invalid("JSON Value: %s Is not object", _describe(body))
    return body


def signature_name(body, default):
    """The optional "signature_name"; anything but a string is INVALID_ARGUMENT."""
    if "signature_name" not in body:
        return default
    name = body["signature_name"]
    if not isinstance(name, str):
        raise errors.invalid("JSON Value: %s not formatted correctly. 'signature_name' key "
                             "must be a string value.", _describe(name))
    return name or default


def _check_types(key, value, dtype):
    """Raises INVALID_ARGUMENT unless every leaf of `value` is a JSON value of `dtype`'s kind.

    One C-speed pass (object array + set of leaf types) rather than a Python walk, so a
    large float image costs milliseconds."""
    if dtype == tf.string:
        return  # tensors.from_json accepts only strings and {"b64": ...} objects
    try:
        leaves = np.array(value, dtype=object)
    except (ValueError, TypeError) as error:
        raise errors.invalid("input %r is not a rectangular array: %s", key, error) from None
    kinds = set(map(type, leaves.ravel()))
    if list in kinds or dict in kinds:
        raise errors.invalid("input %r is not a rectangular array of %s values (ragged rows "
                             "or objects inside)", key, dtype.name)
    if dtype == tf.bool:
        allowed = {bool}
    elif dtype in _FLOAT_DTYPES:
        allowed = {int, float}
    elif dtype in _INT_DTYPES:
        allowed = {int}
    else:
        raise errors.invalid("input %r has dtype %s, which the REST API cannot fill from "
                             "JSON", key, dtype.name)
    wrong = kinds - allowed
    if wrong:
        bad = next(v for v in leaves.ravel() if type(v) in wrong)  # pylint: disable=unidiomatic-typecheck
        raise errors.invalid("JSON Value: %s Type: %s is not of expected type: %s (input %r)",
                             _describe(bad), _json_type(bad), dtype.name, key)
    if dtype in _INT_DTYPES and leaves.size:
        low, high = int(min(leaves.ravel())), int(max(leaves.ravel()))
        if low < dtype.min or high > dtype.max:
            out = low if low < dtype.min else high
            raise errors.invalid("JSON Value: %d is out of range for %s (input %r)", out,
                                 dtype.name, key)


def _json_type(value):
    if isinstance(value, bool):
        return "Bool"
    if isinstance(value, str):
        return "String"
    if isinstance(value, float):
        return "Double"
    if isinstance(value, int):
        return "Int"
    return type(value).__name__


def _to_array(key, value, tensor_info):
    _check_types(key, value, tensors.signature_dtype(tensor_info))
    return tensors.from_json(key, value, tensor_info)


def _instances_to_feeds(instances, signature_inputs):
    keys = sorted(signature_inputs)
    if not isinstance(instances, list) or not instances:
        raise errors.invalid("\"instances\" must be a non-empty list")
    if all(isinstance(row, dict) and "b64" not in row for row in instances):
        columns = {k: [] for k in keys}
        for index, row in enumerate(instances):
            if set(row) != set(keys):
                raise errors.invalid("instance %d has keys %s; signature expects %s", index,
                                     sorted(row), keys)
            for key in keys:
                columns[key].append(row[key])
    elif any(isinstance(row, dict) and "b64" not in row for row in instances):
        raise errors.invalid("\"instances\" mixes objects and plain values")
    elif len(keys) == 1:
        columns = {keys[0]: instances}
    else:
        raise errors.invalid("signature takes several inputs %s: each instance must be an "
                             "object with those keys", keys)
    return {k: _to_array(k, v, signature_inputs[k]) for k, v in columns.items()}


def _inputs_to_feeds(inputs, signature_inputs):
    keys = sorted(signature_inputs)
    if isinstance(inputs, dict) and "b64" not in inputs:
        columns = inputs
    elif len(keys) == 1:
        columns = {keys[0]: inputs}
    else:
        raise errors.invalid("\"inputs\" must be an object with keys %s", keys)
    if set(columns) != set(keys):
        raise errors.invalid("\"inputs\" has keys %s; signature expects %s", sorted(columns),
                             keys)
    return {k: _to_array(k, v, signature_inputs[k]) for k, v in columns.items()}


def predict_feeds(body, signature_inputs):
    """-> (feeds {key: ndarray}, row_format) for a :predict body against a signature's
    inputs map (its TensorInfos)."""
    if ("instances" in body) == ("inputs" in body):
        raise errors.invalid("request must have exactly one of \"instances\" (row format) "
                             "or \"inputs\" (columnar format)")
    try:
        if "instances" in body:
            return _instances_to_feeds(body["instances"], signature_inputs), True
        return _inputs_to_feeds(body["inputs"], signature_inputs), False
    except RecursionError:
        raise errors.invalid("input values are nested too deeply") from None


def predict_response(outputs, row_format):
    columns = {k: tensors.to_json(k, v) for k, v in outputs.items()}
    keys = sorted(columns)
    if not keys:
        raise errors.invalid("Cannot convert empty tensor map to JSON")
    if row_format:
        if len(keys) == 1:
            return {"predictions": columns[keys[0]]}
        rows = {len(outputs[k]) if outputs[k].ndim else 0 for k in keys}
        if len(rows) != 1:
            raise errors.invalid("outputs %s have different batch sizes %s; ask for the "
                                 "columnar format (\"inputs\") instead", keys, sorted(rows))
        count = rows.pop()
        return {"predictions": [{k: columns[k][i] for k in keys} for i in range(count)]}
    return {"outputs": columns[keys[0]] if len(keys) == 1 else columns}


def _feature(key, value):
    values = value if isinstance(value, list) else [value]
    if not values:
        raise errors.invalid("example feature %r is an empty list", key)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        if any(not -2 ** 63 <= v < 2 ** 63 for v in values):
            raise errors.invalid("example feature %r: integer out of int64 range", key)
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    if all(isinstance(v, _NUMBER) and not isinstance(v, bool) for v in values):
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))
    out = []
    for v in values:
        if isinstance(v, dict) and set(v) == {"b64"} and isinstance(v["b64"], str):
            try:
                out.append(base64.b64decode(v["b64"], validate=True))
            except ValueError:
                raise errors.invalid("example feature %r: invalid base64", key) from None
        elif isinstance(v, str):
            out.append(v.encode("utf-8"))
        else:
            raise errors.invalid("example feature %r has an unsupported value %s (numbers, "
                                 "strings or {\"b64\": ...}, all of one kind)", key,
                                 _describe(v))
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=out))


def _example(index, value, context):
    if not isinstance(value, dict):
        raise errors.invalid("Example must be JSON object but got JSON %s (example %s)",
                             _json_type(value), index)
    merged = dict(context, **value)
    features = {k: _feature(k, v) for k, v in merged.items()}
    return tf.train.Example(features=tf.train.Features(feature=features))


def serialized_examples(body, method):
    """A :classify / :regress body -> serialized tf.Examples (context merged in)."""
    examples = body.get("examples")
    if examples is None:
        raise errors.invalid("When method is %s, key 'examples' is expected and was not "
                             "found", method)
    if not isinstance(examples, list):
        raise errors.invalid("Expecting 'examples' value to be an list/array")
    if not examples:
        raise errors.invalid("'examples' value is an empty array")
    context = body.get("context", {})
    if not isinstance(context, dict):
        raise errors.invalid("\"context\" must be an object of features")
    _example("context", context, {})  # checked once, merged into each example below
    return [_example(i, e, context).SerializeToString() for i, e in enumerate(examples)]


def classify_response(classes, scores):
    results = []
    for row in range(len(scores)):
        results.append([[classes[row][c].decode("utf-8", "replace")
                         if classes is not None else str(c), float(scores[row][c])]
                        for c in range(scores.shape[1])])
    return {"results": results}


def regress_response(values):
    return {"results": [float(v) for v in np.asarray(values).reshape(-1)]}


def _print(message, **kwargs):
    """Proto -> dict as TF Serving prints it: every primitive field, even at its default."""
    return json_format.MessageToDict(message, including_default_value_fields=True, **kwargs)


def metadata_response(name, version, signature_defs):
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    response.model_spec.name = name
    response.model_spec.version.value = version
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    for key, value in signature_defs.items():
        signature_map.signature_def[key].CopyFrom(value)
    return {"model_spec": _print(response.model_spec, preserving_proto_field_name=True),
            "metadata": {"signature_def": _print(signature_map,
                                                 preserving_proto_field_name=True)}}


def status_response(statuses):
    """[(version, state name, error message)] -> GetModelStatusResponse as JSON."""
    response = get_model_status_pb2.GetModelStatusResponse()
    for version, state, message in statuses:
        entry = response.model_version_status.add()
        entry.version = version
        entry.state = get_model_status_pb2.ModelVersionStatus.State.Value(state)
        entry.status.SetInParent()  # TF Serving always prints it, {"error_code": "OK", ...}
        if message:
            entry.status.error_code = 2  # UNKNOWN: the load failure's own code is not kept
            entry.status.error_message = message
    return _print(response)
