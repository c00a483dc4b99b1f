"""gRPC client for TF Serving and the embedded server: Predict, Classify,
GetModelMetadata and GetModelStatus (the command is slimserve/cli/client.py).

    slimserve-client predict  --server=localhost:8500 photo1.jpg photo2.png --top_k=3
    slimserve-client classify --server=localhost:8500 photo1.jpg --json
    slimserve-client metadata --server=localhost:8500
    slimserve-client status   --server=localhost:8500

Retries (with exponential backoff) only on UNAVAILABLE, the status a server gives
while it starts, swaps versions or sheds load; anything else is final. (Whether anything
listens at all is serving/clients/channel.py's check, which needs no TensorFlow.)

`predict_files` is the bulk path of `slimserve-client predict`: every file is checked
before it is sent (a regular file within --max_message_bytes that starts like a JPEG,
PNG, GIF or BMP), and a batch the server refuses is split in halves until the image at
fault is alone, so one bad file costs one error line, never its neighbours' answers.
"""
import collections
import concurrent.futures
import threading
import time

import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import classification_pb2
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from slimserve import conventions
from slimserve import errors
from slimserve import image_listing
from slimserve.serving.clients import channel as channel_lib
from slimserve.serving.core import tensors

DEFAULT_MESSAGE_BYTES = channel_lib.DEFAULT_MESSAGE_BYTES
# A batch refused with one of these may be refused for one image in it: it is split.
# Anything else (no such model or signature, no server, the deadline) ends the run.
_SPLIT_ON = frozenset([grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                       grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.INTERNAL,
                       grpc.StatusCode.UNKNOWN])
_MAX_ERROR_CHARS = 300

# One file's answer: `error` (a sentence) or the top class and `top_k`, a list of
# (class id, class name or None, probability), most probable first.
FileResult = collections.namedtuple("FileResult", "path error class_id class_name top_k")


