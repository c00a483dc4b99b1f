"""REST JSON <-> tensors as TF Serving 2.15.1's util/json_tensor.cc reads and writes them:
every wire-observable expectation of its json_tensor_test.cc, plus a round trip of every
dtype the codec handles at its limits, ranks 0 to 32, base64, and the errors, through
slimserve's REST routes and gRPC servicers in process.

The identity model (slimserve/testing/identity_models.py) hands each input back, so what
the server read from JSON is what it writes: a REST answer shows the tensor TF Serving's
FillPredictRequestFromJson builds, and the same TensorProto sent over gRPC comes back
byte for byte as Tensor::AsProtoField writes it. Values are compared as the C++ tests
compare them: parsed JSON, or every number as its text where formatting matters."""
import base64
import json
import math

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.framework import tensor_pb2
from tensorflow_serving.apis import predict_pb2

from slimserve.serving.config.model_config import ServedModel
from slimserve.testing import identity_models
from slimserve.testing.inprocess import Aborted, Context, InProcess

PATH = "/v1/models/id:predict"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("identity") / "id")
    identity_models.write_identity_model(base)
    with InProcess([ServedModel("id", base)]) as instance:
        yield instance


def _post(stack, body, signature=None):
    """(status, raw answer) of a :predict; body: bytes as sent, or a dict sent as JSON."""
    if signature is not None:
        body = dict(body, signature_name=signature)
    status, _, payload = stack.rest("POST", PATH, body)
    return status, payload


def _ok(stack, body, signature=None):
    status, payload = _post(stack, body, signature)
    assert status == 200, payload
    return payload


def _as_text(payload):
    """A JSON answer with every number (NaN and Infinity too) as its text."""
    return json.loads(payload, parse_float=str, parse_int=str, parse_constant=str)


def _error(stack, body, signature=None):
    status, payload = _post(stack, body, signature)
    assert status != 200, payload
    return status, json.loads(payload)["error"]


