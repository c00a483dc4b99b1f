"""Prometheus metrics through prometheus_client, with TF Serving 2.15.1's names, labels and
fixed bucket boundaries, served at TF Serving's default path /monitoring/prometheus/metrics.

Each server has its own CollectorRegistry holding one collector that turns this module's
counts into prometheus_client metric families at scrape time (HELP and TYPE lines, label
escaping and sample formatting are the library's). What is exported:

- request_count {model_name, status} and request_latency {model_name, API, entrypoint}
  (microseconds, only for requests that succeeded: servables/tensorflow/util.cc,
  prediction_service_impl.cc, http_server.cc). API is TF Serving's: Predict, Classify,
  Regress, MultiInference, GetModelMetadata on gRPC, the URL's verb on REST;
- batching_session:processed_batch_size and queuing_latency {thread_pool_name}
  (batching_util.h, batching_session.cc), request_log_count {model_name, status_code}
  (core/request_logger.cc), model_warmup_latency {model_path, status}, TensorFlow's
  saved_model load_attempt_count {model_path, status} and load_latency {model_path};
- slimserve's own, in the same scheme: model_state {model_name, version, state},
  request_latency_by_version {model_name, version, signature_name, API, entrypoint},
  :slimserve:serving:model_runtime {model_name, model_version, precision, xla_cpu_jit,
  runtime},
  and what the batch scheduler chose and learned per {model_name, version,
  signature_name} (core/batching/, core/adaptive.py): the batch sizes it ran and each
  request's queue delay (histograms), the cost of a run per batch size
  {batch_size, runs="alone"|"overlapped"}, the requests it counts in the system, their
  arrival rate, its plan (parallel runs, target batch size) and its bound on a hold.

Nothing a client chooses grows a series: a request naming a model this server does not
serve is counted under model_name="<unknown>" (`UNKNOWN_MODEL`), latencies are kept only
for requests that were served (so versions and signatures are real ones), latency series
of versions that ended are dropped and only the last few ended versions keep a state.

Histograms keep TF Serving's bucket boundaries (monitoring::Buckets::Exponential, written
as its exporter writes them, %.6g) with Prometheus's `le` meaning; the batch-size
histogram's buckets are fixed, so its series never change between scrapes.
"""
import bisect
import re
import threading

from prometheus_client import exposition
from prometheus_client import parser
from prometheus_client import registry as registry_lib
from prometheus_client.core import CounterMetricFamily
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.core import HistogramMetricFamily

from slimserve.serving.core import errors

PATH = "/monitoring/prometheus/metrics"
REQUEST_COUNT = ":tensorflow:serving:request_count"
REQUEST_LATENCY = ":tensorflow:serving:request_latency"  # microseconds
LATENCY_BY_VERSION = ":tensorflow:serving:request_latency_by_version"  # slimserve's
BATCH_SIZE = ":tensorflow:serving:batching_session:processed_batch_size"
QUEUING_LATENCY = ":tensorflow:serving:batching_session:queuing_latency"  # microseconds
REQUEST_LOG_COUNT = ":tensorflow:serving:request_log_count"
MODEL_STATE = ":tensorflow:serving:model_state"  # slimserve's
# Each loaded version's precision and XLA setting (slimserve's own: TF Serving only logs
# "Running inference with bfloat16 auto mixed precision").
MODEL_RUNTIME = ":slimserve:serving:model_runtime"
LOAD_ATTEMPTS = ":tensorflow:cc:saved_model:load_attempt_count"  # TensorFlow's
LOAD_LATENCY = ":tensorflow:cc:saved_model:load_latency"  # TensorFlow's: total microseconds
WARMUP_LATENCY = ":tensorflow:serving:model_warmup_latency"  # microseconds
# What the batch scheduler chose and learned, per model, version and signature.
BATCHING = ":slimserve:serving:batching:"
BATCHING_BATCH_SIZE = BATCHING + "batch_size"
BATCHING_QUEUE_DELAY = BATCHING + "queue_delay"  # microseconds
BATCHING_COST = BATCHING + "cost"  # microseconds per run
BATCHING_GAUGES = {  # name: (help, state key, scale)
    BATCHING + "adaptive": ("1 when the adaptive scheduler batches it, 0 for TF Serving's "
                            "timeout rule.", "adaptive", 1),
    BATCHING + "concurrency": ("Requests the scheduler counts in the system (queued and "
                               "running; peak over the last batches).", "concurrency", 1),
    BATCHING + "arrival_rate": ("Requests per second arriving (moving average).",
                                "arrival_rate", 1),
    BATCHING + "parallel_runs": ("Runs its plan lets go at a time (1 or 2).", "parallel", 1),
    BATCHING + "target_batch_size": ("Rows its plan puts in a batch.", "target", 1),
    BATCHING + "max_queue_delay": ("Longest a free batch thread holds rows back, "
                                   "microseconds (the bound).", "bound", 1e6),
    BATCHING + "fill_time": ("How long the missing requests of a hold took to come (90th "
                             "percentile of recent holds), microseconds; absent before.",
                             "fill", 1e6),
}
BATCHING_LABELS = ["model_name", "version", "signature_name"]
VERSION_STATES = ("START", "LOADING", "AVAILABLE", "UNLOADING", "END")
UNKNOWN_MODEL = "<unknown>"
# TF Serving's API label: gRPC method names; REST requests carry the URL's verb.
GRPC_API = {"predict": "Predict", "classify": "Classify", "regress": "Regress",
            "multi_inference": "MultiInference", "metadata": "GetModelMetadata"}
