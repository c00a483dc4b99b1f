"""The embedded TF-Serving-compatible model server: wiring only.

`ModelServer(options)` builds what a `ServerOptions` (serving/options.py; its fields are
tensorflow_model_server's flag names) asks for, as TF Serving's Server::BuildAndStart:
every config file is read once (serving/config/files.py), the model manager, batcher and
inference service are made, and gRPC (and REST, and the Unix socket) are bound; `start()`
loads the first versions and starts serving. slimserve-server (slimserve/cli/server.py) is
this plus flags; tests, the demo and benchmarks run it in process.
"""
import logging
import os
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc
from prometheus_client.core import GaugeMetricFamily

from slimserve.serving import options as options_lib
from slimserve.serving.api import addresses
from slimserve.serving.api import grpc_service
from slimserve.serving.api import http_server
from slimserve.serving.api import profiler_service
from slimserve.serving.api import tls
from slimserve.serving.config import files
from slimserve.serving.config import model_config
from slimserve.serving.config import platform
from slimserve.serving.config import session
from slimserve.serving.core import batching as batching_lib
from slimserve.serving.core import errors
from slimserve.serving.core import inference
from slimserve.serving.core import manager as manager_lib
from slimserve.serving.core import tflite_servable
from slimserve.serving.observability import metrics as metrics_lib
from slimserve.serving.observability import request_log
from slimserve.serving.observability import request_window

PICK_FREE_PORT = options_lib.PICK_FREE_PORT  # bind any free port; ModelServer reports it
# TF Serving lets gRPC accept messages of any size; so do we unless told otherwise.
_MAX_MESSAGE = 2 ** 31 - 1
# The services TF Serving registers with the standard health service, plus the
# full names grpc_health_probe users pass, plus "" (the whole server).
# The metric naming each loaded version's precision and XLA setting (slimserve's own:
# TF Serving only logs "Running inference with bfloat16 auto mixed precision").
MODEL_RUNTIME = ":slimserve:serving:model_runtime"
HEALTH_SERVICES = ("", "ModelService", "PredictionService", "tensorflow.serving.ModelService",
                   "tensorflow.serving.PredictionService")


def parse_channel_arguments(text):
    """`a=1,b=x` -> [("a", 1), ("b", "x")] (integers where they parse)."""
    options = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError("--grpc_channel_arguments: expected key=value, got %r" % item)
        options.append((key, int(value) if value.lstrip("-").isdigit() else value))
    return options


def monitoring_path(config, where="--monitoring_config_file"):
    """A MonitoringConfig -> the Prometheus path, or None when not enabled (an empty path
    means TF Serving's default, /monitoring/prometheus/metrics)."""
    prometheus = config.prometheus_config
    if not prometheus.enable:
        return None
    if prometheus.path and not prometheus.path.startswith("/"):
        raise ValueError("%s: prometheus_config.path must start with '/', got %r"
                         % (where, prometheus.path))
    return prometheus.path or metrics_lib.PATH


def read_monitoring_path(path, flag="monitoring_config_file"):
    """The Prometheus path a --monitoring_config_file enables, or None."""
    return monitoring_path(files.read_monitoring_config(path, flag), "--%s %s" % (flag, path))


def ready_line(server):
    """What slimserve-server prints on stdout once it serves: the addresses it bound (so a
    parent that passed --port=-1 / --rest_api_port=-1 learns them; parse_ready_line)."""
    grpc_addresses = ["%s:%d" % (server.bind_address, server.port)] if server.port else []
    if server.grpc_socket_path:
        grpc_addresses.append("unix:%s" % server.grpc_socket_path)
    return "slimserve-server: gRPC %s REST %s" % (" ".join(grpc_addresses),
                                                   server.rest_api_port or "off")


def parse_ready_line(line):
    """ready_line's text -> (gRPC port or 0, REST port or 0); ValueError if it is not one."""
    words = line.split()
    if words[:2] != ["slimserve-server:", "gRPC"] or "REST" not in words:
        raise ValueError("not slimserve-server's ready line: %r" % line)
    grpc_port = next((int(w.rsplit(":", 1)[1]) for w in words[2:words.index("REST")]
                      if not w.startswith("unix:")), 0)
    rest = words[words.index("REST") + 1]
    return grpc_port, 0 if rest == "off" else int(rest)