def _grpc_identity(stack, signature, tensors_text):
    """{alias: TensorProto text} sent over gRPC to `signature` -> {alias: serialized
    output}; each must be the input as AsProtoField writes it."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "id"
    request.model_spec.signature_name = signature
    for key, text in tensors_text.items():
        request.inputs[key].CopyFrom(text_format.Parse(text, tensor_pb2.TensorProto()))
    response = stack.prediction.Predict(request, Context())
    return {key: value.SerializeToString() for key, value in response.outputs.items()}


def _proto_bytes(text):
    return text_format.Parse(text, tensor_pb2.TensorProto()).SerializeToString()


# --- JSON -> tensors (FillPredictRequestFromJson) -----------------------------------------

READ_CASES = [
    # (signature, body, the TensorProto TF Serving fills per input, answer as numbers' text)
    ("int32", {"instances": [[1, 2], [3, 4], [5, 6]]},
     {"x": "dtype: DT_INT32 tensor_shape { dim { size: 3 } dim { size: 2 } } "
           "int_val: [1, 2, 3, 4, 5, 6]"},
     {"predictions": [["1", "2"], ["3", "4"], ["5", "6"]]}),
    ("float", {"instances": [1, 2.0, 3, 4, 5.003, 0.007, 0.0]},
     {"x": "dtype: DT_FLOAT tensor_shape { dim { size: 7 } } "
           "float_val: [1, 2, 3, 4, 5.003, 0.007, 0]"},
     {"predictions": ["1.0", "2.0", "3.0", "4.0", "5.003", "0.007", "0.0"]}),
    ("double", {"instances": [1.0, 2, 3, 4, 0.662, 0, 0.0]},
     {"x": "dtype: DT_DOUBLE tensor_shape { dim { size: 7 } } "
           "double_val: [1, 2, 3, 4, 0.662, 0, 0]"},
     {"predictions": ["1.0", "2.0", "3.0", "4.0", "0.662", "0.0", "0.0"]}),
    # precision loss: the integer and the decimal spelling read the same float
    ("float", {"instances": [1435774380]},
     {"x": "dtype: DT_FLOAT tensor_shape { dim { size: 1 } } float_val: 1435774380"},
     {"predictions": ["1.43577434e+09"]}),
    ("float", {"instances": [1435774380.0]},
     {"x": "dtype: DT_FLOAT tensor_shape { dim { size: 1 } } float_val: 1435774380"},
     {"predictions": ["1.43577434e+09"]}),
    # past float's range: inf; below its smallest: 0 (signed)
    ("float", b'{"instances": [1.7976931348623157e+308, -1.7976931348623157e+308]}',
     {"x": "dtype: DT_FLOAT tensor_shape { dim { size: 2 } } float_val: [inf, -inf]"},
     {"predictions": ["Infinity", "-Infinity"]}),
    ("float", b'{"instances": [2.2250738585072014e-308, -2.2250738585072014e-308]}',
     {"x": "dtype: DT_FLOAT tensor_shape { dim { size: 2 } } float_val: [0, -0]"},
     {"predictions": ["0.0", "-0.0"]}),
    ("int32", {"signature_name": "int32", "instances": [[1, 2]]},
     {"x": "dtype: DT_INT32 tensor_shape { dim { size: 1 } dim { size: 2 } } "
           "int_val: [1, 2]"},
     {"predictions": [["1", "2"]]}),
    ("string", {"instances": [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}]},
     {"x": 'dtype: DT_STRING tensor_shape { dim { size: 2 } } string_val: ["hello", "world"]'},
     {"predictions": ["hello", "world"]}),
    ("string", {"instances": [[{"b64": "aGVsbG8="}], [{"b64": "d29ybGQ="}]]},
     {"x": 'dtype: DT_STRING tensor_shape { dim { size: 2 } dim { size: 1 } } '
           'string_val: ["hello", "world"]'},
     {"predictions": [["hello"], ["world"]]}),
    ("string", {"instances": [{"x": [[{"b64": "aGVsbG8="}], [{"b64": "d29ybGQ="}]]}]},
     {"x": 'dtype: DT_STRING tensor_shape { dim { size: 1 } dim { size: 2 } dim { size: 1 } }'
           ' string_val: ["hello", "world"]'},
     {"predictions": [[["hello"], ["world"]]]}),
    ("named", b'{"instances": [{"int_tensor": [[1,2],[3,4],[5,6]], "str_tensor": ["foo", '
              b'"bar"], "float_tensor": [1.0, NaN], "dbl_tensor": [NaN]}, {"int_tensor": '
              b'[[7,8],[9,0],[1,2]], "str_tensor": ["baz", "bat"], "float_tensor": [2.0, '
              b'Infinity], "dbl_tensor": [2.0]}]}',
     {"int_tensor": "dtype: DT_INT32 tensor_shape { dim { size: 2 } dim { size: 3 } "
                    "dim { size: 2 } } int_val: [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2]",
      "str_tensor": 'dtype: DT_STRING tensor_shape { dim { size: 2 } dim { size: 2 } } '
                    'string_val: ["foo", "bar", "baz", "bat"]',
      "float_tensor": "dtype: DT_FLOAT tensor_shape { dim { size: 2 } dim { size: 2 } } "
                      "float_val: [1, nan, 2, inf]",
      "dbl_tensor": "dtype: DT_DOUBLE tensor_shape { dim { size: 2 } dim { size: 1 } } "
                    "double_val: [nan, 2]"},
     {"predictions": [
         {"dbl_tensor": ["NaN"], "float_tensor": ["1.0", "NaN"],
          "int_tensor": [["1", "2"], ["3", "4"], ["5", "6"]], "str_tensor": ["foo", "bar"]},
         {"dbl_tensor": ["2.0"], "float_tensor": ["2.0", "Infinity"],
          "int_tensor": [["7", "8"], ["9", "0"], ["1", "2"]], "str_tensor": ["baz", "bat"]}]}),
    ("int32", {"inputs": {"x": [[[1, 2], [3, 4], [5, 6]]]}},
     {"x": "dtype: DT_INT32 tensor_shape { dim { size: 1 } dim { size: 3 } dim { size: 2 } }"
           " int_val: [1, 2, 3, 4, 5, 6]"},
     {"outputs": [[["1", "2"], ["3", "4"], ["5", "6"]]]}),
    ("int32", {"inputs": [[[1, 2], [3, 4], [5, 6]]]},
     {"x": "dtype: DT_INT32 tensor_shape { dim { size: 1 } dim { size: 3 } dim { size: 2 } }"
           " int_val: [1, 2, 3, 4, 5, 6]"},
     {"outputs": [[["1", "2"], ["3", "4"], ["5", "6"]]]}),
    ("columnar", {"inputs": {"int_tensor": [[[1, 2], [3, 4], [5, 6]]],
                             "str_tensor": ["foo", "bar"], "bin_tensor": {"b64": "aGVsbG8="}}},
     {"int_tensor": "dtype: DT_INT32 tensor_shape { dim { size: 1 } dim { size: 3 } "
                    "dim { size: 2 } } int_val: [1, 2, 3, 4, 5, 6]",
      "str_tensor": 'dtype: DT_STRING tensor_shape { dim { size: 2 } } '
                    'string_val: ["foo", "bar"]',
      "bin_tensor": 'dtype: DT_STRING tensor_shape {} string_val: "hello"'},
     {"outputs": {"bin_tensor": "hello", "int_tensor": [[["1", "2"], ["3", "4"], ["5", "6"]]],
                  "str_tensor": ["foo", "bar"]}}),
    # a string scalar (json_tensor_test's bin_tensor; api_rest.md's {"inputs": "hello"})
    ("string", {"inputs": "hello"}, {"x": 'dtype: DT_STRING tensor_shape {} string_val: "hello"'},
     {"outputs": "hello"}),
    ("string", {"inputs": {"b64": "aGVsbG8="}},
     {"x": 'dtype: DT_STRING tensor_shape {} string_val: "hello"'}, {"outputs": "hello"}),
]


@pytest.mark.parametrize("signature, body, protos, answer", READ_CASES)
def test_json_is_read_as_fill_predict_request_from_json_reads_it(stack, signature, body,
                                                                 protos, answer):
    if isinstance(body, dict):
        body = dict(body, signature_name=signature)
    else:
        body = body.replace(b"{", b'{"signature_name": "%s", ' % signature.encode(), 1)
    assert _as_text(_ok(stack, body)) == answer
    outputs = _grpc_identity(stack, signature, protos)
    assert outputs == {key: _proto_bytes(text) for key, text in protos.items()}


@pytest.mark.parametrize("body, text", [
    (b"", "document is empty"),
    ({"signature_name": 5, "instances": [[1, 2], [3, 4], [5, 6, 7]]},
     "must be a string value"),
    ({"instances": [[1, 2], [3, 4], [5, 6, 7]], "inputs": [[1, 2], [3, 4], [5, 6, 7]]},
     "Not formatted correctly"),
    ({"instances": [[1, 2], [3, 4], [5, 6, 7]]}, "Expecting tensor size"),
    ({"instances": [[1, 2], [3, 4], [[5, 6]]]}, "Expecting shape"),
    ({"instances": [1, [1]]}, "Expecting shape"),
    ({"instances": [[1, 2], ["a", "b"]]}, "not of expected type"),
])
def test_single_unnamed_tensor_errors(stack, body, text):
    if isinstance(body, dict) and "signature_name" not in body:
        body = dict(body, signature_name="int32")
    elif body:
        body = dict(body)
    status, message = _error(stack, body or b"")
    assert status == 400 and text in message


@pytest.mark.parametrize("instances, text", [
    ([{"int_tensor": [[1, 2], [3, 4], [5, 6]], "str_tensor": ["foo", "bar"],
       "float_tensor": [1.0], "dbl_tensor": [1.0]},
      {"int_tensor": [[[7, 8], [9, 0], [1, 2]]], "str_tensor": ["baz", "bat"],
       "float_tensor": [1.0], "dbl_tensor": [1.0]}], "Expecting shape"),
    ([{"int_tensor": [[1, 2], [3, 4], [5, 6], [7, 8]], "str_tensor": ["foo", "bar"],
       "float_tensor": [1.0], "dbl_tensor": [1.0]},
      {"int_tensor": [[7, 8], [9, 0], [1, 2]], "str_tensor": ["baz", "bat"],
       "float_tensor": [1.0], "dbl_tensor": [1.0]}], "Expecting tensor size"),
    ([{"int_tensor": [[1, 2], [3, 4], [5, 6]], "str_tensor": ["foo", "bar"],
       "float_tensor": [1.0], "dbl_tensor": [1.0]}, [1, 20, 30]],
     "Expecting object but got list at item 1 of input list"),
])
def test_multiple_named_tensor_errors(stack, instances, text):
    status, message = _error(stack, {"instances": instances}, "named")
    assert status == 400 and text in message


def test_a_list_then_an_object_is_refused(stack):
    status, message = _error(stack, {"instances": [["baz", "bar"], {"x": ["baz", "bat"]}]},
                             "string")
    assert (status, message) == (400, "Expecting value/list but got object at item 1 of "
                                      "input list")


# --- tensors -> JSON (MakeJsonFromTensors) ------------------------------------------------

def test_a_tensor_in_row_and_columnar_layout(stack):
    rows = [[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 0], [1, 2]]]
    assert json.loads(_ok(stack, {"instances": rows}, "int32")) == {"predictions": rows}
    assert json.loads(_ok(stack, {"inputs": rows}, "int32")) == {"outputs": rows}
    assert json.loads(_ok(stack, {"instances": [1, 2, 3, 4, 5]}, "int32")) == {
        "predictions": [1, 2, 3, 4, 5]}
    assert json.loads(_ok(stack, {"inputs": [1, 2, 3, 4, 5]}, "int32")) == {
        "outputs": [1, 2, 3, 4, 5]}


def test_a_bytes_tensor_is_written_base64(stack):
    words = [["hello", "world"], ["tf", "serving"]]
    payload = _ok(stack, {"instances": words}, "string_bytes")
    assert json.loads(payload) == {"predictions": [
        [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}], [{"b64": "dGY="}, {"b64": "c2VydmluZw=="}]]}


def test_floats_are_written_with_six_digits_or_enough_to_read_back(stack):
    values = [[9000000, 999999, 0.5], [0.0003, 0.00003, 555557.5]]
    assert _as_text(_ok(stack, {"instances": values}, "float")) == {"predictions": [
        ["9e+06", "999999.0", "0.5"], ["0.0003", "3e-05", "555557.5"]]}
    payload = _ok(stack, b'{"signature_name": "float", "instances": [[NaN, Infinity], '
                         b'[3, -Infinity]]}')
    assert _as_text(payload) == {"predictions": [["NaN", "Infinity"], ["3.0", "-Infinity"]]}


def test_several_outputs_in_both_layouts(stack):
    instances = [{"int_tensor": [[1, 2], [3, 4], [5, 6]], "str_tensor": ["foo", "bar"],
                  "float_tensor": [1.0], "dbl_tensor": 8.0},
                 {"int_tensor": [[7, 8], [9, 0], [1, 2]], "str_tensor": ["baz", "bat"],
                  "float_tensor": [2.0], "dbl_tensor": 9.0}]
    assert json.loads(_ok(stack, {"instances": instances}, "named")) == {
        "predictions": instances}
    columns = {key: [row[key] for row in instances] for key in instances[0]}
    assert json.loads(_ok(stack, {"inputs": columns}, "named")) == {"outputs": columns}


@pytest.mark.parametrize("signature, body, status, text", [
    ("complex_out", {"inputs": [1.0, 2.0]}, 400,
     "Failed to write JSON value for tensor type: complex64"),
    ("scalar_out", {"instances": [1.0, 2.0]}, 400, "Tensor name: y has no shape information "),
    ("two_batches", {"instances": [1.0, 2.0]}, 400,
     "Tensor name: b has inconsistent batch size: 1 expecting: 2"),
    ("zero_and_one", {"instances": [1.0]}, 400,
     "Tensor name: str_tensor has inconsistent batch size: 1 expecting: 0"),
])
def test_answers_that_cannot_be_written(stack, signature, body, status, text):
    assert _error(stack, body, signature) == (status, text)


def test_zero_batch_answers(stack):
    assert json.loads(_ok(stack, {"instances": [[1.0, 2.0]]}, "zero_batch")) == {
        "predictions": []}
    assert json.loads(_ok(stack, {"instances": [1.0]}, "zero_batches")) == {
        "predictions": []}
    assert json.loads(_ok(stack, {"inputs": [1.0, 2.0]}, "scalar_out")) == {"outputs": 3.0}


# --- every dtype the codec handles, at its limits, at every rank -------------------------

LIMITS = {
    "int8": [-128, 127], "uint8": [0, 255], "int16": [-32768, 32767],
    "int32": [-2 ** 31, 2 ** 31 - 1], "int64": [-2 ** 63, 2 ** 63 - 1],
    "uint32": [0, 2 ** 32 - 1], "uint64": [0, 2 ** 64 - 1], "bool": [True, False],
    "float": [-3.4028234663852886e38, 1.401298464324817e-45],
    "double": [-1.7976931348623157e308, 5e-324], "string": ["", "\u00e9\u0000\"\\\n"],
}
FIELDS = {"int8": "int_val", "uint8": "int_val", "int16": "int_val", "int32": "int_val",
          "int64": "int64_val", "uint32": "uint32_val", "uint64": "uint64_val",
          "bool": "bool_val", "float": "float_val", "double": "double_val",
          "string": "string_val"}


def _nested(values, rank):
    """`values` (a list) nested `rank` deep: rank 0 is the first value alone."""
    if rank == 0:
        return values[0]
    item = values
    for _ in range(rank - 1):
        item = [item]
    return item


@pytest.mark.parametrize("dtype", sorted(LIMITS))
@pytest.mark.parametrize("rank", [0, 1, 2, 5, 32])
def test_every_dtype_round_trips_at_its_limits_and_any_rank(stack, dtype, rank):
    values = LIMITS[dtype]
    if rank == 0:
        values = values[:1]
    item = _nested(values, rank)
    payload = _ok(stack, {"inputs": item}, dtype)
    answer = json.loads(payload)["outputs"]
    if dtype == "float":  # written with 9 digits: the same float, another double
        assert np.array_equal(np.float32(answer), np.float32(item))
    else:
        assert answer == item
    proto = tensor_pb2.TensorProto(dtype=identity_models.DTYPES[dtype].as_datatype_enum)
    proto.tensor_shape.SetInParent()
    for size in ([1] * (rank - 1) + [len(values)] if rank else []):
        proto.tensor_shape.dim.add(size=size)
    getattr(proto, FIELDS[dtype]).extend(
        [v.encode() for v in values] if dtype == "string" else values)
    outputs = _grpc_identity(stack, dtype, {"x": text_format.MessageToString(proto)})
    assert outputs == {"x": proto.SerializeToString()}


@pytest.mark.parametrize("dtype, item, text", [
    ("int32", 2 ** 31, "JSON Value: 2147483648 Type: Number is not of expected type: int32"),
    ("int16", 2 ** 31, "JSON Value: 2147483648 Type: Number is not of expected type: int16"),
    ("int64", 2 ** 63, "JSON Value: 9223372036854775808 Type: Number is not of expected "
                       "type: int64"),
    ("uint32", -1, "JSON Value: -1 Type: Number is not of expected type: uint32"),
    # past uint64 an integer is a double, quoted as a float (it is within float's range)
    ("uint64", 2 ** 64, "JSON Value: 1.84467441e+19 Type: Number is not of expected "
                        "type: uint64"),
    ("int32", 1.5, "JSON Value: 1.5 Type: Number is not of expected type: int32"),
    ("bool", 1, "JSON Value: 1 Type: Number is not of expected type: bool"),
    ("string", 1, "JSON Value: 1 Type: Number is not of expected type: string"),
    ("float", "1", 'JSON Value: "1" Type: String is not of expected type: float'),
    ("float", None, "JSON Value: null Type: Null is not of expected type: float"),
    ("float", {"b64": "AA=="}, 'JSON Value: {\n    "b64": "AA=="\n} Type: Object is not of '
                               'expected type: float'),
    ("string", {"b64": "not base64!"}, "Unable to base64 decode"),
    ("string", {"b64": "AA==", "x": 1}, 'JSON Value: {\n    "b64": "AA==",\n    "x": 1\n} '
                                        'not formatted correctly for base64 data'),
])
def test_values_of_the_wrong_kind_are_tf_servings_errors(stack, dtype, item, text):
    assert _error(stack, {"inputs": [item]}, dtype) == (400, text)


def test_integers_narrow_as_tf_static_cast_does(stack):
    """IsInt() passes 300 for int8 and -1 for uint8; Tensor::FromProto then casts."""
    assert json.loads(_ok(stack, {"inputs": [300, -129]}, "int8")) == {"outputs": [44, 127]}
    assert json.loads(_ok(stack, {"inputs": [-1, 256]}, "uint8")) == {"outputs": [255, 0]}


@pytest.mark.parametrize("dtype", ["half", "bfloat16", "uint16", "complex64", "complex128"])
def test_dtypes_the_codec_does_not_read_or_write(stack, dtype):
    assert _error(stack, {"inputs": [1]}, dtype) == (
        501, "Conversion of JSON Value: 1 to type: %s" % dtype)
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "id", dtype
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones([2], identity_models.DTYPES[
        dtype].as_numpy_dtype)))
    response = stack.prediction.Predict(request, Context())
    out = response.outputs["x"]
    assert out.tensor_shape.dim[0].size == 2 and not out.tensor_content  # AsProtoField
    assert (len(out.half_val) or len(out.int_val) or len(out.scomplex_val)
            or len(out.dcomplex_val))


# --- rapidjson's reading of numbers and strings -------------------------------------------

@pytest.mark.parametrize("body, number", [
    (b'{"signature_name": "float", "inputs": [1, 1e309]}', b"1e309"),
    (b'{"signature_name": "float", "inputs": [0e400]}', b"0e400"),  # 0, yet too big
    (b'{"signature_name": "float", "inputs": -' + b"9" * 400 + b"}", b"-9"),
    (b'{"signature_name": "float", "inputs": "1e400", "x": 1e400}', b"1e400}"),
])
def test_numbers_too_big_for_a_double(stack, body, number):
    """rapidjson's limit (an exponent past 308 less the fraction's digits, or an integer
    part past DBL_MAX), at the number's first byte; strings are not numbers."""
    assert _error(stack, body) == (400, "JSON Parse error: Number too big to be stored in "
                                        "double. at offset: %d" % body.index(number))


