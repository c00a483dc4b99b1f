"""What the drift, reference and retrain tests share: a cheap real digits model whose
version carries an export's reference (slimserve/testing/digits_traffic.py), images of
the traffic part of the digits (never fitted on, never in the reference), and request
logs a real server wrote for unshifted and for shifted traffic.

Imported by tests/test_drift.py and tests/test_reference.py (fixtures by import).
"""
import os

import pytest

from slimserve.testing import digits_traffic

MODEL = "digits"
UNSHIFTED = 240   # requests of held-out digits
SHIFTED = 160     # then requests of held-out digits written inverted


@pytest.fixture(scope="session")
def drift_parts(digits_dir):
    """{fit, reference, traffic}: disjoint parts of the digits tree."""
    return digits_traffic.split(digits_dir, {"fit": 0.45, "reference": 0.2, "traffic": 0.35})


@pytest.fixture(scope="session")
def drift_model(tmp_path_factory, drift_parts):
    """The base path of the digits model (version 1, with its reference)."""
    work = str(tmp_path_factory.mktemp("drift_model"))
    return digits_traffic.digits_model(work, drift_parts["fit"], drift_parts["reference"])


@pytest.fixture(scope="session")
def traffic_images(drift_parts):
    """[(encoded bytes, class)] of the traffic part."""
    return [(open(path, "rb").read(), name) for path, name in drift_parts["traffic"]]


@pytest.fixture(scope="session")
def drift_logs(tmp_path_factory, drift_model, traffic_images):
    """{"unshifted": glob, "shifted": glob}: logs of UNSHIFTED requests of held-out digits,
    and of the same followed by SHIFTED requests of inverted ones."""
    folder = tmp_path_factory.mktemp("drift_logs")
    plain = [data for data, _ in traffic_images[:UNSHIFTED]]
    inverted = [digits_traffic.shift(data, "invert")
                for data, _ in traffic_images[UNSHIFTED:UNSHIFTED + SHIFTED]]
    return {
        "unshifted": digits_traffic.log_traffic(drift_model, MODEL,
                                                os.path.join(folder, "plain", MODEL), plain),
        "shifted": digits_traffic.log_traffic(drift_model, MODEL,
                                              os.path.join(folder, "shift", MODEL),
                                              plain + inverted),
    }


def write_foreign_records(directory, prefix):
    """Two TFRecord files another program could have left where request logs are (named
    `<prefix>-zz-...`: after every log file, so read first as the newest): tf.Example
    records (they parse as an empty PredictionLog) and plain text records (they do not
    parse at all). Returns their paths."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    examples = os.path.join(directory, prefix + "-zz-examples.tfrecord")
    with tf.io.TFRecordWriter(examples) as writer:
        for label in range(3):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "image/class/label": tf.train.Feature(
                    int64_list=tf.train.Int64List(value=[label]))})).SerializeToString())
    text = os.path.join(directory, prefix + "-zz-text.tfrecord")
    with tf.io.TFRecordWriter(text) as writer:
        for line in ("hello, world", "not a request"):
            writer.write(line.encode())
    return [examples, text]


def write_claiming_record(directory, prefix, claimed=1 << 40):
    """A request log file (named `<prefix>-zz-...`: read first as the newest) of one
    record of MODEL version 1 whose image_bytes and probabilities claim `claimed` images
    by their shapes and hold one. Returns its path."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tensorflow_serving.apis import prediction_log_pb2  # pylint: disable=import-outside-toplevel
    log = prediction_log_pb2.PredictionLog()
    log.log_metadata.model_spec.name = MODEL
    log.log_metadata.model_spec.version.value = 1
    log.predict_log.request.model_spec.name = MODEL
    images = log.predict_log.request.inputs["image_bytes"]
    images.dtype = tf.string.as_datatype_enum
    images.tensor_shape.dim.add(size=claimed)
    images.string_val.append(b"\x89PNG")
    probabilities = log.predict_log.response.outputs["probabilities"]
    probabilities.dtype = tf.float32.as_datatype_enum
    probabilities.tensor_shape.dim.add(size=claimed)
    probabilities.tensor_shape.dim.add(size=10)
    probabilities.float_val.append(0.1)
    path = os.path.join(directory, prefix + "-zz-claims.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(log.SerializeToString())
    return path


def write_damaged_file(directory, prefix):
    """A log file damaged at its first record (`<prefix>-zz-...`). Returns its path."""
    path = os.path.join(directory, prefix + "-zz-damaged.tfrecord")
    with open(path, "wb") as handle:
        handle.write(b"\x10" + b"\x00" * 7 + b"bad!" + b"not a record" * 20)
    return path
