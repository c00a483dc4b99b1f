"""One tuner for every serving knob: runtime (TensorFlow or OpenVINO), precision, XLA,
OpenVINO's streams and batching, measured on this machine and guarded by agreement with
the fp32 model and by validation accuracy.

Each setting is served by a fresh `slimserve-server` process started with the flags it
stands for (`--mixed_precision=bfloat16`, `--xla_cpu_compilation_enabled=true`,
`--prefer_openvino_model=true --openvino_precision=int8 --openvino_num_streams=2`,
`--enable_batching` with a TF Serving batching file) and driven by the closed-loop load
generator with batch-1 requests. Before the load, the same comparison inputs are sent to
every setting and each answer's class is compared with the baseline's: TensorFlow fp32,
no XLA, no batching, i.e. the model as exported. A setting agreeing on fewer than
`min_agreement` of them is rejected whatever its speed, and so is one whose accuracy on
the comparison inputs' labels (the validation split, when given) is more than
`max_accuracy_drop` below the baseline's. The chosen setting is the fastest accepted one
whose p99 meets the latency budget without errors.

Search: `staged` first tries every runtime candidate (TensorFlow precision x XLA pairs,
OpenVINO precision x streams pairs) at the grid's largest batch and longest timeout
(where compute dominates, so a faster kernel shows), then the batching grid under the
fastest accepted candidate; `full` measures the whole product. The batching-only mode of
`slimserve-tune-batching` is the same sweep with one fp32 pair and no guard.
"""
import concurrent.futures
import dataclasses
import os
import tempfile
import time
import typing

import grpc
import numpy as np
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from slimserve import conventions
from slimserve import errors
from slimserve import outputs
from slimserve.serving import options as options_lib
from slimserve.serving import server_process
from slimserve.serving.clients import client as client_lib
from slimserve.serving.clients import image_classifier
from slimserve.serving.clients import loadtest
from slimserve.serving.config import model_config
from slimserve.serving.observability import metrics
from slimserve.serving.tuning import batching_tuner
from slimserve.serving.tuning import inputs as tuner_inputs

# Tuner name -> the server's --mixed_precision value (TF Serving's; '' is fp32).
PRECISIONS = {"fp32": "", "bf16": "bfloat16"}
TENSORFLOW, OPENVINO = "tensorflow", "openvino"  # the server's runtimes (core/openvino_servable)
RUNTIMES = (TENSORFLOW, OPENVINO)
OPENVINO_PRECISIONS = ("fp32", "bf16", "int8")  # the server's --openvino_precision
SEARCHES = ("staged", "full")
DEFAULT_MAX_ACCURACY_DROP = 0.005  # as the export's int8 guard (export/openvino.py)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One serving configuration: the server flags it adds to the common ones.
    `precision` is TensorFlow's (fp32, bf16) or, with runtime "openvino", OpenVINO's
    (fp32, bf16, int8); `streams` is OpenVINO's (0: its latency hint)."""
    precision: str = "fp32"
    xla: bool = False
    batching: typing.Optional[batching_tuner.Setting] = None  # None: no --enable_batching
    extra_flags: typing.Tuple[str, ...] = ()  # more slimserve-server flags (tests, candidates)
    runtime: str = TENSORFLOW
    streams: int = 0

    def __post_init__(self):
        if self.runtime not in RUNTIMES:
            raise ValueError("runtime must be one of %s, got %r" % (list(RUNTIMES),
                                                                   self.runtime))
        allowed = PRECISIONS if self.runtime == TENSORFLOW else OPENVINO_PRECISIONS
        if self.precision not in allowed:
            raise ValueError("precision must be one of %s, got %r" % (sorted(allowed),
                                                                     self.precision))
        if self.runtime == OPENVINO and self.xla:
            raise ValueError("XLA is TensorFlow's: an OpenVINO setting has none")

    def server_flags(self, batching_file=None, platform_in_config=False):
        """The flags, spelled so tensorflow_model_server accepts them too;
        platform_in_config: the model config file names the runtime (model_platform), so
        --prefer_openvino_model is left out."""
        flags = []
        if self.batching is not None:
            flags += ["--enable_batching=true", "--batching_parameters_file=%s" % batching_file]
        if self.runtime == OPENVINO:  # slimserve's own flags (TF Serving has none)
            flags += [] if platform_in_config else ["--prefer_openvino_model=true"]
            flags.append("--openvino_precision=%s" % self.precision)
            if self.streams:
                flags.append("--openvino_num_streams=%d" % self.streams)
        elif PRECISIONS[self.precision]:
            flags.append("--mixed_precision=%s" % PRECISIONS[self.precision])
        if self.xla:
            flags.append("--xla_cpu_compilation_enabled=true")
        return flags + list(self.extra_flags)

    def candidate(self):
        """The runtime part of the label: `fp32 no-xla`, `openvino int8 streams 2`."""
        if self.runtime == OPENVINO:
            return "openvino %s streams %s" % (self.precision, self.streams or "auto")
        return "%s %s" % (self.precision, "xla" if self.xla else "no-xla")

    def label(self):
        parts = [self.candidate(), self.batching.label() if self.batching else "no batching"]
        return " ".join(parts + list(self.extra_flags))


