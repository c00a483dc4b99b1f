"""Errors that carry a gRPC status code, mapped to HTTP statuses like TF Serving's REST API."""
import grpc

_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.INTERNAL: 500,
}


class ServingError(Exception):
    """A request failure with the status TF Serving would return."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message

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


def _clean(message):
    """Keeps what TF says went wrong; drops the graph-node and traceback decoration."""
    lines = [line.strip() for line in message.splitlines()]
    kept = [line for line in lines if line and line != "Graph execution error:"
            and not line.startswith(("[[", "Detected at node", "Original stack trace",
                                     "File ", "Node:"))]
    return " ".join(kept[:2]) if kept else message