# Ended (unloaded or failed) versions whose END state stays exported, per model.
MAX_ENDED_VERSIONS = 16


def exponential_buckets(scale, growth, count):
    """TF's monitoring::Buckets::Exponential(scale, growth, count) upper bounds (+Inf is
    added by the exposition), rounded as TF Serving's exporter prints them (%.6g)."""
    bounds, bound = [], float(scale)
    for _ in range(count):
        bounds.append(float("%.6g" % bound))
        bound *= growth
    return tuple(bounds)


LATENCY_BUCKETS = exponential_buckets(10, 1.8, 33)  # util.cc: ~20 minutes
BATCH_SIZE_BUCKETS = exponential_buckets(1, 2, 14)  # batching_util.h: 1 .. 8192
QUEUING_BUCKETS = exponential_buckets(100, 1.2, 52)  # batching_session.cc: ~1 second
WARMUP_BUCKETS = exponential_buckets(10, 1.8, 33)  # saved_model_warmup_util.cc
_HELP = {
    REQUEST_COUNT: "The total number of requests.",
    REQUEST_LATENCY: "Distribution of wall time (in microseconds) for Tensorflow Serving "
                     "request.",
    LATENCY_BY_VERSION: "request_latency per version and signature (slimserve).",
    BATCH_SIZE: "Tracks the batch size distribution on processing.",
    QUEUING_LATENCY: "Distribution of wall time spent (in microseconds) in queuing",
    REQUEST_LOG_COUNT: "The total number of requests logged from the model server sliced "
                       "down by model_name and status code.",
    MODEL_STATE: "1 for the state each model version is in (slimserve).",
    LOAD_ATTEMPTS: "The number of times a SavedModel was successfully loaded.",
    LOAD_LATENCY: "Latency in microseconds for SavedModels that were successfully loaded.",
    WARMUP_LATENCY: "Distribution of wall time (in microseconds) for warming up the model.",
    BATCHING_BATCH_SIZE: "Rows of each batch the scheduler ran, after padding (slimserve).",
    BATCHING_QUEUE_DELAY: "Microseconds each request waited for its batch to start "
                          "(slimserve).",
    BATCHING_COST: "Microseconds a run of batch_size rows takes, as the scheduler measured "
                   "it (moving average; runs: alone or overlapped by another run).",
}
# prometheus_client names every counter NAME_total; TF Serving's counters have no suffix,
# and dashboards written for TF Serving query the bare names.
_COUNTERS = (REQUEST_COUNT, REQUEST_LOG_COUNT, LOAD_ATTEMPTS, LOAD_LATENCY)
_TOTAL_SUFFIX = re.compile(r"^(# (?:HELP|TYPE) )?(%s)_total(?=[{ ])"
                           % "|".join(re.escape(n) for n in _COUNTERS), re.MULTILINE)