BASELINE = Setting()


def setting_of(row):
    """The Setting a result row was measured with."""
    batching = (batching_tuner.Setting(**{k: row[k] for k in batching_tuner.FIELDS})
                if row["batching"] else None)
    return Setting(row["precision"], row["xla"], batching, tuple(row["extra_flags"]),
                   row.get("runtime", TENSORFLOW), row.get("streams") or 0)


class TuningFailed(errors.UserError):
    """The tuning cannot go on: the baseline (the model as exported) failed to serve or
    to answer; the message says why, from the server's own last words."""


class Stopping(RuntimeError):
    """The tuner is being interrupted: no more requests."""


class _Client(client_lib.Client):
    """Sends the load generator's inputs under the signature's own input key (the load
    generator names its one input `image_bytes`; a classify signature calls it `inputs`);
    once the tuner is interrupted, fails every call without sending it."""

    def __init__(self, target, model_name, input_key):
        super().__init__(target, model_name, retries=0)
        self.input_key = input_key

    def predict(self, inputs, signature_name=conventions.DEFAULT_SIGNATURE, output_filter=()):
        if server_process.STOPPING.is_set():
            raise Stopping("interrupted")
        (values,) = inputs.values()
        return super().predict({self.input_key: values}, signature_name, output_filter)


class Answers(list):
    """Per comparison input (class key, scores or None), or None where the request
    failed; `failure` is the first failure's text."""
    failure = ""


def predict_classes(client, inputs, signature_name, concurrency):
    """One batch-1 request per input, `concurrency` in flight (so a batching server forms
    its batches as it would under load) -> Answers."""
    failures = []

    def one(value):
        try:
            outputs = client.predict({client.input_key: [value]}, signature_name)
            classes, scores = image_classifier.decision(outputs)  # as the canary decides
            return classes[0], None if scores is None else np.asarray(scores[0], np.float64)
        except (grpc.RpcError, errors.UserError, ValueError, Stopping) as error:
            failures.append(error.details() if isinstance(error, grpc.RpcError) else str(error))
            return None

    pool = concurrent.futures.ThreadPoolExecutor(concurrency)
    try:
        answers = Answers(pool.map(one, inputs))
    finally:  # interrupted: drop the queued requests rather than send them
        pool.shutdown(wait=True, cancel_futures=True)
    answers.failure = failures[0] if failures else ""
    return answers


def agreement(baseline, answers):
    """(fraction of the inputs the baseline answered on which `answers` pick the same
    class (a failed answer disagrees), inputs compared, largest |dp| of any score or None)."""
    compared = agree = 0
    max_dp = None
    for base, answer in zip(baseline, answers):
        if base is None:
            continue
        compared += 1
        if answer is None:
            continue
        agree += answer[0] == base[0]
        if base[1] is not None and answer[1] is not None and base[1].shape == answer[1].shape:
            dp = float(np.max(np.abs(base[1] - answer[1]))) if base[1].size else 0.0
            max_dp = dp if max_dp is None else max(max_dp, dp)
    return (agree / compared if compared else 0.0), compared, max_dp


