"""The gRPC channel a client opens, and whether a server answers on it.

Needs grpcio only (no TensorFlow), so slimserve-client can tell "nothing is listening" in
a fraction of a second, before it pays for importing TensorFlow. It tells apart:

- nothing listening (connection refused, no such socket file, unknown host): reported
  once `connect_timeout` has passed without a server appearing;
- a port that accepted the connection but has not answered gRPC yet (slimserve-server
  binds its port before it has loaded its models): waited for up to `start_timeout`.

A server that answers but is not ready to serve (UNAVAILABLE while a model loads) is the
client's retry policy's business, not this module's.
"""
import threading
import time

import grpc

DEFAULT_MESSAGE_BYTES = 256 * 1024 * 1024  # gRPC's 4 MB default trips image batches
# Failures that mean a peer accepted the connection and may still answer (a server that
# is starting); any other failure means nothing is there to answer.
_STILL_STARTING = ("timeout", "timed out", "deadline", "handshake")
_PROBE = "/grpc.health.v1.Health/Check"  # any method: only the transport's answer matters


class ServerUnreachable(ConnectionError):
    """No gRPC server answers at the target; the message says what to do."""


def options(max_message_bytes=DEFAULT_MESSAGE_BYTES):
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)]


def open_channel(target, max_message_bytes=DEFAULT_MESSAGE_BYTES):
    return grpc.insecure_channel(target, options=options(max_message_bytes))


def wait_for_server(target, connect_timeout=1.0, start_timeout=30.0):
    """Returns once a gRPC server at `target` completes a connection; raises
    ServerUnreachable when nothing listens there for `connect_timeout` seconds, or when
    what listens gives no gRPC answer within `start_timeout` seconds."""
    started = time.monotonic()
    channel = grpc.insecure_channel(target, options=[
        # Retry a refused connection every 0.2-1 s, not gRPC's 1-120 s, while we wait.
        ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 1000)])
    changed = threading.Condition()
    state = [grpc.ChannelConnectivity.IDLE]

    def on_change(new_state):
        with changed:
            state[0] = new_state
            changed.notify_all()

    channel.subscribe(on_change, try_to_connect=True)
    try:
        while True:
            elapsed = time.monotonic() - started
            with changed:
                current = state[0]
                if current not in (grpc.ChannelConnectivity.READY,
                                   grpc.ChannelConnectivity.TRANSIENT_FAILURE) and \
                        elapsed < start_timeout:
                    changed.wait(min(0.1, start_timeout - elapsed))
                    continue
            if current == grpc.ChannelConnectivity.READY:
                return
            reason = _probe(channel)
            if reason is None:
                return  # answered between the state change and the probe
            if elapsed >= start_timeout:
                raise ServerUnreachable(
                    "%s accepted the connection but no gRPC server answered within %g s (%s): "
                    "is it the gRPC port (8500 by default; 8501 is REST)? A server that is "
                    "still loading its models answers once loaded: wait, or raise --timeout"
                    % (target, start_timeout, reason))
            if elapsed >= connect_timeout and not any(
                    word in reason.lower() for word in _STILL_STARTING):
                raise ServerUnreachable(_unreachable(target, reason))
            with changed:
                if state[0] == current:
                    changed.wait(0.1)
    finally:
        channel.unsubscribe(on_change)
        channel.close()


def _unreachable(target, reason):
    lowered = reason.lower()
    if "http1" in lowered:
        return ("%s answers HTTP/1, not gRPC (%s): is it the REST port? Point --server at "
                "the gRPC port (8500 by default)" % (target, reason))
    if "refused" in lowered or "no such file" in lowered:
        return ("nothing is listening on %s (%s): start slimserve-server (or "
                "tensorflow_model_server) there, or point --server at its gRPC port (8500 by "
                "default); --connect_timeout waits longer for one that is starting"
                % (target, reason))
    return ("cannot reach a gRPC server at %s (%s): check --server; --connect_timeout "
            "waits longer" % (target, reason))


def _probe(channel):
    """None if a server answers (whatever it answers), else why the transport failed: the
    last words of gRPC's message, e.g. "Connection refused"."""
    try:
        channel.unary_unary(_PROBE)(b"", timeout=1.0, wait_for_ready=False)
    except grpc.RpcError as error:
        if error.code() not in (grpc.StatusCode.UNAVAILABLE,
                                grpc.StatusCode.DEADLINE_EXCEEDED):
            return None  # UNIMPLEMENTED, NOT_FOUND, ...: a server answered
        details = error.details() or error.code().name
        return details.rsplit(": ", 1)[-1].strip(" []") or details
    return None
