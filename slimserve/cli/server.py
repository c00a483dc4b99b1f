"""slimserve-server: the embedded TF-Serving-compatible model server (gRPC 8500, REST 8501).

Takes every one of tensorflow_model_server 2.15.1's 46 flags, with the same meaning, so
a command line written for one runs the other:

    slimserve-server --port=8500 --rest_api_port=8501 --model_name=resnet \\
        --model_base_path=/models/resnet --enable_batching

Flags about hardware or runtimes this server does not have (TPU, ALTS, TFLite, platform
configs, ...) are accepted and logged once as having no effect. Unlike TF Serving it binds
127.0.0.1 unless --bind_address says otherwise.
"""
import logging
import os
import signal
import sys
import threading

from absl import flags
from google.protobuf import text_format

import tensorflow as tf

from slimserve.serving.core import batching
from slimserve.serving.core import errors
from slimserve.serving.core import manager as models
from slimserve.serving import server as server_lib
from slimserve.serving.core import tensors
from slimserve.serving.api import tls
from slimserve.cli import logs

FLAGS = flags.FLAGS
_CPUS = os.cpu_count() or 1
TF_SERVING_VERSION = "2.15.1"

# --- gRPC ---------------------------------------------------------------------------------
flags.DEFINE_integer("port", 8500, "gRPC port (0: pick a free one; TF Serving: 0 disables "
                     "TCP gRPC when --grpc_socket_path is given).")
flags.DEFINE_string("grpc_socket_path", "",
                    "If non-empty, also serve gRPC on this UNIX socket (relative or absolute).")
flags.DEFINE_string("grpc_channel_arguments", "",
                    "Comma-separated key=value gRPC server arguments, e.g. "
                    "grpc.max_receive_message_length=4194304.")
flags.DEFINE_integer("grpc_max_threads", 32, "Threads serving gRPC requests "
                     "(TF Serving: 4 x CPUs).")
flags.DEFINE_bool("enable_grpc_healthcheck_service", False,
                  "Serve the standard grpc.health.v1 Health service.")
flags.DEFINE_string("ssl_config_file", "",
                    "Text-format SSLConfig (server_key, server_cert, custom_ca, client_verify: "
                    "PEM texts inline): TLS on gRPC and on REST.")
flags.DEFINE_bool("use_alts_credentials", False, "Google ALTS credentials (no effect here).")
flags.DEFINE_string("bind_address", "127.0.0.1",
                    "Address both APIs bind (slimserve only; TF Serving binds 0.0.0.0).")
# --- REST ---------------------------------------------------------------------------------
flags.DEFINE_integer("rest_api_port", 8501, "REST port (0: no REST API; TF Serving's "
                     "default is 0). Must differ from --port.")
flags.DEFINE_integer("rest_api_num_threads", 4 * _CPUS,
                     "Threads processing REST requests (default 4 x CPUs, as TF Serving).")
flags.DEFINE_integer("rest_api_timeout_in_ms", 30000, "Timeout for REST API calls.")
flags.DEFINE_bool("rest_api_enable_cors_support", False, "Send CORS headers in REST responses.")
flags.DEFINE_integer("rest_max_body_bytes", 64 * 2 ** 20,
                     "Larger REST bodies get 413 before they are read (slimserve only).",
                     lower_bound=1)
flags.DEFINE_integer("rest_connection_limit", 256,
                     "Open REST connections; past it the longest-idle are closed (slimserve "
                     "only).", lower_bound=1)
flags.DEFINE_integer("rest_idle_timeout_seconds", 30,
                     "Close a REST connection idle this long (slimserve only).", lower_bound=1)
flags.DEFINE_integer("rest_read_timeout_seconds", 60,
                     "Drop a REST request not fully received this long after its first byte "
                     "(slimserve only).", lower_bound=1)
# --- models -------------------------------------------------------------------------------
flags.DEFINE_string("model_name", "resnet", "Name of the model at --model_base_path "
                    "(TF Serving's default: 'default').")
flags.DEFINE_string("model_base_path", None, "Folder of integer version sub-folders.")
flags.DEFINE_string("model_config_file", None,
                    "Text-format ModelServerConfig (several models).")
