"""tensorflow_model_server's command line as one object, as TF Serving's Server::Options.

Every field of `ServerOptions` is named, typed, defaulted and bounded exactly as the flag
of `slimserve-server` it stands for, and carries that flag's help text
(slimserve/fields.py): slimserve/cli/server.py generates its flags from these fields, so
the command line and the library cannot drift. A flag that feeds a component's option
object (the manager's, the REST server's, the request loggers', TFLite's) takes its
default and bound from that object's field, so each is written once; serving/limits.py
holds the ceilings. Fields marked `slimserve only` are flags TF Serving lacks. The last
group holds the parsed form of a `*_file` flag, for in-process use (tests, the demo,
benchmarks); give one or the other.

    options = ServerOptions(model_name="resnet", model_base_path="/models/resnet",
                            port=PICK_FREE_PORT, rest_api_port=PICK_FREE_PORT)
    server = ModelServer(options).start()     # server.port, server.rest_api_port

`options.check()` (ModelServer calls it) refuses, as a UserError naming the flags, a
value out of its bound and the combinations tensorflow_model_server refuses.
"""
import dataclasses
import os
import typing

from slimserve import errors
from slimserve import fields
from slimserve.serving import limits
from slimserve.serving.api import http_server
from slimserve.serving.core import manager
from slimserve.serving.core import tensors
from slimserve.serving.core import openvino_servable
from slimserve.serving.core import tflite_servable
from slimserve.serving.observability import drift
from slimserve.serving.observability import drift_monitor
from slimserve.serving.observability import request_log

# A port of -1 binds any free port; the server reports the one it got (ModelServer.port,
# .rest_api_port). 0 keeps TF Serving's meaning: that API is off.
PICK_FREE_PORT = -1
CPUS = limits.CPUS


def _flag(default, help_text, bound=None, slimserve_only=False, no_effect=False, kind=None,
          choices=None):
    """A field that is also a command-line flag; `slimserve only` ones say so in --help."""
    return fields.option(default, help_text + (" (slimserve only)" if slimserve_only else ""),
                         bound, kind=kind, slimserve_only=slimserve_only,
                         no_effect=no_effect, choices=choices)


def _of(component, name, help_text, **metadata):
    """A flag standing for a component's option field: its default and bound are that
    field's (written once, in the component)."""
    field = component.__dataclass_fields__[name]
    return _flag(field.default, help_text, field.metadata.get("bound"),
                 kind=field.metadata["kind"], choices=field.metadata.get("choices"),
                 **metadata)


def _parsed(help_text):
    """An in-process-only field: the parsed message of a *_file flag."""
    return dataclasses.field(default=None, metadata={"help": help_text, "in_process": True})


