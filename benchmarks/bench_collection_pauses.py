"""Python's garbage-collection pauses in a server under load, with and without
--freeze_loaded_objects (serving/core/heap.py; docs/batching.md "Collection pauses").

    python benchmarks/bench_collection_pauses.py [--rounds 2 --seconds 15 --concurrency 32]

A full collection walks every tracked object with the GIL held, and a loaded SavedModel
leaves ~300,000 of them: every thread of the server stops while it runs. Freezing is
process-wide, so each measurement is a fresh process: it serves the 32x32 digits export of
`bench_serve.py --sections limit` (trained once under bench_out) in process with
--enable_batching, times every collection with `gc.callbacks` while closed-loop gRPC
clients in another process load it, and reports the collections by generation, the
longest pause and the clients' img/s and p99. The two settings take turns, round after
round.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

import common  # pylint: disable=wrong-import-order
import serve_harness  # pylint: disable=wrong-import-order  (quiets TensorFlow first)
import serve_limit  # pylint: disable=wrong-import-order

del serve_harness  # imported first for its quieting of TensorFlow
_LOAD = """
import json, sys
sys.path.insert(0, %(benchmarks)r)
import serve_harness
from slimserve.estimator import schema, splits
digits = splits.read_images(%(data)r, schema.VALIDATION)[0][:64]
requests = serve_harness.predict_requests(digits)
serve_harness.closed_loop(%(target)r, requests, %(concurrency)d, 2.0, warmup=0.5)
print(json.dumps(serve_harness.closed_loop(%(target)r, requests, %(concurrency)d, %(seconds)r)))
"""


def serve_and_measure(args):
    """The child: one server in this process, one load from another -> JSON on stdout."""
    import gc  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel
    from slimserve.serving.config import model_config  # pylint: disable=import-outside-toplevel
    from slimserve.testing import servers  # pylint: disable=import-outside-toplevel
    server = servers.serve_in_process(
        [model_config.ServedModel("resnet", args.base)], rest_api_port=0,
        enable_batching=True, freeze_loaded_objects=args.freeze == "true")
    pauses, started = [], {}

    def timed(phase, info):
        if phase == "start":
            started["at"] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - started["at"]))

    try:
        tracked, frozen = len(gc.get_objects()), gc.get_freeze_count()
        gc.callbacks.append(timed)
        load = subprocess.run(
            [sys.executable, "-c", _LOAD % dict(
                benchmarks=os.path.dirname(os.path.abspath(__file__)), data=args.data,
                target="127.0.0.1:%d" % server.port, concurrency=args.concurrency,
                seconds=args.seconds)],
            capture_output=True, text=True, check=True, cwd=common.ROOT)
        gc.callbacks.remove(timed)
    finally:
        server.stop()
    result = json.loads(load.stdout.splitlines()[-1])
    print(json.dumps({
        "tracked": tracked, "frozen": frozen, "img_s": result["images_per_s"],
        "p99_ms": result["p99_ms"],
        "collections": [sum(1 for g, _ in pauses if g == gen) for gen in range(3)],
        "full_ms": [1e3 * s for g, s in pauses if g == 2],
        "longest_ms": 1e3 * max((s for _, s in pauses), default=0.0)}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="Turns of each setting.")
    parser.add_argument("--seconds", type=float, default=15.0,
                        help="Seconds of load per measurement (after 2.5 s of warm-up).")
    parser.add_argument("--concurrency", type=int, default=32, help="Closed-loop clients.")
    parser.add_argument("--digits_steps", type=int, default=serve_limit.DIGITS_STEPS,
                        help="Training steps of the digits model.")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--freeze", default="true", help=argparse.SUPPRESS)
    parser.add_argument("--base", default="", help=argparse.SUPPRESS)
    parser.add_argument("--data", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1 or not args.seconds > 0 or args.concurrency < 1:
        parser.error("--rounds, --seconds and --concurrency must be positive")
    if args.child:
        serve_and_measure(args)
        return
    data, model_dir = serve_limit.digits_model(args.digits_steps)
    base = serve_limit.trained_export(model_dir, 32)
    seen = {"true": [], "false": []}
    for round_index in range(args.rounds):
        for freeze in (("true", "false") if round_index % 2 == 0 else ("false", "true")):
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", "--freeze", freeze,
                 "--base", base, "--data", data, "--seconds", str(args.seconds),
                 "--concurrency", str(args.concurrency)],
                capture_output=True, text=True, check=True, cwd=common.ROOT)
            seen[freeze].append(json.loads(out.stdout.splitlines()[-1]))
            print("round %d, freeze %s: %s" % (round_index + 1, freeze,
                                               out.stdout.splitlines()[-1]), flush=True)
    rows = []
    for freeze, runs in seen.items():
        full = [ms for run in runs for ms in run["full_ms"]]
        rows.append([
            "--freeze_loaded_objects=%s" % freeze, runs[0]["tracked"], runs[0]["frozen"],
            "%d / %d / %d" % tuple(sum(r["collections"][g] for r in runs) for g in range(3)),
            "%.1f" % max(full, default=0.0), "%.1f" % sum(full),
            "%.1f" % max(r["longest_ms"] for r in runs),
            "%.1f" % np.median([r["img_s"] for r in runs]),
            "%.1f" % np.median([r["p99_ms"] for r in runs])])
    common.table(
        "Collection pauses at 32x32, %d closed-loop gRPC clients, --enable_batching (%d "
        "rounds of %.0f s per setting, taking turns)" % (args.concurrency, args.rounds,
                                                          args.seconds),
        ["server", "tracked objects", "frozen", "collections gen 0 / 1 / 2",
         "longest full ms", "full ms in all", "longest any ms", "img/s (median)",
         "p99 ms (median)"], rows)


if __name__ == "__main__":
    main()
