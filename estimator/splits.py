"""Reading a finished data set's splits: the shard list of a split (complete, or an error
naming the missing shard) and its records as tf.train.Examples or (image, label) pairs.

The one reader of a converted split outside the training input pipeline (inputs.py):
warmup images for exports, the demo, benchmarks and tests. dataset.py writes the splits.
"""
import glob
import os

from slimserve.estimator import dataset
from slimserve.estimator import schema


def read_examples(data_dir, split, limit=None):
    """The tf.train.Examples of a split in shard order, at most `limit`.

    Plain Python reads, no tf.data: exporters call this inside a finalized training graph.
    The one reader of a converted split for warmup, the demo, benchmarks and tests."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    out = []
    for path in split_files(data_dir, split):
        for record in tf.compat.v1.io.tf_record_iterator(path):
            out.append(tf.train.Example.FromString(record))
            if limit is not None and len(out) >= limit:
                return out
    return out


def read_images(data_dir, split, limit=None):
    """(encoded images, int labels) of a split, in shard order."""
    examples = read_examples(data_dir, split, limit)
    return ([e.features.feature[schema.ENCODED].bytes_list.value[0] for e in examples],
            [e.features.feature[schema.LABEL].int64_list.value[0] for e in examples])


def split_files(data_dir, split):
    """The complete shard list of a split; a missing shard is an error naming it."""
    files = sorted(glob.glob(schema.shard_pattern(data_dir, split)))
    if not files:
        raise dataset.DatasetError("no %s shards matching %s"
                                   % (split, schema.shard_pattern(data_dir, split)))
    expected = int(files[0].rsplit("-of-", 1)[1])
    want = [os.path.join(data_dir, schema.shard_name(split, i, expected)) for i in range(expected)]
    missing = sorted(set(want) - set(files))
    if missing:
        raise dataset.DatasetError("missing shard(s): %s" % ", ".join(missing))
    return want
