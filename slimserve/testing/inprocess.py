"""The serving stack in this process, without a socket: one ModelManager, the
InferenceService over it, the REST routes (RestApi) and the gRPC servicers, wired as
ModelServer wires them. For unit tests of routes, the service and the servicers, as TF
Serving's http_rest_api_handler_test drives its handler against one ServerCore with no
HTTP; socket tests stay for what only a socket shows (transport limits, TLS, drains,
signals).

    stack = InProcess([ServedModel("tiny", base)])          # loads the first versions
    status, headers, body = stack.rest("POST", "/v1/models/tiny:predict",
                                       {"instances": [[1.0, 2.0]]})
    json.loads(body)                                        # {"predictions": [...]}
    response = stack.prediction.Predict(request, Context())
    with pytest.raises(Aborted) as caught:                  # what context.abort raises
        stack.prediction.Predict(bad_request, Context())
    caught.value.code                                        # grpc.StatusCode.NOT_FOUND
    stack.model.HandleReloadConfigRequest(reload_request, Context())
    stack.close()                                           # retires every version

A stack is cheap (no ports, no threads but the manager's own when asked), so a module can
hold one in a fixture for all its tests: module scope for tests that only send requests,
a fresh one for tests that reload. `Context` stands in for grpc.ServicerContext: `abort`
raises `Aborted` (as grpc's own abort raises), a deadline is `Context(timeout=seconds)`,
and `set_code`/`set_details` are kept for HandleReloadConfigRequest's answer.
"""
import json
import threading
import time

from slimserve.serving import server as server_lib
from slimserve.serving.api import grpc_service
from slimserve.serving.api import rest_api
from slimserve.serving.core import batching
from slimserve.serving.core import inference
from slimserve.serving.core import manager as manager_lib
from slimserve.serving.observability import metrics as metrics_lib
from slimserve.serving.observability import request_logs as request_logs_lib
from slimserve.serving.observability import request_window


class Aborted(Exception):
    """What Context.abort raises (a servicer's call ends there, as with grpc's)."""

    def __init__(self, code, details):
        super().__init__("%s: %s" % (code.name, details))
        self.code, self.details = code, details


class Context:
    """A grpc.ServicerContext stand-in for calling a servicer method directly."""

    def __init__(self, timeout=None):
        """timeout: seconds the client gives the call (its gRPC deadline); None: none."""
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self.code, self.details = None, None

    def abort(self, code, details):
        self.code, self.details = code, details
        raise Aborted(code, details)

    def set_code(self, code):
        self.code = code

    def set_details(self, details):
        self.details = details

    def time_remaining(self):
        return None if self._deadline is None else self._deadline - time.monotonic()

    @staticmethod
    def is_active():
        return True

    @staticmethod
    def invocation_metadata():
        return ()


class InProcess:
    """ModelManager + InferenceService + RestApi + gRPC servicers over [ServedModel].

    Attributes: manager, service, metrics, request_logs, batcher (None unless `batching`),
    rest_api (the RestApi), prediction (PredictionServicer), model (ModelServicer)."""

    def __init__(self, served_models, manager_options=None, batching_parameters=None,
                 request_log_dir=None, rest_timeout_ms=rest_api.DEFAULT_TIMEOUT_MS,
                 enable_cors=False, status_page=False,
                 monitoring_path=metrics_lib.PATH, load=True, **service_options):
        """manager_options: a ManagerOptions (default: retries of a failed load wait an
        hour, so a failed version stays failed while a test looks). batching_parameters: batch requests
        with these core.batching.BatchingParameters. request_log_dir: as
        --request_log_dir. rest_timeout_ms / enable_cors / monitoring_path: the REST
        routes' --rest_api_timeout_in_ms, --rest_api_enable_cors_support and Prometheus
        path. status_page: --status_page. load: poll once now, so the first versions
        serve. service_options:
        InferenceService keywords (max_request_elements, max_broadcast_elements,
        method_name_check)."""
        self.metrics = metrics_lib.Metrics()
        self.manager = manager_lib.ModelManager(
            list(served_models), manager_options or manager_lib.ManagerOptions(
                load_retry_interval_micros=3600 * 10 ** 6),
            on_change=self.metrics.model_event, on_load=self.metrics.model_load)
        self.metrics.set_served_models(model.name for model in served_models)
        self.request_logs = request_logs_lib.RequestLogs(request_log_dir)
        self.request_logs.update(served_models, "in-process config", from_operator=True)
        self.batcher = (batching.Batcher(batching_parameters, self.metrics.observe_batch,
                                         self.metrics.observe_queue_wait)
                        if batching_parameters is not None else None)
        self.service = inference.InferenceService(
            self.manager, self.batcher, self.metrics, request_logs=self.request_logs,
            window=request_window.RequestWindow(label=self.metrics.model_label),
            **service_options)
        self.metrics.add_collector(self.request_logs.families)
        self.metrics.add_collector(lambda: [metrics_lib.model_runtime_family(self.manager)])
        if self.batcher is not None:
            self.metrics.add_collector(
                lambda: self.metrics.batching_families(self.batcher.learners()))
        self.rest_api = rest_api.RestApi(self.service, self.metrics, monitoring_path,
                                         rest_timeout_ms, enable_cors, status_page)
        self._reload_lock = threading.Lock()
        self.prediction = grpc_service.PredictionServicer(self.service)
        self.model = grpc_service.ModelServicer(self.service, self.reload_config)
        if load:
            self.manager.poll()

    def reload_config(self, config_proto, where="ReloadConfigRequest", from_operator=False):
        """What HandleReloadConfigRequest does in ModelServer (server.reload_models)."""
        with self._reload_lock:
            server_lib.reload_models(config_proto, where, self.manager, self.request_logs,
                                     self.metrics, from_operator)

    def rest(self, method, path, body=None, headers=None):
        """One REST call through the routes -> (HTTP status, headers, body bytes). body:
        bytes as sent, or anything else as JSON; headers: lower-case keys."""
        if body is not None and not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body).encode()
        return self.rest_api.handle(method, path, headers or {}, body or b"")

    def rest_json(self, method, path, body=None, headers=None):
        """rest() with the answer's JSON parsed -> (HTTP status, parsed body)."""
        status, _, payload = self.rest(method, path, body, headers)
        return status, json.loads(payload)

    def close(self):
        """Stops batching, closes the request logs, retires every version."""
        if self.batcher is not None:
            self.batcher.stop()
        self.request_logs.close()
        self.manager.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

