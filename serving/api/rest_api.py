"""TF Serving's REST API as a WSGI app, served by waitress.

    GET  /v1/models/{name}[/versions/{v} | /labels/{l}]            model status
    GET  /v1/models/{name}[/versions/{v} | /labels/{l}]/metadata   signatures
    POST /v1/models/{name}[/versions/{v} | /labels/{l}]:predict    row "instances" or
                                                                   columnar "inputs"
    POST /v1/models/{name}[/versions/{v} | /labels/{l}]:classify   "examples" (+ "context")
    POST /v1/models/{name}[/versions/{v} | /labels/{l}]:regress    "examples" (+ "context")
    GET  /monitoring/prometheus/metrics                            when monitoring is on
    GET  / or /status                                              the HTML status page

Routing follows http_rest_api_util.cc: the paths match case-insensitively, anything else
under /v1/ is 400 "Malformed request", other paths 404. Every answer, errors included, is
JSON: {"error": "..."} with the HTTP status of the gRPC code.

Why waitress: one event loop holds every connection (an idle or slow client costs a
socket, not a thread), a fixed pool of `num_threads` runs the app, bodies are read in full
(Content-Length or chunked, capped at `max_body_bytes`) before a thread is taken, and
there are idle timeouts and a connection limit. The http.server thread-per-connection
server it replaces had none of these (issue 12).
"""
import concurrent.futures
import json
import logging
import os
import re
import socket
import ssl
import threading
import time
import urllib.parse

import grpc
import waitress.channel
import waitress.parser
import waitress.server
import waitress.task

from slimserve.serving.core import errors
from slimserve.serving.api import protos
from slimserve.serving.api import rest_json
from slimserve.serving.core import inference as service_lib
from slimserve.serving.observability import status_page

STATUS_PAGE_PATHS = ("/", "/status")
_PREDICTION_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(classify|regress|predict)",
    re.IGNORECASE)
_STATUS_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?(?:/(metadata))?",
    re.IGNORECASE)
_API_PATH = re.compile(r"/v1/.*", re.IGNORECASE | re.DOTALL)
_ORIGIN = re.compile(r"https?://")
_INT64_MAX = 2 ** 63 - 1
_JSON = [("Content-Type", "application/json")]
_CORS = [("Access-Control-Allow-Origin", "*"), ("Access-Control-Allow-Methods", "POST, GET"),
         ("Access-Control-Allow-Headers", "Content-Type")]


def default_num_threads():
    """TF Serving's default for --rest_api_num_threads: 4 per schedulable CPU."""
    return 4 * len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        4 * (os.cpu_count() or 1)


def _json_bytes(payload):
    return (json.dumps(payload) + "\n").encode("utf-8")


def _error_body(message):
    return _json_bytes({"error": message})


def _deadline_exceeded(timeout_ms):
    return errors.ServingError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               "Deadline exceeded: the request ran longer than "
                               "rest_api_timeout_in_ms=%d" % timeout_ms)


def _spec(name, version, label):
    name = urllib.parse.unquote(name) if name else name
    label = urllib.parse.unquote(label) if label else None
    if version:
        number = int(version)
        if number > _INT64_MAX:
            raise errors.invalid("Failed to convert version: %s to numeric.", version)
        version = number
    else:
        version = None
    return name, version, label


def _logged(pair):
    """(request, response) -> what log_request takes: the answering ModelSpec added."""
    request, response = pair
    return request, response, response.model_spec


