"""First-request latency of a new version: warmed with the export's synthetic requests
(batch 1, one per signature) vs with requests built from logged traffic
(`slimserve-export --warmup_from`), for the batch sizes clients really send.

    python benchmarks/bench_warmup.py [--image_size 224 --batch_sizes 1,8 --rounds 5]

Each measurement loads the version in a fresh process (as a server does after a
rollout), replays its warmup file, then times the first request of each batch size;
the two exports take turns, round after round, so both see the same machine.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

import common  # pylint: disable=wrong-import-order

from slimserve.cli import logs  # pylint: disable=wrong-import-order

logs.quiet_tensorflow()
import tensorflow as tf  # noqa: E402  pylint: disable=wrong-import-position
from tensorflow_serving.apis import model_pb2  # noqa: E402  pylint: disable=wrong-import-position
from tensorflow_serving.apis import predict_pb2  # noqa: E402  pylint: disable=wrong-import-position

import serve_harness  # noqa: E402  pylint: disable=wrong-import-position,wrong-import-order
from slimserve import image_listing  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.export import warmup  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.export import writer
from slimserve.serving.observability import request_log  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.serving.core import servable

_CHILD = """
import json, sys, time
import numpy as np
sys.path.insert(0, %(root)r)
from slimserve.cli import logs
logs.quiet_tensorflow()
from slimserve.serving.core import servable
images = [open(p, "rb").read() for p in %(images)r]
started = time.perf_counter()
version = servable.Servable("resnet", 1, %(path)r)
warmed = version.warm_up()
loaded = time.perf_counter() - started
out = {"load_and_warmup_s": loaded, "warmup_records": warmed}
signature = version.signatures["serving_default"]
for batch in %(batches)r:
    feed = {"image_bytes": np.array(images[:batch], dtype=object)}
    started = time.perf_counter()
    version.run(signature, feed, sorted(signature.outputs))
    out["first_batch_%%d_ms" %% batch] = (time.perf_counter() - started) * 1e3
print(json.dumps(out))
"""


def traffic_logs(prefix, images, batch_sizes):
    """A few logged requests of each batch size, as the server's request logger writes."""
    logger = request_log.RequestLogger(prefix, 1.0)
    for batch in batch_sizes:
        for start in range(2):
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "resnet"
            request.model_spec.signature_name = "serving_default"
            request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto(
                images[start:start + batch]))
            spec = model_pb2.ModelSpec(name="resnet", signature_name="serving_default")
            logger.maybe_log("predict", request, predict_pb2.PredictResponse(), spec)
    logger.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image_size", type=int, default=224, help="Model input side.")
    parser.add_argument("--batch_sizes", default="1,8",
                        help="Batch sizes of the logged traffic and of the first requests.")
    parser.add_argument("--rounds", type=int, default=5,
                        help="Fresh-process loads per export (alternating).")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    if args.rounds < 1 or not batches or min(batches) < 1:
        parser.error("--rounds and every --batch_sizes value must be >= 1")
    import make_photos  # pylint: disable=import-outside-toplevel
    photos = common.work_dir("photos")
    if not os.listdir(photos):
        make_photos.write_photos(photos, 400)
    files = [entry.path for entry in image_listing.list_folder(
        photos, suffixes=(".jpg", ".jpeg", ".png")).entries][:max(batches) + 2]
    images = [image_listing.read(path, 0) for path in files]
    synthetic = serve_harness.make_export(
        os.path.join(common.WORK, "serve_models_%d" % args.image_size), args.image_size)
    prefix = os.path.join(common.work_dir("warmup_logs_%d" % args.image_size), "resnet")
    if not tf.io.gfile.glob(prefix + "*"):
        traffic_logs(prefix, images, batches)
    base = os.path.join(common.WORK, "warmup_traffic_%d" % args.image_size)
    if writer.list_versions(base):
        traffic = os.path.join(base, str(writer.list_versions(base)[-1]))
    else:
        os.makedirs(base, exist_ok=True)
        traffic = os.path.join(base, "1")
        import shutil  # pylint: disable=import-outside-toplevel
        shutil.copytree(synthetic, traffic)
        warmup.write_warmup(os.path.join(traffic, servable.WARMUP_PATH),
                            warmup.traffic_warmup(prefix + "*"))
    results = {"synthetic": [], "traffic": []}
    for round_index in range(args.rounds):
        order = [("synthetic", synthetic), ("traffic", traffic)]
        for name, path in order if round_index % 2 == 0 else order[::-1]:
            code = _CHILD % {"root": common.ROOT, "images": files, "path": path,
                             "batches": batches}
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True, timeout=600)
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print("round %d %s: %s" % (round_index + 1, name, results[name][-1]), flush=True)
    rows = []
    for name, runs in results.items():
        rows.append([name, runs[0]["warmup_records"],
                     "%.2f" % np.median([r["load_and_warmup_s"] for r in runs])] +
                    ["%.1f" % np.median([r["first_batch_%d_ms" % b] for r in runs])
                     for b in batches])
    common.table("first request of a new version, %dx%d, median of %d fresh loads" % (
        args.image_size, args.image_size, args.rounds),
        ["warmup", "records", "load + warmup s"] + ["first batch-%d ms" % b for b in batches],
        rows)


if __name__ == "__main__":
    main()
