"""TF Serving's REST API as a WSGI app, served by waitress.

    GET  /v1/models/{name}[/versions/{v} | /labels/{l}]            model status
    GET  /v1/models/{name}[/versions/{v} | /labels/{l}]/metadata   signatures
    POST /v1/models/{name}[/versions/{v} | /labels/{l}]:predict    row "instances" or
                                                                   columnar "inputs"
    POST /v1/models/{name}[/versions/{v} | /labels/{l}]:classify   "examples" (+ "context")
    POST /v1/models/{name}[/versions/{v} | /labels/{l}]:regress    "examples" (+ "context")
    GET  /monitoring/prometheus/metrics                            when monitoring is on
    GET  / or /status                                              the HTML status page
                                                                   (--status_page)

Routing follows http_rest_api_util.cc: the paths match case-insensitively, anything else
under /v1/ is 400 "Malformed request", other paths 404. Every answer, errors included, is
JSON: {"error": "..."} with the HTTP status of the gRPC code (http_server.cc's map,
core/errors.py); a UserError raised while reading the request is 400 INVALID_ARGUMENT, and
any other exception is a bug of the server: 500, logged with its traceback naming the
request.

Transport-free, as TF Serving's http_rest_api_handler is apart from its http_server:
`RestApi.handle(method, path, headers, body)` -> (status, headers, body); the waitress
server that carries it is http_server.py.
"""
import logging
import os
import re
import urllib.parse

import grpc

from slimserve import errors as user_errors
from slimserve.serving.core import deadlines
from slimserve.serving.core import errors
from slimserve.serving.api import json_writer
from slimserve.serving.api import protos
from slimserve.serving.api import rest_json
from slimserve.serving.core import inference as service_lib
from slimserve.serving.observability import status_page

STATUS_PAGE_PATHS = ("/", "/status")
# http_rest_api_util.cc's two patterns (RE2's \d is ASCII only, so [0-9] here).
_PREDICTION_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:/versions/([0-9]+)|/labels/([^/:]+))?:(classify|regress|predict)",
    re.IGNORECASE)
_STATUS_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:/versions/([0-9]+)|/labels/([^/:]+))?(?:/(metadata))?",
    re.IGNORECASE)
_API_PATH = re.compile(r"/v1/.*", re.IGNORECASE | re.DOTALL)
_ORIGIN = re.compile(r"https?://")
_INT64_MAX = 2 ** 63 - 1
JSON_HEADERS = [("Content-Type", "application/json")]
DEFAULT_TIMEOUT_MS = 30000  # TF Serving's --rest_api_timeout_in_ms
_CORS = [("Access-Control-Allow-Origin", "*"), ("Access-Control-Allow-Methods", "POST, GET"),
         ("Access-Control-Allow-Headers", "Content-Type")]


def default_num_threads():
    """TF Serving's default for --rest_api_num_threads: 4 per schedulable CPU."""
    return 4 * len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        4 * (os.cpu_count() or 1)


def error_body(message):
    """An error answer's body, as TF Serving's MakeJsonFromStatus writes it."""
    return json_writer.to_bytes(json_writer.error(message))


# What TF Serving's HTTP server (libevent's evhttp_send_error) answers for a path no
# handler takes.
NOT_FOUND_HEADERS = [("Content-Type", "text/html; charset=ISO-8859-1")]
NOT_FOUND_BODY = (b"<HTML><HEAD>\n<TITLE>404 Not Found</TITLE>\n</HEAD><BODY>\n"
                  b"<H1>Not Found</H1>\n</BODY></HTML>\n")


def decode_arg(text):
    """A model name or label from the path, percent-decoded as TF Serving's DecodeArg
    (curl_easy_unescape: %XX only, `+` kept, bytes as they are). The path arrives as
    the HTTP server decoded its bytes (latin-1); the result is those bytes read as UTF-8,
    undecodable ones kept as surrogates (written back as the same bytes)."""
    try:
        raw = text.encode("latin-1")
    except UnicodeEncodeError:  # an in-process caller's str
        raw = text.encode("utf-8", "surrogateescape")
    return urllib.parse.unquote_to_bytes(raw).decode("utf-8", "surrogateescape")