class RestApi:
    """Method + raw path + body -> (HTTP status, headers, body); no transport in here."""

    def __init__(self, service, metrics=None, monitoring_path=None, timeout_ms=30000,
                 inference_threads=None, enable_cors=False):
        self._service = service
        self._headers = _JSON + (_CORS if enable_cors else [])
        self._metrics = metrics
        self._monitoring_path = monitoring_path
        self._timeout_ms = timeout_ms
        # A request that outlives timeout_ms is answered 504 while its run finishes here;
        # at most one run per app thread, so this pool is as bounded as the app's.
        self._inference = (concurrent.futures.ThreadPoolExecutor(
            inference_threads or default_num_threads(), thread_name_prefix="rest-inference")
            if timeout_ms and timeout_ms > 0 else None)

    def close(self, wait=True):
        if self._inference is not None:
            self._inference.shutdown(wait=wait, cancel_futures=True)

    def handle(self, method, path, headers, body):
        """headers: a dict with lower-case keys (only "origin" is read)."""
        if self._monitoring_path and path == self._monitoring_path and \
                self._metrics is not None and method == "GET":
            return 200, [("Content-Type", "text/plain; version=0.0.4")], \
                self._metrics.render().encode()
        if method == "GET" and path in STATUS_PAGE_PATHS:
            return 200, [("Content-Type", "text/html; charset=utf-8"),
                         ("Cache-Control", "no-store")], self.status_page().encode("utf-8")
        if not _API_PATH.fullmatch(path):
            return 404, _JSON, _error_body("Not found: %s %s (the REST API lives under "
                                           "/v1/models/)" % (method, path))
        try:
            if method == "OPTIONS":  # CORS preflight, as http_server.cc answers it
                if not _ORIGIN.match(headers.get("origin", "")):
                    raise errors.ServingError(grpc.StatusCode.FAILED_PRECONDITION,
                                              "Origin header is missing in CORS preflight")
                return 200, self._headers, b""
            return 200, self._headers, _json_bytes(self._dispatch(method, path, body))
        except errors.ServingError as error:
            return error.http_status, self._headers, _error_body(error.message)

    def status_page(self):
        """The HTML status page: every model's versions and states, and the last
        minute's traffic (serving/observability/status_page.py)."""
        manager = self._service.manager
        models = {}
        for name in manager.model_names:
            try:
                models[name] = self._service.status(name)
            except errors.ServingError:
                models[name] = []
        return status_page.render(models, self._service.window.summary())

    def _dispatch(self, method, path, body):
        malformed = errors.invalid("Malformed request: %s %s", method, path)
        if method == "POST":
            match = _PREDICTION_PATH.fullmatch(path)
            if not match:
                raise malformed
            name, version, label = _spec(*match.group(1, 2, 3))
            verb = match.group(4)
            # TF Serving compares the verb case-sensitively after a case-blind match.
            handler = {"predict": self._predict, "classify": self._classify,
                       "regress": self._regress}.get(verb)
            if handler is None:
                raise malformed
            with self._service.observe(name, verb, "REST") as call:
                return handler(name, version, label, rest_json.parse_body(body), call)
        if method == "GET":
            match = _STATUS_PATH.fullmatch(path)
            if not match:
                raise malformed
            name, version, label = _spec(*match.group(1, 2, 3))
            if not name:
                raise errors.invalid("Missing model name in request.")
            if match.group(4) == "metadata":
                with self._service.observe(name, "metadata", "REST"):
                    version, signature_defs = self._service.metadata(name, version, label)
                    return rest_json.metadata_response(name, version, signature_defs)
            # GetModelStatus ignores a label and lists every version, on gRPC as here.
            return rest_json.status_response(self._service.status(name, version))
        raise malformed

    def _run(self, function, *args):
        """Runs inference, answering DEADLINE_EXCEEDED past timeout_ms as TF Serving does."""
        if self._inference is None:
            return function(*args)
        future = self._inference.submit(function, *args)
        try:
            return future.result(self._timeout_ms / 1000.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise _deadline_exceeded(self._timeout_ms) from None

    def _predict(self, name, version, label, body, call):
        sig_name = rest_json.signature_name(body, service_lib.DEFAULT_SIGNATURE)
        decoded = {}

        def decode(signature_inputs):
            """The JSON, decoded against the signature of the version that runs it (one
            servable lookup per request, as gRPC)."""
            decoded["feeds"], decoded["rows"] = rest_json.predict_feeds(body, signature_inputs)
            return decoded["feeds"]

        served, sig_name, outputs = self._run(self._service.predict, name, version, label,
                                              sig_name, decode)
        feeds, row_format = decoded["feeds"], decoded["rows"]
        call.version, call.signature = served, sig_name
        self._service.log_request(name, "predict", lambda: _logged(
            protos.predict_pair(name, served, sig_name, feeds, outputs)))
        return rest_json.predict_response(outputs, row_format)

    def _classify(self, name, version, label, body, call):
        sig_name = rest_json.signature_name(body, service_lib.DEFAULT_SIGNATURE)
        examples = rest_json.serialized_examples(body, "classify")
        served, sig_name, classes, scores = self._run(
            self._service.classify, name, version, label, sig_name, examples)
        call.version, call.signature = served, sig_name
        self._service.log_request(name, "classify", lambda: _logged(
            protos.classify_pair(name, served, sig_name, examples, classes, scores)))
        return rest_json.classify_response(classes, scores)

    def _regress(self, name, version, label, body, call):
        sig_name = rest_json.signature_name(body, service_lib.DEFAULT_SIGNATURE)
        examples = rest_json.serialized_examples(body, "regress")
        served, sig_name, values = self._run(self._service.regress, name, version, label,
                                             sig_name, examples)
        call.version, call.signature = served, sig_name
        self._service.log_request(name, "regress", lambda: _logged(
            protos.regress_pair(name, served, sig_name, examples, values)))
        return rest_json.regress_response(values)

    def wsgi(self, environ, start_response):
        """The WSGI entry point: reads the (already fully buffered) body and answers."""
        path = urllib.parse.urlsplit(environ.get("REQUEST_URI") or
                                     environ.get("PATH_INFO", "/")).path
        method = environ["REQUEST_METHOD"]
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0  # waitress has already refused a malformed Content-Length
        body = environ["wsgi.input"].read(length) if length > 0 else b""
        headers = {"origin": environ.get("HTTP_ORIGIN", "")}
        try:
            status, response_headers, payload = self.handle(method, path, headers, body)
        except Exception as error:  # pylint: disable=broad-except
            logging.exception("REST %s %s failed", method, path)
            status, response_headers, payload = 500, _JSON, _error_body(
                "Internal error: %s" % error)
        start_response("%d %s" % (status, _REASONS.get(status, "Error")),
                       response_headers + [("Content-Length", str(len(payload)))])
        return [payload]


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Payload Too Large",
            429: "Too Many Requests", 500: "Internal Server Error", 501: "Not Implemented",
            503: "Service Unavailable", 504: "Gateway Timeout"}


