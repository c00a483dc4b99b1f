"""Hostile requests cost no more than their size justifies, responses fill TF Serving's
typed fields, and client-facing errors name no server paths.

Real gRPC and HTTP on loopback against the tiny SavedModel (slimserve/testing/tiny_models.py): the
bounds do not depend on the model, only on its signatures.
"""
import base64
import re
import subprocess
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import json_format
from tensorflow.core.framework import tensor_pb2
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from slimserve.serving.api import rest_json
from slimserve.serving.core import errors
from slimserve.serving.config import model_config
from slimserve.serving.core import tensors
from tests import helpers
from slimserve.testing import tiny_models
from slimserve.testing.servers import serve_in_process, wait_until
from tests.helpers import start_server_process, stop_process

ROOT = helpers.ROOT
INVALID = grpc.StatusCode.INVALID_ARGUMENT



@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    base = tmp_path_factory.mktemp("bounds") / "tiny"
    tiny_models.write_tiny_model(str(base), 1)
    return str(base)


@pytest.fixture(scope="module")
def server(tiny_base):
    instance = serve_in_process([model_config.ServedModel("tiny", tiny_base)])
    yield instance
    instance.stop()


def _proto(**fields):
    """A TensorProto from JSON-style fields (as a hostile client would hand-craft it)."""
    if "string_val" in fields:
        fields = dict(fields, string_val=[base64.b64encode(v).decode()
                                          for v in fields["string_val"]])
    return json_format.ParseDict(fields, tensor_pb2.TensorProto())


def _shape(*dims):
    return {"dim": [{"size": d} for d in dims]}


def _request(key, proto, signature=""):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    request.model_spec.signature_name = signature
    request.inputs[key].CopyFrom(proto)
    return request


def _valid_request(rows):
    return _request("x", tf.make_tensor_proto(np.array(rows, np.float32)))


# The reported bombs and their relatives: each must be INVALID_ARGUMENT with a message
# naming the input, decided before anything is allocated.
BOMBS = {
    # 58 bytes that grew the server to 22 GB: one string filling [100000000].
    "string_fill_1e8": ("inputs", "classify", dict(
        dtype="DT_STRING", tensor_shape=_shape(100000000), string_val=[b"x"]),
        r"max_request_elements"),
    "string_fill_2e6": ("inputs", "classify", dict(
        dtype="DT_STRING", tensor_shape=_shape(2000000), string_val=[b"x"]),
        r"max_broadcast_elements"),
    # +1.9 GB: one float filling [5e8] (here [2.5e8, 2] to fit the signature).
    "float_fill_5e8": ("x", "", dict(
        dtype="DT_FLOAT", tensor_shape=_shape(250000000, 2), float_val=[1.0]),
        r"max_request_elements"),
    # +4.5 GB: a shape with no values at all (TF would fill zeros).
    "no_values_zero_fill": ("x", "", dict(
        dtype="DT_FLOAT", tensor_shape=_shape(20000000, 2)), r"max_request_elements|"
        r"max_broadcast_elements"),
    "no_values_over_fill_limit": ("x", "", dict(
        dtype="DT_FLOAT", tensor_shape=_shape(600000, 2)), r"max_broadcast_elements"),
    # What Tensor::FromProto refuses is TF Serving's "tensor parsing error: <alias>".
    "negative_dimension": ("x", "", dict(
        dtype="DT_FLOAT", tensor_shape=_shape(-5, 2), float_val=[1.0, 2.0]),
        r"tensor parsing error: x"),
    "product_overflows_int64": ("x", "", dict(
        dtype="DT_FLOAT", tensor_shape=_shape(2 ** 62, 2 ** 62), float_val=[1.0]),
        r"tensor parsing error: x"),
    "content_length_mismatch": ("x", "", dict(
        dtype="DT_FLOAT", tensor_shape=_shape(1000, 2), tensor_content="AAAA"),
        r"tensor parsing error: x"),
    "dtype_invalid_enum": ("x", "", dict(dtype="DT_INVALID", tensor_shape=_shape(1)),
                           r"tensor parsing error: x"),
    "rank_past_tensorflows": ("x", "", dict(
        dtype="DT_FLOAT", tensor_shape=_shape(*[1] * 255), float_val=[1.0]),
        r"tensor parsing error: x"),
    "rank_past_numpys": ("x", "", dict(
        dtype="DT_FLOAT", tensor_shape=_shape(*[1] * 33), float_val=[1.0]),
        r"takes at most 32"),
    "unsupported_dtype_resource": ("x", "", dict(
        dtype="DT_RESOURCE", tensor_shape=_shape(1)), r"does not accept"),
    "unsupported_dtype_variant": ("x", "", dict(
        dtype="DT_VARIANT", tensor_shape=_shape(1)), r"does not accept"),
    # Session::Run's own check, worded as TF words it (by argument index).
    "dtype_not_the_fed_tensors": ("x", "", dict(
        dtype="DT_INT64", tensor_shape=_shape(1, 2), int64_val=[1, 2]),
        r"Expects arg\[0\] to be float but int64 is provided"),
}


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_hostile_tensorproto_is_invalid_argument_and_server_keeps_serving(stub, case):
    key, signature, fields, message = BOMBS[case]
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(_request(key, _proto(**fields), signature), timeout=30)
    assert caught.value.code() == INVALID, caught.value.details()
    assert re.search(message, caught.value.details()), caught.value.details()
    details = caught.value.details()
    assert repr(key) in details or "error: %s" % key in details or "arg[0]" in details
    response = stub.Predict(_valid_request([[1.0, 2.0]]), timeout=30)
    assert list(response.outputs["y"].float_val) == tiny_models.expected_y([[1.0, 2.0]])


