"""Which HTTP server library carries the REST API: waitress (WSGI, event loop for sockets,
thread pool for the app) against aiohttp (asyncio, app run in a thread pool), side by side
in one run. Each serves the same RestApi over the tiny test model, in its own process (bound to a
port the kernel picks, which it prints: no port is picked, closed and hoped for); the
project's one load generator (serving/clients/loadtest.py through benchmarks/request_rate.py)
keeps `concurrency` keep-alive connections busy for `--seconds` per cell.

    PYTHONPATH=$PWD python benchmarks/rest_server_libraries.py --seconds 5

Cells: a trivial GET answered without the model, and the tiny model's :predict.
"""
import argparse
import json
import socket
import sys
import tempfile
import threading

import request_rate  # pylint: disable=wrong-import-order

from slimserve.serving.clients import loadtest  # pylint: disable=wrong-import-order

_PREDICT = json.dumps({"instances": [[1.0, 2.0]]}).encode()
_TRIVIAL = b'{"ok": true}\n'


def _service(model_dir):
    from slimserve.serving.config import model_config  # pylint: disable=import-outside-toplevel
    from slimserve.serving.core import manager as manager_lib  # pylint: disable=import-outside-toplevel
    from slimserve.serving.core import inference as service
    manager = manager_lib.ModelManager([model_config.ServedModel("tiny", model_dir)],
                                       manager_lib.ManagerOptions(warmup=False))
    manager.poll()
    return service.InferenceService(manager)


def _serve_waitress(model_dir):
    from slimserve.serving.api import http_server  # pylint: disable=import-outside-toplevel
    server = http_server.RestServer(_service(model_dir), "127.0.0.1", 0)
    api_app = server._server.application  # pylint: disable=protected-access

    def app(environ, start_response):
        if environ["PATH_INFO"] == "/trivial":
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(_TRIVIAL)))])
            return [_TRIVIAL]
        return api_app(environ, start_response)

    server._server.application = app  # pylint: disable=protected-access
    server.start()
    print(server.port, flush=True)
    threading.Event().wait()


def _serve_aiohttp(model_dir):
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
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(128)
    print(listening.getsockname()[1], flush=True)  # listening before the parent connects
    web.run_app(app, sock=listening, print=None, access_log=None)


def _load(port, path, body, concurrency, seconds):
    """Requests per second of `concurrency` keep-alive clients for `seconds` (POST with a
    body, else GET); RuntimeError when any answer was not 200."""
    with request_rate.HttpSender(port, path, body) as send:
        result = loadtest.run_level(None, None, concurrency, None, seconds, send=send)
    if result["errors"]:
        raise RuntimeError("failed requests: %s" % result["errors"])
    return result["requests_per_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--serve", choices=["waitress", "aiohttp"])
    parser.add_argument("--model_dir")
    args = parser.parse_args()
    if args.serve:
        return (_serve_waitress if args.serve == "waitress" else _serve_aiohttp)(
            args.model_dir)
    from slimserve.testing import tiny_models  # pylint: disable=import-outside-toplevel
    with tempfile.TemporaryDirectory() as tmp:
        tiny_models.write_tiny_model(tmp)
        rows = []
        for library in ("waitress", "aiohttp"):
            server, port = request_rate.start_reference(
                "rest_server_libraries.py", "--serve", library, "--model_dir", tmp)
            try:
                _load(port, "/v1/models/tiny:predict", _PREDICT, 4, 1.0)  # warm up
                for name, path, body in (("trivial GET", "/trivial", None),
                                         ("tiny :predict", "/v1/models/tiny:predict",
                                          _PREDICT)):
                    for concurrency in (8, 32):
                        rate = _load(port, path, body, concurrency, args.seconds)
                        rows.append((library, name, concurrency, rate))
                        print("%-9s %-14s c=%-3d %8.0f req/s" % rows[-1], flush=True)
            finally:
                request_rate.stop(server)
    return 0


if __name__ == "__main__":
    from slimserve import cpu  # pylint: disable=g-import-not-at-top
    print(cpu.describe(), flush=True)  # a figure of speed means little without its CPU
    sys.exit(main())