def test_numbers_rapidjson_reads_that_pythons_json_does_not(stack):
    payload = _ok(stack, b'{"signature_name": "float", "inputs": [Inf, -Inf, -NaN, 2e308, '
                         b'1' + b"0" * 30 + b']}')
    assert _as_text(payload) == {"outputs": ["Infinity", "-Infinity", "NaN", "Infinity",
                                             "1e+30"]}
    # an integer past uint64 is a double: a float, not an integer
    assert _error(stack, b'{"signature_name": "uint64", "inputs": [18446744073709551616]}')[
        1].endswith("Type: Number is not of expected type: uint64")


def test_doubles_are_computed_as_rapidjson_computes_them(stack):
    """rapidjson 1.1.0 (normal precision) reads `0.1e-25` as significand 1 over the
    double nearest 1e26, one ULP under the correctly rounded 1e-26; a double input gets
    rapidjson's value, written back with 17 digits since six do not read back as it."""
    assert 1 / 1e26 != 1e-26
    payload = _ok(stack, b'{"signature_name": "double", "inputs": [0.1e-25, 0.5]}')
    assert _as_text(payload) == {"outputs": ["9.999999999999999e-27", "0.5"]}
    assert float(_as_text(payload)["outputs"][0]) == 1 / 1e26


def test_strings_keep_their_bytes(stack):
    body = b'{"signature_name": "string", "inputs": ["\xff\xfe", "\\udc00", "\\u00e9"]}'
    payload = _ok(stack, body)
    assert payload == b'{\n    "outputs": [\n        "\xff\xfe",\n        "\xed\xb0\x80",\n' \
                      b'        "\xc3\xa9"\n    ]\n}'
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "id", "string_bytes"
    payload = _ok(stack, b'{"signature_name": "string_bytes", "inputs": ["\xff"]}')
    assert json.loads(payload) == {"outputs": [{"b64": base64.b64encode(b"\xff").decode()}]}


