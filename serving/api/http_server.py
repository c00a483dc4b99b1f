"""The REST API's HTTP transport: waitress carrying rest_api.RestApi as a WSGI app.

Apart from the routes, as TF Serving keeps http_server apart from http_rest_api_handler.

Why waitress: one event loop holds every connection (an idle or slow client costs a
socket, not a thread), a fixed pool of `num_threads` (RestOptions) runs the app, bodies
are read in full (Content-Length or chunked, capped at `max_body_bytes`) before a thread
is taken, and there are idle timeouts and a connection limit (http.server's thread per
connection has none of these). docs/serving.md has the measurements that chose it.

Slow clients (slowloris): a request's headers must arrive within `header_timeout_seconds`
of its first byte, after that it must keep an average of `min_request_bytes_per_second`,
and all of it must arrive within `read_timeout_seconds`; a request that misses one of these
gets a 408 naming the flag and loses its connection. At the connection limit idle
connections are closed first; while a new connection waits and none is idle, the slowest
partial requests (fewest bytes per second since their first byte) are; connections whose
request is queued or running are never shed. docs/reliability.md states the guarantee.
"""
import dataclasses
import logging
import select
import socket
import ssl
import threading
import time
import urllib.parse

import waitress.channel
import waitress.parser
import waitress.server
import waitress.task

from slimserve import fields
from slimserve.serving import limits
from slimserve.serving.api import rest_api


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 408: "Request Timeout",
            413: "Payload Too Large",
            429: "Too Many Requests", 500: "Internal Server Error", 501: "Not Implemented",
            503: "Service Unavailable", 504: "Gateway Timeout"}


def request_target(environ):
    """The request's path with its query and fragment, still percent-encoded: what TF
    Serving's routes match (its uri_path() is evhttp's path, `?query` and `#fragment`),
    so `/v1/models/m:predict?x=1` is a malformed request there and here."""
    target = environ.get("REQUEST_URI") or environ.get("PATH_INFO") or "/"
    if not target.startswith("/"):  # absolute form: http://host:port/path?query
        parts = urllib.parse.urlsplit(target)
        target = target[len(parts.scheme) + 3 + len(parts.netloc):] if parts.netloc \
            else target
    return target or "/"


def wsgi_app(api):
    """The WSGI entry point of `api` (a RestApi): reads the (already fully buffered) body
    and answers with what api.handle returns."""

    def app(environ, start_response):
        path = request_target(environ)
        method = environ["REQUEST_METHOD"]
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0  # waitress has already refused a malformed Content-Length
        body = environ["wsgi.input"].read(length) if length > 0 else b""
        headers = {"origin": environ.get("HTTP_ORIGIN", "")}
        try:
            status, response_headers, payload = api.handle(method, path, headers, body)
        except Exception as error:  # pylint: disable=broad-except
            logging.exception("REST %s %s failed", method, path)
            status, response_headers = 500, rest_api.JSON_HEADERS
            payload = rest_api.error_body("Internal error: %s" % error)
        start_response("%d %s" % (status, _REASONS.get(status, "Error")),
                       response_headers + [("Content-Length", str(len(payload)))])
        return [payload]

    return app


class _JsonErrorTask(waitress.task.ErrorTask):
    """waitress's own refusals (bad Content-Length, too large, bad chunking) as JSON."""

    def execute(self):
        error = self.request.error
        self.status = "%d %s" % (error.code, error.reason)
        body = rest_api.error_body("%s: %s" % (error.reason, error.body))
        self.response_headers.extend(rest_api.JSON_HEADERS)
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class _TimedParser(waitress.parser.HTTPRequestParser):
    """Remembers when a request's first byte arrived and how many bytes have come since,
    for the header and read timeouts and the minimum data rate."""

    def __init__(self, adj):
        super().__init__(adj)
        self.started = time.monotonic()
        self.bytes_received = 0

    def received(self, data):
        consumed = super().received(data)
        self.bytes_received += consumed
        return consumed

    def rate(self, now):
        """Average bytes per second since the first byte."""
        return self.bytes_received / max(now - self.started, 1e-3)


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


def _partial(channel):
    """The request this connection is still receiving, when nothing of it is queued or
    running (a pipelined request behind a running one waits on us, not on its client)."""
    request = channel.request
    if request is None or channel.requests or channel.will_close:
        return None
    return request


