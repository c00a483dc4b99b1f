"""A tuning run, end to end: the candidates this machine and this export allow, the sweep
under a progress bar that never leaves a server behind (SIGTERM / SIGINT stop the server
children, then the command exits 128 + signal), the choice and the files it is written
to. `tune(config)` is slimserve-tune, `tune_batching(config)` slimserve-tune-batching;
each config is the command's typed flags (slimserve/cli/tune.py, tune_batching.py).

Candidates (slimserve-tune): TensorFlow's precisions (fp32; bf16 where the CPU has
AVX512_BF16 or AMX) x XLA, and OpenVINO's precisions x streams when `--runtimes` names
openvino and this Python has it: fp32, bf16 where the CPU has it, int8 where the newest
version holds openvino/model_int8.xml (slimserve-export --openvino_int8 writes it when it
passes its accuracy guard). A version without an IR is converted at load, as the server
does. The chosen setting is written as server flags (--prefer_openvino_model=true
--openvino_precision=... --openvino_num_streams=... for OpenVINO) and a batching file.
"""
import importlib.util
import os
import signal
import sys
import time

from tqdm import tqdm

from slimserve import cpu
from slimserve import errors
from slimserve import outputs
from slimserve.serving import server_process
from slimserve.serving.clients import image_classifier
from slimserve.serving.core import openvino_model
from slimserve.serving.tuning import batching_tuner
from slimserve.serving.tuning import inputs as tuner_inputs
from slimserve.serving.tuning import tuner as tuner_lib

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
    os.cpu_count() or 1)


def _listed(values, flag, allowed):
    """The lower-cased, de-duplicated `values`; UserError naming `flag` when one is not in
    `allowed` or none is given."""
    wanted = list(dict.fromkeys(v.strip().lower() for v in values if v.strip()))
    unknown = [v for v in wanted if v not in allowed]
    if unknown or not wanted:
        raise errors.UserError("%s: expected some of %s, got %s" % (
            flag, ",".join(allowed), ",".join(values) or "nothing"))
    return wanted


def precisions(values, tool):
    """TensorFlow's precisions of --precisions (auto: fp32, and bf16 where the CPU has
    native bf16)."""
    if [v.strip().lower() for v in values] == ["auto"]:
        if cpu.cpu_supports_bf16():
            return ["fp32", "bf16"]
        print("%s: this CPU has no native bf16 (AVX512_BF16 or AMX): trying fp32 only "
              "(--precisions=fp32,bf16 forces it)" % tool, file=sys.stderr)
        return ["fp32"]
    return _listed(values, "--precisions", ["auto"] + sorted(tuner_lib.PRECISIONS))


def xla_modes(values):
    names = {"true": True, "1": True, "on": True, "false": False, "0": False, "off": False}
    try:
        modes = [names[v.strip().lower()] for v in values]
    except KeyError:
        raise errors.UserError("--xla: expected true/false values, got %s"
                               % ",".join(values)) from None
    if not modes:
        raise errors.UserError("--xla: give at least one of false, true")
    return list(dict.fromkeys(modes))


