"""slimserve-loadtest: closed-loop gRPC load against TF Serving or the embedded server.

    slimserve-loadtest --server=localhost:8500 --images=photos/ --concurrency=1,8,32 \
        --requests=400

Bounded by --requests and --max_seconds per level; it stops by itself.
"""
import json
import sys

import grpc
from absl import flags

from slimserve.serving.tools import client as client_lib
from slimserve.serving.tools import loadtest
from slimserve.cli import logs

FLAGS = flags.FLAGS


flags.DEFINE_string("server", "localhost:8500", "host:port of the gRPC API.")
flags.DEFINE_string("model_name", "resnet", "Model name.")
flags.DEFINE_string("signature_name", "serving_default",
                    "Signature with one string input (encoded images); its input name is "
                    "read from the server's GetModelMetadata.")
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
    try:
        images = loadtest.load_images(FLAGS.images)
    except ValueError as error:
        sys.exit("slimserve-loadtest: --images: %s" % error)
    client = client_lib.Client(FLAGS.server, FLAGS.model_name, timeout=FLAGS.timeout, retries=0)
    try:
        input_key, _ = client.image_input_key(FLAGS.signature_name)
    except ValueError as error:
        sys.exit("slimserve-loadtest: %s" % error)
    except grpc.RpcError as error:
        sys.exit("slimserve-loadtest: GetModelMetadata of model %s at %s failed: %s: %s" % (
            FLAGS.model_name, FLAGS.server, error.code().name, error.details()))
    rows = []
    for level in (int(c) for c in FLAGS.concurrency):
        done = [0]

        def progress(level=level, done=done):
            done[0] += 1
            if done[0] % max(1, FLAGS.requests // 10) == 0:
                print("  concurrency %d: %d/%d" % (level, done[0], FLAGS.requests),
                      file=sys.stderr, flush=True)

        result = loadtest.run_level(client, images, level, FLAGS.requests, FLAGS.max_seconds,
                                    FLAGS.batch_size, FLAGS.signature_name, progress,
                                    input_key=input_key)
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
    logs.run(main)


if __name__ == "__main__":
    run()
