"""Averaging a fine-tuned checkpoint with the weights it started from (WiSE-FT, Wortsman
et al., "Robust fine-tuning of zero-shot models", 2022), for slimserve-retrain.

    average_checkpoints(finetuned, start, start_weight=0.3, output_prefix=...)

A fine-tune on a few hundred new images moves every weight towards the new data and
forgets some of the original task; the point between the two sets of weights keeps more
of the original task for a smaller loss on the new one (both lie in one basin when the
fine-tune started from the other). Every float variable of `finetuned` that `start` also
holds with the same shape becomes (1 - start_weight) * finetuned + start_weight * start,
BatchNorm's moving statistics and moving-average (EMA) shadows included (the serving
weights are looked up under the variable's name, else its shadow's or the variable it
shadows: an export of a run with --moving_average_decay holds the EMA weights under
the shadow names); every other variable (global_step, optimizer
slots, a variable `start` lacks) is copied as it is. The result is an ordinary slim-named
checkpoint that slimserve-export and the Estimator read.
"""
import logging
import os

import numpy as np
import tensorflow as tf

from slimserve import errors


SHADOW = "/ExponentialMovingAverage"


def _averaged(name, value, start, start_weight):
    if start_weight == 0 or not np.issubdtype(value.dtype, np.floating):
        return value, False
    # The serving version's weights may be under the variable's name or its shadow's
    # (an export of a run with --moving_average_decay keeps the shadow names).
    names = (name, name[:-len(SHADOW)]) if name.endswith(SHADOW) else (name, name + SHADOW)
    source = next((n for n in names if start.has_tensor(n)), None)
    if source is None:
        return value, False
    other = start.get_tensor(source)
    if other.shape != value.shape:
        return value, False
    mixed = (1.0 - start_weight) * value + start_weight * other.astype(value.dtype)
    return mixed.astype(value.dtype), True


def average_checkpoints(finetuned, start, start_weight, output_prefix):
    """Writes the average of checkpoints `finetuned` and `start` (prefixes) to
    `output_prefix`; returns (output_prefix, number of averaged variables). A UserError
    names a checkpoint that cannot be read; start_weight must be in [0, 1)."""
    if not 0 <= start_weight < 1:
        raise errors.UserError("the serving weights' share must be in [0, 1), not %r"
                               % start_weight)
    readers = {}
    for role, prefix in (("fine-tuned", finetuned), ("serving", start)):
        try:
            readers[role] = tf.train.load_checkpoint(prefix)
        except (tf.errors.OpError, ValueError) as error:
            raise errors.UserError("cannot read the %s checkpoint %s: %s" % (
                role, prefix, str(error).splitlines()[0])) from None
    tuned, serving = readers["fine-tuned"], readers["serving"]
    graph = tf.Graph()
    averaged = 0
    with graph.as_default():
        variables, feeds = {}, {}
        for index, name in enumerate(sorted(tuned.get_variable_to_shape_map())):
            value, mixed = _averaged(name, tuned.get_tensor(name), serving, start_weight)
            averaged += mixed
            value = np.asarray(value)
            # Fed through a placeholder: a constant would copy every weight into the graph.
            holder = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape)
            variables[name] = tf.compat.v1.Variable(holder, name="v%d" % index,
                                                    trainable=False)
            feeds[holder] = value
        saver = tf.compat.v1.train.Saver(variables, write_version=tf.compat.v1.train.SaverDef.V2)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer(), feed_dict=feeds)
            os.makedirs(os.path.dirname(os.path.abspath(output_prefix)), exist_ok=True)
            saver.save(session, output_prefix, write_meta_graph=False,
                       write_state=False)
    logging.info("averaged %d variables: %.2f of the serving version's weights, %.2f of "
                 "the fine-tuned ones (%s)", averaged, start_weight, 1 - start_weight,
                 output_prefix)
    return output_prefix, averaged