@pytest.mark.parametrize("body, at, message", [
    (b'["\\ud800"]}', b"\\", "The surrogate pair in string is invalid."),
    (b'["\\ud800\\u0041"]}', b"\\", "The surrogate pair in string is invalid."),
    (b'["a\x01"]}', b"\x01", "Invalid escape character in string."),
    (b'["a\x00"]}', b"\x00", "Missing a closing quotation mark in string."),
    (b'[1, 2', None, "Missing a comma or ']' after an array element."),
])
def test_string_and_syntax_errors_say_what_rapidjson_says(stack, body, at, message):
    body = b'{"signature_name": "string", "inputs": ' + body
    offset = body.index(at) if at else len(body)
    assert _error(stack, body) == (400, "JSON Parse error: %s at offset: %d" % (message,
                                                                                 offset))


def test_a_nul_after_the_document_ends_it(stack):
    assert json.loads(_ok(stack, b'{"signature_name": "float", "inputs": [1]}\x00junk')) == {
        "outputs": [1.0]}


# --- classify / regress requests (FillClassifyRegressRequestFromJson) --------------------

def _echoed(stack, body):
    """The serialized tf.Examples the echo model was fed, in order."""
    status, _, payload = stack.rest("POST", "/v1/models/id:classify",
                                    dict(body, signature_name="echo_classify"))
    assert status == 200, payload
    results = json.loads(payload)["results"]
    return [base64.urlsafe_b64decode(row[0][0] + "=" * (-len(row[0][0]) % 4))
            for row in results]