class Client:
    """One channel to one server; thread-safe, so share it between threads."""

    def __init__(self, target="localhost:8500", model_name="resnet", version=None,
                 version_label=None, timeout=30.0, max_message_bytes=DEFAULT_MESSAGE_BYTES,
                 retries=3, backoff_seconds=0.2, image_key=conventions.ENCODED):
        if version is not None and version_label:
            raise errors.UserError("give a version or a version label, not both")
        self.channel = channel_lib.open_channel(target, max_message_bytes)
        self.max_message_bytes = max_message_bytes
        self._predict = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self._model = model_service_pb2_grpc.ModelServiceStub(self.channel)
        self.model_name, self.version, self.version_label = model_name, version, version_label
        self.timeout, self.retries, self.backoff = timeout, retries, backoff_seconds
        self.image_key = image_key
        self._names_lock = threading.Lock()
        self._names = None  # every class name in id order, once learned (class_names)
        self._names_tried = False

    def close(self):
        self.channel.close()

    def _spec(self, spec, signature_name=None):
        spec.name = self.model_name
        if self.version is not None:
            spec.version.value = int(self.version)
        elif self.version_label:
            spec.version_label = self.version_label
        if signature_name:
            spec.signature_name = signature_name

    def _call(self, method, request):
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                return method(request, timeout=self.timeout)
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE or attempt == self.retries:
                    raise
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def predict(self, inputs, signature_name="serving_default", output_filter=()):
        """inputs: {key: array-like}; returns {output key: ndarray}."""
        request = predict_pb2.PredictRequest()
        self._spec(request.model_spec, signature_name)
        for key, value in inputs.items():
            request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
        request.output_filter.extend(output_filter)
        response = self._call(self._predict.Predict, request)
        # Bounded, typed-field-aware decoding (tf.make_ndarray is ~600x slower on float_val).
        return {key: tensors.from_proto(key, proto) for key, proto in response.outputs.items()}

    def predict_images(self, encoded_images, signature_name="serving_default"):
        """Encoded JPEG/PNG bytes -> {classes, probabilities, class_names} for the batch."""
        return self.predict({conventions.IMAGE_BYTES: list(encoded_images)}, signature_name)

    def classify(self, examples, signature_name="classify"):
        """tf.train.Examples (or images as bytes) -> [[(label, score), ...] per example]."""
        request = classification_pb2.ClassificationRequest()
        self._spec(request.model_spec, signature_name)
        for example in examples:
            target = request.input.example_list.examples.add()
            if isinstance(example, bytes):
                target.features.feature[self.image_key].bytes_list.value.append(example)
            else:
                target.CopyFrom(example)
        response = self._call(self._predict.Classify, request)
        return [[(c.label, c.score) for c in result.classes]
                for result in response.result.classifications]

    def metadata(self):
        """{signature name: SignatureDef} of the model (version) this client targets."""
        request = get_model_metadata_pb2.GetModelMetadataRequest()
        self._spec(request.model_spec)
        request.metadata_field.append("signature_def")
        response = self._call(self._predict.GetModelMetadata, request)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_map)
        return dict(signature_map.signature_def)

    def status(self):
        """[(version, state name, error message)], newest first."""
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = self.model_name
        if self.version is not None:
            request.model_spec.version.value = int(self.version)
        response = self._call(self._model.GetModelStatus, request)
        states = get_model_status_pb2.ModelVersionStatus.State
        return [(s.version, states.Name(s.state), s.status.error_message)
                for s in response.model_version_status]

    def image_input_key(self, signature_name=conventions.DEFAULT_SIGNATURE):
        """(input key, SignatureDef) of a served signature that takes encoded images: one
        string input, its name read from GetModelMetadata; UserError saying what the model
        has otherwise."""
        signatures = self.metadata()
        if signature_name not in signatures:
            raise errors.UserError("--signature_name %s: model %s has no such signature (it has %s)"
                             % (signature_name, self.model_name, ", ".join(sorted(signatures))))
        signature = signatures[signature_name]
        inputs = {key: types_pb2.DataType.Name(info.dtype)
                  for key, info in signature.inputs.items()}
        if len(inputs) != 1 or list(inputs.values()) != ["DT_STRING"]:
            raise errors.UserError(
                "--signature_name %s of model %s takes %s; encoded image files need a "
                "signature with one string input (e.g. --signature_name=%s)" % (
                    signature_name, self.model_name,
                    ", ".join("%s (%s)" % kv for kv in sorted(inputs.items())),
                    conventions.DEFAULT_SIGNATURE))
        return next(iter(inputs)), signature

    def image_signature(self, signature_name=conventions.DEFAULT_SIGNATURE):
        """The input key of a signature that takes encoded images and answers
        `probabilities` (what predict prints); UserError otherwise."""
        key, signature = self.image_input_key(signature_name)
        if conventions.PROBABILITIES not in signature.outputs:
            raise errors.UserError("signature %s has no %r output (it has %s)" % (
                signature_name, conventions.PROBABILITIES, ", ".join(sorted(signature.outputs))))
        return key

    def class_names(self, image, count):
        """Every class name in id order, learned once from the model's classify signature
        (its `classes` output lists them all) with one image; None when the model has no
        such signature or its answer does not have `count` classes."""
        with self._names_lock:
            if not self._names_tried:
                self._names_tried = True
                try:
                    rows = self.classify([image])
                    names = [label for label, _ in rows[0]] if rows else []
                    self._names = names if len(names) == count else None
                except grpc.RpcError:
                    self._names = None
            return self._names

    def known_class_names(self):
        """Every class name in id order once `class_names` learned them, else None."""
        with self._names_lock:
            return self._names

    def predict_files(self, paths, batch_size=8, concurrency=1,
                      signature_name=conventions.DEFAULT_SIGNATURE, top_k=3):
        """Yields one FileResult per path, in order, as answers arrive: `batch_size`
        images per request, `concurrency` requests in flight, at most 2 x `concurrency`
        batches read ahead. A file that cannot be sent, or that the server refuses, gets
        an error; the others in its batch are answered. Raises UserError for a signature
        that does not take images, grpc.RpcError when the server fails the run (no such
        model, no server, a deadline)."""
        input_key = self.image_signature(signature_name)
        batch_size, concurrency = max(1, batch_size), max(1, concurrency)
        batches = (paths[i:i + batch_size] for i in range(0, len(paths), batch_size))
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            pending = collections.deque()
            for batch in batches:
                pending.append(pool.submit(self._predict_batch, batch, input_key,
                                           signature_name, top_k))
                if len(pending) >= 2 * concurrency:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()

    def _predict_batch(self, paths, input_key, signature_name, top_k):
        results, images = {}, []
        for index, path in enumerate(paths):
            data, error = read_image(path, self.max_message_bytes)
            if error:
                results[index] = FileResult(path, error, None, None, [])
            else:
                images.append((index, data))
        for (index, data), outputs in self._run_isolating(images, input_key, signature_name):
            if isinstance(outputs, str):
                results[index] = FileResult(paths[index], outputs, None, None, [])
            else:
                results[index] = self._result(paths[index], data, outputs, top_k)
        return [results[index] for index in range(len(paths))]

    def _run_isolating(self, images, input_key, signature_name):
        """[((index, data), {output: row} or an error sentence)] for the batch; a batch
        refused for what may be one image's fault is split in halves until it is alone."""
        if not images:
            return []
        try:
            out = self.predict({input_key: [data for _, data in images]}, signature_name)
        except grpc.RpcError as error:
            if error.code() not in _SPLIT_ON:
                raise
            if len(images) == 1:
                details = (error.details() or "").strip().splitlines()
                return [(images[0], "the server refused it: %s: %s" % (
                    error.code().name, (details[0] if details else "")[:_MAX_ERROR_CHARS]))]
            half = len(images) // 2
            return (self._run_isolating(images[:half], input_key, signature_name) +
                    self._run_isolating(images[half:], input_key, signature_name))
        return [(image, {key: value[position] for key, value in out.items()})
                for position, image in enumerate(images)]

    def _result(self, path, data, outputs, top_k):
        probabilities = np.asarray(outputs[conventions.PROBABILITIES], np.float64).reshape(-1)
        order = [int(i) for i in np.argsort(-probabilities, kind="stable")[:max(1, top_k)]]
        class_id = order[0]
        answered = outputs.get(conventions.CLASS_NAMES)
        answered = answered.decode("utf-8", "replace") if isinstance(answered, bytes) \
            else None
        names = self.class_names(data, len(probabilities)) if top_k > 1 or answered is None \
            else None
        if names is not None and answered is not None and names[class_id] != answered:
            names = None  # another signature's classes: trust only what this one said
        name = answered if answered is not None else (names[class_id] if names else None)
        return FileResult(path, None, class_id, name, [
            (i, name if i == class_id else (names[i] if names else None),
             float(probabilities[i])) for i in order])


def read_image(path, max_bytes):
    """(bytes, None), or (None, why) for a file that cannot be sent: read as every tool
    reads an image it was given (slimserve/image_listing.py): a regular file (never opens
    a named pipe or a device) of at most `max_bytes` (--max_message_bytes), not empty, a
    JPEG, PNG, GIF or BMP (what every serving signature decodes) by its first bytes."""
    try:
        return image_listing.read_image(path, max_bytes, "--max_message_bytes"), None
    except image_listing.NotReadable as reason:
        return None, str(reason)
