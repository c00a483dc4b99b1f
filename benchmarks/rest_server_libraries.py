"""Which HTTP server library carries the REST API: waitress (WSGI, event loop for sockets,
thread pool for the app) against aiohttp (asyncio, app run in a thread pool), side by side
in one run. Each serves the same RestApi over the tiny test model, in its own process; a
client process keeps `concurrency` keep-alive connections busy for `--seconds` per cell.

    PYTHONPATH=$PWD python benchmarks/rest_server_libraries.py --seconds 5

Cells: a trivial GET answered without the model, and the tiny model's :predict.
"""
import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

_PREDICT = json.dumps({"instances": [[1.0, 2.0]]}).encode()
_TRIVIAL = b'{"ok": true}\n'


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _service(model_dir):
    from slimserve.serving.config import model_config  # pylint: disable=import-outside-toplevel
    from slimserve.serving.core import manager as manager_lib  # pylint: disable=import-outside-toplevel
    from slimserve.serving.core import inference as service
    manager = manager_lib.ModelManager([model_config.ServedModel("tiny", model_dir)],
                                       manager_lib.ManagerOptions(warmup=False))
    manager.poll()
    return service.InferenceService(manager)


def _serve_waitress(model_dir, port):
    from slimserve.serving.api import http_server  # pylint: disable=import-outside-toplevel
    server = http_server.RestServer(_service(model_dir), "127.0.0.1", port)
    api_app = server._server.application  # pylint: disable=protected-access

    def app(environ, start_response):
        if environ["PATH_INFO"] == "/trivial":
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(_TRIVIAL)))])
            return [_TRIVIAL]
        return api_app(environ, start_response)

    server._server.application = app  # pylint: disable=protected-access
    server.start()
    print("ready", flush=True)
    threading.Event().wait()


def _serve_aiohttp(model_dir, port):
    import asyncio  # pylint: disable=import-outside-toplevel
    import concurrent.futures  # pylint: disable=import-outside-toplevel
    from aiohttp import web  # pylint: disable=import-outside-toplevel
    from slimserve.serving.api import rest_api as rest  # pylint: disable=import-outside-toplevel
    api = rest.RestApi(_service(model_dir))
    pool = concurrent.futures.ThreadPoolExecutor(rest.default_num_threads())

    async def trivial(request):
        del request
        return web.Response(body=_TRIVIAL, content_type="application/json")

    async def api_handler(request):
        body = await request.read()
        status, headers, payload = await asyncio.get_running_loop().run_in_executor(
            pool, api.handle, request.method, request.raw_path.split("?")[0],
            {"origin": request.headers.get("Origin", "")}, body)
        return web.Response(status=status, body=payload, headers=dict(headers))

    app = web.Application(client_max_size=64 * 2 ** 20)
    app.router.add_get("/trivial", trivial)
    app.router.add_route("*", "/{tail:.*}", api_handler)
    print("ready", flush=True)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _load(port, path, body, concurrency, seconds):
    counts = [0] * concurrency
    failures = []
    stop = time.monotonic() + seconds

    def worker(index):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while time.monotonic() < stop:
            conn.request("POST" if body else "GET", path, body=body)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                failures.append(response.status)
                return
            counts[index] += 1
        conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError("non-200 answers: %s" % failures[:5])
    return sum(counts) / (time.monotonic() - started)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--serve", choices=["waitress", "aiohttp"])
    parser.add_argument("--model_dir")
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    if args.serve:
        return (_serve_waitress if args.serve == "waitress" else _serve_aiohttp)(
            args.model_dir, args.port)
    from slimserve.testing import tiny_models  # pylint: disable=import-outside-toplevel
    with tempfile.TemporaryDirectory() as tmp:
        tiny_models.write_tiny_model(tmp)
        rows = []
        for library in ("waitress", "aiohttp"):
            port = _free_port()
            server = subprocess.Popen(
                [sys.executable, __file__, "--serve", library, "--model_dir", tmp,
                 "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True)
            try:
                assert server.stdout.readline().strip() == "ready"
                deadline = time.monotonic() + 60
                while True:  # aiohttp binds after printing; wait for the port
                    try:
                        socket.create_connection(("127.0.0.1", port), 1).close()
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)
                _load(port, "/v1/models/tiny:predict", _PREDICT, 4, 1.0)  # warm up
                for name, path, body in (("trivial GET", "/trivial", None),
                                         ("tiny :predict", "/v1/models/tiny:predict",
                                          _PREDICT)):
                    for concurrency in (8, 32):
                        rate = _load(port, path, body, concurrency, args.seconds)
                        rows.append((library, name, concurrency, rate))
                        print("%-9s %-14s c=%-3d %8.0f req/s" % rows[-1], flush=True)
            finally:
                server.kill()
                server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
