"""Shapes as TF Serving treats them: a request's tensors are not checked against the
SignatureDef but fed to the session, and the graph decides (predict_util.cc,
saved_model::GetInputValues, tag 2.15.1). half_plus_two's `x` is [-1, 1], yet [1], [3], a
scalar or [2, 2] run; a shape the graph cannot take is the graph's INVALID_ARGUMENT, and
no shape, however odd, takes the server down."""
import json
import os
import random
import subprocess
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from slimserve.serving.config import model_config
from slimserve.testing import half_plus_two
from slimserve.testing import tiny_models
from slimserve.testing.servers import serve_in_process
from tests.helpers import rest_json, start_server_process, stop_process

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("half_plus")
    half_plus_two.write_half_plus(str(root / "half_plus_two"))
    half_plus_two.write_half_plus(str(root / "half_plus_three"), plus=3.0)
    tiny_models.write_tiny_model(str(root / "tiny"))
    return {name: str(root / name) for name in ("half_plus_two", "half_plus_three", "tiny")}


@pytest.fixture(scope="module")
def server(bases):
    server = serve_in_process([model_config.ServedModel(name, path)
                               for name, path in bases.items()])
    yield server
    server.stop()


def _request(model, inputs, signature=""):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    for key, proto in inputs.items():
        request.inputs[key].CopyFrom(proto)
    return request


def _rest(server, path, body):
    return rest_json(server.rest_api_port, path, body, timeout=60)


@pytest.mark.parametrize("shape", [[1], [3], [], [2, 2], [1, 1], [0], [2, 0, 3]])
def test_grpc_feeds_any_shape_the_graph_takes(stub, shape):
    """The signature says [-1, 1]; TF Serving feeds whatever comes and answers y = x/2 + 2
    in the shape the graph gives back."""
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    response = stub.Predict(_request("half_plus_two", {"x": tf.make_tensor_proto(x)}),
                            timeout=60)
    y = tf.make_ndarray(response.outputs["y"])
    assert list(y.shape) == shape
    assert np.allclose(y, x * 0.5 + 2.0)


def test_rest_accepts_scalars_rows_and_columns_as_tf_serving(server):
    """api_rest.md's canonical example against a model whose signature declares no
    shape, and the columnar / scalar forms TF Serving reads."""
    assert _rest(server, "/v1/models/half_plus_three:predict",
                 {"instances": [1.0, 2.0, 5.0]}) == (200, {"predictions": [3.5, 4.0, 5.5]})
    assert _rest(server, "/v1/models/half_plus_two:predict", {"inputs": 1.0}) == \
        (200, {"outputs": 2.5})
    assert _rest(server, "/v1/models/half_plus_two:predict",
                 {"instances": [[1.0, 2.0], [3.0, 4.0]]}) == \
        (200, {"predictions": [[2.5, 3.0], [3.5, 4.0]]})
    # One named input may be given by name; members the signature lacks are ignored.
    assert _rest(server, "/v1/models/half_plus_two:predict",
                 {"inputs": {"x": [[1.0]], "unused": "ignored"}}) == (200, {"outputs": [[2.5]]})
    assert _rest(server, "/v1/models/half_plus_two:predict", {"instances": [[]]}) == \
        (200, {"predictions": [[]]})


def test_a_shape_the_graph_cannot_take_is_the_graphs_invalid_argument(server, stub):
    """tiny's y = x @ [[1], [2]]: a vector cannot be multiplied, on gRPC or REST."""
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(_request("tiny", {"x": tf.make_tensor_proto([1.0, 2.0, 3.0])}),
                     timeout=60)
    assert caught.value.code() == INVALID
    assert "Shape must be rank 2 but is rank 1" in caught.value.details(), caught.value.details()
    status, body = _rest(server, "/v1/models/tiny:predict", {"inputs": [1.0, 2.0]})
    assert status == 400 and "Shape must be rank 2 but is rank 1" in body["error"], body
    status, body = _rest(server, "/v1/models/tiny:predict", {"instances": [1.0, 2.0]})
    assert status == 400 and "Shape must be rank 2 but is rank 1" in body["error"], body


