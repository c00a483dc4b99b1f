"""Serving: closed-loop gRPC load at concurrency 1, 8, 32 with batch-1 image requests,
with and without server-side batching, against in-process session.run of the same
SavedModel with the same number of threads, measured in the same rounds; the
concurrency-1 overhead against the bare-grpcio floor (idle and with the cores busy); and
the maximum request rate on a trivial model against bare grpcio and waitress.

    make bench-serve        (python benchmarks/bench_serve.py --help)

The server runs in its own process (slimserve-server, memory-capped), as in production;
the load generator is serving/tools/loadtest.py (benchmarks/request_rate.py for the rate rows).
These machines are noisy, so every comparison is made side by side: in-process, served
without and with batching take turns in every round (the order rotating, all servers up
all along), the concurrency-1 overhead is the median difference of interleaved request
pairs, and --baseline_root serves another checkout's code as extra rows of the same run.
"""
import argparse
import contextlib
import dataclasses
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request

import numpy as np

import common  # pylint: disable=wrong-import-order
import echo_server  # pylint: disable=wrong-import-order
import request_rate  # pylint: disable=wrong-import-order

from slimserve.cli import logs  # pylint: disable=wrong-import-order

logs.quiet_tensorflow()
import tensorflow as tf  # noqa: E402  pylint: disable=wrong-import-position

from slimserve.estimator import model  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import nets
from slimserve.export import signatures  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.export import verify
from slimserve.export import writer
from slimserve.serving.tools import client as client_lib  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.serving.tools import loadtest
from slimserve.serving.observability import metrics


def make_export(base, size):
    """A randomly initialised resnet_v1_50 exported like a trained one."""
    if writer.list_versions(base):
        return os.path.join(base, str(writer.list_versions(base)[-1]))
    config = model.ModelConfig(model_name="resnet_v1_50", num_classes=10,
                               class_names=[str(i) for i in range(10)])
    graph = tf.Graph()
    with graph.as_default():
        images = tf.compat.v1.placeholder(tf.float32, [None, size, size, 3])
        model.model_fn({"image": images}, tf.zeros([1], tf.int32), tf.estimator.ModeKeys.TRAIN,
                       dataclasses.asdict(config))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            checkpoint = tf.compat.v1.train.Saver().save(
                session, os.path.join(common.work_dir("serve_ckpt"), "model.ckpt"))
    serving = nets.preprocessing_spec("resnet_v1_50", size)
    return writer.write_saved_model(base, checkpoint, config, serving)


LOCAL = "in-process session.run"
OFF = "served, batching off"
ON = "served, batching on"
LOGGED = "served, batching off, logging %g"
BASELINE_OFF = "baseline code, batching off"
BASELINE_ON = "baseline code, batching on"


def _logging_rate(name):
    return float(name.rsplit(" ", 1)[1]) if name.startswith(LOGGED.split("%")[0]) else None


def load_session(export_dir):
    session = tf.compat.v1.Session(graph=tf.Graph())
    meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
    return session, meta


def run_in_process(session, meta, images, index, batch):
    """The in-process call the server is measured against: same images, same order
    as the load test's request `index`."""
    feed = {signatures.IMAGE_BYTES: np.array(
        [images[(index * batch + i) % len(images)] for i in range(batch)], dtype=object)}
    verify.run_signature(session, meta, signatures.DEFAULT, feed)


PREDICT = "/tensorflow.serving.PredictionService/Predict"


def predict_requests(images, model_name="resnet"):
    """One serialized PredictRequest per image, made before any timing: neither the
    served nor the bare-grpcio side pays client-side conversion in the measurement."""
    from tensorflow_serving.apis import predict_pb2  # pylint: disable=import-outside-toplevel
    out = []
    for image in images:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.inputs[signatures.IMAGE_BYTES].CopyFrom(tf.make_tensor_proto([image]))
        out.append(request.SerializeToString())
    return out


