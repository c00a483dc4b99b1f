"""`openvino/model.xml` (+ `.bin`) beside a SavedModel (slimserve-export --openvino): the
network from decoded images to its outputs (serving/core/openvino_model.py's Cut,
preprocessing included) as an OpenVINO IR, served with --prefer_openvino_model or
model_platform "openvino". TF Serving ignores the folder, as every tool that reads the
SavedModel does.

- Converted by openvino.convert_model from the SavedModel's graph as the server loads it
  (variables frozen, the decoded-images tensor made the input), weights kept in fp32.
- Parity: the SavedModel on TensorFlow and the version on OpenVINO, each loaded as the
  server loads it, run `predict_images` on the verification images; agreement of
  `classes` and max |dp| of `probabilities` go into the verification report and
  `assets.extra/openvino_parity.json`; agreement below the bar fails the export (nothing
  is published).
- int8 (--openvino_int8): NNCF post-training quantization of that IR, calibrated on the
  reference images (a sample of the evaluation split), written as openvino/model_int8.xml
  only when its classes agree with fp32 on at least --openvino_int8_min_agreement of them
  and its accuracy on their labels is at most --openvino_int8_max_accuracy_drop below
  fp32's; otherwise refused with one line saying by how much (the export goes on).
"""
import contextlib
import dataclasses
import json
import logging
import os
import sys
import time

import numpy as np
import tensorflow as tf

from slimserve.estimator import preprocessing
from slimserve.export import signatures
from slimserve.export.verify import ExportVerificationError
from slimserve.serving.core import errors
from slimserve.serving.core import openvino_model
from slimserve.serving.core import openvino_servable
from slimserve.serving.core import servable as servable_lib

SIGNATURE = signatures.PREDICT_IMAGES
PARITY_FILE = "openvino_parity.json"  # in assets.extra, beside the warmup requests
INT8_FILE = "openvino_int8.json"  # the int8 guard's figures, written either way
DEFAULT_MIN_AGREEMENT = 0.99
DEFAULT_INT8_MIN_AGREEMENT = 0.995  # the tuner's bar for a setting (serving/tuning/tuner.py)
DEFAULT_INT8_MAX_ACCURACY_DROP = 0.005
INT8_CALIBRATION_IMAGES = 300  # NNCF's default subset size
BATCH = 32


@dataclasses.dataclass
class OpenVinoSettings:
    """What an export does about OpenVINO (slimserve-export's --openvino* flags)."""
    min_agreement: float = DEFAULT_MIN_AGREEMENT
    int8: bool = False
    int8_min_agreement: float = DEFAULT_INT8_MIN_AGREEMENT
    int8_max_accuracy_drop: float = DEFAULT_INT8_MAX_ACCURACY_DROP


def available():
    """None when openvino imports here, else the one line saying why it does not."""
    try:
        openvino_model.runtime()
    except openvino_model.NotConvertible as error:
        return str(error)
    return None


def write_openvino(export_dir):
    """Converts the SavedModel at `export_dir` to `<export_dir>/openvino/model.xml`;
    ExportVerificationError when OpenVINO cannot convert it. -> seconds taken."""
    started = time.monotonic()
    servable = servable_lib.Servable("verify", 0, export_dir)
    try:
        cut = openvino_model.find_cut(servable.graph, servable.signatures)
        model = openvino_model.convert(servable.session, cut)
    except openvino_model.NotConvertible as error:
        raise ExportVerificationError("%s: no OpenVINO IR: %s" % (export_dir, error)) from None
    finally:
        servable.retire()
    openvino_model.save(model, export_dir)
    seconds = time.monotonic() - started
    logging.info("%s: %d outputs, converted in %.1f s", openvino_model.MODEL_FILE,
                 len(cut.outputs), seconds)
    return seconds


def pixels_of(images, preprocess):
    """The evaluation pixels of encoded images: predict_images' input."""
    return np.stack([preprocessing.decode_eval_pixels(
        encoded, preprocess.image_size, preprocess.style, preprocess.central_fraction,
        preprocess.max_image_pixels).numpy() for encoded in images])


def _predict(servable, pixels, keys=(signatures.CLASSES, signatures.PROBABILITIES)):
    """predict_images over `pixels` in batches of BATCH -> {key: ndarray}."""
    signature_def = servable.signature(SIGNATURE)[1]
    parts = [servable.run(signature_def, {signatures.IMAGES: pixels[start:start + BATCH]},
                          list(keys)) for start in range(0, len(pixels), BATCH)]
    return {key: np.concatenate([part[key] for part in parts]) for key in keys}