@dataclasses.dataclass
class ServerOptions:
    """The server's configuration; see the module docstring."""
    # --- gRPC -----------------------------------------------------------------------------
    port: int = _flag(8500, "gRPC port (0: no TCP gRPC, which then needs --grpc_socket_path, "
                      "as in TF Serving).", limits.PORT)
    grpc_socket_path: str = _flag("", "If non-empty, also serve gRPC on this UNIX socket "
                                  "(relative or absolute).")
    grpc_channel_arguments: str = _flag("", "Comma-separated key=value gRPC server arguments, "
                                        "e.g. grpc.max_receive_message_length=4194304.")
    grpc_max_threads: int = _flag(32, "Threads serving gRPC requests (TF Serving: 4 x CPUs).",
                                  limits.THREADS)
    enable_grpc_healthcheck_service: bool = _flag(
        False, "Serve the standard grpc.health.v1 Health service.")
    ssl_config_file: str = _flag("", "Text-format SSLConfig (server_key, server_cert, "
                                 "custom_ca, client_verify: PEM texts inline): TLS on gRPC "
                                 "and on REST.")
    use_alts_credentials: bool = _flag(False, "Google ALTS credentials (no effect here).",
                                       no_effect=True)
    bind_address: str = _flag("127.0.0.1", "Address both APIs bind (TF Serving binds "
                              "0.0.0.0).", slimserve_only=True)
    # --- REST -----------------------------------------------------------------------------
    rest_api_port: int = _flag(8501, "REST port (0: no REST API; TF Serving's default is 0). "
                               "Must differ from --port.", limits.PORT)
    rest_api_num_threads: int = _of(http_server.RestOptions, "num_threads",
                                    "Threads processing REST requests (default 4 x CPUs, "
                                    "as TF Serving).")
    rest_api_timeout_in_ms: int = _of(http_server.RestOptions, "timeout_ms",
                                      "Timeout for REST API calls.")
    rest_api_enable_cors_support: bool = _of(http_server.RestOptions, "enable_cors",
                                             "Send CORS headers in REST responses.")
    rest_max_body_bytes: int = _of(http_server.RestOptions, "max_body_bytes",
                                   "Larger REST bodies get 413 before they are read.",
                                   slimserve_only=True)
    rest_connection_limit: int = _of(
        http_server.RestOptions, "connection_limit", "Open REST connections; at it the "
        "longest-idle are closed, and while a client waits the slowest partial requests.",
        slimserve_only=True)
    rest_idle_timeout_seconds: int = _of(http_server.RestOptions, "idle_timeout_seconds",
                                         "Close a REST connection idle this long.",
                                         slimserve_only=True)
    rest_read_timeout_seconds: int = _of(
        http_server.RestOptions, "read_timeout_seconds", "Drop (408) a REST request not "
        "fully received this long after its first byte.", slimserve_only=True)
    rest_header_timeout_seconds: int = _of(
        http_server.RestOptions, "header_timeout_seconds", "Drop (408) a REST request "
        "whose headers are not received this long after its first byte.",
        slimserve_only=True)
    status_page: bool = _of(
        http_server.RestOptions, "status_page", "Serve the HTML status page at / and "
        "/status on the REST port: every model's versions and load errors and the last "
        "minute's traffic (it tells any REST client what the server serves). Off: those "
        "paths are 404, as in TF Serving.", slimserve_only=True)
    rest_min_request_bytes_per_second: int = _of(
        http_server.RestOptions, "min_request_bytes_per_second", "Drop (408) a REST "
        "request that, --rest_header_timeout_seconds after its first byte, has arrived "
        "slower than this on average (trickling clients). 0: no minimum.",
        slimserve_only=True)
    # --- models ---------------------------------------------------------------------------
    model_name: str = _flag("resnet", "Name of the model at --model_base_path (TF Serving's "
                            "default: 'default').")
    model_base_path: str = _flag("", "Folder of integer version sub-folders.")
    model_config_file: str = _flag("", "Text-format ModelServerConfig (several models).")
    model_config_file_poll_wait_seconds: int = _flag(
        0, "Seconds between re-reads of --model_config_file; a changed file is applied (new "
        "models load before old ones unload). 0: read once.", limits.SECONDS_OR_ZERO)
    file_system_poll_wait_seconds: float = _flag(
        1, "Seconds between scans of the base paths for new versions (0: once).",
        limits.SECONDS_OR_ZERO, kind=float)
    allow_version_labels_for_unavailable_models: bool = _of(
        manager.ManagerOptions, "allow_version_labels_for_unavailable_models",
        "Allow assigning a version label to a version that is not yet available.")
    error_hints: bool = _of(
        manager.ManagerOptions, "error_hints", "Add hints to NOT_FOUND answers: the served "
        "model names for a model this server does not serve (which tells any client what "
        "it serves), and why a served model's base path holds no version (answered "
        "UNAVAILABLE, so clients retry). Off: TF Serving's exact statuses and messages, "
        "the hints in the server log only.", slimserve_only=True)
    freeze_loaded_objects: bool = _flag(
        True, "After each model load, freeze the Python objects it left (gc.freeze), so "
        "the collector's full passes skip the served graphs instead of stopping every "
        "thread for 150-175 ms about every 17 s under load; after each unload, thaw, "
        "collect and freeze again. False: Python's default collection.",
        slimserve_only=True)
    saved_model_tags: str = _flag("", "Comma-separated tags of the MetaGraphDef to load "
                                  "(empty: serve).")
    num_load_threads: int = _of(manager.ManagerOptions, "num_load_threads",
                                "Threads loading models; >1 loads different models in "
                                "parallel (0: serially).")
    num_unload_threads: int = _of(manager.ManagerOptions, "num_unload_threads",
                                  "Threads in the pool that unloads servables (retires a "
                                  "version, closes its session); 0: unloads run in the "
                                  "polling thread, one after another.")
    max_num_load_retries: int = _of(manager.ManagerOptions, "max_num_load_retries",
                                    "Retries after the first failed load of a version "
                                    "before giving up on it while it stays aspired (0: "
                                    "one attempt).")
    retry_failed_versions_on_change: bool = _of(
        manager.ManagerOptions, "retry_failed_versions_on_change", "Load a failed version "
        "again whenever its files change (names, sizes, mtimes), e.g. once a version copied "
        "in place non-atomically is complete. Off: as TF Serving, a version whose load "
        "failed is not loaded again while it stays aspired.", slimserve_only=True)
    load_retry_interval_micros: int = _of(
        manager.ManagerOptions, "load_retry_interval_micros", "Interval in microseconds "
        "between load retries of a failed version (negative: no wait). Default: 1 minute, "
        "as TF Serving.")
    flush_filesystem_caches: bool = _flag(True, "Flush file-system caches after loads (no "
                                          "effect here).", no_effect=True)
    enable_model_warmup: bool = _of(manager.ManagerOptions, "warmup",
                                    "Replay assets.extra/tf_serving_warmup_requests before "
                                    "serving a version.")
    num_request_iterations_for_warmup: int = _flag(
        0, "Times each warmup request is replayed in a row; used only if > 0 (else once), "
        "as TF Serving.", fields.Bound(-2 ** 31, limits.MAX_WARMUP_ITERATIONS))
    enable_signature_method_name_check: bool = _flag(
        False, "Require Classify / Regress signatures to have the classify / regress "
        "method_name (and Predict one of predict, classify, regress).")
    remove_unused_fields_from_bundle_metagraph: bool = _flag(
        True, "Keep only the signature_def of a loaded MetaGraphDef. Always so here: a loaded "
        "version holds its graph and signatures, never the MetaGraphDef proto (false has "
        "no effect).", no_effect=True)
    # --- batching -------------------------------------------------------------------------
    enable_batching: bool = _flag(False, "Batch concurrent requests server-side.")
    batching_parameters_file: str = _flag("", "Text-format BatchingParameters "
                                          "(max_batch_size { value: 8 } ...).")
    enable_per_model_batching_parameters: bool = _flag(
        False, "With --enable_batching, each version is batched by its own "
        "assets.extra/batching_params.pbtxt (versions without one are not batched); only "
        "num_batch_threads comes from --batching_parameters_file (the batch threads are "
        "shared).")
    # --- TensorFlow session ---------------------------------------------------------------
    tensorflow_session_parallelism: int = _flag(
        0, "Threads for both of TF's pools, unless the two below are given.",
        limits.THREADS_OR_ZERO)
    tensorflow_intra_op_parallelism: int = _flag(0, "Threads inside ops (0: TF's).",
                                                 limits.THREADS_OR_ZERO)
    tensorflow_inter_op_parallelism: int = _flag(0, "Concurrent ops (0: TF's).",
                                                 limits.THREADS_OR_ZERO)
    tensorflow_session_config_file: str = _flag(
        "", "Text-format tensorflow.ConfigProto for the model sessions.")
    per_process_gpu_memory_fraction: float = _flag(
        0.0, "Fraction of GPU memory each process takes (0: TF's default).",
        fields.PROBABILITY)
    mixed_precision: str = _flag("", "bfloat16: oneDNN's auto-mixed-precision rewrite on "
                                 "every model session (convolutions and matmuls in bfloat16; "
                                 "fast on CPUs with AVX512_BF16/AMX, emulated and slow "
                                 "elsewhere). Empty: float32.")
    xla_cpu_compilation_enabled: bool = _flag(False, "XLA:CPU JIT: auto-clusters every model "
                                              "session's graph and compiles it with XLA.")
    max_request_elements: int = _flag(
        tensors.DEFAULT_MAX_REQUEST_ELEMENTS, "Elements one Predict request may carry, summed over "
        "its inputs (gRPC and REST); more is INVALID_ARGUMENT. Default 2^26: 256 MiB of "
        "float32.", limits.ELEMENTS, slimserve_only=True)
    max_broadcast_elements: int = _flag(
        tensors.DEFAULT_MAX_BROADCAST_ELEMENTS, "Largest tensor a TensorProto may fill from fewer "
        "values than its shape has elements (TF's rule: last value repeated, zeros when "
        "none).", limits.ELEMENTS_OR_ZERO, slimserve_only=True)
    max_request_bytes_in_flight: int = _flag(
        0, "Bytes of requests (Predict, Classify, Regress, MultiInference; gRPC and REST, "
        "by wire size) the server works on at once, each charged 4x for the copies it holds "
        "while it runs; past it a request is answered RESOURCE_EXHAUSTED at once. 0: a "
        "quarter of the memory the process may still take when it starts (its address-"
        "space and cgroup limits, the machine's available memory).", limits.BYTES_OR_ZERO,
        slimserve_only=True)
    shutdown_grace_seconds: int = _flag(
        5, "On SIGTERM or SIGINT, how long requests in flight (queued, running, or still "
        "being received) may take to finish before their connections are closed; the "
        "process ends at most 20 s after that. Keep it below the pod's "
        "terminationGracePeriodSeconds.", limits.SECONDS_OR_ZERO, slimserve_only=True)
    # --- request logging (a model's logging_config) ---------------------------------------
    request_log_dir: str = _flag(
        "", "Directory every request log is written under: a logging_config's "
        "filename_prefix (from --model_config_file or a ReloadConfigRequest) is relative to "
        "it, and one outside it is refused. Empty: prefixes from --model_config_file are "
        "used as given, and a ReloadConfigRequest may only name those.", slimserve_only=True)
    request_log_queue_bytes: int = _of(
        request_log.RequestLogOptions, "queue_bytes", "Bytes of sampled requests (and "
        "their responses) waiting per model to be written to its request log; past it "
        "records are dropped and counted in "
        "request_log_count{status_code=\"RESOURCE_EXHAUSTED\"}.", slimserve_only=True)
    # --- drift of the logged traffic (observability/drift_monitor.py) ----------------------
    drift_check_interval_seconds: float = _of(
        drift_monitor.MonitorOptions, "check_interval_seconds", "Seconds between two checks "
        "of each request-logged model version's newest traffic against the reference its "
        "export recorded (shown on the status page and as :slimserve:serving:drift* "
        "gauges); 0: only on demand (SIGUSR2).", slimserve_only=True)
    drift_max_images: int = _of(
        drift_monitor.MonitorOptions, "max_images", "Newest logged images of a version a "
        "drift check reads at most (each runs through the version's embeddings "
        "signature, off the request path).", slimserve_only=True)
    drift_window_size: int = _of(
        drift.DriftOptions, "window_size", "Logged images per drift window.",
        slimserve_only=True)
    drift_alpha: float = _of(
        drift.DriftOptions, "alpha", "Chance that a window of traffic like the reference's "
        "is flagged as drift.", slimserve_only=True)
    # --- other runtimes and services ------------------------------------------------------
    monitoring_config_file: str = _flag("", "Text-format MonitoringConfig: prometheus_config "
                                        "{ enable: true path: ... }.")
    platform_config_file: str = _flag(
        "", "Text-format PlatformConfigMap whose \"tensorflow\" platform packs a "
        "SavedModelBundleSourceAdapterConfig: its SessionBundleConfig (session config, "
        "batching parameters, warmup options, tags, mixed precision) replaces the flags "
        "that would compose it, as in TF Serving.")
    prefer_tflite_model: bool = _flag(
        False, "Serve a version from the model.tflite in its directory (TensorFlow Lite, "
        "tf.lite.Interpreter) instead of its saved_model.pb; versions without one still "
        "load their SavedModel.")
    num_tflite_pools: int = _of(
        tflite_servable.TfLiteOptions, "num_pools", "TFLite interpreters per model.tflite, "
        "each on one thread (default: the CPUs, as TF Serving; 0 means 1).")
    num_tflite_interpreters_per_pool: int = _of(
        tflite_servable.TfLiteOptions, "num_interpreters_per_pool", "Above 1, TF Serving's "
        "TFLite batch scheduler: a request is split into pieces of at most 500/N rows and "
        "concurrent small requests are merged, run in parallel over the "
        "--num_tflite_pools interpreters.")
    prefer_openvino_model: bool = _flag(
        False, "Run every model's network on OpenVINO (its version's openvino/model.xml, "
        "converted at load when absent); decoding and tf.Example parsing stay in "
        "TensorFlow. Per model: model_platform \"openvino\" in --model_config_file. A "
        "version OpenVINO cannot compile is served by TensorFlow (one log line).",
        slimserve_only=True)
    openvino_precision: str = _of(
        openvino_servable.OpenVinoOptions, "precision", "What the OpenVINO runtime "
        "computes in: fp32; bf16 where the CPU has AVX512_BF16 or AMX (else fp32, said in "
        "the log); int8 from the version's openvino/model_int8.xml (slimserve-export "
        "--openvino_int8 writes it when it passes the accuracy guard; else fp32).",
        slimserve_only=True)
    openvino_num_streams: int = _of(
        openvino_servable.OpenVinoOptions, "num_streams", "OpenVINO CPU streams per "
        "version (requests run at once, the cores split among them); 0: its latency hint, "
        "one stream over every core.", slimserve_only=True)
    enable_profiler: bool = _flag(
        True, "Serve tensorflow.ProfilerService on the gRPC port: TensorBoard's 'capture "
        "profile' and tf.profiler.experimental.client.trace collect a trace of the "
        "server's model runs.")
    profiler_max_duration_ms: int = _flag(
        60000, "Longest profile (and start delay) a ProfilerService client may ask for; "
        "longer is INVALID_ARGUMENT.", limits.MILLISECONDS, slimserve_only=True)
    profiler_log_dir: str = _flag(
        "", "Local directory the ProfilerService may write traces under: a client's "
        "repository_root must resolve inside it (a relative one is taken under it; '..' "
        "or a path or symlink leading out is PERMISSION_DENIED). Empty: nothing is "
        "written, the trace is returned in the ProfileResponse.", slimserve_only=True)
    thread_pool_factory_config_file: str = _flag(
        "", "Text-format ThreadPoolFactoryConfig whose Any holds a "
        "tensorflow.ThreadPoolOptionProto (num_threads, global_name): the inter-op thread "
        "pool every model run uses (TF Serving's build registers no factory).")
    skip_initialize_tpu: bool = _flag(False, "Skip TPU initialisation (no effect here).",
                                      no_effect=True)
    # --- in process only: the parsed form of a *_file flag (give one or the other) -------
    model_server_config: typing.Any = _parsed(
        "A ModelServerConfig message (or a list of config.model_config.ServedModel) instead "
        "of --model_config_file / --model_base_path.")
    batching_parameters: typing.Any = _parsed(
        "core.batching.BatchingParameters instead of --batching_parameters_file (implies "
        "--enable_batching).")
    monitoring_config: typing.Any = _parsed("A MonitoringConfig message instead of "
                                            "--monitoring_config_file.")
    ssl_config: typing.Any = _parsed("An SSLConfig message instead of --ssl_config_file.")
    session_config: typing.Any = _parsed("A tensorflow.ConfigProto instead of "
                                         "--tensorflow_session_config_file.")
    platform_config: typing.Any = _parsed("A PlatformConfigMap (config/messages.py) "
                                          "instead of --platform_config_file.")

    def replace(self, **changes):
        """A copy with `changes` (field names); ModelServer checks it."""
        return dataclasses.replace(self, **changes)

    def check(self):
        """Returns self once every value is within its bound and no combination is one
        tensorflow_model_server refuses; else a UserError naming the flags."""
        fields.check(self)
        given = [bool(self.model_base_path), bool(self.model_config_file),
                 self.model_server_config is not None]
        if sum(given) != 1:
            raise errors.UserError("give exactly one of --model_base_path or "
                                   "--model_config_file")
        if self.use_alts_credentials and (self.ssl_config_file or self.ssl_config):
            raise errors.UserError("Either --use_alts_credentials must be false or "
                                   "--ssl_config_file must be empty.")
        if self.port == 0 and not self.grpc_socket_path:
            raise errors.UserError("At least one of --port or --grpc_socket_path must be "
                                   "set.")
        if self.rest_api_port > 0 and self.rest_api_port == self.port:
            raise errors.UserError("--rest_api_port must differ from --port (both %d)"
                                   % self.port)
        if self.profiler_log_dir and not os.path.isdir(self.profiler_log_dir):
            raise errors.UserError("--profiler_log_dir %s: not a directory (create it; "
                                   "traces are written only inside it)"
                                   % self.profiler_log_dir)
        if self.prefer_openvino_model and self.prefer_tflite_model:
            raise errors.UserError("--prefer_openvino_model and --prefer_tflite_model: "
                                   "give one (each names the runtime of every model)")
        if self.batching_parameters_file and not self.enable_batching and \
                self.batching_parameters is None:
            raise errors.UserError("--batching_parameters_file needs --enable_batching")
        return self


def flag_fields():
    """The fields that are command-line flags, in definition order."""
    return [field for _, field in fields.walk(ServerOptions)]


def changed_without_effect(options):
    """[(flag, value)] of flags TF Serving honours that this server accepts without effect,
    set to something other than their default."""
    return [(f.name, getattr(options, f.name)) for f in flag_fields()
            if f.metadata["no_effect"] and getattr(options, f.name) != f.default]
