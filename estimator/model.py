"""model_fn: a slim net fine-tuned from a checkpoint, with frozen scopes done right.

- Warm start (estimator/warm_start.py) restores every checkpoint variable that is not
  excluded, BatchNorm moving statistics included, through variable initialisers: it
  therefore only happens when `model_dir` has no checkpoint yet (resume wins).
- Frozen variables are left out of the optimizer's var_list (no gradient is even
  computed below the lowest trained layer), out of weight decay and of the EMA;
  BatchNorm inside a frozen residual unit runs in inference mode, so its moving
  statistics stay bit-identical too.

`ModelConfig` holds every model and optimisation hyper-parameter. It is the `model`
section of slimserve-train's TrainConfig (estimator/train_config.py): each field is a
flag (slimserve/fields.py) carrying its name, default, help and bound, checked once.
"""
import dataclasses
from typing import Optional, Sequence

import tensorflow as tf

from slimserve import errors
from slimserve import fields
from slimserve.estimator import compat
from slimserve.estimator import guards
from slimserve.estimator import nets
from slimserve.estimator import preprocessing
from slimserve.estimator import warm_start

slim = compat.import_tf_slim()

OPTIMIZERS = ("momentum", "sgd", "rmsprop", "adam")
SCHEDULES = ("fixed", "exponential", "polynomial", "piecewise", "cosine")
DECAYING_SCHEDULES = ("exponential", "polynomial", "cosine")  # these need decay_steps

# --opt_epsilon when it is not given, per optimizer. slim's single default (1.0) was
# tuned for RMSProp on ImageNet; under Adam it divides every step by ~1 instead of by
# the gradient's RMS, so a fine-tuning run at Adam's usual learning rates barely moves.
OPT_EPSILON_DEFAULTS = {"adam": 1e-8, "rmsprop": 1.0}
# --batch_norm_decay when it is not given: BN_DECAY_WINDOWS moving-average windows fit in
# the run (window = 1 / (1 - decay) steps), within slim's range of decays.
BN_DECAY_WINDOWS = 10
BN_DECAY_RANGE = (0.9, 0.997)