flags.DEFINE_integer("model_config_file_poll_wait_seconds", 0,
                     "Seconds between re-reads of --model_config_file; a changed file is "
                     "applied (new models load before old ones unload). 0: read once.")
flags.DEFINE_integer("file_system_poll_wait_seconds", 1,
                     "Seconds between scans of the base paths for new versions (0: once).")
flags.DEFINE_bool("allow_version_labels_for_unavailable_models", False,
                  "Allow assigning a version label to a version that is not yet available.")
flags.DEFINE_string("saved_model_tags", "",
                    "Comma-separated tags of the MetaGraphDef to load (empty: serve).")
flags.DEFINE_integer("num_load_threads", 0,
                     "Threads loading models; >1 loads different models in parallel "
                     "(0: serially).", lower_bound=0)
flags.DEFINE_integer("num_unload_threads", 0, "Threads unloading servables (no effect here).")
flags.DEFINE_integer("max_num_load_retries", 5,
                     "Retries after the first failed load of a version before giving up until "
                     "its files change (0: one attempt).", lower_bound=0)
flags.DEFINE_integer("load_retry_interval_micros", 60 * 1000 * 1000,
                     "Interval in microseconds between load retries of a failed version "
                     "(negative: no wait). Default: 1 minute, as TF Serving.")
flags.DEFINE_bool("flush_filesystem_caches", True, "Flush file-system caches after loads "
                  "(no effect here).")
flags.DEFINE_bool("enable_model_warmup", True,
                  "Replay assets.extra/tf_serving_warmup_requests before serving a version.")
flags.DEFINE_integer("num_request_iterations_for_warmup", 0,
                     "Times each warmup request is replayed (no effect here: once).")
flags.DEFINE_bool("enable_signature_method_name_check", False,
                  "Require Classify / Regress signatures to have the classify / regress "
                  "method_name (and Predict one of predict, classify, regress).")
flags.DEFINE_bool("remove_unused_fields_from_bundle_metagraph", True, "(no effect here)")
# --- batching -----------------------------------------------------------------------------
flags.DEFINE_bool("enable_batching", False, "Batch concurrent requests server-side.")
flags.DEFINE_string("batching_parameters_file", None,
                    "Text-format BatchingParameters (max_batch_size { value: 8 } ...).")
flags.DEFINE_bool("enable_per_model_batching_parameters", False,
                  "Per-model batching_params.pbtxt (no effect here).")
# --- TensorFlow session -------------------------------------------------------------------
flags.DEFINE_integer("tensorflow_session_parallelism", 0,
                     "Threads for both of TF's pools, unless the two below are given.")
flags.DEFINE_integer("tensorflow_intra_op_parallelism", 0, "Threads inside ops (0: TF's).")
flags.DEFINE_integer("tensorflow_inter_op_parallelism", 0, "Concurrent ops (0: TF's).")
flags.DEFINE_integer("max_request_elements", tensors.DEFAULT_MAX_REQUEST_ELEMENTS,
                     "Elements one Predict request may carry, summed over its inputs (gRPC "
                     "and REST); more is INVALID_ARGUMENT. Default 2^26: 256 MiB of float32 "
                     "(slimserve only).", lower_bound=1)
flags.DEFINE_integer("max_broadcast_elements", tensors.DEFAULT_MAX_BROADCAST_ELEMENTS,
                     "Largest tensor a TensorProto may fill from fewer values than its shape "
                     "has elements (TF's rule: last value repeated, zeros when none; "
                     "slimserve only).", lower_bound=0)
flags.DEFINE_string("tensorflow_session_config_file", "",
                    "Text-format tensorflow.ConfigProto for the model sessions.")
flags.DEFINE_float("per_process_gpu_memory_fraction", 0,
                   "Fraction of GPU memory each process takes (0: TF's default).")
flags.DEFINE_string("mixed_precision", "", "Mixed precision mode (no effect here).")
flags.DEFINE_bool("xla_cpu_compilation_enabled", False, "XLA:CPU JIT (no effect here).")
# --- other runtimes and services ----------------------------------------------------------
flags.DEFINE_string("monitoring_config_file", None,
                    "Text-format MonitoringConfig: prometheus_config { enable: true path: ... }.")
