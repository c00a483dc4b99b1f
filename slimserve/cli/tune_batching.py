"""slimserve-tune-batching: measure server-side batching settings on real images and
write the best one that meets a latency budget as TF Serving's batching file.

    slimserve-tune-batching --model_base_path=/models/resnet --images=photos/ \
        --latency_budget_ms=100 --output_config=batching.config --output_png=batching.png

The batching-only mode of slimserve-tune (fp32, no XLA, no accuracy guard). Bounded by
--max_minutes; each setting runs in a fresh slimserve-server process, stopped with the
command (SIGTERM / SIGINT, or when the command is killed).
"""
import dataclasses
import sys

from slimserve import fields
from slimserve.cli import logs
from slimserve.cli import tuning
from slimserve.cli.tuning import TuningOptions
from slimserve.serving.tuning import batching_tuner
from slimserve.serving.tuning import inputs as tuner_inputs
from slimserve.serving.tuning import tuner as tuner_lib

TOOL = "slimserve-tune-batching"


@dataclasses.dataclass
class TuneBatchingConfig:
    """slimserve-tune-batching's flags: the tuners' shared section and the load images."""
    tuning: TuningOptions = fields.section(TuningOptions)
    images: str = fields.option(None, "An image file or a folder of them (up to 256 used).",
                                required=True)


CONFIG = TuneBatchingConfig


def main(config, args):
    del args
    options = config.tuning
    sources = tuner_inputs.Sources(images=config.images)
    sources.check()
    tuning.check_outputs(("--output_config", options.output_config),
                         ("--output_png", options.output_png))
    grid, reference_setting = tuning.batching_grid(options)
    extra = [reference_setting] if reference_setting else []
    total = tuner_lib.planned(["fp32"], [False], grid, extra, "full", baseline=False)
    with tuner_lib.scratch(options.work_dir) as scratch:
        tuner = tuner_lib.Tuner(options.model_base_path, options.model_name, sources,
                                options.signature_name, options.concurrency, options.requests,
                                options.max_seconds, guard=False, scratch_dir=scratch)
        tuner.prepare()
        rows = tuning.run_sweep(TOOL, tuner, total,
                                lambda rows: print(batching_tuner.table(rows)), options,
                                precisions=["fp32"], xla_modes=[False], grid=grid,
                                extra_batchings=extra, search="full", baseline=False)
    reference = tuning.find_reference(rows, reference_setting)
    print(batching_tuner.table(rows))
    best = tuner_lib.choose(rows, options.latency_budget_ms)
    if options.output_png and rows:
        tuner_lib.plot(rows, options.output_png, best, reference,
                       latency_budget_ms=options.latency_budget_ms)
        print("plot: %s" % options.output_png)
    if best is None:
        sys.exit("%s: no setting met p99 <= %g ms without errors; raise --latency_budget_ms "
                 "or try smaller batches" % (TOOL, options.latency_budget_ms))
    batching_tuner.write_config(options.output_config, best, rows, options.latency_budget_ms,
                                options.concurrency, reference)
    print("chosen: %s (%.1f img/s, p99 %.1f ms) -> %s" % (
        tuner_lib.setting_of(best).batching.label(), best["images_per_s"], best["p99_ms"],
        options.output_config))
    tuning.print_reference(best, reference)


def run():
    logs.run(main, config=CONFIG)


if __name__ == "__main__":
    run()