def accuracy(answers, labels):
    """The fraction of the labelled comparison inputs whose answer names the label (its
    id as text, as a signature without labels.txt answers, or its class text); a failed
    answer is wrong."""
    right = sum(1 for answer, (label, text) in zip(answers, labels)
                if answer is not None and answer[0] in (str(label), text))
    return right / len(labels) if labels else 0.0


class Tuner:
    """Serves and measures settings of one model; keeps the baseline's answers."""

    def __init__(self, model_base_path, model_name, sources,
                 signature_name=conventions.DEFAULT_SIGNATURE, concurrency=16, requests=300,
                 max_seconds=60.0, common_flags=(), guard=True, scratch_dir=None,
                 max_accuracy_drop=DEFAULT_MAX_ACCURACY_DROP):
        # the server refuses a relative base path (as TF Serving): resolve it here, once
        self.model_base_path = model_config.absolute(model_base_path)
        self.model_name = model_name
        self.sources, self.signature_name, self.guard = sources, signature_name, guard
        self.concurrency, self.requests, self.max_seconds = concurrency, requests, max_seconds
        self.common_flags = list(common_flags)
        self.scratch_dir = scratch_dir
        self.max_accuracy_drop = max_accuracy_drop
        self.input_key = self.load_inputs = self.compare_inputs = None
        self.compare_source = ""
        self.compare_labels = None  # [(label id, label text)] of the comparison inputs
        self.baseline_answers = None
        self.baseline_accuracy = None
        self._count = 0

    def prepare(self):
        """Reads the signature from the model and the inputs for it, before any server
        starts (so a wrong flag or a bad file fails in seconds); UserError names the flag."""
        kind, self.input_key = tuner_inputs.kind_for(self.model_base_path, self.signature_name)
        self.load_inputs, self.compare_inputs, self.compare_source = self.sources.read(
            self.signature_name, kind, self.input_key)
        self.compare_labels = self.sources.labels

    def measure(self, setting):
        """Serves `setting`, compares its answers, loads it; returns the result row. A
        setting whose server fails (does not start, dies, stops answering its metrics) is
        a row with `failure` set, never chosen; only the baseline's failure is fatal."""
        if self.input_key is None:
            self.prepare()
        if self.guard and self.baseline_answers is None and setting != BASELINE:
            raise RuntimeError("the baseline (%s) must be measured first: it is what every "
                               "setting is compared with" % BASELINE.label())
        row = {"runtime": setting.runtime, "precision": setting.precision, "xla": setting.xla,
               "streams": setting.streams, "candidate": setting.candidate(),
               "batching": setting.batching is not None,
               "extra_flags": list(setting.extra_flags), "label": setting.label(),
               "agreement": None, "compared": 0, "max_abs_dp": None, "baseline": False,
               "accuracy": None, "accuracy_ok": None, "failure": ""}
        row.update({k: getattr(setting.batching, k) if setting.batching else None
                    for k in batching_tuner.FIELDS})
        try:
            answers, result, batched = self._serve_and_load(setting)
        except (RuntimeError, OSError) as error:  # URLError is an OSError
            if setting == BASELINE:
                raise TuningFailed("the baseline (%s) failed: %s" % (setting.label(), error)) \
                    from None
            row.update({"requests": 0, "errors": 1, "images_per_s": 0.0,
                        "p50_ms": float("nan"), "p99_ms": float("nan"), "mean_batch": 0.0,
                        "failure": str(error).splitlines()[0][:200]})
            return row
        # the steady part of the load (loadtest.run_level): the drain at its end would
        # charge a long batch_timeout_micros for batches that stop filling only because
        # the load stops, and reject the settings that serve steady traffic best
        row.update({
            "requests": result["steady_requests"], "errors": sum(result["errors"].values()),
            "images_per_s": result["steady_images_per_s"], "p50_ms": result["steady_p50_ms"],
            "p99_ms": result["steady_p99_ms"], "mean_batch": batched})
        if answers is not None:
            if self.baseline_answers is None:
                if not any(answers):
                    raise TuningFailed("the baseline answered none of the %d comparison "
                                       "inputs: %s" % (len(answers), answers.failure))
                self.baseline_answers = list(answers)
                row["baseline"] = True
            row["agreement"], row["compared"], row["max_abs_dp"] = agreement(
                self.baseline_answers, answers)
            if self.compare_labels:
                row["accuracy"] = accuracy(answers, self.compare_labels)
                if row["baseline"]:
                    self.baseline_accuracy = row["accuracy"]
                row["accuracy_ok"] = (self.baseline_accuracy - row["accuracy"]
                                      <= self.max_accuracy_drop + 1e-12)
        return row

    def _serve_and_load(self, setting):
        """(comparison answers or None, the load level's result, mean batch size)."""
        self._count += 1
        stem = os.path.join(self.scratch_dir, "setting-%03d" % self._count)
        batching_file = None
        if setting.batching is not None:
            batching_file = stem + ".batching.config"
            with open(batching_file, "w") as handle:
                handle.write(setting.batching.to_text())
        flags = ["--model_name=%s" % self.model_name,
                 "--model_base_path=%s" % self.model_base_path,
                 "--monitoring_config_file=%s" % self._monitoring_file(),
                 "--file_system_poll_wait_seconds=0"] + self.common_flags
        server = server_process.ServerProcess(flags + setting.server_flags(batching_file),
                                             setting.label(), stem + ".server.log")
        try:
            client = _Client("127.0.0.1:%d" % server.port, self.model_name, self.input_key)
            try:
                answers = None
                if self.guard:  # also warms the channel and the batches
                    answers = predict_classes(client, self.compare_inputs, self.signature_name,
                                              self.concurrency)
                else:
                    loadtest.run_level(client, self.load_inputs, self.concurrency,
                                       2 * self.concurrency, self.max_seconds,
                                       signature_name=self.signature_name)
                before = server.batch_totals()
                result = loadtest.run_level(client, self.load_inputs, self.concurrency,
                                            self.requests, self.max_seconds,
                                            signature_name=self.signature_name)
                after = server.batch_totals()
            finally:
                client.close()
        finally:
            server.stop()
        rows, batches = after[0] - before[0], after[1] - before[1]
        if setting.batching is None:  # no batcher, no metric: every request ran alone
            return answers, result, 1.0 if result["requests"] else 0.0
        return answers, result, rows / batches if batches else 0.0

    def _monitoring_file(self):
        path = os.path.join(self.scratch_dir, "monitoring.config")
        if not os.path.exists(path):
            with open(path, "w") as handle:
                handle.write('prometheus_config { enable: true path: "%s" }\n'
                             % metrics.PATH)
        return path