flags.DEFINE_string("platform_config_file", "", "PlatformConfigMap (no effect here).")
flags.DEFINE_bool("prefer_tflite_model", False, "Serve model.tflite (no effect here).")
flags.DEFINE_integer("num_tflite_pools", _CPUS, "TFLite interpreter pools (no effect here).")
flags.DEFINE_integer("num_tflite_interpreters_per_pool", 1,
                     "TFLite interpreters per pool (no effect here).")
flags.DEFINE_bool("enable_profiler", True, "Profiler service (no effect here).")
flags.DEFINE_string("thread_pool_factory_config_file", "",
                    "ThreadPoolConfig (no effect here).")
flags.DEFINE_bool("skip_initialize_tpu", False, "Skip TPU initialisation (no effect here).")
flags.DEFINE_bool("version", False, "Print the version and exit.")
# --bind_address is the one flag of ours that TF Serving lacks.

NO_EFFECT = ("use_alts_credentials", "num_unload_threads", "flush_filesystem_caches",
             "num_request_iterations_for_warmup", "remove_unused_fields_from_bundle_metagraph",
             "enable_per_model_batching_parameters", "mixed_precision",
             "xla_cpu_compilation_enabled", "platform_config_file", "prefer_tflite_model",
             "num_tflite_pools", "num_tflite_interpreters_per_pool", "enable_profiler",
             "thread_pool_factory_config_file", "skip_initialize_tpu")


def version_text():
    try:
        from importlib import metadata  # pylint: disable=import-outside-toplevel
        own = metadata.version("slimserve")
    except Exception:  # pylint: disable=broad-except
        own = "dev"
    return ("slimserve-server %s (TensorFlow ModelServer %s command line and APIs)\n"
            "TensorFlow Library: %s" % (own, TF_SERVING_VERSION, tf.__version__))


def log_flags_without_effect():
    """Each TF Serving flag this server accepts but cannot honour, named once."""
    given = [name for name in NO_EFFECT if FLAGS[name].present]
    for name in given:
        logging.warning("--%s=%s is accepted for TF Serving compatibility and has no effect "
                        "here", name, FLAGS[name].value)
    return given


def session_config():
    """ConfigProto as TF Serving builds it: the config file, then the GPU fraction, then the
    thread counts (intra/inter, else session_parallelism for both)."""
    config = tf.compat.v1.ConfigProto()
    if FLAGS.tensorflow_session_config_file:
        try:
            with open(FLAGS.tensorflow_session_config_file) as handle:
                text_format.Parse(handle.read(), config)
        except (OSError, UnicodeDecodeError, text_format.ParseError) as error:
            raise ValueError("--tensorflow_session_config_file %s: %s" % (
                FLAGS.tensorflow_session_config_file, error)) from None
    if not 0 <= FLAGS.per_process_gpu_memory_fraction <= 1:
        raise ValueError("--per_process_gpu_memory_fraction must be within [0, 1]")
    if FLAGS.per_process_gpu_memory_fraction:
        config.gpu_options.per_process_gpu_memory_fraction = (
            FLAGS.per_process_gpu_memory_fraction)
    intra, inter = FLAGS.tensorflow_intra_op_parallelism, FLAGS.tensorflow_inter_op_parallelism
    both = FLAGS.tensorflow_session_parallelism
    if intra > 0 and inter > 0 and both > 0:
        raise ValueError("Either configure --tensorflow_session_parallelism or "
                         "(--tensorflow_intra_op_parallelism, "
                         "--tensorflow_inter_op_parallelism) separately. You cannot "
                         "configure all.")
    if intra > 0 or inter > 0:
        config.intra_op_parallelism_threads, config.inter_op_parallelism_threads = intra, inter
    elif both > 0:
        config.intra_op_parallelism_threads = config.inter_op_parallelism_threads = both
    return config


