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

from slimserve.serving import options as options_lib
from slimserve.serving.api import grpc_service
from slimserve.serving.api import http_server
from slimserve.serving.api import tls
from slimserve.serving.config import files
from slimserve.serving.config import model_config
from slimserve.serving.config import platform
from slimserve.serving.config import session
from slimserve.serving.core import batching as batching_lib
from slimserve.serving.core import errors
from slimserve.serving.core import inference
from slimserve.serving.core import manager as manager_lib
from slimserve.serving.observability import metrics as metrics_lib
from slimserve.serving.observability import request_log

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
    """(initial [ServedModel], the ModelServerConfig read from --model_config_file or None)."""
    if isinstance(options.model_server_config, (list, tuple)):
        return list(options.model_server_config), None  # [ServedModel], in process
    if options.model_server_config is not None:
        return model_config.served_models_from_proto(options.model_server_config,
                                                     "model_server_config"), None
    if options.model_config_file:
        config = files.read_model_server_config(options.model_config_file)
        return model_config.served_models_from_proto(
            config, "--model_config_file %s" % options.model_config_file), config
    return [model_config.ServedModel(options.model_name, options.model_base_path)], None


def model_runtime_lines(manager):
    """Prometheus lines naming what every loaded version computes in: the precision
    (--mixed_precision) and whether XLA compiles it (--xla_cpu_compilation_enabled), as
    an info-style gauge a dashboard can join on model_name and model_version."""
    lines = ["# TYPE %s gauge" % MODEL_RUNTIME]
    for name in manager.model_names:
        for number in manager.available_versions(name):
            try:
                servable = manager.acquire(name, number)
            except errors.ServingError:
                continue  # unloaded since it was listed
            try:
                lines.append('%s{model_name="%s",model_version="%d",precision="%s",'
                             'xla_cpu_jit="%s"} 1' % (
                                 MODEL_RUNTIME, name.replace("\\", "\\\\").replace('"', '\\"'),
                                 number, servable.precision,
                                 "true" if servable.xla_jit else "false"))
            finally:
                servable.release()
    return lines


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
        configs, self._config_loaded = _model_configs(options)
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
            saved_model_tags=settings.saved_model_tags,
            batching_for=(lambda path: batching_lib.parameters_for_version(
                path, batching, settings.per_model_batching)) if batching else None)
        self.batcher = (batching_lib.Batcher(batching, self.metrics.observe_batch,
                                             self.metrics.observe_queue_wait)
                        if batching else None)
        self.service = inference.InferenceService(
            self.manager, self.batcher, self.metrics, options.max_request_elements,
            options.max_broadcast_elements,
            method_name_check=options.enable_signature_method_name_check)
        self._sync_request_loggers(configs)
        self.metrics.add_collector(
            lambda: metrics_lib.request_log_lines(self.service.request_loggers))
        self.metrics.add_collector(lambda: model_runtime_lines(self.manager))
        self._stopping = threading.Event()
        self._config_thread = None
        self._reload_lock = threading.Lock()  # one model-set change at a time
        self.ssl_config = ssl_config
        grpc_options = dict([("grpc.max_receive_message_length", _MAX_MESSAGE),
                             ("grpc.max_send_message_length", _MAX_MESSAGE)])
        grpc_options.update(dict(channel_arguments))  # gRPC would honour the first duplicate
        self._grpc = grpc.server(
            futures.ThreadPoolExecutor(max_workers=options.grpc_max_threads),
            options=list(grpc_options.items()))
        grpc_service.add_to_server(self._grpc, self.service, self.reload_config)
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
            self.port = self._add_port("%s:%d" % (options.bind_address, max(options.port, 0)),
                                       credentials)
        self.grpc_socket_path = options.grpc_socket_path or None
        if self.grpc_socket_path:
            self._add_port("unix:" + os.path.abspath(self.grpc_socket_path), credentials)
        self._rest = None
        self.rest_api_port = 0
        if options.rest_api_port:
            self._rest = http_server.make_server(
                self.service, options.bind_address, max(options.rest_api_port, 0),
                self.metrics, monitoring, num_threads=options.rest_api_num_threads,
                timeout_ms=options.rest_api_timeout_in_ms,
                max_body_bytes=options.rest_max_body_bytes,
                connection_limit=options.rest_connection_limit,
                idle_timeout_seconds=options.rest_idle_timeout_seconds,
                read_timeout_seconds=options.rest_read_timeout_seconds,
                enable_cors=options.rest_api_enable_cors_support,
                ssl_context=tls.server_ssl_context(ssl_config) if ssl_config else None)
            self.rest_api_port = self._rest.port

    def _sync_request_loggers(self, configs):
        """One RequestLogger per model whose config has a logging_config (TF Serving's
        grammar, written by serving/observability/request_log.py); loggers of removed or changed
        models are closed (their files published)."""
        wanted = {c.name: c.logging_config for c in configs
                  if getattr(c, "logging_config", None) is not None}
        current = self.service.request_loggers
        for name in list(current):
            logger = current[name]
            config = wanted.get(name)
            if config is None or (config.log_collector_config.filename_prefix,
                                  config.sampling_config.sampling_rate) != (
                                      logger.filename_prefix, logger.sampling_rate):
                del current[name]
                logger.close()
        for name, config in wanted.items():
            if name not in current:
                try:
                    logger = request_log.RequestLogger.from_config(config)
                except ValueError as error:
                    raise ValueError("model %s: %s" % (name, error)) from None
                if logger is not None:
                    current[name] = logger

    def _add_port(self, address, credentials):
        bound = (self._grpc.add_secure_port(address, credentials) if credentials
                 else self._grpc.add_insecure_port(address))
        if bound == 0:
            raise OSError("cannot bind gRPC to %s" % address)
        return bound

    def reload_config(self, config_proto):
        """HandleReloadConfigRequest / config-file polling: serve exactly these models,
        loading new ones before unloading old ones (ModelManager.reload)."""
        try:
            configs = model_config.served_models_from_proto(config_proto,
                                                           "ReloadConfigRequest")
        except ValueError as error:
            raise errors.invalid("%s", error) from None
        with self._reload_lock:
            self.manager.reload(configs)
            try:
                self._sync_request_loggers(configs)
            except ValueError as error:
                raise errors.invalid("%s", error) from None

    def _poll_config_file(self):
        path = self.options.model_config_file
        while not self._stopping.wait(self.options.model_config_file_poll_wait_seconds):
            try:
                config = files.read_model_server_config(path)
                if config == self._config_loaded:
                    continue
                logging.info("--model_config_file %s changed: reloading", path)
                self.reload_config(config)
                self._config_loaded = config
            except (ValueError, errors.ServingError) as error:
                logging.error("Failed to reload --model_config_file: %s", error)

    def start(self):
        """Loads the initial versions, then starts polling and both front ends."""
        self.manager.poll()
        for name in self.manager.model_names:
            if not self.manager.available_versions(name):
                logging.warning("model %s has no loadable version yet; still polling", name)
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
