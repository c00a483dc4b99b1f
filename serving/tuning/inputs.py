"""What the tuner sends: load inputs and comparison inputs, in the form the tuned
signature takes.

A signature the tuner can drive has one string input: encoded images (slimserve's
`serving_default`: `image_bytes`), or serialized tf.Examples (a classify / regress
signature, or an input named `inputs` / `examples`). The comparison inputs come from the
validation split of a converted data set (`--data_dir`), else from request logs
(`--logs`), else from the load images; they are read once, so every setting is compared
on the same inputs. Everything read is bounded in count and bytes before it is held.
"""
import dataclasses
import struct

import tensorflow as tf
from google.protobuf import message
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import saved_model_pb2

from slimserve import conventions
from slimserve import errors
from slimserve.serving.clients import image_classifier
from slimserve.serving.clients import loadtest
from slimserve.serving.core import errors as serving_errors
from slimserve.serving.core import tensors
from slimserve.serving.observability import request_log

IMAGES = "encoded images"
EXAMPLES = "serialized tf.Examples"
_EXAMPLE_METHODS = ("tensorflow/serving/classify", "tensorflow/serving/regress")
_EXAMPLE_KEYS = (conventions.EXAMPLES, "examples")
_FORMATS = ((b"\xff\xd8", b"jpeg"), (b"\x89PNG", b"png"), (b"GIF8", b"gif"), (b"BM", b"bmp"))


def signatures(model_base_path, tags=("serve",)):
    """{name: SignatureDef} of the newest version under a base path (or of a SavedModel
    directory), read from saved_model.pb without loading the model."""
    path = tf.io.gfile.join(image_classifier.resolve_model_dir(model_base_path),
                            "saved_model.pb")
    saved_model = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(path, "rb") as handle:
        saved_model.ParseFromString(handle.read())  # protobuf itself caps a message at 2 GiB
    for meta_graph in saved_model.meta_graphs:
        if set(meta_graph.meta_info_def.tags) == set(tags):
            return dict(meta_graph.signature_def)
    raise errors.UserError("%s has no MetaGraph tagged %s" % (path, ",".join(tags)))


def kind_for(model_base_path, signature_name):
    """(IMAGES or EXAMPLES, input key) of `signature_name` in the model to be served."""
    try:
        found = signatures(model_base_path)
    except (errors.UserError, OSError, tf.errors.OpError, message.DecodeError) as error:
        raise errors.UserError("--model_base_path=%s: %s" % (model_base_path, getattr(
            error, "message", None) or error)) from None
    if signature_name not in found:
        raise errors.UserError("--signature_name=%s: the model at %s has signatures %s" % (
            signature_name, model_base_path, ", ".join(sorted(found)) or "none"))
    return request_kind(signature_name, found[signature_name])


def request_kind(signature_name, signature_def):
    """(IMAGES or EXAMPLES, input key) for a signature; UserError naming the flag when
    the tuner cannot feed it."""
    inputs = dict(signature_def.inputs)
    if len(inputs) != 1 or next(iter(inputs.values())).dtype != types_pb2.DT_STRING:
        raise errors.UserError(
            "--signature_name=%s takes %s; the tuner sends one string input (encoded images, "
            "or serialized tf.Examples to a classify/regress signature)" % (
                signature_name, ", ".join("%s (%s)" % (k, types_pb2.DataType.Name(v.dtype))
                                          for k, v in sorted(inputs.items())) or "no input"))
    key = next(iter(inputs))
    if signature_def.method_name in _EXAMPLE_METHODS or key in _EXAMPLE_KEYS:
        return EXAMPLES, key
    return IMAGES, key


def image_example(encoded):
    """A serialized tf.Example holding one encoded image under the slim keys."""
    image_format = next((name for magic, name in _FORMATS if encoded.startswith(magic)), b"")
    example = tf.train.Example()
    example.features.feature[conventions.ENCODED].bytes_list.value.append(encoded)
    if image_format:
        example.features.feature[conventions.FORMAT].bytes_list.value.append(image_format)
    return example.SerializeToString()


def _encoded(example, where):
    values = example.features.feature[conventions.ENCODED].bytes_list.value
    if not values:
        raise errors.UserError("%s: a tf.Example without %s" % (where, conventions.ENCODED))
    return values[0]


def _records(path, budget):
    """TFRecord payloads of one file; the length header is checked against `budget`
    (bytes still allowed) before a record is read."""
    with tf.io.gfile.GFile(path, "rb") as handle:
        offset = 0
        while True:
            header = handle.read(12)  # uint64 length, uint32 masked crc of the length
            if not header:
                return
            if len(header) < 12:
                raise errors.UserError("%s: truncated TFRecord header at byte %d" % (path, offset))
            (length,) = struct.unpack("<Q", header[:8])
            if length > budget:
                raise errors.UserError("%s: the record at byte %d is %d bytes, more than the %d "
                                 "left of --max_input_mb" % (path, offset, length, budget))
            data, footer = handle.read(length), handle.read(4)
            if len(data) < length or len(footer) < 4:
                raise errors.UserError("%s: truncated TFRecord at byte %d" % (path, offset))
            yield offset, data
            offset += 16 + length


