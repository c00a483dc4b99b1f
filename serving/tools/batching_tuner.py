"""Finds batching parameters that pay on this machine, by measuring them.

Each setting of `max_batch_size`, `batch_timeout_micros`, `num_batch_threads` and
`max_enqueued_batches` is served by a fresh `slimserve-server` process (as in
production, reading the setting from a TF Serving batching file) and driven by the
closed-loop load generator with real images. The mean batch size comes from the
server's own `processed_batch_size` metric. The best setting is the highest throughput
whose p99 latency meets the budget with no errors; it is written as TF Serving's
text-format batching file (the measured table in its comments) and can be given to
the real `tensorflow_model_server --batching_parameters_file` unchanged.
"""
import dataclasses
import itertools
import os
import select
import subprocess
import sys
import tempfile
import time
import urllib.request

from slimserve.serving import server as server_lib
from slimserve.serving.tools import client as client_lib
from slimserve.serving.tools import loadtest
from slimserve.serving.observability import metrics

FIELDS = ("max_batch_size", "batch_timeout_micros", "num_batch_threads",
          "max_enqueued_batches")


@dataclasses.dataclass(frozen=True)
class Setting:
    max_batch_size: int
    batch_timeout_micros: int
    num_batch_threads: int
    max_enqueued_batches: int

    def to_text(self):
        """TF Serving's BatchingParameters text format (wrapper values)."""
        return "".join("%s { value: %d }\n" % (name, getattr(self, name)) for name in FIELDS)

    def label(self):
        return "b%d t%dus th%d q%d" % (self.max_batch_size, self.batch_timeout_micros,
                                       self.num_batch_threads, self.max_enqueued_batches)


def documented_cpu_start(cores):
    """TF Serving's batching/README.md, "CPU-only: One Approach": num_batch_threads = the
    number of cores, max_batch_size "a really high value", batch_timeout_micros 0."""
    return Setting(max_batch_size=1024, batch_timeout_micros=0, num_batch_threads=cores,
                   max_enqueued_batches=100)


def grid(max_batch_sizes, batch_timeouts, batch_threads, enqueued):
    for values in itertools.product(max_batch_sizes, batch_timeouts, batch_threads, enqueued):
        if min(values[0], values[2], values[3]) < 1 or values[1] < 0:
            raise ValueError("batching grid: sizes, threads and queue must be >= 1 and the "
                             "timeout >= 0, got %s" % (values,))
        yield Setting(*values)