def openvino_candidates(config, tool):
    """[(OpenVINO precision, streams)] of the flags (--runtimes, --openvino_precisions,
    --openvino_streams), empty when OpenVINO is not asked for or not installed here;
    a line on stderr for each candidate left out and why."""
    runtimes = _listed(config.runtimes, "--runtimes", list(tuner_lib.RUNTIMES))
    if tuner_lib.OPENVINO not in runtimes:
        return [], runtimes
    try:
        openvino_model.runtime()
    except openvino_model.NotConvertible as error:
        print("%s: not trying OpenVINO: %s" % (tool, error), file=sys.stderr)
        return [], [r for r in runtimes if r != tuner_lib.OPENVINO]
    wanted = [v.strip().lower() for v in config.openvino_precisions]
    if wanted == ["auto"]:
        wanted = ["fp32"]
        if cpu.cpu_supports_bf16():
            wanted.append("bf16")
        else:
            print("%s: OpenVINO bf16 left out: this CPU has no AVX512_BF16 or AMX" % tool,
                  file=sys.stderr)
        try:
            version = image_classifier.resolve_model_dir(config.tuning.model_base_path)
        except errors.UserError as error:
            raise errors.UserError("--model_base_path=%s: %s" % (
                config.tuning.model_base_path, error)) from None
        if openvino_model.has_model(version, openvino_model.INT8_MODEL_FILE):
            wanted.append("int8")
        else:
            print("%s: OpenVINO int8 left out: %s has no %s (slimserve-export "
                  "--openvino_int8 writes it when it passes its accuracy guard)" % (
                      tool, version, openvino_model.INT8_MODEL_FILE), file=sys.stderr)
    else:
        wanted = _listed(config.openvino_precisions, "--openvino_precisions",
                         ["auto"] + list(tuner_lib.OPENVINO_PRECISIONS))
    streams = list(dict.fromkeys(config.openvino_streams))
    if not streams:
        raise errors.UserError("--openvino_streams: give at least one (0: OpenVINO's "
                               "latency hint)")
    if tuner_lib.TENSORFLOW not in runtimes and config.min_agreement > 0:
        print("%s: the baseline (TensorFlow fp32, no batching) is still measured: every "
              "OpenVINO setting is compared with it" % tool, file=sys.stderr)
    return [(p, n) for p in wanted for n in streams], runtimes


def batching_grid(options):
    """(the grid from the flags, TF Serving's documented CPU start or None)."""
    grid = list(batching_tuner.grid(options.max_batch_sizes, options.batch_timeouts_micros,
                                    options.num_batch_threads, options.max_enqueued_batches))
    if not grid:
        raise errors.UserError("the batching grid is empty")
    reference = (batching_tuner.documented_cpu_start(CORES) if options.compare_documented
                 else None)
    return grid, reference


def check_outputs(*paths):
    """Fails before any measuring when an output flag names a path that cannot be written
    (`paths`: (flag, path) pairs; an empty path writes nothing)."""
    for flag, path in paths:
        if not path:
            continue
        outputs.check_output(path, flag)
        if flag == "--output_png" and importlib.util.find_spec("matplotlib") is None:
            raise errors.UserError("--output_png needs matplotlib (pip install matplotlib), "
                                   "or give --output_png=''")


def find_reference(rows, reference):
    """The row measured with the documented CPU start (under the chosen pair), or None."""
    if reference is None:
        return None
    return next((r for r in rows if r["batching"]
                 and tuner_lib.setting_of(r).batching == reference), None)


def print_reference(best, reference):
    """How the chosen setting compares with TF Serving's documented CPU starting point
    (find_reference's row; nothing when that setting was not measured)."""
    if reference is not None:
        print("TF Serving's documented CPU starting point: %.1f img/s, p99 %.1f ms (%.2fx)" % (
            reference["images_per_s"], reference["p99_ms"],
            best["images_per_s"] / reference["images_per_s"]))


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_signal(signum, frame):
    """SIGTERM to every server child (so in-flight load fails at once), then unwind once;
    a second signal only repeats the SIGTERM."""
    del frame
    server_process.signal_all()
    if not getattr(_on_signal, "fired", False):
        _on_signal.fired = True
        raise Interrupted(signum)


def run_sweep(tool, tuner, total, print_rows, options, **sweep_args):
    """tuner_lib.sweep under a progress bar (options: the TuningOptions); on SIGTERM /
    SIGINT stops the servers, prints what was measured (`print_rows(rows)`) and exits
    128 + the signal. Returns the rows."""
    rows = []
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    bar = tqdm(total=total, disable=not options.progress, unit="setting")

    def progress(row):
        rows.append(row)
        agreement = "" if row["agreement"] is None else " agree %.4f" % row["agreement"]
        bar.set_postfix_str("%s: %.1f img/s p99 %.0f ms%s" % (
            row["label"], row["images_per_s"], row["p99_ms"], agreement))
        bar.update()

    deadline = time.monotonic() + options.max_minutes * 60
    try:
        tuner_lib.sweep(tuner, deadline=deadline, progress=progress, **sweep_args)
    except Interrupted as interrupted:
        bar.close()
        stopped = server_process.stop_all()
        if rows:
            print_rows(rows)
        print("%s: interrupted by %s after %d of %d settings%s" % (
            tool, interrupted, len(rows), total,
            "; stopped %d server(s)" % stopped if stopped else ""), file=sys.stderr)
        sys.exit(128 + interrupted.signum)
    finally:
        bar.close()
        for number, handler in previous.items():
            signal.signal(number, handler)
    if len(rows) < total and time.monotonic() > deadline:
        print("--max_minutes=%g reached: %d of %d settings measured" % (
            options.max_minutes, len(rows), total), file=sys.stderr)
    return rows