def test_request_element_limit_is_a_server_parameter(tiny_base):
    small = serve_in_process([model_config.ServedModel("tiny", tiny_base)], max_request_elements=100)
    try:
        channel = grpc.insecure_channel("127.0.0.1:%d" % small.port)
        limited = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        ok = limited.Predict(_valid_request(np.ones([50, 2])), timeout=30)  # 100 elements
        assert len(ok.outputs["y"].float_val) == 50
        with pytest.raises(grpc.RpcError) as caught:
            limited.Predict(_valid_request(np.ones([51, 2])), timeout=30)
        assert caught.value.code() == INVALID
        assert "'x'" in caught.value.details() and "limit of 100 elements" in \
            caught.value.details()
        # REST meets the same limit.
        status, body = _rest(small, "/v1/models/tiny:predict",
                             {"instances": np.ones([51, 2]).tolist()})
        assert status == 400 and "limit of 100 elements" in body["error"]
        channel.close()
    finally:
        small.stop()


@pytest.mark.parametrize("values, shape, expected", [
    (1.5, [3, 2], [[1.5, 1.5]] * 3),          # one value fills the shape
    ([1.0, 2.0, 3.0], [2, 2], [[1, 2], [3, 3]]),  # the last value repeats
    ([], [2, 2], [[0, 0], [0, 0]]),           # no values: zeros
])
def test_tf_fill_rule_is_honoured_within_the_limit(stub, values, shape, expected):
    """tf.make_tensor_proto(value, shape=...) sends fewer values than elements; TF
    Serving fills them (Tensor::FromProto) and so do we, up to max_broadcast_elements."""
    proto = tf.make_tensor_proto(values, dtype=tf.float32, shape=shape)
    assert len(proto.float_val) == len(np.ravel(values)) and not proto.tensor_content
    response = stub.Predict(_request("x", proto), timeout=30)
    assert tf.make_ndarray(response.outputs["doubled"]).tolist() == \
        (2 * np.array(expected, np.float32)).tolist()


def test_decoding_agrees_with_make_ndarray_for_every_supported_dtype():
    rng = np.random.default_rng(0)
    for dtype in tensors._TYPED:  # pylint: disable=protected-access
        if dtype == tf.string:
            array = np.array([[b"a", b"bc"], [b"", b"\x00\xff"]], dtype=object)
        else:
            array = (rng.standard_normal((3, 70)) * 50).astype(dtype.as_numpy_dtype)
        for proto in (tf.make_tensor_proto(array), tensors.to_proto(array)):
            decoded = tensors.from_proto("k", proto)
            reference = tf.make_ndarray(proto)
            assert decoded.dtype == reference.dtype, dtype
            assert decoded.tolist() == reference.tolist(), dtype
        assert tf.make_ndarray(tensors.to_proto(array)).tolist() == array.tolist(), dtype


def test_element_count_stops_multiplying_at_the_limit():
    with pytest.raises(errors.ServingError) as caught:
        tensors.element_count("k", [2 ** 62] * 1000, 10 ** 6)
    assert "'k'" in caught.value.message and "10" in caught.value.message
    assert tensors.element_count("k", [2 ** 62, 0], 10) == 0


