"""Exporting any checkpoint of a training run as a servable version: `ExportConfig` (the
flags of slimserve-export, slimserve/fields.py) and `export_run(config)`.

Reads the run's `slimserve.json` (net, classes, preprocessing), takes the latest
checkpoint unless --checkpoint_path names one, and exports it only when the evaluation
the run recorded for that checkpoint's step clears --export_min_metric (export/blessing.py,
the same gate as the training exporters). The version is written under
`<export_base>/.tmp-<version>`, verified, and renamed into place (export/writer.py): a
permission error or a full disk under --export_base is a UserError naming it, and
nothing is published.
"""
import dataclasses
import logging
import os
from typing import List, Optional

import tensorflow as tf

from slimserve import errors
from slimserve import fields
from slimserve.estimator import model
from slimserve.estimator import preprocessing
from slimserve.estimator import run_files
from slimserve.export import blessing
from slimserve.export import exporters
from slimserve.export import openvino as openvino_lib
from slimserve.export import reference as reference_lib
from slimserve.export import tflite as tflite_lib
from slimserve.export import writer


@dataclasses.dataclass
class ExportConfig:
    """Every flag of slimserve-export."""
    model_dir: str = fields.option(
        None, "The training run's model_dir (has slimserve.json).", required=True)
    checkpoint_path: str = fields.option(
        None, "Checkpoint prefix (default: latest in model_dir).")
    export_base: str = fields.option(
        None, "Versions go to <export_base>/<version>/ (default <model_dir>/export/manual).")
    data_dir: str = fields.option(
        None, "TFRecords for warmup and verification images (default: the run's).")
    eval_split: str = fields.option(
        None, "Split of --data_dir to sample (default: the run's).")
    verify: bool = fields.option(
        True, "Compare the export with estimator.predict before publishing.")
    num_verify_images: int = fields.option(8, "Images used for verification.",
                                           fields.NON_NEGATIVE)
    warmup_from: str = fields.option(
        None, "Glob of request logs (the server's logging_config files): warmup requests are "
        "built from that traffic, one per signature and input shape, at most 1000; "
        "validation images when it matches nothing.")
    max_image_pixels: Optional[int] = fields.option(
        None, "Override the run's pixel limit for this export: images whose header claims "
        "more pixels are INVALID_ARGUMENT before any decode.", fields.POSITIVE, kind=int)
    export_min_metric: str = fields.option(
        blessing.AUTO, "Judged on the run's recorded evaluation of this checkpoint. "
        + blessing.HELP + " ('none' also exports a checkpoint that was never evaluated.)")
    tflite: bool = fields.option(
        False, "Also write model.tflite (the predict_images signature, TFLite builtin ops) "
        "beside the SavedModel, for --prefer_tflite_model; its classes must agree with the "
        "SavedModel's on the verification images (the warmup file then holds "
        "predict_images requests only, which both models answer).")
    reference_images: int = fields.option(
        reference_lib.DEFAULT_IMAGES, "Validation images the version's reference samples "
        "(assets.extra/reference/: confidences, image statistics, embeddings, for drift "
        "detection; with class priors and example images); 0: no reference.",
        fields.Bound(0, reference_lib.MAX_IMAGES))
    tflite_min_agreement: float = fields.option(
        tflite_lib.DEFAULT_MIN_AGREEMENT, "With --tflite: the least fraction of verification "
        "images on which model.tflite and the SavedModel must give the same class.",
        fields.PROBABILITY)

    openvino: bool = fields.option(
        False, "Also write openvino/model.xml (+ .bin): the network from decoded images to "
        "its outputs as an OpenVINO IR, for --prefer_openvino_model (which converts a "
        "version without one at load); its classes must agree with the SavedModel's on "
        "the verification images. Skipped, with one line, where openvino is not installed "
        "(it needs Python >= 3.10).")
    openvino_min_agreement: float = fields.option(
        openvino_lib.DEFAULT_MIN_AGREEMENT, "With --openvino: the least fraction of "
        "verification images on which the IR and the SavedModel must give the same class.",
        fields.PROBABILITY)
    openvino_int8: bool = fields.option(
        False, "With --openvino: also write openvino/model_int8.xml, NNCF post-training "
        "int8 quantization calibrated on the reference images, kept only when it passes "
        "the accuracy guard below (else refused with a line saying by how much; the export "
        "goes on). Needs nncf and --reference_images > 0.")
    openvino_int8_min_agreement: float = fields.option(
        openvino_lib.DEFAULT_INT8_MIN_AGREEMENT, "With --openvino_int8: the least fraction "
        "of reference images on which int8 and fp32 must give the same class.",
        fields.PROBABILITY)
    openvino_int8_max_accuracy_drop: float = fields.option(
        openvino_lib.DEFAULT_INT8_MAX_ACCURACY_DROP, "With --openvino_int8: the most "
        "int8's accuracy on the labelled reference images may fall below fp32's.",
        fields.PROBABILITY)

    def base(self):
        """--export_base, or <model_dir>/export/manual."""
        return self.export_base or os.path.join(self.model_dir, "export", "manual")


def _openvino_settings(config):
    """The OpenVinoSettings of the flags, or None (off, or no openvino here: said once)."""
    if not config.openvino:
        if config.openvino_int8:
            raise errors.UserError("--openvino_int8 quantizes the IR --openvino writes: give "
                                   "both")
        return None
    missing = openvino_lib.available()
    if missing:
        logging.warning("no OpenVINO IR written: %s", missing)
        return None
    return openvino_lib.OpenVinoSettings(
        config.openvino_min_agreement, config.openvino_int8,
        config.openvino_int8_min_agreement, config.openvino_int8_max_accuracy_drop)


@dataclasses.dataclass
class ExportResult:
    path: str                     # the published version directory
    gate: str                     # why the checkpoint cleared --export_min_metric
    removed: List[str] = dataclasses.field(default_factory=list)  # stale .tmp-* removed


def export_run(config):
    """Exports the checkpoint `config` names; returns an ExportResult. A UserError names
    a missing run or checkpoint, a refused gate, a failed verification or a path under
    --export_base that cannot be written."""
    blessing.parse(config.export_min_metric)
    openvino = _openvino_settings(config)  # a bad combination fails before any work
    run = run_files.read(config.model_dir)
    checkpoint = config.checkpoint_path or tf.train.latest_checkpoint(config.model_dir)
    if not checkpoint or not tf.io.gfile.exists(checkpoint + ".index"):
        raise errors.UserError("no checkpoint %s" % (
            config.checkpoint_path or "in --model_dir %s" % config.model_dir))
    gate = blessing.judge_checkpoint(config.model_dir, checkpoint, config.export_min_metric,
                                     run["model"]["num_classes"])
    logging.info("export gate: %s", gate)
    export_base = config.base()
    estimator = tf.estimator.Estimator(model.model_fn, model_dir=config.model_dir,
                                       params=dataclasses.asdict(run_files.model_config(run)))
    with errors.writing(export_base, "--export_base"):
        removed = writer.remove_stale_temp_dirs(export_base)
        path = exporters.export_checkpoint(
            estimator, export_base, checkpoint, preprocessing.Spec.from_dict(run["serving"]),
            config.data_dir or run.get("data_dir"), config.eval_split or run.get("eval_split"),
            config.verify, config.num_verify_images, warmup_from=config.warmup_from,
            max_image_pixels=config.max_image_pixels, tflite=config.tflite,
            tflite_min_agreement=config.tflite_min_agreement,
            reference_images=config.reference_images,
            openvino=openvino)
    return ExportResult(path, gate, [os.path.join(export_base, name) for name in removed])
