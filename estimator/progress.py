"""A training progress line: step, steps/s, images/s and ETA."""
import logging
import time

import tensorflow as tf


class ProgressHook(tf.estimator.SessionRunHook):
    """Logs `step 120/1000 (12%)  3.1 steps/s  99 img/s  ETA 4m44s` every N steps."""

    def __init__(self, max_steps, batch_size, every_n_steps=20):
        self._max_steps = max_steps
        self._batch_size = batch_size
        self._every = max(1, every_n_steps)
        self._global_step = None
        self._last = None

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def before_run(self, run_context):
        return tf.estimator.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        step = int(run_values.results) + 1
        now = time.time()
        if self._last is None:
            self._last = (step, now)
            return
        last_step, last_time = self._last
        if step - last_step < self._every and step < self._max_steps:
            return
        rate = (step - last_step) / max(now - last_time, 1e-9)
        remaining = max(self._max_steps - step, 0) / max(rate, 1e-9)
        logging.info("step %d/%d (%d%%)  %.2f steps/s  %.1f img/s  ETA %dm%02ds", step,
                     self._max_steps, 100 * step // max(self._max_steps, 1), rate,
                     rate * self._batch_size, remaining // 60, remaining % 60)
        self._last = (step, now)
