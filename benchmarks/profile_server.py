"""Profiles slimserve-server under load with py-spy (dev only: pip install -e .[dev]):
the server runs as its own process under py-spy (memory-capped), loaded at one
concurrency by a gRPC client, and py-spy's top functions are printed as text.

    python benchmarks/profile_server.py --model tiny --concurrency 32 --seconds 15
    python benchmarks/profile_server.py --model digits --concurrency 1 --seconds 15
    python benchmarks/profile_server.py --model digits --image_size 224 --concurrency 8 \
        --server_args "--enable_batching" --idle

`tiny` is slimserve/testing/tiny_models.py's SavedModel (inference costs ~nothing: the
server's own per-request work shows); `digits` is resnet_v1_50 at --image_size (32) as
bench-serve makes it (benchmarks/serve_harness.py). The server starts through the one
launcher (serving/server_process.py: its own free port, memory-capped, gone with
this process) and the load comes from the one load generator (benchmarks/request_rate.py
over serving/clients/loadtest.py). By default only samples of threads holding the GIL count
(where the server's Python time goes); --idle counts every thread's samples (where
threads wait).
"""
import argparse
import collections
import os
import subprocess
import sys

import common  # pylint: disable=wrong-import-order
import request_rate  # pylint: disable=wrong-import-order

from slimserve.cli import logs  # pylint: disable=wrong-import-order

logs.quiet_tensorflow()
import tensorflow as tf  # noqa: E402  pylint: disable=wrong-import-position
from tensorflow_serving.apis import predict_pb2  # noqa: E402  pylint: disable=wrong-import-position

from slimserve.serving import server_process  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.testing import servers  # noqa: E402  pylint: disable=wrong-import-position

PREDICT = "/tensorflow.serving.PredictionService/Predict"


def tiny_request():
    """(base path, serialized PredictRequest) for the tiny model, one row."""
    from slimserve.testing import tiny_models  # pylint: disable=import-outside-toplevel
    base = os.path.join(common.WORK, "tiny_models", "tiny")
    if not os.path.isdir(os.path.join(base, "1")):
        tiny_models.write_tiny_model(base)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([[1.0, 2.0]], tf.float32))
    return base, request.SerializeToString()


def digits_request(size=32):
    """(base path, serialized PredictRequest of one real photo) for resnet_v1_50 at `size`."""
    import make_photos  # pylint: disable=import-outside-toplevel
    from slimserve.serving.clients import loadtest  # pylint: disable=import-outside-toplevel
    photos = common.work_dir("photos")
    if not os.listdir(photos):
        make_photos.write_photos(photos, 400)
    image = loadtest.load_images(photos)[0]
    base = os.path.join(common.WORK, "serve_models_%d" % size)
    import serve_harness  # pylint: disable=import-outside-toplevel
    serve_harness.make_export(base, size)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "resnet"
    request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto([image]))
    return base, request.SerializeToString()


def top_functions(raw_path, count):
    """py-spy's raw (collapsed) stacks -> [(own %, total %, function)] by own samples."""
    own, total, samples = collections.Counter(), collections.Counter(), 0
    with open(raw_path) as handle:
        for line in handle:
            stack, _, number = line.rstrip().rpartition(" ")
            number = int(number)
            frames = stack.split(";")
            samples += number
            own[frames[-1]] += number
            for frame in set(frames):
                total[frame] += number
    return samples, [(100.0 * n / samples, 100.0 * total[f] / samples, f)
                     for f, n in own.most_common(count)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["tiny", "digits"], default="tiny")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--idle", action="store_true", help="Include idle threads.")
    parser.add_argument("--server_args", default="", help="Extra server flags.")
    parser.add_argument("--image_size", type=int, default=32, help="digits: input side.")
    args = parser.parse_args()
    base, request = (tiny_request() if args.model == "tiny"
                     else digits_request(args.image_size))
    name = "tiny" if args.model == "tiny" else "resnet"
    raw = os.path.join(common.work_dir("profiles"), "%s-c%d.txt" % (args.model,
                                                                    args.concurrency))
    py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    server = server_process.ServerProcess(
        ["--rest_api_port=0", "--model_name=%s" % name, "--model_base_path=%s" % base]
        + args.server_args.split(), "profiled", memory_cap=servers.MODEL_MEMORY_CAP,
        cwd=common.ROOT)
    try:
        target = server.address
        request_rate.grpc_rate(target, PREDICT, request, args.concurrency, 2)  # warm up
        # sampled only while loaded, only threads holding the GIL unless --idle: where the
        # server's Python time goes
        spy = subprocess.Popen(
            [py_spy, "record", "--pid", str(server.pid), "--format", "raw", "--output", raw,
             "--rate", "250", "--duration", str(int(args.seconds)), "--nonblocking"] +
            (["--idle"] if args.idle else ["--gil"]), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        rate, errors = request_rate.grpc_rate(target, PREDICT, request, args.concurrency,
                                              args.seconds)
        spy.wait(timeout=120)
    finally:
        server.kill()
    samples, top = top_functions(raw, args.top)
    print("%s model, concurrency %d: %.0f requests/s (%d errors); %d samples; top "
          "functions by own time:" % (args.model, args.concurrency, rate, errors, samples))
    print("| own % | total % | function |\n|---|---|---|")
    for own, total, frame in top:
        print("| %.1f | %.1f | `%s` |" % (own, total, frame))


if __name__ == "__main__":
    main()