def probe_batching(grid):
    """The grid's largest batch with its longest timeout: the stage-1 batching."""
    return max(grid, key=lambda s: (s.max_batch_size, s.batch_timeout_micros))


def candidates(precisions, xla_modes, openvino=()):
    """The runtime candidates (Settings without batching): TensorFlow's precision x XLA
    pairs, then OpenVINO's (precision, streams) pairs."""
    found = [Setting(p, x) for p in precisions for x in xla_modes]
    return found + [Setting(p, runtime=OPENVINO, streams=n) for p, n in openvino]


def planned(precisions, xla_modes, grid, extra_batchings=(), search="staged", baseline=True,
            openvino=()):
    """How many settings `sweep` will measure if nothing stops it."""
    pairs = len(candidates(precisions, xla_modes, openvino))
    batchings = len(set(grid) | set(extra_batchings))
    if search == "full":
        return int(baseline) + pairs * batchings
    return int(baseline) + pairs + batchings - 1


def accepted(row, min_agreement):
    """Agrees enough with the baseline (or no guard), lost no more validation accuracy
    than the tuner allows (where labels are known) and answered every request."""
    agreed = row.get("agreement")
    return (row["errors"] == 0 and (agreed is None or agreed >= min_agreement)
            and row.get("accuracy_ok") is not False)


