"""Serving: closed-loop gRPC load at concurrency 1, 8, 32 with batch-1 image requests,
with and without server-side batching, against in-process session.run of the same
SavedModel with the same number of threads, measured in the same rounds; the
concurrency-1 overhead against the bare-grpcio floor (idle and with the cores busy); the
maximum request rate on a trivial model against bare grpcio and waitress; and (section
`limit`) served throughput per precision (float32, --mixed_precision=bfloat16,
--xla_cpu_compilation_enabled) against the machine's limit, in-process session.run at its
best batch size in the same precision, with each precision's agreement with float32 on
the validation images of a trained digits model.

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
    """slimserve/testing/tiny_models.py's SavedModel (inference costs ~nothing) under `base`."""
    from slimserve.testing import tiny_models  # pylint: disable=import-outside-toplevel
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


DIGITS_STEPS = 300  # the trained model of the `limit` section (~97% accurate on digits)
PRECISION_FLAGS = {"fp32": [], "bf16": ["--mixed_precision=bfloat16"],
                   "xla": ["--xla_cpu_compilation_enabled"]}


def digits_model(steps=DIGITS_STEPS):
    """(data dir, model dir) of resnet_v1_50 trained on the digits at 32x32 with the
    test suite's flags (tests/conftest.py) for `steps` steps; made once under bench_out."""
    import make_digits  # pylint: disable=import-outside-toplevel
    root = common.work_dir("digits_%d" % steps)
    data, run = os.path.join(root, "data"), os.path.join(root, "run")
    if os.path.exists(os.path.join(root, "done")):
        return data, run
    images = os.path.join(root, "images")
    make_digits.write_digits(images, size=32)
    for argv in (["slimserve.cli.convert", "--input", images, "--output_dir", data,
                  "--overwrite", "--noprogress"],
                 ["slimserve.cli.train", "--data_dir", data, "--model_dir", run,
                  "--image_size", "32", "--max_steps", str(steps), "--batch_size", "32",
                  "--save_checkpoints_steps", str(steps), "--batch_norm_decay", "0.9",
                  "--optimizer", "adam", "--learning_rate", "0.001", "--opt_epsilon", "1e-8",
                  "--min_crop_area", "0.85", "--norandom_flip", "--eval_central_fraction",
                  "1.0", "--moving_average_decay", "0.99"]):
        subprocess.run([sys.executable, "-m"] + argv, check=True, cwd=common.ROOT)
    open(os.path.join(root, "done"), "w").close()
    return data, run


def trained_export(model_dir, size):
    """The trained digits checkpoint exported for `size`x`size` inputs (its own export at
    32; at 224 the same weights, the digits upscaled by the graph): -> base path."""
    import dataclasses as dc  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import preprocessing  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import run_files  # pylint: disable=import-outside-toplevel
    base = common.work_dir("%s_export_%d" % (os.path.basename(os.path.dirname(model_dir)),
                                             size))
    if not writer.list_versions(base):
        run = run_files.read(model_dir)
        spec = dc.replace(preprocessing.Spec.from_dict(run["serving"]), image_size=size)
        writer.write_saved_model(base, tf.train.latest_checkpoint(model_dir),
                                 run_files.model_config(run), spec)
    return base


def closed_loop(target, requests, concurrency, seconds, warmup=1.0):
    """`concurrency` clients each sending one serialized PredictRequest (cycling through
    `requests`) and the next as soon as it is answered, for `seconds` after `warmup`;
    a light client (futures, no client threads), so the server is what is measured.
    -> {"images_per_s", "p50_ms", "p99_ms", "errors", "latencies_ms"}."""
    import grpc  # pylint: disable=import-outside-toplevel
    import threading  # pylint: disable=import-outside-toplevel
    channel = grpc.insecure_channel(target, options=[
        ("grpc.max_receive_message_length", 256 * 2 ** 20)])
    call = channel.unary_unary(PREDICT)
    lock = threading.Condition()
    started = time.perf_counter()
    state = {"next": 0, "done": 0, "errors": 0, "open": concurrency, "latencies": [],
             "from": started + warmup, "until": started + warmup + seconds}

    def launch():
        with lock:
            index = state["next"]
            state["next"] += 1
        sent = time.perf_counter()
        future = call.future(requests[index % len(requests)], timeout=120)
        future.add_done_callback(lambda done: finish(done, sent))

    def finish(future, sent):
        now = time.perf_counter()
        with lock:
            if future.exception() is not None:
                state["errors"] += 1
            elif state["from"] <= now <= state["until"]:
                state["done"] += 1
                state["latencies"].append(now - sent)
            again = now < state["until"]
            if not again:
                state["open"] -= 1
                lock.notify_all()
        if again:
            launch()

    for _ in range(concurrency):
        launch()
    with lock:
        lock.wait_for(lambda: state["open"] == 0, timeout=warmup + seconds + 180)
    channel.close()
    latencies = np.array(state["latencies"] or [float("nan")]) * 1e3
    return {"images_per_s": state["done"] / seconds, "errors": state["errors"],
            "p50_ms": float(np.percentile(latencies, 50)),
            "p99_ms": float(np.percentile(latencies, 99)),
            "latencies_ms": latencies.tolist()}


