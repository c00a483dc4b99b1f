"""model_fn: a slim net fine-tuned from a checkpoint, with frozen scopes done right.

- Warm start restores every checkpoint variable that is not excluded, BatchNorm
  moving statistics included, through variable initialisers: it therefore only
  happens when `model_dir` has no checkpoint yet (resume wins).
- Frozen variables are left out of the optimizer's var_list (no gradient is even
  computed below the lowest trained layer), out of weight decay and of the EMA;
  BatchNorm inside a frozen residual unit runs in inference mode, so its moving
  statistics stay bit-identical too.
"""
import collections
import dataclasses
import logging
from typing import Optional, Sequence

import tensorflow as tf

from slimserve.estimator import compat  # noqa: F401  pylint: disable=unused-import
from slimserve.estimator import guards
from slimserve.estimator import nets
from slimserve.estimator import preprocessing

import tf_slim as slim  # pylint: disable=g-bad-import-order

OPTIMIZERS = ("momentum", "sgd", "rmsprop", "adam")
SCHEDULES = ("fixed", "exponential", "polynomial", "piecewise", "cosine")
_SLOT_SUFFIXES = ("/Momentum", "/RMSProp", "/RMSProp_1", "/Adam", "/Adam_1")


@dataclasses.dataclass
class ModelConfig:
    """Every model and optimisation hyper-parameter; each is a flag in train.py."""
    model_name: str = "resnet_v1_50"
    num_classes: int = 10
    class_names: Sequence[str] = ()
    checkpoint_path: Optional[str] = None
    checkpoint_exclude_scopes: Sequence[str] = ()
    ignore_missing_vars: bool = False
    trainable_scopes: Sequence[str] = ()
    freeze_scopes: Sequence[str] = ()
    frozen_bn_inference: bool = True
    batch_norm_decay: float = 0.997  # slim's; slimserve-train derives it from --max_steps
    batch_norm_epsilon: float = 1e-5
    weight_decay: float = 1e-4
    label_smoothing: float = 0.0
    optimizer: str = "momentum"
    momentum: float = 0.9
    rmsprop_decay: float = 0.9
    opt_epsilon: Optional[float] = None  # None: default_opt_epsilon(optimizer)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    learning_rate: float = 0.01
    learning_rate_schedule: str = "fixed"
    decay_steps: int = 1000  # slimserve-train: --max_steps unless --decay_steps is given
    decay_rate: float = 0.94
    end_learning_rate: float = 1e-4
    boundaries: Sequence[int] = ()
    boundary_values: Sequence[float] = ()
    warmup_steps: int = 0
    moving_average_decay: Optional[float] = None
    clip_gradient_norm: float = 0.0
    num_summary_images: int = 3

    def validate(self):
        """Raises ValueError naming the flag of the first out-of-range value (a
        --decay_steps=0 otherwise surfaced later as a NaN loss)."""
        nets.get_net(self.model_name)
        for name, ok, rule in _RANGES:
            value = getattr(self, name)
            if value is not None and not ok(value):
                raise ValueError("--%s must be %s, got %r" % (name, rule, value))
        if self.num_classes < 2:
            raise ValueError("a classifier needs at least 2 classes, got %d (labels.txt)"
                             % self.num_classes)
        if self.learning_rate_schedule in ("exponential", "polynomial", "cosine") and (
                self.decay_steps < 1):
            raise ValueError("--decay_steps must be > 0 with --learning_rate_schedule=%s, "
                             "got %r" % (self.learning_rate_schedule, self.decay_steps))
        if list(self.boundaries) != sorted(set(int(b) for b in self.boundaries)):
            raise ValueError("--boundaries must be increasing, got %s" % list(self.boundaries))
        if self.optimizer not in OPTIMIZERS:
            raise ValueError("--optimizer must be one of %s, got %r" % (OPTIMIZERS, self.optimizer))
        if self.learning_rate_schedule not in SCHEDULES:
            raise ValueError("--learning_rate_schedule must be one of %s, got %r"
                             % (SCHEDULES, self.learning_rate_schedule))
        if self.learning_rate_schedule == "piecewise" and (
                len(self.boundary_values) != len(self.boundaries) + 1):
            raise ValueError("--boundary_values needs one more value than --boundaries "
                             "(%d boundaries, %d values)"
                             % (len(self.boundaries), len(self.boundary_values)))
        if self.class_names and len(self.class_names) != self.num_classes:
            raise ValueError("num_classes=%d but %d class names"
                             % (self.num_classes, len(self.class_names)))
        return self


