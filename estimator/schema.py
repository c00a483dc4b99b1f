"""The tf.Example feature keys (slim / TF models convention), written and parsed here only."""
import tensorflow as tf

ENCODED = "image/encoded"
FORMAT = "image/format"
LABEL = "image/class/label"
TEXT = "image/class/text"
HEIGHT = "image/height"
WIDTH = "image/width"
CHANNELS = "image/channels"
FILENAME = "image/filename"

TRAIN = "train"
VALIDATION = "validation"
SPLITS = (TRAIN, VALIDATION)
LABELS_FILE = "labels.txt"
INFO_FILE = "dataset_info.json"


def shard_name(split, index, num_shards):
    """`train-00003-of-00010`: the names every TF input pipeline expects."""
    return "%s-%05d-of-%05d" % (split, index, num_shards)


def shard_pattern(data_dir, split):
    return "%s/%s-*-of-*" % (data_dir.rstrip("/"), split)


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
    names = {}
    with tf.io.gfile.GFile(path) as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            key, sep, name = line.partition(":")
            if not sep or not key.strip().isdigit():
                raise ValueError("%s:%d: expected 'id:name', got %r" % (path, number, line))
            names[int(key)] = name
    if sorted(names) != list(range(len(names))):
        raise ValueError("%s: label ids must be 0..N-1 without gaps, got %s"
                         % (path, sorted(names)))
    return [names[i] for i in range(len(names))]


def write_labels(path, names):
    with tf.io.gfile.GFile(path, "w") as handle:
        for index, name in enumerate(names):
            handle.write("%d:%s\n" % (index, name))
