"""slimserve-tune-batching: measure server-side batching settings on real images and
write the best one that meets a latency budget as TF Serving's batching file.

    slimserve-tune-batching --model_base_path=/models/resnet --images=photos/ \
        --latency_budget_ms=100 --output_config=batching.config --output_png=batching.png

The batching-only mode of slimserve-tune (fp32, no XLA, no accuracy guard). Bounded by
--max_minutes; each setting runs in a fresh slimserve-server process, stopped with the
command (SIGTERM / SIGINT, or when the command is killed).
"""
import dataclasses

from slimserve import fields
from slimserve.cli import tuning
from slimserve.cli.tuning import TuningOptions
from slimserve.serving.tuning import run as tuner_run

TOOL = "slimserve-tune-batching"


@dataclasses.dataclass
class TuneBatchingConfig:
    """slimserve-tune-batching's flags: the tuners' shared section and the load images."""
    tuning: TuningOptions = fields.section(TuningOptions)
    images: str = fields.option(None, "An image file or a folder of them (up to 256 used).",
                                required=True)


CONFIG = TuneBatchingConfig

main, run = tuning.command(CONFIG, tuner_run.tune_batching, TOOL, __name__)


if __name__ == "__main__":
    run()
