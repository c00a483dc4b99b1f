"""tf.Example records and labels.txt files as TensorFlow writes and parses them. The names
themselves (feature keys, splits, shard names, the labels.txt format) are the project's
conventions, defined once in slimserve/conventions.py and re-exported here."""
import tensorflow as tf

from slimserve.conventions import (  # noqa: F401  (re-exported: the data set's vocabulary)
    CHANNELS, ENCODED, FILENAME, FORMAT, HEIGHT, INFO_FILE, LABEL, LABELS_FILE, SPLITS, TEXT,
    TRAIN, VALIDATION, WIDTH, format_labels, parse_labels, shard_name, shard_pattern)


def _bytes(value):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int64(value):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def make_example(encoded, image_format, label, text, height, width, channels=3,
                 filename=""):
    """Builds the tf.Example for one image; label is 0-based."""
    return tf.train.Example(features=tf.train.Features(feature={
        ENCODED: _bytes(encoded),
        FORMAT: _bytes(image_format.encode()),
        LABEL: _int64(int(label)),
        TEXT: _bytes(text.encode()),
        HEIGHT: _int64(int(height)),
        WIDTH: _int64(int(width)),
        CHANNELS: _int64(int(channels)),
        FILENAME: _bytes(filename.encode()),
    }))


def feature_spec(with_label=True):
    """Parsing spec; serving requests (classify) may carry no label."""
    spec = {
        ENCODED: tf.io.FixedLenFeature([], tf.string),
        FORMAT: tf.io.FixedLenFeature([], tf.string, default_value="jpeg"),
    }
    if with_label:
        spec[LABEL] = tf.io.FixedLenFeature([], tf.int64)
    return spec


def read_labels(path):
    """Reads `id:name` lines into a list indexed by id; errors name the line."""
    with tf.io.gfile.GFile(path) as handle:
        return parse_labels(handle, path)


def write_labels(path, names):
    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write(format_labels(names))
