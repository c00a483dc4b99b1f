"""The OpenVINO runtime on the session's real short training run (digits, 32x32):
slimserve-export --openvino writes openvino/model.xml with its parity; a model whose
config says model_platform "openvino" answers predict_images, serving_default (JPEG
bytes, gRPC and REST) and classify (tf.Examples) on loopback with the classes and
probabilities TensorFlow gives, the network run on OpenVINO once per batch;
--prefer_openvino_model converts a version without an IR at load; a broken IR, or a model
OpenVINO cannot take, is served by TensorFlow after one log line; the metrics name each
version's runtime; bf16 says when this CPU lacks it; int8 is refused, saying by how much,
when it fails its accuracy guard. Cost: one export, two in-process servers, a few
servables, one NNCF quantization (~20 s). Skipped where openvino is not installed."""
import base64
import concurrent.futures
import logging
import os
import re
import shutil
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import classification_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from slimserve import cpu
from slimserve import errors as user_errors
from slimserve.estimator import preprocessing
from slimserve.estimator import run_files
from slimserve.estimator import schema
from slimserve.estimator import splits
from slimserve.export import openvino as ov_export
from slimserve.export import run_export
from slimserve.export import signatures
from slimserve.serving import options as options_lib
from slimserve.serving.config import files
from slimserve.serving.config import model_config
from slimserve.serving.core import batching
from slimserve.serving.core import deadlines
from slimserve.serving.core import errors
from slimserve.serving.core import openvino_model
from slimserve.serving.core import openvino_servable
from slimserve.serving.core import servable as servable_lib
from slimserve.serving.observability import metrics
from slimserve.testing import image_classifiers
from slimserve.testing.servers import serve_in_process
from tests.helpers import IMAGE_SIZE, rest_json, run_cli

pytest.importorskip("openvino")

# fp32 on OpenVINO against TensorFlow: the same float32 network, other kernels (max |dp|
# measured 2e-13 here at 32x32, 2.4e-6 at 224): a probability may move by this much.
PROBABILITY_TOLERANCE = 1e-4
IMAGES = 24  # validation images sent through each signature


@pytest.fixture(scope="module")
def ir_export(trained_run, tmp_path_factory):
    """slimserve-export --openvino -> (base, version dir, stdout lines)."""
    base = str(tmp_path_factory.mktemp("openvino_export"))
    out = run_cli("slimserve.cli.export", "--model_dir", trained_run, "--export_base", base,
                  "--openvino", "--reference_images", 32)
    lines = out.stdout.strip().splitlines()
    return base, lines[-2], lines


@pytest.fixture(scope="module")
def validation(trained_run, digits_data):
    """(encoded images, labels, evaluation pixels) of IMAGES validation images spread over
    the split (it is stored class by class)."""
    spec = preprocessing.Spec.from_dict(run_files.read(trained_run)["serving"])
    images, labels = splits.read_images(digits_data, schema.VALIDATION)
    step = len(images) // IMAGES
    images, labels = images[::step][:IMAGES], labels[::step][:IMAGES]
    return images, labels, ov_export.pixels_of(images, spec)


def _answers(server, model, validation):
    """What `model` answers on loopback: {call: tuple of arrays} for predict_images and
    serving_default over gRPC, serving_default over REST, and classify over gRPC."""
    images, _, pixels = validation
    out = {}
    with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for name, key, value in ((signatures.PREDICT_IMAGES, signatures.IMAGES,
                                  tf.make_tensor_proto(pixels)),
                                 (signatures.DEFAULT, signatures.IMAGE_BYTES,
                                  tf.make_tensor_proto(images, tf.string))):
            request = predict_pb2.PredictRequest()
            request.model_spec.name = model
            request.model_spec.signature_name = name
            request.inputs[key].CopyFrom(value)
            response = stub.Predict(request, timeout=120)
            out[name] = tuple(tf.make_ndarray(response.outputs[key]) for key in (
                signatures.CLASSES, signatures.PROBABILITIES, signatures.CLASS_NAMES))
        request = classification_pb2.ClassificationRequest()
        request.model_spec.name = model
        request.model_spec.signature_name = signatures.CLASSIFY
        for encoded in images:
            request.input.example_list.examples.add().CopyFrom(schema.make_example(
                encoded, "jpeg", 0, "", IMAGE_SIZE, IMAGE_SIZE))
        rows = stub.Classify(request, timeout=120).result.classifications
        out[signatures.CLASSIFY] = (np.array([[c.label for c in row.classes] for row in rows]),
                                    np.array([[c.score for c in row.classes] for row in rows]))
    status, body = rest_json(server.rest_api_port, "/v1/models/%s:predict" % model, {
        "instances": [{"b64": base64.b64encode(encoded).decode()} for encoded in images]})
    assert status == 200, body
    out["rest"] = (np.array([p[signatures.CLASSES] for p in body["predictions"]]),
                   np.array([p[signatures.PROBABILITIES] for p in body["predictions"]]))
    return out


