"""slimserve-tune-batching: measure server-side batching settings on real images and
write the best one that meets a latency budget as TF Serving's batching file.

    slimserve-tune-batching --model_base_path=/models/resnet --images=photos/ \
        --latency_budget_ms=100 --output_config=batching.config --output_png=batching.png

Bounded by --max_minutes; each setting runs in a fresh slimserve-server process.
"""
import os
import sys
import time

from absl import flags
from tqdm import tqdm

from slimserve.serving.tools import batching_tuner
from slimserve.serving.tools import loadtest
from slimserve.cli import logs

FLAGS = flags.FLAGS
flags.DEFINE_string("model_base_path", None, "Folder of integer version sub-folders.")
flags.DEFINE_string("model_name", "resnet", "Model name served during the sweep.")
flags.DEFINE_string("images", None, "An image file or a folder of them (up to 256 used).")
flags.DEFINE_string("signature_name", "serving_default", "Signature taking image_bytes.")
flags.DEFINE_float("latency_budget_ms", None, "Highest acceptable p99 latency (ms).",
                   lower_bound=0.0)
flags.DEFINE_integer("concurrency", 16, "Closed-loop clients during each measurement.",
                     lower_bound=1)
flags.DEFINE_integer("requests", 300, "Batch-1 requests measured per setting.", lower_bound=1)
flags.DEFINE_float("max_seconds", 60.0, "Upper bound on one setting's measurement.",
                   lower_bound=1.0)
flags.DEFINE_list("max_batch_sizes", ["4", "8", "16", "32"], "max_batch_size values tried.")
flags.DEFINE_list("batch_timeouts_micros", ["0", "1000", "5000"],
                  "batch_timeout_micros values tried.")
flags.DEFINE_list("num_batch_threads", [str(os.cpu_count() or 1)],
                  "num_batch_threads values tried (default: the number of cores).")
flags.DEFINE_list("max_enqueued_batches", ["100"], "max_enqueued_batches values tried.")
flags.DEFINE_bool("compare_documented", True,
                  "Also measure TF Serving's documented CPU starting point (batching/README.md) "
                  "on the same load and report the chosen setting against it.")
flags.DEFINE_float("max_minutes", 20.0, "Stop starting new settings after this long.",
                   lower_bound=0.1)
flags.DEFINE_string("output_config", "batching.config",
                    "Where the chosen setting goes (TF Serving text format).")
flags.DEFINE_string("output_png", "batching.png",
                    "Plot of throughput against p99 for every setting ('' for none).")
flags.DEFINE_bool("progress", True, "Show a progress bar.")
flags.mark_flags_as_required(["model_base_path", "images", "latency_budget_ms"])


def _ints(flag):
    try:
        return [int(v) for v in FLAGS[flag].value]
    except ValueError:
        raise ValueError("--%s: expected integers, got %s" % (flag, FLAGS[flag].value)) from None


def main(argv):
    del argv
    try:
        images = loadtest.load_images(FLAGS.images)
        settings = list(batching_tuner.grid(_ints("max_batch_sizes"), _ints("batch_timeouts_micros"),
                                            _ints("num_batch_threads"),
                                            _ints("max_enqueued_batches")))
    except ValueError as error:
        sys.exit("slimserve-tune-batching: %s" % error)
    reference_setting = batching_tuner.documented_cpu_start(os.cpu_count() or 1)
    if FLAGS.compare_documented:
        settings.append(reference_setting)
    deadline = time.monotonic() + FLAGS.max_minutes * 60
    with tqdm(total=len(settings), disable=not FLAGS.progress, unit="setting") as bar:
        def progress(row):
            bar.set_postfix_str("%s: %.1f img/s p99 %.0f ms" % (
                batching_tuner.Setting(**{k: row[k] for k in batching_tuner.FIELDS}).label(),
                row["images_per_s"], row["p99_ms"]))
            bar.update()

        try:
            rows = batching_tuner.sweep(FLAGS.model_base_path, FLAGS.model_name, images,
                                        settings, FLAGS.concurrency, FLAGS.requests,
                                        FLAGS.max_seconds, deadline, progress)
        except RuntimeError as error:
            sys.exit("slimserve-tune-batching: %s" % error)
    if len(rows) < len(settings):
        print("--max_minutes=%g reached: %d of %d settings measured" % (
            FLAGS.max_minutes, len(rows), len(settings)), file=sys.stderr)
    reference = next((r for r in rows if FLAGS.compare_documented and batching_tuner.Setting(
        **{k: r[k] for k in batching_tuner.FIELDS}) == reference_setting), None)
    print(batching_tuner.table(rows))
    best = batching_tuner.choose(rows, FLAGS.latency_budget_ms)
    if FLAGS.output_png and rows:
        batching_tuner.plot(rows, FLAGS.output_png, best, reference)
        print("plot: %s" % FLAGS.output_png)
    if best is None:
        sys.exit("slimserve-tune-batching: no setting met p99 <= %g ms without errors; raise "
                 "--latency_budget_ms or try smaller batches" % FLAGS.latency_budget_ms)
    batching_tuner.write_config(FLAGS.output_config, best, rows, FLAGS.latency_budget_ms,
                                FLAGS.concurrency, reference)
    print("chosen: %s (%.1f img/s, p99 %.1f ms) -> %s" % (
        batching_tuner.Setting(**{k: best[k] for k in batching_tuner.FIELDS}).label(),
        best["images_per_s"], best["p99_ms"], FLAGS.output_config))
    if reference is not None:
        print("TF Serving's documented CPU starting point: %.1f img/s, p99 %.1f ms (%.2fx)" % (
            reference["images_per_s"], reference["p99_ms"],
            best["images_per_s"] / reference["images_per_s"]))


def run():
    logs.run(main)


if __name__ == "__main__":
    run()