def test_dtypes_names_and_parsing_fail_with_tf_servings_statuses(stub):
    """Session::Run's dtype check, GetInputValues' alias rules, FromProto's parse errors."""
    cases = [
        ({"x": tf.make_tensor_proto([1], tf.int32)},
         "Expects arg[0] to be float but int32 is provided"),
        ({"x": tf.make_tensor_proto([1.0], tf.float64)},
         "Expects arg[0] to be float but double is provided"),
        ({"z": tf.make_tensor_proto([1.0])},
         "Signature input alias: x(feed name: x:0) not found in request"),
        ({"x": tf.make_tensor_proto([1.0]), "z": tf.make_tensor_proto([1.0])},
         "input size does not match signature: 2!=1"),
        ({"x": tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_content=b"abc",
                                      tensor_shape={"dim": [{"size": 1}]})},
         "tensor parsing error: x"),
        ({"x": tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT,
                                      tensor_shape={"dim": [{"size": 1}] * 255})},
         "tensor parsing error: x"),
    ]
    for inputs, message in cases:
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(_request("half_plus_two", inputs), timeout=60)
        assert caught.value.code() == INVALID, caught.value.details()
        assert message in caught.value.details(), (message, caught.value.details())


def test_tf_errors_quoting_non_utf8_request_bytes_stay_invalid_argument(stub):
    """ParseExample quotes an input it cannot parse; when those bytes are not UTF-8,
    TensorFlow's Python binding fails to decode its own message (UnicodeDecodeError):
    the answer is still the op's INVALID_ARGUMENT, not UNKNOWN (found by the random-shape
    test below)."""
    request = _request("half_plus_two", {"inputs": tf.make_tensor_proto(
        [b"\x94 not an example"], tf.string)}, "classify_x_to_y")
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(request, timeout=60)
    assert caught.value.code() == INVALID
    assert "Could not parse example input" in caught.value.details()


def test_tensorprotos_are_read_as_tf_reads_them(stub):
    """Tensor::FromProto: extra values ignored, the last one repeated, unknown_rank ignored,
    values in another field ignored (zeros), tensor_content winning over typed values."""
    def y(proto):
        response = stub.Predict(_request("half_plus_two", {"x": proto}), timeout=60)
        return tf.make_ndarray(response.outputs["y"]).tolist()

    shape = {"dim": [{"size": 2}]}
    assert y(tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=shape,
                                    float_val=[2.0, 4.0, 6.0])) == [3.0, 4.0]
    assert y(tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=shape,
                                    float_val=[2.0])) == [3.0, 3.0]
    assert y(tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=shape,
                                    int_val=[7, 7])) == [2.0, 2.0]
    unknown = {"dim": [{"size": 2}], "unknown_rank": True}
    assert y(tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=unknown,
                                    float_val=[2.0, 4.0])) == [3.0, 4.0]
    content = np.array([2.0, 4.0], np.float32).tobytes()
    assert y(tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=shape,
                                    tensor_content=content, float_val=[9.0])) == [3.0, 4.0]


def test_batching_refuses_what_tf_servings_batching_session_refuses(bases):
    server = serve_in_process([model_config.ServedModel("half_plus_two",
                                                        bases["half_plus_two"])],
                              enable_batching=True)
    try:
        channel = grpc.insecure_channel("127.0.0.1:%d" % server.port)
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(_request("half_plus_two", {"x": tf.make_tensor_proto(1.0)}),
                         timeout=60)
        assert caught.value.code() == INVALID
        assert "must have at least one dimension" in caught.value.details()
        response = stub.Predict(_request("half_plus_two",
                                         {"x": tf.make_tensor_proto([1.0, 2.0])}), timeout=60)
        assert list(response.outputs["y"].float_val) == [2.5, 3.0]
        channel.close()
    finally:
        server.stop()


