"""The embedded TF-Serving-compatible model server: wiring only.

`ModelServer(options)` builds what a `ServerOptions` (serving/options.py; its fields are
tensorflow_model_server's flag names) asks for, as TF Serving's Server::BuildAndStart:
every config file is read once (serving/config/files.py), each component gets its own
option object built here from the flags (the manager's ManagerOptions, the REST server's
RestOptions, the request loggers' RequestLogOptions, the batcher's BatchingParameters),
the inference service is made over them, and gRPC (and REST, and the Unix socket) are
bound; `start()` loads the first versions and starts serving. slimserve-server
(slimserve/cli/server.py) is this plus flags; tests, the demo and benchmarks run it in
process. What each piece does lives in the piece: request logs in
observability/request_logs.py, the config-file poller in config/poller.py.
"""
import logging
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc

from slimserve import errors as user_errors
from slimserve.serving import options as options_lib
from slimserve.serving.api import addresses
from slimserve.serving.api import grpc_service
from slimserve.serving.api import http_server
from slimserve.serving.api import profiler_service
from slimserve.serving.api import tls
from slimserve.serving.config import files
from slimserve.serving.config import model_config
from slimserve.serving.config import platform
from slimserve.serving.config import poller
from slimserve.serving.config import session
from slimserve.serving.core import admission
from slimserve.serving.core import batching as batching_lib
from slimserve.serving.core import errors
from slimserve.serving.core import health as health_lib
from slimserve.serving.core import inference
from slimserve.serving.core import manager as manager_lib
from slimserve.serving.core import openvino_servable
from slimserve.serving.core import tflite_servable
from slimserve.serving.observability import drift as drift_lib
from slimserve.serving.observability import drift_monitor
from slimserve.serving.observability import metrics as metrics_lib
from slimserve.serving.observability import request_log
from slimserve.serving.observability import request_logs as request_logs_lib
from slimserve.serving.observability import request_window

PICK_FREE_PORT = options_lib.PICK_FREE_PORT  # bind any free port; ModelServer reports it
# TF Serving lets gRPC accept messages of any size; so do we unless told otherwise.
_MAX_MESSAGE = 2 ** 31 - 1
# The services TF Serving registers with the standard health service, plus the
# full names grpc_health_probe users pass, plus "" (the whole server).
HEALTH_SERVICES = ("", "ModelService", "PredictionService", "tensorflow.serving.ModelService",
                   "tensorflow.serving.PredictionService")


def parse_channel_arguments(text):
    """`a=1,b=x` -> [("a", 1), ("b", "x")] (integers where they parse, each a 32-bit C
    int as gRPC takes them; a UserError naming the flag otherwise)."""
    options = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise user_errors.UserError("--grpc_channel_arguments: expected key=value, got %r"
                                        % item)
        if value.lstrip("-").isdigit():
            number = int(value)
            if not -2 ** 31 <= number < 2 ** 31:  # gRPC channel arguments are C ints
                raise user_errors.UserError(
                    "--grpc_channel_arguments: %s=%s must be in [-2147483648, 2147483647] "
                    "(gRPC takes 32-bit integer arguments)" % (key, value))
            options.append((key, number))
        else:
            options.append((key, value))
    return options