def _runtime_line(server, model):
    (line,) = [line for line in server.metrics.render().splitlines()
               if line.startswith(metrics.MODEL_RUNTIME + "{")
               and 'model_name="%s"' % model in line]
    return line


def _count_runs(monkeypatch):
    """A list that gets the batch size of every network run on OpenVINO from now on."""
    runs = []
    real = openvino_model.run_compiled
    monkeypatch.setattr(openvino_model, "run_compiled",
                        lambda request, images: runs.append(len(images)) or real(request,
                                                                                 images))
    return runs


def _copy(version_dir, tmp_path, keep_ir=True):
    """A copy of the version as `<tmp>/base/1` (without its IR unless keep_ir)."""
    copy = str(tmp_path / "base" / "1")
    shutil.copytree(version_dir, copy, ignore=None if keep_ir else
                    shutil.ignore_patterns(os.path.dirname(openvino_model.MODEL_FILE)))
    return copy


def _tensorflow(version_dir, signature, feeds, keys):
    servable = servable_lib.Servable("tf", 1, version_dir)
    try:
        return servable.run(servable.signatures[signature], feeds, keys)
    finally:
        servable.retire()


@pytest.mark.cost(30)
def test_export_writes_the_ir_with_its_parity(ir_export):
    _, version_dir, lines = ir_export
    for name in (openvino_model.MODEL_FILE, openvino_model.MODEL_FILE[:-4] + ".bin"):
        assert os.path.getsize(os.path.join(version_dir, name)) > 0
    assert lines[-1].startswith("openvino: 8/8 images agree (100.0%), max |dp| "), lines
    parity = ov_export.read_parity(version_dir)
    assert parity["openvino_images"] == 8 and parity["openvino_agreement"] == 1.0
    assert 0.0 <= parity["openvino_max_abs_probability_diff"] < PROBABILITY_TOLERANCE
    # The IR maps the decoded images to the tensors the signatures' outputs come from.
    model = openvino_model.read(version_dir)
    images, outputs = openvino_model.names(model)
    servable = servable_lib.Servable("tf", 1, version_dir)
    try:
        sig = servable.signatures[signatures.PREDICT_IMAGES]
        assert images == sig.inputs[signatures.IMAGES].name
        assert {sig.outputs[signatures.PROBABILITIES].name,
                sig.outputs[signatures.CLASSES].name} <= set(outputs)
        assert servable.signatures[signatures.EMBEDDINGS_SIGNATURE].outputs[
            signatures.EMBEDDINGS].name in outputs
    finally:
        servable.retire()
    assert sorted(os.listdir(os.path.dirname(os.path.join(
        version_dir, openvino_model.MODEL_FILE)))) == ["model.bin", "model.xml"]


@pytest.mark.cost(10)
def test_a_model_on_openvino_answers_every_signature_as_tensorflow(ir_export, validation,
                                                                    monkeypatch):
    """Two models on one export in one server: "resnet" on TensorFlow, "resnet_ov" with
    model_platform "openvino". Same classes and class names, probabilities within
    PROBABILITY_TOLERANCE, on every signature and both APIs; the network ran on OpenVINO
    once per request (the decoding and parsing before it in TensorFlow)."""
    base, _, _ = ir_export
    runs = _count_runs(monkeypatch)
    server = serve_in_process([model_config.ServedModel("resnet", base),
                               model_config.ServedModel("resnet_ov", base,
                                                        platform="openvino")])
    try:
        assert 'runtime="tensorflow"' in _runtime_line(server, "resnet")
        line = _runtime_line(server, "resnet_ov")
        assert 'runtime="openvino"' in line and 'precision="fp32"' in line
        del runs[:]  # warmup's
        expected = _answers(server, "resnet", validation)
        assert runs == []
        served = _answers(server, "resnet_ov", validation)
        assert runs == [IMAGES] * 4  # predict_images, serving_default, classify, REST
    finally:
        server.stop()
    for call, values in expected.items():
        np.testing.assert_array_equal(served[call][0], values[0], err_msg=call)
        np.testing.assert_allclose(served[call][1], values[1], atol=PROBABILITY_TOLERANCE,
                                   err_msg=call)
        if len(values) > 2:
            np.testing.assert_array_equal(served[call][2], values[2], err_msg=call)
    assert len(set(expected[signatures.PREDICT_IMAGES][0])) > 1  # real, varied answers


