"""Maximum request rate of a gRPC or HTTP server at a fixed concurrency, measured with the
project's one load generator (serving/clients/loadtest.py `run_level`, time-bounded with a
warm-up) through a light `send`: gRPC requests serialized once and sent as bytes over a
bare channel (no client-side conversion), HTTP requests over one keep-alive connection
per client.

Also starts the bare references the served rates are compared with: a grpcio server
that answers at once (benchmarks/echo_server.py with 0 s) and waitress serving a WSGI
app that does nothing (benchmarks/noop_wsgi.py), both in their own processes.
"""
import http.client
import os
import subprocess
import sys
import threading

import grpc

from slimserve.serving.clients import loadtest

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_MESSAGE = 256 * 2 ** 20


class GrpcSender:
    """send(index): one unary call of `method` with requests[index % len(requests)]
    (serialized bytes in, bytes out) on one shared channel; raises grpc.RpcError."""

    def __init__(self, target, method, requests, timeout=30.0):
        self.channel = grpc.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE)])
        self._call = self.channel.unary_unary(method)
        self._requests, self._timeout = list(requests), timeout

    def __call__(self, index):
        return self._call(self._requests[index % len(self._requests)], timeout=self._timeout)

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class HttpStatusError(Exception):
    """An HTTP answer other than 200."""


class HttpSender:
    """send(index): POST `body` to `path` (GET without a body) over the calling thread's
    own keep-alive connection, reopened after a failure; raises for a status other than
    200 or a broken connection."""

    def __init__(self, port, path, body=None, timeout=30.0):
        self.port, self.path, self.body, self.timeout = port, path, body, timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections = []

    def _connection(self):
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPConnection("127.0.0.1", self.port,
                                                    timeout=self.timeout)
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    def __call__(self, index):
        del index
        connection = self._connection()
        try:
            if self.body is None:
                connection.request("GET", self.path)
            else:
                connection.request("POST", self.path, self.body,
                                   {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
        except (OSError, http.client.HTTPException):
            connection.close()
            self._local.connection = None
            raise
        if response.status != 200:
            raise HttpStatusError(response.status)

    def close(self):
        with self._lock:
            for connection in self._connections:
                connection.close()
            self._connections = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def rate(send, concurrency, seconds, warmup):
    """(requests per second over `seconds` after `warmup`, errors) of `send` kept
    `concurrency` in flight by the closed-loop load generator."""
    result = loadtest.run_level(None, None, concurrency, None, warmup + seconds, send=send,
                                warmup_seconds=warmup)
    return result["requests_per_s"], sum(result["errors"].values())


def grpc_rate(target, method, request_bytes, concurrency, seconds):
    """Requests per second of `method` on `target` with `concurrency` calls always in
    flight for `seconds` (after a short warm-up); -> (rate, errors)."""
    with GrpcSender(target, method, [request_bytes]) as send:
        return rate(send, concurrency, seconds, min(1.0, seconds / 4))


def http_rate(port, path, body, concurrency, seconds):
    """Requests per second of POST `path` with `concurrency` keep-alive clients; ->
    (rate, errors)."""
    with HttpSender(port, path, body) as send:
        return rate(send, concurrency, seconds, 0.5)


def start_reference(script, *args):
    """Starts benchmarks/<script> (which prints its port, then serves) -> (process, port)."""
    process = subprocess.Popen([sys.executable, os.path.join(HERE, script)] +
                               [str(a) for a in args], stdout=subprocess.PIPE, text=True)
    return process, int(process.stdout.readline().strip())


def stop(process):
    process.kill()
    process.wait(timeout=30)
