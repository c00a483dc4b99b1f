"""Serving: closed-loop gRPC load at concurrency 1, 8, 32 with batch-1 image requests,
with and without server-side batching, against the in-process session.run rate of
the same SavedModel measured in the same run.

    make bench-serve        (python benchmarks/bench_serve.py --help)

The server runs in its own process (slimserve-server), as in production; the load
generator is serving/loadtest.py.
"""
import argparse
import dataclasses
import os
import socket
import subprocess
import sys
import time

import numpy as np

import common  # pylint: disable=wrong-import-order

import slimserve_quiet  # pylint: disable=wrong-import-order

slimserve_quiet.quiet_tensorflow()
import tensorflow as tf  # noqa: E402  pylint: disable=wrong-import-position

from estimator import model  # noqa: E402  pylint: disable=wrong-import-position
from export import signatures, verify, writer  # noqa: E402  pylint: disable=wrong-import-position
from serving import client as client_lib, loadtest  # noqa: E402  pylint: disable=wrong-import-position


def make_export(base, size):
    """A randomly initialised resnet_v1_50 exported like a trained one."""
    if writer.list_versions(base):
        return os.path.join(base, str(writer.list_versions(base)[-1]))
    config = model.ModelConfig(model_name="resnet_v1_50", num_classes=10, image_size=size,
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
    serving = {"image_size": size, "style": "vgg", "central_fraction": 0.875}
    return writer.write_saved_model(base, checkpoint, config, serving)


def in_process_rate(export_dir, images, batch, seconds):
    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        feed = {signatures.IMAGE_BYTES: np.array(
            [images[i % len(images)] for i in range(batch)], dtype=object)}
        latencies = []

        def step():
            started = time.perf_counter()
            verify.run_signature(session, meta, signatures.DEFAULT, feed)
            latencies.append(time.perf_counter() - started)
            return batch

        rate = common.timed(step, seconds, warmup=3)
    return rate, float(np.median(latencies) * 1000.0)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(base, batching, batch_file):
    port = _free_port()
    argv = [sys.executable, "-m", "serving.server", "--port", str(port), "--rest_api_port", "0",
            "--model_base_path", base, "--file_system_poll_wait_seconds", "0"]
    if batching:
        argv += ["--enable_batching", "--batching_parameters_file", batch_file]
    process = subprocess.Popen(argv, cwd=common.ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    process.stdout.readline()  # "slimserve-server: gRPC ..." once it serves
    return process, "127.0.0.1:%d" % port


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image_size", type=int, default=224, help="Model input side.")
    parser.add_argument("--concurrency", default="1,8,32", help="Closed-loop clients.")
    parser.add_argument("--requests", type=int, default=200, help="Requests per level.")
    parser.add_argument("--seconds", type=float, default=6.0, help="In-process timing.")
    parser.add_argument("--max_batch_size", type=int, default=8,
                        help="Server batching: largest batch.")
    parser.add_argument("--batch_timeout_micros", type=int, default=2000,
                        help="Server batching: longest wait for a batch to fill.")
    args = parser.parse_args()
    import make_photos  # pylint: disable=import-outside-toplevel
    photos = common.work_dir("photos")
    if not os.listdir(photos):
        make_photos.write_photos(photos, 400)
    images = loadtest.load_images(photos)[:64]
    base = os.path.join(common.WORK, "serve_models_%d" % args.image_size)
    export_dir = make_export(base, args.image_size)
    batch_file = os.path.join(common.WORK, "batching.config")
    with open(batch_file, "w") as handle:
        handle.write("max_batch_size { value: %d }\nbatch_timeout_micros { value: %d }\n"
                     "max_enqueued_batches { value: 1000 }\nnum_batch_threads { value: 2 }\n"
                     % (args.max_batch_size, args.batch_timeout_micros))
    levels = [int(c) for c in args.concurrency.split(",")]
    local = {b: in_process_rate(export_dir, images, b, args.seconds)
             for b in sorted({1, args.max_batch_size})}
    rows = []
    for batching in (False, True):
        process, target = start_server(base, batching, batch_file)
        try:
            client = client_lib.Client(target, retries=0)
            loadtest.run_level(client, images, 2, 10)  # warm the channel and the model
            for level in levels:
                result = loadtest.run_level(client, images, level, args.requests)
                matching = local[args.max_batch_size if batching and level > 1 else 1]
                rows.append([
                    "on (max %d)" % args.max_batch_size if batching else "off", level,
                    "%.2f" % result["p50_ms"], "%.2f" % result["p90_ms"],
                    "%.2f" % result["p99_ms"], "%.1f" % result["images_per_s"],
                    sum(result["errors"].values()),
                    "%.2f" % (result["images_per_s"] / matching[0]),
                    "%+.2f" % (result["p50_ms"] - local[1][1]) if level == 1 else ""])
            client.close()
        finally:
            process.terminate()
            process.wait(timeout=30)
    print("\nin-process session.run (image_bytes, %dx%d model): " % (
        args.image_size, args.image_size) + ", ".join(
            "batch %d: %.1f img/s, median %.2f ms" % (b, r, m) for b, (r, m) in local.items()))
    common.table("gRPC closed-loop load, batch-1 requests (%d cores)" % os.cpu_count(),
                 ["batching", "concurrency", "p50 ms", "p90 ms", "p99 ms", "img/s", "errors",
                  "vs in-process", "p50 overhead ms"], rows)
    print("(vs in-process: at batch %d when batching with concurrency > 1, else batch 1)"
          % args.max_batch_size)


if __name__ == "__main__":
    main()
