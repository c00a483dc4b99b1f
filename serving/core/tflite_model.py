"""The `model.tflite` file as TF Serving 2.15.1 reads it: the flatbuffer, its custom ops,
and the SignatureDefs TF Serving keeps in the model's metadata.

TF Serving does not read TFLite's own (SignatureRunner) signatures: it reads TensorFlow
`SignatureDef` protos stored under the metadata entry `signature_defs_metadata` as a
FlexBuffer map {signature key: serialized SignatureDef} (tensorflow/lite/tools/signature/
signature_def_util.cc, which TF's pip wheel does not ship). `read_signature_defs` reads
that map exactly as TF Serving does, and `with_signature_defs` writes it byte for byte as
TF's C++ writer does, so a model written here is served the same by both servers.
"""
import os

import numpy as np
import tensorflow as tf
from flatbuffers import flexbuffers
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.lite.python import schema_py_generated as schema
from tensorflow.lite.tools import flatbuffer_utils

from slimserve.serving.core import version_dirs

MODEL_FILENAME = version_dirs.TFLITE_MODEL  # what --prefer_tflite_model serves
SIGNATURE_DEFS_METADATA = "signature_defs_metadata"
# Flatbuffers address with 32-bit offsets; a larger file cannot be a TFLite model.
MAX_MODEL_BYTES = 2 ** 31 - 1
# The custom ops TF Serving's TfLiteSession registers besides the builtins
# (tflite::ops::custom::AddParseExampleOp). TF's Python interpreter has no kernel for them.
TF_SERVING_CUSTOM_OPS = ("ParseExample", "ParseExampleV2")


def has_model(version_dir):
    return tf.io.gfile.exists(os.path.join(version_dir, MODEL_FILENAME))


def read_model(version_dir):
    """The bytes of `<version_dir>/model.tflite`, its size checked before it is read."""
    path = os.path.join(version_dir, MODEL_FILENAME)
    size = tf.io.gfile.stat(path).length
    if size > MAX_MODEL_BYTES:
        raise ValueError("%s is %d bytes; a TFLite flatbuffer is at most %d bytes"
                         % (path, size, MAX_MODEL_BYTES))
    with tf.io.gfile.GFile(path, "rb") as handle:
        data = handle.read(size + 1)
    if len(data) != size:
        raise ValueError("%s changed size while it was read" % path)
    return data


def _model(data):
    if len(data) < 8 or not schema.Model.ModelBufferHasIdentifier(data, 0):
        raise ValueError("Cannot build FlatBufferModel from buffer: not a TFLite model "
                         "(no TFL3 identifier)")
    return schema.Model.GetRootAsModel(data, 0)


def custom_ops(data):
    """Sorted names of the custom ops (Select TF "Flex" ops included) the model uses."""
    model = _model(data)
    names = set()
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin == schema.BuiltinOperator.CUSTOM:
            names.add((code.CustomCode() or b"").decode("utf-8", "replace"))
    return sorted(names)


def _metadata_buffer(model):
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        if entry.Name() == SIGNATURE_DEFS_METADATA.encode():
            buffer = model.Buffers(entry.Buffer()) if entry.Buffer() < model.BuffersLength() \
                else None
            if buffer is None:
                raise ValueError("Error reading signature def map: metadata %s names "
                                 "buffer %d of %d" % (SIGNATURE_DEFS_METADATA, entry.Buffer(),
                                                      model.BuffersLength()))
            return buffer.DataAsNumpy().tobytes() if buffer.DataLength() else b""
    return None


def read_signature_defs(data):
    """{key: SignatureDef} from the model's `signature_defs_metadata` ({} when it has
    none). Raises ValueError as tflite::GetSignatureDefMap fails."""
    raw = _metadata_buffer(_model(data))
    if raw is None:
        return {}
    try:
        entries = flexbuffers.GetRoot(raw).AsMap
        pairs = [(k.AsKey, bytes(v.AsStringBytes)) for k, v in zip(entries.Keys,
                                                                     entries.Values)]
    except Exception as error:  # pylint: disable=broad-except  (any malformed buffer)
        raise ValueError("Error reading signature def map: %s" % error) from None
    found = {}
    for key, serialized in pairs:
        # TF's reader takes each value through c_str(): it ends at the first NUL byte.
        serialized = serialized.split(b"\0", 1)[0]
        try:
            found[key] = meta_graph_pb2.SignatureDef.FromString(serialized)
        except Exception:  # pylint: disable=broad-except  (DecodeError and friends)
            raise ValueError("Cannot parse signature def found in flatbuffer.") from None
    return found


def with_signature_defs(data, signature_defs):
    """The model `data` with its `signature_defs_metadata` set to `signature_defs`
    ({key: SignatureDef}), replacing any there was (tflite::SetSignatureDefMap)."""
    if not signature_defs:
        raise ValueError("signature_def_map should not be empty")
    builder = flexbuffers.Builder()
    start = builder._StartMap()  # pylint: disable=protected-access
    for key, signature_def in sorted(signature_defs.items()):
        serialized = signature_def.SerializeToString(deterministic=True)
        if b"\0" in serialized:
            raise ValueError("signature %r serializes with a NUL byte (a scalar or "
                             "zero-sized dimension), which TF Serving's reader cuts off; "
                             "give its tensors a shape with non-zero dimensions" % key)
        builder.Key(key)
        # A binary STRING value, as the C++ fbb.String(key, std::string) writes it;
        # Builder.String only takes text.
        builder._WriteBlob(serialized, append_zero=True,  # pylint: disable=protected-access
                           type_=flexbuffers.Type.STRING)
    builder._EndMap(start)  # pylint: disable=protected-access
    payload = bytes(builder.Finish())
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
    model.metadata = list(model.metadata or [])
    entry = next((m for m in model.metadata
                  if m.name in (SIGNATURE_DEFS_METADATA, SIGNATURE_DEFS_METADATA.encode())),
                 None)
    if entry is None:
        model.buffers.append(schema.BufferT())
        entry = schema.MetadataT()
        entry.name = SIGNATURE_DEFS_METADATA
        entry.buffer = len(model.buffers) - 1
        model.metadata.append(entry)
    model.buffers[entry.buffer].data = np.frombuffer(payload, np.uint8)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))
