"""slimserve-loadtest: closed-loop gRPC load against TF Serving or the embedded server.

    slimserve-loadtest --server=localhost:8500 --images=photos/ --concurrency=1,8,32 \
        --requests=400

Bounded by --requests and --max_seconds per level; it stops by itself. The run is
serving/clients/load_levels.py's.
"""
import dataclasses

from slimserve import fields
from slimserve.cli import logs
from slimserve.serving.clients import load_levels


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
    load_levels.run(config)


def run():
    logs.run(main, config=CONFIG)


if __name__ == "__main__":
    run()