def _example(features):
    return tf.train.Example(features=tf.train.Features(feature=features))


def test_examples_without_context(stack):
    fed = _echoed(stack, {"examples": [{"names": ["foo", "bar"], "ratings": [8.0, 9.0],
                                        "age": 20},
                                       {"names": ["baz"], "ratings": 6.0}]})
    expected = [
        _example({"names": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"foo", b"bar"])),
                  "ratings": tf.train.Feature(float_list=tf.train.FloatList(value=[8, 9])),
                  "age": tf.train.Feature(int64_list=tf.train.Int64List(value=[20]))}),
        _example({"names": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"baz"])),
                  "ratings": tf.train.Feature(float_list=tf.train.FloatList(value=[6]))})]
    assert [tf.train.Example.FromString(data) for data in fed] == expected


def test_examples_with_context_are_its_bytes_then_theirs(stack):
    body = b'''{"signature_name": "echo_classify", "context": {"query": "pizza"},
      "examples": [{"names": ["foo", "bar"], "ratings": [8.0, 9.0, NaN, Infinity]},
                   {"names": ["baz", {"b64": "aGVsbG8="}], "intboolmix": [1, true, false]},
                   {"names": "bar", "ratings": -Infinity}]}'''
    status, _, payload = stack.rest("POST", "/v1/models/id:classify", body)
    assert status == 200, payload
    fed = [base64.urlsafe_b64decode(r[0][0] + "=" * (-len(r[0][0]) % 4))
           for r in json.loads(payload)["results"]]
    context = _example({"query": tf.train.Feature(bytes_list=tf.train.BytesList(
        value=[b"pizza"]))}).SerializeToString()
    assert all(data.startswith(context) for data in fed)
    parsed = [tf.train.Example.FromString(data) for data in fed]
    features = [p.features.feature for p in parsed]
    assert [list(f["names"].bytes_list.value) for f in features] == [
        [b"foo", b"bar"], [b"baz", b"hello"], [b"bar"]]
    ratings = list(features[0]["ratings"].float_list.value)
    assert ratings[:2] == [8.0, 9.0] and math.isnan(ratings[2]) and ratings[3] == math.inf
    assert list(features[1]["intboolmix"].int64_list.value) == [1, 1, 0]
    assert list(features[2]["ratings"].float_list.value) == [-math.inf]
    assert all(f["query"].bytes_list.value == [b"pizza"] for f in features)