def from_data_dir(data_dir, kind, limit, max_bytes, labels=None):
    """Up to `limit` inputs from the validation split of a converted data set; when
    `labels` is a list, each input's (label id, label text) is appended to it (None, ""
    where the example has none)."""
    files = sorted(tf.io.gfile.glob(conventions.shard_pattern(data_dir, conventions.VALIDATION)))
    if not files:
        raise errors.UserError("--data_dir=%s holds no %s-*-of-* shards (slimserve-convert writes "
                         "them)" % (data_dir, conventions.VALIDATION))
    rows, used = [], 0
    for path in files:
        for offset, record in _records(path, max_bytes - used):
            where = "%s (record at byte %d)" % (path, offset)
            try:
                example = tf.train.Example.FromString(record)
            except Exception:  # protobuf's DecodeError
                raise errors.UserError("%s is not a tf.Example" % where) from None
            value = record if kind == EXAMPLES else _encoded(example, where)
            if labels is not None:
                feature = example.features.feature
                ids = feature[conventions.LABEL].int64_list.value
                texts = feature[conventions.TEXT].bytes_list.value
                labels.append((ids[0] if ids else None,
                               texts[0].decode("utf-8", "replace") if texts else ""))
            rows.append(value)
            used += len(value)
            if len(rows) >= limit:
                return rows
    return rows


def from_logs(pattern, signature_name, kind, key, limit, max_bytes):
    """Up to `limit` inputs of the logged requests made to `signature_name` (one per row of
    a batched request), read with the server's own request-log reader."""
    rows, used = [], 0
    for log in request_log.iter_logs(pattern):
        log_type = log.WhichOneof("log_type")
        request = getattr(log, log_type).request if log_type else None
        if request is None or (request.model_spec.signature_name
                               or conventions.DEFAULT_SIGNATURE) != signature_name:
            continue
        if log_type == "predict_log":
            if key not in request.inputs:
                continue
            try:
                values = list(tensors.from_proto(key, request.inputs[key]).reshape(-1))
            except serving_errors.ServingError:  # a logged request the server refused: not an input
                continue
        elif log_type in ("classify_log", "regress_log"):
            examples = list(request.input.example_list.examples)
            values = ([e.SerializeToString() for e in examples] if kind == EXAMPLES else
                      [_encoded(e, "%s (a %s)" % (pattern, log_type)) for e in examples])
        else:
            continue
        for value in values:
            if not isinstance(value, bytes):
                continue
            if used + len(value) > max_bytes:
                raise errors.UserError("--logs=%s: the logged inputs pass --max_input_mb" % pattern)
            rows.append(value)
            used += len(value)
            if len(rows) >= limit:
                return rows
    if not rows:
        raise errors.UserError("--logs=%s holds no logged request to signature %r with input %r"
                         % (pattern, signature_name, key))
    return rows


@dataclasses.dataclass
class Sources:
    """Where the tuner's inputs come from (flags); `read` shapes them for a signature."""
    images: str = ""          # load inputs (and comparison inputs when nothing else)
    data_dir: str = ""        # comparison inputs: the validation split
    logs: str = ""            # comparison inputs: request logs (a glob)
    compare_limit: int = 500
    max_bytes: int = 256 << 20
    # [(label id, label text)] of the comparison inputs once read (the validation split's);
    # None when they carry no labels (request logs, load images)
    labels: list = dataclasses.field(default=None, init=False)

    def check(self):
        """Cheap checks before any server starts."""
        if not (self.images or self.data_dir or self.logs):
            raise errors.UserError("give --images, --data_dir or --logs")
        if self.images and not tf.io.gfile.exists(self.images):
            raise errors.UserError("--images=%s does not exist" % self.images)
        if self.data_dir and not tf.io.gfile.glob(
                conventions.shard_pattern(self.data_dir, conventions.VALIDATION)):
            raise errors.UserError("--data_dir=%s holds no %s-*-of-* shards (slimserve-convert "
                             "writes them)" % (self.data_dir, conventions.VALIDATION))
        if self.logs and not self.data_dir and not [
                f for f in tf.io.gfile.glob(self.logs) if not tf.io.gfile.isdir(f)]:
            raise errors.UserError("--logs=%s matches no file" % self.logs)

    def read(self, signature_name, kind, key):
        """(load inputs, comparison inputs, a phrase saying where the latter came from)."""
        compare = source = None
        if self.data_dir:
            labels = []
            compare = from_data_dir(self.data_dir, kind, self.compare_limit, self.max_bytes,
                                    labels)
            self.labels = labels if all(label is not None for label, _ in labels) else None
            source = "%d validation images of %s" % (len(compare), self.data_dir)
        elif self.logs:
            compare = from_logs(self.logs, signature_name, kind, key, self.compare_limit,
                                self.max_bytes)
            source = "%d logged inputs of %s" % (len(compare), self.logs)
        load = None
        if self.images:
            load = loadtest.load_images(self.images)
            if kind == EXAMPLES:
                load = [image_example(image) for image in load]
        if compare is None:
            compare = load[:self.compare_limit]
            source = "%d images of %s" % (len(compare), self.images)
        if not compare:
            raise errors.UserError("no input to compare predictions on (%s)" % source)
        return load or compare, compare, source
