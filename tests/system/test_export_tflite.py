"""slimserve-export --tflite on a real short training run: model.tflite of predict_images
beside the SavedModel, its parity recorded, and served with --prefer_tflite_model it
gives the SavedModel's classes."""
import json
import os

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.lite.python import schema_py_generated as schema
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_log_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from slimserve.estimator import preprocessing
from slimserve.estimator import run_files
from slimserve.estimator import splits
from slimserve.export import signatures
from slimserve.export import tflite
from slimserve.export import verify
from slimserve.serving.config.model_config import ServedModel
from slimserve.serving.core import servable as servable_lib
from slimserve.serving.core import tflite_model
from slimserve.testing.servers import serve_in_process
from tests.helpers import run_cli


@pytest.fixture(scope="module")
def tflite_export(trained_run, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("tflite_export"))
    out = run_cli("slimserve.cli.export", "--model_dir", trained_run, "--export_base", base,
                  "--tflite")
    return base, out.stdout.strip().splitlines()


def _validation_pixels(trained_run, digits_data, count=48):
    spec = preprocessing.Spec.from_dict(run_files.read(trained_run)["serving"])
    images, _ = splits.read_images(digits_data, "validation", count)
    return np.stack([preprocessing.decode_eval_pixels(
        encoded, spec.image_size, spec.style, spec.central_fraction).numpy()
        for encoded in images])


def _predict_images(port, pixels, signature=signatures.PREDICT_IMAGES):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "resnet"
    request.model_spec.signature_name = signature
    request.inputs[signatures.IMAGES].CopyFrom(tf.make_tensor_proto(pixels))
    with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            request, timeout=120)
    return (tf.make_ndarray(response.outputs[signatures.CLASSES]),
            tf.make_ndarray(response.outputs[signatures.PROBABILITIES]))


@pytest.mark.cost(22)
def test_export_writes_model_tflite_with_its_parity(tflite_export):
    base, lines = tflite_export
    version_dir = lines[-2]
    assert os.path.dirname(version_dir) == base
    assert lines[-1].startswith("tflite: 8/8 images agree (100.0%), max |dp| ")
    parity = json.load(open(os.path.join(version_dir, signatures.EXTRA_DIR,
                                         tflite.PARITY_FILE)))
    assert parity["tflite_images"] == 8 and parity["tflite_agreement"] == 1.0
    assert 0.0 <= parity["tflite_max_abs_probability_diff"] < 1e-3
    assert os.path.getsize(os.path.join(version_dir, "saved_model.pb")) > 0
    # The SignatureDef TF Serving reads: predict_images, keys, dtypes and shapes as the
    # SavedModel's, tensor names the converted model's.
    with open(os.path.join(version_dir, tflite_model.MODEL_FILENAME), "rb") as handle:
        defs = tflite_model.read_signature_defs(handle.read())
    assert set(defs) == {signatures.PREDICT_IMAGES}
    lite = defs[signatures.PREDICT_IMAGES]
    saved = servable_lib.Servable.load(version_dir)
    try:
        expected = saved.signatures[signatures.PREDICT_IMAGES]
    finally:
        saved.retire()
    assert lite.method_name == expected.method_name
    for mine, theirs in ((lite.inputs, expected.inputs), (lite.outputs, expected.outputs)):
        assert set(mine) == set(theirs)
        for key in mine:
            assert (mine[key].dtype, mine[key].tensor_shape) == (theirs[key].dtype,
                                                                  theirs[key].tensor_shape)
    # Warmup keeps only what both models answer: TF Serving fails a load on a warmup
    # record naming a signature the loaded model lacks.
    records = [prediction_log_pb2.PredictionLog.FromString(r) for r in
               tf.compat.v1.io.tf_record_iterator(os.path.join(version_dir,
                                                               servable_lib.WARMUP_PATH))]
    assert records and {r.predict_log.request.model_spec.signature_name
                        for r in records} == {signatures.PREDICT_IMAGES}


def test_served_with_prefer_tflite_model_it_gives_the_saved_models_classes(
        tflite_export, trained_run, digits_data):
    base, _ = tflite_export
    pixels = _validation_pixels(trained_run, digits_data)
    answers = {}
    for prefer in (False, True):
        server = serve_in_process([ServedModel("resnet", base)], prefer_tflite_model=prefer,
                                  rest_api_port=0)
        try:
            answers[prefer] = _predict_images(server.port, pixels)
            if prefer:  # the image_bytes signature stays with the SavedModel
                with pytest.raises(grpc.RpcError) as missing:
                    _predict_images(server.port, pixels, signatures.DEFAULT)
                assert missing.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        finally:
            server.stop()
    np.testing.assert_array_equal(answers[True][0], answers[False][0])
    np.testing.assert_allclose(answers[True][1], answers[False][1], atol=1e-4)


def test_a_tflite_model_that_disagrees_fails_the_parity_check(tflite_export, trained_run,
                                                              digits_data, tmp_path):
    """The same check, on a copy whose model.tflite float weights are replaced by noise:
    agreement falls below the bar, the export would fail, and the figures are still
    recorded."""
    import shutil  # pylint: disable=import-outside-toplevel
    from tensorflow.lite.tools import flatbuffer_utils  # pylint: disable=import-outside-toplevel
    _, lines = tflite_export
    copy = str(tmp_path / "1")
    shutil.copytree(lines[-2], copy)
    path = os.path.join(copy, tflite_model.MODEL_FILENAME)
    model = flatbuffer_utils.read_model(path)
    rng = np.random.RandomState(1)
    for tensor in model.subgraphs[0].tensors:
        data = model.buffers[tensor.buffer].data
        if tensor.type == schema.TensorType.FLOAT32 and data is not None and len(data):
            noise = rng.normal(0.0, 0.05, len(data) // 4).astype(np.float32)
            model.buffers[tensor.buffer].data = noise.view(np.uint8)
    flatbuffer_utils.write_model(model, path)
    spec = preprocessing.Spec.from_dict(run_files.read(trained_run)["serving"])
    images, _ = splits.read_images(digits_data, "validation", 48)
    with pytest.raises(verify.ExportVerificationError, match="below --tflite_min_agreement"):
        tflite.check_parity(copy, images, spec, 0.99)
    recorded = tflite.read_parity(copy)
    assert recorded["tflite_images"] == 48 and recorded["tflite_agreement"] < 0.99


def test_a_full_disk_is_one_line_and_nothing_is_published(trained_run, tmp_path):
    """--tflite onto a disk that fills while the version is written: one line naming
    --export_base and why (it was a 34-line traceback), no version and no temporary."""
    from tests.system.test_request_log_durability import small_tmpfs  # pylint: disable=import-outside-toplevel
    with small_tmpfs(str(tmp_path / "disk"), 8 << 20) as disk:
        base = os.path.join(disk, "export")
        out = run_cli("slimserve.cli.export", "--model_dir", trained_run, "--export_base",
                      base, "--tflite", check=False)
        assert out.returncode == 1, out.stderr[-2000:]
        assert out.stdout == ""
        lines = out.stderr.strip().splitlines()
        assert lines[-1].startswith("slimserve-export: --export_base %s: " % base), lines[-3:]
        assert "No space left on device" in lines[-1] and "Traceback" not in out.stderr
        assert os.listdir(base) == []  # nothing published, no temporary left