class _JsonErrorTask(waitress.task.ErrorTask):
    """waitress's own refusals (bad Content-Length, too large, bad chunking) as JSON."""

    def execute(self):
        error = self.request.error
        self.status = "%d %s" % (error.code, error.reason)
        body = _error_body("%s: %s" % (error.reason, error.body))
        self.response_headers.extend(_JSON)
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class _TimedParser(waitress.parser.HTTPRequestParser):
    """Remembers when a request's first byte arrived, for the read timeout."""

    def __init__(self, adj):
        super().__init__(adj)
        self.started = time.monotonic()


class _Channel(waitress.channel.HTTPChannel):
    error_task_class = _JsonErrorTask
    parser_class = _TimedParser


class _TlsChannel(_Channel):
    """HTTPS on waitress's non-blocking loop: the handshake and partial TLS records show
    up as SSLWant* errors, which mean "wait for the socket", not "the client is gone";
    decrypted bytes OpenSSL already holds are drained at once (poll would not see them)."""

    def handle_read(self):
        try:
            data = self.socket.recv(self.adj.recv_bytes)
            while data and self.socket.pending():
                data += self.socket.recv(self.socket.pending())
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:  # a failed handshake (plain HTTP, an untrusted client) included
            self.handle_close()
            return
        if data:
            self.last_activity = time.time()
            self.received(data)
        else:
            self.handle_close()

    def send(self, data, do_close=True):
        try:
            return super().send(data, do_close)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return 0


