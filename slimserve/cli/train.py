r"""slimserve-train: fine-tune a slim net on TFRecords with tf.estimator.train_and_evaluate.

    slimserve-train --flagfile=configs/own_images_finetune.flags --data_dir=data/ \
        --model_dir=runs/mine --checkpoint_path=resnet_v1_50.ckpt

--data_dir is the output of slimserve-convert. The console shows progress, each
evaluation and each export; --verbosity=1 adds TensorFlow's own INFO log. Every flag is
written to `<model_dir>/flags.txt` (usable as --flagfile) and the model/input settings
that export needs to `<model_dir>/slimserve.json`.
"""
import contextlib
import dataclasses
import logging
import math
import os
import sys
import time

from absl import flags

import tensorflow as tf

from slimserve.estimator import checkpoints
from slimserve.estimator import dataset
from slimserve.estimator import guards
from slimserve.estimator import inputs
from slimserve.estimator import model
from slimserve.estimator import nets
from slimserve.estimator import preprocessing
from slimserve.estimator import progress
from slimserve.estimator import run_config
from slimserve.estimator import run_files
from slimserve.estimator import run_lock
from slimserve.estimator import schema
from slimserve.export import blessing
from slimserve.export import warmup
from slimserve.cli import logs

FLAGS = flags.FLAGS

# Dataset.
flags.DEFINE_string("data_dir", None, "TFRecords written by slimserve-convert (train-*/"
                    "validation-* shards, labels.txt, dataset_info.json); not the images.")
flags.DEFINE_string("labels_file", None, "id:name file (default: <data_dir>/labels.txt).")
flags.DEFINE_string("train_split", "train", "Split name of the training shards.")
flags.DEFINE_string("eval_split", "validation", "Split name of the evaluation shards.")
# Input pipeline.
flags.DEFINE_integer("image_size", None, "Network input side (default: the net's own: 224, "
                     "299 for resnet_v2_*).", lower_bound=1)
flags.DEFINE_integer("batch_size", 32, "Global training batch size (split across replicas).",
                     lower_bound=1)
flags.DEFINE_integer("eval_batch_size", 64, "Evaluation batch size.", lower_bound=1)
flags.DEFINE_integer("shuffle_buffer", 2048, "Records in the training shuffle buffer.",
                     lower_bound=1)
flags.DEFINE_integer("cycle_length", 8, "Shards read in parallel by interleave.", lower_bound=1)
flags.DEFINE_integer("num_parallel_calls", -1, "Parallel map calls (-1: AUTOTUNE).")
flags.DEFINE_integer("prefetch", -1, "Batches to prefetch (-1: AUTOTUNE).")
flags.DEFINE_string("cache", "", "Cache records: '' off, 'memory', or a file prefix.")
flags.DEFINE_float("min_crop_area", 0.25, "Smallest random-crop area, as a fraction.")
flags.DEFINE_float("max_crop_area", 1.0, "Largest random-crop area, as a fraction.")
flags.DEFINE_float("min_aspect_ratio", 3 / 4, "Smallest random-crop aspect ratio (w/h).")
flags.DEFINE_float("max_aspect_ratio", 4 / 3, "Largest random-crop aspect ratio (w/h).")
flags.DEFINE_bool("random_flip", True, "Random left-right flips in training.")
flags.DEFINE_float("eval_central_fraction", 0.875,
                   "Eval and serving crop: vgg-style nets (resnet_v1, vgg) keep the central "
                   "square of this fraction of the shorter side (slim's 224/256); "
                   "inception-style (resnet_v2) this fraction of each side (1.0: no crop).")
flags.DEFINE_integer("max_image_pixels", preprocessing.DEFAULT_MAX_IMAGE_PIXELS,
                     "Images whose header claims more pixels (width x height; all frames of "
                     "a GIF) fail before decoding: skipped by the train/eval input, "
                     "INVALID_ARGUMENT from the exported model.", lower_bound=1)
