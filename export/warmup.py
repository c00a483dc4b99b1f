"""`assets.extra/tf_serving_warmup_requests`: a few real-size requests per signature,
as PredictionLog records, the format TF Serving's --enable_model_warmup replays."""
import io

import numpy as np
import tensorflow as tf
from PIL import Image
from tensorflow_serving.apis import classification_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_log_pb2

from estimator import schema
from export import signatures


def sample_images(data_dir=None, split=schema.VALIDATION, count=3, image_size=224, seed=0):
    """Encoded JPEGs: the first `count` of a split when given, else noise at model size."""
    if data_dir:
        from estimator import dataset  # pylint: disable=g-import-not-at-top
        # Plain Python reads: exporters run inside a finalized training graph.
        images = []
        for path in dataset.split_files(data_dir, split):
            for record in tf.compat.v1.io.tf_record_iterator(path):
                example = tf.train.Example.FromString(record)
                images.append(example.features.feature[schema.ENCODED].bytes_list.value[0])
                if len(images) == count:
                    return images
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


def read_warmup(path):
    logs = []
    for record in tf.compat.v1.io.tf_record_iterator(path):
        logs.append(prediction_log_pb2.PredictionLog.FromString(record))
    return logs


def sample_inputs(images, image_size):
    """Float pixels like the `images` signature expects, for tests and benchmarks."""
    return np.stack([_pixels(encoded, image_size) for encoded in images])

