"""slimserve-tune: find the fastest serving configuration of a model on this machine
that still answers like the fp32 model: precision (fp32, bf16 where the CPU has it), XLA
on/off and the batching grid, each measured in a fresh slimserve-server process.

    slimserve-tune --model_base_path=/models/resnet --data_dir=data/ \
        --latency_budget_ms=100 --output_flags=server.flags \
        --output_config=batching.config --output_png=tuning.png
    slimserve-server --flagfile=server.flags

Every setting answers the same comparison inputs (the validation split of --data_dir,
else --logs, else --images) and is rejected when it picks the fp32 baseline's class on
fewer than --min_agreement of them. Writes the chosen server flags (a flagfile that
tensorflow_model_server's flags can be read from too), the batching file, the table and
the plot. Bounded by --max_minutes; SIGTERM / SIGINT stop the server children.
"""
import sys

from absl import flags

from slimserve import cpu
from slimserve.cli import logs
from slimserve.cli import tuning
from slimserve.serving.tools import batching_tuner
from slimserve.serving.tools import tuner as tuner_lib
from slimserve.serving.tools import tuner_inputs

TOOL = "slimserve-tune"
FLAGS = flags.FLAGS
tuning.define_flags()
flags.DEFINE_string("images", None, "Load images: an image file or a folder of them (up "
                    "to 256 used). Default: the comparison inputs.")
flags.DEFINE_string("data_dir", None, "A converted data set: predictions are compared on "
                    "its validation split (validation-*-of-* TFRecords).")
flags.DEFINE_string("logs", None, "Request-log files (a glob): predictions are compared on "
                    "the logged inputs to --signature_name (when --data_dir is not given).")
flags.DEFINE_integer("compare_images", 500, "At most this many comparison inputs (each "
                     "setting answers all of them before its load).", lower_bound=1,
                     upper_bound=100000)
flags.DEFINE_integer("max_input_mb", 256, "Upper bound on the bytes of comparison inputs "
                     "read (checked before each record is read).", lower_bound=1,
                     upper_bound=16384)
