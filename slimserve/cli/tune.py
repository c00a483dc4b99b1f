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
import dataclasses
import sys

from slimserve import cpu
from slimserve import errors
from slimserve import fields
from slimserve.cli import logs
from slimserve.cli import tuning
from slimserve.cli.tuning import TuningOptions
from slimserve.serving.tuning import batching_tuner
from slimserve.serving.tuning import inputs as tuner_inputs
from slimserve.serving.tuning import tuner as tuner_lib

TOOL = "slimserve-tune"


@dataclasses.dataclass
class TuneConfig:
    """slimserve-tune's flags: the tuners' shared section and its own."""
    tuning: TuningOptions = fields.section(TuningOptions)
    images: str = fields.option(None, "Load images: an image file or a folder of them (up to "
                                "256 used). Default: the comparison inputs.")
    data_dir: str = fields.option(None, "A converted data set: predictions are compared on "
                                  "its validation split (validation-*-of-* TFRecords).")
    logs: str = fields.option(None, "Request-log files (a glob): predictions are compared on "
                              "the logged inputs to --signature_name (when --data_dir is not "
                              "given).")
    compare_images: int = fields.option(
        500, "At most this many comparison inputs (each setting answers all of them before "
        "its load).", fields.Bound(1, 100000))
    max_input_mb: int = fields.option(
        256, "Upper bound on the bytes of comparison inputs read (checked before each record "
        "is read).", fields.Bound(1, 16384))
    min_agreement: float = fields.option(
        0.995, "Reject a setting that picks the fp32 baseline's class on fewer than this "
        "fraction of the comparison inputs (0: no guard).", fields.PROBABILITY)
    precisions: tuple = fields.option(
        ("auto",), "Precisions tried: fp32, bf16 (the server's --mixed_precision=bfloat16). "
        "auto: fp32, and bf16 when the CPU has native bf16 (AVX512_BF16 or AMX).")
    xla: tuple = fields.option(("false", "true"), "XLA settings tried (the server's "
                               "--xla_cpu_compilation_enabled).")
    search: str = fields.option(
        "staged", "staged: every precision x XLA pair at the grid's largest batch and longest "
        "timeout, then the batching grid under the fastest accepted pair; full: the whole "
        "product.", choices=tuner_lib.SEARCHES)
    server_flag: tuple = fields.option(
        (), "A slimserve-server flag given to every setting, e.g. "
        "--server_flag=--tensorflow_intra_op_parallelism=2 (repeatable; also written to "
        "--output_flags).", kind=list, repeat=True)
    output_flags: str = fields.option(
        "server.flags", "Where the chosen server flags go: a flagfile for slimserve-server "
        "--flagfile=..., one flag a line, which tensorflow_model_server takes too (comments "
        "say how).")


CONFIG = TuneConfig


def precisions(config):
    wanted = [p.strip().lower() for p in config.precisions]
    if wanted == ["auto"]:
        native = cpu.cpu_supports_bf16()
        if not native:
            print("%s: this CPU has no native bf16 (AVX512_BF16 or AMX): trying fp32 only "
                  "(--precisions=fp32,bf16 forces it)" % TOOL, file=sys.stderr)
        return ["fp32", "bf16"] if native else ["fp32"]
    unknown = sorted(set(wanted) - set(tuner_lib.PRECISIONS))
    if unknown or not wanted:
        raise errors.UserError("--precisions: expected auto or some of %s, got %s" % (
            ",".join(sorted(tuner_lib.PRECISIONS)), ",".join(config.precisions)))
    return list(dict.fromkeys(wanted))


def xla_modes(config):
    values = {"true": True, "1": True, "on": True, "false": False, "0": False, "off": False}
    try:
        modes = [values[v.strip().lower()] for v in config.xla]
    except KeyError:
        raise errors.UserError("--xla: expected true/false values, got %s"
                               % ",".join(config.xla)) from None
    if not modes:
        raise errors.UserError("--xla: give at least one of false, true")
    return list(dict.fromkeys(modes))


