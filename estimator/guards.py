"""Stops a training run whose loss is NaN/Inf or has exploded, with an error that says so.

A diverged run otherwise trains on to max_steps (a learning rate of 1e6 with Adam ended
at a loss of 4.6e19 with exit status 0) and its chance-level weights get exported.
The hook raises before that step's checkpoint is saved, so the newest checkpoint on
disk is one taken before the divergence was seen.
"""
import logging
import math

import tensorflow as tf

from slimserve import errors

# model_fn adds its total loss here (replica 0's first under MirroredStrategy), so the
# hook needs no handle on model_fn's tensors.
LOSS_COLLECTION = "slimserve_total_loss"


class DivergenceError(errors.UserError):
    """Training stopped because the loss became non-finite or exploded."""


class LossGuardHook(tf.estimator.SessionRunHook):
    """Raises DivergenceError when the training loss is NaN/Inf (`stop_on_nonfinite`) or
    more than `max_loss_factor` times this run's reference loss (0 turns that off).

    The reference is the first loss this process sees, but at least `loss_floor`
    (ln(num_classes), the loss of a uniform guess): so a run resumed from a well trained
    checkpoint, whose loss is near 0, is not stopped by an ordinary bad batch.
    `max_loss_factor` is 0 or > 1 (the bound of --max_loss_factor, estimator/train_config.py).
    """

    def __init__(self, stop_on_nonfinite=True, max_loss_factor=100.0, loss_floor=1.0):
        self._stop_on_nonfinite = stop_on_nonfinite
        self._factor = max_loss_factor
        self._floor = loss_floor
        self._reference = None
        self._loss = None
        self._step = 0


    def begin(self):
        losses = tf.compat.v1.get_collection(LOSS_COLLECTION)
        if not losses:
            raise ValueError("the model_fn added no loss to the %r collection"
                             % LOSS_COLLECTION)
        self._loss = losses[0]

    def after_create_session(self, session, coord):
        # Counted here rather than fetched each step: a fetched global step races with
        # the train op's increment in the same run call.
        self._step = int(session.run(tf.compat.v1.train.get_global_step()))

    def before_run(self, run_context):
        return tf.estimator.SessionRunArgs(self._loss)

    def after_run(self, run_context, run_values):
        loss = float(run_values.results)
        self._step += 1
        step = self._step
        if not math.isfinite(loss):
            if self._stop_on_nonfinite:
                raise DivergenceError(
                    "training diverged at step %d: the loss is %s (not finite). Lower "
                    "--learning_rate, add --warmup_steps or --clip_gradient_norm; "
                    "--nostop_on_nonfinite_loss trains on regardless" % (step, loss))
            return
        if self._reference is None:
            self._reference = max(loss, self._floor)
            logging.info("loss guard: reference loss %.4g (step %d); stopping above %s",
                         self._reference, step,
                         "%.4g" % (self._factor * self._reference) if self._factor else "-")
            return
        if self._factor and loss > self._factor * self._reference:
            raise DivergenceError(
                "training diverged at step %d: loss %.4g is more than --max_loss_factor=%g "
                "times this run's reference loss %.4g (its first loss, at least ln(classes)). "
                "Lower --learning_rate, add --warmup_steps or --clip_gradient_norm; "
                "--max_loss_factor=0 turns this check off"
                % (step, loss, self._factor, self._reference))
