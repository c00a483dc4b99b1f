"""slimserve-loadtest's run: the concurrency levels in turn through the one load generator
(serving/clients/loadtest.py `run_level`), progress on stderr, each level's result as a
JSON line or all of them as one table.

`run` is the command's one call; `config` is its LoadtestConfig (slimserve/cli/loadtest.py).
Images that cannot be loaded and a model whose metadata cannot be read are one UserError
naming the flag or the server.
"""
import json
import sys

import grpc

from slimserve import errors
from slimserve.serving.clients import client as client_lib
from slimserve.serving.clients import loadtest


def run(config):
    """Runs every level of config.concurrency against config.server; returns the rows
    (run_level's results without their latencies) after printing them."""
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
        print(table(rows))
    return rows


def table(rows):
    """The levels' results as a Markdown table."""
    lines = ["| concurrency | requests | req/s | p50 ms | p90 ms | p99 ms | errors |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %d | %d | %.1f | %.2f | %.2f | %.2f | %s |" % (
            r["concurrency"], r["requests"], r["requests_per_s"], r["p50_ms"],
            r["p90_ms"], r["p99_ms"], r["errors"] or 0))
    return "\n".join(lines)