def _idle(channel):
    """Nothing received, queued, running or left to send on this connection."""
    if channel.requests or channel.request is not None or channel.total_outbufs_len:
        return False
    if isinstance(channel.socket, ssl.SSLSocket) and channel.socket.pending():
        return False
    try:  # bytes the loop has not read yet are a request already sent to us (for TLS,
        # the raw socket's encrypted bytes)
        return not socket.socket.recv(channel.socket, 1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return True


class _Server(waitress.server.TcpWSGIServer):
    """waitress's TCP server, plus: at the connection limit the longest-idle connections
    are closed to make room, so idle sockets delay nobody; and a drain for graceful stops."""

    channel_class = _Channel
    read_timeout_seconds = 60
    ssl_context = None

    def handle_accept(self):
        if self.ssl_context is None:
            return super().handle_accept()
        try:
            accepted = self.accept()
            if accepted is None:
                return None
            conn, addr = accepted
            self.set_socket_options(conn)
            conn = self.ssl_context.wrap_socket(conn, server_side=True,
                                                do_handshake_on_connect=False)
        except OSError:
            return None
        _TlsChannel(self, conn, self.fix_addr(addr), self.adj, map=self._map)
        return None

    def maintenance(self, now):
        """waitress closes idle connections; also close those still sending one request
        after read_timeout_seconds (a trickling client resets the idle clock forever)."""
        super().maintenance(now)
        cutoff = time.monotonic() - self.read_timeout_seconds
        for channel in self.active_channels.values():
            if channel.request is not None and channel.request.started < cutoff:
                channel.will_close = True

    def readable(self):
        if self.accepting and len(self._map) >= self.adj.connection_limit:
            idle = sorted((c for c in self.active_channels.values()
                           if not c.will_close and _idle(c)), key=lambda c: c.last_activity)
            for channel in idle[:max(1, len(idle) // 16)]:  # a flood is cleared in a few turns
                channel.will_close = True
        return super().readable()

    def drain_step(self):
        """Runs in the loop thread: stop listening, close connections with nothing in
        flight; requests being read, queued or answered carry on."""
        if self.accepting:
            self.accepting = False
            waitress.server.wasyncore.dispatcher.close(self)  # the listening socket only
        for channel in list(self.active_channels.values()):
            if _idle(channel):
                channel.will_close = True


class RestServer:
    """The REST front end: a bound waitress server driven by one loop thread.

    num_threads: app threads (TF Serving's --rest_api_num_threads; default 4 per CPU).
    timeout_ms: inference answering later gets 504 (--rest_api_timeout_in_ms; <=0: none).
    max_body_bytes: larger bodies get 413 before they are read.
    connection_limit: open connections; past it the longest-idle one is closed.
    idle_timeout_seconds: a connection with no request in flight and no bytes moving for
        this long is closed (waitress checks every idle_timeout/2, at least each second).
    read_timeout_seconds: a request not received in full this long after its first byte
        is dropped with its connection.
    enable_cors: add TF Serving's CORS headers to every /v1 answer.
    ssl_context: serve HTTPS with it (--ssl_config_file; TF Serving's REST has no TLS).
    """

    def __init__(self, service, address, port, metrics=None, monitoring_path=None,
                 num_threads=None, timeout_ms=30000, max_body_bytes=64 * 2 ** 20,
                 connection_limit=256, idle_timeout_seconds=30, read_timeout_seconds=60,
                 enable_cors=False, ssl_context=None):
        threads = num_threads or default_num_threads()
        if min(connection_limit, max_body_bytes, idle_timeout_seconds,
               read_timeout_seconds) < 1:
            raise ValueError("REST connection_limit, max_body_bytes, idle_timeout_seconds and "
                             "read_timeout_seconds must be positive")
        self.api = RestApi(service, metrics, monitoring_path, timeout_ms, threads, enable_cors)
        self._server = _Server(
            self.api.wsgi, host=address, port=port, threads=threads,
            # the map also holds the listening socket and the wake-up pipe
            connection_limit=connection_limit + 2,
            channel_timeout=idle_timeout_seconds,
            cleanup_interval=max(1, idle_timeout_seconds // 2),
            max_request_body_size=max_body_bytes, asyncore_use_poll=True,
            ident="slimserve", expose_tracebacks=False, clear_untrusted_proxy_headers=False)
        self._server.read_timeout_seconds = read_timeout_seconds
        self._server.ssl_context = ssl_context
        self.port = int(self._server.effective_port)
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self._server.run, name="rest-loop",
                                        daemon=True)
        self._thread.start()
        return self

    def _in_loop(self, function):
        """Runs `function` in the loop thread (asyncore is not thread-safe); a loop that
        has already closed everything (its trigger included) has nothing left to run."""
        try:
            self._server.trigger.pull_trigger(function)
        except OSError:
            pass

    def stop(self, grace=5.0):
        """Stops accepting, lets requests in flight finish within `grace` seconds, then
        closes everything. Returns True when nothing was cut off."""
        deadline = time.monotonic() + grace
        if self._thread is None:
            self._server.close()
            self._server.task_dispatcher.shutdown(timeout=0)
            self.api.close(wait=False)
            return True
        drained = False
        while True:
            self._in_loop(self._server.drain_step)
            if not self._server.active_channels and not self._server.task_dispatcher.queue:
                drained = True
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)  # polling a condition with a deadline, not synchronising on time
        if not drained:
            logging.warning("REST: %d connection(s) still busy after %.1fs; closing them",
                            len(self._server.active_channels), grace)
        self._in_loop(lambda: waitress.server.wasyncore.close_all(self._server._map))  # pylint: disable=protected-access
        self._thread.join(max(1.0, deadline - time.monotonic()))
        dispatcher = self._server.task_dispatcher
        dispatcher.shutdown(cancel_pending=True, timeout=max(0.5, deadline - time.monotonic()))
        # A run that outlived its timeout may still be going: it is not waited for here
        # (the interpreter joins it at exit; its session stays open until it returns).
        self.api.close(wait=False)
        return drained and not dispatcher.threads


def make_server(service, address, port, metrics=None, monitoring_path=None, **kwargs):
    """A bound (not yet serving) REST server; call start(), later stop(grace)."""
    return RestServer(service, address, port, metrics, monitoring_path, **kwargs)