@dataclasses.dataclass
class ModelConfig:
    """Every model and optimisation hyper-parameter; each option is a flag of
    slimserve-train. num_classes and class_names come from the data set's labels.txt.
    None marks a value derived from others when unset (`derived`)."""
    model_name: str = fields.option("resnet_v1_50", "The slim net (estimator/nets.py).",
                                    choices=sorted(nets.NETS))
    num_classes: int = 10
    class_names: Sequence[str] = ()
    # Fine-tuning.
    checkpoint_path: Optional[str] = fields.option(
        None, "Checkpoint file or directory to warm-start from.")
    checkpoint_exclude_scopes: Sequence[str] = fields.option(
        (), "Scopes not restored (e.g. the head).")
    ignore_missing_vars: bool = fields.option(
        False, "Train variables the checkpoint lacks from scratch.")
    trainable_scopes: Sequence[str] = fields.option(
        (), "Only these scopes train (slim's meaning; all if empty).")
    freeze_scopes: Sequence[str] = fields.option((), "These scopes never train.")
    frozen_bn_inference: bool = fields.option(
        True, "BatchNorm in frozen residual units runs in inference mode (stats untouched).")
    # Optimisation.
    optimizer: str = fields.option("momentum", "Optimizer.", choices=OPTIMIZERS)
    learning_rate: float = fields.option(0.01, "Initial learning rate.", fields.POSITIVE)
    learning_rate_schedule: str = fields.option("fixed", "LR schedule.", choices=SCHEDULES)
    decay_steps: Optional[int] = fields.option(
        None, "Steps of exponential/polynomial/cosine decay (default: --max_steps, i.e. "
        "decay over the whole run).", fields.POSITIVE, kind=int)
    decay_rate: float = fields.option(0.94, "Exponential decay factor per decay_steps.",
                                      fields.POSITIVE)
    end_learning_rate: float = fields.option(
        1e-4, "Final LR of polynomial and cosine decay.", fields.NON_NEGATIVE)
    boundaries: Sequence[int] = fields.option((), "Piecewise schedule: step boundaries.",
                                              item=int)
    boundary_values: Sequence[float] = fields.option(
        (), "Piecewise schedule: LRs (one more than boundaries).", item=float)
    warmup_steps: int = fields.option(0, "Linear LR warm-up steps.", fields.NON_NEGATIVE)
    momentum: float = fields.option(0.9, "Momentum (momentum and rmsprop).",
                                    fields.NON_NEGATIVE)
    rmsprop_decay: float = fields.option(0.9, "RMSProp decay.", fields.FRACTION)
    opt_epsilon: Optional[float] = fields.option(
        None, "Epsilon of rmsprop and adam (default: per optimizer, adam 1e-8 as in Adam's "
        "paper, rmsprop 1.0 as in slim).", fields.POSITIVE, kind=float)
    adam_beta1: float = fields.option(0.9, "Adam beta1.", fields.FRACTION)
    adam_beta2: float = fields.option(0.999, "Adam beta2.", fields.FRACTION)
    weight_decay: float = fields.option(1e-4, "L2 weight decay on trained conv weights.",
                                        fields.NON_NEGATIVE)
    label_smoothing: float = fields.option(0.0, "Label smoothing.", fields.FRACTION)
    distill_weight: float = fields.option(
        0.0, "Weight of a distillation loss (Learning without Forgetting): on training "
        "records that carry a teacher's probabilities (image/class/teacher, written by "
        "slimserve-retrain), the cross-entropy of the net's answer against them is added "
        "at this weight, so the original images keep the serving version's answers while "
        "the new ones are learnt; 0: off.", fields.Bound(0.0, 100.0))
    batch_norm_decay: Optional[float] = fields.option(
        None, "BatchNorm moving-average decay (default: from --max_steps, 1 - %d/max_steps "
        "within [%g, %g], so the moving statistics forget the checkpoint's within a tenth "
        "of the run: 0.967 for 300 steps, slim's 0.997 from 3334 on)."
        % (BN_DECAY_WINDOWS, BN_DECAY_RANGE[0], BN_DECAY_RANGE[1]), fields.FRACTION,
        kind=float)
    batch_norm_epsilon: float = fields.option(1e-5, "BatchNorm epsilon (slim's ResNet: 1e-5).",
                                              fields.POSITIVE)
    moving_average_decay: Optional[float] = fields.option(
        None, "EMA of weights, used by eval and export.", fields.OPEN_FRACTION, kind=float)
    clip_gradient_norm: float = fields.option(
        0.0, "Clip gradients to this global norm (0: off).", fields.NON_NEGATIVE)
    num_summary_images: int = fields.option(
        3, "Training input images shown in TensorBoard.", fields.NON_NEGATIVE)

    def derived(self, max_steps=None):
        """({field: value}, notes) for the fields left unset whose default follows from
        others: opt_epsilon from the optimizer, batch_norm_decay and decay_steps from the
        run's length `max_steps` (unknown: slim's 0.997, and decay_steps stays unset).
        One note per value, in flag terms, so a run logs what it trained with."""
        values, notes = {}, []
        if self.opt_epsilon is None and default_opt_epsilon(self.optimizer) is not None:
            values["opt_epsilon"] = default_opt_epsilon(self.optimizer)
            notes.append("--opt_epsilon=%g (the default for --optimizer=%s)"
                         % (values["opt_epsilon"], self.optimizer))
        if self.batch_norm_decay is None:
            values["batch_norm_decay"] = default_batch_norm_decay(max_steps)
            if max_steps:
                notes.append("--batch_norm_decay=%g (1 - %d/max_steps within [%g, %g], for "
                             "--max_steps=%d)" % (values["batch_norm_decay"], BN_DECAY_WINDOWS,
                                                  BN_DECAY_RANGE[0], BN_DECAY_RANGE[1],
                                                  max_steps))
        if self.decay_steps is None and max_steps:
            values["decay_steps"] = max_steps
            if self.learning_rate_schedule in DECAYING_SCHEDULES:
                notes.append("--decay_steps=%d (--max_steps)" % max_steps)
        return values, notes

    def resolved(self, max_steps=None):
        """This config with the derived values filled in."""
        return dataclasses.replace(self, **self.derived(max_steps)[0])

    def validate(self):
        """Raises UserError naming the flag of the first value outside its bound or
        choices (fields.check: a --decay_steps=0 otherwise surfaced later as a NaN loss),
        then of the first rule that joins fields; returns self."""
        fields.check(self)
        nets.get_net(self.model_name)
        if self.num_classes < 2:
            raise errors.UserError("a classifier needs at least 2 classes, got %d "
                                   "(labels.txt)" % self.num_classes)
        if self.learning_rate_schedule in DECAYING_SCHEDULES and self.decay_steps is None:
            raise errors.UserError("--decay_steps must be given with "
                                   "--learning_rate_schedule=%s" % self.learning_rate_schedule)
        if list(self.boundaries) != sorted(set(int(b) for b in self.boundaries)):
            raise errors.UserError("--boundaries must be increasing, got %s"
                                   % list(self.boundaries))
        if self.learning_rate_schedule == "piecewise" and (
                len(self.boundary_values) != len(self.boundaries) + 1):
            raise errors.UserError("--boundary_values needs one more value than --boundaries "
                                   "(%d boundaries, %d values)"
                                   % (len(self.boundaries), len(self.boundary_values)))
        if self.class_names and len(self.class_names) != self.num_classes:
            raise errors.UserError("num_classes=%d but %d class names"
                                   % (self.num_classes, len(self.class_names)))
        return self


