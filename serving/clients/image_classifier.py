"""A SavedModel's image-bytes signature as a function of a batch of inputs: the
classifier bulk inference runs, in this process (serving/bulk/predict.py) or behind
Beam's RunInference (serving/bulk/beam.py).

Loaded through the server's own servable (so it answers as slimserve-server would: on
TensorFlow, or with runtime "openvino" the network on OpenVINO as --prefer_openvino_model
runs it, a version without an IR converted at load), it
turns each ImageInput into one row: the class id and name and the top-k probabilities,
or an `error` for an input that could not be read or decoded. A batch that fails is split
in halves until the bad image is alone, so one bad image never costs its neighbours'
answers. Optionally each row carries a PredictionLog as TFX's BulkInferrer writes them.
Class names come from the signature's `class_names` output, else the model's labels.txt.

Also the one reader of a model's labels.txt (`read_model_labels`), and what every client
judging a model's answers shares: `resolve_model_dir` (a version or a base path's newest)
and `decision` (outputs -> the class named per prediction), used by the flywheel's canary
comparison and by the tuner's accuracy guard.
"""
import os

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from slimserve import conventions
from slimserve.errors import UserError
from slimserve.serving.bulk import inputs as bulk_inputs
from slimserve.serving.core import errors
from slimserve.serving.core import openvino_servable
from slimserve.serving.core import servable as servable_lib
from slimserve.serving.core import version_dirs

# Output keys read for the class decision and for the probabilities, in order of
# preference: slimserve's predict signatures, then TF Serving's classify convention.
CLASS_KEYS = (conventions.CLASSES,)
SCORE_KEYS = (conventions.PROBABILITIES, conventions.SCORES)


TENSORFLOW, OPENVINO = openvino_servable.TENSORFLOW, openvino_servable.OPENVINO
RUNTIMES = (TENSORFLOW, OPENVINO)


class ImageClassifier:
    """A SavedModel's image-bytes signature as a function of a batch of ImageInputs."""

    def __init__(self, path, version=0, model_name="resnet",
                 signature_name="serving_default", top_k=5, prediction_log=False,
                 session_config=None, runtime=TENSORFLOW, openvino_precision="fp32"):
        if runtime not in RUNTIMES:
            raise bulk_inputs.BulkPredictError("--runtime must be one of %s, got %r" % (
                ", ".join(RUNTIMES), runtime))
        if runtime == OPENVINO:
            self.servable = openvino_servable.OpenVinoServable(
                model_name, version, path, session_config,
                options=openvino_servable.OpenVinoOptions(precision=openvino_precision))
        else:
            self.servable = servable_lib.Servable(model_name, version, path, session_config)
        try:
            self.signature_name, self.signature = self.servable.signature(signature_name)
        except errors.ServingError:
            self.servable.retire()
            raise bulk_inputs.BulkPredictError(
                "--signature_name %s: %s has no such signature (has %s)" % (
                    signature_name, path, ", ".join(sorted(self.servable.signatures)))) \
                from None
        if len(self.signature.inputs) != 1:
            raise bulk_inputs.BulkPredictError(
                "signature %s of %s takes %s; bulk inference needs one input of encoded "
                "images" % (signature_name, path, sorted(self.signature.inputs)))
        self.input_key = next(iter(self.signature.inputs))
        for key in (conventions.PROBABILITIES,):
            if key not in self.signature.outputs:
                raise bulk_inputs.BulkPredictError(
                    "signature %s of %s has no %r output (has %s)" % (
                        signature_name, path, key, sorted(self.signature.outputs)))
        self.output_keys = sorted(self.signature.outputs)
        self.class_names = read_model_labels(path)
        self.top_k = top_k
        self.prediction_log = prediction_log

    def close(self):
        self.servable.retire()

    def predict(self, inputs):
        """One row (a dict) per ImageInput, in order; errors become rows."""
        rows = [None] * len(inputs)
        good = [i for i, item in enumerate(inputs) if item.error is None]
        for i, item in enumerate(inputs):
            if item.error is not None:
                rows[i] = error_row(item, item.error)
        for index, outputs in self._run_isolating([inputs[i] for i in good], good):
            item = inputs[index]
            rows[index] = (error_row(item, outputs) if isinstance(outputs, str)
                           else self._row(item, outputs))
        return rows

    def _run_isolating(self, items, indices):
        """Runs the batch; on a failure, halves it until the bad images are alone."""
        if not items:
            return []
        try:
            out = self.servable.run(self.signature, {
                self.input_key: np.array([item.data for item in items], dtype=object)},
                self.output_keys)
        except errors.ServingError as error:
            if len(items) == 1:
                return [(indices[0], "cannot be decoded: %s" % error.message.splitlines()[0])]
            half = len(items) // 2
            return (self._run_isolating(items[:half], indices[:half]) +
                    self._run_isolating(items[half:], indices[half:]))
        return [(index, {key: value[position] for key, value in out.items()})
                for position, index in enumerate(indices)]

    def _row(self, item, outputs):
        probabilities = np.asarray(outputs[conventions.PROBABILITIES], dtype=np.float64)
        order = np.argsort(-probabilities, kind="stable")[:self.top_k]
        class_id = int(order[0])
        row = {"path": item.key, "class_id": class_id,
               "class_name": self._name(class_id, outputs),
               "top_k": [{"class_id": int(c), "class_name": self._name(int(c)),
                          "probability": float(probabilities[c])} for c in order]}
        if item.label is not None:
            row["label"] = item.label
        if self.prediction_log:
            row["_prediction_log"] = self._log(item, outputs)
        return row

    def _name(self, class_id, outputs=None):
        if outputs is not None and conventions.CLASS_NAMES in outputs:
            value = outputs[conventions.CLASS_NAMES]
            return value.decode("utf-8") if isinstance(value, bytes) else str(value)
        if class_id < len(self.class_names):
            return self.class_names[class_id]
        return str(class_id)

    def _log(self, item, outputs):
        """A PredictionLog as TFX's BulkInferrer writes (request and response)."""
        log = prediction_log_pb2.PredictionLog()
        request = log.predict_log.request
        request.model_spec.name = self.servable.name
        request.model_spec.version.value = self.servable.version
        request.model_spec.signature_name = self.signature_name
        request.inputs[self.input_key].CopyFrom(tf.make_tensor_proto([item.data]))
        response = log.predict_log.response
        response.model_spec.CopyFrom(request.model_spec)
        for key, value in outputs.items():
            response.outputs[key].CopyFrom(tf.make_tensor_proto(np.asarray(value)[None]))
        return log.SerializeToString()


