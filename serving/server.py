"""Embedded TF-Serving-compatible model server: gRPC on 8500, REST on 8501.

The library half of `slimserve-server` (slimserve/cli/server.py holds the flags):
`ModelServer` runs in-process too (tests, the demo, benchmarks).
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
from tensorflow_serving.config import model_server_config_pb2

from slimserve.serving.core import batching as batching_lib
from slimserve.serving.config import messages as config_protos
from slimserve.serving.core import errors
from slimserve.serving.api import grpc_service
from slimserve.serving.observability import metrics as metrics_lib
from slimserve.serving.core import manager as models
from slimserve.serving.observability import request_log
from slimserve.serving.api import rest_api as rest
from slimserve.serving.core import inference as service
from slimserve.serving.core import tensors
from slimserve.serving.api import tls

# TF Serving lets gRPC accept messages of any size; so do we unless told otherwise.
_MAX_MESSAGE = 2 ** 31 - 1


def parse_channel_arguments(text):
    """`a=1,b=x` -> [("a", 1), ("b", "x")] (integers where they parse)."""
    options = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError("--grpc_channel_arguments: expected key=value, got %r" % item)
        options.append((key, int(value) if value.lstrip("-").isdigit() else value))
    return options


def parse_monitoring_config(path):
    """TF Serving's MonitoringConfig file -> the Prometheus path, or None when not enabled
    (an empty path means TF Serving's default, /monitoring/prometheus/metrics)."""
    config = config_protos.parse_text_file(path, config_protos.MonitoringConfig,
                                           "monitoring_config_file")
    prometheus = config.prometheus_config
    if not prometheus.enable:
        return None
    if prometheus.path and not prometheus.path.startswith("/"):
        raise ValueError("--monitoring_config_file %s: prometheus_config.path must start with "
                         "'/', got %r" % (path, prometheus.path))
    return prometheus.path or metrics_lib.PATH


def read_model_config_file(path):
    """The text-format ModelServerConfig proto at `path` (errors name the flag)."""
    return config_protos.parse_text_file(path, model_server_config_pb2.ModelServerConfig,
                                         "model_config_file")


# The services TF Serving registers with the standard health service, plus the
# full names grpc_health_probe users pass, plus "" (the whole server).
HEALTH_SERVICES = ("", "ModelService", "PredictionService", "tensorflow.serving.ModelService",
                   "tensorflow.serving.PredictionService")


class ModelServer:
    """gRPC + REST front ends over one ModelManager; usable in-process (tests, demo).

    Keyword options mirror tensorflow_model_server's flags (slimserve/cli/server.py):
    grpc_socket_path, ssl_config (an SSLConfig from tls.load_ssl_config: TLS on gRPC and
    REST), enable_grpc_healthcheck_service, method_name_check
    (--enable_signature_method_name_check), model_config_file +
    model_config_file_poll_seconds (re-read the file and reload: new models load before
    old ones unload), rest_api_timeout_in_ms / rest_api_num_threads /
    rest_api_enable_cors_support (for the REST front end), and manager options
    (saved_model_tags, allow_version_labels_for_unavailable_models, num_load_threads,
    load_retry_interval_micros: None keeps the manager's default)."""

    def __init__(self, model_configs, port=8500, rest_api_port=8501,
                 bind_address="127.0.0.1", batching=None, poll_seconds=1, warmup=True,
                 monitoring_path=None, grpc_options=(), grpc_max_threads=32,
                 session_config=None, max_num_load_retries=5,
                 load_retry_interval_micros=60 * 1000 * 1000, num_load_threads=0,
                 allow_version_labels_for_unavailable_models=False,
                 max_request_elements=None, max_broadcast_elements=None, *,
                 grpc_socket_path=None, ssl_config=None, enable_grpc_healthcheck_service=False,
                 method_name_check=False, model_config_file=None,
                 model_config_file_poll_seconds=0, saved_model_tags=None,
                 rest_api_num_threads=None, rest_api_timeout_in_ms=30000,
                 rest_max_body_bytes=64 * 2 ** 20, rest_connection_limit=256,
                 rest_idle_timeout_seconds=30, rest_read_timeout_seconds=60,
                 rest_api_enable_cors_support=False):
        self.metrics = metrics_lib.Metrics()
        self.manager = models.ModelManager(
            model_configs, warmup, session_config, max_num_load_retries,
            load_retry_interval_micros, num_load_threads,
            allow_version_labels_for_unavailable_models,
            on_change=self.metrics.model_event, on_load=self.metrics.model_load,
            saved_model_tags=saved_model_tags)
        self.batcher = (batching_lib.Batcher(batching, self.metrics.observe_batch,
                                             self.metrics.observe_queue_wait)
                        if batching else None)
        self.service = service.InferenceService(
            self.manager, self.batcher, self.metrics,
            tensors.DEFAULT_MAX_REQUEST_ELEMENTS if max_request_elements is None
            else max_request_elements,
            tensors.DEFAULT_MAX_BROADCAST_ELEMENTS if max_broadcast_elements is None
            else max_broadcast_elements, method_name_check=method_name_check)
        self._sync_request_loggers(model_configs)
        self.metrics.add_collector(
            lambda: metrics_lib.request_log_lines(self.service.request_loggers))
        self._poll_seconds = poll_seconds
        self._model_config_file = model_config_file
        self._config_poll_seconds = model_config_file_poll_seconds
        self._config_loaded = (read_model_config_file(model_config_file)
                               if model_config_file else None)
        self._stopping = threading.Event()
        self._config_thread = None
        self._reload_lock = threading.Lock()  # one model-set change at a time
        self.ssl_config = ssl_config
        options = dict([("grpc.max_receive_message_length", _MAX_MESSAGE),
                        ("grpc.max_send_message_length", _MAX_MESSAGE)])
        options.update(dict(grpc_options))  # gRPC would honour the first of duplicates
        options = list(options.items())
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=grpc_max_threads),
                                 options=options)
        grpc_service.add_to_server(self._grpc, self.service, self.reload_config)
        self.health = None
        if enable_grpc_healthcheck_service:
            self.health = health.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._grpc)
            for name in HEALTH_SERVICES:
                self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        credentials = tls.grpc_credentials(ssl_config) if ssl_config else None
        self.port = self._add_port("%s:%d" % (bind_address, port), credentials)
        self.grpc_socket_path = grpc_socket_path
        if grpc_socket_path:
            self._add_port("unix:" + os.path.abspath(grpc_socket_path), credentials)
        self._rest = None
        self.rest_api_port = 0
        if rest_api_port:
            self._rest = rest.make_server(
                self.service, bind_address, rest_api_port, self.metrics, monitoring_path,
                num_threads=rest_api_num_threads, timeout_ms=rest_api_timeout_in_ms,
                max_body_bytes=rest_max_body_bytes, connection_limit=rest_connection_limit,
                idle_timeout_seconds=rest_idle_timeout_seconds,
                read_timeout_seconds=rest_read_timeout_seconds,
                enable_cors=rest_api_enable_cors_support,
                ssl_context=tls.server_ssl_context(ssl_config) if ssl_config else None)
            self.rest_api_port = self._rest.port
        self.bind_address = bind_address

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
            configs = models.served_models_from_proto(config_proto, "ReloadConfigRequest")
        except ValueError as error:
            raise errors.invalid("%s", error) from None
        with self._reload_lock:
            self.manager.reload(configs)
            try:
                self._sync_request_loggers(configs)
            except ValueError as error:
                raise errors.invalid("%s", error) from None

    def _poll_config_file(self):
        while not self._stopping.wait(self._config_poll_seconds):
            try:
                config = read_model_config_file(self._model_config_file)
                if config == self._config_loaded:
                    continue
                logging.info("--model_config_file %s changed: reloading",
                             self._model_config_file)
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
        self.manager.start_polling(self._poll_seconds)
        if self._model_config_file and self._config_poll_seconds > 0:
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