flags.DEFINE_bool("verify_shards", True, "Check every shard's record structure first.")
flags.DEFINE_bool("deterministic_input", False,
                  "Training examples in an order fixed by --seed (parallel input stages keep "
                  "their order; slower). Evaluation is always in order.")
# Net.
flags.DEFINE_string("model_name", "resnet_v1_50", "Net from estimator/nets.py.")
# Fine-tuning.
flags.DEFINE_string("checkpoint_path", None, "Checkpoint file or directory to warm-start from.")
flags.DEFINE_list("checkpoint_exclude_scopes", [], "Scopes not restored (e.g. the head).")
flags.DEFINE_bool("ignore_missing_vars", False, "Train variables the checkpoint lacks from scratch.")
flags.DEFINE_list("trainable_scopes", [], "Only these scopes train (slim's meaning; all if empty).")
flags.DEFINE_list("freeze_scopes", [], "These scopes never train.")
flags.DEFINE_bool("frozen_bn_inference", True,
                  "BatchNorm in frozen residual units runs in inference mode (stats untouched).")
# Optimisation.
flags.DEFINE_enum("optimizer", "momentum", model.OPTIMIZERS, "Optimizer.")
flags.DEFINE_float("learning_rate", 0.01, "Initial learning rate.")
flags.DEFINE_enum("learning_rate_schedule", "fixed", model.SCHEDULES, "LR schedule.")
flags.DEFINE_integer("decay_steps", None, "Steps of exponential/polynomial/cosine decay "
                     "(default: --max_steps, i.e. decay over the whole run).", lower_bound=1)
flags.DEFINE_float("decay_rate", 0.94, "Exponential decay factor per decay_steps.")
flags.DEFINE_float("end_learning_rate", 1e-4, "Final LR of polynomial and cosine decay.")
flags.DEFINE_list("boundaries", [], "Piecewise schedule: step boundaries.")
flags.DEFINE_list("boundary_values", [], "Piecewise schedule: LRs (one more than boundaries).")
flags.DEFINE_integer("warmup_steps", 0, "Linear LR warm-up steps.", lower_bound=0)
flags.DEFINE_float("momentum", 0.9, "Momentum (momentum and rmsprop).")
flags.DEFINE_float("rmsprop_decay", 0.9, "RMSProp decay.")
flags.DEFINE_float("opt_epsilon", None, "Epsilon of rmsprop and adam (default: per optimizer, "
                   "adam 1e-8 as in Adam's paper, rmsprop 1.0 as in slim).")
flags.DEFINE_float("adam_beta1", 0.9, "Adam beta1.")
flags.DEFINE_float("adam_beta2", 0.999, "Adam beta2.")
flags.DEFINE_float("weight_decay", 1e-4, "L2 weight decay on trained conv weights.")
flags.DEFINE_float("label_smoothing", 0.0, "Label smoothing.")
flags.DEFINE_float("batch_norm_decay", None,
                   "BatchNorm moving-average decay (default: from --max_steps, 1 - %d/max_steps "
                   "within [%g, %g], so the moving statistics forget the checkpoint's within a "
                   "tenth of the run: 0.967 for 300 steps, slim's 0.997 from 3334 on)."
                   % (model.BN_DECAY_WINDOWS, model.BN_DECAY_RANGE[0], model.BN_DECAY_RANGE[1]))
flags.DEFINE_float("batch_norm_epsilon", 1e-5, "BatchNorm epsilon (slim's ResNet: 1e-5).")
flags.DEFINE_float("moving_average_decay", None, "EMA of weights, used by eval and export.")
flags.DEFINE_float("clip_gradient_norm", 0.0, "Clip gradients to this global norm (0: off).")
# Run config.
flags.DEFINE_string("model_dir", None, "Checkpoints, summaries, exports.")
flags.DEFINE_enum("mode", "train_and_eval", ["train_and_eval", "train", "eval"], "What to run.")
flags.DEFINE_integer("max_steps", 1000, "Total training steps (global step).", lower_bound=1)
flags.DEFINE_integer("eval_steps", None, "Eval batches (default: the whole eval split).",
                     lower_bound=1)