def test_responses_fill_typed_fields_as_tf_serving_examples_read_them(stub):
    """TF Serving's example clients (resnet_client_grpc.py, mnist_client.py at 2.15.1)
    read `response.outputs[...].float_val`; tensor_content would leave it empty."""
    rows = [[1.0, 2.0], [3.0, -4.0], [0.5, 0.25]]
    response = stub.Predict(_valid_request(rows), timeout=30)
    y = response.outputs["y"]
    assert y.dtype == types_pb2.DT_FLOAT and not y.tensor_content
    assert [d.size for d in y.tensor_shape.dim] == [3, 1]
    assert list(y.float_val) == tiny_models.expected_y(rows)
    doubled = response.outputs["doubled"]
    assert np.array(doubled.float_val).reshape(
        [d.size for d in doubled.tensor_shape.dim]).tolist() == (2 * np.array(rows)).tolist()
    # Strings: Predict on the classify signature answers string_val and float_val.
    examples = tf.make_tensor_proto([tiny_models.tiny_example(1.0, 2.0).SerializeToString()])
    response = stub.Predict(_request("inputs", examples, "classify"), timeout=30)
    assert list(response.outputs["classes"].string_val) == [b"a", b"b"]
    scores = list(response.outputs["scores"].float_val)
    assert scores == pytest.approx(np.exp([1, 2]) / np.exp([1, 2]).sum(), rel=1e-6)
    # Every other dtype goes in its typed field too, and reads back through make_ndarray.
    for array, field in [(np.array([[1, -2]], np.int64), "int64_val"),
                         (np.array([[7, 8]], np.int32), "int_val"),
                         (np.array([True, False]), "bool_val"),
                         (np.array([2.5], np.float64), "double_val"),
                         (np.array([1.5], np.float16), "half_val")]:
        proto = tensors.to_proto(array)
        assert len(getattr(proto, field)) == array.size and not proto.tensor_content
        assert tf.make_ndarray(proto).tolist() == array.tolist()


def _rest(server, path, body):
    return helpers.rest_json(server.rest_api_port, path, body)


@pytest.mark.parametrize("case, instances, message", [
    ("ragged_rows", [[1.0, 2.0], [3.0]], "Failed to process element: 1 of 'instances' list. "
     "Error: INVALID_ARGUMENT: Expecting tensor size: 2 but got: 1"),
    ("list_and_value_mixed", [[1.0, 2.0], 3.0], "Expecting tensor size: 2 but got: 1"),
    ("rows_of_other_shapes", [[[1.0], [2.0]], [[1.0, 2.0]]],
     "Expecting shape [2,1] but got: [1,2]"),
    ("not_a_number", [[1.0, "two"]],
     'JSON Value: "two" Type: String is not of expected type: float'),
])
def test_rest_json_is_read_as_tf_serving_reads_it(server, case, instances, message):
    """json_tensor.cc's checks and messages: each row the first row's size and shape,
    each value its dtype's JSON kind."""
    status, body = _rest(server, "/v1/models/tiny:predict", {"instances": instances})
    assert status == 400, (case, body)
    assert message in body["error"], body
    status, body = _rest(server, "/v1/models/tiny:predict", {"instances": [[1.0, 2.0]]})
    assert status == 200 and body["predictions"][0]["y"] == tiny_models.expected_y([[1.0, 2.0]])


def test_rest_json_nested_past_the_parsers_recursion_is_400(server):
    depth = 100000
    raw = b'{"instances": ' + b"[" * depth + b"]" * depth + b"}"
    status, body = _rest(server, "/v1/models/tiny:predict", raw)
    assert status == 400 and "JSON Parse error" in body["error"], body


def test_json_element_and_depth_limits_apply_before_building_the_array():
    sig = meta_graph_pb2.SignatureDef()
    sig.inputs["x"].dtype = types_pb2.DT_FLOAT
    with pytest.raises(errors.ServingError) as caught:
        rest_json.predict_feeds({"inputs": [[0.0] * 11] * 10}, sig, max_elements=100)
    assert "max_request_elements" in caught.value.message
    for depth, message in ((33, "takes at most 32"),
                           (tensors.MAX_DIMENSIONS + 1, "tensor parsing error: x")):
        deep = 0.0
        for _ in range(depth):
            deep = [deep]
        with pytest.raises(errors.ServingError) as caught:
            rest_json.predict_feeds({"inputs": deep}, sig)
        assert message in caught.value.message, caught.value.message


