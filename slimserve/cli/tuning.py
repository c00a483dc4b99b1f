"""What slimserve-tune and slimserve-tune-batching share: the load and batching-grid
flags (TuningOptions, a section of both commands' configs) and their entry points
(`command`). Running a sweep is the library's (serving/tuning/run.py).
"""
import dataclasses

from slimserve import fields
from slimserve.cli import logs
from slimserve.serving.tuning.run import CORES


@dataclasses.dataclass
class TuningOptions:
    """The flags both tuners take, with the defaults slimserve-tune-batching always had."""
    model_base_path: str = fields.option(None, "Folder of integer version sub-folders.",
                                         required=True)
    model_name: str = fields.option("resnet", "Model name served during the sweep.")
    signature_name: str = fields.option(
        "serving_default", "Signature loaded and compared: one string input, encoded images "
        "(e.g. serving_default) or serialized tf.Examples (e.g. classify).")
    latency_budget_ms: float = fields.option(None, "Highest acceptable p99 latency (ms).",
                                             fields.NON_NEGATIVE, kind=float, required=True)
    concurrency: int = fields.option(16, "Closed-loop clients during each measurement.",
                                     fields.Bound(1, 1024))
    requests: int = fields.option(300, "Batch-1 requests measured per setting.",
                                  fields.Bound(1, fields.INT32_MAX))
    max_seconds: float = fields.option(60.0, "Upper bound on one setting's measurement.",
                                       fields.Bound(1.0))
    max_batch_sizes: tuple = fields.option((4, 8, 16, 32), "max_batch_size values tried.",
                                           fields.Bound(1, fields.INT32_MAX), item=int)
    batch_timeouts_micros: tuple = fields.option(
        (0, 1000, 5000), "batch_timeout_micros values tried.",
        fields.Bound(0, fields.INT64_MAX), item=int)
    num_batch_threads: tuple = fields.option(
        (CORES,), "num_batch_threads values tried (default: the number of cores).",
        fields.Bound(1, 4096), item=int)
    max_enqueued_batches: tuple = fields.option(
        (100,), "max_enqueued_batches values tried.", fields.Bound(1, fields.INT32_MAX),
        item=int)
    compare_documented: bool = fields.option(
        True, "Also measure TF Serving's documented CPU starting point (batching/README.md) "
        "on the same load and report the chosen setting against it.")
    max_minutes: float = fields.option(20.0, "Stop starting new settings after this long.",
                                       fields.Bound(0.1))
    output_config: str = fields.option(
        "batching.config", "Where the chosen batching setting goes (TF Serving text format).")
    output_png: str = fields.option(
        "batching.png", "Plot of throughput against p99 for every setting ('' for none).")
    work_dir: str = fields.option(None, "Where a temporary folder for the settings' batching "
                                  "files and server logs is made (default: the system's).")
    progress: bool = fields.option(True, "Show a progress bar.")


def command(config_class, tune, tool, module):
    """(main, run) of a tuner command: main(config, args) runs `tune(config, tool)`
    (serving/tuning/run.py's tune or tune_batching); run() is its console entry point,
    with `config_class`'s flags filed under `module` (the command's __name__)."""
    def main(config, args):
        del args
        tune(config, tool)

    def run():
        logs.run(main, config=config_class, module=module)

    return main, run