flags.DEFINE_integer("save_checkpoints_steps", 200, "Checkpoint every N steps.", lower_bound=1)
flags.DEFINE_integer("save_checkpoints_secs", None, "Or every N seconds (overrides steps).",
                     lower_bound=1)
flags.DEFINE_integer("keep_checkpoint_max", 5, "Checkpoints kept.", lower_bound=1)
flags.DEFINE_integer("log_step_count_steps", 20, "Progress line every N steps.", lower_bound=1)
flags.DEFINE_integer("save_summary_steps", 100, "TensorBoard summaries every N steps "
                     "(0: none).", lower_bound=0)
flags.DEFINE_integer("num_summary_images", 3, "Training input images shown in TensorBoard.",
                     lower_bound=0)
flags.DEFINE_integer("eval_throttle_secs", 10, "Least seconds between evaluations.",
                     lower_bound=0)
flags.DEFINE_integer("seed", 0, "Graph-level seed for init, shuffling and crops.")
# Distribution and speed.
flags.DEFINE_enum("distribution", "auto", run_config.DISTRIBUTIONS,
                  "auto: mirrored with >1 GPU, PS when TF_CONFIG names ps, collective "
                  "for a TF_CONFIG of workers only.")
flags.DEFINE_integer("num_gpus", 0, "GPUs to mirror over (MirroredStrategy when > 1).",
                     lower_bound=0)
flags.DEFINE_integer("cpu_replicas", 0,
                     "Split the CPU into N logical devices and mirror over them (tests the "
                     "multi-device path without GPUs).", lower_bound=0)
flags.DEFINE_bool("xla", False, "XLA JIT compilation.")
flags.DEFINE_enum("precision", "fp32", run_config.PRECISIONS,
                  "bf16: oneDNN auto mixed precision on CPUs with AVX512_BF16; fp16: GPUs.")
flags.DEFINE_integer("intra_op_threads", 0, "Threads inside ops (0: TF's choice).",
                     lower_bound=0)
flags.DEFINE_integer("inter_op_threads", 0, "Ops run concurrently (0: TF's choice).",
                     lower_bound=0)
# Export.
flags.DEFINE_bool("export", True, "Attach the Final and Best exporters (train_and_eval).")
flags.DEFINE_integer("exports_to_keep", 3, "BestExporter versions kept.", lower_bound=1)
flags.DEFINE_string("best_metric", "accuracy", "Eval metric the BestExporter maximises.")
flags.DEFINE_bool("verify_export", True, "Reload each export and compare with predict().")
flags.DEFINE_string("warmup_from", None,
                    "Glob of request logs: the exporters build warmup requests from that "
                    "traffic (validation images when it matches nothing).")
flags.DEFINE_string("export_min_metric", blessing.AUTO, "Gates export/final and export/best. "
                    + blessing.HELP)
# Training guards.
flags.DEFINE_bool("stop_on_nonfinite_loss", True,
                  "Stop with an error (non-zero exit) when the training loss is NaN or Inf.")
flags.DEFINE_float("max_loss_factor", 100.0,
                   "Stop with an error when the loss exceeds this many times the run's first "
                   "loss (at least ln(classes)); 0: off.", lower_bound=0.0)
flags.DEFINE_bool("force_unlock", False,
                  "Take <model_dir>/train.lock even if a trainer on another host holds it "
                  "(only once that trainer is gone).")

flags.mark_flags_as_required(["data_dir", "model_dir"])


def _check(name, ok, rule):
    flags.register_validator(name, lambda value: value is None or ok(value),
                             message="--%s must be %s" % (name, rule))


for _name in ("learning_rate", "decay_rate", "opt_epsilon", "batch_norm_epsilon"):
    _check(_name, lambda v: v > 0, "> 0")
for _name in ("end_learning_rate", "momentum", "weight_decay", "clip_gradient_norm"):
    _check(_name, lambda v: v >= 0, ">= 0")