def monitoring_path(config, where="--monitoring_config_file"):
    """A MonitoringConfig -> the Prometheus path, or None when not enabled (an empty path
    means TF Serving's default, /monitoring/prometheus/metrics)."""
    prometheus = config.prometheus_config
    if not prometheus.enable:
        return None
    if prometheus.path and not prometheus.path.startswith("/"):
        raise files.ConfigError("%s: prometheus_config.path must start with '/', got %r"
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


def _model_configs(options):
    """(initial [ServedModel], the ModelServerConfig read from --model_config_file or None,
    what to name as their source in errors)."""
    if isinstance(options.model_server_config, (list, tuple)):
        for config in options.model_server_config:
            model_config.check_base_path(config.name, config.base_path, "model_server_config")
        return list(options.model_server_config), None, "model_server_config"  # in process
    if options.model_server_config is not None:
        return model_config.served_models_from_proto(options.model_server_config,
                                                     "model_server_config"), None, \
            "model_server_config"
    if options.model_config_file:
        where = "--model_config_file %s" % options.model_config_file
        config = files.read_model_server_config(options.model_config_file)
        return model_config.served_models_from_proto(config, where), config, where
    model_config.check_base_path(options.model_name, options.model_base_path,
                                 "--model_base_path")
    return [model_config.ServedModel(options.model_name, options.model_base_path)], None, \
        "--model_base_path"


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


def manager_options(options, settings):
    """The ModelManager's part of the flags (settings: the SessionBundleConfig the flags or
    --platform_config_file decide, config/platform.py)."""
    return manager_lib.ManagerOptions(
        warmup=settings.enable_model_warmup, warmup_iterations=settings.warmup_iterations,
        max_num_load_retries=options.max_num_load_retries,
        load_retry_interval_micros=options.load_retry_interval_micros,
        num_load_threads=options.num_load_threads,
        num_unload_threads=options.num_unload_threads,
        allow_version_labels_for_unavailable_models=(
            options.allow_version_labels_for_unavailable_models),
        error_hints=options.error_hints,
        retry_failed_versions_on_change=options.retry_failed_versions_on_change,
        freeze_loaded_objects=options.freeze_loaded_objects,
        saved_model_tags=settings.saved_model_tags,
        session_config=session.session_config(options, settings),
        tflite=tflite_servable.TfLiteOptions(options.num_tflite_pools,
                                             options.num_tflite_interpreters_per_pool)
        if options.prefer_tflite_model else None,
        openvino=openvino_servable.OpenVinoOptions(options.openvino_precision,
                                                   options.openvino_num_streams),
        prefer_openvino=options.prefer_openvino_model)


def rest_options(options):
    """The REST server's part of the flags."""
    return http_server.RestOptions(
        num_threads=options.rest_api_num_threads, timeout_ms=options.rest_api_timeout_in_ms,
        max_body_bytes=options.rest_max_body_bytes,
        connection_limit=options.rest_connection_limit,
        idle_timeout_seconds=options.rest_idle_timeout_seconds,
        read_timeout_seconds=options.rest_read_timeout_seconds,
        header_timeout_seconds=options.rest_header_timeout_seconds,
        min_request_bytes_per_second=options.rest_min_request_bytes_per_second,
        enable_cors=options.rest_api_enable_cors_support, status_page=options.status_page)


def request_log_options(options):
    """The request loggers' part of the flags."""
    return request_log.RequestLogOptions(queue_bytes=options.request_log_queue_bytes)


def drift_options(options):
    """The drift monitor's part of the flags: (MonitorOptions, DriftOptions)."""
    return (drift_monitor.MonitorOptions(
        check_interval_seconds=options.drift_check_interval_seconds,
        max_images=options.drift_max_images),
            drift_lib.DriftOptions(window_size=options.drift_window_size,
                                   alpha=options.drift_alpha))


def reload_models(config_proto, where, manager, request_logs, metrics=None,
                  from_operator=False):
    """Serve exactly the models of a ModelServerConfig: the manager reloads, then the
    request loggers follow.

    All or nothing: the configs and their request-log locations are checked first (a
    UserError, answered INVALID_ARGUMENT naming the model), then ModelManager.reload loads
    new models before it unloads old ones and changes nothing when one fails; only then
    do the loggers (RequestLogs) and the metrics' served names change. from_operator: the
    config is the operator's (the polled --model_config_file), not a network client's.
    Errors are ServingErrors whose messages name no server path; anything that is neither
    a UserError nor a ServingError is a bug: logged with its traceback, answered
    INTERNAL. A config with no config kind set (an empty file or request) changes
    nothing, as in TF Serving ("Taking no action for empty config"); an empty
    model_config_list unloads every model."""
    if config_proto.WhichOneof("config") is None:
        logging.info("%s: taking no action for empty config", where)
        return
    try:
        configs = model_config.served_models_from_proto(config_proto, where,
                                                        manager.platforms())
        plan = request_logs.plan(configs, where, from_operator)
        manager.reload(configs)
    except user_errors.UserError as error:  # the config's fault: it names what is wrong
        raise errors.invalid("%s", error) from None
    except errors.ServingError:
        raise
    except Exception as error:  # pylint: disable=broad-except  (a bug, not the config's)
        logging.exception("%s: reload failed", where)
        raise errors.ServingError(grpc.StatusCode.INTERNAL, "%s: reload failed: %s: %s"
                                  % (where, type(error).__name__, error)) from None
    if metrics is not None:
        metrics.set_served_models(c.name for c in configs)
    request_logs.apply(plan, from_operator)


def _check_free(host, port, flag, api):
    """A UserError naming the flag when host:port cannot be bound (in use, say)."""
    reason = addresses.tcp_bind_error(host, port) if port > 0 else None
    if reason:
        raise user_errors.UserError("%s %d: cannot bind %s to %s:%d: %s"
                                    % (flag, port, api, host, port, reason))


class ModelServer:
    """gRPC + REST front ends over one ModelManager, configured by one ServerOptions.

    After construction the ports are bound: `port` and `rest_api_port` are the ones in use
    (0 when that API is off; PICK_FREE_PORT in the options becomes a real port here).
    Start-up problems the user can fix (a flag out of its bound, a bad config file, a port
    in use) are UserErrors naming the flag or file."""

    def __init__(self, options=None, **changes):
        """options: a ServerOptions; keyword changes are applied on top of it (or of the
        defaults), e.g. ModelServer(model_base_path=path, port=PICK_FREE_PORT)."""
        options = (options or options_lib.ServerOptions()).replace(**changes).check()
        self.options = options
        configs, loaded_config, where = _model_configs(options)
        self._config_source = where
        # Every background component reports here; the health service follows it.
        self.component_health = health_lib.Health(on_change=self._health_changed)
        self._serving = False  # the health service says SERVING only once started
        self.request_logs = request_logs_lib.RequestLogs(options.request_log_dir,
                                                         request_log_options(options),
                                                         self.component_health)
        log_plan = self.request_logs.plan(configs, where, from_operator=True)
        self.ssl_config = _ssl_config(options)
        monitoring = _monitoring_path(options)
        channel_arguments = parse_channel_arguments(options.grpc_channel_arguments)
        for name, value in options_lib.changed_without_effect(options):
            logging.warning("--%s=%s is accepted for TF Serving compatibility and has no "
                            "effect here", name, value)
        # SessionBundleConfig: --platform_config_file's, or composed from the flags
        self.settings = settings = platform.bundle_settings(options)
        batching = settings.batching
        self.metrics = metrics_lib.Metrics()
        self.manager = manager_lib.ModelManager(
            configs, manager_options(options, settings), on_change=self.metrics.model_event,
            on_load=self.metrics.model_load,
            batching_for=(lambda path: batching_lib.parameters_for_version(
                path, batching, settings.per_model_batching)) if batching else None,
            health=self.component_health)
        self.batcher = (batching_lib.Batcher(batching, self.metrics.observe_batch,
                                             self.metrics.observe_queue_wait,
                                             on_failure=self._batching_failed)
                        if batching else None)
        # Requests are counted, and shown on the status page, under served model names only.
        self.metrics.set_served_models(c.name for c in configs)
        self.request_logs.apply(log_plan, from_operator=True)
        self.service = inference.InferenceService(
            self.manager, self.batcher, self.metrics, options.max_request_elements,
            options.max_broadcast_elements,
            method_name_check=options.enable_signature_method_name_check,
            request_logs=self.request_logs,
            window=request_window.RequestWindow(label=self.metrics.model_label),
            in_flight=self._bytes_in_flight(options))
        self.metrics.add_collector(self.request_logs.families)
        self.metrics.add_collector(lambda: [metrics_lib.model_runtime_family(self.manager)])
        if self.batcher is not None:
            self.metrics.add_collector(
                lambda: self.metrics.batching_families(self.batcher.learners()))
        # Off the request path: its own thread, the server's own logs (drift_monitor.py).
        self.drift = drift_monitor.DriftMonitor(self.manager, self.request_logs,
                                                *drift_options(options))
        self.service.drift = self.drift
        self.metrics.add_collector(self.drift.families)
        self._config_poller = None
        if options.model_config_file and options.model_config_file_poll_wait_seconds > 0:
            self._config_poller = poller.ConfigFilePoller(
                options.model_config_file, options.model_config_file_poll_wait_seconds,
                lambda config, where: self.reload_config(config, where, from_operator=True),
                loaded=loaded_config, health=self.component_health)
        self._reload_lock = threading.Lock()  # one model-set change at a time
        self._grpc = self._grpc_server(options, channel_arguments)
        credentials = tls.grpc_credentials(self.ssl_config) if self.ssl_config else None
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
            try:
                self._rest = http_server.make_server(
                    self.service, options.bind_address, max(options.rest_api_port, 0),
                    self.metrics, monitoring, rest_options(options),
                    tls.server_ssl_context(self.ssl_config) if self.ssl_config else None)
            except OSError as error:  # taken between the check and the bind, say
                raise user_errors.UserError("--rest_api_port %d: cannot bind REST to %s:%d: %s"
                                            % (options.rest_api_port, options.bind_address,
                                               options.rest_api_port,
                                               error.strerror or error)) from None
            self.rest_api_port = self._rest.port

    @staticmethod
    def _bytes_in_flight(options):
        budget = options.max_request_bytes_in_flight or admission.default_budget()
        logging.info("Requests in flight: at most %d MiB (--max_request_bytes_in_flight%s)",
                     budget >> 20, "" if options.max_request_bytes_in_flight else
                     ": a quarter of the memory this process may still take")
        return admission.BytesInFlight(budget)

    def _grpc_server(self, options, channel_arguments):
        """The gRPC server with every service the options ask for (not yet bound)."""
        grpc_options = dict([("grpc.max_receive_message_length", _MAX_MESSAGE),
                             ("grpc.max_send_message_length", _MAX_MESSAGE),
                             # one server per port: a second one fails to bind (addresses.py)
                             ("grpc.so_reuseport", 0)])
        grpc_options.update(dict(channel_arguments))  # gRPC would honour the first duplicate
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=options.grpc_max_threads),
            options=list(grpc_options.items()))
        grpc_service.add_to_server(server, self.service, self.reload_config)
        if options.enable_profiler:
            profiler_service.add_to_server(server, options.profiler_max_duration_ms,
                                           options.profiler_log_dir)
            logging.info("Profiler service is enabled")
        self.health = None
        if options.enable_grpc_healthcheck_service:
            self.health = health.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
            for name in HEALTH_SERVICES:
                self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        return server

    def _health_changed(self, healthy):
        """The standard health service follows the components' health once the server
        serves: NOT_SERVING while one of them is failing (core/health.py)."""
        if getattr(self, "health", None) is None or not getattr(self, "_serving", False):
            return
        status = (health_pb2.HealthCheckResponse.SERVING if healthy
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in HEALTH_SERVICES:
            self.health.set(name, status)

    def _batching_failed(self, message):
        """The Batcher's on_failure: no batch thread is left, so no batched request can
        be answered; a permanent failure of the "batching" component (the health service
        answers NOT_SERVING; GetModelStatus and the status page say why)."""
        self.component_health.fail("batching", message)

    def check_drift(self, wait=True):
        """A drift check of every request-logged model version now (slimserve-server:
        SIGUSR2): in this thread when `wait`, else by the monitor's thread. Returns the
        results ({(model, version): VersionDrift}) when it waited."""
        if wait:
            return self.drift.check_now()
        self.drift.request_check()
        return None

    def flush_request_logs(self, timeout=None):
        """Publishes every model's open request log file now (SIGUSR1 to slimserve-server);
        see RequestLogs.flush."""
        return self.request_logs.flush(timeout)

    def _add_port(self, host, port, credentials, flag):
        """Binds gRPC to host:port (host None: port is a Unix socket path); a UserError
        naming the flag, and why when it can tell, if that fails."""
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
            raise user_errors.UserError("%s: cannot bind gRPC to %s" % (flag, address))
        return bound

    def reload_config(self, config_proto, where="ReloadConfigRequest", from_operator=False):
        """HandleReloadConfigRequest / config-file polling: serve exactly these models
        (reload_models, one change at a time)."""
        with self._reload_lock:
            reload_models(config_proto, where, self.manager, self.request_logs, self.metrics,
                          from_operator)

    def start(self):
        """Loads the initial versions, then starts polling and both front ends. As TF
        Serving's ServerCore, a model whose versions all failed to load (after their
        retries) stops the start ("N model(s) did not become available"), and so does a
        version label naming a version that did not load (a UserError naming the
        config). A model whose base path holds no version yet does not: it is polled."""
        try:
            self.manager.poll()
            wait = self.manager.next_retry_seconds()
            while wait is not None:  # TF Serving retries a load before it gives up
                time.sleep(wait)
                self.manager.poll()
                wait = self.manager.next_retry_seconds()
            failed = self.manager.start_up_failures()
            if failed:
                raise errors.ServingError(
                    grpc.StatusCode.UNKNOWN, "%d model(s) did not become available: {%s}"
                    % (len(failed), "".join("{%s}, " % f for f in failed)))
        except errors.ServingError as error:
            self.manager.stop()
            raise user_errors.UserError("%s: %s" % (self._config_source, error.message)) \
                from None
        interval = self.options.file_system_poll_wait_seconds
        for name in self.manager.model_names:
            if not self.manager.available_versions(name):  # the manager logged why
                logging.warning("model %s has no loadable version yet; %s", name,
                                "its base path is polled every %g s, so a fix is picked up "
                                "without a restart" % interval if interval > 0 else
                                "polling is off (--file_system_poll_wait_seconds=0): "
                                "restart after fixing it")
        self.manager.start_polling(self.options.file_system_poll_wait_seconds)
        if self._config_poller is not None:
            self._config_poller.start()
        self._grpc.start()
        self._serving = True
        self._health_changed(self.component_health.healthy)
        if self._rest is not None:
            self._rest.start()
        self.drift.start()
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
        if self._config_poller is not None:
            self._config_poller.stop()  # no reload starts while draining
        self._serving = False
        if self.health is not None:
            self.health.enter_graceful_shutdown()
        grpc_done = self._grpc.stop(grace)  # refuses new RPCs now, drains in background
        clean = self._rest.stop(grace) if self._rest is not None else True
        clean = grpc_done.wait(max(0.0, deadline - time.monotonic())) and clean
        self.drift.stop()
        if self.batcher is not None:
            self.batcher.stop()
        self.request_logs.close()  # flushed and published, as on SIGTERM
        self.manager.stop()
        return clean
