"""TF Serving's config messages that the tensorflow-serving-api wheel does not ship
(BatchingParameters, SessionBundleConfig, PlatformConfigMap, ThreadPoolFactoryConfig,
MonitoringConfig, SSLConfig), so their text-format files are parsed by protobuf's own
text_format exactly as tensorflow_model_server parses them: an unknown field is an error
naming it, wrapper values (`{ value: 8 }`) and expanded Any values
(`[type.googleapis.com/tensorflow.serving.SavedModelBundleSourceAdapterConfig] { ... }`)
parse.

Field names and numbers are those of TF Serving 2.15.1's
servables/tensorflow/session_bundle_config.proto, saved_model_bundle_source_adapter.proto,
thread_pool_factory_config.proto, config/platform_config.proto,
config/monitoring_config.proto and config/ssl_config.proto. The descriptors live in a
private pool (POOL, built by config/descriptors.py; TensorFlow's ConfigProto and
NamedTensorProto are copied into it), so a future wheel that ships the same messages
cannot clash with them.
"""
from google.protobuf import any_pb2
from google.protobuf import message_factory
from google.protobuf import wrappers_pb2
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import named_tensor_pb2

from slimserve.serving.config import descriptors

_PACKAGE = "tensorflow.serving"
_F = descriptors.F
_MAP = descriptors.MAP

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
    "ModelWarmupOptions": [
        ("num_request_iterations", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".google.protobuf.Int32Value"),
        ("num_model_warmup_threads", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".google.protobuf.Int32Value"),
        ("model_name", 3, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("model_version", 4, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("enable_all_batch_sizes_warmup", 5, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
    ],
    "SessionBundleConfig": [
        ("session_target", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("session_config", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".tensorflow.ConfigProto"),
        ("batching_parameters", 3, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".tensorflow.serving.BatchingParameters"),
        ("session_run_load_threadpool_index", 4, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".google.protobuf.Int32Value"),
        ("experimental_transient_ram_bytes_during_load", 5, _F.TYPE_UINT64,
         _F.LABEL_OPTIONAL, None),
        ("saved_model_tags", 6, _F.TYPE_STRING, _F.LABEL_REPEATED, None),
        ("experimental_fixed_input_tensors", 778, _F.TYPE_MESSAGE, _F.LABEL_REPEATED,
         ".tensorflow.NamedTensorProto"),
        ("enable_model_warmup", 779, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
        ("model_warmup_options", 780, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".tensorflow.serving.ModelWarmupOptions"),
        ("enable_session_metadata", 781, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
        ("remove_unused_fields_from_bundle_metagraph", 782, _F.TYPE_BOOL, _F.LABEL_OPTIONAL,
         None),
        ("prefer_tflite_model", 783, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
        ("resource_estimation_uses_validation_result", 784, _F.TYPE_BOOL, _F.LABEL_OPTIONAL,
         None),
        ("num_tflite_interpreters", 785, _F.TYPE_INT32, _F.LABEL_OPTIONAL, None),
        ("num_tflite_interpreters_per_pool", 786, _F.TYPE_INT32, _F.LABEL_OPTIONAL, None),
        ("num_tflite_pools", 787, _F.TYPE_INT32, _F.LABEL_OPTIONAL, None),
        ("wrap_session_with_no_threading_params", 788, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
        ("enable_per_model_batching_params", 789, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
        ("enable_saved_model_config", 790, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
        ("mixed_precision", 791, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
    ],
    "SavedModelBundleSourceAdapterConfig": [
        ("legacy_config", 1000, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".tensorflow.serving.SessionBundleConfig"),
    ],
    "PlatformConfig": [
        ("source_adapter_config", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".google.protobuf.Any"),
    ],
    "PlatformConfigMap": [
        ("platform_configs", 1, _MAP, ("string", ".tensorflow.serving.PlatformConfig"), None),
    ],
    "ThreadPoolFactoryConfig": [
        ("thread_pool_factory_config", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
         ".google.protobuf.Any"),
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


POOL, _CLASSES = descriptors.build(
    "slimserve/tfserving_config.proto", _PACKAGE, _MESSAGES,
    imports=(wrappers_pb2.DESCRIPTOR, any_pb2.DESCRIPTOR, config_pb2.DESCRIPTOR,
             named_tensor_pb2.DESCRIPTOR))
BatchingParameters = _CLASSES["BatchingParameters"]
ModelWarmupOptions = _CLASSES["ModelWarmupOptions"]
SessionBundleConfig = _CLASSES["SessionBundleConfig"]
SavedModelBundleSourceAdapterConfig = _CLASSES["SavedModelBundleSourceAdapterConfig"]
PlatformConfig = _CLASSES["PlatformConfig"]
PlatformConfigMap = _CLASSES["PlatformConfigMap"]
ThreadPoolFactoryConfig = _CLASSES["ThreadPoolFactoryConfig"]
PrometheusConfig = _CLASSES["PrometheusConfig"]
MonitoringConfig = _CLASSES["MonitoringConfig"]
SSLConfig = _CLASSES["SSLConfig"]
# TensorFlow's own messages as copied into POOL (a SessionBundleConfig's session_config is
# one of these; tensorflow_config() converts it to TensorFlow's class).
ConfigProto = message_factory.GetMessageClass(POOL.FindMessageTypeByName(
    "tensorflow.ConfigProto"))


def tensorflow_config(config):
    """A ConfigProto from POOL (e.g. SessionBundleConfig.session_config) as TensorFlow's
    own tf.compat.v1.ConfigProto."""
    return config_pb2.ConfigProto.FromString(config.SerializeToString())


def prometheus_monitoring(path):
    """A MonitoringConfig that serves Prometheus metrics at `path` (what a
    --monitoring_config_file with `prometheus_config { enable: true path: ... }` holds)."""
    return MonitoringConfig(prometheus_config=PrometheusConfig(enable=True, path=path))
