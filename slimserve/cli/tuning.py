"""What slimserve-tune and slimserve-tune-batching share: the load and batching-grid
flags (TuningOptions, a section of both commands' configs), and running a sweep under a
progress bar in a way that never leaves a server behind (SIGTERM / SIGINT stop the server
children, then the command exits 128 + signal).
"""
import dataclasses
import importlib.util
import os
import signal
import sys
import time

from tqdm import tqdm

from slimserve import errors
from slimserve import fields
from slimserve import outputs
from slimserve.serving import server_process
from slimserve.serving.tuning import batching_tuner
from slimserve.serving.tuning import tuner as tuner_lib

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
    os.cpu_count() or 1)


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


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def print_reference(best, reference):
    """How the chosen setting compares with TF Serving's documented CPU starting point
    (find_reference's row; nothing when that setting was not measured)."""
    if reference is not None:
        print("TF Serving's documented CPU starting point: %.1f img/s, p99 %.1f ms (%.2fx)" % (
            reference["images_per_s"], reference["p99_ms"],
            best["images_per_s"] / reference["images_per_s"]))


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