def _spec(name, version, label):
    name = decode_arg(name) if name else name
    label = decode_arg(label) if label else None
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

    def __init__(self, service, metrics=None, monitoring_path=None,
                 timeout_ms=DEFAULT_TIMEOUT_MS, enable_cors=False, status_page=False):
        """timeout_ms: --rest_api_timeout_in_ms; a request's inference gets what is left
        of it as its deadline (core/deadlines.py: the session run is cancelled when it
        passes, and the request answered 504 DEADLINE_EXCEEDED); <= 0: none."""
        self._service = service
        self._headers = JSON_HEADERS + (_CORS if enable_cors else [])
        self._metrics = metrics
        self._monitoring_path = monitoring_path
        self._timeout_ms = timeout_ms
        self._timeout_source = "rest_api_timeout_in_ms=%d" % timeout_ms
        self._status_page = status_page  # --status_page (off: 404, as TF Serving)

    def handle(self, method, path, headers, body):
        """headers: a dict with lower-case keys (only "origin" is read)."""
        if self._monitoring_path and path == self._monitoring_path and \
                self._metrics is not None and method == "GET":
            return 200, [("Content-Type", "text/plain; version=0.0.4")], \
                self._metrics.render().encode()
        if self._status_page and method == "GET" and path.split("?", 1)[0] in \
                STATUS_PAGE_PATHS:
            return 200, [("Content-Type", "text/html; charset=utf-8"),
                         ("Cache-Control", "no-store")], self.status_page().encode("utf-8")
        if not _API_PATH.fullmatch(path):
            return 404, NOT_FOUND_HEADERS, NOT_FOUND_BODY
        if method == "OPTIONS":  # CORS preflight, as http_server.cc answers it: no body
            if not _ORIGIN.search(headers.get("origin", "")):
                return errors.ServingError(grpc.StatusCode.FAILED_PRECONDITION, "").http_status, \
                    self._headers, b""
            return 200, self._headers, b""
        try:
            return 200, self._headers, self._dispatch(method, path, body)
        except errors.ServingError as error:
            return error.http_status, self._headers, error_body(error.message)
        except user_errors.UserError as error:  # the request's fault, as it says: 400
            error = errors.invalid("%s", error)
            return error.http_status, self._headers, error_body(error.message)
        except Exception as error:  # pylint: disable=broad-except  (a bug, not the client's)
            logging.exception("REST %s %s failed", method, path)
            return 500, self._headers, error_body(errors.scrub_paths(
                "Internal error: %s: %s" % (type(error).__name__, error)))

    def status_page(self):
        """The HTML status page: every model's versions and states, the last minute's
        traffic and the batch scheduler's state (serving/observability/status_page.py)."""
        manager = self._service.manager
        models = {}
        for name in manager.model_names:
            try:
                models[name] = [(version, state, message) for version, state, message, _
                                in self._service.status(name)]
            except errors.ServingError:
                models[name] = []
        failing = {component: failure.message for component, failure
                   in manager.health.failing().items()}
        batcher = self._service.batcher
        batching = None if batcher is None else {
            "problem": batcher.problem(), "thread_failures": list(batcher.thread_failures),
            "learners": batcher.learners()}
        monitor = getattr(self._service, "drift", None)
        return status_page.render(models, self._service.window.summary(), failing=failing,
                                  batching=batching,
                                  drift=monitor.results() if monitor is not None else None)

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
            deadline = deadlines.Deadline.after_ms(self._timeout_ms, self._timeout_source)
            with self._service.admitted(len(body or b""), name, verb, "REST"), \
                    self._service.observe(name, verb, "REST") as call:
                return handler(name, version, label, rest_json.parse_body(body), call,
                               deadline)
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

    def _predict(self, name, version, label, body, call, deadline):
        given = rest_json.signature_name(body, "")
        decoded = {}

        def decode(sig):
            """The JSON, read against the signature of the version that runs it (one
            servable lookup per request, as gRPC)."""
            decoded["feeds"], decoded["rows"] = rest_json.predict_feeds(
                body, sig, given, self._service.max_request_elements)
            return decoded["feeds"]

        served, sig_name, outputs = self._service.predict(
            name, version, label, given or service_lib.DEFAULT_SIGNATURE, decode,
            api="rest_predict", deadline=deadline)
        feeds, row_format = decoded["feeds"], decoded["rows"]
        call.version, call.signature = served, sig_name
        self._service.log_request(name, "predict", lambda: _logged(
            protos.predict_pair(name, served, sig_name, feeds, outputs)))
        return rest_json.predict_response(outputs, row_format)

    def _classify(self, name, version, label, body, call, deadline):
        sig_name = rest_json.signature_name(body, service_lib.DEFAULT_SIGNATURE)
        examples = rest_json.serialized_examples(body)
        served, sig_name, classes, scores = self._service.classify(
            name, version, label, sig_name, examples, deadline)
        call.version, call.signature = served, sig_name
        self._service.log_request(name, "classify", lambda: _logged(
            protos.classify_pair(name, served, sig_name, examples, classes, scores)))
        return rest_json.classify_response(classes, scores)

    def _regress(self, name, version, label, body, call, deadline):
        sig_name = rest_json.signature_name(body, service_lib.DEFAULT_SIGNATURE)
        examples = rest_json.serialized_examples(body)
        served, sig_name, values = self._service.regress(name, version, label, sig_name,
                                                         examples, deadline)
        call.version, call.signature = served, sig_name
        self._service.log_request(name, "regress", lambda: _logged(
            protos.regress_pair(name, served, sig_name, examples, values)))
        return rest_json.regress_response(values)
