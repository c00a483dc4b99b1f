"""What slimserve-train prints while it runs: a progress line (step, loss, steps/s,
images/s, ETA) and a line per evaluation; TensorFlow's own INFO log waits for
--verbosity=1."""
import logging
import time

import tensorflow as tf

from slimserve.estimator import guards


class ProgressHook(tf.estimator.SessionRunHook):
    """Logs `step 120/1000 (12%)  loss 0.8123  3.1 steps/s  99 img/s  ETA 4m44s` every N
    steps (the loss is the total training loss, weight decay included)."""

    def __init__(self, max_steps, batch_size, every_n_steps=20):
        self._max_steps = max_steps
        self._batch_size = batch_size
        self._every = max(1, every_n_steps)
        self._fetches = None
        self._last = None

    def begin(self):
        self._fetches = {"step": tf.compat.v1.train.get_global_step()}
        losses = tf.compat.v1.get_collection(guards.LOSS_COLLECTION)
        if losses:
            self._fetches["loss"] = losses[0]

    def before_run(self, run_context):
        return tf.estimator.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values):
        step = int(run_values.results["step"]) + 1
        loss = run_values.results.get("loss")
        now = time.time()
        if self._last is None:
            self._last = (step, now)
            return
        last_step, last_time = self._last
        if step - last_step < self._every and step < self._max_steps:
            return
        rate = (step - last_step) / max(now - last_time, 1e-9)
        remaining = max(self._max_steps - step, 0) / max(rate, 1e-9)
        logging.info("step %d/%d (%d%%)  %s%.2f steps/s  %.1f img/s  ETA %dm%02ds", step,
                     self._max_steps, 100 * step // max(self._max_steps, 1),
                     "loss %.4f  " % loss if loss is not None else "", rate,
                     rate * self._batch_size, remaining // 60, remaining % 60)
        self._last = (step, now)


class EvalLogger(tf.estimator.Exporter):
    """Logs one line per evaluation of train_and_evaluate (`eval at step 300: accuracy
    0.8125, ...`): attached as the first exporter, the one place every evaluation
    result passes through, so the console shows evaluations without TensorFlow's INFO log."""

    @property
    def name(self):
        return "eval_log"

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        del estimator, export_path, checkpoint_path, is_the_final_export
        logging.info("eval at step %d: %s", int(eval_result.get("global_step", -1)),
                     ", ".join("%s %.4f" % (k, float(v)) for k, v in sorted(eval_result.items())
                               if k != "global_step"))
        return None
