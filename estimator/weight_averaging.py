"""Averaging fine-tuned checkpoints with each other (a uniform model soup, Wortsman et al.,
"Model soups", 2022) and with the weights they started from (WiSE-FT, Wortsman et al.,
"Robust fine-tuning of zero-shot models", 2022), for slimserve-retrain.

    average_checkpoints([run_0, run_1, run_2], start, start_weight=0.0, output_prefix=...)

Fine-tunes of one start on the same data that differ only in their seed (the order of the
examples, the crops), when they land in one basin, average into one network that varies
less from seed to seed than any of them, which is what a check against a fixed margin on
a few hundred images needs (--soup_seeds). Whether they do depends on the fine-tune: the
flywheel demo's (150 Adam steps at 1e-3) do not, and its soup is worse than one run
(docs/benchmarks.md). The soup is the mean of every float variable the runs share, then
mixed with the start as below.

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


def _read(role, prefix):
    try:
        return tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as error:
        raise errors.UserError("cannot read the %s checkpoint %s: %s" % (
            role, prefix, str(error).splitlines()[0])) from None


def _soup(name, readers, prefixes):
    """The mean of variable `name` over the fine-tuned runs (floats every run holds with
    the first's shape), else the first run's value as it is."""
    value = readers[0].get_tensor(name)
    if len(readers) == 1 or not np.issubdtype(np.asarray(value).dtype, np.floating):
        return value
    values = [value]
    for reader, prefix in zip(readers[1:], prefixes[1:]):
        other = reader.get_tensor(name) if reader.has_tensor(name) else None
        if other is None or np.shape(other) != np.shape(value):
            raise errors.UserError(
                "the fine-tuned runs differ: %s is %s in %s and %s in %s" % (
                    name, np.shape(value), prefixes[0], "missing" if other is None
                    else np.shape(other), prefix))
        values.append(other)
    return np.mean(np.stack(values).astype(np.float64), axis=0).astype(np.asarray(value).dtype)


def average_checkpoints(finetuned, start, start_weight, output_prefix):
    """Writes the average of checkpoints `finetuned` (a prefix, or a list of the prefixes of
    runs to average first: the soup) and `start` to `output_prefix`; returns
    (output_prefix, number of variables mixed with the start). A UserError names a
    checkpoint that cannot be read or runs that differ; start_weight must be in [0, 1)."""
    if not 0 <= start_weight < 1:
        raise errors.UserError("the serving weights' share must be in [0, 1), not %r"
                               % start_weight)
    prefixes = [finetuned] if isinstance(finetuned, str) else list(finetuned)
    if not prefixes:
        raise errors.UserError("no fine-tuned checkpoint to average")
    runs = [_read("fine-tuned", prefix) for prefix in prefixes]
    serving = _read("serving", start)
    graph = tf.Graph()
    averaged = 0
    with graph.as_default():
        variables, feeds = {}, {}
        for index, name in enumerate(sorted(runs[0].get_variable_to_shape_map())):
            value, mixed = _averaged(name, _soup(name, runs, prefixes), serving, start_weight)
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
    logging.info("averaged %d fine-tuned run(s); %d variables mixed: %.2f of the serving "
                 "version's weights, %.2f of the fine-tuned ones (%s)", len(runs), averaged,
                 start_weight, 1 - start_weight, output_prefix)
    return output_prefix, averaged
