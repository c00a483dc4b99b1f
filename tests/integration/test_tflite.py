"""--prefer_tflite_model: versions served from model.tflite with tf.lite.Interpreter, as
TF Serving 2.15.1's TfLiteSession serves them (its suite's testPredictOnTfLite and
testPredictWithSignatureDefOnTfLite, on models the tests convert themselves)."""
import concurrent.futures
import json
import os
import subprocess
import sys
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.lite.python import schema_py_generated as schema
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from slimserve import errors as user_errors
from slimserve.serving.config.model_config import ServedModel
from slimserve.serving.core import errors
from slimserve.serving.core import tflite_model
from slimserve.serving.core import tflite_servable
from slimserve.serving.core import version_dirs
from slimserve.testing import tflite_models
from slimserve.testing import tiny_models
from slimserve.testing.servers import serve_in_process, wait_until
from tests.helpers import ROOT

DEFAULT = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY


@pytest.fixture(scope="module")
def plain_base(tmp_path_factory):
    base = tmp_path_factory.mktemp("half_plus_two_tflite")
    tflite_models.half_plus_two(base)
    return str(base)


@pytest.fixture(scope="module")
def sigdef_base(tmp_path_factory):
    base = tmp_path_factory.mktemp("half_plus_two_tflite_with_sigdef")
    tflite_models.half_plus_two(base, signature_defs=True)
    return str(base)


def _predict(port, x, signature=DEFAULT, model="default", output_filter=()):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.asarray(x, np.float32)))
    request.output_filter.extend(output_filter)
    with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
        return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            request, timeout=30)


def _metadata(port, model="default"):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = model
    request.metadata_field.append("signature_def")
    with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(
            channel).GetModelMetadata(request, timeout=30)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signatures)
    return response, signatures.signature_def


# --- the metadata format ----------------------------------------------------------------

def test_signature_defs_round_trip_through_the_model_metadata():
    data = tflite_models.half_plus_two_bytes("tflite_input")
    assert tflite_model.read_signature_defs(data) == {}
    first = {DEFAULT: tflite_models.signature_def("tflite_input:0")}
    written = tflite_model.with_signature_defs(data, first)
    assert tflite_model.read_signature_defs(written) == first
    # Setting them again replaces the entry (one metadata entry, one buffer more at most)
    second = {"other": tflite_models.signature_def("tflite_input")}
    rewritten = tflite_model.with_signature_defs(written, second)
    assert tflite_model.read_signature_defs(rewritten) == second
    model = schema.Model.GetRootAsModel(rewritten, 0)
    names = [model.Metadata(i).Name() for i in range(model.MetadataLength())]
    assert names.count(tflite_model.SIGNATURE_DEFS_METADATA.encode()) == 1
    # The interpreter still runs the rewritten model
    interpreter = tf.lite.Interpreter(model_content=rewritten)
    interpreter.allocate_tensors()


def test_a_signature_tf_serving_would_cut_short_is_refused_when_written():
    """TF Serving reads each SignatureDef up to its first NUL byte (c_str()); a scalar
    TensorInfo serializes with one, so the writer refuses it rather than write a model
    TF Serving misreads."""
    data = tflite_models.half_plus_two_bytes()
    with pytest.raises(ValueError, match="NUL byte"):
        tflite_model.with_signature_defs(data, {DEFAULT: tflite_models.signature_def(
            "x:0", shape=())})
    with pytest.raises(ValueError, match="should not be empty"):
        tflite_model.with_signature_defs(data, {})
    with pytest.raises(ValueError, match="not a TFLite model"):
        tflite_model.read_signature_defs(b"definitely not a flatbuffer")


# --- the servable -----------------------------------------------------------------------