def _conv_model(base):
    """x [None, 8, 8, 3] -> conv2d: TensorFlow 2.15's Conv2D kernel CHECK-fails (aborts
    the process) when fed a scalar, in tensorflow_model_server as anywhere."""
    path = os.path.join(base, "1")
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 8, 8, 3], name="x")
        y = tf.nn.conv2d(x, tf.ones([3, 3, 3, 4]), 1, "SAME", name="y")
        info = v1.saved_model.utils.build_tensor_info
        signature = v1.saved_model.signature_def_utils.build_signature_def(
            {"x": info(x)}, {"y": info(y)}, tf.saved_model.PREDICT_METHOD_NAME)
        with v1.Session(graph=graph) as session:
            builder = v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(
                session, [tf.saved_model.SERVING],
                signature_def_map={"serving_default": signature})
            builder.save()
    return base


def test_a_shape_a_kernel_would_abort_on_is_refused_by_shape_inference(tmp_path):
    """A shape the graph was not built for goes through TensorFlow's shape inference
    first, so the Conv2D abort becomes INVALID_ARGUMENT and the server lives on; shapes
    the shape functions accept still run (here a bigger image)."""
    base = _conv_model(str(tmp_path / "conv"))
    process, port, _ = start_server_process(
        ["--model_name=conv", "--model_base_path=%s" % base, "--rest_api_port=0",
         "--file_system_poll_wait_seconds=0"], prefix=["prlimit", "--as=%d" % (6 * 1024 ** 3)],
        stderr=subprocess.DEVNULL)
    try:
        channel = grpc.insecure_channel("127.0.0.1:%d" % port)
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(_request("conv", {"x": tf.make_tensor_proto(1.0)}), timeout=60)
        assert caught.value.code() == INVALID, caught.value.details()
        assert "rank 4" in caught.value.details(), caught.value.details()
        assert process.poll() is None
        big = stub.Predict(_request("conv", {"x": tf.make_tensor_proto(
            np.ones([1, 16, 16, 3], np.float32))}), timeout=60)
        assert [d.size for d in big.outputs["y"].tensor_shape.dim] == [1, 16, 16, 4]
        channel.close()
    finally:
        process.terminate()
        process.wait(timeout=60)


# --- random shapes at every signature, in a memory-capped server ----------------------

_DTYPE_ENUMS = {tf.float32: types_pb2.DT_FLOAT, tf.string: types_pb2.DT_STRING,
                tf.int64: types_pb2.DT_INT64, tf.int32: types_pb2.DT_INT32}


def _random_dims(rng):
    """Ranks 0-6 with small, zero and huge dimensions; now and then a huge-but-empty
    shape (a 0 before dimensions whose product would overflow) or a deep rank."""
    pick = rng.random()
    if pick < 0.08:
        return [0, 2 ** 40, 2 ** 40][:rng.randint(2, 3)]
    if pick < 0.12:
        return [2 ** 31, 0, 7]
    if pick < 0.15:
        return [1] * rng.choice([30, 254, 255])
    if pick < 0.2:
        return [rng.choice([2 ** 20, 2 ** 30, 2 ** 62])] * rng.randint(1, 3)
    dims = []
    for _ in range(rng.randint(0, 6)):
        dims.append(rng.choice([0, 1, 1, 2, 3, 5, 32, rng.randint(0, 64)]))
        while np.prod(dims, dtype=np.float64) > 2 ** 16:
            dims[-1] = max(dims[-1] // 4, 1)
    return dims


def _random_tensor(rng, dtype):
    dims = _random_dims(rng)
    proto = tensor_pb2.TensorProto(dtype=_DTYPE_ENUMS[dtype])
    for size in dims:
        proto.tensor_shape.dim.add(size=size)
    count = int(np.prod(dims, dtype=np.float64)) if dims else 1
    given = count if count <= 2 ** 16 else rng.choice([0, 1])
    if dtype == tf.string:
        proto.string_val.extend(rng.randbytes(rng.randint(0, 40)) for _ in range(given))
    elif dtype == tf.float32:
        proto.tensor_content = np.float32(np.random.RandomState(rng.randint(0, 99)).uniform(
            -300, 300, given)).tobytes() if given == count and count else b""
        if given != count:
            proto.float_val.extend([1.5] * given)
    else:
        getattr(proto, "int64_val" if dtype == tf.int64 else "int_val").extend(
            rng.randint(-5, 5) for _ in range(given))
    return proto


def _signatures(stub, model):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = model
    request.metadata_field.append("signature_def")
    response = stub.GetModelMetadata(request, timeout=60)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signatures)
    return signatures.signature_def


