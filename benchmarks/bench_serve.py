"""Serving: closed-loop gRPC load at concurrency 1, 8, 32 with batch-1 image requests,
with and without server-side batching, against in-process session.run of the same
SavedModel with the same number of threads, measured in the same rounds; the
concurrency-1 overhead against the bare-grpcio floor (idle and with the cores busy); the
maximum request rate on a trivial model against bare grpcio and waitress; and (section
`limit`) served throughput per precision (float32, --mixed_precision=bfloat16,
--xla_cpu_compilation_enabled) against the machine's limit, in-process session.run at its
best batch size in the same precision, with each precision's agreement with float32 on
the validation images of a trained digits model; and (section `adaptive`) the adaptive
batch scheduler against TF Serving's defaults and the tuned file at 1-32 clients.

    make bench-serve        (python benchmarks/bench_serve.py --help)

The server runs in its own process (slimserve-server, memory-capped, started by
serving/server_process.py), as in production; every load comes from
serving/clients/loadtest.py, the generator slimserve-loadtest and slimserve-tune use (with a
raw-bytes gRPC or HTTP sender from benchmarks/request_rate.py for the rate and limit
rows). This file is the command line; the harness the sections share is
benchmarks/serve_harness.py and each section is a file of its own: serve_table.py,
serve_overhead.py, serve_rate.py, serve_limit.py, serve_adaptive.py.
These machines are noisy, so every comparison is made side by side: in-process, served
without and with batching take turns in every round (the order rotating, all servers up
all along), the concurrency-1 overhead is the median difference of interleaved request
pairs, and --baseline_root serves another checkout's code as extra rows of the same run.
"""
import argparse
import os

import common  # pylint: disable=wrong-import-order
import serve_harness  # pylint: disable=wrong-import-order  (quiets TensorFlow first)
import serve_adaptive  # pylint: disable=wrong-import-order
import serve_limit  # pylint: disable=wrong-import-order
import serve_overhead  # pylint: disable=wrong-import-order
import serve_rate  # pylint: disable=wrong-import-order
import serve_table  # pylint: disable=wrong-import-order

from slimserve.serving.clients import loadtest  # pylint: disable=wrong-import-order

del serve_harness  # imported first for its quieting of TensorFlow


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
                             "agreement; not in the default set), adaptive (the adaptive "
                             "batch scheduler vs TF Serving's defaults and the tuned file "
                             "at --adaptive_concurrency, in the limit section's table, "
                             "plus a summary; not in the default set).")
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
    parser.add_argument("--digits_steps", type=int, default=serve_limit.DIGITS_STEPS,
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
                             "xla with --enable_batching alone (the adaptive scheduler).")
    parser.add_argument("--adaptive_concurrency", default="1,2,4,8,16,32",
                        help="adaptive section: closed-loop clients per served row.")
    parser.add_argument("--adaptive_precisions", default="fp32,bf16",
                        help="adaptive section: precisions (fp32, bf16, xla).")
    args = parser.parse_args()
    if not args.variant:
        args.variant = ["%s adaptive=--enable_batching %s" % (p, " ".join(f))
                        for p, f in serve_limit.PRECISION_FLAGS.items()]
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
        serve_rate.rate_section(args)
    if "overhead" in sections:
        serve_overhead.overhead_section(args, images, image_path)
    if "table" in sections:
        serve_table.table_section(args, images)
    if "limit" in sections:
        serve_limit.limit_section(args, images)
    if "adaptive" in sections:
        serve_adaptive.adaptive_section(args, images)


if __name__ == "__main__":
    main()
