"""absl app: fine-tune a slim net on TFRecords with tf.estimator.train_and_evaluate.

    slimserve-train --data_dir=data/ --model_dir=runs/digits --model_name=resnet_v1_50 \
        --checkpoint_path=resnet_v1_50.ckpt --checkpoint_exclude_scopes=resnet_v1_50/logits

Every flag is written to `<model_dir>/flags.txt` (usable as --flagfile) and the
model/input settings that export needs to `<model_dir>/slimserve.json`.
"""
import dataclasses
import json
import logging
import os
import sys
import time

from absl import flags

import slimserve_quiet

FLAGS = flags.FLAGS

def define_flags():
    """Defined on demand so that importing this module never clashes with other CLIs."""
    # Dataset.
    flags.DEFINE_string("data_dir", None, "Folder with train-*/validation-* shards and labels.txt.")
    flags.DEFINE_string("labels_file", None, "id:name file (default: <data_dir>/labels.txt).")
    flags.DEFINE_string("train_split", "train", "Split name of the training shards.")
    flags.DEFINE_string("eval_split", "validation", "Split name of the evaluation shards.")
    # Input pipeline.
    flags.DEFINE_integer("image_size", None, "Network input side (default: the net's own, 224).")
    flags.DEFINE_integer("batch_size", 32, "Global training batch size (split across replicas).")
    flags.DEFINE_integer("eval_batch_size", 64, "Evaluation batch size.")
    flags.DEFINE_integer("shuffle_buffer", 2048, "Records in the training shuffle buffer.")
    flags.DEFINE_integer("cycle_length", 8, "Shards read in parallel by interleave.")
    flags.DEFINE_integer("num_parallel_calls", -1, "Parallel map calls (-1: AUTOTUNE).")
    flags.DEFINE_integer("prefetch", -1, "Batches to prefetch (-1: AUTOTUNE).")
    flags.DEFINE_string("cache", "", "Cache records: '' off, 'memory', or a file prefix.")
    flags.DEFINE_float("min_crop_area", 0.25, "Smallest random-crop area, as a fraction.")
    flags.DEFINE_float("max_crop_area", 1.0, "Largest random-crop area, as a fraction.")
    flags.DEFINE_bool("random_flip", True, "Random left-right flips in training.")
    flags.DEFINE_float("eval_central_fraction", 0.875,
                       "Central crop kept before resizing in eval and serving (1.0: none).")
    flags.DEFINE_bool("verify_shards", True, "Check every shard's record structure first.")
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
    flags.DEFINE_enum("optimizer", "momentum", ["momentum", "sgd", "rmsprop", "adam"], "Optimizer.")
    flags.DEFINE_float("learning_rate", 0.01, "Initial learning rate.")
    flags.DEFINE_enum("learning_rate_schedule", "fixed",
                      ["fixed", "exponential", "polynomial", "piecewise", "cosine"], "LR schedule.")
    flags.DEFINE_integer("decay_steps", 1000, "Steps of exponential/polynomial/cosine decay.")
    flags.DEFINE_float("decay_rate", 0.94, "Exponential decay factor per decay_steps.")
    flags.DEFINE_float("end_learning_rate", 1e-4, "Final LR of polynomial and cosine decay.")
    flags.DEFINE_list("boundaries", [], "Piecewise schedule: step boundaries.")
    flags.DEFINE_list("boundary_values", [], "Piecewise schedule: LRs (one more than boundaries).")
    flags.DEFINE_integer("warmup_steps", 0, "Linear LR warm-up steps.")
    flags.DEFINE_float("momentum", 0.9, "Momentum (momentum and rmsprop).")
    flags.DEFINE_float("rmsprop_decay", 0.9, "RMSProp decay.")
    flags.DEFINE_float("opt_epsilon", 1.0, "Epsilon of rmsprop and adam.")
    flags.DEFINE_float("adam_beta1", 0.9, "Adam beta1.")
    flags.DEFINE_float("adam_beta2", 0.999, "Adam beta2.")
    flags.DEFINE_float("weight_decay", 1e-4, "L2 weight decay on trained conv weights.")
    flags.DEFINE_float("label_smoothing", 0.0, "Label smoothing.")
    flags.DEFINE_float("batch_norm_decay", 0.997,
                       "BatchNorm moving-average decay; use ~0.9 for short runs.")
    flags.DEFINE_float("moving_average_decay", None, "EMA of weights, used by eval and export.")
    flags.DEFINE_float("clip_gradient_norm", 0.0, "Clip gradients to this global norm (0: off).")
    # Run config.
    flags.DEFINE_string("model_dir", None, "Checkpoints, summaries, exports.")
    flags.DEFINE_enum("mode", "train_and_eval", ["train_and_eval", "train", "eval"], "What to run.")
    flags.DEFINE_integer("max_steps", 1000, "Total training steps (global step).")
    flags.DEFINE_integer("eval_steps", None, "Eval batches (default: the whole eval split).")
    flags.DEFINE_integer("save_checkpoints_steps", 200, "Checkpoint every N steps.")
    flags.DEFINE_integer("save_checkpoints_secs", None, "Or every N seconds (overrides steps).")
    flags.DEFINE_integer("keep_checkpoint_max", 5, "Checkpoints kept.")
    flags.DEFINE_integer("log_step_count_steps", 20, "Progress line every N steps.")
    flags.DEFINE_integer("save_summary_steps", 100, "TensorBoard summaries every N steps.")
    flags.DEFINE_integer("eval_throttle_secs", 10, "Least seconds between evaluations.")
    flags.DEFINE_integer("seed", 0, "Graph-level seed for init, shuffling and crops.")
    # Distribution and speed.
    flags.DEFINE_enum("distribution", "auto", ["auto", "none", "mirrored", "collective"],
                      "auto: mirrored with >1 GPU, PS when TF_CONFIG names ps, collective "
                      "for a TF_CONFIG of workers only.")
    flags.DEFINE_integer("num_gpus", 0, "GPUs to mirror over (MirroredStrategy when > 1).")
    flags.DEFINE_integer("cpu_replicas", 0,
                         "Split the CPU into N logical devices and mirror over them (tests the "
                         "multi-device path without GPUs).")
    flags.DEFINE_bool("xla", False, "XLA JIT compilation.")
    flags.DEFINE_enum("precision", "fp32", ["fp32", "bf16", "fp16"],
                      "bf16: oneDNN auto mixed precision on CPUs with AVX512_BF16; fp16: GPUs.")
    flags.DEFINE_integer("intra_op_threads", 0, "Threads inside ops (0: TF's choice).")
    flags.DEFINE_integer("inter_op_threads", 0, "Ops run concurrently (0: TF's choice).")
    # Export.
    flags.DEFINE_bool("export", True, "Attach the Final and Best exporters (train_and_eval).")
    flags.DEFINE_integer("exports_to_keep", 3, "BestExporter versions kept.")
    flags.DEFINE_string("best_metric", "accuracy", "Eval metric the BestExporter maximises.")
    flags.DEFINE_bool("verify_export", True, "Reload each export and compare with predict().")

    flags.mark_flags_as_required(["data_dir", "model_dir"])