def paired_overhead(session, meta, target, images, pairs):
    """Alternates one in-process call and one gRPC Predict on the same image (order
    flipped every pair) so both see the same machine noise; -> medians in ms of
    in-process, gRPC, and of the per-pair difference, and the status-RPC round trip."""
    import grpc  # pylint: disable=import-outside-toplevel
    requests = predict_requests(images)
    channel = grpc.insecure_channel(target)
    call = channel.unary_unary(PREDICT)
    local, remote = [], []
    for index in range(pairs + 5):
        order = (0, 1) if index % 2 else (1, 0)
        for which in order:
            started = time.perf_counter()
            if which == 0:
                run_in_process(session, meta, images, index, 1)
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
    requests = predict_requests(images)
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
    export_dir = make_export(base, size)
    session, meta = load_session(export_dir)
    servers = {"new": start_server(base, False, None)}
    if baseline_root:
        servers["baseline"] = start_server(base, False, None, root=baseline_root)
    try:
        for _, target, _ in servers.values():
            client = client_lib.Client(target, retries=0)
            loadtest.run_level(client, images, 1, 10)
            client.close()
        for index in range(10):
            run_in_process(session, meta, images, index, 1)
        result = {"size": size}
        for name, (_, target, _) in servers.items():
            result[name] = paired_overhead(session, meta, target, images, pairs)
        service = result["new"][0] / 1e3
        result["floor_idle"] = transport_floor(images, service, pairs)
        result["floor_busy"] = transport_floor(images, service, pairs,
                                               BusyCores(export_dir, image_path))
    finally:
        for process, _, _ in servers.values():
            process.terminate()
            process.wait(timeout=30)
        session.close()
    return result


def tiny_model(base):
    """tests/tiny_models.py's SavedModel (inference costs ~nothing) under `base`."""
    sys.path.insert(0, os.path.join(common.ROOT, "tests"))
    import tiny_models  # pylint: disable=import-outside-toplevel
    if not writer.list_versions(base):
        tiny_models.write_tiny_model(base)
    return base


def request_rates(concurrency, seconds, rounds, baseline_root=None):
    """Maximum request rate on the tiny model at `concurrency`: gRPC Predict vs a bare
    grpcio server answering at once with a reply of the same size, REST predict vs
    waitress serving a do-nothing app with the same threads, alternating in every round.
    -> {row name: [rate per round]}, errors per row."""
    from tensorflow_serving.apis import predict_pb2  # pylint: disable=import-outside-toplevel
    from slimserve.serving.api import rest_api as rest  # pylint: disable=import-outside-toplevel
    base = tiny_model(os.path.join(common.WORK, "tiny_models", "tiny"))
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([[1.0, 2.0]], tf.float32))
    request = request.SerializeToString()
    body = json.dumps({"instances": [[1.0, 2.0]]}).encode()
    path = "/v1/models/tiny:predict"
    servers = {"new": start_server(base, False, None, model_name="tiny")}
    if baseline_root:
        servers["baseline"] = start_server(base, False, None, model_name="tiny",
                                           root=baseline_root)
    references = []
    try:
        import grpc  # pylint: disable=import-outside-toplevel
        channel = grpc.insecure_channel(servers["new"][1])
        reply_size = len(channel.unary_unary(PREDICT)(request, timeout=30))
        channel.close()
        rest_port = int(servers["new"][2].split(":")[2].split("/")[0])
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
        for name, (_, target, metrics_url) in servers.items():
            port = int(metrics_url.split(":")[2].split("/")[0])
            runs["grpc " + name] = (lambda target=target: request_rate.grpc_rate(
                target, PREDICT, request, concurrency, seconds))
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
        for process, _, _ in servers.values():
            process.terminate()
            process.wait(timeout=30)
    return rates, errors