def test_a_model_without_signature_defs_gets_tf_servings_generated_one(plain_base):
    servable = tflite_servable.TfLiteServable.load(os.path.join(plain_base, "123"))
    try:
        assert (servable.name, servable.version) == (os.path.basename(plain_base), 123)
        assert set(servable.signatures) == {DEFAULT}
        signature = servable.signatures[DEFAULT]
        assert signature.method_name == tf.saved_model.PREDICT_METHOD_NAME
        assert {k: v.name for k, v in signature.inputs.items()} == {"x": "x"}
        assert {k: v.name for k, v in signature.outputs.items()} == {"y": "y"}
        assert [d.size for d in signature.inputs["x"].tensor_shape.dim] == [1, 1]
        with pytest.raises(errors.ServingError) as missing:
            servable.signature("nope")
        assert missing.value.code == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        servable.retire()


def test_inputs_are_resized_to_whatever_the_request_sends(sigdef_base):
    """TF Serving resizes the interpreter's input to the request's shape and lets the
    model decide: [1], [3, 1] and [2, 2] all run on a [1, 1] input."""
    servable = tflite_servable.TfLiteServable.load(os.path.join(sigdef_base, "123"))
    try:
        _, signature = servable.signature(tflite_models.NAMED_SIGNATURE)
        for x in ([2.0], [[1.0], [2.0], [5.0]], [[2.0, 4.0], [6.0, 8.0]], [[2.0]]):
            got = servable.run(signature, {"x": np.array(x, np.float32)}, ["y"])["y"]
            np.testing.assert_allclose(got, np.array(x) / 2 + 2)
            assert got.shape == np.array(x).shape
        with pytest.raises(errors.ServingError) as wrong_type:
            servable.run(signature, {"x": np.array([[2.0]], np.float64)}, ["y"])
        assert wrong_type.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "float32" in wrong_type.value.message
        broken = meta_graph_pb2.SignatureDef()
        broken.CopyFrom(signature)
        broken.outputs["y"].name = "no_such_tensor:0"
        with pytest.raises(errors.ServingError) as unknown:
            servable.run(broken, {"x": np.array([[2.0]], np.float32)}, ["y"])
        assert unknown.value.code == grpc.StatusCode.INTERNAL
        assert "Missing output TFLite tensor: no_such_tensor:0" in unknown.value.message
    finally:
        servable.retire()


def test_a_model_with_custom_ops_fails_to_load_naming_them(tmp_path):
    """Select TF ("Flex") ops run in TF's Python interpreter but not in TF Serving: such a
    model must not load here either."""

    class Join(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def __call__(self, text):
            return {"joined": tf.strings.join([text, text])}

    module = Join()
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [module.__call__.get_concrete_function()], module)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS,
                                           tf.lite.OpsSet.SELECT_TF_OPS]
    path = tmp_path / "1"
    path.mkdir()
    (path / "model.tflite").write_bytes(converter.convert())
    with pytest.raises(errors.ServingError, match="FlexStringJoin") as refused:
        tflite_servable.TfLiteServable.load(str(path))
    assert refused.value.code == grpc.StatusCode.INTERNAL


def test_interpreters_per_pool_split_large_requests_and_merge_small_ones(plain_base):
    """--num_tflite_interpreters_per_pool=4: pieces of at most 500/4 = 125 rows, run over
    the pool; every request gets exactly its own rows back."""
    servable = tflite_servable.TfLiteServable.load(
        os.path.join(plain_base, "123"), tflite_servable.TfLiteOptions(2, 4))
    batcher = servable.session.batcher  # the server's one scheduler, core/batching/
    try:
        _, signature = servable.signature("")
        rows = np.arange(300, dtype=np.float32).reshape(300, 1)
        got = servable.run(signature, {"x": rows}, ["y"])["y"]
        np.testing.assert_allclose(got, rows / 2 + 2)
        assert batcher.batches_run == 3 and sorted(batcher.batch_rows) == [50, 125, 125]

        def client(worker):
            for i in range(25):
                value = float(worker * 100 + i)
                out = servable.run(signature, {"x": np.array([[value]], np.float32)}, ["y"])
                assert out["y"].tolist() == [[value / 2 + 2]]
        before = batcher.batches_run
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(client, range(8)))
        assert batcher.batches_run - before < 200  # some of the 200 requests merged
    finally:
        servable.retire()


