"""Request logs for the labelling page's tests, written as a server writes them.

`digits_model`: a real digits classifier (logistic regression fitted on scikit-learn's
digits, as slimserve/testing/image_classifiers.py serves it) with labels.txt.
`served_logs`: that model served in process with request logging on, queried over gRPC
with digits images (single images and batches): the server's own RequestLogger writes
the PredictionLog files. `hostile_logs`: records no honest server writes (a model name
and class names carrying markup, a decompression bomb and HTML as image bytes, a
response that does not fit its request), written by the same RequestLogger, next to a
file of garbage bytes.

Imported by tests/test_label.py and tests/test_label_browser.py (fixtures by import).
"""
import os

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow_serving.apis import model_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.config import logging_config_pb2

from slimserve import conventions
from slimserve.serving.clients import client as client_lib
from slimserve.serving.config import model_config
from slimserve.serving.observability import request_log
from slimserve.testing import image_bombs
from slimserve.testing import image_classifiers
from slimserve.testing.servers import serve_in_process

MODEL = "digits"
HOSTILE_MODEL = '<img src=x onerror="window.canary=2">'
HOSTILE_CLASS = "<script>window.canary=1</script>"
SINGLE_REQUESTS = 24
BATCHES = 3  # of two images each


def digits_files(digits_dir):
    """[(path, class name)] of the digits tree, sorted."""
    found = []
    for name in sorted(os.listdir(digits_dir)):
        folder = os.path.join(digits_dir, name)
        found += [(os.path.join(folder, f), name) for f in sorted(os.listdir(folder))]
    return found


@pytest.fixture(scope="session")
def digits_model(tmp_path_factory, digits_dir):
    """(base path, [(path, class)] of the images it was not fitted on)."""
    from sklearn.linear_model import LogisticRegression  # pylint: disable=import-outside-toplevel
    files = digits_files(digits_dir)
    fit, held_out = files[::2], files[1::2]
    features = image_classifiers.digits_features([open(p, "rb").read() for p, _ in fit])
    # Strong regularisation: soft probabilities, so confidence varies from image to image.
    model = LogisticRegression(C=0.1, max_iter=2000).fit(features, [c for _, c in fit])
    base = str(tmp_path_factory.mktemp("label_model") / MODEL)
    image_classifiers.write_image_classifier(base, 1, model.coef_.T, model.intercept_,
                                             [str(c) for c in model.classes_])
    return base, held_out


def logging_config(prefix):
    return text_format.Parse(
        'log_collector_config { type: "file" filename_prefix: "%s" } '
        'sampling_config { sampling_rate: 1.0 }' % prefix, logging_config_pb2.LoggingConfig())


@pytest.fixture(scope="session")
def served_logs(tmp_path_factory, digits_model):
    """The glob of the logs of SINGLE_REQUESTS + BATCHES requests to the served model."""
    base, held_out = digits_model
    prefix = str(tmp_path_factory.mktemp("label_logs") / MODEL)
    server = serve_in_process([model_config.ServedModel(MODEL, base,
                                                        logging_config=logging_config(prefix))],
                              enable_model_warmup=False)
    try:
        client = client_lib.Client("127.0.0.1:%d" % server.port, model_name=MODEL, retries=0)
        chosen = held_out[::max(1, len(held_out) // (SINGLE_REQUESTS + 2 * BATCHES))]
        images = [open(path, "rb").read() for path, _ in chosen]
        for data in images[:SINGLE_REQUESTS]:
            client.predict_images([data])
        rest = images[SINGLE_REQUESTS:]
        for batch in range(BATCHES):
            client.predict_images(rest[2 * batch:2 * batch + 2])
        client.close()
    finally:
        server.stop()  # flushes and publishes the log files
    return prefix + "*"


def _predict_record(image, probabilities, class_name, model_name=MODEL):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.inputs[conventions.IMAGE_BYTES].CopyFrom(
        tf.make_tensor_proto([image], dtype=tf.string))
    response = predict_pb2.PredictResponse()
    probabilities = np.asarray([probabilities], np.float32)
    response.outputs[conventions.PROBABILITIES].CopyFrom(tf.make_tensor_proto(probabilities))
    response.outputs[conventions.CLASSES].CopyFrom(
        tf.make_tensor_proto(np.argmax(probabilities, axis=1).astype(np.int64)))
    response.outputs[conventions.CLASS_NAMES].CopyFrom(
        tf.make_tensor_proto([class_name], dtype=tf.string))
    spec = model_pb2.ModelSpec(name=model_name)
    spec.version.value = 1
    return request, response, spec


def write_hostile_logs(directory, good_image):
    """Writes hostile records with the real RequestLogger (and a garbage file); returns
    the glob. The only record worth offering is `good_image` under HOSTILE_MODEL with a
    HOSTILE_CLASS name; the bomb is proposed (it looks like a PNG) but never shown."""
    prefix = os.path.join(directory, MODEL)
    logger = request_log.RequestLogger(prefix, 1.0)
    unsure = [0.15, 0.12, 0.11, 0.1, 0.1, 0.1, 0.1, 0.08, 0.07, 0.07]
    records = [
        _predict_record(good_image, unsure, HOSTILE_CLASS, HOSTILE_MODEL),
        _predict_record(image_bombs.png_bomb(), unsure, HOSTILE_CLASS, HOSTILE_MODEL),
        _predict_record(b"<html><script>window.canary=3</script></html>", unsure,
                        HOSTILE_CLASS, HOSTILE_MODEL),
    ]
    request, response, spec = _predict_record(good_image, unsure, "0")
    response.outputs[conventions.PROBABILITIES].CopyFrom(
        tf.make_tensor_proto(np.ones([3, 10], np.float32)))  # 3 rows for one image
    records.append((request, response, spec))
    for request, response, spec in records:
        assert logger.enqueue("predict", request, response, spec)
    logger.close()
    with open(prefix + "-garbage.tfrecord", "wb") as handle:
        handle.write(b"\x10" + b"\x00" * 7 + b"bad!" + b"not a record" * 20)
    return prefix + "*"