@pytest.mark.cost(12)
def test_a_version_without_an_ir_is_converted_at_load_and_batched(ir_export, validation,
                                                                   tmp_path, caplog,
                                                                   monkeypatch):
    """--prefer_openvino_model on a copy without openvino/: converted at load (the copy
    left as it was); with --enable_batching, four concurrent 6-row requests reach OpenVINO
    merged (one run per batch, 24 rows in all) and each gets TensorFlow's answer."""
    _, version_dir, _ = ir_export
    copy = _copy(version_dir, tmp_path, keep_ir=False)
    _, _, pixels = validation
    runs = _count_runs(monkeypatch)
    parameters = batching.BatchingParameters(max_batch_size=IMAGES,
                                             batch_timeout_micros=2000000)
    with caplog.at_level(logging.INFO):
        server = serve_in_process([model_config.ServedModel("resnet", os.path.dirname(copy))],
                                  prefer_openvino_model=True, rest_api_port=0,
                                  enable_model_warmup=False, enable_batching=True,
                                  batching_parameters=parameters)
    try:
        assert 'runtime="openvino"' in _runtime_line(server, "resnet")

        def predict(rows):
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "resnet"
            request.model_spec.signature_name = signatures.PREDICT_IMAGES
            request.inputs[signatures.IMAGES].CopyFrom(tf.make_tensor_proto(rows))
            with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
                return tf.make_ndarray(prediction_service_pb2_grpc.PredictionServiceStub(
                    channel).Predict(request, timeout=120).outputs[signatures.PROBABILITIES])

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            parts = list(pool.map(predict, [pixels[i:i + 6] for i in range(0, IMAGES, 6)]))
    finally:
        server.stop()
    assert [r for r in caplog.records if "converted at load" in r.getMessage()]
    assert not os.path.exists(os.path.join(copy, openvino_model.MODEL_FILE))  # read-only
    assert sum(runs) == IMAGES and len(runs) < 4, runs
    expected = _tensorflow(copy, signatures.PREDICT_IMAGES, {signatures.IMAGES: pixels},
                           [signatures.PROBABILITIES])[signatures.PROBABILITIES]
    np.testing.assert_allclose(np.concatenate(parts), expected, atol=PROBABILITY_TOLERANCE)


@pytest.mark.cost(8)
def test_concurrent_runs_keep_tensorflow_off_the_cores_openvino_computes_on(
        ir_export, validation, monkeypatch):
    """Two batch threads running serving_default at once on a version with one
    InferRequest (the latency hint): each run holds it from its JPEG decoding to its class
    names, so neither run's TensorFlow steps fall inside the other's network run (on 2
    cores they took OpenVINO's threads: served int8 at 224 lost a tenth); both answers are
    TensorFlow's."""
    _, version_dir, _ = ir_export
    images, _, _ = validation
    spans = []  # (thread, "tf" or "openvino", start, end)
    real_run, real_infer = servable_lib.Servable.run, openvino_model.run_compiled

    def timed(kind, call):
        def wrapper(*args, **kwargs):
            start = time.monotonic()
            try:
                return call(*args, **kwargs)
            finally:
                spans.append((threading.get_ident(), kind, start, time.monotonic()))
        return wrapper

    def slow_infer(request, pixels):  # long enough for the other thread's TF step to start
        time.sleep(0.3)
        return real_infer(request, pixels)

    servable = openvino_servable.OpenVinoServable("resnet", 1, version_dir)
    try:
        monkeypatch.setattr(servable_lib.Servable, "run", timed("tf", real_run))
        monkeypatch.setattr(openvino_model, "run_compiled", timed("openvino", slow_infer))
        signature_def = servable.signatures[signatures.DEFAULT]
        feeds = {signatures.IMAGE_BYTES: np.array(images[:8], dtype=object)}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: servable.run(
                signature_def, feeds, [signatures.CLASSES]), range(2)))
    finally:
        monkeypatch.undo()
        servable.retire()
    assert len({thread for thread, _, _, _ in spans}) == 2
    for thread, kind, start, end in spans:
        if kind == "openvino":
            inside = [s for s in spans if s[0] != thread and s[2] < end and s[3] > start]
            assert not inside, (spans, inside)
    expected = _tensorflow(version_dir, signatures.DEFAULT, feeds, [signatures.CLASSES])
    for answer in answers:
        np.testing.assert_array_equal(answer[signatures.CLASSES],
                                      expected[signatures.CLASSES])


