"""What slimserve-tune and slimserve-tune-batching share: the load and batching-grid
flags, and running a sweep under a progress bar in a way that never leaves a server
behind (SIGTERM / SIGINT stop the server children, then the command exits 128 + signal).
"""
import importlib.util
import os
import signal
import sys
import time

from absl import flags
from tqdm import tqdm

from slimserve.serving.tools import batching_tuner
from slimserve.serving.tools import tuner as tuner_lib
from slimserve.serving.tools import server_process

FLAGS = flags.FLAGS
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
    os.cpu_count() or 1)


def define_flags():
    """The flags both tuners take, with the defaults slimserve-tune-batching always had."""
    flags.DEFINE_string("model_base_path", None, "Folder of integer version sub-folders.")
    flags.DEFINE_string("model_name", "resnet", "Model name served during the sweep.")
    flags.DEFINE_string("signature_name", "serving_default",
                        "Signature loaded and compared: one string input, encoded images "
                        "(e.g. serving_default) or serialized tf.Examples (e.g. classify).")
    flags.DEFINE_float("latency_budget_ms", None, "Highest acceptable p99 latency (ms).",
                       lower_bound=0.0)
    flags.DEFINE_integer("concurrency", 16, "Closed-loop clients during each measurement.",
                         lower_bound=1, upper_bound=1024)
    flags.DEFINE_integer("requests", 300, "Batch-1 requests measured per setting.",
                         lower_bound=1)
    flags.DEFINE_float("max_seconds", 60.0, "Upper bound on one setting's measurement.",
                       lower_bound=1.0)
    flags.DEFINE_list("max_batch_sizes", ["4", "8", "16", "32"],
                      "max_batch_size values tried.")
    flags.DEFINE_list("batch_timeouts_micros", ["0", "1000", "5000"],
                      "batch_timeout_micros values tried.")
    flags.DEFINE_list("num_batch_threads", [str(CORES)],
                      "num_batch_threads values tried (default: the number of cores).")
    flags.DEFINE_list("max_enqueued_batches", ["100"], "max_enqueued_batches values tried.")
    flags.DEFINE_bool("compare_documented", True,
                      "Also measure TF Serving's documented CPU starting point "
                      "(batching/README.md) on the same load and report the chosen "
                      "setting against it.")
    flags.DEFINE_float("max_minutes", 20.0, "Stop starting new settings after this long.",
                       lower_bound=0.1)
    flags.DEFINE_string("output_config", "batching.config",
                        "Where the chosen batching setting goes (TF Serving text format).")
    flags.DEFINE_string("output_png", "batching.png",
                        "Plot of throughput against p99 for every setting ('' for none).")
    flags.DEFINE_string("work_dir", None, "Where a temporary folder for the settings' "
                        "batching files and server logs is made (default: the system's).")
    flags.DEFINE_bool("progress", True, "Show a progress bar.")


def _ints(flag):
    try:
        return [int(v) for v in FLAGS[flag].value]
    except ValueError:
        raise ValueError("--%s: expected integers, got %s" % (flag, FLAGS[flag].value)) from None


def batching_grid():
    """(the grid from the flags, TF Serving's documented CPU start or None)."""
    grid = list(batching_tuner.grid(_ints("max_batch_sizes"), _ints("batch_timeouts_micros"),
                                    _ints("num_batch_threads"), _ints("max_enqueued_batches")))
    if not grid:
        raise ValueError("the batching grid is empty")
    reference = batching_tuner.documented_cpu_start(CORES) if FLAGS.compare_documented else None
    return grid, reference


def check_outputs(*flag_names):
    """Fails before any measuring when an output flag names a path that cannot be written."""
    for name in flag_names:
        path = FLAGS[name].value
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise ValueError("--%s=%s is a directory" % (name, path))
        if not os.path.isdir(folder):
            raise ValueError("--%s=%s: folder %s does not exist" % (name, path, folder))
        if not os.access(folder, os.W_OK):
            raise ValueError("--%s=%s: folder %s is not writable" % (name, path, folder))
        if name == "output_png" and importlib.util.find_spec("matplotlib") is None:
            raise ValueError("--output_png needs matplotlib (pip install matplotlib), or give "
                             "--output_png=''")


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


def run_sweep(tool, tuner, total, print_rows, **sweep_args):
    """tuner_lib.sweep under a progress bar; on SIGTERM / SIGINT stops the servers, prints
    what was measured (`print_rows(rows)`) and exits 128 + the signal. Returns the rows."""
    rows = []
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    bar = tqdm(total=total, disable=not FLAGS.progress, unit="setting")

    def progress(row):
        rows.append(row)
        agreement = "" if row["agreement"] is None else " agree %.4f" % row["agreement"]
        bar.set_postfix_str("%s: %.1f img/s p99 %.0f ms%s" % (
            row["label"], row["images_per_s"], row["p99_ms"], agreement))
        bar.update()

    deadline = time.monotonic() + FLAGS.max_minutes * 60
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
    except (RuntimeError, ValueError) as error:
        bar.close()
        sys.exit("%s: %s" % (tool, error))
    finally:
        bar.close()
        for number, handler in previous.items():
            signal.signal(number, handler)
    if len(rows) < total and time.monotonic() > deadline:
        print("--max_minutes=%g reached: %d of %d settings measured" % (
            FLAGS.max_minutes, len(rows), total), file=sys.stderr)
    return rows