def local_concurrent(session, meta, images, concurrency, requests, first_index):
    """The in-process reference at the same concurrency: `concurrency` threads each
    calling session.run with one image, `requests` calls in all (as the load test does)."""
    class InProcess:
        def predict(self, inputs, signature_name=None):
            del signature_name
            verify.run_signature(session, meta, signatures.DEFAULT,
                                 {signatures.IMAGE_BYTES: np.array(
                                     inputs[signatures.IMAGE_BYTES], dtype=object)})
    return loadtest.run_level(InProcess(), images, concurrency, requests,
                              first_index=first_index)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(base, batching, batch_file, logging_rate=None, model_name="resnet",
                 root=None, extra_args=()):
    """-> (process, gRPC target, metrics URL). With `logging_rate`, the model is served
    from a model config whose logging_config samples that share of requests to
    TFRecords (the request-logging cost rows). `root`: run another checkout's server
    (the baseline rows), else this one's. Capped at 6 GB of address space."""
    port, rest_port = _free_port(), _free_port()
    if logging_rate is None:
        models = ["--model_name", model_name, "--model_base_path", base]
    else:
        config = os.path.join(common.work_dir("serve_logging"), "models-%g.config" % logging_rate)
        with open(config, "w") as handle:
            handle.write(
                'model_config_list { config { name: "%s" base_path: "%s" '
                'model_platform: "tensorflow" logging_config { log_collector_config { '
                'type: "file" filename_prefix: "%s" } sampling_config { sampling_rate: %g '
                '} } } }\n' % (model_name, base, os.path.join(
                    common.work_dir("serve_logging"), "log-%g" % logging_rate), logging_rate))
        models = ["--model_config_file", config]
    argv = ["prlimit", "--as=6000000000", sys.executable, "-m", "slimserve.cli.server",
            "--port", str(port), "--rest_api_port", str(rest_port)] + models + [
            "--file_system_poll_wait_seconds", "0", "--monitoring_config_file",
            os.path.join(common.ROOT, "serving", "tfserving", "monitoring.config")]
    if batching:
        argv += ["--enable_batching", "--batching_parameters_file", batch_file]
    argv += list(extra_args)
    env = dict(os.environ, PYTHONPATH=root or common.ROOT)
    process = subprocess.Popen(argv, cwd=root or common.ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=env)
    line = process.stdout.readline()  # "slimserve-server: gRPC ..." once it serves
    if not line.startswith("slimserve-server"):
        raise RuntimeError("server %s did not start (exit %s)" % (argv, process.wait()))
    return (process, "127.0.0.1:%d" % port,
            "http://127.0.0.1:%d%s" % (rest_port, metrics.PATH))