def _openvino_servable(export_dir, precision=openvino_model.FP32):
    """The version on OpenVINO, loaded as the server loads it; ExportVerificationError
    when it fell back to TensorFlow (the reason is the warning just logged)."""
    servable = openvino_servable.OpenVinoServable(
        "verify", 0, export_dir, options=openvino_servable.OpenVinoOptions(precision))
    if servable.runtime != openvino_servable.OPENVINO:
        servable.retire()
        raise ExportVerificationError("%s: OpenVINO does not serve the IR it wrote (see "
                                      "the warning above)" % export_dir)
    return servable


def check_parity(export_dir, images, preprocess, min_agreement=DEFAULT_MIN_AGREEMENT):
    """Runs `predict_images` of the SavedModel (TensorFlow) and of the version on OpenVINO
    (its IR) on the evaluation pixels of `images`; -> report; ExportVerificationError
    when `classes` agree on fewer than `min_agreement` of them."""
    pixels = pixels_of(images, preprocess)
    servable = servable_lib.Servable("verify", 0, export_dir)
    try:
        saved = _predict(servable, pixels)
    finally:
        servable.retire()
    try:
        servable = _openvino_servable(export_dir)
        try:
            servable.warm_up()
            served = _predict(servable, pixels)
        finally:
            servable.retire()
    except (errors.ServingError, servable_lib.WarmupError) as error:
        raise ExportVerificationError("%s: %s: %s" % (
            export_dir, openvino_model.MODEL_FILE, getattr(error, "message", error))) \
            from None
    agreement = float(np.mean(saved[signatures.CLASSES] == served[signatures.CLASSES]))
    report = {"openvino_images": len(images), "openvino_agreement": agreement,
              "openvino_max_abs_probability_diff": float(np.max(np.abs(
                  saved[signatures.PROBABILITIES] - served[signatures.PROBABILITIES])))}
    _write_json(export_dir, PARITY_FILE, report)
    if agreement < min_agreement:
        raise ExportVerificationError(
            "%s: %s agrees with the SavedModel on %.1f%% of %d images, below "
            "--openvino_min_agreement=%g" % (export_dir, openvino_model.MODEL_FILE,
                                             100 * agreement, len(images), min_agreement))
    return report


def quantize_int8(export_dir, calibration, guard, labels=None,
                  min_agreement=DEFAULT_INT8_MIN_AGREEMENT,
                  max_accuracy_drop=DEFAULT_INT8_MAX_ACCURACY_DROP):
    """NNCF post-training int8 quantization of `<export_dir>/openvino/model.xml`,
    calibrated on `calibration` pixels; kept as openvino/model_int8.xml only when, on the
    `guard` pixels (with their `labels`, if known), its classes agree with fp32's on at
    least `min_agreement` and its accuracy is at most `max_accuracy_drop` below fp32's.
    -> (kept, report); the report (with `refused`: the line saying by how much, when not
    kept) is also written to assets.extra/openvino_int8.json."""
    try:
        import nncf  # pylint: disable=import-outside-toplevel,import-error
    except ImportError as error:
        raise ExportVerificationError("%s: --openvino_int8 needs nncf (pip install nncf): %s"
                                      % (export_dir, error)) from None
    nncf.set_log_level(logging.WARNING)
    started = time.monotonic()
    model = openvino_model.read(export_dir)
    batch = list(calibration[i:i + 1] for i in range(len(calibration)))
    # NNCF draws progress bars on stdout, where a command prints its results. Full bias
    # correction, not NNCF's fast one: on the digits export 1 of 359 validation images
    # left fp32's class where the fast one moved 2-3 (benchmarks/bench_int8_calibration.py,
    # docs/runtimes.md).
    with contextlib.redirect_stdout(sys.stderr):
        quantized = nncf.quantize(model, nncf.Dataset(batch),
                                  subset_size=min(len(batch), INT8_CALIBRATION_IMAGES),
                                  fast_bias_correction=False)
    seconds = time.monotonic() - started
    path = os.path.join(export_dir, openvino_model.INT8_MODEL_FILE)
    temp_name = os.path.join(os.path.dirname(openvino_model.INT8_MODEL_FILE),
                             ".candidate_int8.xml")
    openvino_model.save(quantized, export_dir, temp_name)
    report = {"int8_calibration_images": len(calibration), "int8_guard_images": len(guard),
              "int8_quantize_seconds": round(seconds, 2)}
    try:
        classes = {}
        for precision, filename in ((openvino_model.FP32, openvino_model.MODEL_FILE),
                                    (openvino_model.INT8, temp_name)):
            classes[precision] = ir_classes(export_dir, openvino_model.compile_model(
                openvino_model.read(export_dir, filename)), guard)
        agreement = float(np.mean(classes[openvino_model.FP32] ==
                                  classes[openvino_model.INT8]))
        report["int8_agreement"] = agreement
        reasons = []
        if agreement < min_agreement:
            reasons.append("top-1 agrees with fp32 on %.1f%% of %d images, %.1f points "
                           "below --openvino_int8_min_agreement=%g" % (
                               100 * agreement, len(guard), 100 * (min_agreement - agreement),
                               min_agreement))
        if labels is not None and len(labels):
            labels = np.asarray(labels).reshape(-1)
            fp32 = float(np.mean(classes[openvino_model.FP32] == labels))
            int8 = float(np.mean(classes[openvino_model.INT8] == labels))
            report.update(fp32_accuracy=fp32, int8_accuracy=int8)
            if fp32 - int8 > max_accuracy_drop:
                reasons.append("accuracy %.1f%% against fp32's %.1f%%, %.1f points more "
                               "than --openvino_int8_max_accuracy_drop=%g allows" % (
                                   100 * int8, 100 * fp32,
                                   100 * (fp32 - int8 - max_accuracy_drop),
                                   max_accuracy_drop))
        if reasons:
            report["refused"] = "int8 refused: " + "; ".join(reasons)
        else:
            os.replace(os.path.join(export_dir, temp_name[:-4] + ".bin"), path[:-4] + ".bin")
            os.replace(os.path.join(export_dir, temp_name), path)
    finally:
        for leftover in (temp_name, temp_name[:-4] + ".bin"):
            if os.path.exists(os.path.join(export_dir, leftover)):
                os.remove(os.path.join(export_dir, leftover))
    _write_json(export_dir, INT8_FILE, report)
    if "refused" in report:
        logging.warning("%s: %s", export_dir, report["refused"])
    return "refused" not in report, report