@pytest.mark.cost(4)
def test_a_run_whose_deadline_passes_while_another_holds_openvino_is_deadline_exceeded(
        ir_export, validation, monkeypatch):
    """While one run holds the version's only InferRequest (its network slowed to 2 s), a
    run with a 0.3 s deadline gives up waiting for it: DEADLINE_EXCEEDED naming the
    deadline's source, while the first run is still computing; the first still answers."""
    _, version_dir, _ = ir_export
    _, _, pixels = validation
    real_infer = openvino_model.run_compiled
    started = threading.Event()

    def slow_infer(request, images):
        started.set()
        time.sleep(2.0)
        return real_infer(request, images)

    servable = openvino_servable.OpenVinoServable("resnet", 1, version_dir)
    try:
        monkeypatch.setattr(openvino_model, "run_compiled", slow_infer)
        signature_def = servable.signatures[signatures.PREDICT_IMAGES]
        feeds = {signatures.IMAGES: pixels[:4]}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(servable.run, signature_def, feeds, [signatures.CLASSES])
            assert started.wait(60)
            with pytest.raises(errors.ServingError) as caught:
                servable.run(signature_def, feeds, [signatures.CLASSES],
                             deadlines.Deadline(0.3, "the test's deadline"))
            gave_up_first = not first.done()
            assert first.result(timeout=60)[signatures.CLASSES].shape == (4,)
    finally:
        monkeypatch.undo()
        servable.retire()
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "the test's deadline" in str(caught.value)
    assert gave_up_first  # it did not wait for the held request to come back


def test_a_broken_ir_is_served_by_tensorflow_after_one_line(ir_export, validation, tmp_path,
                                                            caplog):
    _, version_dir, _ = ir_export
    copy = _copy(version_dir, tmp_path)
    with open(os.path.join(copy, openvino_model.MODEL_FILE), "w") as handle:
        handle.write("<net name='half written'><layers>")
    _, _, pixels = validation
    with caplog.at_level(logging.WARNING):
        servable = openvino_servable.OpenVinoServable("resnet", 1, copy)
    try:
        assert servable.runtime == openvino_servable.TENSORFLOW
        served = servable.run(servable.signatures[signatures.PREDICT_IMAGES],
                              {signatures.IMAGES: pixels}, [signatures.PROBABILITIES])
    finally:
        servable.retire()
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.startswith("model resnet version 1: OpenVINO cannot serve it (openvino/"
                           "model.xml does not read: ") and line.endswith(
                               "; TensorFlow serves it"), line
    expected = _tensorflow(copy, signatures.PREDICT_IMAGES, {signatures.IMAGES: pixels},
                           [signatures.PROBABILITIES])
    np.testing.assert_array_equal(served[signatures.PROBABILITIES],
                                  expected[signatures.PROBABILITIES])


def test_a_model_without_predict_images_is_served_by_tensorflow(tmp_path, caplog):
    """A model whose network input is not known (no predict_images signature)."""
    path = image_classifiers.write_image_classifier(
        str(tmp_path), 1, np.zeros([64, 2]), np.zeros([2]), ["a", "b"])
    with caplog.at_level(logging.WARNING):
        servable = openvino_servable.OpenVinoServable("tiny", 1, path)
    servable.retire()
    assert servable.runtime == openvino_servable.TENSORFLOW
    assert any("no 'predict_images' signature" in r.getMessage() for r in caplog.records)


def test_bf16_and_int8_say_when_they_cannot_run(ir_export, caplog):
    """bf16 on a CPU without AVX512_BF16/AMX (this AVX2 machine), and int8 on a version
    without its int8 IR: one line each, and the version runs fp32 on OpenVINO."""
    _, version_dir, _ = ir_export
    for precision in (openvino_model.BF16, openvino_model.INT8):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            servable = openvino_servable.OpenVinoServable(
                "resnet", 1, version_dir,
                options=openvino_servable.OpenVinoOptions(precision=precision))
        servable.retire()
        assert servable.runtime == openvino_servable.OPENVINO
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        if precision == openvino_model.BF16 and cpu.cpu_supports_bf16():
            assert servable.precision == openvino_model.BF16 and lines == []
            continue
        assert servable.precision == openvino_model.FP32
        assert len(lines) == 1 and lines[0].endswith("OpenVINO runs it in fp32"), lines
        if precision == openvino_model.BF16:
            assert "bf16 is not available on this CPU (no AVX512_BF16 or AMX)" in lines[0]
        else:
            assert "no openvino/model_int8.xml" in lines[0]


