"""TF Serving's config messages that the tensorflow-serving-api wheel does not ship
(BatchingParameters, MonitoringConfig, SSLConfig), so their text-format files are
parsed by protobuf's own text_format exactly as tensorflow_model_server parses them:
an unknown field is an error naming it, and wrapper values (`{ value: 8 }`) parse.

Field names and numbers are those of TF Serving 2.15.1's
servables/tensorflow/session_bundle_config.proto, config/monitoring_config.proto and
config/ssl_config.proto. The descriptors live in a private pool, so a future wheel
that ships the same messages cannot clash with them.
"""
from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory
from google.protobuf import wrappers_pb2

_PACKAGE = "tensorflow.serving"
_F = descriptor_pb2.FieldDescriptorProto

_MESSAGES = {
    # name: [(field, number, type, label, message type or None)]
    "BatchingParameters": [
        ("max_batch_size", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".google.protobuf.Int64Value"),
        ("batch_timeout_micros", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".google.protobuf.Int64Value"),
        ("max_enqueued_batches", 3, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".google.protobuf.Int64Value"),
        ("num_batch_threads", 4, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".google.protobuf.Int64Value"),
        ("thread_pool_name", 5, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".google.protobuf.StringValue"),
        ("allowed_batch_sizes", 6, _F.TYPE_INT64, _F.LABEL_REPEATED, None),
        ("pad_variable_length_inputs", 7, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
        ("enable_large_batch_splitting", 8, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".google.protobuf.BoolValue"),
        ("max_execution_batch_size", 9, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".google.protobuf.Int64Value"),
    ],
    "PrometheusConfig": [
        ("enable", 1, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
        ("path", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
    ],
    "MonitoringConfig": [
        ("prometheus_config", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".tensorflow.serving.PrometheusConfig"),
    ],
    "SSLConfig": [
        ("server_key", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("server_cert", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("custom_ca", 3, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("client_verify", 4, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
    ],
}


def _build():
    pool = descriptor_pool.DescriptorPool()
    wrappers = descriptor_pb2.FileDescriptorProto.FromString(
        wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(wrappers)
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="slimserve/tfserving_config.proto", package=_PACKAGE, syntax="proto3",
        dependency=[wrappers.name])
    for name, fields in _MESSAGES.items():
        message = file_proto.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            entry = message.field.add(name=field, number=number, type=kind, label=label,
                                      json_name=_camel(field))
            if type_name:
                entry.type_name = type_name
    pool.Add(file_proto)
    return {name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName("%s.%s" % (_PACKAGE, name))) for name in _MESSAGES}


def _camel(name):
    head, *tail = name.split("_")
    return head + "".join(part.title() for part in tail)


_CLASSES = _build()
BatchingParameters = _CLASSES["BatchingParameters"]
PrometheusConfig = _CLASSES["PrometheusConfig"]
MonitoringConfig = _CLASSES["MonitoringConfig"]
SSLConfig = _CLASSES["SSLConfig"]


def prometheus_monitoring(path):
    """A MonitoringConfig that serves Prometheus metrics at `path` (what a
    --monitoring_config_file with `prometheus_config { enable: true path: ... }` holds)."""
    return MonitoringConfig(prometheus_config=PrometheusConfig(enable=True, path=path))