_POSITIVE, _NON_NEGATIVE, _FRACTION = "> 0", ">= 0", "in [0, 1)"
# (ModelConfig field = flag name, check, rule in words); ModelConfig.validate() applies them.
_RANGES = (
    ("learning_rate", lambda v: v > 0, _POSITIVE),
    ("decay_rate", lambda v: v > 0, _POSITIVE),
    ("end_learning_rate", lambda v: v >= 0, _NON_NEGATIVE),
    ("warmup_steps", lambda v: v >= 0, _NON_NEGATIVE),
    ("momentum", lambda v: v >= 0, _NON_NEGATIVE),
    ("rmsprop_decay", lambda v: 0 <= v < 1, _FRACTION),
    ("opt_epsilon", lambda v: v > 0, _POSITIVE),
    ("adam_beta1", lambda v: 0 <= v < 1, _FRACTION),
    ("adam_beta2", lambda v: 0 <= v < 1, _FRACTION),
    ("weight_decay", lambda v: v >= 0, _NON_NEGATIVE),
    ("label_smoothing", lambda v: 0 <= v < 1, _FRACTION),
    ("batch_norm_decay", lambda v: 0 <= v < 1, _FRACTION),
    ("batch_norm_epsilon", lambda v: v > 0, _POSITIVE),
    ("moving_average_decay", lambda v: 0 < v < 1, "in (0, 1)"),
    ("clip_gradient_norm", lambda v: v >= 0, _NON_NEGATIVE),
    ("num_summary_images", lambda v: v >= 0, _NON_NEGATIVE),
)


def _in_scopes(name, scopes):
    return any(name == s or name.startswith(s.rstrip("/") + "/") for s in scopes)


def is_trained(name, config):
    """slim's meaning: trained iff inside --trainable_scopes (all when empty) and not
    inside --freeze_scopes."""
    if config.trainable_scopes and not _in_scopes(name, config.trainable_scopes):
        # A scope that contains a trainable scope (e.g. block4 for block4/unit_3) is not
        # frozen as a whole; callers asking about scopes rely on this.
        if not any(s.startswith(name.rstrip("/") + "/") for s in config.trainable_scopes):
            return False
    return not _in_scopes(name, config.freeze_scopes)


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


# --opt_epsilon when it is not given, per optimizer. slim's single default (1.0) was
# tuned for RMSProp on ImageNet; under Adam it divides every step by ~1 instead of by
# the gradient's RMS, so a fine-tuning run at Adam's usual learning rates barely moves.
OPT_EPSILON_DEFAULTS = {"adam": 1e-8, "rmsprop": 1.0}
# --batch_norm_decay when it is not given: BN_DECAY_WINDOWS moving-average windows fit in
# the run (window = 1 / (1 - decay) steps), within slim's range of decays.
BN_DECAY_WINDOWS = 10
BN_DECAY_RANGE = (0.9, 0.997)


def default_opt_epsilon(optimizer):
    """Adam's own 1e-8 (Kingma & Ba), RMSProp slim's 1.0; None for optimizers without one."""
    return OPT_EPSILON_DEFAULTS.get(optimizer)