for _name in ("rmsprop_decay", "adam_beta1", "adam_beta2", "label_smoothing",
              "batch_norm_decay"):
    _check(_name, lambda v: 0 <= v < 1, "in [0, 1)")
_check("moving_average_decay", lambda v: 0 < v < 1, "in (0, 1)")
for _name in ("min_crop_area", "max_crop_area", "eval_central_fraction"):
    _check(_name, lambda v: 0 < v <= 1, "in (0, 1]")
for _name in ("min_aspect_ratio", "max_aspect_ratio"):
    _check(_name, lambda v: v > 0, "> 0")
for _name in ("num_parallel_calls", "prefetch"):
    _check(_name, lambda v: v == -1 or v > 0, "-1 (AUTOTUNE) or > 0")
flags.register_multi_flags_validator(
    ["min_crop_area", "max_crop_area"], lambda f: f["min_crop_area"] <= f["max_crop_area"],
    message="--min_crop_area must be <= --max_crop_area")
flags.register_multi_flags_validator(
    ["min_aspect_ratio", "max_aspect_ratio"],
    lambda f: f["min_aspect_ratio"] <= f["max_aspect_ratio"],
    message="--min_aspect_ratio must be <= --max_aspect_ratio")


def _valid_min_metric(value):
    try:
        blessing.parse(value)
    except ValueError:
        return False
    return True


flags.register_validator("export_min_metric", _valid_min_metric,
                         message="--export_min_metric must be 'auto', 'none', a number or "
                                 "<metric>:<number>")

# Exit status of a run that trained but exported nothing: no evaluation cleared
# --export_min_metric. (A final export refused for falling below the run's best while
# export/best holds that best is reported, not an error.)
EXIT_EXPORT_REFUSED = 3

# ModelConfig fields that are not flags of the same name: derived from the data and net.
_DERIVED_FIELDS = ("num_classes", "class_names", "boundaries", "boundary_values")


def derived_defaults():
    """{flag: value} for the flags left unset whose default depends on other flags, and
    one line per value saying the rule (logged, so a run says what it trained with)."""
    values, notes = {}, []
    if FLAGS.opt_epsilon is None and model.default_opt_epsilon(FLAGS.optimizer) is not None:
        values["opt_epsilon"] = model.default_opt_epsilon(FLAGS.optimizer)
        notes.append("--opt_epsilon=%g (the default for --optimizer=%s)"
                     % (values["opt_epsilon"], FLAGS.optimizer))
    if FLAGS.batch_norm_decay is None:
        values["batch_norm_decay"] = model.default_batch_norm_decay(FLAGS.max_steps)
        notes.append("--batch_norm_decay=%g (1 - %d/max_steps within [%g, %g], for "
                     "--max_steps=%d)" % (values["batch_norm_decay"], model.BN_DECAY_WINDOWS,
                                          model.BN_DECAY_RANGE[0], model.BN_DECAY_RANGE[1],
                                          FLAGS.max_steps))
    if FLAGS.decay_steps is None:
        values["decay_steps"] = FLAGS.max_steps
        if FLAGS.learning_rate_schedule in ("exponential", "polynomial", "cosine"):
            notes.append("--decay_steps=%d (--max_steps)" % FLAGS.max_steps)
    return values, notes


