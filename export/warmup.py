"""`assets.extra/tf_serving_warmup_requests`: a few real-size requests per signature,
as PredictionLog records, the format TF Serving's --enable_model_warmup replays.

Built from served traffic (`requests_from_logs`, the request logs the server writes)
when there is some, so a new version is warmed with the shapes clients really send;
else from validation images."""
import io
import logging

import numpy as np
import tensorflow as tf
from PIL import Image
from tensorflow_serving.apis import classification_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_log_pb2

from slimserve import errors
from slimserve.estimator import schema
from slimserve.estimator import splits
from slimserve.export import signatures
from slimserve.serving.observability import request_log


# TF Serving refuses a warmup file with more records (saved_model_warmup_util.cc).
MAX_RECORDS = 1000


def _shape_key(log):
    """(API, signature, input shapes): requests that warm up the same kernels."""
    kind = log.WhichOneof("log_type")
    request = getattr(log, kind).request
    if kind == "predict_log":
        shapes = tuple(sorted((key, tuple(d.size for d in proto.tensor_shape.dim))
                              for key, proto in request.inputs.items()))
    else:
        examples = request.input.WhichOneof("kind")
        count = len(getattr(request.input, examples).examples) if examples else 0
        shapes = (("examples", count),)
    return kind, request.model_spec.signature_name, shapes


def requests_from_logs(logs, per_shape=1, max_records=MAX_RECORDS):
    """Warmup records from logged traffic: the first `per_shape` requests of each
    (API, signature, input shapes) seen, at most `max_records`. Responses are dropped
    and the version is unpinned (a warmup request must fit whatever version loads it)."""
    if not 1 <= max_records <= MAX_RECORDS:
        raise ValueError("max_records must be in 1..%d (TF Serving's limit), got %d"
                         % (MAX_RECORDS, max_records))
    seen = {}
    out = []
    for log in logs:
        kind = log.WhichOneof("log_type")
        if kind not in ("predict_log", "classify_log", "regress_log", "multi_inference_log"):
            continue
        key = _shape_key(log) if kind != "multi_inference_log" else (kind,)
        if seen.get(key, 0) >= per_shape:
            continue
        seen[key] = seen.get(key, 0) + 1
        request = getattr(log, kind).request
        warm = prediction_log_pb2.PredictionLog()
        getattr(warm, kind).request.CopyFrom(request)
        spec = getattr(warm, kind).request.model_spec
        spec.ClearField("version")
        spec.ClearField("version_label")
        out.append(warm)
        if len(out) >= max_records:
            break
    return out


def check_pattern(pattern, flag="--warmup_from"):
    """The published log files `pattern` matches ([] for none yet); UserError naming the
    flag when it matches a folder (request logs are files: a folder is a mistaken
    pattern, which TFRecord reading would fail on with a traceback)."""
    matches = [f for f in tf.io.gfile.glob(pattern) if not f.rsplit("/", 1)[-1].startswith(".")]
    folders = [f for f in matches if tf.io.gfile.isdir(f)]
    if folders:
        raise errors.UserError("%s=%s matches the folder %s; request logs are files: give a "
                               "pattern of them, e.g. %s/<filename_prefix>*" % (
                                   flag, pattern, folders[0], folders[0].rstrip("/")))
    return matches


def traffic_warmup(pattern):
    """Warmup records built from the request logs matching `pattern` (a glob); [] when
    no log file matches yet, so the caller falls back to validation images. A file that
    is not a PredictionLog TFRecord, or a folder, is an error naming it."""
    if not pattern:
        return []
    if not check_pattern(pattern):
        logging.warning("--warmup_from=%s matches no request log; warming up with "
                        "validation images instead", pattern)
        return []
    records = requests_from_logs(request_log.iter_logs(pattern))  # streamed, not loaded
    logging.info("warmup: %d requests from the traffic logged in %s", len(records), pattern)
    return records


def sample_images(data_dir=None, split=schema.VALIDATION, count=3, image_size=224, seed=0):
    """Encoded JPEGs: the first `count` of a split when given, else noise at model size."""
    if data_dir:
        images, _ = splits.read_images(data_dir, split, count)
        if images:
            return images
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(count):
        pixels = rng.randint(0, 256, size=(image_size, image_size, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def _pixels(encoded, image_size):
    image = Image.open(io.BytesIO(encoded)).convert("RGB").resize((image_size, image_size))
    return np.asarray(image, np.float32)


def build_requests(images, image_size, model_name="resnet"):
    """One request per sample image and signature, in batches of one."""
    logs = []
    for encoded in images:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.model_spec.signature_name = signatures.DEFAULT
        request.inputs[signatures.IMAGE_BYTES].CopyFrom(tf.make_tensor_proto([encoded]))
        logs.append(prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(request=request)))

        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.model_spec.signature_name = signatures.PREDICT_IMAGES
        request.inputs[signatures.IMAGES].CopyFrom(
            tf.make_tensor_proto(_pixels(encoded, image_size)[None]))
        logs.append(prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(request=request)))

        request = classification_pb2.ClassificationRequest()
        request.model_spec.name = model_name
        request.model_spec.signature_name = signatures.CLASSIFY
        example = request.input.example_list.examples.add()
        example.features.feature[schema.ENCODED].bytes_list.value.append(encoded)
        logs.append(prediction_log_pb2.PredictionLog(
            classify_log=prediction_log_pb2.ClassifyLog(request=request)))
    return logs


def write_warmup(path, logs):
    with tf.io.TFRecordWriter(path) as writer:
        for log in logs:
            writer.write(log.SerializeToString())
