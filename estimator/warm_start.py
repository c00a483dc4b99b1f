"""Warm start: a slim checkpoint restored into a new model, checked before anything runs.

- `check_checkpoint_net`: a --checkpoint_path of another net fails before the graph is
  built or anything written, naming the --model_name to pass.
- `check_needs_checkpoint`: settings that only mean something when a checkpoint is
  restored (frozen or trainable scopes, excluded scopes, --ignore_missing_vars) are
  refused without one: frozen layers would keep their random initial values.
- `warm_start_plan`: each model variable restored, excluded (--checkpoint_exclude_scopes)
  or missing (an error unless --ignore_missing_vars); a shape mismatch names the scope
  to exclude. BatchNorm moving statistics are restored too; an EMA shadow the checkpoint
  lacks starts from its base variable, and a variable the checkpoint holds only as its
  EMA shadow (an exported version's variables/variables) starts from the average.
- `warm_start`: through variable initialisers, so it only happens when `model_dir` has no
  checkpoint yet (a resume wins).
"""
import collections
import logging

import tensorflow as tf

from slimserve import errors
from slimserve.estimator import nets

# Optimizer slot variables: never in a checkpoint to warm-start from.
_SLOT_SUFFIXES = ("/Momentum", "/RMSProp", "/RMSProp_1", "/Adam", "/Adam_1")


class WarmStartError(errors.UserError):
    """The checkpoint does not fit the model; the message names the variable."""


def _model_variables(spec):
    """The net's own variables (optimizer slots left out)."""
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


# Settings about what a warm start restores or keeps: without a checkpoint they would
# freeze random weights (a scratch run 3-4 points worse, silently) or do nothing.
CHECKPOINT_SETTINGS = ("freeze_scopes", "trainable_scopes", "checkpoint_exclude_scopes",
                       "ignore_missing_vars")


def settings_needing_checkpoint(config):
    """The `--flag=value` texts of CHECKPOINT_SETTINGS that `config` (a ModelConfig) sets."""
    found = []
    for name in CHECKPOINT_SETTINGS:
        value = getattr(config, name)
        if isinstance(value, bool):
            if value:
                found.append("--" + name)
        elif value:
            found.append("--%s=%s" % (name, ",".join(value)))
    return found


def check_needs_checkpoint(config):
    """Raises WarmStartError when `config` (a ModelConfig without checkpoint_path) sets a
    setting that only applies to restored weights: frozen layers would stay at their
    random initial values, silently (the fine-tuning recipe without --checkpoint_path was
    3-4 points worse than the scratch recipe). Not called for a resume, whose weights come
    from its own checkpoint."""
    if config.checkpoint_path:
        return
    found = settings_needing_checkpoint(config)
    if not found:
        return
    freezing = config.freeze_scopes or config.trainable_scopes
    raise WarmStartError(
        "%s %s a checkpoint to restore, but no --checkpoint_path is given%s. Pass "
        "--checkpoint_path, or leave %s out to train every layer from scratch "
        "(--recipe=auto picks the route with or without a checkpoint)" % (
            " and ".join(found), "needs" if len(found) == 1 else "need",
            ": frozen layers would keep their random initial values" if freezing else "",
            "it" if len(found) == 1 else "them"))


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
        if nets.in_scopes(name, exclude_scopes):
            table["excluded"].append(name)
            continue
        source = name
        if source not in shapes and name.endswith(shadow) and name[:-len(shadow)] in shapes:
            source = name[:-len(shadow)]
        elif source not in shapes and name + shadow in shapes:
            # An export of a run with --moving_average_decay (a SavedModel's
            # variables/variables) holds the averaged weights under the shadow names.
            source = name + shadow
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
    """Initialises the net's variables from config.checkpoint_path (warm_start_plan)
    through their initialisers; returns the plan's table.

    Under a distribution strategy model_fn runs once per replica, where a mirrored
    variable reads as that replica's copy ("<name>/replica_1": not in the checkpoint);
    the warm start runs once, in cross-replica context, where each variable is the
    mirrored one and its restore initialises every copy."""
    replica = tf.distribute.get_replica_context()
    if tf.distribute.has_strategy() and replica is not None:
        return replica.merge_call(lambda _: _apply_warm_start(config, spec))
    return _apply_warm_start(config, spec)


def _apply_warm_start(config, spec):
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


def warm_start(config, spec, model_dir):
    """Warm-starts from config.checkpoint_path unless `model_dir` already has a
    checkpoint to resume from (model_fn calls this in training)."""
    if not config.checkpoint_path:
        return None
    resume = model_dir and tf.train.latest_checkpoint(model_dir)
    if resume:
        logging.info("resuming from %s; warm start from %s skipped", resume,
                     config.checkpoint_path)
        return None
    return apply_warm_start(config, spec)
