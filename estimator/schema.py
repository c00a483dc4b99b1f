"""tf.Example records and labels.txt files as TensorFlow writes and parses them. The names
themselves (feature keys, splits, shard names, the labels.txt format) are the project's
conventions, defined once in slimserve/conventions.py and re-exported here."""
import tensorflow as tf

from slimserve.conventions import (  # noqa: F401  (re-exported: the data set's vocabulary)
    CHANNELS, ENCODED, FILENAME, FORMAT, HEIGHT, INFO_FILE, LABEL, LABELS_FILE, SPLITS,
    TEACHER, TEXT, TRAIN, VALIDATION, WIDTH, format_labels, parse_labels, shard_name,
    shard_pattern)


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


def feature_spec(with_label=True, teacher_classes=0):
    """Parsing spec; serving requests (classify) may carry no label. With
    `teacher_classes`, also the TEACHER probabilities (all zeros in a record without
    them: a new label, which has no teacher)."""
    spec = {
        ENCODED: tf.io.FixedLenFeature([], tf.string),
        FORMAT: tf.io.FixedLenFeature([], tf.string, default_value="jpeg"),
    }
    if with_label:
        spec[LABEL] = tf.io.FixedLenFeature([], tf.int64)
    if teacher_classes:
        spec[TEACHER] = tf.io.FixedLenFeature([teacher_classes], tf.float32,
                                              default_value=[0.0] * teacher_classes)
    return spec


def set_teacher(example, probabilities):
    """Adds (or replaces) the TEACHER probabilities of a tf.Example, in place."""
    feature = example.features.feature[TEACHER]
    del feature.float_list.value[:]
    feature.float_list.value.extend(float(p) for p in probabilities)


def read_labels(path):
    """Reads `id:name` lines into a list indexed by id; errors name the line."""
    with tf.io.gfile.GFile(path) as handle:
        return parse_labels(handle, path)


def write_labels(path, names):
    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write(format_labels(names))
