"""Training as a library: `run(TrainConfig)` -> TrainResult (Model Garden's train_lib).

    config = train_config.TrainConfig()       # or fields.from_flags(TrainConfig)
    config.data.data_dir, config.run.model_dir = "data/", "runs/mine"
    result = training.run(config, exporters_factory=exporters.for_training)

Owns the order of a run, so slimserve-train only builds the config and prints the result:
1. applies a --recipe to the settings not given, then checks before anything is
   written: the config's rules, the data set, the labels, the
   exporters' settings, and a --checkpoint_path of another net (named with the
   --model_name to pass);
2. the chief takes `<model_dir>/train.lock` (one trainer per model_dir), checks the
   checkpoint it resumes from (intact, same head) and writes the run files (flags.txt,
   slimserve.json: estimator/run_files.py);
3. trains --mode with the progress and loss-guard hooks: train_and_evaluate attaches the
   exporters, an evaluation logger first.
A permission error or a full disk under --model_dir is a UserError naming it. The
estimator library never imports export/: the exporters come from `exporters_factory`
(config, eval preprocessing) -> [tf.estimator.Exporter]; an exporter with `refusal` and
`exported` attributes (export/exporters.py) is reported in the result.
"""
import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from typing import Dict, List, Optional

import tensorflow as tf

from slimserve import errors
from slimserve.estimator import checkpoints
from slimserve.estimator import guards
from slimserve.estimator import inputs
from slimserve.estimator import model
from slimserve.estimator import progress
from slimserve.estimator import recipes
from slimserve.estimator import run_config
from slimserve.estimator import run_files
from slimserve.estimator import run_lock
from slimserve.estimator import schema
from slimserve.estimator import warm_start


@dataclasses.dataclass
class TrainResult:
    """What a run produced: the last evaluation (None after --mode=train, or on a cluster
    task that is not the evaluator), the versions the exporters wrote that still exist
    (pruned ones left out), and why each exporter that wrote nothing refused."""
    eval_result: Optional[Dict[str, float]] = None
    exported: List[str] = dataclasses.field(default_factory=list)
    refused: Dict[str, str] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    @property
    def export_refused(self):
        """True when exporters were attached, some refused and none exported."""
        return bool(self.refused) and not self.exported

    @classmethod
    def of(cls, eval_result, exporters, seconds):
        gated = [e for e in exporters if hasattr(e, "refusal")]
        return cls(eval_result=dict(eval_result) if eval_result else None,
                   exported=[path for e in gated for path in e.exported
                             if tf.io.gfile.exists(path)],
                   refused={e.name: e.refusal for e in gated if e.refusal and not e.exported},
                   seconds=seconds)


def build_configs(config):
    """TrainConfig -> (ModelConfig, the evaluation/serving preprocessing.Spec).

    The ModelConfig gets the data set's classes and the defaults that derive from other
    flags (logged, so the run says what it trained with)."""
    inputs.check_data_dir(config.data.data_dir, config.data.train_split)
    labels_file = config.data.labels_path()
    if not tf.io.gfile.exists(labels_file):
        raise errors.UserError("--labels_file %s does not exist" % labels_file)
    class_names = schema.read_labels(labels_file)
    derived, notes = config.derived_defaults()
    model_config = dataclasses.replace(config.model, num_classes=len(class_names),
                                       class_names=list(class_names), **derived).validate()
    if notes:
        logging.info("defaults for this run: %s", "; ".join(notes))
    return model_config, config.preprocess()


def _teacher_classes(config, model_config):
    """The number of teacher probabilities per training record when --distill_weight
    distils (0 when it does not); the data set must say it carries them."""
    if not model_config.distill_weight:
        return 0
    info_path = os.path.join(config.data.data_dir, schema.INFO_FILE)
    try:
        with tf.io.gfile.GFile(info_path) as handle:
            info = json.load(handle)
    except (OSError, tf.errors.OpError, ValueError) as error:
        raise errors.UserError("--data_dir: %s cannot be read (%s)" % (info_path, error)) \
            from None
    if not isinstance(info, dict) or not info.get("teacher"):
        raise errors.UserError(
            "--distill_weight %g: --data_dir %s has no teacher probabilities (%s has no "
            "\"teacher\"): slimserve-retrain writes them when it distils; pass "
            "--distill_weight=0 to train on a data set from slimserve-convert"
            % (model_config.distill_weight, config.data.data_dir, info_path))
    return model_config.num_classes


def make_estimator(config, model_config):
    """The Estimator with the RunConfig the config describes."""
    run, speed = config.run, config.distribution
    strategy = run_config.strategy(speed.distribution, speed.num_gpus, speed.cpu_replicas)
    estimator_config = tf.estimator.RunConfig(
        model_dir=run.model_dir, tf_random_seed=run.seed,
        save_checkpoints_steps=run.checkpoint_steps(),
        save_checkpoints_secs=run.save_checkpoints_secs,
        keep_checkpoint_max=run.keep_checkpoint_max,
        checkpoint_save_graph_def=run.checkpoint_save_graph_def,
        log_step_count_steps=run.log_step_count_steps,
        save_summary_steps=run.save_summary_steps,
        session_config=run_config.session_config(speed.xla, speed.precision,
                                                 speed.intra_op_threads,
                                                 speed.inter_op_threads),
        train_distribute=strategy, eval_distribute=strategy)
    return tf.estimator.Estimator(model.model_fn, config=estimator_config,
                                  params=dataclasses.asdict(model_config))