def default_batch_norm_decay(max_steps):
    """1 - BN_DECAY_WINDOWS / max_steps, within BN_DECAY_RANGE: the moving mean and
    variance must forget the warm-start checkpoint's statistics (or the random start's)
    well before the run ends. slim's 0.997 keeps 0.997**300 = 41% of the source data's
    statistics after a 300-step fine-tune; the rule gives 0.967 there and 0.997 from
    3,334 steps on."""
    low, high = BN_DECAY_RANGE
    return round(min(high, max(low, 1.0 - BN_DECAY_WINDOWS / float(max_steps))), 4)


def _optimizer(config, learning_rate):
    v1 = tf.compat.v1.train
    epsilon = config.opt_epsilon
    if epsilon is None:
        epsilon = default_opt_epsilon(config.optimizer)
    if config.optimizer == "momentum":
        return v1.MomentumOptimizer(learning_rate, config.momentum)
    if config.optimizer == "rmsprop":
        return v1.RMSPropOptimizer(learning_rate, decay=config.rmsprop_decay,
                                   momentum=config.momentum, epsilon=epsilon)
    if config.optimizer == "adam":
        return v1.AdamOptimizer(learning_rate, config.adam_beta1, config.adam_beta2,
                                epsilon=epsilon)
    return v1.GradientDescentOptimizer(learning_rate)


class WarmStartError(ValueError):
    """The checkpoint does not fit the model; the message names the variable."""


def _model_variables(spec):
    prefix = spec.name + "/"
    return [v for v in tf.compat.v1.global_variables()
            if v.op.name.startswith(prefix) and not v.op.name.endswith(_SLOT_SUFFIXES)]


def checkpoint_file(checkpoint_path):
    """--checkpoint_path as a checkpoint prefix: the newest checkpoint of a directory."""
    if tf.io.gfile.isdir(checkpoint_path):
        latest = tf.train.latest_checkpoint(checkpoint_path)
        if not latest:
            raise WarmStartError("--checkpoint_path %s holds no checkpoint" % checkpoint_path)
        return latest
    return checkpoint_path


def _checkpoint_shapes(checkpoint_path):
    try:
        return dict(tf.train.list_variables(checkpoint_path))
    except (tf.errors.NotFoundError, tf.errors.DataLossError, ValueError) as error:
        raise WarmStartError("cannot read --checkpoint_path %s: %s"
                             % (checkpoint_path, error)) from None


def check_checkpoint_net(checkpoint_path, model_name):
    """Raises WarmStartError naming the --model_name to pass when the checkpoint holds
    another net (its variables live under another top-level scope, e.g. resnet_v1_101/).

    Checked before any graph is built or file written: otherwise every variable was
    "missing" and the error suggested --ignore_missing_vars, which trains from scratch
    and silently discards the checkpoint."""
    path = checkpoint_file(checkpoint_path)
    shapes = _checkpoint_shapes(path)
    spec = nets.get_net(model_name)
    scopes = collections.Counter(name.split("/", 1)[0] for name in shapes if "/" in name)
    if spec.name in scopes:
        return path
    if not scopes:
        raise WarmStartError("--checkpoint_path %s holds no variables of a slim net (it "
                             "has %s)" % (path, ", ".join(sorted(shapes)[:5]) or "nothing"))
    scope = scopes.most_common(1)[0][0]
    if scope in nets.NETS:
        other = nets.get_net(scope)
        raise WarmStartError(
            "--checkpoint_path %s is a %s checkpoint (its variables are under %s/) but "
            "--model_name=%s: pass --model_name=%s (and --checkpoint_exclude_scopes=%s to "
            "train a new head)" % (path, scope, scope, model_name, scope,
                                   ",".join(other.head_scopes)))
    raise WarmStartError(
        "--checkpoint_path %s holds variables under %s/, which no --model_name builds (%s); "
        "use a checkpoint of one of those nets" % (path, scope, ", ".join(sorted(nets.NETS))))


