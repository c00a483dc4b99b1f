"""bench-serve's `overhead` section: what serving adds at concurrency 1, against what
Python gRPC alone costs. Interleaved pairs of an in-process session.run and a gRPC
Predict of the same JPEG (order flipped every pair) give the overhead; a bare grpcio
server (benchmarks/echo_server.py) sleeping the in-process model time gives the floor,
measured idle and while another process keeps the cores busy running the model.

    python benchmarks/bench_serve.py --sections=overhead --overhead_sizes=32,224
"""
import contextlib
import os
import struct
import subprocess
import sys
import time

import numpy as np

import common  # pylint: disable=wrong-import-order
import echo_server  # pylint: disable=wrong-import-order
import request_rate  # pylint: disable=wrong-import-order
import serve_harness as harness  # pylint: disable=wrong-import-order

from slimserve.serving.clients import client as client_lib  # pylint: disable=wrong-import-order
from slimserve.serving.clients import loadtest  # pylint: disable=wrong-import-order


def paired_overhead(session, meta, target, images, pairs):
    """Alternates one in-process call and one gRPC Predict on the same image (order
    flipped every pair) so both see the same machine noise; -> medians in ms of
    in-process, gRPC, and of the per-pair difference, and the status-RPC round trip."""
    import grpc  # pylint: disable=import-outside-toplevel
    requests = harness.predict_requests(images)
    channel = grpc.insecure_channel(target)
    call = channel.unary_unary(harness.PREDICT)
    local, remote = [], []
    for index in range(pairs + 5):
        order = (0, 1) if index % 2 else (1, 0)
        for which in order:
            started = time.perf_counter()
            if which == 0:
                harness.run_in_process(session, meta, images, index, 1)
            else:
                call(requests[index % len(images)], timeout=30)
            (local if which == 0 else remote).append(time.perf_counter() - started)
    channel.close()
    local, remote = np.array(local[5:]) * 1e3, np.array(remote[5:]) * 1e3
    status = []
    client = client_lib.Client(target, retries=0)
    for _ in range(100):
        started = time.perf_counter()
        client.status()
        status.append(time.perf_counter() - started)
    client.close()
    return (float(np.median(local)), float(np.median(remote)),
            float(np.median(remote - local)), float(np.median(status) * 1e3))


_BUSY = """
import sys
import numpy as np
import tensorflow as tf
session = tf.compat.v1.Session(graph=tf.Graph())
meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], sys.argv[1])
sig = meta.signature_def["serving_default"]
feed = {sig.inputs["image_bytes"].name: np.array([open(sys.argv[2], "rb").read()], object)}
fetches = [t.name for t in sig.outputs.values()]
session.run(fetches, feed)
print("busy", flush=True)
while True:
    session.run(fetches, feed)
"""


class BusyCores:
    """Keeps TensorFlow running the model back to back in another process (all cores
    busy, as when the server's own model runs) while the block runs."""

    def __init__(self, export_dir, image_path):
        self._argv = [sys.executable, "-c", _BUSY, export_dir, image_path]
        self._process = None

    def __enter__(self):
        self._process = subprocess.Popen(self._argv, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True)
        self._process.stdout.readline()  # "busy" once it runs
        return self

    def __exit__(self, *exc):
        request_rate.stop(self._process)


def transport_floor(images, service_seconds, pairs, busy=None):
    """Median round trip minus handler time of a bare grpcio server that sleeps the
    in-process model time, for the same serialized PredictRequests: what Python gRPC
    alone costs. With `busy` (a BusyCores), measured while TensorFlow keeps the cores
    busy."""
    import grpc  # pylint: disable=import-outside-toplevel
    requests = harness.predict_requests(images)
    process, port = request_rate.start_reference("echo_server.py", service_seconds)
    try:
        channel = grpc.insecure_channel("127.0.0.1:%d" % port)
        call = channel.unary_unary(echo_server.METHOD)
        extra = []
        with busy or contextlib.nullcontext():
            for index in range(pairs + 5):
                started = time.perf_counter()
                handler_seconds, = struct.unpack_from(
                    "<d", call(requests[index % len(images)], timeout=30))
                extra.append(time.perf_counter() - started - handler_seconds)
        channel.close()
    finally:
        request_rate.stop(process)
    return float(np.median(extra[5:]) * 1e3)


def overhead_at(size, images, image_path, pairs, baseline_root=None):
    """Concurrency-1 overhead of the served model at `size` (batching off) next to the
    bare-grpcio floor measured idle and with the cores busy -> dict of ms figures. With
    `baseline_root`, the same pairs against a server running that checkout's code."""
    base = os.path.join(common.WORK, "serve_models_%d" % size)
    export_dir = harness.make_export(base, size)
    session, meta = harness.load_session(export_dir)
    servers = {}
    try:
        servers["new"] = harness.start_server(base)
        if baseline_root:
            servers["baseline"] = harness.start_server(base, root=baseline_root)
        for server in servers.values():
            client = client_lib.Client(server.address, retries=0)
            loadtest.run_level(client, images, 1, 10)
            client.close()
        for index in range(10):
            harness.run_in_process(session, meta, images, index, 1)
        result = {"size": size}
        for name, server in servers.items():
            result[name] = paired_overhead(session, meta, server.address, images, pairs)
        service = result["new"][0] / 1e3
        result["floor_idle"] = transport_floor(images, service, pairs)
        result["floor_busy"] = transport_floor(images, service, pairs,
                                               BusyCores(export_dir, image_path))
    finally:
        for server in servers.values():
            server.stop()
        session.close()
    return result


def overhead_section(args, images, image_path):
    """Concurrency-1 overhead against the bare-grpcio floor, idle and busy, per size."""
    rows = []
    for size in [int(x) for x in args.overhead_sizes.split(",") if x]:
        result = overhead_at(size, images, image_path, args.pairs, args.baseline_root)
        local, remote, overhead, status = result["new"]
        rows.append(["%dx%d" % (size, size), "%.2f" % local, "%.2f" % remote,
                     "%+.2f" % overhead, "%.2f" % result["floor_idle"],
                     "%.2f" % result["floor_busy"], "%.2f" % (overhead / result["floor_idle"]),
                     "%.2f" % (overhead / result["floor_busy"]), "%.2f" % status,
                     "%+.2f" % result["baseline"][2] if "baseline" in result else ""])
    common.table("concurrency 1, %d interleaved pairs (in-process session.run, then gRPC "
                 "Predict of the same JPEG, order flipped every pair), batching off"
                 % args.pairs,
                 ["model", "in-process p50 ms", "served p50 ms", "overhead ms (median of "
                  "pairs)", "floor idle ms", "floor busy ms", "overhead / floor idle",
                  "overhead / floor busy", "GetModelStatus ms", "baseline overhead ms"], rows)
    print("(floor: a bare grpcio server sleeping the in-process p50, the same serialized "
          "requests; round trip minus its handler time, median; 'busy': while another "
          "process runs the model back to back. Target: overhead <= 2x the floor.)")