def default_opt_epsilon(optimizer):
    """Adam's own 1e-8 (Kingma & Ba), RMSProp slim's 1.0; None for optimizers without one."""
    return OPT_EPSILON_DEFAULTS.get(optimizer)


def default_batch_norm_decay(max_steps=None):
    """1 - BN_DECAY_WINDOWS / max_steps, within BN_DECAY_RANGE: the moving mean and
    variance must forget the warm-start checkpoint's statistics (or the random start's)
    well before the run ends. slim's 0.997 keeps 0.997**300 = 41% of the source data's
    statistics after a 300-step fine-tune; the rule gives 0.967 there and 0.997 from
    3,334 steps on. slim's 0.997 when the run's length is unknown."""
    low, high = BN_DECAY_RANGE
    if not max_steps:
        return high
    return round(min(high, max(low, 1.0 - BN_DECAY_WINDOWS / float(max_steps))), 4)


def is_trained(name, config):
    """slim's meaning: trained iff inside --trainable_scopes (all when empty) and not
    inside --freeze_scopes."""
    if config.trainable_scopes and not nets.in_scopes(name, config.trainable_scopes):
        # A scope that contains a trainable scope (e.g. block4 for block4/unit_3) is not
        # frozen as a whole; callers asking about scopes rely on this.
        if not any(s.startswith(name.rstrip("/") + "/") for s in config.trainable_scopes):
            return False
    return not nets.in_scopes(name, config.freeze_scopes)


def trained_variables(config):
    return [v for v in tf.compat.v1.trainable_variables() if is_trained(v.op.name, config)]


def _learning_rate(config, global_step):
    step = tf.cast(global_step, tf.float32)
    schedule = config.learning_rate_schedule
    lr = config.learning_rate
    if schedule == "exponential":
        rate = tf.compat.v1.train.exponential_decay(lr, global_step, config.decay_steps,
                                                    config.decay_rate, staircase=True)
    elif schedule == "polynomial":
        rate = tf.compat.v1.train.polynomial_decay(lr, global_step, config.decay_steps,
                                                   config.end_learning_rate, power=1.0)
    elif schedule == "piecewise":
        rate = tf.compat.v1.train.piecewise_constant(
            global_step, [int(b) for b in config.boundaries],
            [float(v) for v in config.boundary_values])
    elif schedule == "cosine":
        rate = tf.compat.v1.train.cosine_decay(lr, global_step, config.decay_steps,
                                               alpha=config.end_learning_rate / lr)
    else:
        rate = tf.constant(lr, tf.float32)
    rate = tf.cast(rate, tf.float32)
    if config.warmup_steps > 0:
        ramp = tf.minimum(1.0, (step + 1.0) / float(config.warmup_steps))
        rate = rate * ramp
    return rate


