"""Estimator exporters that write slimserve SavedModels (all three signatures).

Estimator's own FinalExporter/BestExporter can only export one receiver's
signatures under names like `alt:output`, and BestExporter compares eval loss;
these keep the project's signature names (slimserve/conventions.py) and compare eval accuracy. Both export only
an evaluation that clears --export_min_metric (export/blessing.py); a refusal is logged
(a warning only at the run's last evaluation: earlier ones may not have learnt yet) and
kept in `refusal` for the training command's summary and exit status. The best exporter
writes only when an evaluation beats every earlier one; when both want the same
checkpoint (the last evaluation is the best), it is exported once and copied. `exported`
lists the versions that still exist (pruned ones are left out).
"""
import dataclasses
import json
import logging
import os

import numpy as np
import tensorflow as tf

from slimserve import errors
from slimserve.estimator import compat
from slimserve.estimator import model
from slimserve.estimator import preprocessing
from slimserve.export import blessing
from slimserve.export import openvino as openvino_lib
from slimserve.export import reference as reference_lib
from slimserve.export import signatures
from slimserve.export import tflite as tflite_lib
from slimserve.export import verify as verify_lib
from slimserve.export import warmup
from slimserve.export import writer

EVAL_RESULT_FILE = "eval_result.json"


def predict_probabilities(estimator, images, checkpoint_path, preprocess):
    """estimator.predict on encoded images, through the evaluation preprocessing."""

    def input_fn():
        ds = tf.data.Dataset.from_tensor_slices(list(images))
        ds = ds.map(compat.plain_graph_building(lambda encoded: {
            "image": preprocessing.eval_image(encoded, preprocess.image_size, preprocess.style,
                                              preprocess.central_fraction,
                                              preprocess.max_image_pixels)}))
        return ds.batch(len(images))

    return [p["probabilities"] for p in estimator.predict(
        input_fn, predict_keys=["probabilities"], checkpoint_path=checkpoint_path)]


def export_checkpoint(estimator, export_base, checkpoint_path, preprocess,
                      data_dir=None, eval_split="validation", verify=True,
                      num_verify_images=8, eval_result=None, warmup_from=None,
                      max_image_pixels=None, tflite=False,
                      tflite_min_agreement=tflite_lib.DEFAULT_MIN_AGREEMENT,
                      reference_images=reference_lib.DEFAULT_IMAGES, openvino=None):
    """Writes, verifies and publishes one version; returns its directory.

    warmup_from: a glob of request logs to build the warmup requests from (validation
    images when it matches nothing yet). max_image_pixels, when given, overrides the
    run's serving setting (the largest image, by its header, the exported graph will
    decode). tflite: also write model.tflite of predict_images (export/tflite.py), whose
    classes must agree with the SavedModel's on `tflite_min_agreement` of the
    verification images. reference_images: the size of the sample of `eval_split` images
    the version's reference records (export/reference.py; 0: none), with the training
    split's class counts and example images per class. openvino: an
    openvino.OpenVinoSettings to also write openvino/model.xml (export/openvino.py),
    parity-checked like model.tflite, and with `int8` its int8 IR behind the accuracy
    guard (calibrated on the reference images); None: no IR."""
    if max_image_pixels:
        preprocess = dataclasses.replace(preprocess, max_image_pixels=max_image_pixels)
    config = model.ModelConfig(**estimator.params)
    size = preprocess.image_size
    images = warmup.sample_images(data_dir, eval_split, num_verify_images, size)

    def before_publish(temp_dir):
        report = {}
        if tflite:
            tflite_lib.write_tflite(temp_dir, images, preprocess)
        if verify:
            expected = predict_probabilities(estimator, images, checkpoint_path, preprocess)
            report.update(verify_lib.verify_export(temp_dir, images, expected))
        if tflite:
            report.update(tflite_lib.check_parity(temp_dir, images, preprocess,
                                                  tflite_min_agreement))
        if openvino is not None:
            openvino_lib.write_openvino(temp_dir)
            report.update(openvino_lib.check_parity(temp_dir, images, preprocess,
                                                    openvino.min_agreement))
        if reference_images and data_dir:
            report.update(reference_lib.write_reference(temp_dir, data_dir, eval_split,
                                                        reference_images))
        elif reference_images:
            logging.warning("no reference recorded: no data set to take it from")
        if openvino is not None and openvino.int8:
            report.update(_int8(temp_dir, data_dir, eval_split, reference_images,
                                preprocess, openvino))
        if report:
            logging.info("export verified: %s", report)
        if eval_result is not None:
            extra = os.path.join(temp_dir, signatures.EXTRA_DIR, EVAL_RESULT_FILE)
            with tf.io.gfile.GFile(extra, "w") as handle:
                json.dump({k: float(v) for k, v in eval_result.items()}, handle)

    return writer.write_saved_model(export_base, checkpoint_path, config, preprocess,
                                    sample_jpegs=images[:3], before_publish=before_publish,
                                    warmup_records=warmup.traffic_warmup(warmup_from))


