"""The checkpoints a run resumes from, checked before training instead of failing in it.

- A corrupt `.index` or a truncated `.data-*` of the newest checkpoint ended in a bare
  OpError deep inside the Estimator. Each checkpoint in the `checkpoint` state file is
  read in full (every tensor, so TensorFlow checks sizes and CRCs), newest first; the
  newest intact one is resumed from and the broken ones are moved to
  `<model_dir>/corrupt-checkpoints/` (kept, not deleted), with a log line.
- A model_dir holding a 5-class checkpoint resumed on 10-class data failed with "logits
  and labels must be broadcastable"; the head's shape is compared with num_classes
  first and the error names the file, the shapes and what to do.
"""
import logging
import os

import tensorflow as tf

from slimserve import errors
from slimserve.estimator import nets

CORRUPT_DIR = "corrupt-checkpoints"


class CheckpointError(errors.UserError):
    """No usable checkpoint to resume from; the message names the file(s)."""


def _state(model_dir):
    path = os.path.join(model_dir, "checkpoint")
    try:
        return tf.train.get_checkpoint_state(model_dir)
    except Exception as error:  # pylint: disable=broad-except  (text_format.ParseError)
        raise CheckpointError(
            "%s is not a readable checkpoint state file (%s); restore it, or move it away "
            "to start from scratch, or use a new --model_dir" % (path, error)) from None


def listed_checkpoints(model_dir):
    """Checkpoint prefixes of the `checkpoint` state file, newest first ([] when none)."""
    state = _state(model_dir)
    if not state or not state.model_checkpoint_path:
        return []
    absolute = lambda p: p if os.path.isabs(p) else os.path.join(model_dir, p)  # noqa: E731
    latest = absolute(state.model_checkpoint_path)
    # all_model_checkpoint_paths is oldest first and normally ends with the latest.
    older = [absolute(p) for p in reversed(state.all_model_checkpoint_paths)]
    return [latest] + [p for p in older if p != latest]


def check_readable(prefix):
    """Reads every tensor of one checkpoint; returns None when intact, else the reason."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as error:  # pylint: disable=broad-except
        # OpError (bad index), IndexError ("Read less bytes than requested": truncated
        # data), ValueError...: whichever the reader raises, the checkpoint is unusable.
        message = getattr(error, "message", None) or str(error) or type(error).__name__
        return "%s: %s" % (type(error).__name__, message.strip().splitlines()[0])
    return None


def _move_aside(model_dir, prefix):
    target = os.path.join(model_dir, CORRUPT_DIR)
    tf.io.gfile.makedirs(target)
    moved = []
    for name in tf.io.gfile.glob(prefix + ".*"):
        destination = os.path.join(target, os.path.basename(name))
        tf.io.gfile.rename(name, destination, overwrite=True)
        moved.append(destination)
    return moved


def resume_checkpoint(model_dir, repair=True):
    """The newest intact checkpoint of model_dir (None for a fresh run).

    With `repair` (the trainer holding the model_dir's lock), broken newer checkpoints
    are moved aside and the state file points at the intact one, so the Estimator resumes
    from it; without, a broken newest checkpoint is an error naming it.
    """
    listed = listed_checkpoints(model_dir)
    broken = []
    for prefix in listed:
        reason = check_readable(prefix)
        if reason is None:
            break
        broken.append((prefix, reason))
        if not repair:
            raise CheckpointError(
                "the newest checkpoint %s is unreadable (%s); a trainer resuming in "
                "--model_dir %s falls back to the newest intact one" % (prefix, reason,
                                                                       model_dir))
    else:
        if broken:
            raise CheckpointError(
                "no intact checkpoint in --model_dir %s: %s. Restore them, or move them "
                "away (with the `checkpoint` file) to start from scratch, or use a new "
                "--model_dir" % (model_dir, "; ".join("%s: %s" % b for b in broken)))
        return None
    intact = prefix
    if broken:
        for bad, reason in broken:
            moved = _move_aside(model_dir, bad)
            logging.warning("checkpoint %s is unreadable (%s); moved %d files to %s", bad,
                            reason, len(moved), os.path.join(model_dir, CORRUPT_DIR))
        kept = [p for p in reversed(listed) if p not in dict(broken)]
        tf.compat.v1.train.update_checkpoint_state(model_dir, intact,
                                                    all_model_checkpoint_paths=kept)
        logging.warning("resuming from %s, the newest intact checkpoint", intact)
    return intact


def check_head(checkpoint, model_name, num_classes, labels_source="the labels"):
    """Raises CheckpointError when the checkpoint's head does not have num_classes outputs."""
    spec = nets.get_net(model_name)
    shapes = dict(tf.train.list_variables(checkpoint))
    for scope in spec.head_scopes:
        for suffix in ("/weights", "/biases"):
            shape = shapes.get(scope + suffix)
            if shape and shape[-1] != num_classes:
                raise CheckpointError(
                    "%s has a %d-class head (%s is %s) but %s name %d classes: the run "
                    "cannot resume with another head. Use a new --model_dir (with "
                    "--checkpoint_path=%s to fine-tune from it), or the %d-class data it "
                    "was trained on" % (checkpoint, shape[-1], scope + suffix, list(shape),
                                        labels_source, num_classes, checkpoint, shape[-1]))