def _check(options):
    """Refuses combinations tensorflow_model_server refuses, naming the flags."""
    given = [bool(options.model_base_path), bool(options.model_config_file),
             options.model_server_config is not None]
    if sum(given) != 1:
        raise ValueError("give exactly one of --model_base_path or --model_config_file")
    if options.use_alts_credentials and (options.ssl_config_file or options.ssl_config):
        raise ValueError("Either --use_alts_credentials must be false or --ssl_config_file "
                         "must be empty.")
    if options.port == 0 and not options.grpc_socket_path:
        raise ValueError("At least one of --port or --grpc_socket_path must be set.")
    if options.rest_api_port > 0 and options.rest_api_port == options.port:
        raise ValueError("--rest_api_port must differ from --port (both %d)" % options.port)
    if (options.batching_parameters_file or options.batching_parameters) and \
            not options.enable_batching and options.batching_parameters is None:
        raise ValueError("--batching_parameters_file needs --enable_batching")


def _model_configs(options):
    """(initial [ServedModel], the ModelServerConfig read from --model_config_file or None,
    what to name as their source in errors)."""
    if isinstance(options.model_server_config, (list, tuple)):
        return list(options.model_server_config), None, "model_server_config"  # in process
    if options.model_server_config is not None:
        return model_config.served_models_from_proto(options.model_server_config,
                                                     "model_server_config"), None, \
            "model_server_config"
    if options.model_config_file:
        where = "--model_config_file %s" % options.model_config_file
        config = files.read_model_server_config(options.model_config_file)
        return model_config.served_models_from_proto(config, where), config, where
    return [model_config.ServedModel(options.model_name, options.model_base_path)], None, \
        "--model_base_path"


def _request_log_dir(options):
    """--request_log_dir made absolute (symlinks resolved) and created, or None."""
    if not options.request_log_dir:
        return None
    path = os.path.realpath(options.request_log_dir)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise ValueError("--request_log_dir %s: cannot create it: %s"
                         % (options.request_log_dir, error.strerror or error)) from None
    return path


def model_runtime_family(manager):
    """A gauge naming what every loaded version computes in: the precision
    (--mixed_precision) and whether XLA compiles it (--xla_cpu_compilation_enabled), as
    an info-style gauge a dashboard can join on model_name and model_version."""
    family = GaugeMetricFamily(
        MODEL_RUNTIME, "What each loaded version computes in (1 per version).",
        labels=["model_name", "model_version", "precision", "xla_cpu_jit"])
    for name in manager.model_names:
        for number in manager.available_versions(name):
            try:
                servable = manager.acquire(name, number)
            except errors.ServingError:
                continue  # unloaded since it was listed
            try:
                family.add_metric([name, str(number), servable.precision,
                                   "true" if servable.xla_jit else "false"], 1)
            finally:
                servable.release()
    return family


def _ssl_config(options):
    if options.ssl_config is not None:
        return tls.check_ssl_config(options.ssl_config, "ssl_config")
    if options.ssl_config_file:
        return tls.check_ssl_config(files.read_ssl_config(options.ssl_config_file),
                                    "--ssl_config_file %s" % options.ssl_config_file)
    return None


def _monitoring_path(options):
    if options.monitoring_config is not None:
        return monitoring_path(options.monitoring_config, "monitoring_config")
    if options.monitoring_config_file:
        return read_monitoring_path(options.monitoring_config_file)
    return None


def _check_free(host, port, flag, api):
    """OSError naming the flag when host:port cannot be bound (in use, say)."""
    reason = addresses.tcp_bind_error(host, port) if port > 0 else None
    if reason:
        raise OSError("%s %d: cannot bind %s to %s:%d: %s" % (flag, port, api, host, port,
                                                              reason))