def ir_classes(export_dir, compiled, pixels):
    """predict_images' top-1 classes of `pixels` computed by `compiled`, a compiled IR of
    the version (fp32 or int8), BATCH images a run."""
    request = compiled.create_infer_request()
    names = openvino_model.names(compiled)[1]
    cut_classes = classes_output(export_dir, names)
    found = []
    for start in range(0, len(pixels), BATCH):
        values = dict(zip(names, openvino_model.run_compiled(request,
                                                             pixels[start:start + BATCH])))
        found.append(np.asarray(values[cut_classes]).reshape(-1))
    return np.concatenate(found)


def classes_output(export_dir, names):
    """The IR output that is predict_images' `classes` (the SavedModel's tensor name)."""
    servable = servable_lib.Servable("verify", 0, export_dir)
    try:
        wanted = servable.signatures[SIGNATURE].outputs[signatures.CLASSES].name
    finally:
        servable.retire()
    if wanted not in names:
        raise ExportVerificationError("%s: the IR has no output %s (predict_images' "
                                      "classes)" % (export_dir, wanted))
    return wanted


def _write_json(export_dir, name, report):
    with tf.io.gfile.GFile(os.path.join(export_dir, signatures.EXTRA_DIR, name), "w") as h:
        json.dump(report, h, indent=1)


def describe(report):
    """One line: `openvino: 8/8 images agree (100.0%), max |dp| 2.4e-06`."""
    count = report["openvino_images"]
    return "openvino: %d/%d images agree (%.1f%%), max |dp| %.2g" % (
        round(report["openvino_agreement"] * count), count,
        100 * report["openvino_agreement"], report["openvino_max_abs_probability_diff"])


def describe_int8(export_dir):
    """One line: the int8 guard's verdict recorded in a version."""
    path = os.path.join(export_dir, signatures.EXTRA_DIR, INT8_FILE)
    if not tf.io.gfile.exists(path):
        return "int8: not quantized (see the log)"
    with tf.io.gfile.GFile(path) as handle:
        report = json.load(handle)
    if "refused" in report:
        return report["refused"]
    return "int8: %s written, top-1 agrees with fp32 on %.1f%% of %d images" % (
        openvino_model.INT8_MODEL_FILE, 100 * report["int8_agreement"],
        report["int8_guard_images"])


def has_parity(export_dir):
    return tf.io.gfile.exists(os.path.join(export_dir, signatures.EXTRA_DIR, PARITY_FILE))


def read_parity(export_dir):
    """The parity report check_parity recorded in a version."""
    with tf.io.gfile.GFile(os.path.join(export_dir, signatures.EXTRA_DIR, PARITY_FILE)) as h:
        return json.load(h)