@pytest.mark.cost(12)
def test_random_shapes_at_every_signature_never_take_the_server_down(bases, export_dir,
                                                                      tmp_path):
    """Hundreds of random ranks and dimensions (0, huge, huge-but-empty, deeper than TF
    allows), right and wrong dtypes, at every signature of the demo model and of
    half_plus_two, over gRPC and REST, in a server capped at 8 GB of address space: each
    is answered OK or INVALID_ARGUMENT, and the server still answers afterwards."""
    config = tmp_path / "models.config"
    config.write_text("model_config_list {\n%s}\n" % "".join(
        '  config { name: "%s" base_path: "%s" model_platform: "tensorflow" }\n' % item
        for item in [("half_plus_two", bases["half_plus_two"]),
                     ("tiny", bases["tiny"]), ("demo", os.path.dirname(export_dir))]))
    cap = 8 * 1024 ** 3
    process, port, rest_port = start_server_process(
        ["--model_config_file=%s" % config, "--file_system_poll_wait_seconds=0"],
        prefix=["prlimit", "--as=%d" % cap], stderr=subprocess.DEVNULL)
    rng = random.Random(19)
    codes = {}
    try:
        channel = grpc.insecure_channel("127.0.0.1:%d" % port, options=[
            ("grpc.max_receive_message_length", 256 * 1024 * 1024)])
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for model in ("half_plus_two", "tiny", "demo"):
            for name, sig in sorted(_signatures(stub, model).items()):
                for attempt in range(40):
                    inputs = {}
                    for key, info in sig.inputs.items():
                        dtype = tf.as_dtype(info.dtype)
                        if attempt % 7 == 6:  # now and then the wrong dtype
                            dtype = tf.int64 if dtype != tf.int64 else tf.float32
                        inputs[key] = _random_tensor(rng, dtype)
                    try:
                        stub.Predict(_request(model, inputs, name), timeout=120)
                        code = grpc.StatusCode.OK
                    except grpc.RpcError as error:
                        code = error.code()
                        assert code == INVALID, (model, name, inputs.keys(), error.details())
                    codes[code] = codes.get(code, 0) + 1
                    assert process.poll() is None, "server died on %s %s" % (model, name)
                # REST: random nestings of the signature's first input.
                key = sorted(sig.inputs)[0]
                for attempt in range(10):
                    dims = [d for d in _random_dims(rng) if d < 8][:4]
                    value = np.zeros(dims).tolist() if dims else 0.0
                    status, _ = _rest_port(rest_port, model, name,
                                           {"inputs": {key: value}} if len(sig.inputs) > 1
                                           else {"instances": value if dims else [value]})
                    assert status in (200, 400), (model, name, dims, status)
                    assert process.poll() is None, "server died on REST %s %s" % (model, name)
        # Still serving, and right.
        response = stub.Predict(_request("half_plus_two", {"x": tf.make_tensor_proto(
            [[1.0], [2.0]])}), timeout=60)
        assert list(response.outputs["y"].float_val) == [2.5, 3.0]
        channel.close()
        print("answers by status over random shapes: %s" % {
            code.name: count for code, count in codes.items()})
        assert codes.get(grpc.StatusCode.OK, 0) > 20 and codes.get(INVALID, 0) > 20, codes
    finally:
        stop_process(process)


def _rest_port(port, model, signature, body):
    body = dict(body, signature_name=signature)
    url = "http://127.0.0.1:%d/v1/models/%s:predict" % (port, model)
    try:
        with urllib.request.urlopen(urllib.request.Request(
                url, data=json.dumps(body).encode()), timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