def error_row(item, message):
    row = {"path": item.key, "error": message}
    if item.label is not None:
        row["label"] = item.label
    return row


# A labels.txt larger than this is refused rather than read into memory (a model
# directory may come from anyone: the labelling page reads it too).
MAX_LABELS_BYTES = 1 << 24


def read_model_labels(path):
    """Class names from the SavedModel's labels.txt asset (`id:name`), [] if it has none;
    the one reader of a model's labels (bulk inference, the canary comparison and the
    flywheel's labelling and retrain all name classes with it). A file that does not
    parse, or is over MAX_LABELS_BYTES, is a UserError naming it."""
    labels = os.path.join(path, "assets", conventions.LABELS_ASSET)
    if not tf.io.gfile.exists(labels):
        return []
    with tf.io.gfile.GFile(labels, "rb") as handle:
        data = handle.read(MAX_LABELS_BYTES + 1)
    if len(data) > MAX_LABELS_BYTES:
        raise UserError("%s is over %d bytes: not a labels file" % (labels, MAX_LABELS_BYTES))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError("%s is not UTF-8 text: %s" % (labels, error)) from None
    return conventions.parse_labels(text.split("\n"), labels)


def resolve_model_dir(path):
    """A SavedModel directory, or a base path whose newest integer version is used."""
    if tf.io.gfile.exists(tf.io.gfile.join(path, "saved_model.pb")):
        return path
    versions = version_dirs.list_version_dirs(path)
    if not versions:
        raise UserError("%s is neither a SavedModel directory nor a base path with an "
                        "integer version holding saved_model.pb" % path)
    return versions[max(versions)]


def decision(outputs, names=()):
    """(class per prediction [B] as text, scores [B, C] or None) from a signature's
    outputs: a classify signature's class strings, else the class id named through the
    model's labels.txt (`names`; the id as text when it has none)."""
    scores = next((outputs[k] for k in SCORE_KEYS if k in outputs), None)
    classes = next((outputs[k] for k in CLASS_KEYS if k in outputs), None)
    if scores is not None and scores.ndim == 2:
        chosen = np.argmax(scores, axis=1)
        if classes is not None and classes.ndim == 2:  # classify: class names per column
            return [_text(classes[i, j]) for i, j in enumerate(chosen)], scores
        return [_name(int(c), names) for c in chosen], scores
    if classes is not None:
        first = classes.reshape(len(classes), -1)[:, 0]
        return [_name(int(c), names) if np.issubdtype(first.dtype, np.integer) else _text(c)
                for c in first], None
    raise UserError("outputs %s have neither class ids nor scores to compare"
                    % sorted(outputs))


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _name(class_id, names):
    return names[class_id] if 0 <= class_id < len(names) else str(class_id)
