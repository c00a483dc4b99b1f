"""slimserve-export: export any checkpoint of a slimserve run as a servable SavedModel.

    slimserve-export --model_dir=runs/digits --export_base=models/resnet

Reads the run's `slimserve.json` (net, classes, preprocessing), takes the latest
checkpoint unless --checkpoint_path names one, writes `<export_base>/<version>/`
atomically with warmup requests, and verifies it against estimator.predict.
Like the training exporters it exports only a checkpoint whose evaluation clears
--export_min_metric: it trusts the evaluation the run recorded for that checkpoint's step
(<model_dir>/eval/ events, written by slimserve-train) rather than evaluating again.
With --tflite the version also carries model.tflite (export/tflite.py), and the parity
of the two models is printed after the version's path.
"""
import dataclasses
import logging
import os
import sys

from absl import flags

import tensorflow as tf

from slimserve import errors as user_errors
from slimserve.estimator import model
from slimserve.estimator import preprocessing
from slimserve.estimator import run_files
from slimserve.export import blessing
from slimserve.export import exporters
from slimserve.export import tflite
from slimserve.export import verify
from slimserve.export import writer
from slimserve.cli import logs

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "The training run's model_dir (has slimserve.json).")
flags.DEFINE_string("checkpoint_path", None, "Checkpoint prefix (default: latest in model_dir).")
flags.DEFINE_string("export_base", None,
                    "Versions go to <export_base>/<version>/ (default <model_dir>/export/manual).")
flags.DEFINE_string("data_dir", None,
                    "TFRecords for warmup and verification images (default: the run's).")
flags.DEFINE_string("eval_split", None, "Split of --data_dir to sample (default: the run's).")
flags.DEFINE_bool("verify", True, "Compare the export with estimator.predict before publishing.")
flags.DEFINE_integer("num_verify_images", 8, "Images used for verification.")
flags.DEFINE_string("warmup_from", None,
                    "Glob of request logs (the server's logging_config files): warmup "
                    "requests are built from that traffic, one per signature and input "
                    "shape, at most 1000; validation images when it matches nothing.")
flags.DEFINE_integer("max_image_pixels", None,
                     "Override the run's pixel limit for this export: images whose header "
                     "claims more pixels are INVALID_ARGUMENT before any decode.",
                     lower_bound=1)
flags.DEFINE_string("export_min_metric", blessing.AUTO,
                    "Judged on the run's recorded evaluation of this checkpoint. " + blessing.HELP
                    + " ('none' also exports a checkpoint that was never evaluated.)")
flags.DEFINE_bool("tflite", False,
                  "Also write model.tflite (the predict_images signature, TFLite builtin "
                  "ops) beside the SavedModel, for --prefer_tflite_model; its classes must "
                  "agree with the SavedModel's on the verification images (the warmup file "
                  "then holds predict_images requests only, which both models answer).")
flags.DEFINE_float("tflite_min_agreement", tflite.DEFAULT_MIN_AGREEMENT,
                   "With --tflite: the least fraction of verification images on which "
                   "model.tflite and the SavedModel must give the same class.",
                   lower_bound=0.0, upper_bound=1.0)
flags.mark_flag_as_required("model_dir")


def check_blessing(checkpoint, num_classes):
    """Raises ExportRefused unless the run's recorded eval of `checkpoint` clears the bar."""
    if blessing.parse(FLAGS.export_min_metric)[0] is None:
        return "--export_min_metric=none: not gated"
    step = int(tf.train.load_checkpoint(checkpoint).get_tensor("global_step"))
    result = blessing.recorded_eval(FLAGS.model_dir, step)
    if result is None:
        raise blessing.ExportRefused(
            "export refused: %s (step %d) was never evaluated; run slimserve-train "
            "--mode=eval with the run's flags (--flagfile=%s/flags.txt) first, or pass "
            "--export_min_metric=none" % (checkpoint, step, FLAGS.model_dir))
    best_seen = blessing.best_recorded(FLAGS.model_dir, blessing.auto_metric(result))
    return blessing.check(result, FLAGS.export_min_metric, "accuracy", num_classes, best_seen)


def main(argv):
    del argv
    try:
        run = run_files.read(FLAGS.model_dir)
    except ValueError as error:
        sys.exit("slimserve-export: %s" % error)
    checkpoint = FLAGS.checkpoint_path or tf.train.latest_checkpoint(FLAGS.model_dir)
    if not checkpoint or not tf.io.gfile.exists(checkpoint + ".index"):
        sys.exit("slimserve-export: no checkpoint %s" % (
            FLAGS.checkpoint_path or "in --model_dir %s" % FLAGS.model_dir))
    try:
        logging.info("export gate: %s", check_blessing(checkpoint, run["model"]["num_classes"]))
    except ValueError as error:  # ExportRefused or a metric the evaluation lacks
        sys.exit("slimserve-export: %s" % error)
    export_base = FLAGS.export_base or os.path.join(FLAGS.model_dir, "export", "manual")
    # A full disk or a refusing directory is one line naming the path (the version's
    # temporary directory is removed, nothing is published), never a traceback.
    with user_errors.writing(export_base, "--export_base"):
        export(export_base, checkpoint, run)


def export(export_base, checkpoint, run):
    """The export proper, into `export_base` (see main)."""
    for stale in writer.remove_stale_temp_dirs(export_base):
        print("removed %s left by an interrupted export" % os.path.join(export_base, stale))
    estimator = tf.estimator.Estimator(model.model_fn, model_dir=FLAGS.model_dir,
                                       params=dataclasses.asdict(
                                           run_files.model_config(run)))
    try:
        path = exporters.export_checkpoint(
            estimator, export_base, checkpoint,
            preprocessing.Spec.from_dict(run["serving"]),
            FLAGS.data_dir or run.get("data_dir"), FLAGS.eval_split or run.get("eval_split"),
            FLAGS.verify, FLAGS.num_verify_images, warmup_from=FLAGS.warmup_from,
            max_image_pixels=FLAGS.max_image_pixels, tflite=FLAGS.tflite,
            tflite_min_agreement=FLAGS.tflite_min_agreement)
    except (verify.ExportVerificationError, ValueError) as error:
        sys.exit("slimserve-export: %s" % error)
    print(path)
    if FLAGS.tflite:
        print(tflite.describe(tflite.read_parity(path)))


def run():
    logs.run(main)


if __name__ == "__main__":
    run()