def test_the_scheduler_queue_is_bounded_per_interpreter(plain_base):
    """500 interpreters per pool: pieces of one row; one interpreter queues at most 100
    batches, so a 101-row request is UNAVAILABLE (TF Serving's full queue), a 100-row one
    runs, and an empty input runs alone, beside the scheduler."""
    servable = tflite_servable.TfLiteServable.load(
        os.path.join(plain_base, "123"), tflite_servable.TfLiteOptions(1, 500))
    try:
        _, signature = servable.signature("")
        with pytest.raises(errors.ServingError) as full:
            servable.run(signature, {"x": np.zeros([101, 1], np.float32)}, ["y"])
        assert full.value.code == grpc.StatusCode.UNAVAILABLE
        rows = np.arange(100, dtype=np.float32).reshape(100, 1)
        np.testing.assert_allclose(servable.run(signature, {"x": rows}, ["y"])["y"],
                                   rows / 2 + 2)
        assert max(servable.session.batcher.batch_rows) == 1
        before = servable.session.batcher.batches_run
        assert servable.run(signature, {"x": np.zeros([0, 1], np.float32)},
                            ["y"])["y"].shape[0] == 0
        assert servable.session.batcher.batches_run == before
    finally:
        servable.retire()


def test_options_are_bounded():
    with pytest.raises(user_errors.UserError, match="--num_tflite_pools"):
        tflite_servable.TfLiteOptions(10 ** 6, 1).check()
    with pytest.raises(user_errors.UserError, match="--num_tflite_interpreters_per_pool"):
        tflite_servable.TfLiteOptions(1, -1).check()


# --- the server -------------------------------------------------------------------------

def test_version_directories_with_only_model_tflite_count_with_the_flag(plain_base):
    assert version_dirs.list_version_dirs(plain_base) == {}
    assert version_dirs.list_version_dirs(plain_base, accept_tflite=True) == {
        123: os.path.join(plain_base, "123")}


@pytest.mark.parametrize("with_signature_defs", [False, True])
def test_predict_and_metadata_on_tflite(plain_base, sigdef_base, with_signature_defs):
    """TF Serving's testPredictOnTfLite / testPredictWithSignatureDefOnTfLite: model
    `default`, --prefer_tflite_model, x = 2.0 -> y = 3.0 from version 123, on gRPC and
    REST; GetModelMetadata lists the signatures TF Serving shows."""
    base = sigdef_base if with_signature_defs else plain_base
    server = serve_in_process([ServedModel("default", base)], prefer_tflite_model=True,
                              num_tflite_pools=2)
    try:
        response = _predict(server.port, [[2.0]], output_filter=["y"])
        assert response.outputs["y"].float_val == [3.0]
        assert (response.model_spec.version.value, response.model_spec.signature_name) == (
            123, DEFAULT)
        metadata, signature_defs = _metadata(server.port)
        assert metadata.model_spec.version.value == 123
        expected = {DEFAULT, tflite_models.NAMED_SIGNATURE} if with_signature_defs else {
            DEFAULT}
        assert set(signature_defs) == expected
        assert signature_defs[DEFAULT].inputs["x"].name == (
            "tflite_input" if with_signature_defs else "x")
        if with_signature_defs:
            named = _predict(server.port, [[6.0]], tflite_models.NAMED_SIGNATURE)
            assert named.outputs["y"].float_val == [5.0]
            assert named.model_spec.signature_name == tflite_models.NAMED_SIGNATURE
        url = "http://127.0.0.1:%d/v1/models/default:predict" % server.rest_api_port
        body = json.dumps({"instances": [[2.0]]}).encode()
        with urllib.request.urlopen(url, body, timeout=30) as answer:
            assert json.load(answer) == {"predictions": [[3.0]]}
    finally:
        server.stop()