def sweep(tuner, precisions, xla_modes, grid, extra_batchings=(), search="staged",
          min_agreement=0.995, deadline=float("inf"), progress=None, baseline=True,
          openvino=()):
    """Measures the baseline (when `baseline`), then the settings of `search` over the
    candidates (TensorFlow's precision x XLA, OpenVINO's `openvino` (precision, streams)
    pairs), until done or `deadline` (time.monotonic()) passes; returns the rows in
    measuring order."""
    if search not in SEARCHES:
        raise ValueError("search must be one of %s, got %r" % (SEARCHES, search))
    rows = []
    batchings = list(grid) + [b for b in extra_batchings if b not in grid]

    def run(setting):
        if time.monotonic() > deadline:
            return False
        rows.append(tuner.measure(setting))
        if progress:
            progress(rows[-1])
        return True

    if baseline and not run(BASELINE):
        return rows
    pairs = candidates(precisions, xla_modes, openvino)
    if search == "full":
        for pair, batching in ((pair, b) for pair in pairs for b in batchings):
            if not run(dataclasses.replace(pair, batching=batching)):
                break
        return rows
    probe = probe_batching(grid)
    stage1 = []
    for pair in pairs:
        if not run(dataclasses.replace(pair, batching=probe)):
            return rows
        stage1.append((rows[-1], pair))
    fine = [(r, pair) for r, pair in stage1 if accepted(r, min_agreement)]
    if not fine:
        return rows
    best = max(fine, key=lambda found: found[0]["images_per_s"])[1]
    for batching in batchings:
        if batching != probe and not run(dataclasses.replace(best, batching=batching)):
            break
    return rows


def fits(row, latency_budget_ms, min_agreement):
    return accepted(row, min_agreement) and row["p99_ms"] <= latency_budget_ms


def choose(rows, latency_budget_ms, min_agreement=0.995):
    """The fastest row that agrees, meets the p99 budget and had no errors (or None)."""
    fitting = [r for r in rows if fits(r, latency_budget_ms, min_agreement)]
    return max(fitting, key=lambda r: r["images_per_s"]) if fitting else None


def verdict(row, latency_budget_ms, min_agreement, best=None):
    if row is best:
        return "**chosen**"
    if row.get("failure"):
        return "failed: %s" % row["failure"].replace("|", "/")
    if row.get("agreement") is not None and row["agreement"] < min_agreement:
        return "rejected: agreement < %g" % min_agreement
    if row.get("accuracy_ok") is False:
        return "rejected: accuracy drop"
    if row["errors"]:
        return "errors"
    if row["p99_ms"] > latency_budget_ms:
        return "p99 over budget"
    return "baseline" if row.get("baseline") else "ok"


def table(rows, latency_budget_ms, min_agreement, best=None):
    """Markdown table of the measured rows."""
    header = ("| precision | XLA | max_batch | timeout us | threads | queue | img/s | p50 ms | "
              "p99 ms | mean batch | errors | agreement | max abs dp | verdict | accuracy |")
    lines = [header, "|" + "---|" * 15]
    for r in rows:
        batching = (["%d" % r[k] for k in batching_tuner.FIELDS] if r["batching"]
                    else ["off", "-", "-", "-"])
        agreement_text = "-" if r["agreement"] is None else "%.4f (%d)" % (r["agreement"],
                                                                          r["compared"])
        openvino = r.get("runtime") == OPENVINO
        first = ("openvino %s streams %s" % (r["precision"], r.get("streams") or "auto")
                 if openvino else r["precision"])
        lines.append("| " + " | ".join(
            [first + "".join(" " + f for f in r["extra_flags"]),
             "-" if openvino else "on" if r["xla"] else "off"] + batching + [
                "%.1f" % r["images_per_s"], "%.1f" % r["p50_ms"], "%.1f" % r["p99_ms"],
                "%.2f" % r["mean_batch"], "%d" % r["errors"], agreement_text,
                "-" if r["max_abs_dp"] is None else "%.2g" % r["max_abs_dp"],
                verdict(r, latency_budget_ms, min_agreement, best),
                "-" if r.get("accuracy") is None else "%.4f" % r["accuracy"]]) + " |")
    return "\n".join(lines)


def server_flags(best, model_name, model_base_path, batching_file, common_flags=(),
                 model_config_file=None):
    """The chosen setting as a server command line (slimserve-server and
    tensorflow_model_server read the same spelling; paths absolute). With
    model_config_file (write_model_config's), the model is named by that file."""
    setting = setting_of(best)
    model = (["--model_config_file=%s" % os.path.abspath(model_config_file)]
             if model_config_file else
             ["--model_name=%s" % model_name,
              "--model_base_path=%s" % model_config.absolute(model_base_path)])
    return (model + list(common_flags) + setting.server_flags(
        os.path.abspath(batching_file) if batching_file else None,
        platform_in_config=bool(model_config_file)))