class _Server:
    """One slimserve-server process serving `base_path` with one batching setting."""

    def __init__(self, base_path, model_name, setting, work_dir, start_timeout=300):
        config = os.path.join(work_dir, "batching-%s.config" % setting.label().replace(" ", "_"))
        with open(config, "w") as handle:
            handle.write(setting.to_text())
        monitoring = os.path.join(work_dir, "monitoring.config")
        with open(monitoring, "w") as handle:
            handle.write('prometheus_config { enable: true path: "%s" }\n' % metrics.PATH)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "slimserve.cli.server", "--port=-1", "--rest_api_port=-1",
             "--model_name", model_name,
             "--model_base_path", base_path, "--enable_batching",
             "--batching_parameters_file", config, "--monitoring_config_file", monitoring,
             "--file_system_poll_wait_seconds", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.process.stdout], [], [], start_timeout)
        line = self.process.stdout.readline() if ready else ""  # printed once serving
        try:
            self.port, self.rest_port = server_lib.parse_ready_line(line)
        except ValueError:
            self.stop()
            raise RuntimeError("slimserve-server did not start for %s: %s" % (
                setting.label(), self.process.stderr.read()[-2000:])) from None

    def batch_totals(self):
        """(rows, batches) run so far, from the processed_batch_size metric."""
        url = "http://127.0.0.1:%d%s" % (self.rest_port, metrics.PATH)
        with urllib.request.urlopen(url, timeout=10) as response:
            return metrics.batch_totals(response.read().decode())

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def measure(base_path, model_name, images, setting, concurrency, requests, max_seconds,
            work_dir, signature_name="serving_default"):
    """Serves one setting and loads it; returns a result row (dict)."""
    server = _Server(base_path, model_name, setting, work_dir)
    try:
        client = client_lib.Client("127.0.0.1:%d" % server.port, model_name, retries=0)
        try:
            loadtest.run_level(client, images, concurrency, 2 * concurrency, max_seconds,
                               signature_name=signature_name)  # warm the channel and batches
            before = server.batch_totals()
            result = loadtest.run_level(client, images, concurrency, requests, max_seconds,
                                        signature_name=signature_name)
            after = server.batch_totals()
        finally:
            client.close()
    finally:
        server.stop()
    batches = after[1] - before[1]
    row = dataclasses.asdict(setting)
    row.update({
        "requests": result["requests"], "errors": sum(result["errors"].values()),
        "images_per_s": result["images_per_s"], "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "mean_batch": (after[0] - before[0]) / batches if batches else 0.0})
    return row


def choose(rows, latency_budget_ms):
    """The row with the highest throughput whose p99 meets the budget with no errors."""
    fitting = [r for r in rows if r["errors"] == 0 and r["p99_ms"] <= latency_budget_ms]
    return max(fitting, key=lambda r: r["images_per_s"]) if fitting else None


def table(rows):
    """Markdown table of the measured rows."""
    header = "| max_batch | timeout us | threads | queue | img/s | p50 ms | p99 ms | mean batch | errors |"
    lines = [header, "|" + "---|" * 9]
    for r in rows:
        lines.append("| %d | %d | %d | %d | %.1f | %.1f | %.1f | %.2f | %d |" % (
            r["max_batch_size"], r["batch_timeout_micros"], r["num_batch_threads"],
            r["max_enqueued_batches"], r["images_per_s"], r["p50_ms"], r["p99_ms"],
            r["mean_batch"], r["errors"]))
    return "\n".join(lines)


def write_config(path, best, rows, latency_budget_ms, concurrency, reference=None):
    """The chosen setting in TF Serving's format, with how it was chosen as comments."""
    setting = Setting(**{name: best[name] for name in FIELDS})
    comments = ["Written by slimserve-tune-batching: highest throughput with p99 <= %g ms "
                "at concurrency %d." % (latency_budget_ms, concurrency)]
    if reference is not None:
        comments.append("TF Serving's documented CPU starting point on the same load: "
                        "%.1f img/s, p99 %.1f ms; this setting: %.1f img/s, p99 %.1f ms."
                        % (reference["images_per_s"], reference["p99_ms"],
                           best["images_per_s"], best["p99_ms"]))
    comments += ["", "Measured:"] + table(rows).splitlines()
    temp = path + ".tmp"
    with open(temp, "w") as handle:
        handle.write("".join("# %s\n" % line if line else "#\n" for line in comments))
        handle.write(setting.to_text())
    os.replace(temp, path)


def plot(rows, path, best=None, reference=None):
    """Throughput against p99 for every setting tried (PNG)."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
    figure, axes = pyplot.subplots(figsize=(7, 5))
    axes.scatter([r["p99_ms"] for r in rows], [r["images_per_s"] for r in rows], c="tab:blue",
                 label="settings tried")
    for r in rows:
        axes.annotate("b%d t%d th%d" % (r["max_batch_size"], r["batch_timeout_micros"],
                                        r["num_batch_threads"]),
                      (r["p99_ms"], r["images_per_s"]), fontsize=7, alpha=0.7)
    if reference is not None:
        axes.scatter([reference["p99_ms"]], [reference["images_per_s"]], c="tab:orange",
                     marker="s", s=60, label="TF Serving's CPU starting point")
    if best is not None:
        axes.scatter([best["p99_ms"]], [best["images_per_s"]], c="tab:green", marker="*",
                     s=200, label="chosen")
    axes.set_xlabel("p99 latency (ms)")
    axes.set_ylabel("throughput (images/s)")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def sweep(base_path, model_name, images, settings, concurrency, requests, max_seconds,
          deadline, progress=None, work_dir=None):
    """Measures settings until they are done or `deadline` (time.monotonic()) passes."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="slimserve-tune-", dir=work_dir) as scratch:
        for setting in settings:
            if time.monotonic() > deadline:
                break
            rows.append(measure(base_path, model_name, images, setting, concurrency,
                                requests, max_seconds, scratch))
            if progress:
                progress(rows[-1])
    return rows
