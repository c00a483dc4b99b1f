"""slimserve-loadtest: closed-loop gRPC load against TF Serving or the embedded server.

    slimserve-loadtest --server=localhost:8500 --images=photos/ --concurrency=1,8,32 \
        --requests=400

Bounded by --requests and --max_seconds per level; it stops by itself.
"""
import dataclasses
import json
import sys

import grpc

from slimserve import errors
from slimserve import fields
from slimserve.cli import logs
from slimserve.serving.clients import client as client_lib
from slimserve.serving.clients import loadtest


@dataclasses.dataclass
class LoadtestConfig:
    """slimserve-loadtest's flags."""
    server: str = fields.option("localhost:8500", "host:port of the gRPC API.")
    model_name: str = fields.option("resnet", "Model name.")
    signature_name: str = fields.option(
        "serving_default", "Signature with one string input (encoded images); its input "
        "name is read from the server's GetModelMetadata.")
    images: str = fields.option(None, "An image file or a folder of them (up to 256 used).",
                                required=True)
    concurrency: tuple = fields.option((1, 8, 32), "Concurrency levels, run in turn.",
                                       fields.Bound(1, 1024), item=int)
    requests: int = fields.option(400, "Requests per level.", fields.Bound(1, fields.INT32_MAX))
    batch_size: int = fields.option(1, "Images per request.", fields.Bound(1, 65536))
    max_seconds: float = fields.option(60.0, "Upper bound on each level's duration.",
                                       fields.POSITIVE)
    timeout: float = fields.option(30.0, "Per-request deadline in seconds.", fields.POSITIVE)
    json: bool = fields.option(False, "Print JSON lines instead of a table.")


CONFIG = LoadtestConfig


def main(config, args):
    del args
    try:
        images = loadtest.load_images(config.images)
    except errors.UserError as error:
        raise errors.UserError("--images: %s" % error) from None
    client = client_lib.Client(config.server, config.model_name, timeout=config.timeout,
                               retries=0)
    try:
        input_key, _ = client.image_input_key(config.signature_name)
    except grpc.RpcError as error:
        raise errors.UserError("GetModelMetadata of model %s at %s failed: %s: %s" % (
            config.model_name, config.server, error.code().name, error.details())) from None
    rows = []
    for level in config.concurrency:
        done = [0]

        def progress(level=level, done=done):
            done[0] += 1
            if done[0] % max(1, config.requests // 10) == 0:
                print("  concurrency %d: %d/%d" % (level, done[0], config.requests),
                      file=sys.stderr, flush=True)

        result = loadtest.run_level(client, images, level, config.requests, config.max_seconds,
                                    config.batch_size, config.signature_name, progress,
                                    input_key=input_key)
        del result["latencies_ms"]
        rows.append(result)
        if config.json:
            print(json.dumps(result))
    client.close()
    if not config.json:
        print("| concurrency | requests | req/s | p50 ms | p90 ms | p99 ms | errors |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print("| %d | %d | %.1f | %.2f | %.2f | %.2f | %s |" % (
                r["concurrency"], r["requests"], r["requests_per_s"], r["p50_ms"],
                r["p90_ms"], r["p99_ms"], r["errors"] or 0))


def run():
    logs.run(main, config=CONFIG)


if __name__ == "__main__":
    run()