def _optimizer(config, learning_rate):
    v1 = tf.compat.v1.train
    epsilon = config.opt_epsilon  # filled by ModelConfig.resolved() for rmsprop and adam
    if config.optimizer == "momentum":
        return v1.MomentumOptimizer(learning_rate, config.momentum)
    if config.optimizer == "rmsprop":
        return v1.RMSPropOptimizer(learning_rate, decay=config.rmsprop_decay,
                                   momentum=config.momentum, epsilon=epsilon)
    if config.optimizer == "adam":
        return v1.AdamOptimizer(learning_rate, config.adam_beta1, config.adam_beta2,
                                epsilon=epsilon)
    return v1.GradientDescentOptimizer(learning_rate)


@compat.plain_graph_building
def build_logits(config, images, is_training):
    config = config.resolved()  # e.g. batch_norm_decay left unset by a library caller
    spec = nets.get_net(config.model_name)
    frozen = lambda scope: config.frozen_bn_inference and not is_trained(scope, config)  # noqa: E731
    with slim.arg_scope(spec.arg_scope(config.batch_norm_decay, config.batch_norm_epsilon)):
        logits, end_points = spec.build(images, config.num_classes, is_training, frozen)
    if logits.shape.rank == 4:
        logits = tf.squeeze(logits, axis=[1, 2], name="SpatialSqueeze")
    return spec, logits, end_points


def predictions_from_logits(logits, class_names):
    probabilities = tf.nn.softmax(logits, name="probabilities")
    classes = tf.argmax(logits, axis=1, name="classes")
    names = tf.constant(list(class_names) or [str(i) for i in range(logits.shape[-1])])
    return {
        "classes": classes,
        "probabilities": probabilities,
        "class_names": tf.gather(names, classes, name="class_names"),
    }


def embeddings_from_logits(logits):
    """[B, D] penultimate features of the net that produced `logits` (nets.logits_input,
    spatial dimensions averaged away: 1x1 after slim's global pool): what the export's
    `embeddings` signature serves and drift detection compares."""
    features = nets.logits_input(logits)
    if features.shape.rank == 4:
        features = tf.reduce_mean(features, axis=[1, 2])
    return tf.identity(tf.cast(features, tf.float32), name="embeddings")


def distillation_loss(features, logits):
    """Mean cross-entropy of the net's answers against features["teacher"], over the
    records that have a teacher (a row of zeros has none: a new label). Needs the input
    pipeline's teacher (inputs.make_input_fn teacher_classes)."""
    if not isinstance(features, dict) or "teacher" not in features:
        raise errors.UserError(
            "--distill_weight needs training records with a teacher's probabilities "
            "(image/class/teacher): slimserve-retrain writes them; a data set from "
            "slimserve-convert has none")
    teacher = tf.cast(features["teacher"], tf.float32)
    has_teacher = tf.cast(tf.reduce_sum(teacher, axis=1) > 0, tf.float32)
    per_record = tf.nn.softmax_cross_entropy_with_logits(
        labels=teacher, logits=tf.cast(logits, tf.float32))
    return tf.reduce_sum(per_record * has_teacher) / tf.maximum(tf.reduce_sum(has_teacher), 1.0)


def ema_saver(config):
    """A Saver that loads EMA weights into the model variables (eval and export)."""
    if not config.moving_average_decay:
        return None
    ema = tf.train.ExponentialMovingAverage(config.moving_average_decay)
    return tf.compat.v1.train.Saver(
        ema.variables_to_restore(moving_avg_variables=trained_variables(config)),
        sharded=True)