def _refuse(channel, message):
    """Answers 408 with a JSON error (best effort: the client may not read it) and closes
    the connection; only for a connection with nothing queued, running or unsent."""
    body = rest_api.error_body(message)
    head = ("HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)).encode("ascii")
    if not channel.total_outbufs_len:
        with channel.outbuf_lock:
            channel.outbufs[-1].append(head + body)
            channel.current_outbuf_count += len(head) + len(body)
            channel.total_outbufs_len += len(head) + len(body)
    channel.will_close = True


class _Server(waitress.server.TcpWSGIServer):
    """waitress's TCP server, plus: deadlines and a minimum data rate for requests being
    received; at the connection limit the longest-idle connections are closed to make room,
    and while a connection waits to be accepted and none is idle, the slowest partial
    requests; and a drain for graceful stops."""

    channel_class = _Channel
    read_timeout_seconds = 60
    header_timeout_seconds = 10
    min_request_bytes_per_second = 1024
    ssl_context = None
    connection_limit = 256  # as the flag says (waitress's map also holds 2 internal sockets)
    _next_deadline_check = 0.0
    _overflow_logged = 0.0
    shed = 0  # connections closed at the connection limit, for the log line

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

    def late_reason(self, request, now):
        """Why a request still being received is out of time, or None."""
        elapsed = now - request.started
        if elapsed > self.read_timeout_seconds:
            return ("request not received in full within --rest_read_timeout_seconds=%d"
                    % self.read_timeout_seconds)
        if elapsed > self.header_timeout_seconds:
            if not request.headers_finished:
                return ("request headers not received within --rest_header_timeout_seconds=%d"
                        % self.header_timeout_seconds)
            if request.rate(now) < self.min_request_bytes_per_second:
                return ("request arriving at %.0f bytes/s, below "
                        "--rest_min_request_bytes_per_second=%d"
                        % (request.rate(now), self.min_request_bytes_per_second))
        return None

    def enforce_deadlines(self, now):
        """Drops every request being received that is out of time (see late_reason). The
        clock of a request waiting behind a queued or running one restarts: the server,
        not its client, is holding it up."""
        for channel in list(self.active_channels.values()):
            request = channel.request
            if request is None or channel.will_close:
                continue
            if channel.requests:
                request.started, request.bytes_received = now, 0
                continue
            reason = self.late_reason(request, now)
            if reason is not None:
                _refuse(channel, reason)

    def _connection_waiting(self):
        """A client waits in the listening socket's backlog."""
        poller = select.poll()
        try:
            poller.register(self.socket, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return False

    def make_room(self, now):
        """At the limit: close the longest-idle connections; if none is idle and a client
        waits, the partial requests arriving slowest (a flood is cleared in a few turns of
        the loop, 1/16 of the candidates each)."""
        idle = sorted((c for c in self.active_channels.values()
                       if not c.will_close and _idle(c)), key=lambda c: c.last_activity)
        if idle:
            victims = idle[:max(1, len(idle) // 16)]
        else:
            if not self._connection_waiting():
                return
            partial = sorted((c for c in self.active_channels.values() if _partial(c)),
                             key=lambda c: c.request.rate(now))
            victims = partial[:max(1, len(partial) // 16)]
            for channel in victims:
                _refuse(channel, "request dropped at --rest_connection_limit=%d: it was "
                        "among the slowest arriving" % self.connection_limit)
        for channel in victims:
            channel.will_close = True
        self.shed += len(victims)
        if victims and now - self._overflow_logged > 60:
            self._overflow_logged = now
            logging.warning("REST: at --rest_connection_limit=%d; %d connection(s) closed "
                            "to make room so far (idle first, then the slowest requests)",
                            self.connection_limit, self.shed)

    def readable(self):
        """Called by the loop every turn (at least once a second): the idle timeout
        (waitress's maintenance) and the request deadlines are enforced, room is made at
        the limit, and no connection is accepted past it. (waitress's own readable() logs
        every crossing of the limit, which a flood would turn into a log flood.)"""
        now = time.monotonic()
        if now >= self._next_deadline_check:
            self._next_deadline_check = now + 1.0
            self.enforce_deadlines(now)
        wall = time.time()
        if wall >= self.next_channel_cleanup:
            self.next_channel_cleanup = wall + self.adj.cleanup_interval
            self.maintenance(wall)
        if not self.accepting:
            return False
        if len(self._map) >= self.adj.connection_limit:
            self.make_room(now)
            return False
        return True

    def drain_step(self):
        """Runs in the loop thread: stop listening, close connections with nothing in
        flight; requests being read, queued or answered carry on."""
        if self.accepting:
            self.accepting = False
            waitress.server.wasyncore.dispatcher.close(self)  # the listening socket only
        for channel in list(self.active_channels.values()):
            if _idle(channel):
                channel.will_close = True


@dataclasses.dataclass
class RestOptions:
    """The REST front end's settings: its part of the server's flags (each field names its
    flag; ModelServer builds it from ServerOptions), checked once by RestServer."""
    num_threads: int = fields.option(
        rest_api.default_num_threads(), "App threads (4 per CPU, as TF Serving).",
        bound=limits.THREADS, flag="rest_api_num_threads")
    timeout_ms: int = fields.option(
        rest_api.DEFAULT_TIMEOUT_MS, "The deadline of each request's inference: cancelled "
        "and answered 504 past it.", bound=limits.MILLISECONDS,
        flag="rest_api_timeout_in_ms")
    max_body_bytes: int = fields.option(
        64 * 2 ** 20, "Larger bodies get 413 before they are read.", bound=limits.BYTES,
        flag="rest_max_body_bytes")
    connection_limit: int = fields.option(
        256, "Open connections; at it, while a client waits, the longest-idle connections "
        "are closed, or else the slowest partial requests.",
        bound=fields.Bound(1, limits.MAX_CONNECTIONS), flag="rest_connection_limit")
    idle_timeout_seconds: int = fields.option(
        30, "A connection with no request in flight and no bytes moving for this long is "
        "closed (waitress checks every idle_timeout/2, at least each second).",
        bound=limits.SECONDS, flag="rest_idle_timeout_seconds")
    read_timeout_seconds: int = fields.option(
        60, "A request not received in full this long after its first byte gets 408 and "
        "loses its connection.", bound=limits.SECONDS, flag="rest_read_timeout_seconds")
    header_timeout_seconds: int = fields.option(
        10, "The same for a request whose headers are not in this long after its first "
        "byte.", bound=limits.SECONDS, flag="rest_header_timeout_seconds")
    min_request_bytes_per_second: int = fields.option(
        1024, "The same for a request that, past header_timeout_seconds, has arrived "
        "slower than this on average (0: no minimum rate).",
        bound=fields.Bound(0, limits.MAX_BYTES_PER_SECOND),
        flag="rest_min_request_bytes_per_second")
    enable_cors: bool = fields.option(False, "Add TF Serving's CORS headers to every /v1 "
                                      "answer.", flag="rest_api_enable_cors_support")
    status_page: bool = fields.option(
        False, "Serve the HTML status page at / and /status (every model's versions and "
        "the last minute's traffic: it tells any REST client what the server serves); "
        "off, those paths are 404 as in TF Serving.")


class RestServer:
    """The REST front end: a bound waitress server driven by one loop thread.

    options: a RestOptions (default: its defaults). ssl_context: serve HTTPS with it
    (--ssl_config_file; TF Serving's REST has no TLS). monitoring_path: where the
    Prometheus metrics are served (None: not served).
    """

    def __init__(self, service, address, port, metrics=None, monitoring_path=None,
                 options=None, ssl_context=None):
        options = fields.check(options if options is not None else RestOptions())
        self.options = options
        self.api = rest_api.RestApi(service, metrics, monitoring_path, options.timeout_ms,
                                    options.enable_cors, options.status_page)
        self._server = _Server(
            wsgi_app(self.api), host=address, port=port, threads=options.num_threads,
            # the map also holds the listening socket and the wake-up pipe
            connection_limit=options.connection_limit + 2,
            channel_timeout=options.idle_timeout_seconds,
            cleanup_interval=max(1, options.idle_timeout_seconds // 2),
            max_request_body_size=options.max_body_bytes, asyncore_use_poll=True,
            ident="slimserve", expose_tracebacks=False, clear_untrusted_proxy_headers=False)
        self._server.read_timeout_seconds = options.read_timeout_seconds
        self._server.header_timeout_seconds = options.header_timeout_seconds
        self._server.connection_limit = options.connection_limit
        self._server.min_request_bytes_per_second = options.min_request_bytes_per_second
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
        return drained and not dispatcher.threads


def make_server(service, address, port, metrics=None, monitoring_path=None, options=None,
                ssl_context=None):
    """A bound (not yet serving) REST server; call start(), later stop(grace)."""
    return RestServer(service, address, port, metrics, monitoring_path, options,
                      ssl_context)