class InProcessLimit:
    """The machine's limit for one precision: the export run in this process by
    serving's own Servable (cached session callables, the session config the server's
    flags make), one caller feeding batches of `batch` images back to back."""

    def __init__(self, export_dir, precision, images):
        from slimserve.serving import options as options_lib  # pylint: disable=import-outside-toplevel
        from slimserve.serving.config import session as session_lib  # pylint: disable=import-outside-toplevel
        from slimserve.serving.core import servable as servable_lib  # pylint: disable=import-outside-toplevel
        options = options_lib.ServerOptions(
            mixed_precision="bfloat16" if precision == "bf16" else "",
            xla_cpu_compilation_enabled=precision == "xla")
        self.servable = servable_lib.Servable("limit", 0, export_dir,
                                              session_lib.session_config(options))
        _, self.signature = self.servable.signature(signatures.DEFAULT)
        self.outputs = sorted(self.signature.outputs)
        self.images = images
        self.batch = None

    def rate(self, batch, seconds):
        feeds = {signatures.IMAGE_BYTES: np.array(
            [self.images[i % len(self.images)] for i in range(batch)], dtype=object)}
        self.servable.run(self.signature, feeds, self.outputs)  # (XLA compiles per shape)
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            self.servable.run(self.signature, feeds, self.outputs)
            done += batch
        return done / (time.perf_counter() - started)

    def probabilities(self, images):
        return np.concatenate([self.servable.run(self.signature, {
            signatures.IMAGE_BYTES: np.array(images[i:i + 32], dtype=object)},
            [signatures.PROBABILITIES])[signatures.PROBABILITIES]
            for i in range(0, len(images), 32)])

    def close(self):
        self.servable.retire()


def served_probabilities(target, images):
    client = client_lib.Client(target, retries=0)
    try:
        return np.concatenate([client.predict({signatures.IMAGE_BYTES: images[i:i + 8]})[
            signatures.PROBABILITIES] for i in range(0, len(images), 8)])
    finally:
        client.close()


def parse_variants(texts):
    """["NAME[@LEVELS]=FLAGS", ...] -> [(name, precision, [flags], levels or None)]; the
    precision (fp32, bf16, xla) is read off the flags; LEVELS (e.g. @8 or @8,16) limits
    the variant's rows to those concurrencies (a config tuned for one); FLAGS may start
    with @DIR: that checkout's server."""
    variants = []
    for text in texts:
        name, _, flags = text.partition("=")
        name, _, levels = name.partition("@")
        flags = flags.split()
        precision = ("bf16" if "--mixed_precision=bfloat16" in flags else
                     "xla" if any(f.startswith("--xla_cpu_compilation_enabled") and
                                  not f.endswith("false") for f in flags) else "fp32")
        levels = [int(x) for x in levels.split(",")] if levels else None
        for other in variants:  # one row per name and concurrency, or the table is ambiguous
            if other[0] == name.strip() and (levels is None or other[3] is None or
                                             set(levels) & set(other[3])):
                raise SystemExit("--variant %r: another variant named %r has rows at the "
                                 "same concurrency; give it other @LEVELS or another name"
                                 % (text, other[0]))
        variants.append((name.strip(), precision, flags, levels))
    return variants