def model_fn(features, labels, mode, params, config=None):
    """Estimator model_fn; params is `dataclasses.asdict(ModelConfig)`, config the
    Estimator's RunConfig (Estimator passes it by that name; its model_dir decides
    whether this is a resume)."""
    model_dir = getattr(config, "model_dir", None)
    model_config = ModelConfig(**params).resolved().validate()
    is_training = mode == tf.estimator.ModeKeys.TRAIN
    images = features["image"] if isinstance(features, dict) else features
    update_ops_before = len(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS))
    spec, logits, _ = build_logits(model_config, images, is_training)
    # Only this call's update ops: under MirroredStrategy each replica adds its own.
    update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)[update_ops_before:]
    predictions = predictions_from_logits(logits, model_config.class_names)

    if mode == tf.estimator.ModeKeys.PREDICT:
        served = dict(predictions)
        predictions["embeddings"] = embeddings_from_logits(logits)
        return tf.estimator.EstimatorSpec(
            mode, predictions=predictions,
            export_outputs={"serving_default": tf.estimator.export.PredictOutput(served)},
            scaffold=tf.compat.v1.train.Scaffold(saver=ema_saver(model_config)))

    labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)
    one_hot = tf.one_hot(labels, model_config.num_classes)
    cross_entropy = tf.compat.v1.losses.softmax_cross_entropy(
        one_hot, logits, label_smoothing=model_config.label_smoothing)
    train_vars = trained_variables(model_config)
    decayed = [v for v in train_vars if v.op.name.endswith("/weights")]
    loss = cross_entropy
    if is_training and model_config.distill_weight > 0:
        loss += model_config.distill_weight * distillation_loss(features, logits)
    if model_config.weight_decay > 0 and decayed:
        loss += model_config.weight_decay * tf.add_n([tf.nn.l2_loss(v) for v in decayed])
    tf.compat.v1.add_to_collection(guards.LOSS_COLLECTION, loss)  # for guards.LossGuardHook

    accuracy = tf.compat.v1.metrics.accuracy(labels, predictions["classes"])
    metrics = {
        "accuracy": accuracy,
        "mean_per_class_accuracy": tf.compat.v1.metrics.mean_per_class_accuracy(
            labels, predictions["classes"], model_config.num_classes),
    }
    if model_config.num_classes > 5:
        metrics["top_5_accuracy"] = tf.compat.v1.metrics.mean(
            tf.cast(tf.nn.in_top_k(predictions=logits, targets=labels, k=5), tf.float32))

    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, eval_metric_ops=metrics, predictions=predictions,
            scaffold=tf.compat.v1.train.Scaffold(saver=ema_saver(model_config)))

    global_step = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = _learning_rate(model_config, global_step)
    optimizer = _optimizer(model_config, learning_rate)
    if not train_vars:
        raise errors.UserError("no variable is trained: --trainable_scopes=%s, "
                               "--freeze_scopes=%s" % (list(model_config.trainable_scopes),
                                                      list(model_config.freeze_scopes)))
    grads_and_vars = optimizer.compute_gradients(loss, var_list=train_vars)
    if model_config.clip_gradient_norm > 0:
        grads, variables = zip(*grads_and_vars)
        grads, _ = tf.clip_by_global_norm(grads, model_config.clip_gradient_norm)
        grads_and_vars = list(zip(grads, variables))
    with tf.control_dependencies(update_ops):
        train_op = optimizer.apply_gradients(grads_and_vars, global_step=global_step)
    if model_config.moving_average_decay:
        ema = tf.train.ExponentialMovingAverage(model_config.moving_average_decay,
                                                num_updates=global_step)
        with tf.control_dependencies([train_op]):
            train_op = ema.apply(train_vars)

    batch_accuracy = tf.reduce_mean(tf.cast(tf.equal(predictions["classes"],
                                                     tf.cast(labels, tf.int64)), tf.float32))
    tf.compat.v1.summary.scalar("learning_rate", learning_rate)
    tf.compat.v1.summary.scalar("train_accuracy", batch_accuracy)
    tf.compat.v1.summary.scalar("cross_entropy", cross_entropy)
    if model_config.num_summary_images:
        shown = preprocessing.denormalize(images[:model_config.num_summary_images],
                                          nets.get_net(model_config.model_name).style)
        tf.compat.v1.summary.image("input", tf.clip_by_value(shown / 255.0, 0.0, 1.0),
                                   max_outputs=model_config.num_summary_images)
    warm_start.warm_start(model_config, spec, model_dir)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