def batch_totals(metrics_url):
    """(rows, batches) the server's batcher has run so far, from its metrics."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        return metrics.batch_totals(response.read().decode())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image_size", type=int, default=224, help="Model input side.")
    parser.add_argument("--concurrency", default="1,8,32", help="Closed-loop clients.")
    parser.add_argument("--requests", type=int, default=200, help="Requests per level.")
    parser.add_argument("--rounds", type=int, default=3,
                        help="Alternations of in-process and served timing per level.")
    parser.add_argument("--pairs", type=int, default=150,
                        help="Interleaved in-process/gRPC pairs for the concurrency-1 overhead.")
    parser.add_argument("--logging_rates", default="1.0,0.01",
                        help="Request-logging sampling rates measured as extra rows (each a "
                             "server with that logging_config; '' for none).")
    parser.add_argument("--max_batch_size", type=int, default=8,
                        help="Server batching: largest batch.")
    parser.add_argument("--batch_timeout_micros", type=int, default=2000,
                        help="Server batching: longest wait for a batch to fill.")
    parser.add_argument("--num_batch_threads", type=int, default=2,
                        help="Server batching: batches run at the same time.")
    parser.add_argument("--sections", default="table,overhead,rate",
                        help="Which parts to run: table (the concurrency rows), overhead "
                             "(concurrency-1 overhead vs the bare-grpcio floor, idle and "
                             "busy, at --overhead_sizes), rate (maximum request rate on a "
                             "trivial model vs bare grpcio / waitress).")
    parser.add_argument("--overhead_sizes", default="32,224",
                        help="Model input sides the concurrency-1 overhead is measured at.")
    parser.add_argument("--rate_concurrency", type=int, default=32,
                        help="Requests in flight for the request-rate rows.")
    parser.add_argument("--rate_seconds", type=float, default=4.0,
                        help="Seconds per request-rate measurement.")
    parser.add_argument("--baseline_root", default="",
                        help="A checkout of other code (e.g. `git worktree add /tmp/base "
                             "HEAD~1`) whose server runs as extra rows side by side.")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    args.logging_rates = [float(r) for r in args.logging_rates.split(",") if r]
    if args.rounds < 1 or args.requests < args.rounds or args.pairs < 1:
        parser.error("--rounds and --pairs must be >= 1 and --requests >= --rounds "
                     "(got %d, %d, %d)" % (args.rounds, args.pairs, args.requests))
    import make_photos  # pylint: disable=import-outside-toplevel
    photos = common.work_dir("photos")
    if not os.listdir(photos):
        make_photos.write_photos(photos, 400)
    images = loadtest.load_images(photos)[:64]
    image_path = sorted(os.path.join(photos, f) for f in os.listdir(photos))[0]
    if os.path.isdir(image_path):
        image_path = os.path.join(image_path, sorted(os.listdir(image_path))[0])
    if "rate" in sections:
        rate_section(args)
    if "overhead" in sections:
        overhead_section(args, images, image_path)
    if "table" in sections:
        table_section(args, images)


def table_section(args, images):
    """The concurrency rows (and, with --baseline_root, the previous code's)."""
    base = os.path.join(common.WORK, "serve_models_%d" % args.image_size)
    export_dir = make_export(base, args.image_size)
    batch_file = os.path.join(common.WORK, "batching.config")
    with open(batch_file, "w") as handle:
        handle.write("max_batch_size { value: %d }\nbatch_timeout_micros { value: %d }\n"
                     "max_enqueued_batches { value: 1000 }\nnum_batch_threads { value: %d }\n"
                     % (args.max_batch_size, args.batch_timeout_micros, args.num_batch_threads))
    levels = [int(c) for c in args.concurrency.split(",")]
    session, meta = load_session(export_dir)
    kinds = [OFF, ON] + [LOGGED % rate for rate in args.logging_rates] + (
        [BASELINE_OFF, BASELINE_ON] if args.baseline_root else [])
    servers = {name: start_server(base, name in (ON, BASELINE_ON), batch_file,
                                  _logging_rate(name),
                                  root=args.baseline_root if name in (
                                      BASELINE_OFF, BASELINE_ON) else None)
               for name in kinds}
    rows, logging_notes = [], []
    try:
        clients = {name: client_lib.Client(target, retries=0)
                   for name, (_, target, _) in servers.items()}
        for client in clients.values():
            loadtest.run_level(client, images, 2, 10)  # warm the channel and the model
        for level in levels:
            per_round = args.requests // args.rounds
            totals_before = {name: batch_totals(servers[name][2])
                             for name in (ON, BASELINE_ON) if name in servers}
            seen = {name: {"latencies": [], "rates": [], "errors": 0}
                    for name in [LOCAL] + kinds}

            def measure(name, round_index, level=level, per_round=per_round, seen=seen):
                first = round_index * args.requests
                if name == LOCAL:
                    result = local_concurrent(session, meta, images, level, per_round, first)
                else:
                    result = loadtest.run_level(clients[name], images, level, per_round,
                                                first_index=first)
                seen[name]["latencies"] += result["latencies_ms"]
                seen[name]["rates"].append(result["images_per_s"])
                seen[name]["errors"] += sum(result["errors"].values())

            order = [LOCAL] + kinds
            for round_index in range(args.rounds):
                # every kind takes its turn in every round, the order rotating, so no row
                # gains from running first or last on this drifting machine
                turn = round_index % len(order)
                for name in order[turn:] + order[:turn]:
                    measure(name, round_index)
            mean_batch = {}
            for name, before in totals_before.items():
                after = batch_totals(servers[name][2])
                batches = after[1] - before[1]
                mean_batch[name] = ("%.2f" % ((after[0] - before[0]) / batches)
                                    if batches else "")
            local_rates = np.array(seen[LOCAL]["rates"])
            for rate in args.logging_rates:
                logging_notes.append(
                    "request logging at sampling %g, concurrency %d: %.2f of the throughput "
                    "without logging (median of per-round ratios)" % (
                        rate, level, np.median(np.array(seen[LOGGED % rate]["rates"]) /
                                               np.array(seen[OFF]["rates"]))))
            for name in [LOCAL] + kinds:
                latencies = seen[name]["latencies"]
                rates = np.array(seen[name]["rates"])
                rows.append([
                    name, level, "%.2f" % np.percentile(latencies, 50),
                    "%.2f" % np.percentile(latencies, 90), "%.2f" % np.percentile(latencies, 99),
                    "%.1f" % np.median(rates), mean_batch.get(name, ""),
                    seen[name]["errors"], "%.2f" % np.median(rates / local_rates)])
        for client in clients.values():
            client.close()
    finally:
        for process, _, _ in servers.values():
            process.terminate()
            process.wait(timeout=30)
    session.close()
    common.table("batch-1 requests, closed loop, %dx%d (%d cores; %d rounds, order rotating)"
                 % (args.image_size, args.image_size, os.cpu_count(), args.rounds),
                 ["path", "concurrency", "p50 ms", "p90 ms", "p99 ms", "img/s", "mean batch",
                  "errors", "vs in-process"], rows)
    print("(img/s: median over the rounds; vs in-process: median over the rounds of img/s "
          "/ the in-process img/s of the same round, %s, same concurrency)" % LOCAL)
    print("\n".join([""] + logging_notes))


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


if __name__ == "__main__":
    main()