def tune(config, tool="slimserve-tune"):
    """slimserve-tune (config: its TuneConfig): measures, prints the table, writes the
    chosen server flags and batching file and the plot; exits non-zero (SystemExit with
    the reason) when no setting fits."""
    options = config.tuning
    sources = tuner_inputs.Sources(config.images or "", config.data_dir or "",
                                   config.logs or "", config.compare_images,
                                   config.max_input_mb << 20)
    sources.check()
    check_outputs(("--output_config", options.output_config),
                  ("--output_png", options.output_png), ("--output_flags", config.output_flags),
                  ("--output_model_config", config.output_model_config))
    grid, reference_setting = batching_grid(options)
    openvino, runtimes = openvino_candidates(config, tool)
    tf_pairs = ((precisions(config.precisions, tool), xla_modes(config.xla))
                if tuner_lib.TENSORFLOW in runtimes else ([], []))
    if not tf_pairs[0] and not openvino:
        raise errors.UserError("--runtimes=%s: nothing to try on this machine"
                               % ",".join(config.runtimes))
    extra = [reference_setting] if reference_setting else []
    guard = config.min_agreement > 0
    candidates = dict(precisions=tf_pairs[0], xla_modes=tf_pairs[1], openvino=openvino)
    total = tuner_lib.planned(grid=grid, extra_batchings=extra, search=config.search,
                              **candidates)
    budget, floor = options.latency_budget_ms, config.min_agreement
    with tuner_lib.scratch(options.work_dir) as scratch:
        tuner = tuner_lib.Tuner(options.model_base_path, options.model_name, sources,
                                options.signature_name, options.concurrency, options.requests,
                                options.max_seconds, config.server_flag, guard=guard,
                                scratch_dir=scratch, max_accuracy_drop=config.max_accuracy_drop)
        tuner.prepare()
        rows = run_sweep(tool, tuner, total,
                         lambda rows: print(tuner_lib.table(rows, budget, floor)), options,
                         grid=grid, extra_batchings=extra, search=config.search,
                         min_agreement=floor, **candidates)
    best = tuner_lib.choose(rows, budget, floor)
    reference = find_reference(rows, reference_setting)
    measured = tuner_lib.table(rows, budget, floor, best)
    if guard:
        print("signature %s, compared on %s; rejected below agreement %g with TensorFlow "
              "fp32, no XLA, no batching%s" % (
                  options.signature_name, tuner.compare_source, floor,
                  " or more than %g below its validation accuracy" % config.max_accuracy_drop
                  if tuner.compare_labels else ""))
    print(measured)
    if options.output_png and rows:
        tuner_lib.plot(rows, options.output_png, best, reference, floor if guard else None,
                       budget)
        print("plot: %s" % options.output_png)
    if best is None:
        sys.exit("%s: no setting met p99 <= %g ms without errors%s; raise --latency_budget_ms "
                 "or try smaller batches" % (tool, budget, " and agreed with fp32"
                                             if guard else ""))
    summary = ["Chosen by %s: %s, %.1f img/s, p99 %.1f ms at concurrency %d (p99 budget %g "
               "ms)." % (tool, best["label"], best["images_per_s"], best["p99_ms"],
                         options.concurrency, budget)]
    if guard:
        summary.append("Agreement with TensorFlow fp32, no XLA, no batching: %.4f on %s "
                       "(required >= %g)%s." % (
                           best["agreement"], tuner.compare_source, floor,
                           "; validation accuracy %.4f (the baseline's %.4f)" % (
                               best["accuracy"], tuner.baseline_accuracy)
                           if best.get("accuracy") is not None else ""))
    batching_file = options.output_config if best["batching"] else None
    if batching_file:
        batching_tuner.write_config(batching_file, best, rows, budget, options.concurrency,
                                    reference, tool=tool, measured=measured, notes=summary[1:])
    if config.output_model_config:
        tuner_lib.write_model_config(config.output_model_config, best, options.model_name,
                                     options.model_base_path, summary[:1] + [
                                         "slimserve-server --flagfile=%s" % config.output_flags])
    server_flags = tuner_lib.server_flags(best, options.model_name, options.model_base_path,
                                          batching_file, config.server_flag,
                                          config.output_model_config)
    tfserving = tuner_lib.tfserving_flags(server_flags)
    runtime_note = (["(TF Serving has no OpenVINO runtime: it serves this model on "
                     "TensorFlow, without the --openvino flags%s)" % (
                         ", and with model_platform \"tensorflow\" in %s"
                         % config.output_model_config if config.output_model_config else "")]
                    if best.get("runtime") == tuner_lib.OPENVINO else [])
    tuner_lib.write_flagfile(config.output_flags, server_flags, summary + [
        "", "slimserve-server --flagfile=%s" % config.output_flags,
        "tensorflow_model_server %s" % " ".join(tfserving)] + runtime_note + [
        "(for TF Serving in Docker, give the paths as the container sees them)", ""])
    print("chosen: %s (%.1f img/s, p99 %.1f ms%s)" % (
        best["label"], best["images_per_s"], best["p99_ms"],
        ", agreement %.4f" % best["agreement"] if guard else ""))
    print("server flags -> %s%s%s" % (
        config.output_flags, "; batching -> %s" % batching_file if batching_file else
        " (no batching)", "; model config -> %s" % config.output_model_config
        if config.output_model_config else ""))
    print("slimserve-server --flagfile=%s" % config.output_flags)
    print("tensorflow_model_server %s" % " ".join(tfserving))
    print_reference(best, reference)