class ModelServer:
    """gRPC + REST front ends over one ModelManager, configured by one ServerOptions.

    After construction the ports are bound: `port` and `rest_api_port` are the ones in use
    (0 when that API is off; PICK_FREE_PORT in the options becomes a real port here)."""

    def __init__(self, options=None, **changes):
        """options: a ServerOptions; keyword changes are applied on top of it (or of the
        defaults), e.g. ModelServer(model_base_path=path, port=PICK_FREE_PORT)."""
        options = (options or options_lib.ServerOptions()).replace(**changes)
        _check(options)
        self.options = options
        configs, self._config_loaded, where = _model_configs(options)
        self._retired_log_counts = {}  # (model, status_code) -> n of loggers closed
        self._loggers_lock = threading.Lock()  # a logger retires and its counts move at once
        self._log_dir = _request_log_dir(options)
        # Request-log locations the operator's own config names: without --request_log_dir,
        # the only ones a ReloadConfigRequest may use (see _plan_request_logs).
        self._operator_prefixes = frozenset()
        log_plan = self._plan_request_logs(configs, where, from_operator=True)
        ssl_config = _ssl_config(options)
        monitoring = _monitoring_path(options)
        channel_arguments = parse_channel_arguments(options.grpc_channel_arguments)
        for name, value in options_lib.changed_without_effect(options):
            logging.warning("--%s=%s is accepted for TF Serving compatibility and has no "
                            "effect here", name, value)
        # SessionBundleConfig: --platform_config_file's, or composed from the flags
        settings = platform.bundle_settings(options)
        self.settings = settings
        batching = settings.batching
        self.metrics = metrics_lib.Metrics()
        self.manager = manager_lib.ModelManager(
            configs, settings.enable_model_warmup, session.session_config(options, settings),
            options.max_num_load_retries, options.load_retry_interval_micros,
            options.num_load_threads, options.allow_version_labels_for_unavailable_models,
            on_change=self.metrics.model_event, on_load=self.metrics.model_load,
            saved_model_tags=settings.saved_model_tags, tflite=tflite_servable.TfLiteOptions(
                options.num_tflite_pools, options.num_tflite_interpreters_per_pool)
            if options.prefer_tflite_model else None,
            num_unload_threads=options.num_unload_threads,
            warmup_iterations=settings.warmup_iterations,
            batching_for=(lambda path: batching_lib.parameters_for_version(
                path, batching, settings.per_model_batching)) if batching else None)
        self.batcher = (batching_lib.Batcher(batching, self.metrics.observe_batch,
                                             self.metrics.observe_queue_wait)
                        if batching else None)
        self.service = inference.InferenceService(
            self.manager, self.batcher, self.metrics, options.max_request_elements,
            options.max_broadcast_elements,
            method_name_check=options.enable_signature_method_name_check)
        # Requests are counted, and shown on the status page, under served model names only.
        self.metrics.set_served_models(c.name for c in configs)
        self.service.window = request_window.RequestWindow(label=self.metrics.model_label)
        self._apply_request_logs(log_plan)
        self._operator_prefixes = frozenset(prefix for prefix, _ in log_plan.values())
        self.metrics.add_collector(self._request_log_families)
        self.metrics.add_collector(lambda: [model_runtime_family(self.manager)])
        self._config_error = None  # the last failed edit of --model_config_file, logged once
        self._stopping = threading.Event()
        self._config_thread = None
        self._reload_lock = threading.Lock()  # one model-set change at a time
        self.ssl_config = ssl_config
        grpc_options = dict([("grpc.max_receive_message_length", _MAX_MESSAGE),
                             ("grpc.max_send_message_length", _MAX_MESSAGE),
                             # one server per port: a second one fails to bind (addresses.py)
                             ("grpc.so_reuseport", 0)])
        grpc_options.update(dict(channel_arguments))  # gRPC would honour the first duplicate
        self._grpc = grpc.server(
            futures.ThreadPoolExecutor(max_workers=options.grpc_max_threads),
            options=list(grpc_options.items()))
        grpc_service.add_to_server(self._grpc, self.service, self.reload_config)
        if options.enable_profiler:
            profiler_service.add_to_server(self._grpc, options.profiler_max_duration_ms)
            logging.info("Profiler service is enabled")
        self.health = None
        if options.enable_grpc_healthcheck_service:
            self.health = health.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._grpc)
            for name in HEALTH_SERVICES:
                self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        credentials = tls.grpc_credentials(ssl_config) if ssl_config else None
        self.bind_address = options.bind_address
        self.port = 0
        if options.port:
            self.port = self._add_port(options.bind_address, max(options.port, 0),
                                       credentials, "--port")
        self.grpc_socket_path = options.grpc_socket_path or None
        if self.grpc_socket_path:
            path, served = addresses.check_unix_socket_path(self.grpc_socket_path)
            if served:
                logging.warning(
                    "--grpc_socket_path %s: another server listens on it; taking it over as "
                    "TF Serving (gRPC) does: new connections come here, that server keeps "
                    "its open ones and its other ports", path)
            self._add_port(None, path, credentials, "--grpc_socket_path")
        self._rest = None
        self.rest_api_port = 0
        if options.rest_api_port:
            _check_free(options.bind_address, options.rest_api_port, "--rest_api_port", "REST")
            self._rest = http_server.make_server(
                self.service, options.bind_address, max(options.rest_api_port, 0),
                self.metrics, monitoring, num_threads=options.rest_api_num_threads,
                timeout_ms=options.rest_api_timeout_in_ms,
                max_body_bytes=options.rest_max_body_bytes,
                connection_limit=options.rest_connection_limit,
                idle_timeout_seconds=options.rest_idle_timeout_seconds,
                read_timeout_seconds=options.rest_read_timeout_seconds,
                header_timeout_seconds=options.rest_header_timeout_seconds,
                min_request_bytes_per_second=options.rest_min_request_bytes_per_second,
                enable_cors=options.rest_api_enable_cors_support,
                ssl_context=tls.server_ssl_context(ssl_config) if ssl_config else None)
            self.rest_api_port = self._rest.port

    def _plan_request_logs(self, configs, where, from_operator):
        """{model: (resolved filename_prefix, sampling_rate)} for the configs' logging_config
        (TF Serving's grammar, written by serving/observability/request_log.py), checked
        and with their directories made, before anything changes. Raises ValueError naming
        `where`, the model and the prefix.

        Where logs may go: with --request_log_dir, under it (request_log.resolve_prefix),
        whoever sent the config. Without it, the operator's config (the --model_config_file
        as read at start or polled, or the in-process config) may name any prefix, and a
        ReloadConfigRequest (from_operator False: a network client) only one of those."""
        plan = {}
        for config in configs:
            logging_config = getattr(config, "logging_config", None)
            if logging_config is None:
                continue
            collector = logging_config.log_collector_config
            if not collector.filename_prefix and not collector.type:
                continue
            try:
                prefix = request_log.resolve_prefix(collector.filename_prefix, self._log_dir)
                rate = logging_config.sampling_config.sampling_rate
                request_log.check_sampling_rate(rate)
                if not from_operator and self._log_dir is None and \
                        prefix not in self._operator_prefixes:
                    raise ValueError(
                        "filename_prefix %r is not a request log location this server's own "
                        "config names; a ReloadConfigRequest may choose where logs go only "
                        "under --request_log_dir" % collector.filename_prefix)
                try:
                    request_log.make_directory(prefix)
                except ValueError as error:
                    raise ValueError("filename_prefix %r: %s"
                                     % (collector.filename_prefix, error)) from None
            except ValueError as error:
                raise ValueError("%s: model %s: %s" % (where, config.name, error)) from None
            plan[config.name] = (prefix, rate)
        return plan

    def _apply_request_logs(self, plan):
        """One RequestLogger per model of `plan` (checked by _plan_request_logs); loggers of
        removed or changed models are closed (their files published)."""
        current = self.service.request_loggers
        for name in list(current):
            logger = current[name]
            if plan.get(name) != (logger.filename_prefix, logger.sampling_rate):
                logger.close()  # requests see it closed and stop sampling
                with self._loggers_lock:
                    del current[name]
                    for code, count in [("OK", logger.written)] + list(logger.drops.items()):
                        key = (name, code)
                        self._retired_log_counts[key] = self._retired_log_counts.get(key, 0) \
                            + count
        for name, (prefix, rate) in plan.items():
            if name not in current:
                current[name] = request_log.RequestLogger(
                    prefix, rate, queue_bytes=self.options.request_log_queue_bytes)

    def _request_log_families(self):
        with self._loggers_lock:
            return metrics_lib.request_log_families(self.service.request_loggers,
                                                    self._retired_log_counts)

    def flush_request_logs(self, timeout=None):
        """Publishes every model's open request log file now (SIGUSR1 to slimserve-server),
        so a canary can read the traffic without waiting for rotation. With a timeout,
        waits for the files and says whether all were published in time."""
        results = [logger.flush(timeout)
                   for logger in list(self.service.request_loggers.values())]
        return all(results) if timeout is not None else None

    def _add_port(self, host, port, credentials, flag):
        """Binds gRPC to host:port (host None: port is a Unix socket path); OSError naming
        the flag, and why when it can tell, if that fails."""
        if host is None:
            address = "unix:" + port
        else:
            _check_free(host, port, flag, "gRPC")
            address = "%s:%d" % (host, port)
        try:
            bound = (self._grpc.add_secure_port(address, credentials) if credentials
                     else self._grpc.add_insecure_port(address))
        except RuntimeError:  # grpcio >= 1.5x raises where older ones returned 0
            bound = 0
        if bound == 0:
            raise OSError("%s: cannot bind gRPC to %s" % (flag, address))
        return bound

    def reload_config(self, config_proto, where="ReloadConfigRequest", from_operator=False):
        """HandleReloadConfigRequest / config-file polling: serve exactly these models.

        All or nothing: the configs and their request-log locations are checked first
        (INVALID_ARGUMENT naming the model), then ModelManager.reload loads new models
        before it unloads old ones and changes nothing when one fails; only then are the
        request loggers swapped. Errors are ServingErrors whose messages name no server
        path."""
        try:
            configs = model_config.served_models_from_proto(config_proto, where)
        except ValueError as error:
            raise errors.invalid("%s", error) from None
        with self._reload_lock:
            try:
                plan = self._plan_request_logs(configs, where, from_operator)
            except ValueError as error:
                raise errors.invalid("%s", error) from None
            try:
                self.manager.reload(configs)
            except errors.ServingError:
                raise
            except Exception as error:  # pylint: disable=broad-except
                logging.exception("%s: reload failed", where)
                raise errors.ServingError(grpc.StatusCode.INTERNAL, "%s: reload failed: %s"
                                          % (where, error)) from None
            self.metrics.set_served_models(c.name for c in configs)
            self._apply_request_logs(plan)
            if from_operator:
                self._operator_prefixes = frozenset(prefix for prefix, _ in plan.values())

    def _poll_config_file(self):
        """Applies each edit of --model_config_file. Survives anything a bad edit does: the
        error is logged once per edit and the file is read again at the next poll."""
        path = self.options.model_config_file
        where = "--model_config_file %s" % path
        while not self._stopping.wait(self.options.model_config_file_poll_wait_seconds):
            config = None
            try:
                config = files.read_model_server_config(path)
                if config == self._config_loaded:
                    continue
                logging.info("%s changed: reloading", where)
                self.reload_config(config, where, from_operator=True)
                self._config_loaded = config
                self._config_error = None
            except (ValueError, errors.ServingError) as error:
                self._config_failed(config, getattr(error, "full_message", None) or error)
            except Exception as error:  # pylint: disable=broad-except  (never the poller)
                logging.exception("%s: applying the edit failed", where)
                self._config_failed(config, error)

    def _config_failed(self, config, error):
        key = (config.SerializeToString() if config is not None else None, str(error))
        if key != self._config_error:
            logging.error("Failed to reload --model_config_file: %s (serving the previous "
                          "config; the file is read again every %d s)", error,
                          self.options.model_config_file_poll_wait_seconds)
            self._config_error = key

    def start(self):
        """Loads the initial versions, then starts polling and both front ends."""
        self.manager.poll()
        interval = self.options.file_system_poll_wait_seconds
        for name in self.manager.model_names:
            if not self.manager.available_versions(name):  # the manager logged why
                logging.warning("model %s has no loadable version yet; %s", name,
                                "its base path is polled every %g s, so a fix is picked up "
                                "without a restart" % interval if interval > 0 else
                                "polling is off (--file_system_poll_wait_seconds=0): "
                                "restart after fixing it")
        self.manager.start_polling(self.options.file_system_poll_wait_seconds)
        if self.options.model_config_file and \
                self.options.model_config_file_poll_wait_seconds > 0:
            self._config_thread = threading.Thread(target=self._poll_config_file,
                                                   name="model-config-poller", daemon=True)
            self._config_thread.start()
        self._grpc.start()
        if self.health is not None:
            for name in HEALTH_SERVICES:
                self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self._rest is not None:
            self._rest.start()
        logging.info("gRPC on %s:%d%s, REST on %s", self.bind_address, self.port,
                     " and unix:%s" % self.grpc_socket_path if self.grpc_socket_path else "",
                     "%s:%d" % (self.bind_address, self.rest_api_port)
                     if self.rest_api_port else "off")
        return self

    def stop(self, grace=5.0):
        """Refuses new requests on both APIs at once, lets those in flight finish within
        `grace` seconds, and only then stops batching and closes the sessions (a session
        closed under a running request, or a process exiting under one, crashes).
        Returns True when every request in flight was answered."""
        deadline = time.monotonic() + grace
        self._stopping.set()
        if self.health is not None:
            self.health.enter_graceful_shutdown()
        grpc_done = self._grpc.stop(grace)  # refuses new RPCs now, drains in background
        clean = self._rest.stop(grace) if self._rest is not None else True
        clean = grpc_done.wait(max(0.0, deadline - time.monotonic())) and clean
        if self._config_thread is not None:
            self._config_thread.join(timeout=10)
        if self.batcher is not None:
            self.batcher.stop()
        for logger in self.service.request_loggers.values():
            logger.close()  # flushed and published, as on SIGTERM
        self.manager.stop()
        return clean
