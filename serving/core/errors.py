"""Errors that carry a gRPC status code, mapped to HTTP statuses like TF Serving's REST API.

What a client reads never names the server's files: absolute paths in a message become
`.../<last component>` (scrub_paths); the server log keeps the full message.
"""
import logging
import re

import grpc

# TF Serving's ToHTTPStatusCode (model_servers/http_server.cc); anything else is 500.
_HTTP = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
}


class ServingError(Exception):
    """A request failure with the status TF Serving would return."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.full_message = message  # for the server log only
        self.message = scrub_paths(message)  # what gRPC and REST clients are sent
        if self.message != message:
            logging.warning("%s (client sees: %s)", message, self.message)

    @property
    def http_status(self):
        return _HTTP.get(self.code, 500)


def invalid(message, *args):
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message % args if args else message)


def not_found(message, *args):
    return ServingError(grpc.StatusCode.NOT_FOUND, message % args if args else message)


def unavailable(message, *args):
    return ServingError(grpc.StatusCode.UNAVAILABLE, message % args if args else message)


def from_tf_error(error):
    """TensorFlow OpError -> ServingError with the same canonical code."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    mapping = {
        tf.errors.InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
        tf.errors.NotFoundError: grpc.StatusCode.NOT_FOUND,
        tf.errors.ResourceExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
        tf.errors.UnavailableError: grpc.StatusCode.UNAVAILABLE,
        tf.errors.DeadlineExceededError: grpc.StatusCode.DEADLINE_EXCEEDED,
        tf.errors.FailedPreconditionError: grpc.StatusCode.FAILED_PRECONDITION,
        tf.errors.OutOfRangeError: grpc.StatusCode.OUT_OF_RANGE,
    }
    message = _clean(getattr(error, "message", str(error)))
    for kind, code in mapping.items():
        if isinstance(error, kind):
            return ServingError(code, message)
    return ServingError(grpc.StatusCode.INTERNAL, message)


def from_undecodable_tf_error(error):
    """A UnicodeDecodeError raised by a session run -> INVALID_ARGUMENT with TF's message.

    TensorFlow builds the Python exception from the C++ status's message as UTF-8; when
    an op quotes request bytes that are not UTF-8 (ParseExample's "Could not parse example
    input, value: '...'") that decoding fails before the status code is read. Ops quote
    their input only when refusing it, which TF does with INVALID_ARGUMENT."""
    raw = error.object if isinstance(error.object, bytes) else bytes(error.object)
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                        _clean(raw.decode("utf-8", "backslashreplace")))


def _clean(message):
    """Keeps what TF says went wrong; drops the graph-node and traceback decoration."""
    lines = [line.strip() for line in message.splitlines()]
    kept = [line for line in lines if line and line != "Graph execution error:"
            and not line.startswith(("[[", "Detected at node", "Original stack trace",
                                     "File ", "Node:"))]
    return " ".join(kept[:2]) if kept else message


# An absolute path: "/" + at least one more component, starting at a boundary (start,
# whitespace, quote, "(", "=", ":" or ","), optionally behind a URL scheme (file://,
# gs://, ...); it runs to the next whitespace, quote, comma, ";" or ")".
_PATH = re.compile(r"(?:(?<=^)|(?<=[\s'\"(=:,\[]))"
                   r"(?:[A-Za-z][A-Za-z0-9+.-]*:/)?(?:/[^\s'\"/,;()\[\]]*)+")
# REST routes the client itself sent ("Malformed request: POST /v1/models/x:predict").
_ROUTES = ("/v1/", "/monitoring/")


def scrub_paths(message):
    """Replaces each absolute path in `message` by `.../<its last component>` (what
    failed stays readable: `.../saved_model.pb`), so clients learn nothing about the
    server's file system."""
    def shorten(match):
        text = match.group(0)
        if text.startswith(_ROUTES) or (text.count("/") < 2 and "://" not in text):
            return text  # "/" or "/v1" alone: not worth hiding, often an HTTP route
        tail = text.rstrip("/").rsplit("/", 1)[-1]
        return ".../" + tail if tail else "..."
    return _PATH.sub(shorten, message)