flags.DEFINE_float("min_agreement", 0.995, "Reject a setting that picks the fp32 baseline's "
                   "class on fewer than this fraction of the comparison inputs (0: no "
                   "guard).", lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_list("precisions", ["auto"], "Precisions tried: fp32, bf16 (the server's "
                  "--mixed_precision=bfloat16). auto: fp32, and bf16 when the CPU has native "
                  "bf16 (AVX512_BF16 or AMX).")
flags.DEFINE_list("xla", ["false", "true"], "XLA settings tried (the server's "
                  "--xla_cpu_compilation_enabled).")
flags.DEFINE_enum("search", "staged", tuner_lib.SEARCHES,
                  "staged: every precision x XLA pair at the grid's largest batch and longest "
                  "timeout, then the batching grid under the fastest accepted pair; full: "
                  "the whole product.")
flags.DEFINE_multi_string("server_flag", [], "A slimserve-server flag given to every "
                          "setting, e.g. --server_flag=--tensorflow_intra_op_parallelism=2 "
                          "(repeatable; also written to --output_flags).")
flags.DEFINE_string("output_flags", "server.flags", "Where the chosen server flags go: a "
                    "flagfile for slimserve-server --flagfile=..., one flag a line, which "
                    "tensorflow_model_server takes too (comments say how).")
flags.mark_flags_as_required(["model_base_path", "latency_budget_ms"])


def precisions():
    wanted = [p.strip().lower() for p in FLAGS.precisions]
    if wanted == ["auto"]:
        native = cpu.cpu_supports_bf16()
        if not native:
            print("%s: this CPU has no native bf16 (AVX512_BF16 or AMX): trying fp32 only "
                  "(--precisions=fp32,bf16 forces it)" % TOOL, file=sys.stderr)
        return ["fp32", "bf16"] if native else ["fp32"]
    unknown = sorted(set(wanted) - set(tuner_lib.PRECISIONS))
    if unknown or not wanted:
        raise ValueError("--precisions: expected auto or some of %s, got %s" % (
            ",".join(sorted(tuner_lib.PRECISIONS)), ",".join(FLAGS.precisions)))
    return list(dict.fromkeys(wanted))


def xla_modes():
    values = {"true": True, "1": True, "on": True, "false": False, "0": False, "off": False}
    try:
        modes = [values[v.strip().lower()] for v in FLAGS.xla]
    except KeyError:
        raise ValueError("--xla: expected true/false values, got %s" % ",".join(FLAGS.xla)) \
            from None
    if not modes:
        raise ValueError("--xla: give at least one of false, true")
    return list(dict.fromkeys(modes))


def main(argv):
    del argv
    sources = tuner_inputs.Sources(FLAGS.images or "", FLAGS.data_dir or "", FLAGS.logs or "",
                                   FLAGS.compare_images, FLAGS.max_input_mb << 20)
    try:
        sources.check()
        tuning.check_outputs("output_config", "output_png", "output_flags")
        grid, reference_setting = tuning.batching_grid()
        pairs = (precisions(), xla_modes())
    except ValueError as error:
        sys.exit("%s: %s" % (TOOL, error))
    extra = [reference_setting] if reference_setting else []
    guard = FLAGS.min_agreement > 0
    total = tuner_lib.planned(pairs[0], pairs[1], grid, extra, FLAGS.search)
    budget, floor = FLAGS.latency_budget_ms, FLAGS.min_agreement
    with tuner_lib.scratch(FLAGS.work_dir) as scratch:
        tuner = tuner_lib.Tuner(FLAGS.model_base_path, FLAGS.model_name, sources,
                                FLAGS.signature_name, FLAGS.concurrency, FLAGS.requests,
                                FLAGS.max_seconds, FLAGS.server_flag, guard=guard,
                                scratch_dir=scratch)
        try:
            tuner.prepare()
        except ValueError as error:
            sys.exit("%s: %s" % (TOOL, error))
        rows = tuning.run_sweep(TOOL, tuner, total,
                                lambda rows: print(tuner_lib.table(rows, budget, floor)),
                                precisions=pairs[0], xla_modes=pairs[1], grid=grid,
                                extra_batchings=extra, search=FLAGS.search,
                                min_agreement=floor)
    best = tuner_lib.choose(rows, budget, floor)
    reference = tuning.find_reference(rows, reference_setting)
    measured = tuner_lib.table(rows, budget, floor, best)
    if guard:
        print("signature %s, compared on %s; rejected below agreement %g with fp32, no XLA, "
              "no batching" % (FLAGS.signature_name, tuner.compare_source, floor))
    print(measured)
    if FLAGS.output_png and rows:
        tuner_lib.plot(rows, FLAGS.output_png, best, reference, floor if guard else None,
                       budget)
        print("plot: %s" % FLAGS.output_png)
    if best is None:
        sys.exit("%s: no setting met p99 <= %g ms without errors%s; raise --latency_budget_ms "
                 "or try smaller batches" % (TOOL, budget, " and agreed with fp32"
                                             if guard else ""))
    summary = ["Chosen by slimserve-tune: %s, %.1f img/s, p99 %.1f ms at concurrency %d "
               "(p99 budget %g ms)." % (best["label"], best["images_per_s"], best["p99_ms"],
                                        FLAGS.concurrency, budget)]
    if guard:
        summary.append("Agreement with fp32, no XLA, no batching: %.4f on %s (required >= %g)."
                       % (best["agreement"], tuner.compare_source, floor))
    batching_file = FLAGS.output_config if best["batching"] else None
    if batching_file:
        batching_tuner.write_config(batching_file, best, rows, budget, FLAGS.concurrency,
                                    reference, tool=TOOL, measured=measured, notes=summary[1:])
    server_flags = tuner_lib.server_flags(best, FLAGS.model_name, FLAGS.model_base_path,
                                          batching_file, FLAGS.server_flag)
    tfserving = tuner_lib.tfserving_flags(server_flags)
    tuner_lib.write_flagfile(FLAGS.output_flags, server_flags, summary + [
        "", "slimserve-server --flagfile=%s" % FLAGS.output_flags,
        "tensorflow_model_server %s" % " ".join(tfserving),
        "(for TF Serving in Docker, give the paths as the container sees them)", ""])
    print("chosen: %s (%.1f img/s, p99 %.1f ms%s)" % (
        best["label"], best["images_per_s"], best["p99_ms"],
        ", agreement %.4f" % best["agreement"] if guard else ""))
    print("server flags -> %s%s" % (FLAGS.output_flags, "; batching -> %s" % batching_file
                                    if batching_file else " (no batching)"))
    print("slimserve-server --flagfile=%s" % FLAGS.output_flags)
    print("tensorflow_model_server %s" % " ".join(tfserving))
    tuning.print_reference(best, reference)


def run():
    logs.run(main)


if __name__ == "__main__":
    run()