def build_configs():
    """Flags -> (ModelConfig, InputConfig for train, InputConfig for eval).

    ModelConfig is filled by field name, so a new field only needs a flag of its name;
    flags left unset that derive from others (derived_defaults) are filled in first."""
    inputs.check_data_dir(FLAGS.data_dir, FLAGS.train_split)
    if FLAGS.warmup_from:  # a folder fails here, not at the first export an hour later
        warmup.check_pattern(FLAGS.warmup_from)
    labels_file = FLAGS.labels_file or os.path.join(FLAGS.data_dir, schema.LABELS_FILE)
    if not os.path.exists(labels_file):
        raise ValueError("--labels_file %s does not exist" % labels_file)
    class_names = schema.read_labels(labels_file)
    preprocess = nets.preprocessing_spec(FLAGS.model_name, FLAGS.image_size,
                                         FLAGS.eval_central_fraction, FLAGS.max_image_pixels)
    derived, notes = derived_defaults()
    fields = {f.name for f in dataclasses.fields(model.ModelConfig)} - set(_DERIVED_FIELDS)
    model_config = model.ModelConfig(
        num_classes=len(class_names), class_names=class_names,
        boundaries=[int(b) for b in FLAGS.boundaries],
        boundary_values=[float(v) for v in FLAGS.boundary_values],
        **{name: derived.get(name, FLAGS[name].value) for name in fields}).validate()
    if notes:
        logging.info("defaults for this run: %s", "; ".join(notes))
    common = dict(preprocess=preprocess, shuffle_buffer=FLAGS.shuffle_buffer,
                  cycle_length=FLAGS.cycle_length, num_parallel_calls=FLAGS.num_parallel_calls,
                  prefetch=FLAGS.prefetch, cache=FLAGS.cache,
                  area_range=(FLAGS.min_crop_area, FLAGS.max_crop_area),
                  aspect_ratio_range=(FLAGS.min_aspect_ratio, FLAGS.max_aspect_ratio),
                  random_flip=FLAGS.random_flip,
                  seed=FLAGS.seed, verify_shards=FLAGS.verify_shards,
                  deterministic=FLAGS.deterministic_input)
    train_input = inputs.InputConfig(batch_size=FLAGS.batch_size, **common)
    eval_input = inputs.InputConfig(batch_size=FLAGS.eval_batch_size, **common)
    return model_config, train_input, eval_input


def make_estimator(model_config):
    """The Estimator with the RunConfig the flags describe."""
    strategy = run_config.strategy(FLAGS.distribution, FLAGS.num_gpus, FLAGS.cpu_replicas)
    config = tf.estimator.RunConfig(
        model_dir=FLAGS.model_dir, tf_random_seed=FLAGS.seed,
        save_checkpoints_steps=None if FLAGS.save_checkpoints_secs else FLAGS.save_checkpoints_steps,
        save_checkpoints_secs=FLAGS.save_checkpoints_secs,
        keep_checkpoint_max=FLAGS.keep_checkpoint_max,
        log_step_count_steps=FLAGS.log_step_count_steps,
        save_summary_steps=FLAGS.save_summary_steps,
        session_config=run_config.session_config(FLAGS.xla, FLAGS.precision,
                                                 FLAGS.intra_op_threads, FLAGS.inter_op_threads),
        train_distribute=strategy, eval_distribute=strategy)
    return tf.estimator.Estimator(model.model_fn, config=config,
                                  params=dataclasses.asdict(model_config))


def _check_resume(model_config, repair):
    """The checkpoint to resume from, checked (intact, same head) before any graph is built."""
    if not tf.io.gfile.isdir(FLAGS.model_dir):
        return None
    resume = checkpoints.resume_checkpoint(FLAGS.model_dir, repair=repair)
    if resume:
        labels = FLAGS.labels_file or os.path.join(FLAGS.data_dir, schema.LABELS_FILE)
        checkpoints.check_head(resume, model_config.model_name, model_config.num_classes,
                               "the labels in %s" % labels)
    return resume


def _check_warm_start():
    """A --checkpoint_path of another net fails here, naming the --model_name to pass:
    before the graph is built and before train.lock or anything else is written into
    --model_dir. A run that resumes from its own checkpoint never reads it."""
    if not FLAGS.checkpoint_path or FLAGS.mode == "eval":
        return
    if tf.io.gfile.isdir(FLAGS.model_dir):
        try:
            if checkpoints.listed_checkpoints(FLAGS.model_dir):
                return  # a resume: the warm start is skipped (_check_resume checks the rest)
        except checkpoints.CheckpointError:
            return  # a broken state file: _check_resume names it
    model.check_checkpoint_net(FLAGS.checkpoint_path, FLAGS.model_name)