def test_client_errors_carry_no_server_paths(tmp_path, caplog):
    """A real load failure (a corrupt saved_model.pb) and a real OpError (a missing file)."""
    base = tmp_path / "secret-dir" / "broken"
    base.mkdir(parents=True)  # no version yet: the server starts, and polls
    broken = serve_in_process([model_config.ServedModel("broken", str(base))],
                              max_num_load_retries=0, file_system_poll_wait_seconds=0.2)
    try:
        # published whole once serving (a server started with it alone exits, as TF
        # Serving's does); its load fails
        (base / "1.partial").mkdir()
        (base / "1.partial" / "saved_model.pb").write_bytes(b"this is not a SavedModel")
        (base / "1.partial").rename(base / "1")
        channel = grpc.insecure_channel("127.0.0.1:%d" % broken.port)
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = "broken"

        def failed():
            try:
                return [s for s in model_service_pb2_grpc.ModelServiceStub(channel)
                        .GetModelStatus(request, timeout=30).model_version_status
                        if s.status.error_message]
            except grpc.RpcError:  # NOT_FOUND until the poll sees version 1
                return None

        status = wait_until(failed, message="version 1 to fail")[0]
        channel.close()
        message = status.status.error_message
        assert "saved_model.pb" in message or "SavedModel" in message, message
        assert "secret-dir" not in message and str(tmp_path) not in message, message
        with urllib.request.urlopen("http://127.0.0.1:%d/v1/models/broken"
                                    % broken.rest_api_port, timeout=30) as reply:
            text = reply.read().decode()
        assert "secret-dir" not in text and "error_message" in text
    finally:
        broken.stop()

    missing = str(tmp_path / "secret-dir" / "no-such-file.bin")
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session() as session:
        with pytest.raises(tf.errors.OpError) as raised:
            session.run(tf.io.read_file(missing))
    assert "secret-dir" in raised.value.message
    with caplog.at_level("WARNING"):
        error = errors.from_tf_error(raised.value)
    assert error.code == grpc.StatusCode.NOT_FOUND
    assert "secret-dir" not in error.message and "no-such-file.bin" in error.message
    assert "secret-dir" in error.full_message
    assert any("secret-dir" in record.getMessage() for record in caplog.records)


# --- memory soak: a real server process under an address-space cap ---------------------

def _rss_kb(pid):
    with open("/proc/%d/status" % pid) as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for %d" % pid)


def _bombs_and_valid(count):
    """`count` requests cycling through every bomb and a valid request."""
    cases = [(_request(key, _proto(**fields), signature), False)
             for key, signature, fields, _ in BOMBS.values()]
    cases.append((_valid_request(np.ones([64, 2])), True))
    cases.append((_request("x", tf.make_tensor_proto(1.0, tf.float32, [500000, 2])), True))
    return [cases[i % len(cases)] for i in range(count)]


def test_memory_stays_flat_under_200_hostile_requests(tiny_base, tmp_path):
    cap = 3 * 1024 ** 3  # a regression is killed here instead of taking the machine down
    process, port, _ = start_server_process(
        ["--model_name=tiny", "--model_base_path=%s" % tiny_base, "--rest_api_port=0",
         "--file_system_poll_wait_seconds=0"], prefix=["prlimit", "--as=%d" % cap],
        stderr=subprocess.DEVNULL)
    try:
        channel = grpc.insecure_channel("127.0.0.1:%d" % port, options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024)])
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        requests = _bombs_and_valid(200)
        for request, _ in requests[:20]:  # warm: first-call allocations are not growth
            try:
                stub.Predict(request, timeout=60)
            except grpc.RpcError:
                pass
        before = _rss_kb(process.pid)
        answered = {True: 0, False: 0}
        for request, valid in requests:
            try:
                stub.Predict(request, timeout=60)
                answered[True] += valid
            except grpc.RpcError as error:
                assert not valid and error.code() == INVALID, error
                answered[False] += 1
        after = _rss_kb(process.pid)
        channel.close()
        assert process.poll() is None, "server died"
        assert answered[False] >= 150 and answered[True] >= 10, answered
        growth_mb = (after - before) / 1024.0
        print("server RSS %.0f MB -> %.0f MB (%+.1f MB) over %d requests" % (
            before / 1024.0, after / 1024.0, growth_mb, len(requests)))
        assert growth_mb < 100, growth_mb
    finally:
        stop_process(process)
