"""slimserve-tune-batching: measure server-side batching settings on real images and
write the best one that meets a latency budget as TF Serving's batching file.

    slimserve-tune-batching --model_base_path=/models/resnet --images=photos/ \
        --latency_budget_ms=100 --output_config=batching.config --output_png=batching.png

The batching-only mode of slimserve-tune (fp32, no XLA, no accuracy guard). Bounded by
--max_minutes; each setting runs in a fresh slimserve-server process, stopped with the
command (SIGTERM / SIGINT, or when the command is killed).
"""
import sys

from absl import flags

from slimserve.cli import logs
from slimserve.cli import tuning
from slimserve.serving.tools import batching_tuner
from slimserve.serving.tools import tuner as tuner_lib
from slimserve.serving.tools import tuner_inputs

TOOL = "slimserve-tune-batching"
FLAGS = flags.FLAGS
tuning.define_flags()
flags.DEFINE_string("images", None, "An image file or a folder of them (up to 256 used).")
flags.mark_flags_as_required(["model_base_path", "images", "latency_budget_ms"])


def main(argv):
    del argv
    sources = tuner_inputs.Sources(images=FLAGS.images)
    try:
        sources.check()
        tuning.check_outputs("output_config", "output_png")
        grid, reference_setting = tuning.batching_grid()
    except ValueError as error:
        sys.exit("%s: %s" % (TOOL, error))
    extra = [reference_setting] if reference_setting else []
    total = tuner_lib.planned(["fp32"], [False], grid, extra, "full", baseline=False)
    with tuner_lib.scratch(FLAGS.work_dir) as scratch:
        tuner = tuner_lib.Tuner(FLAGS.model_base_path, FLAGS.model_name,
                                sources,
                                FLAGS.signature_name, FLAGS.concurrency, FLAGS.requests,
                                FLAGS.max_seconds, guard=False, scratch_dir=scratch)
        try:
            tuner.prepare()
        except ValueError as error:
            sys.exit("%s: %s" % (TOOL, error))
        rows = tuning.run_sweep(TOOL, tuner, total,
                                lambda rows: print(batching_tuner.table(rows)),
                                precisions=["fp32"], xla_modes=[False], grid=grid,
                                extra_batchings=extra, search="full", baseline=False)
    reference = tuning.find_reference(rows, reference_setting)
    print(batching_tuner.table(rows))
    best = tuner_lib.choose(rows, FLAGS.latency_budget_ms)
    if FLAGS.output_png and rows:
        tuner_lib.plot(rows, FLAGS.output_png, best, reference,
                       latency_budget_ms=FLAGS.latency_budget_ms)
        print("plot: %s" % FLAGS.output_png)
    if best is None:
        sys.exit("%s: no setting met p99 <= %g ms without errors; raise --latency_budget_ms "
                 "or try smaller batches" % (TOOL, FLAGS.latency_budget_ms))
    batching_tuner.write_config(FLAGS.output_config, best, rows, FLAGS.latency_budget_ms,
                                FLAGS.concurrency, reference)
    print("chosen: %s (%.1f img/s, p99 %.1f ms) -> %s" % (
        tuner_lib.setting_of(best).batching.label(), best["images_per_s"], best["p99_ms"],
        FLAGS.output_config))
    tuning.print_reference(best, reference)


def run():
    logs.run(main)


if __name__ == "__main__":
    run()