class _Histogram:
    """Bucket counts (not cumulative) and the sum of one series."""
    __slots__ = ("counts", "total")

    def __init__(self, bounds):
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def add(self, bounds, value):
        self.counts[bisect.bisect_left(bounds, value)] += 1
        self.total += value

    def buckets(self, bounds):
        out, cumulative = [], 0
        for bound, count in zip(list(bounds) + [None], self.counts):
            cumulative += count
            out.append(("+Inf" if bound is None else "%.6g" % bound, cumulative))
        return out


class _Collector(registry_lib.Collector):
    def __init__(self, metrics):
        self._metrics = metrics

    def collect(self):
        return self._metrics.families()


class Metrics:
    """The counts of one server and the registry that exposes them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._served = None  # frozenset of model names; None: every name is its own label
        self._counts = {}  # (model, status) -> n
        self._latency = {}  # (model, API, entrypoint) -> _Histogram
        self._by_version = {}  # (model, version, signature, API, entrypoint) -> _Histogram
        self._queue_waits = _Histogram(QUEUING_BUCKETS)
        self._batch_sizes = _Histogram(BATCH_SIZE_BUCKETS)
        self._batching_sizes = {}  # (model, version, signature) -> _Histogram
        self._batching_delays = {}  # (model, version, signature) -> _Histogram
        self._version_states = {}  # (model, version) -> state
        self._ended = {}  # model -> [versions in END], oldest first
        self._load_attempts = {}  # (model_path, "success"|"fail") -> n
        self._load_micros = {}  # model_path -> total microseconds
        self._warmups = {}  # (model_path, status) -> _Histogram
        self._collectors = []  # callables -> [prometheus_client metric families]
        self.registry = registry_lib.CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    # --- what the server reports -----------------------------------------------------

    def set_served_models(self, names):
        """The models this server is configured to serve (at start and after a reload):
        the only model_name values requests can create."""
        self._served = frozenset(names)

    def model_label(self, name):
        """The model_name label for a name a request carried."""
        served = self._served
        if served is None:
            return name
        return name if name in served else UNKNOWN_MODEL

    def observe(self, model, api, status, seconds, version=None, signature="",
                entrypoint="GRPC"):
        """One request: counted under its status; timed when it was served (then version
        and signature are the servable's own)."""
        model = self.model_label(model)
        with self._lock:
            key = (model, status)
            self._counts[key] = self._counts.get(key, 0) + 1
            if status != "OK" or model == UNKNOWN_MODEL:
                return
            micros = seconds * 1e6
            api = GRPC_API.get(api, api) if entrypoint == "GRPC" else api
            key = (model, api, entrypoint)
            histogram = self._latency.get(key) or self._latency.setdefault(
                key, _Histogram(LATENCY_BUCKETS))
            histogram.add(LATENCY_BUCKETS, micros)
            # Only versions still serving: a request that ends after its version was
            # unloaded must not bring back the series model_event dropped.
            if version is not None and self._version_states.get(
                    (model, int(version))) in ("AVAILABLE", "UNLOADING"):
                key = (model, str(version), signature or "", api, entrypoint)
                histogram = self._by_version.get(key) or self._by_version.setdefault(
                    key, _Histogram(LATENCY_BUCKETS))
                histogram.add(LATENCY_BUCKETS, micros)

    def observe_queue_wait(self, seconds, label=None):
        """Batching: how long one request waited for its batch to start; label: (model,
        version, signature) of a served version, or None."""
        with self._lock:
            self._queue_waits.add(QUEUING_BUCKETS, seconds * 1e6)
            self._add_batching(self._batching_delays, label, QUEUING_BUCKETS, seconds * 1e6)

    def observe_batch(self, rows, label=None):
        """Batching: one batch of `rows` rows ran (label as in observe_queue_wait)."""
        with self._lock:
            self._batch_sizes.add(BATCH_SIZE_BUCKETS, rows)
            self._add_batching(self._batching_sizes, label, BATCH_SIZE_BUCKETS, rows)

    def _add_batching(self, series, label, bounds, value):
        """Per-version batching series, for versions still serving only (as
        latency_by_version)."""
        if label is None or self._version_states.get(
                (label[0], int(label[1]))) not in ("AVAILABLE", "UNLOADING"):
            return
        key = (label[0], str(label[1]), label[2] or "")
        histogram = series.get(key) or series.setdefault(key, _Histogram(bounds))
        histogram.add(bounds, value)

    def batching_families(self, learners):
        """The scheduler's state per served version and signature from
        Batcher.learners() (several kinds under one label: the busiest), with the
        per-version batch-size and queue-delay histograms."""
        chosen = {}
        with self._lock:
            for state in learners:
                label = state["label"]
                if label is None or self._version_states.get(
                        (label[0], int(label[1]))) not in ("AVAILABLE", "UNLOADING"):
                    continue
                key = (label[0], str(label[1]), label[2] or "")
                if key not in chosen or state["batches"] > chosen[key]["batches"]:
                    chosen[key] = state
            out = [_histograms(BATCHING_BATCH_SIZE, BATCHING_LABELS, self._batching_sizes,
                               BATCH_SIZE_BUCKETS),
                   _histograms(BATCHING_QUEUE_DELAY, BATCHING_LABELS, self._batching_delays,
                               QUEUING_BUCKETS)]
        for name, (text, field, scale) in BATCHING_GAUGES.items():
            family = GaugeMetricFamily(name, text + " (slimserve)", labels=BATCHING_LABELS)
            for key, state in sorted(chosen.items()):
                if state[field] is not None:
                    family.add_metric(list(key), float(state[field]) * scale)
            out.append(family)
        cost = GaugeMetricFamily(BATCHING_COST, _HELP[BATCHING_COST],
                                 labels=BATCHING_LABELS + ["batch_size", "runs"])
        for key, state in sorted(chosen.items()):
            for size, alone, overlapped, _ in state["cost"]:
                for runs, seconds in (("alone", alone), ("overlapped", overlapped)):
                    if seconds is not None:
                        cost.add_metric(list(key) + [str(size), runs], seconds * 1e6)
        out.append(cost)
        return out

    def model_event(self, model, version, state, error=""):
        """ModelManager.on_change: a version changed state (error: why a load failed; not
        a label: GetModelStatus carries it). The END state of the last MAX_ENDED_VERSIONS
        ended versions of a model stays exported; older ones leave, as do the latency
        series of every version that ended."""
        del error
        version = int(version)
        with self._lock:
            ended = self._ended.setdefault(model, [])
            if version in ended:
                ended.remove(version)
            self._version_states[(model, version)] = state
            if state != "END":
                return
            for series in (self._by_version, self._batching_sizes, self._batching_delays):
                for key in [k for k in series if k[:2] == (model, str(version))]:
                    del series[key]
            ended.append(version)
            while len(ended) > MAX_ENDED_VERSIONS:
                self._version_states.pop((model, ended.pop(0)), None)

    def model_load(self, model, version, path, ok, load_seconds, warmup_seconds=None):
        """ModelManager.on_load: one load attempt of a version at `path`."""
        del model, version  # TensorFlow labels its load metrics by model_path
        with self._lock:
            key = (path, "success" if ok else "fail")
            self._load_attempts[key] = self._load_attempts.get(key, 0) + 1
            if ok:
                self._load_micros[path] = self._load_micros.get(path, 0) + int(
                    load_seconds * 1e6)
            if warmup_seconds is not None:
                key = (path, "OK" if ok else "FAILED")
                histogram = self._warmups.setdefault(key, _Histogram(WARMUP_BUCKETS))
                histogram.add(WARMUP_BUCKETS, warmup_seconds * 1e6)

    def add_collector(self, collector):
        """collector() -> prometheus_client metric families, added to every scrape."""
        self._collectors.append(collector)

    # --- the exposition --------------------------------------------------------------

    def families(self):
        """Every metric as prometheus_client metric families (the collector's collect())."""
        with self._lock:
            out = [_counter(REQUEST_COUNT, ["model_name", "status"], self._counts),
                   _histograms(REQUEST_LATENCY, ["model_name", "API", "entrypoint"],
                               self._latency, LATENCY_BUCKETS),
                   _histograms(LATENCY_BY_VERSION, ["model_name", "version",
                                                    "signature_name", "API", "entrypoint"],
                               self._by_version, LATENCY_BUCKETS)]
            if any(self._batch_sizes.counts):
                out.append(_histograms(BATCH_SIZE, [], {(): self._batch_sizes},
                                       BATCH_SIZE_BUCKETS))
                out.append(_histograms(QUEUING_LATENCY, ["thread_pool_name"],
                                       {("batch",): self._queue_waits}, QUEUING_BUCKETS))
            states = GaugeMetricFamily(MODEL_STATE, _HELP[MODEL_STATE],
                                       labels=["model_name", "version", "state"])
            for (model, version), current in sorted(self._version_states.items()):
                for state in VERSION_STATES:
                    states.add_metric([model, str(version), state], int(state == current))
            out.append(states)
            out.append(_counter(LOAD_ATTEMPTS, ["model_path", "status"], self._load_attempts))
            out.append(_counter(LOAD_LATENCY, ["model_path"],
                                {(p,): v for p, v in self._load_micros.items()}))
            out.append(_histograms(WARMUP_LATENCY, ["model_path", "status"], self._warmups,
                                   WARMUP_BUCKETS))
        for collector in self._collectors:
            out.extend(collector())
        return out

    def render(self):
        """The Prometheus text exposition (format 0.0.4) of this server's registry."""
        text = exposition.generate_latest(self.registry).decode("utf-8")
        return _TOTAL_SUFFIX.sub(r"\1\2", text)


def _counter(name, labels, values):
    family = CounterMetricFamily(name, _HELP[name], labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


def _histograms(name, labels, series, bounds):
    family = HistogramMetricFamily(name, _HELP[name], labels=labels)
    for key, histogram in sorted(series.items()):
        family.add_metric(list(key), histogram.buckets(bounds), histogram.total)
    return family


def request_log_families(loggers, retired=None):
    """TF Serving's request_log_count for {model: RequestLogger}: records written (OK) and
    not written by status (RESOURCE_EXHAUSTED: the queue was full or the disk; others: the
    write error's code), plus `retired` {(model, status_code): n} of loggers a reload
    replaced, so the counters never go down."""
    values = dict(retired or {})
    for model, logger in list(loggers.items()):
        for code, count in [("OK", logger.written)] + list(logger.drops.items()):
            values[(model, code)] = values.get((model, code), 0) + count
        values.setdefault((model, "RESOURCE_EXHAUSTED"), 0)
    return [_counter(REQUEST_LOG_COUNT, ["model_name", "status_code"], values)]


def model_runtime_family(manager):
    """A gauge naming what every loaded version computes in: the precision
    (--mixed_precision, --openvino_precision), whether XLA compiles it
    (--xla_cpu_compilation_enabled) and the runtime that runs its network (tensorflow,
    tflite, openvino), as an info-style gauge a dashboard can join on model_name and
    model_version."""
    family = GaugeMetricFamily(
        MODEL_RUNTIME, "What each loaded version computes in (1 per version).",
        labels=["model_name", "model_version", "precision", "xla_cpu_jit", "runtime"])
    for name in manager.model_names:
        for number in manager.available_versions(name):
            try:
                servable = manager.acquire(name, number)
            except errors.ServingError:
                continue  # unloaded since it was listed
            try:
                family.add_metric([name, str(number), servable.precision,
                                   "true" if servable.xla_jit else "false",
                                   servable.runtime], 1)
            finally:
                servable.release()
    return family


def families_from_text(text):
    """{metric name: prometheus_client Metric} parsed from an exposition by the library's
    own parser (counters keep their TF Serving names; samples are NAME_total)."""
    return {family.name: family for family in parser.text_string_to_metric_families(text)}


def batch_totals(text):
    """(rows, batches) the batcher has run so far, from a rendered exposition: the
    processed_batch_size histogram's sum and count (the tuner and bench-serve read the
    mean batch size this way from a running server)."""
    family = families_from_text(text).get(BATCH_SIZE)
    if family is None:
        return 0, 0
    values = {sample.name: sample.value for sample in family.samples}
    return int(values.get(BATCH_SIZE + "_sum", 0)), int(values.get(BATCH_SIZE + "_count", 0))