def server_from_flags():
    if bool(FLAGS.model_config_file) == bool(FLAGS.model_base_path):
        raise ValueError("give exactly one of --model_base_path or --model_config_file")
    if FLAGS.use_alts_credentials and FLAGS.ssl_config_file:
        raise ValueError("Either --use_alts_credentials must be false or --ssl_config_file "
                         "must be empty.")
    if FLAGS.rest_api_port and FLAGS.rest_api_port == FLAGS.port:
        raise ValueError("--rest_api_port must differ from --port (both %d)" % FLAGS.port)
    for name in ("rest_api_num_threads", "rest_api_timeout_in_ms"):
        if FLAGS[name].value < 1:
            raise ValueError("--%s must be >= 1" % name)
    if FLAGS.model_config_file:
        configs = models.parse_model_config_file(FLAGS.model_config_file)
    else:
        configs = [models.ServedModel(FLAGS.model_name, FLAGS.model_base_path)]
    params = None
    if FLAGS.enable_batching:
        params = (batching.BatchingParameters.from_file(FLAGS.batching_parameters_file)
                  if FLAGS.batching_parameters_file else batching.BatchingParameters())
    elif FLAGS.batching_parameters_file:
        raise ValueError("--batching_parameters_file needs --enable_batching")
    monitoring = (server_lib.parse_monitoring_config(FLAGS.monitoring_config_file)
                  if FLAGS.monitoring_config_file else None)
    ssl_config = tls.load_ssl_config(FLAGS.ssl_config_file) if FLAGS.ssl_config_file else None
    tags = tuple(t for t in FLAGS.saved_model_tags.split(",") if t) or None
    log_flags_without_effect()
    return server_lib.ModelServer(
        configs, port=FLAGS.port, rest_api_port=FLAGS.rest_api_port,
        bind_address=FLAGS.bind_address, batching=params,
        poll_seconds=FLAGS.file_system_poll_wait_seconds, warmup=FLAGS.enable_model_warmup,
        monitoring_path=monitoring,
        grpc_options=server_lib.parse_channel_arguments(FLAGS.grpc_channel_arguments),
        grpc_max_threads=FLAGS.grpc_max_threads, session_config=session_config(),
        max_num_load_retries=FLAGS.max_num_load_retries,
        max_request_elements=FLAGS.max_request_elements,
        max_broadcast_elements=FLAGS.max_broadcast_elements,
        grpc_socket_path=FLAGS.grpc_socket_path or None, ssl_config=ssl_config,
        enable_grpc_healthcheck_service=FLAGS.enable_grpc_healthcheck_service,
        method_name_check=FLAGS.enable_signature_method_name_check,
        model_config_file=FLAGS.model_config_file,
        model_config_file_poll_seconds=FLAGS.model_config_file_poll_wait_seconds,
        rest_api_timeout_in_ms=FLAGS.rest_api_timeout_in_ms,
        rest_max_body_bytes=FLAGS.rest_max_body_bytes,
        rest_connection_limit=FLAGS.rest_connection_limit,
        rest_idle_timeout_seconds=FLAGS.rest_idle_timeout_seconds,
        rest_read_timeout_seconds=FLAGS.rest_read_timeout_seconds,
        rest_api_num_threads=FLAGS.rest_api_num_threads,
        rest_api_enable_cors_support=FLAGS.rest_api_enable_cors_support,
        saved_model_tags=tags,
        allow_version_labels_for_unavailable_models=(
            FLAGS.allow_version_labels_for_unavailable_models),
        num_load_threads=FLAGS.num_load_threads,
        load_retry_interval_micros=FLAGS.load_retry_interval_micros)


def main(argv):
    del argv
    if FLAGS.version:
        print(version_text(), flush=True)
        return
    try:
        server = server_from_flags()
    except (ValueError, OSError) as error:
        sys.exit("slimserve-server: %s" % error)
    stopping = threading.Event()

    def on_signal(signum, frame):
        del frame
        logging.info("signal %d: shutting down gracefully", signum)
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.start()
    except errors.ServingError as error:  # e.g. a version label that names no version
        server.stop()
        sys.exit("slimserve-server: %s" % error.message)
    print("slimserve-server: gRPC %s:%d%s REST %s" % (
        server.bind_address, server.port,
        " unix:%s" % server.grpc_socket_path if server.grpc_socket_path else "",
        server.rest_api_port or "off"), flush=True)
    stopping.wait()
    if server.stop():
        logging.info("stopped")
    else:
        logging.warning("stopped; some requests were still running after the grace period")


def run():
    logs.run(main)


if __name__ == "__main__":
    run()