def tune_batching(config, tool="slimserve-tune-batching"):
    """slimserve-tune-batching (config: its TuneBatchingConfig): the batching grid on
    TensorFlow fp32 without a guard; writes the batching file and the plot."""
    options = config.tuning
    sources = tuner_inputs.Sources(images=config.images)
    sources.check()
    check_outputs(("--output_config", options.output_config),
                  ("--output_png", options.output_png))
    grid, reference_setting = batching_grid(options)
    extra = [reference_setting] if reference_setting else []
    total = tuner_lib.planned(["fp32"], [False], grid, extra, "full", baseline=False)
    with tuner_lib.scratch(options.work_dir) as scratch:
        tuner = tuner_lib.Tuner(options.model_base_path, options.model_name, sources,
                                options.signature_name, options.concurrency, options.requests,
                                options.max_seconds, guard=False, scratch_dir=scratch)
        tuner.prepare()
        rows = run_sweep(tool, tuner, total, lambda rows: print(batching_tuner.table(rows)),
                         options, precisions=["fp32"], xla_modes=[False], grid=grid,
                         extra_batchings=extra, search="full", baseline=False)
    reference = find_reference(rows, reference_setting)
    print(batching_tuner.table(rows))
    best = tuner_lib.choose(rows, options.latency_budget_ms)
    if options.output_png and rows:
        tuner_lib.plot(rows, options.output_png, best, reference,
                       latency_budget_ms=options.latency_budget_ms)
        print("plot: %s" % options.output_png)
    if best is None:
        sys.exit("%s: no setting met p99 <= %g ms without errors; raise --latency_budget_ms "
                 "or try smaller batches" % (tool, options.latency_budget_ms))
    batching_tuner.write_config(options.output_config, best, rows, options.latency_budget_ms,
                                options.concurrency, reference)
    print("chosen: %s (%.1f img/s, p99 %.1f ms) -> %s" % (
        tuner_lib.setting_of(best).batching.label(), best["images_per_s"], best["p99_ms"],
        options.output_config))
    print_reference(best, reference)