CONFIG_FILE = "slimserve.json"


def build_configs():
    """Flags -> (ModelConfig, InputConfig for train, InputConfig for eval)."""
    from estimator import inputs, model, nets, schema  # pylint: disable=g-import-not-at-top
    spec = nets.get_net(FLAGS.model_name)
    labels_file = FLAGS.labels_file or os.path.join(FLAGS.data_dir, schema.LABELS_FILE)
    if not os.path.exists(labels_file):
        raise ValueError("--labels_file %s does not exist" % labels_file)
    class_names = schema.read_labels(labels_file)
    image_size = FLAGS.image_size or spec.default_image_size
    model_config = model.ModelConfig(
        model_name=FLAGS.model_name, num_classes=len(class_names), class_names=class_names,
        image_size=image_size, checkpoint_path=FLAGS.checkpoint_path,
        checkpoint_exclude_scopes=FLAGS.checkpoint_exclude_scopes,
        ignore_missing_vars=FLAGS.ignore_missing_vars, trainable_scopes=FLAGS.trainable_scopes,
        freeze_scopes=FLAGS.freeze_scopes, frozen_bn_inference=FLAGS.frozen_bn_inference,
        batch_norm_decay=FLAGS.batch_norm_decay, weight_decay=FLAGS.weight_decay,
        label_smoothing=FLAGS.label_smoothing, optimizer=FLAGS.optimizer,
        momentum=FLAGS.momentum, rmsprop_decay=FLAGS.rmsprop_decay,
        opt_epsilon=FLAGS.opt_epsilon, adam_beta1=FLAGS.adam_beta1,
        adam_beta2=FLAGS.adam_beta2, learning_rate=FLAGS.learning_rate,
        learning_rate_schedule=FLAGS.learning_rate_schedule, decay_steps=FLAGS.decay_steps,
        decay_rate=FLAGS.decay_rate, end_learning_rate=FLAGS.end_learning_rate,
        boundaries=[int(b) for b in FLAGS.boundaries],
        boundary_values=[float(v) for v in FLAGS.boundary_values],
        warmup_steps=FLAGS.warmup_steps, moving_average_decay=FLAGS.moving_average_decay,
        clip_gradient_norm=FLAGS.clip_gradient_norm).validate()
    common = dict(image_size=image_size, style=spec.style, shuffle_buffer=FLAGS.shuffle_buffer,
                  cycle_length=FLAGS.cycle_length, num_parallel_calls=FLAGS.num_parallel_calls,
                  prefetch=FLAGS.prefetch, cache=FLAGS.cache,
                  area_range=(FLAGS.min_crop_area, FLAGS.max_crop_area),
                  random_flip=FLAGS.random_flip, central_fraction=FLAGS.eval_central_fraction,
                  seed=FLAGS.seed, verify_shards=FLAGS.verify_shards)
    train_input = inputs.InputConfig(batch_size=FLAGS.batch_size, **common)
    eval_input = inputs.InputConfig(batch_size=FLAGS.eval_batch_size, **common)
    return model_config, train_input, eval_input


