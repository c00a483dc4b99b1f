"""A request's deadline, carried from the front end to the session run.

TF Serving turns a gRPC deadline (and REST's --rest_api_timeout_in_ms) into the session
run's RunOptions.timeout_in_ms (prediction_service_impl.cc, http_rest_api_handler.cc), so
a request that runs out of time is cancelled inside TensorFlow and stops using a core;
the batching layer runs a batch with the latest deadline of its tasks
(batching_session.cc). `Deadline` is that time, measured on this process's monotonic
clock from when the front end received the request.
"""
import math
import time

import grpc

from slimserve.serving.core import errors

# TF Serving's answer when every task of a batch ran out of time in the queue.
QUEUE_TIMEOUT = "Run() timeout exceeded while waiting in batching queue"


class Deadline:
    """When a request must be answered by; `source` names what set it (a flag or the
    client's gRPC deadline), for the error a client gets."""
    __slots__ = ("at", "source")

    def __init__(self, seconds, source):
        self.at = time.monotonic() + seconds
        self.source = source

    @classmethod
    def from_grpc(cls, context):
        """The client's deadline of a gRPC call, or None when it set none."""
        remaining = context.time_remaining()
        # grpcio reports "no deadline" as None or as a huge number of seconds
        if remaining is None or remaining > 10 ** 8:
            return None
        return cls(max(remaining, 0.0), "the client's gRPC deadline")

    @classmethod
    def after_ms(cls, timeout_ms, source):
        """A deadline `timeout_ms` from now; None for a timeout <= 0 (none)."""
        return cls(timeout_ms / 1000.0, source) if timeout_ms and timeout_ms > 0 else None

    def remaining(self):
        """Seconds left (negative once past)."""
        return self.at - time.monotonic()

    def timeout_in_ms(self):
        """What RunOptions.timeout_in_ms gets: the milliseconds left, rounded up; 0 when
        none are left (callers refuse to start the run then)."""
        return max(0, math.ceil(self.remaining() * 1000.0))

    def exceeded(self, detail="Deadline Exceeded"):
        return errors.ServingError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   "%s (%s)" % (detail, self.source))


def latest(deadlines):
    """The latest of `deadlines`, or None when any is None (a task without a deadline
    makes its batch run without one, as batching_session.cc does)."""
    chosen = None
    for deadline in deadlines:
        if deadline is None:
            return None
        if chosen is None or deadline.at > chosen.at:
            chosen = deadline
    return chosen
