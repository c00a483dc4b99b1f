"""bench-serve's `rate` section: the maximum request rate on a trivial model (the tiny
SavedModel: inference costs nothing, the server's own per-request work shows), gRPC
Predict against a bare grpcio server answering at once with a reply of the same size,
REST predict against waitress serving a do-nothing app with the same threads, alternating
in every round.

    python benchmarks/bench_serve.py --sections=rate --rate_concurrency=32 --rate_seconds=4
"""
import json
import urllib.request

import numpy as np

import common  # pylint: disable=wrong-import-order
import echo_server  # pylint: disable=wrong-import-order
import request_rate  # pylint: disable=wrong-import-order
import serve_harness as harness  # pylint: disable=wrong-import-order


def request_rates(concurrency, seconds, rounds, baseline_root=None):
    """Maximum request rate on the tiny model at `concurrency`: gRPC Predict vs a bare
    grpcio server answering at once with a reply of the same size, REST predict vs
    waitress serving a do-nothing app with the same threads, alternating in every round.
    -> {row name: [rate per round]}, errors per row."""
    from slimserve.serving.api import rest_api as rest  # pylint: disable=import-outside-toplevel
    base, request = harness.tiny_request()
    body = json.dumps({"instances": [[1.0, 2.0]]}).encode()
    path = "/v1/models/tiny:predict"
    servers, references = {}, []
    try:
        servers["new"] = harness.start_server(base, model_name="tiny")
        if baseline_root:
            servers["baseline"] = harness.start_server(base, model_name="tiny",
                                                       root=baseline_root)
        with request_rate.GrpcSender(servers["new"].address, harness.PREDICT,
                                     [request]) as send:
            reply_size = len(send(0))
        rest_port = servers["new"].rest_port
        with urllib.request.urlopen(urllib.request.Request(
                "http://127.0.0.1:%d%s" % (rest_port, path), body), timeout=30) as response:
            rest_reply = len(response.read())
        echo, echo_port = request_rate.start_reference("echo_server.py", 0, reply_size)
        references.append(echo)
        noop, noop_port = request_rate.start_reference(
            "noop_wsgi.py", rest.default_num_threads(), rest_reply)
        references.append(noop)
        runs = {"grpc echo": lambda: request_rate.grpc_rate(
            "127.0.0.1:%d" % echo_port, echo_server.METHOD, request, concurrency, seconds),
                "waitress no-op": lambda: request_rate.http_rate(
            noop_port, path, body, concurrency, seconds)}
        for name, server in servers.items():
            port = server.rest_port
            runs["grpc " + name] = (lambda target=server.address: request_rate.grpc_rate(
                target, harness.PREDICT, request, concurrency, seconds))
            runs["rest " + name] = (lambda port=port: request_rate.http_rate(
                port, path, body, concurrency, seconds))
        rates = {name: [] for name in runs}
        errors = {name: 0 for name in runs}
        order = list(runs)
        for round_index in range(rounds):
            turn = round_index % len(order)
            for name in order[turn:] + order[:turn]:
                rate, failed = runs[name]()
                rates[name].append(rate)
                errors[name] += failed
    finally:
        for process in references:
            request_rate.stop(process)
        for server in servers.values():
            server.stop()
    return rates, errors


def rate_section(args):
    """Maximum request rates on the trivial model against the bare references."""
    rates, errors = request_rates(args.rate_concurrency, args.rate_seconds, args.rounds,
                                  args.baseline_root)
    rows = []
    for name in ("grpc new", "grpc baseline", "grpc echo", "rest new", "rest baseline",
                 "waitress no-op"):
        if name not in rates:
            continue
        reference = None if name in ("grpc echo", "waitress no-op") else (
            "grpc echo" if name.startswith("grpc") else "waitress no-op")
        ratio = ("%.2f" % np.median(np.array(rates[name]) / np.array(rates[reference]))
                 if reference else "")
        rows.append([name, "%.0f" % np.median(rates[name]), errors[name], reference or "",
                     ratio])
    common.table("maximum request rate, tiny SavedModel, %d requests in flight, %d rounds "
                 "of %.0f s (order rotating)" % (args.rate_concurrency, args.rounds,
                                                 args.rate_seconds),
                 ["server", "requests/s", "errors", "reference", "vs reference (median of "
                  "per-round ratios)"], rows)
    print("(grpc echo: bare grpcio, same thread pool size, the same request bytes, a reply "
          "the size of the served one; waitress no-op: waitress with the REST API's threads "
          "answering a reply of the same size without parsing. Target >= 0.7.)")