def limit_section(args, photos):
    """Served throughput against the in-process best-batch limit per precision, with the
    agreement column, at every --limit_sizes; one table per size."""
    data_dir, model_dir = digits_model(args.digits_steps)
    from slimserve.estimator import schema  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import splits  # pylint: disable=import-outside-toplevel
    digits = splits.read_images(data_dir, schema.VALIDATION)[0]
    variants = parse_variants(args.variant)
    for size in [int(x) for x in args.limit_sizes.split(",") if x]:
        base = trained_export(model_dir, size)
        export_dir = os.path.join(base, str(writer.list_versions(base)[-1]))
        images = (photos if size >= 96 else digits)[:64]  # what the load sends
        precisions = sorted({v[1] for v in variants} | {"fp32"},
                            key=list(PRECISION_FLAGS).index)
        limits = {p: InProcessLimit(export_dir, p, images) for p in precisions}
        servers = {}
        try:
            for index, (_, _, flags, _) in enumerate(variants):
                root = flags[0][1:] if flags and flags[0].startswith("@") else None
                servers[index] = start_server(base, False, None, root=root,
                                             extra_args=flags[1:] if root else flags)
            limit_table(args, size, variants, limits, servers, images, digits)
        finally:
            for process, _, _ in servers.values():
                process.terminate()
                process.wait(timeout=60)
            for limit in limits.values():
                limit.close()