def _int8(export_dir, data_dir, eval_split, count, preprocess, settings):
    """openvino/model_int8.xml calibrated and guarded on the reference images (the same
    seeded sample of `eval_split` the reference records) -> the guard's report."""
    if not (count and data_dir):
        logging.warning("no int8 IR: it is calibrated on the reference images "
                        "(--reference_images > 0 and a data set)")
        return {}
    sample, _ = reference_lib.sample_split(data_dir, eval_split, count)
    pixels = openvino_lib.pixels_of([encoded for encoded, _ in sample], preprocess)
    labels = np.array([label for _, label in sample])
    _, report = openvino_lib.quantize_int8(export_dir, pixels, pixels, labels,
                                           settings.int8_min_agreement,
                                           settings.int8_max_accuracy_drop)
    return report


class _SlimserveExporter(tf.estimator.Exporter):
    def __init__(self, name, preprocess, data_dir, eval_split, verify,
                 min_metric=blessing.AUTO, best_metric="accuracy", warmup_from=None,
                 written=None, openvino=None):
        self._name = name
        self._openvino = openvino  # an openvino.OpenVinoSettings: also write the IR
        self._preprocess = preprocess
        self._data_dir = data_dir
        self._eval_split = eval_split
        self._verify = verify
        self._min_metric = min_metric
        self._best_metric = best_metric
        blessing.parse(min_metric, best_metric)  # a bad spec fails before training
        self.refusal = None  # why the last evaluation was not exported, if it was not
        self.exported = []  # versions written by this process
        self._warmup_from = warmup_from
        # {checkpoint path: version directory} shared by the exporters of one run.
        self._written = {} if written is None else written

    @property
    def name(self):
        return self._name

    def _blessed(self, estimator, eval_result, last=True):
        """True when eval_result clears --export_min_metric; logs and records why not
        (an INFO line before the run's `last` evaluation)."""
        try:
            reason = blessing.judge(estimator.model_dir, eval_result, self._min_metric,
                                    self._best_metric, estimator.params.get("num_classes"))
        except blessing.ExportRefused as refused:
            self.refusal = str(refused)
            if last:
                logging.warning("export/%s: %s", self._name, refused)
            else:
                logging.info("export/%s: not exported yet: %s", self._name,
                             str(refused).split("; ")[0])
            return False
        logging.info("export/%s: %s", self._name, reason)
        self.refusal = None
        return True

    def _export(self, estimator, export_path, checkpoint_path, eval_result):
        done = self._written.get(checkpoint_path)
        if done and tf.io.gfile.exists(done):
            path = writer.copy_version(done, export_path)
            logging.info("exported %s -> %s (a copy of %s)", checkpoint_path, path, done)
        else:
            path = export_checkpoint(estimator, export_path, checkpoint_path,
                                     self._preprocess, self._data_dir, self._eval_split,
                                     self._verify, eval_result=eval_result,
                                     warmup_from=self._warmup_from, openvino=self._openvino)
            self._written[checkpoint_path] = path
        self.exported.append(path)
        return path


