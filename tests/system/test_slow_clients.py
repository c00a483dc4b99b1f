"""REST under slow clients, over real sockets against a real slimserve-server under a
memory cap: trickling connections (slowloris) never lock valid clients out, and every
request being received has a header deadline and a minimum data rate."""
import http.client
import json
import select
import socket
import subprocess
import threading
import time

import pytest

from slimserve.testing import tiny_models
from slimserve.testing.servers import wait_until
from tests.helpers import start_server_process, stop_process

TRICKLERS = 262  # past the default --rest_connection_limit=256, as the attack that found it
HEADER_TIMEOUT = 12  # longer than the valid clients' 5 s timeouts: only shedding lets them in


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("slow_clients") / "tiny")
    tiny_models.write_tiny_model(base)
    return base


def _get(port, path="/v1/models/tiny", timeout=5):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _answer(sock):
    """What the server sent before closing, b"" if nothing; None while still open."""
    sock.setblocking(False)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    except BlockingIOError:
        return None
    except OSError:
        return data


class _Trickle:
    """One thread sending the next byte of `data` on every socket every `interval` s, but
    never to a socket the server has answered or closed: a byte arriving after the
    server's close makes it reset the connection, which discards the answer unread (a
    clean-clone CI run lost a 408 so when the shedding came late)."""

    def __init__(self, sockets, data, interval):
        self.sockets, self.data, self.interval = sockets, data, interval
        self.answered = set()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _newly_answered(self):
        poller = select.poll()  # not select(): the worker's descriptors may pass 1024
        for sock in self.sockets:
            if sock.fileno() not in self.answered:
                poller.register(sock, select.POLLIN)
        return {fd for fd, _ in poller.poll(0)}

    def _run(self):
        index = 0
        while not self.stopped.is_set() and index < len(self.data):
            self.answered |= self._newly_answered()
            for sock in self.sockets:
                if sock.fileno() in self.answered:
                    continue
                try:
                    sock.send(self.data[index:index + 1])
                except OSError:
                    pass
            index += 1
            self.stopped.wait(self.interval)

    def stop(self):
        self.stopped.set()
        self.thread.join(10)


@pytest.mark.cost(18)
def test_trickling_clients_never_lock_out_rest(tiny_base):
    """262 connections sending a byte every 5 s left 0 of 3 valid GETs answered in 15 s:
    at the limit the slowest partial requests now make room (408, naming the flag), the
    rest miss the header deadline, a body trickled below the minimum rate is dropped, and
    an upload that is slow but above the minimum rate is answered."""
    process, _, rest_port = start_server_process(
        ["--model_name=tiny", "--model_base_path=%s" % tiny_base,
         "--file_system_poll_wait_seconds=0",
         "--rest_header_timeout_seconds=%d" % HEADER_TIMEOUT],
        prefix=["prlimit", "--as=%d" % (4 * 1024 ** 3)], stderr=subprocess.DEVNULL)
    sockets, trickles = [], []
    try:
        for _ in range(TRICKLERS):
            sock = socket.socket()
            sock.settimeout(10)
            sock.connect(("127.0.0.1", rest_port))  # past the limit: the kernel's backlog
            sockets.append(sock)
        trickles.append(_Trickle(sockets, b"GET /v1/models/tiny HTTP/1.1\r\nHost: x\r\n", 5))
        body = json.dumps({"instances": [[1.0, 2.0]]}).encode()
        slow_body = socket.create_connection(("127.0.0.1", rest_port), timeout=10)
        slow_body.sendall(b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body))
        trickles.append(_Trickle([slow_body], body, 1))
        padded = json.dumps({"instances": [[1.0, 2.0]]}).encode() + b" " * 30000
        uploader = socket.create_connection(("127.0.0.1", rest_port), timeout=60)
        uploader.sendall(b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(padded))
        upload = threading.Thread(target=lambda: [  # ~2.7 KB/s for ~11 s
            (uploader.sendall(padded[i:i + 1500]), time.sleep(0.5))
            for i in range(0, len(padded), 1500)], daemon=True)
        upload.start()
        time.sleep(1)  # every trickler has sent its first byte

        for _ in range(3):
            status, answer = _get(rest_port)
            assert status == 200 and answer["model_version_status"][0]["state"] == "AVAILABLE"
        trickles[0].stop()

        answers = {}

        def all_closed():
            for index, sock in enumerate(sockets):
                if index not in answers:
                    answer = _answer(sock)
                    if answer is not None:
                        answers[index] = answer
            return len(answers) == len(sockets)

        wait_until(all_closed, timeout=HEADER_TIMEOUT + 20, interval=0.5,
                   message="the server to drop every trickling connection")
        shed = [a for a in answers.values() if b"--rest_connection_limit=256" in a]
        late = [a for a in answers.values()
                if b"--rest_header_timeout_seconds=%d" % HEADER_TIMEOUT in a]
        # At the limit the server closes idle connections first, silently, as any idle
        # keep-alive connection (http_server.make_room): a trickler whose first byte it
        # had not read yet (a loaded machine) reads b"".
        idle = [a for a in answers.values() if a == b""]
        assert all(a == b"" or a.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
                   for a in answers.values()), sorted({a[:40] for a in answers.values()})
        assert shed and len(shed) + len(late) + len(idle) == TRICKLERS, \
            (len(shed), len(late), len(idle))

        dropped = wait_until(lambda: _answer(slow_body), timeout=30, interval=0.5,
                             message="the body trickler to be dropped")
        assert dropped.startswith(b"HTTP/1.1 408") and \
            b"--rest_min_request_bytes_per_second=1024" in dropped, dropped

        upload.join(30)
        uploader.settimeout(30)
        response = http.client.HTTPResponse(uploader)
        response.begin()
        assert response.status == 200
        assert json.loads(response.read()) == {"predictions": [{"y": [5.5],
                                                                 "doubled": [2.0, 4.0]}]}
        assert _get(rest_port)[0] == 200
        assert process.poll() is None, "server died"
    finally:
        for trickle in trickles:
            trickle.stop()
        for sock in sockets:
            sock.close()
        stop_process(process)