def _train(estimator, model_config, train_fn, eval_fn, eval_input):
    """Runs --mode; returns (eval result or None, exporters)."""
    hooks = [progress.ProgressHook(FLAGS.max_steps, FLAGS.batch_size, FLAGS.log_step_count_steps),
             guards.LossGuardHook(FLAGS.stop_on_nonfinite_loss, FLAGS.max_loss_factor,
                                  loss_floor=math.log(model_config.num_classes))]
    if FLAGS.mode == "eval":
        return estimator.evaluate(eval_fn, steps=FLAGS.eval_steps), []
    if FLAGS.mode == "train" and not run_config.tf_config_cluster():
        estimator.train(train_fn, max_steps=FLAGS.max_steps, hooks=hooks)
        return None, []
    # Also --mode=train in a TF_CONFIG cluster: Estimator trains multi-worker only
    # through train_and_evaluate (evaluation then runs on an evaluator task).
    exporters = [progress.EvalLogger()]  # one line per evaluation, before the exports
    if FLAGS.export and FLAGS.mode == "train_and_eval":
        # The command wires export in; the estimator library never imports export/.
        from slimserve.export import exporters as export_lib  # pylint: disable=g-import-not-at-top
        exporters += export_lib.make_exporters(
            eval_input.preprocess, FLAGS.data_dir, FLAGS.eval_split,
            FLAGS.exports_to_keep, FLAGS.best_metric, FLAGS.verify_export,
            min_metric=FLAGS.export_min_metric, warmup_from=FLAGS.warmup_from)
    train_spec = tf.estimator.TrainSpec(train_fn, max_steps=FLAGS.max_steps, hooks=hooks)
    eval_spec = tf.estimator.EvalSpec(eval_fn, steps=FLAGS.eval_steps, name=None,
                                      exporters=exporters, start_delay_secs=0,
                                      throttle_secs=FLAGS.eval_throttle_secs)
    outcome = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    return (outcome[0] if outcome else None), exporters  # None on a cluster's chief/worker


def main(argv):
    del argv
    try:
        model_config, train_input, eval_input = build_configs()
        train_fn = inputs.make_input_fn(FLAGS.data_dir, FLAGS.train_split, True, train_input)
        eval_fn = inputs.make_input_fn(FLAGS.data_dir, FLAGS.eval_split, False, eval_input)
        _check_warm_start()
    except (ValueError, dataset.DatasetError) as error:  # WarmStartError too
        sys.exit("slimserve-train: %s" % error)
    chief = run_config.is_chief()
    # One trainer per model_dir: the chief locks it before writing anything there.
    lock = None
    if chief and FLAGS.mode != "eval":
        lock = run_lock.RunLock(FLAGS.model_dir, force=FLAGS.force_unlock)
    started = time.time()
    try:
        with lock or contextlib.nullcontext():
            if chief:
                _check_resume(model_config, repair=lock is not None)
                run_files.write(FLAGS.model_dir, model_config, eval_input.preprocess,
                                FLAGS.data_dir, FLAGS.eval_split, FLAGS.flags_into_string())
            estimator = make_estimator(model_config)
            result, exporters = _train(estimator, model_config, train_fn, eval_fn, eval_input)
    except (run_lock.LockedError, checkpoints.CheckpointError, guards.DivergenceError,
            model.WarmStartError) as error:
        sys.exit("slimserve-train: %s" % error)
    logging.info("done in %.1f s", time.time() - started)
    if result:
        print("eval: " + ", ".join("%s=%.4f" % (k, float(v)) for k, v in sorted(result.items())))
    gated = [e for e in exporters if hasattr(e, "refusal")]
    refused = [e for e in gated if e.refusal and not e.exported]
    for exporter in refused:
        print("export/%s: nothing exported: %s" % (exporter.name, exporter.refusal),
              file=sys.stderr)
    for exporter in gated:
        for path in exporter.exported:
            print("exported %s" % path)
    if refused and not any(e.exported for e in gated):
        sys.exit(EXIT_EXPORT_REFUSED)


def run():
    logs.run(main, concise=True)


if __name__ == "__main__":
    run()
