"""The REST API's HTTP transport: waitress carrying rest_api.RestApi as a WSGI app.

Apart from the routes, as TF Serving keeps http_server apart from http_rest_api_handler.

Why waitress: one event loop holds every connection (an idle or slow client costs a
socket, not a thread), a fixed pool of `num_threads` runs the app, bodies are read in full
(Content-Length or chunked, capped at `max_body_bytes`) before a thread is taken, and
there are idle timeouts and a connection limit (http.server's thread per connection has
none of these). docs/serving.md has the measurements that chose it.
"""
import logging
import socket
import ssl
import threading
import time
import urllib.parse

import waitress.channel
import waitress.parser
import waitress.server
import waitress.task

from slimserve.serving.api import rest_api


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Payload Too Large",
            429: "Too Many Requests", 500: "Internal Server Error", 501: "Not Implemented",
            503: "Service Unavailable", 504: "Gateway Timeout"}


def wsgi_app(api):
    """The WSGI entry point of `api` (a RestApi): reads the (already fully buffered) body
    and answers with what api.handle returns."""

    def app(environ, start_response):
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
    timeout_ms: --rest_api_timeout_in_ms, the deadline of each request's inference
        (cancelled and answered 504 past it; <=0: none).
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
        threads = num_threads or rest_api.default_num_threads()
        if min(connection_limit, max_body_bytes, idle_timeout_seconds,
               read_timeout_seconds) < 1:
            raise ValueError("REST connection_limit, max_body_bytes, idle_timeout_seconds and "
                             "read_timeout_seconds must be positive")
        self.api = rest_api.RestApi(service, metrics, monitoring_path, timeout_ms,
                                    enable_cors)
        self._server = _Server(
            wsgi_app(self.api), host=address, port=port, threads=threads,
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


def make_server(service, address, port, metrics=None, monitoring_path=None, **kwargs):
    """A bound (not yet serving) REST server; call start(), later stop(grace)."""
    return RestServer(service, address, port, metrics, monitoring_path, **kwargs)