class FinalExporter(_SlimserveExporter):
    """Exports once, after the last evaluation of train_and_evaluate."""

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        if not is_the_final_export or not self._blessed(estimator, eval_result):
            return None
        return self._export(estimator, export_path, checkpoint_path, eval_result)


class BestExporter(_SlimserveExporter):
    """Exports when `metric` (eval accuracy by default) beats every earlier export,
    including ones from before a restart (read back from their eval_result.json),
    and keeps the newest `exports_to_keep` versions."""

    def __init__(self, name, preprocess, data_dir, eval_split, verify,
                 metric="accuracy", exports_to_keep=3, min_metric=blessing.AUTO,
                 warmup_from=None, written=None, openvino=None):
        super().__init__(name, preprocess, data_dir, eval_split, verify, min_metric,
                         metric, warmup_from, written, openvino)
        self._metric = metric
        writer.check_exports_to_keep(exports_to_keep)  # request-bounds: 0 kept everything
        self._keep = exports_to_keep
        self._best = None

    def _previous_best(self, export_path):
        best = None
        for version in writer.list_versions(export_path):
            path = os.path.join(export_path, str(version), signatures.EXTRA_DIR,
                                EVAL_RESULT_FILE)
            if tf.io.gfile.exists(path):
                with tf.io.gfile.GFile(path) as handle:
                    value = json.load(handle).get(self._metric)
                if value is not None and (best is None or value > best):
                    best = value
        return best

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        if self._metric not in eval_result:
            raise errors.UserError("--best_metric %r is not an eval metric (have %s)"
                                   % (self._metric, sorted(eval_result)))
        if self._best is None:
            self._best = self._previous_best(export_path)
        value = float(eval_result[self._metric])
        if self._best is not None and value <= self._best:
            return None
        if not self._blessed(estimator, eval_result, is_the_final_export):
            return None
        self._best = value
        path = self._export(estimator, export_path, checkpoint_path, eval_result)
        writer.prune_versions(export_path, self._keep)
        self.exported = [p for p in self.exported if tf.io.gfile.exists(p)]
        return path


def make_exporters(preprocess, data_dir, eval_split, exports_to_keep=3,
                   best_metric="accuracy", verify=True, min_metric=blessing.AUTO,
                   warmup_from=None, openvino=None):
    """The exporters slimserve-train attaches: export/final/<v> and export/best/<v>, both
    gated by `min_metric` (--export_min_metric); a checkpoint both want is exported once.
    openvino: an openvino.OpenVinoSettings to write each version's OpenVINO IR too (None,
    as slimserve-train: the server converts at load)."""
    written = {}
    return [
        FinalExporter("final", preprocess, data_dir, eval_split, verify,
                      min_metric=min_metric, best_metric=best_metric, warmup_from=warmup_from,
                      written=written, openvino=openvino),
        BestExporter("best", preprocess, data_dir, eval_split, verify,
                     metric=best_metric, exports_to_keep=exports_to_keep,
                     min_metric=min_metric, warmup_from=warmup_from, written=written,
                     openvino=openvino),
    ]


def for_training(config, preprocess):
    """The exporters of a training run (estimator/training.py's `exporters_factory`):
    make_exporters with the TrainConfig's export section. Called before training starts,
    so a --warmup_from that names a folder or a bad --export_min_metric fails first."""
    options = config.export
    if options.warmup_from:
        warmup.check_pattern(options.warmup_from)
    return make_exporters(preprocess, config.data.data_dir, config.data.eval_split,
                          options.exports_to_keep, options.best_metric, options.verify_export,
                          min_metric=options.export_min_metric,
                          warmup_from=options.warmup_from)