def _resuming(model_dir):
    if tf.io.gfile.isdir(model_dir):
        try:
            return bool(checkpoints.listed_checkpoints(model_dir))
        except checkpoints.CheckpointError:
            return True  # a broken state file: check_resume names it
    return False


def check_warm_start(config):
    """Before the graph is built and before train.lock or anything else is written into
    --model_dir: a --checkpoint_path of another net fails, naming the --model_name to
    pass; frozen, trainable or excluded scopes without a --checkpoint_path fail, naming
    them (they would freeze random weights). A run that resumes from its own checkpoint
    skips both (its weights come from that checkpoint)."""
    if config.run.mode == "eval" or _resuming(config.run.model_dir):
        return
    if not config.model.checkpoint_path:
        warm_start.check_needs_checkpoint(config.model)
        return
    warm_start.check_checkpoint_net(config.model.checkpoint_path, config.model.model_name)


def check_resume(config, model_config, repair):
    """The checkpoint to resume from, checked (intact, same head) before any graph is built."""
    model_dir = config.run.model_dir
    if not tf.io.gfile.isdir(model_dir):
        return None
    resume = checkpoints.resume_checkpoint(model_dir, repair=repair)
    if resume:
        checkpoints.check_head(resume, model_config.model_name, model_config.num_classes,
                               "the labels in %s" % config.data.labels_path())
    return resume


def _hooks(config, model_config):
    return [progress.ProgressHook(config.run.max_steps, config.input.batch_size,
                                  config.run.log_step_count_steps),
            guards.LossGuardHook(config.guards.stop_on_nonfinite_loss,
                                 config.guards.max_loss_factor,
                                 loss_floor=math.log(model_config.num_classes))]


def _train(config, estimator, model_config, train_fn, eval_fn, exporters):
    """Runs --mode; returns (eval result or None, the exporters attached)."""
    run = config.run
    hooks = _hooks(config, model_config)
    if run.mode == "eval":
        return estimator.evaluate(eval_fn, steps=run.eval_steps), []
    if run.mode == "train" and not run_config.tf_config_cluster():
        estimator.train(train_fn, max_steps=run.max_steps, hooks=hooks)
        return None, []
    # Also --mode=train in a TF_CONFIG cluster: Estimator trains multi-worker only
    # through train_and_evaluate (evaluation then runs on an evaluator task).
    attached = [progress.EvalLogger()]  # one line per evaluation, before the exports
    if run.mode == "train_and_eval":
        attached += exporters
    train_spec = tf.estimator.TrainSpec(train_fn, max_steps=run.max_steps, hooks=hooks)
    eval_spec = tf.estimator.EvalSpec(eval_fn, steps=run.eval_steps, name=None,
                                      exporters=attached, start_delay_secs=0,
                                      throttle_secs=run.eval_throttle_secs)
    outcome = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    return (outcome[0] if outcome else None), attached  # None on a cluster's chief/worker


def run(config, exporters_factory=None):
    """Trains as `config` says; returns a TrainResult. Errors the user can fix (a flag,
    the data set, the checkpoint, the lock, a divergence, a full --model_dir) are
    UserErrors naming what to change.

    exporters_factory(config, eval preprocessing) -> exporters attached to a
    train_and_eval run when --export is on (slimserve-train passes
    export/exporters.py `for_training`); it is called before anything is written, so
    its settings are checked first. A --recipe fills the settings the config did not
    give first (estimator/recipes/), so flags.txt records what the run trained with."""
    config, recipe_line = recipes.apply(config)
    if recipe_line:
        logging.info("%s", recipe_line)
    config.validate()
    model_config, preprocess = build_configs(config)
    data, seed = config.data, config.run.seed
    train_fn = inputs.make_input_fn(data.data_dir, data.train_split, True, config.input,
                                    preprocess, seed,
                                    teacher_classes=_teacher_classes(config, model_config))
    eval_fn = inputs.make_input_fn(data.data_dir, data.eval_split, False, config.input,
                                   preprocess, seed)
    exporters = []
    if exporters_factory is not None and config.export.export:
        exporters = list(exporters_factory(config, preprocess))
    check_warm_start(config)
    model_dir = config.run.model_dir
    chief = run_config.is_chief()
    started = time.time()
    with errors.writing(model_dir, "--model_dir"):
        # One trainer per model_dir: the chief locks it before writing anything there.
        lock = None
        if chief and config.run.mode != "eval":
            lock = run_lock.RunLock(model_dir, force=config.guards.force_unlock)
        with lock or contextlib.nullcontext():
            if chief:
                check_resume(config, model_config, repair=lock is not None)
                run_files.write(model_dir, model_config, preprocess,
                                data.data_dir, data.eval_split, config.flagfile_text())
            estimator = make_estimator(config, model_config)
            eval_result, attached = _train(config, estimator, model_config, train_fn,
                                           eval_fn, exporters)
    seconds = time.time() - started
    logging.info("done in %.1f s", seconds)
    return TrainResult.of(eval_result, attached, seconds)