def limit_table(args, size, variants, limits, servers, images, digits):
    batches = [int(b) for b in args.limit_batches.split(",")]
    levels = [int(c) for c in args.limit_concurrency.split(",")]
    # agreement with float32 on every validation digit, served end to end
    reference = limits["fp32"].probabilities(digits)
    agreement = {}
    for index in range(len(variants)):
        got = served_probabilities(servers[index][1], digits)
        agreement[index] = (float(np.mean(got.argmax(1) == reference.argmax(1))),
                           float(np.abs(got - reference).max()))
    for precision, limit in limits.items():
        got = limit.probabilities(digits)
        agreement["limit " + precision] = (float(np.mean(got.argmax(1) ==
                                                         reference.argmax(1))),
                                           float(np.abs(got - reference).max()))
    # each precision's best batch, searched once (the rounds then re-measure that one)
    for precision, limit in limits.items():
        rates = {b: limit.rate(b, args.limit_seconds / 2) for b in batches}
        limit.batch = max(rates, key=rates.get)
        limit.by_batch = rates
        print("%dx%d %s in-process img/s by batch: %s -> best %d" % (
            size, size, precision, ", ".join("%d: %.1f" % kv for kv in rates.items()),
            limit.batch), flush=True)
    requests = predict_requests(images)
    for _, target, _ in servers.values():  # warm each server at every batch size it forms
        closed_loop(target, requests, max(levels), 2.0, warmup=0.5)
    # a row: (name, precision, concurrency, variant index); a name may repeat across
    # variants tuned for different concurrencies ("fp32 tuned@8", "fp32 tuned@16"), so
    # servers and agreement are keyed by the variant's index, never by its name
    rows = [("limit", p, None, None) for p in limits] + [
        (name, precision, level, index) for level in levels
        for index, (name, precision, _, only) in enumerate(variants)
        if only is None or level in only]
    seen = {row: [] for row in rows}
    batch_rows = {}
    for round_index in range(args.rounds):
        turn = round_index % len(rows)
        for row in rows[turn:] + rows[:turn]:
            name, precision, level, index = row
            if level is None:
                limit = limits[precision]
                seen[row].append({"images_per_s": limit.rate(limit.batch, args.limit_seconds),
                                  "p50_ms": float("nan"), "p99_ms": float("nan"),
                                  "errors": 0, "latencies_ms": []})
                continue
            before = batch_totals(servers[index][2])
            seen[row].append(closed_loop(servers[index][1], requests, level,
                                         args.limit_seconds))
            after = batch_totals(servers[index][2])
            got = batch_rows.setdefault(row, [0, 0])
            got[0] += after[0] - before[0]
            got[1] += after[1] - before[1]
        print("round %d done" % (round_index + 1), flush=True)
    table = []
    for row in rows:
        name, precision, level, index = row
        rates = np.array([r["images_per_s"] for r in seen[row]])
        limit_rates = np.array([r["images_per_s"] for r in
                                seen[("limit", precision, None, None)]])
        fp32_row = ("limit", "fp32", None, None) if level is None else next(
            (r for r in rows if r[2] == level and r[1] == "fp32"
             and r[0].split()[1:] == name.split()[1:]), None)
        vs_fp32 = ("%.2f" % np.median(rates / np.array(
            [r["images_per_s"] for r in seen[fp32_row]])) if fp32_row else "")
        latencies = [x for r in seen[row] for x in r["latencies_ms"]]
        rows_batches = batch_rows.get(row)
        agree = agreement["limit " + precision if level is None else index]
        # c clients can form batches of at most c: the in-process rate at the best such
        # batch (from the search) is what serving could reach at that concurrency
        by_batch = limits[precision].by_batch
        reachable = max((r for b, r in by_batch.items() if level is None or b <= level),
                        default=float("nan")) / max(by_batch.values())
        table.append([
            "in-process, best batch %d" % limits[precision].batch if level is None else name,
            precision, level or "", "%.1f" % np.median(rates),
            "%.1f" % np.percentile(latencies, 50) if latencies else "",
            "%.1f" % np.percentile(latencies, 99) if latencies else "",
            "%.2f" % (rows_batches[0] / rows_batches[1]) if rows_batches and rows_batches[1]
            else "", sum(r["errors"] for r in seen[row]),
            "**%.2f**" % np.median(rates / limit_rates),
            "%.2f" % (np.median(rates / limit_rates) / reachable), vs_fp32,
            "%.4f" % agree[0], "%.4f" % agree[1]])
    common.table(
        "%dx%d, trained digits resnet_v1_50 (%d steps), batch-1 requests from closed-loop "
        "clients vs in-process session.run at its best batch (%d cores; %d rounds of "
        "%.0f s, order rotating)" % (size, size, args.digits_steps, os.cpu_count(),
        args.rounds, args.limit_seconds),
        ["path", "precision", "concurrency", "img/s", "p50 ms", "p99 ms", "mean batch",
         "errors", "vs limit", "vs batch <= c", "vs fp32", "agreement", "max |dp|"], table)
    print("(img/s: median over the rounds; vs limit: median of per-round img/s / the "
          "in-process best-batch img/s of the same precision; vs batch <= c: vs limit "
          "divided by what in-process reaches at the best batch no larger than the "
          "concurrency (c closed-loop clients never form a larger batch; from the batch "
          "search); vs fp32: the same against the float32 row of the same path; agreement "
          "/ max |dp|: argmax agreement and largest probability difference with in-process "
          "float32 on all %d validation digits, sent through that path)" % len(digits))


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
                             "trivial model vs bare grpcio / waitress), limit (served "
                             "img/s per precision vs the in-process best-batch limit, with "
                             "agreement; not in the default set).")
    parser.add_argument("--overhead_sizes", default="32,224",
                        help="Model input sides the concurrency-1 overhead is measured at.")
    parser.add_argument("--rate_concurrency", type=int, default=32,
                        help="Requests in flight for the request-rate rows.")
    parser.add_argument("--rate_seconds", type=float, default=4.0,
                        help="Seconds per request-rate measurement.")
    parser.add_argument("--baseline_root", default="",
                        help="A checkout of other code (e.g. `git worktree add /tmp/base "
                             "HEAD~1`) whose server runs as extra rows side by side.")
    parser.add_argument("--limit_sizes", default="224,32",
                        help="limit section: model input sides, one table each.")
    parser.add_argument("--limit_batches", default="1,2,4,8,16,32",
                        help="limit section: in-process batch sizes searched for the best.")
    parser.add_argument("--limit_concurrency", default="8,16,32",
                        help="limit section: closed-loop clients per served row.")
    parser.add_argument("--limit_seconds", type=float, default=4.0,
                        help="limit section: seconds per measurement.")
    parser.add_argument("--digits_steps", type=int, default=DIGITS_STEPS,
                        help="limit section: training steps of the digits model.")
    parser.add_argument("--variant", action="append", default=[],
                        help="limit section: 'NAME[@LEVELS]=SERVER FLAGS' (repeat), e.g. "
                             "'bf16 tuned@32=--enable_batching --batching_parameters_file="
                             "benchmarks/tuned_224.config --mixed_precision=bfloat16'; the "
                             "precision is read off the flags; @LEVELS: only at those "
                             "concurrencies (one name may repeat at other levels, not at the "
                             "same one); '@DIR' first in the flags runs that checkout's "
                             "server. 'vs fp32' compares a row with the fp32 row whose name "
                             "has the same words after the first. Default: fp32, bf16 and "
                             "xla with --enable_batching's defaults.")
    args = parser.parse_args()
    if not args.variant:
        args.variant = ["%s defaults=--enable_batching %s" % (p, " ".join(f))
                        for p, f in PRECISION_FLAGS.items()]
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
    if "limit" in sections:
        limit_section(args, images)


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
