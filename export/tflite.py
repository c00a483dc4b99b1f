"""`model.tflite` beside a SavedModel (slimserve-export --tflite): the float signature
(`predict_images`) converted by tf.lite.TFLiteConverter, served by this server and by TF
Serving with --prefer_tflite_model.

- Builtin TFLite ops only: TF Serving's TFLite runtime has no Select TF ("Flex") ops.
- The SignatureDef TF Serving reads is the SavedModel's `predict_images` one (same keys,
  dtypes, shapes, method), its tensor names those of the converted model, written into
  the model's metadata (serving/core/tflite_model.py).
- TF Serving replays the version's warmup file against whichever model it loads, and a
  record naming a signature the model lacks fails the load; so the warmup file keeps only
  the requests the TFLite model answers (predict_images), and the SavedModel is warmed
  with those too.
- Parity: both models, each loaded as the server loads it, run `predict_images` on the
  validation images; agreement of `classes` and max |dp| of `probabilities` go into the
  verification report and `assets.extra/tflite_parity.json`; agreement below the bar
  fails the export (nothing is published).
"""
import contextlib
import json
import logging
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import prediction_log_pb2

from slimserve.estimator import preprocessing
from slimserve.export import signatures
from slimserve.export import warmup
from slimserve.export.verify import ExportVerificationError
from slimserve.serving.core import errors
from slimserve.serving.core import servable as servable_lib
from slimserve.serving.core import tflite_model
from slimserve.serving.core import tflite_servable

SIGNATURE = signatures.PREDICT_IMAGES
PARITY_FILE = "tflite_parity.json"  # in assets.extra, beside the warmup requests
DEFAULT_MIN_AGREEMENT = 0.99


class _Captured:
    text = ""


@contextlib.contextmanager
def _stderr_captured():
    """Holds what is written to file descriptor 2 (the MLIR converter's op statistics
    and C++ warnings, alarming and not actionable when it succeeds) in `.text`."""
    sys.stderr.flush()
    captured = _Captured()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.text = sink.read().decode("utf-8", "replace")


def _saved_signature(export_dir, key):
    with tf.io.gfile.GFile(os.path.join(export_dir, "saved_model.pb"), "rb") as handle:
        saved = saved_model_pb2.SavedModel.FromString(handle.read())
    for meta_graph in saved.meta_graphs:
        if signatures.SERVE_TAG in meta_graph.meta_info_def.tags:
            return meta_graph.signature_def[key]
    raise ExportVerificationError("%s: no meta graph tagged %r" % (export_dir,
                                                                    signatures.SERVE_TAG))


def convert(export_dir, key=SIGNATURE):
    """The SavedModel's signature `key` as TFLite model bytes, carrying that SignatureDef
    (names mapped to the converted tensors) where TF Serving reads it."""
    converter = tf.lite.TFLiteConverter.from_saved_model(
        export_dir, signature_keys=[key], tags={signatures.SERVE_TAG})
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    with _stderr_captured() as captured:
        try:
            data = converter.convert()
        except Exception as error:  # pylint: disable=broad-except  (ConverterError and kin)
            failure = str(error).strip()[:2000]
        else:
            failure = None
    if failure is not None:
        raise ExportVerificationError("%s: signature %r does not convert to TFLite builtin "
                                      "ops: %s\n%s" % (export_dir, key, failure,
                                                       captured.text[-2000:]))
    logging.debug("TFLite converter output:\n%s", captured.text)
    signature_def = meta_graph_pb2.SignatureDef()
    signature_def.CopyFrom(_saved_signature(export_dir, key))
    runner = tf.lite.Interpreter(model_content=data).get_signature_runner(key)
    for kind, infos, details in (("input", signature_def.inputs, runner.get_input_details()),
                                 ("output", signature_def.outputs,
                                  runner.get_output_details())):
        for alias, info in infos.items():
            detail = details.get(alias)
            if detail is None:
                raise ExportVerificationError("%s: the TFLite model lost %s %r of %r"
                                              % (export_dir, kind, alias, key))
            lite = tf.string if np.dtype(detail["dtype"]) == np.bytes_ else tf.as_dtype(
                detail["dtype"])
            if lite.as_datatype_enum != info.dtype:
                raise ExportVerificationError(
                    "%s: TFLite %s %r is %s, the SavedModel's %s" % (
                        export_dir, kind, alias, lite.name, tf.as_dtype(info.dtype).name))
            info.name = detail["name"]
    return tflite_model.with_signature_defs(data, {key: signature_def})


