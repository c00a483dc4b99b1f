"""Closed-loop gRPC load generator: N clients each send one request, wait for the
answer, send the next. Reports latency percentiles, throughput and errors.

    slimserve-loadtest --server=localhost:8500 --images=photos/ --concurrency=1,8,32 \
        --requests=400

Bounded by --requests and --max_seconds per level; it stops by itself.
"""
import concurrent.futures
import json
import os
import sys
import threading
import time

from absl import flags

import slimserve_quiet


def run_level(client, images, concurrency, requests, max_seconds=60.0, batch_size=1,
              signature_name="serving_default", progress=None, first_index=0):
    """One closed-loop run; returns a dict of latency percentiles (ms), rates, errors and
    the raw latencies (`latencies_ms`, for callers that pool several runs).
    Request i sends images[(first_index + i) * batch_size ...]."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    counter = iter(range(first_index, first_index + requests))
    lock = threading.Lock()
    latencies, errors = [], {}
    deadline = time.perf_counter() + max_seconds

    def worker():
        while time.perf_counter() < deadline:
            with lock:
                index = next(counter, None)
            if index is None:
                return
            batch = [images[(index * batch_size + i) % len(images)] for i in range(batch_size)]
            started = time.perf_counter()
            try:
                client.predict({"image_bytes": batch}, signature_name)
                elapsed = time.perf_counter() - started
                with lock:
                    latencies.append(elapsed)
            except Exception as error:  # pylint: disable=broad-except
                name = error.code().name if hasattr(error, "code") else type(error).__name__
                with lock:
                    errors[name] = errors.get(name, 0) + 1
            if progress:
                progress()

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(worker) for _ in range(concurrency)]:
            future.result()
    wall = time.perf_counter() - started
    millis = np.array(latencies) * 1000.0 if latencies else np.array([float("nan")])
    return {
        "concurrency": concurrency, "batch_size": batch_size, "requests": len(latencies),
        "errors": errors, "seconds": round(wall, 3),
        "requests_per_s": len(latencies) / wall, "images_per_s": len(latencies) * batch_size / wall,
        "p50_ms": float(np.percentile(millis, 50)), "p90_ms": float(np.percentile(millis, 90)),
        "p99_ms": float(np.percentile(millis, 99)), "latencies_ms": millis.tolist(),
    }


def load_images(path):
    files = [path] if os.path.isfile(path) else [
        os.path.join(root, name) for root, _, names in os.walk(path) for name in sorted(names)
        if name.lower().endswith((".jpg", ".jpeg", ".png", ".gif", ".bmp"))]
    if not files:
        raise ValueError("--images %s holds no JPEG/PNG/GIF/BMP file" % path)
    images = []
    for name in sorted(files)[:256]:
        with open(name, "rb") as handle:
            images.append(handle.read())
    return images


FLAGS = flags.FLAGS


def define_flags():
    """Defined on demand so that importing this module never clashes with other CLIs."""
    flags.DEFINE_string("server", "localhost:8500", "host:port of the gRPC API.")
    flags.DEFINE_string("model_name", "resnet", "Model name.")
    flags.DEFINE_string("signature_name", "serving_default", "Signature taking image_bytes.")
    flags.DEFINE_string("images", None, "An image file or a folder of them (up to 256 used).")
    flags.DEFINE_list("concurrency", ["1", "8", "32"], "Concurrency levels, run in turn.")
    flags.DEFINE_integer("requests", 400, "Requests per level.")
    flags.DEFINE_integer("batch_size", 1, "Images per request.")
    flags.DEFINE_float("max_seconds", 60.0, "Upper bound on each level's duration.")
    flags.DEFINE_float("timeout", 30.0, "Per-request deadline in seconds.")
    flags.DEFINE_bool("json", False, "Print JSON lines instead of a table.")
    flags.mark_flag_as_required("images")


def main(argv):
    del argv
    from serving import client as client_lib  # pylint: disable=import-outside-toplevel
    try:
        images = load_images(FLAGS.images)
    except ValueError as error:
        sys.exit("slimserve-loadtest: %s" % error)
    client = client_lib.Client(FLAGS.server, FLAGS.model_name, timeout=FLAGS.timeout, retries=0)
    rows = []
    for level in (int(c) for c in FLAGS.concurrency):
        done = [0]

        def progress(level=level, done=done):
            done[0] += 1
            if done[0] % max(1, FLAGS.requests // 10) == 0:
                print("  concurrency %d: %d/%d" % (level, done[0], FLAGS.requests),
                      file=sys.stderr, flush=True)

        result = run_level(client, images, level, FLAGS.requests, FLAGS.max_seconds,
                           FLAGS.batch_size, FLAGS.signature_name, progress)
        del result["latencies_ms"]
        rows.append(result)
        if FLAGS.json:
            print(json.dumps(result))
    if not FLAGS.json:
        print("| concurrency | requests | req/s | p50 ms | p90 ms | p99 ms | errors |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print("| %d | %d | %.1f | %.2f | %.2f | %.2f | %s |" % (
                r["concurrency"], r["requests"], r["requests_per_s"], r["p50_ms"],
                r["p90_ms"], r["p99_ms"], r["errors"] or 0))


def run():
    slimserve_quiet.run_absl_app(main, define_flags)


if __name__ == "__main__":
    run()
