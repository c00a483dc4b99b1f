"""The one closed-loop load generator: N clients each send one request, wait for the
answer, send the next. Reports latency percentiles, throughput and errors.

Every load in the project comes from `run_level`: `slimserve-loadtest`
(slimserve/cli/loadtest.py), the tuners (serving/tuning/tuner.py) and the serving
benchmarks (benchmarks/bench_serve.py and its sections, benchmarks/request_rate.py), so
a figure of one is a figure of the others. By default request i sends images through a
Client's Predict to the signature's one string input, whose name `Client.image_input_key`
reads from the server (GetModelMetadata), not a literal: any image model TF Serving serves
can be loaded. A `send` callable replaces that (a serialized request over a bare gRPC
channel, an HTTP POST: benchmarks/request_rate.py), for the maximum request rate.

Bounded by a request count and a deadline per level, or (requests=None) by the deadline
alone, with a warm-up whose answers are not counted.
"""
import concurrent.futures
import itertools
import logging
import threading
import time

import numpy as np

from slimserve import conventions
from slimserve import image_listing

MAX_IMAGES = 256
MAX_IMAGE_BYTES = 64 * 1024 * 1024


def run_level(client, images, concurrency, requests, max_seconds=60.0, batch_size=1,
              signature_name="serving_default", progress=None, first_index=0,
              input_key=conventions.IMAGE_BYTES, send=None, warmup_seconds=0.0):
    """One closed-loop run; returns a dict of latency percentiles (ms), rates, errors and
    the raw latencies (`latencies_ms`, for callers that pool several runs).
    Request i sends images[(first_index + i) * batch_size ...] as `input_key`
    (Client.image_input_key finds a served signature's) with client.predict; or, with
    `send`, calls send(first_index + i), which returns once answered and raises for an
    error (client and images are then unused).

    requests: how many requests in all; None: as many as fit in `max_seconds`, the
    figures counting the answers that arrive between `warmup_seconds` after the start and
    the deadline (a time-bounded level: what the maximum-rate benchmarks measure). Errors
    are counted whenever they happen.

    `steady_*`: the same figures over the steady part only, the answers that came while
    all `concurrency` clients were still sending. Once the first client runs out of
    requests (or time) the load drains, and a batching server then waits out
    batch_timeout_micros for batches that no longer fill: that tail says how the load
    ended, not how the server serves, so the tuners compare settings on the steady part.
    A request still in flight when the steady part ends is left out of it whatever its
    age (a server that starved one request would hide it there): the totals keep every
    answer, so read them too when the steady figures look better than they should."""
    if send is None:
        def send(index):
            batch = [images[(index * batch_size + i) % len(images)]
                     for i in range(batch_size)]
            client.predict({input_key: batch}, signature_name)
    counter = iter(range(first_index, first_index + requests)) if requests is not None \
        else itertools.count(first_index)
    lock = threading.Lock()
    latencies, finished, errors = [], [], {}
    started = time.perf_counter()
    deadline = started + max_seconds
    draining = []  # when each client stopped sending

    def worker():
        while time.perf_counter() < deadline:
            with lock:
                index = next(counter, None)
            if index is None:
                break
            sent = time.perf_counter()
            try:
                send(index)
                now = time.perf_counter()
                with lock:
                    latencies.append(now - sent)
                    finished.append(now)
            except Exception as error:  # pylint: disable=broad-except
                name = error.code().name if hasattr(error, "code") else type(error).__name__
                with lock:
                    errors[name] = errors.get(name, 0) + 1
            if progress:
                progress()
        with lock:
            draining.append(time.perf_counter())

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(worker) for _ in range(concurrency)]:
            future.result()
    window_start = started + warmup_seconds
    window_end = deadline if requests is None else time.perf_counter()
    counted = [(seconds, at) for seconds, at in zip(latencies, finished)
               if window_start <= at <= window_end]
    wall = window_end - window_start
    millis = np.array([s for s, _ in counted]) * 1000.0 if counted \
        else np.array([float("nan")])
    steady_end = min(min(draining), window_end)
    steady = [ms for ms, (_, at) in zip(millis, counted) if at <= steady_end]
    steady_wall = steady_end - window_start
    steady_ms = np.array(steady) if steady else np.array([float("nan")])
    count = len(counted)
    return {
        "concurrency": concurrency, "batch_size": batch_size, "requests": count,
        "errors": errors, "seconds": round(wall, 3),
        "requests_per_s": count / wall, "images_per_s": count * batch_size / wall,
        "p50_ms": float(np.percentile(millis, 50)), "p90_ms": float(np.percentile(millis, 90)),
        "p99_ms": float(np.percentile(millis, 99)), "latencies_ms": millis.tolist(),
        "steady_requests": len(steady), "steady_seconds": round(steady_wall, 3),
        "steady_images_per_s": len(steady) * batch_size / steady_wall if steady_wall > 0 else 0.0,
        "steady_p50_ms": float(np.percentile(steady_ms, 50)),
        "steady_p99_ms": float(np.percentile(steady_ms, 99)),
    }


def load_images(path, limit=MAX_IMAGES, max_bytes=MAX_IMAGE_BYTES):
    """The bytes of an image file, or of the first `limit` readable images of a folder
    (files named .jpg, .jpeg, .png, .gif or .bmp) or of a CSV of paths, listed and read as
    every tool lists and reads images (slimserve/image_listing.py): hidden files are left
    out, and a file that is not regular or is over `max_bytes` is skipped (logged)."""
    listing = image_listing.list_input(path, suffixes=conventions.SERVABLE_IMAGE_SUFFIXES)
    for skipped in listing.skipped:
        if skipped["reason"] in (image_listing.FOLDER_LINK,) or skipped["reason"].startswith(
                "unreadable"):
            logging.warning("skipping %s: %s", skipped["path"], skipped["reason"])
    images = []
    for entry in listing.entries:
        try:
            images.append(image_listing.read(entry.path, max_bytes))
        except image_listing.NotReadable as reason:
            logging.warning("skipping %s: %s", entry.path, reason)
        if len(images) >= limit:
            break
    if not images:
        raise image_listing.ListingError("%s holds no readable JPEG/PNG/GIF/BMP file" % path)
    return images