def write_model_config(path, best, model_name, model_base_path, comments=(),
                       flag="--output_model_config"):
    """The chosen runtime in TF Serving's ModelServerConfig (text format, whole or absent):
    one model, its absolute base path and model_platform "openvino" when OpenVINO won,
    else "tensorflow" (the real TF Serving serves only the latter)."""
    config = model_server_config_pb2.ModelServerConfig()
    entry = config.model_config_list.config.add()
    entry.name = model_name
    entry.base_path = model_config.absolute(model_base_path)
    entry.model_platform = OPENVINO if setting_of(best).runtime == OPENVINO else TENSORFLOW
    with outputs.write_atomically(path, flag) as handle:
        handle.write("".join("# %s\n" % line if line else "#\n" for line in comments))
        handle.write(text_format.MessageToString(config))


def tfserving_flags(flags):
    """The flags of `flags` that tensorflow_model_server has (slimserve-only ones dropped)."""
    own = {f.name for f in options_lib.flag_fields() if f.metadata.get("slimserve_only")}
    return [f for f in flags if f.lstrip("-").split("=", 1)[0] not in own]


def write_flagfile(path, flags, comments=(), flag="--output_flags"):
    """An absl flagfile (`slimserve-server --flagfile=PATH`), comments first; whole or
    absent (slimserve/outputs.py: a full disk names `flag` and the path)."""
    with outputs.write_atomically(path, flag) as handle:
        handle.write("".join("# %s\n" % line if line else "#\n" for line in comments))
        handle.write("".join(flag_text + "\n" for flag_text in flags))


# Colours of the precision x XLA groups; red, green and orange mark rejected settings,
# the chosen one and TF Serving's starting point.
_GROUP_COLOURS = ("tab:blue", "tab:purple", "tab:brown", "tab:cyan", "tab:olive", "tab:pink")


def plot(rows, path, best=None, reference=None, min_agreement=None, latency_budget_ms=None,
         flag="--output_png"):
    """Throughput against p99 for every setting tried (PNG at `path`, whole or absent);
    rejected settings as red x, the latency budget as a dashed line."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
    figure, axes = pyplot.subplots(figsize=(7, 5))
    groups = {}
    for r in rows:
        rejected = min_agreement is not None and not accepted(r, min_agreement)
        key = "rejected (agreement, accuracy or errors)" if rejected else (
            "openvino %s" % r["precision"] if r.get("runtime") == OPENVINO else
            "%s, XLA %s" % (r["precision"], "on" if r["xla"] else "off"))
        groups.setdefault(key, []).append(r)
    colours = iter(_GROUP_COLOURS * 2)
    for key, members in sorted(groups.items()):
        style = (dict(c="tab:red", marker="x") if key.startswith("rejected")
                 else dict(c=next(colours)))
        axes.scatter([r["p99_ms"] for r in members], [r["images_per_s"] for r in members],
                     label=key, **style)
    for r in rows:
        text = ("b%d t%d th%d" % (r["max_batch_size"], r["batch_timeout_micros"],
                                  r["num_batch_threads"]) if r["batching"] else "no batching")
        axes.annotate(text, (r["p99_ms"], r["images_per_s"]), fontsize=7, alpha=0.7)
    if reference is not None:
        axes.scatter([reference["p99_ms"]], [reference["images_per_s"]], c="tab:orange",
                     marker="s", s=60, label="TF Serving's CPU starting point")
    if best is not None:
        axes.scatter([best["p99_ms"]], [best["images_per_s"]], c="tab:green", marker="*",
                     s=250, edgecolors="black", label="chosen")
    if latency_budget_ms is not None:
        axes.axvline(latency_budget_ms, color="gray", linestyle="--", linewidth=1,
                     label="p99 budget")
    axes.set_xlabel("p99 latency (ms)")
    axes.set_ylabel("throughput (images/s)")
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    try:
        outputs.write_file(path, flag, lambda name: figure.savefig(name, dpi=100, format="png"))
    finally:
        pyplot.close(figure)


def scratch(work_dir=None):
    """The temporary folder of one tuning run (batching files, server logs)."""
    return tempfile.TemporaryDirectory(prefix="slimserve-tune-", dir=work_dir)