def test_predict_sends_the_suites_rank_one_input(plain_base):
    """The suite's exact request: x of shape [1] (the model's input is [1, 1]); TF Serving
    resizes and answers one value."""
    server = serve_in_process([ServedModel("default", plain_base)], prefer_tflite_model=True)
    try:
        response = _predict(server.port, [2.0], output_filter=["y"])
        assert response.outputs["y"].float_val == [3.0]
    finally:
        server.stop()


def test_without_the_flag_the_saved_model_is_served(tmp_path):
    """A version holding both files serves its SavedModel unless --prefer_tflite_model;
    with it, the TFLite model (and its signatures) answer."""
    path = tiny_models.write_tiny_model(str(tmp_path), version=7)
    with open(os.path.join(path, "model.tflite"), "wb") as handle:
        handle.write(tflite_models.half_plus_two_bytes())
    for prefer, signatures in ((False, {"serving_default", "classify", "regress"}),
                               (True, {"serving_default"})):
        server = serve_in_process([ServedModel("default", str(tmp_path))],
                                  prefer_tflite_model=prefer, rest_api_port=0)
        try:
            assert set(_metadata(server.port)[1]) == signatures
        finally:
            server.stop()


def test_a_tflite_version_that_cannot_load_shows_its_error(tmp_path):
    server = serve_in_process([ServedModel("default", str(tmp_path))],
                              prefer_tflite_model=True, rest_api_port=0,
                              max_num_load_retries=0, file_system_poll_wait_seconds=0.2)
    try:
        # published once serving (a server started with it alone exits, as TF Serving's)
        path = tmp_path / "5.partial"
        path.mkdir()
        (path / "model.tflite").write_bytes(b"\0" * 64)
        path.rename(tmp_path / "5")
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = "default"

        def status_of_5():
            try:
                found = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
                    request, timeout=30).model_version_status[0]
            except grpc.RpcError:  # NOT_FOUND until the poll sees it
                return None
            return found if found.status.error_message else None

        with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
            status = wait_until(status_of_5, message="version 5's status")
        assert status.version == 5
        assert "not a TFLite model" in status.status.error_message
    finally:
        server.stop()


_HOSTILE = r"""
import json, sys
import numpy as np
from slimserve.serving.core import errors, tflite_servable
servable = tflite_servable.TfLiteServable.load(sys.argv[1])
_, signature = servable.signature("")
rng = np.random.RandomState(0)
codes = {}
for i in range(300):
    rank = rng.randint(0, 6)
    dims = [int(rng.choice([0, 1, 2, 3, 7, 1 << 20, 1 << 31])) for _ in range(rank)]
    if np.prod([float(d) for d in dims]) > 1 << 22:
        dims[rng.randint(rank)] = 0  # huge but empty: nothing to allocate on our side
    try:
        x = np.zeros(dims, np.float32)
    except ValueError:  # numpy refuses the shape itself (its nonzero dims overflow)
        continue
    try:
        servable.run(signature, {"x": x}, ["y"])
        code = "OK"
    except errors.ServingError as error:
        code = error.code.name
    codes[code] = codes.get(code, 0) + 1
out = servable.run(signature, {"x": np.array([[2.0]], np.float32)}, ["y"])["y"]
print(json.dumps({"codes": codes, "last": out.tolist()}))
"""


def test_hostile_shapes_never_take_the_process_down(plain_base):
    """Random ranks and dimensions (0 and huge-but-empty ones) reach the interpreter's
    resize in a memory-capped process: each gets an answer or a status, and the model
    still answers afterwards."""
    process = subprocess.run(
        ["prlimit", "--as=4000000000", sys.executable, "-c", _HOSTILE,
         os.path.join(plain_base, "123")], capture_output=True, text=True, timeout=600,
        cwd=ROOT)
    assert process.returncode == 0, process.stderr[-3000:]
    result = json.loads(process.stdout.strip().splitlines()[-1])
    assert result["last"] == [[3.0]]
    assert set(result["codes"]) <= {"OK", "INTERNAL", "INVALID_ARGUMENT"}
    assert result["codes"].get("OK") and result["codes"].get("INTERNAL"), result