def main(config, args):
    del args
    options = config.tuning
    sources = tuner_inputs.Sources(config.images or "", config.data_dir or "",
                                   config.logs or "", config.compare_images,
                                   config.max_input_mb << 20)
    sources.check()
    tuning.check_outputs(("--output_config", options.output_config),
                         ("--output_png", options.output_png),
                         ("--output_flags", config.output_flags))
    grid, reference_setting = tuning.batching_grid(options)
    pairs = (precisions(config), xla_modes(config))
    extra = [reference_setting] if reference_setting else []
    guard = config.min_agreement > 0
    total = tuner_lib.planned(pairs[0], pairs[1], grid, extra, config.search)
    budget, floor = options.latency_budget_ms, config.min_agreement
    with tuner_lib.scratch(options.work_dir) as scratch:
        tuner = tuner_lib.Tuner(options.model_base_path, options.model_name, sources,
                                options.signature_name, options.concurrency, options.requests,
                                options.max_seconds, config.server_flag, guard=guard,
                                scratch_dir=scratch)
        tuner.prepare()
        rows = tuning.run_sweep(TOOL, tuner, total,
                                lambda rows: print(tuner_lib.table(rows, budget, floor)),
                                options, precisions=pairs[0], xla_modes=pairs[1], grid=grid,
                                extra_batchings=extra, search=config.search,
                                min_agreement=floor)
    best = tuner_lib.choose(rows, budget, floor)
    reference = tuning.find_reference(rows, reference_setting)
    measured = tuner_lib.table(rows, budget, floor, best)
    if guard:
        print("signature %s, compared on %s; rejected below agreement %g with fp32, no XLA, "
              "no batching" % (options.signature_name, tuner.compare_source, floor))
    print(measured)
    if options.output_png and rows:
        tuner_lib.plot(rows, options.output_png, best, reference, floor if guard else None,
                       budget)
        print("plot: %s" % options.output_png)
    if best is None:
        sys.exit("%s: no setting met p99 <= %g ms without errors%s; raise --latency_budget_ms "
                 "or try smaller batches" % (TOOL, budget, " and agreed with fp32"
                                             if guard else ""))
    summary = ["Chosen by slimserve-tune: %s, %.1f img/s, p99 %.1f ms at concurrency %d "
               "(p99 budget %g ms)." % (best["label"], best["images_per_s"], best["p99_ms"],
                                        options.concurrency, budget)]
    if guard:
        summary.append("Agreement with fp32, no XLA, no batching: %.4f on %s (required >= %g)."
                       % (best["agreement"], tuner.compare_source, floor))
    batching_file = options.output_config if best["batching"] else None
    if batching_file:
        batching_tuner.write_config(batching_file, best, rows, budget, options.concurrency,
                                    reference, tool=TOOL, measured=measured, notes=summary[1:])
    server_flags = tuner_lib.server_flags(best, options.model_name, options.model_base_path,
                                          batching_file, config.server_flag)
    tfserving = tuner_lib.tfserving_flags(server_flags)
    tuner_lib.write_flagfile(config.output_flags, server_flags, summary + [
        "", "slimserve-server --flagfile=%s" % config.output_flags,
        "tensorflow_model_server %s" % " ".join(tfserving),
        "(for TF Serving in Docker, give the paths as the container sees them)", ""])
    print("chosen: %s (%.1f img/s, p99 %.1f ms%s)" % (
        best["label"], best["images_per_s"], best["p99_ms"],
        ", agreement %.4f" % best["agreement"] if guard else ""))
    print("server flags -> %s%s" % (config.output_flags, "; batching -> %s" % batching_file
                                    if batching_file else " (no batching)"))
    print("slimserve-server --flagfile=%s" % config.output_flags)
    print("tensorflow_model_server %s" % " ".join(tfserving))
    tuning.print_reference(best, reference)


def run():
    logs.run(main, config=CONFIG)


if __name__ == "__main__":
    run()