def keep_tflite_warmup(export_dir, names, images, image_size):
    """Rewrites the warmup file with only the predict requests for signatures in
    `names`; when none is left, with requests built from `images`. -> records kept."""
    path = os.path.join(export_dir, servable_lib.WARMUP_PATH)
    records = []
    if tf.io.gfile.exists(path):
        for record in tf.compat.v1.io.tf_record_iterator(path):
            log = prediction_log_pb2.PredictionLog.FromString(record)
            if log.WhichOneof("log_type") == "predict_log" and (
                    log.predict_log.request.model_spec.signature_name
                    or signatures.DEFAULT) in names:
                records.append(log)
    if not records:
        records = [log for log in warmup.build_requests(images, image_size)
                   if log.WhichOneof("log_type") == "predict_log"
                   and log.predict_log.request.model_spec.signature_name in names]
    warmup.write_warmup(path, records)
    return len(records)


def check_parity(export_dir, images, preprocess, min_agreement=DEFAULT_MIN_AGREEMENT):
    """Runs `predict_images` of the SavedModel and of model.tflite, each loaded as the
    server loads it (the TFLite one warmed up as with --prefer_tflite_model), on the
    evaluation pixels of `images`; -> report; raises ExportVerificationError when
    `classes` agree on fewer than `min_agreement` of them."""
    pixels = np.stack([preprocessing.decode_eval_pixels(
        encoded, preprocess.image_size, preprocess.style, preprocess.central_fraction,
        preprocess.max_image_pixels).numpy() for encoded in images])
    keys = [signatures.CLASSES, signatures.PROBABILITIES]
    servable = servable_lib.Servable("verify", 0, export_dir)
    try:
        saved = servable.run(servable.signature(SIGNATURE)[1], {signatures.IMAGES: pixels}, keys)
    finally:
        servable.retire()
    try:
        servable = tflite_servable.TfLiteServable("verify", 0, export_dir,
                                                  tflite_servable.TfLiteOptions(1, 1))
        try:
            servable.warm_up()
            lite = servable.run(servable.signature(SIGNATURE)[1], {signatures.IMAGES: pixels},
                                keys)
        finally:
            servable.retire()
    except (errors.ServingError, servable_lib.WarmupError) as error:
        raise ExportVerificationError("%s: model.tflite: %s" % (
            export_dir, getattr(error, "message", error))) from None
    agreement = float(np.mean(saved[signatures.CLASSES] == lite[signatures.CLASSES]))
    report = {"tflite_images": len(images), "tflite_agreement": agreement,
              "tflite_max_abs_probability_diff": float(np.max(np.abs(
                  saved[signatures.PROBABILITIES] - lite[signatures.PROBABILITIES])))}
    with tf.io.gfile.GFile(os.path.join(export_dir, signatures.EXTRA_DIR, PARITY_FILE),
                           "w") as handle:
        json.dump(report, handle, indent=1)
    if agreement < min_agreement:
        raise ExportVerificationError(
            "%s: model.tflite agrees with the SavedModel on %.1f%% of %d images, below "
            "--tflite_min_agreement=%g" % (export_dir, 100 * agreement, len(images),
                                           min_agreement))
    return report


def write_tflite(export_dir, images, preprocess):
    """Converts `predict_images` to `<export_dir>/model.tflite` and keeps the warmup
    requests it can answer. Call before verifying the SavedModel (whose warmup then
    replays those same requests) and check_parity after."""
    data = convert(export_dir)
    with tf.io.gfile.GFile(os.path.join(export_dir, tflite_model.MODEL_FILENAME),
                           "wb") as handle:
        handle.write(data)
    kept = keep_tflite_warmup(export_dir, {SIGNATURE}, images, preprocess.image_size)
    logging.info("model.tflite: %d bytes; %d warmup requests kept for %s", len(data), kept,
                 SIGNATURE)


def describe(report):
    """One line for the console: `tflite: 8/8 images agree (100.0%), max |dp| 2.4e-06`."""
    count = report["tflite_images"]
    return "tflite: %d/%d images agree (%.1f%%), max |dp| %.2g" % (
        round(report["tflite_agreement"] * count), count, 100 * report["tflite_agreement"],
        report["tflite_max_abs_probability_diff"])


def read_parity(export_dir):
    """The parity report check_parity recorded in a version."""
    with tf.io.gfile.GFile(os.path.join(export_dir, signatures.EXTRA_DIR, PARITY_FILE)) as h:
        return json.load(h)
