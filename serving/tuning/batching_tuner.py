"""The batching half of the tuner: the grid of TF Serving batching parameters and the
batching file that carries the chosen one.

A setting of `max_batch_size`, `batch_timeout_micros`, `num_batch_threads` and
`max_enqueued_batches` is written as TF Serving's text-format batching file (the measured
table in its comments), which the real `tensorflow_model_server
--batching_parameters_file` reads unchanged. Measuring is serving/tuning/tuner.py's: the
batching-only mode (`slimserve-tune-batching`) is its sweep with one fp32 setting and no
accuracy guard, presented in this module's table.
"""
import dataclasses
import itertools

from slimserve import errors
from slimserve import outputs


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
            raise errors.UserError("batching grid: sizes, threads and queue must be >= 1 and "
                                   "the timeout >= 0, got %s" % (values,))
        yield Setting(*values)


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


def write_config(path, best, rows, latency_budget_ms, concurrency, reference=None,
                 tool="slimserve-tune-batching", measured=None, notes=(),
                 flag="--output_config"):
    """The chosen setting in TF Serving's format, with how it was chosen as comments
    (`measured`: the table text, default this module's; `notes`: more comment lines);
    whole or absent (slimserve/outputs.py: a full disk names `flag` and the path)."""
    setting = Setting(**{name: best[name] for name in FIELDS})
    comments = ["Written by %s: highest throughput with p99 <= %g ms at concurrency %d."
                % (tool, latency_budget_ms, concurrency)] + list(notes)
    if reference is not None:
        comments.append("TF Serving's documented CPU starting point on the same load: "
                        "%.1f img/s, p99 %.1f ms; this setting: %.1f img/s, p99 %.1f ms."
                        % (reference["images_per_s"], reference["p99_ms"],
                           best["images_per_s"], best["p99_ms"]))
    comments += ["", "Measured:"] + (measured or table(rows)).splitlines()
    with outputs.write_atomically(path, flag) as handle:
        handle.write("".join("# %s\n" % line if line else "#\n" for line in comments))
        handle.write(setting.to_text())