@pytest.mark.cost(25)
def test_int8_is_refused_saying_by_how_much_or_kept_and_served(ir_export, validation,
                                                               tmp_path):
    """NNCF calibrated on images 1000 times too bright: every real image lands in a few
    quantization steps, int8 answers far from fp32, and the guard refuses it. Calibrated
    on the real images and given a bar it clears, it is kept, and --openvino_precision=int8
    serves it: the classes agree with fp32 exactly as the guard measured."""
    _, version_dir, _ = ir_export
    copy = _copy(version_dir, tmp_path)
    _, labels, pixels = validation
    kept, report = ov_export.quantize_int8(copy, pixels[:8] * 1000.0, pixels, labels)
    assert not kept
    assert re.match(r"int8 refused: top-1 agrees with fp32 on \d+\.\d%% of %d images, "
                    r"\d+\.\d points below --openvino_int8_min_agreement=0\.995" % IMAGES,
                    report["refused"]), report["refused"]
    assert report["int8_agreement"] < 0.9
    folder = os.path.dirname(os.path.join(copy, openvino_model.INT8_MODEL_FILE))
    assert sorted(os.listdir(folder)) == ["model.bin", "model.xml"]  # nothing else left
    assert "int8 refused" in ov_export.describe_int8(copy)

    kept, report = ov_export.quantize_int8(copy, pixels[:8], pixels, labels,
                                           min_agreement=0.0, max_accuracy_drop=1.0)
    assert kept and "refused" not in report
    assert sorted(os.listdir(folder)) == ["model.bin", "model.xml", "model_int8.bin",
                                          "model_int8.xml"]
    servable = openvino_servable.OpenVinoServable(
        "resnet", 1, copy, options=openvino_servable.OpenVinoOptions(precision="int8"))
    try:
        assert (servable.runtime, servable.precision) == ("openvino", "int8")
        int8 = servable.run(servable.signatures[signatures.PREDICT_IMAGES],
                            {signatures.IMAGES: pixels}, [signatures.CLASSES])
    finally:
        servable.retire()
    fp32 = _tensorflow(copy, signatures.PREDICT_IMAGES, {signatures.IMAGES: pixels},
                       [signatures.CLASSES])
    assert np.mean(int8[signatures.CLASSES] == fp32[signatures.CLASSES]) == \
        report["int8_agreement"]


def test_the_platform_and_the_flags_are_checked(tmp_path):
    config = tmp_path / "models.config"
    config.write_text('model_config_list { config { name: "a" base_path: "/m/a" '
                      'model_platform: "openvino" } config { name: "b" base_path: "/m/b" } }')
    first, second = model_config.parse_model_config_file(str(config))
    assert (first.platform, second.platform) == ("openvino", "tensorflow")
    config.write_text('model_config_list { config { name: "a" base_path: "/m/a" '
                      'model_platform: "onnx" } }')
    with pytest.raises(files.ConfigError, match=r"--model_config_file .*models.config: "
                       r"Model a requests unsupported platform onnx; this server serves "
                       r"tensorflow or openvino"):
        model_config.parse_model_config_file(str(config))
    with pytest.raises(user_errors.UserError, match="--prefer_openvino_model and "
                       "--prefer_tflite_model"):
        options_lib.ServerOptions(model_base_path="/m/a", prefer_openvino_model=True,
                                  prefer_tflite_model=True).check()
    for value in (-1, 2 ** 31, 2 ** 63 - 1):
        with pytest.raises(user_errors.UserError, match="--openvino_num_streams"):
            options_lib.ServerOptions(model_base_path="/m/a",
                                      openvino_num_streams=value).check()
    options_lib.ServerOptions(model_base_path="/m/a", openvino_num_streams=0).check()
    with pytest.raises(user_errors.UserError, match="--openvino_precision must be one of "
                       "fp32, bf16, int8"):
        options_lib.ServerOptions(model_base_path="/m/a", openvino_precision="fp16").check()
    with pytest.raises(user_errors.UserError, match="--openvino_int8 quantizes the IR "
                       "--openvino writes: give both"):
        run_export.export_run(run_export.ExportConfig(model_dir=str(tmp_path),
                                                      openvino_int8=True))