def save_run_files(model_dir, model_config, eval_input):
    """flags.txt for reproducibility; slimserve.json for export (written atomically)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.io.gfile.makedirs(model_dir)
    with tf.io.gfile.GFile(os.path.join(model_dir, "flags.txt"), "w") as handle:
        handle.write(FLAGS.flags_into_string())
    payload = {"model": dataclasses.asdict(model_config),
               "serving": eval_input.serving_settings(),
               "data_dir": FLAGS.data_dir, "eval_split": FLAGS.eval_split}
    temp = os.path.join(model_dir, CONFIG_FILE + ".tmp")
    with tf.io.gfile.GFile(temp, "w") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True)
    tf.io.gfile.rename(temp, os.path.join(model_dir, CONFIG_FILE), overwrite=True)


def make_estimator(model_config, model_dir, warm=True):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from estimator import model, run_config  # pylint: disable=g-import-not-at-top
    strategy = run_config.strategy(FLAGS.distribution, FLAGS.num_gpus, FLAGS.cpu_replicas)
    config = tf.estimator.RunConfig(
        model_dir=model_dir, tf_random_seed=FLAGS.seed,
        save_checkpoints_steps=None if FLAGS.save_checkpoints_secs else FLAGS.save_checkpoints_steps,
        save_checkpoints_secs=FLAGS.save_checkpoints_secs,
        keep_checkpoint_max=FLAGS.keep_checkpoint_max,
        log_step_count_steps=FLAGS.log_step_count_steps,
        save_summary_steps=FLAGS.save_summary_steps,
        session_config=run_config.session_config(FLAGS.xla, FLAGS.precision,
                                                 FLAGS.intra_op_threads, FLAGS.inter_op_threads),
        train_distribute=strategy, eval_distribute=strategy)
    params = dataclasses.asdict(model_config)
    if not warm:
        params["checkpoint_path"] = None
    return tf.estimator.Estimator(model.model_fn, config=config, params=params)


def main(argv):
    del argv
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from estimator import dataset, inputs, model, progress, run_config  # pylint: disable=g-import-not-at-top
    if FLAGS.xla:
        run_config.enable_cpu_auto_jit()  # before anything sets up TensorFlow's devices
    try:
        model_config, train_input, eval_input = build_configs()
        train_fn = inputs.make_input_fn(FLAGS.data_dir, FLAGS.train_split, True, train_input)
        eval_fn = inputs.make_input_fn(FLAGS.data_dir, FLAGS.eval_split, False, eval_input)
    except (ValueError, dataset.DatasetError) as error:
        sys.exit("slimserve-train: %s" % error)
    is_chief = _is_chief()
    if is_chief:
        save_run_files(FLAGS.model_dir, model_config, eval_input)
    estimator = make_estimator(model_config, FLAGS.model_dir)
    hooks = [progress.ProgressHook(FLAGS.max_steps, FLAGS.batch_size, FLAGS.log_step_count_steps)]
    started = time.time()
    try:
        if FLAGS.mode == "eval":
            result = estimator.evaluate(eval_fn, steps=FLAGS.eval_steps)
        elif FLAGS.mode == "train" and not run_config.tf_config_cluster():
            estimator.train(train_fn, max_steps=FLAGS.max_steps, hooks=hooks)
            result = None
        else:
            # Also --mode=train in a TF_CONFIG cluster: Estimator trains multi-worker only
            # through train_and_evaluate (evaluation then runs on an evaluator task).
            exporters = []
            if FLAGS.export and FLAGS.mode == "train_and_eval":
                from export import exporters as export_lib  # pylint: disable=g-import-not-at-top
                exporters = export_lib.make_exporters(
                    eval_input.serving_settings(), FLAGS.data_dir, FLAGS.eval_split,
                    FLAGS.exports_to_keep, FLAGS.best_metric, FLAGS.verify_export)
            train_spec = tf.estimator.TrainSpec(train_fn, max_steps=FLAGS.max_steps, hooks=hooks)
            eval_spec = tf.estimator.EvalSpec(eval_fn, steps=FLAGS.eval_steps, name=None,
                                              exporters=exporters, start_delay_secs=0,
                                              throttle_secs=FLAGS.eval_throttle_secs)
            outcome = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
            result = outcome[0] if outcome else None  # None on a cluster's chief/worker
    except model.WarmStartError as error:
        sys.exit("slimserve-train: %s" % error)
    logging.info("done in %.1f s", time.time() - started)
    if result:
        print("eval: " + ", ".join("%s=%.4f" % (k, float(v)) for k, v in sorted(result.items())))


def _is_chief():
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    return task.get("type", "chief") in ("chief", "master") or (
        task.get("type") == "worker" and task.get("index") == 0
        and "chief" not in json.loads(os.environ["TF_CONFIG"]).get("cluster", {}))


def run():
    slimserve_quiet.run_absl_app(main, define_flags)


if __name__ == "__main__":
    run()