def warm_start_plan(checkpoint_path, variables, exclude_scopes, ignore_missing_vars):
    """Decides, for each model variable, restore / excluded / missing.

    Returns (checkpoint file, assignment_map ckpt_name -> [variables], table dict); the
    file is the newest checkpoint when `checkpoint_path` is a directory. An EMA shadow
    that the checkpoint lacks is restored from its base variable, so averaging starts
    from the checkpoint rather than from random initial values.
    """
    checkpoint_path = checkpoint_file(checkpoint_path)
    shapes = _checkpoint_shapes(checkpoint_path)
    assignment, table = {}, {"restored": [], "excluded": [], "missing": []}
    shadow = "/ExponentialMovingAverage"
    for var in variables:
        name = var.op.name
        if _in_scopes(name, exclude_scopes):
            table["excluded"].append(name)
            continue
        source = name
        if source not in shapes and name.endswith(shadow) and name[:-len(shadow)] in shapes:
            source = name[:-len(shadow)]
        if source not in shapes:
            table["missing"].append(name)
            continue
        model_shape = var.shape.as_list()
        if list(shapes[source]) != model_shape:
            raise WarmStartError(
                "shape mismatch for %s: checkpoint %s has %s, model has %s; add its scope to "
                "--checkpoint_exclude_scopes" % (name, checkpoint_path, list(shapes[source]),
                                                 model_shape))
        assignment.setdefault(source, []).append(var)
        table["restored"].append(name)
    if table["missing"] and not ignore_missing_vars:
        raise WarmStartError(
            "%d model variables are not in %s (first: %s); pass --ignore_missing_vars to "
            "train them from scratch" % (len(table["missing"]), checkpoint_path,
                                         table["missing"][0]))
    return checkpoint_path, assignment, table


def _log_warm_start(checkpoint_path, table):
    logging.info("warm start from %s: %d restored, %d excluded, %d missing", checkpoint_path,
                 len(table["restored"]), len(table["excluded"]), len(table["missing"]))
    for kind in ("excluded", "missing"):
        for name in table[kind]:
            logging.info("  %-8s %s", kind, name)


def apply_warm_start(config, spec):
    variables = _model_variables(spec)
    path, assignment, table = warm_start_plan(
        config.checkpoint_path, variables, config.checkpoint_exclude_scopes,
        config.ignore_missing_vars)
    # init_from_checkpoint maps one checkpoint tensor to one variable per call.
    rounds = max((len(v) for v in assignment.values()), default=0)
    for index in range(rounds):
        mapping = {name: targets[index] for name, targets in assignment.items()
                   if len(targets) > index}
        tf.compat.v1.train.init_from_checkpoint(path, mapping)
    _log_warm_start(path, table)
    return table


def build_logits(config, images, is_training):
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
    model_config = ModelConfig(**params).validate()
    is_training = mode == tf.estimator.ModeKeys.TRAIN
    images = features["image"] if isinstance(features, dict) else features
    update_ops_before = len(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS))
    spec, logits, _ = build_logits(model_config, images, is_training)
    # Only this call's update ops: under MirroredStrategy each replica adds its own.
    update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)[update_ops_before:]
    predictions = predictions_from_logits(logits, model_config.class_names)

    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(
            mode, predictions=predictions,
            export_outputs={"serving_default": tf.estimator.export.PredictOutput(predictions)},
            scaffold=tf.compat.v1.train.Scaffold(saver=ema_saver(model_config)))

    labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)
    one_hot = tf.one_hot(labels, model_config.num_classes)
    cross_entropy = tf.compat.v1.losses.softmax_cross_entropy(
        one_hot, logits, label_smoothing=model_config.label_smoothing)
    train_vars = trained_variables(model_config)
    decayed = [v for v in train_vars if v.op.name.endswith("/weights")]
    loss = cross_entropy
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
        raise ValueError("no variable is trained: --trainable_scopes=%s, --freeze_scopes=%s"
                         % (list(model_config.trainable_scopes),
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
    if model_config.checkpoint_path:
        resume = model_dir and tf.train.latest_checkpoint(model_dir)
        if resume:
            logging.info("resuming from %s; warm start from %s skipped", resume,
                         model_config.checkpoint_path)
        else:
            apply_warm_start(model_config, spec)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