@pytest.mark.parametrize("body, text", [
    ({"signature_name": ["hello"], "examples": [{"names": ["foo", "bar"]}]},
     "'signature_name' key must be a string"),
    ({"context": [{"names": ["foo", "bar"]}]}, "Example must be JSON object"),
    ({"examples": {"names": ["foo", "bar"]}}, "list/array"),
    ({"examples": [[{"names": ["foo", "bar"]}]]}, "Example must be JSON object"),
    ({"examples": [{"names": [10, None]}]}, "names has element with unexpected JSON type: Null"),
    ({"examples": [{"names": [10, 10.0]}]}, "feature: names expecting type: int64"),
    ({"examples": [{"names": [10, {"test": 10}]}]},
     "names has element with unexpected JSON type: Object"),
    ({"examples": [{"names": [[10], 20]}]}, "names has element with unexpected JSON type: Array"),
    ({"examples": [{"names": [20, 18446744073709551603]}]}, "Only int64_t is supported"),
])
@pytest.mark.parametrize("verb", ["classify", "regress"])
def test_classify_and_regress_json_errors(stack, body, text, verb):
    status, _, payload = stack.rest("POST", "/v1/models/id:" + verb, body)
    assert status == 400 and text in json.loads(payload)["error"]


def test_a_request_the_grpc_way_and_the_rest_way_feed_the_same_bytes(stack):
    """A context on gRPC is fed as on REST: its serialized bytes, then each example's."""
    from tensorflow_serving.apis import classification_pb2  # pylint: disable=import-outside-toplevel
    context = _example({"query": tf.train.Feature(bytes_list=tf.train.BytesList(
        value=[b"pizza"]))})
    example = _example({"age": tf.train.Feature(int64_list=tf.train.Int64List(value=[20]))})
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name, request.model_spec.signature_name = "id", "echo_classify"
    request.input.example_list_with_context.context.CopyFrom(context)
    request.input.example_list_with_context.examples.add().CopyFrom(example)
    response = stack.prediction.Classify(request, Context())
    label = response.result.classifications[0].classes[0].label
    fed = base64.urlsafe_b64decode(label + "=" * (-len(label) % 4))
    assert fed == context.SerializeToString() + example.SerializeToString()
    assert _echoed(stack, {"context": {"query": "pizza"}, "examples": [{"age": 20}]}) == [fed]


def test_a_grpc_predict_refusal_is_the_same_on_rest(stack):
    """A dtype mismatch TF Serving finds in Session::Run is the same error either way."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "id", "float"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([1], tf.int32))
    with pytest.raises(Aborted) as caught:
        stack.prediction.Predict(request, Context())
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "Expects arg[0] to be float but int32 is provided" in caught.value.details
