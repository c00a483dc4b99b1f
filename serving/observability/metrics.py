"""Prometheus text-format metrics: request counts by model/API/status; request latency
per model, version, signature, API and entrypoint (TF Serving's request_latency, in
microseconds, with version and signature_name labels added); the state of every model
version and its load attempts; with batching on, the sizes of the batches run and how
long requests queued for them; request-log records written and dropped. Served at TF
Serving's default path /monitoring/prometheus/metrics.

Load metrics keep TensorFlow's own names (its SavedModel loader exports
/tensorflow/cc/saved_model/load_attempt_count and load_latency by model_path, and TF
Serving /tensorflow/serving/model_warmup_latency); TF Serving 2.15 has no per-version
state gauge, so MODEL_STATE is slimserve's, named in the same scheme."""
import bisect
import collections
import threading

PATH = "/monitoring/prometheus/metrics"
BATCH_SIZE = ":tensorflow:serving:batching_session:processed_batch_size"  # TF Serving's name
MODEL_STATE = ":tensorflow:serving:model_state"
LOAD_ATTEMPTS = ":tensorflow:cc:saved_model:load_attempt_count"  # TensorFlow's name
LOAD_LATENCY = ":tensorflow:cc:saved_model:load_latency"  # TensorFlow's: total microseconds
WARMUP_LATENCY = ":tensorflow:serving:model_warmup_latency"  # TF Serving's: microseconds
VERSION_STATES = ("START", "LOADING", "AVAILABLE", "UNLOADING", "END")
REQUEST_COUNT = ":tensorflow:serving:request_count"
REQUEST_LATENCY = ":tensorflow:serving:request_latency"  # TF Serving's: microseconds
QUEUING_LATENCY = ":tensorflow:serving:batching_session:queuing_latency"  # TF Serving's
REQUEST_LOG_COUNT = ":tensorflow:serving:request_log_count"  # TF Serving's
# Microseconds: 100 us .. ~100 s, about two buckets per factor of 3.
_LATENCY_BUCKETS_US = tuple(int(100 * 1.8 ** i) for i in range(24))
_QUEUE_BUCKETS_US = tuple(int(10 * 1.8 ** i) for i in range(24))
_WARMUP_BUCKETS_US = (1e4, 1e5, 1e6, 1e7, 1e8)


def _label(value):
    """A Prometheus label value, escaped."""
    return str(value).replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self._counts = collections.Counter()  # (model, api, status) -> n
        # (model, version, signature, api, entrypoint) -> bucket counts / sum (us)
        self._latency = collections.defaultdict(
            lambda: [0] * (len(_LATENCY_BUCKETS_US) + 1))
        self._latency_sums = collections.Counter()
        self._queue_waits = [0] * (len(_QUEUE_BUCKETS_US) + 1)
        self._queue_wait_sum = 0.0
        self._collectors = []  # callables -> Prometheus text lines (request logs, ...)
        self._version_states = {}  # (model, version) -> state
        self._load_attempts = collections.Counter()  # (model_path, "success"|"fail") -> n
        self._load_micros = collections.Counter()  # model_path -> total microseconds
        self._warmups = collections.defaultdict(
            lambda: [0] * (len(_WARMUP_BUCKETS_US) + 1))  # (path, status) -> bucket counts
        self._warmup_sums = collections.Counter()
        self._batch_sizes = collections.Counter()  # rows in one batch -> number of batches

    def observe(self, model, api, status, seconds, version=None, signature="",
                entrypoint="GRPC"):
        """One request: counted under its status, timed under its version and signature."""
        micros = seconds * 1e6
        key = (model, "" if version is None else str(version), signature or "", api,
               entrypoint)
        with self._lock:
            self._counts[(model, api, status)] += 1
            self._latency[key][bisect.bisect_left(_LATENCY_BUCKETS_US, micros)] += 1
            self._latency_sums[key] += micros

    def observe_queue_wait(self, seconds):
        """Batching: how long one request waited for its batch to start."""
        micros = seconds * 1e6
        with self._lock:
            self._queue_waits[bisect.bisect_left(_QUEUE_BUCKETS_US, micros)] += 1
            self._queue_wait_sum += micros

    def add_collector(self, collector):
        """collector() -> Prometheus text lines, appended to every render."""
        self._collectors.append(collector)

    def observe_batch(self, rows):
        with self._lock:
            self._batch_sizes[rows] += 1

    def model_event(self, model, version, state, error=""):
        """ModelManager.on_change: a version changed state (error: why a load failed)."""
        del error  # GetModelStatus carries it; a label per message would explode series
        with self._lock:
            self._version_states[(model, int(version))] = state

    def model_load(self, model, version, path, ok, load_seconds, warmup_seconds=None):
        """ModelManager.on_load: one load attempt of a version at `path`."""
        del model, version  # TensorFlow labels its load metrics by model_path
        with self._lock:
            self._load_attempts[(path, "success" if ok else "fail")] += 1
            self._load_micros[path] += int(load_seconds * 1e6)
            if warmup_seconds is not None:
                micros = warmup_seconds * 1e6
                key = (path, "OK" if ok else "FAILED")
                self._warmups[key][bisect.bisect_left(_WARMUP_BUCKETS_US, micros)] += 1
                self._warmup_sums[key] += micros

    def render(self):
        lines = ["# TYPE %s counter" % REQUEST_COUNT]
        with self._lock:
            for (model, api, status), count in sorted(self._counts.items()):
                lines.append('%s{model_name="%s",api="%s",status="%s"} %d' % (
                    REQUEST_COUNT, _label(model), api, status, count))
            lines.append("# TYPE %s histogram" % REQUEST_LATENCY)
            for key, buckets in sorted(self._latency.items()):
                model, version, signature, api, entrypoint = key
                labels = 'model_name="%s",version="%s",signature_name="%s",API="%s",' \
                         'entrypoint="%s"' % (_label(model), version, _label(signature), api,
                                              entrypoint)
                _histogram(lines, REQUEST_LATENCY, labels, _LATENCY_BUCKETS_US, buckets,
                           self._latency_sums[key])
            if any(self._queue_waits):
                lines.append("# TYPE %s histogram" % QUEUING_LATENCY)
                _histogram(lines, QUEUING_LATENCY, 'thread_pool_name="batch"',
                           _QUEUE_BUCKETS_US, self._queue_waits, self._queue_wait_sum)
            if self._batch_sizes:
                name = BATCH_SIZE
                lines.append("# TYPE %s histogram" % name)
                cumulative = 0
                for size in sorted(self._batch_sizes):
                    cumulative += self._batch_sizes[size]
                    lines.append('%s_bucket{le="%d"} %d' % (name, size, cumulative))
                lines.append('%s_bucket{le="+Inf"} %d' % (name, cumulative))
                lines.append("%s_sum %d" % (name, sum(s * n for s, n in self._batch_sizes.items())))
                lines.append("%s_count %d" % (name, cumulative))
            lines.append("# TYPE %s gauge" % MODEL_STATE)
            for (model, version), current in sorted(self._version_states.items()):
                for state in VERSION_STATES:
                    lines.append('%s{model_name="%s",version="%d",state="%s"} %d' % (
                        MODEL_STATE, _label(model), version, state, state == current))
            lines.append("# TYPE %s counter" % LOAD_ATTEMPTS)
            for (path, status), count in sorted(self._load_attempts.items()):
                lines.append('%s{model_path="%s",status="%s"} %d' % (
                    LOAD_ATTEMPTS, _label(path), status, count))
            lines.append("# TYPE %s counter" % LOAD_LATENCY)
            for path, micros in sorted(self._load_micros.items()):
                lines.append('%s{model_path="%s"} %d' % (LOAD_LATENCY, _label(path), micros))
            lines.append("# TYPE %s histogram" % WARMUP_LATENCY)
            for (path, status), buckets in sorted(self._warmups.items()):
                labels = 'model_path="%s",status="%s"' % (_label(path), status)
                cumulative = 0
                for bound, count in zip(list(_WARMUP_BUCKETS_US) + ["+Inf"], buckets):
                    cumulative += count
                    bound = bound if bound == "+Inf" else "%g" % bound
                    lines.append('%s_bucket{%s,le="%s"} %d' % (WARMUP_LATENCY, labels, bound,
                                                              cumulative))
                lines.append("%s_sum{%s} %.0f" % (WARMUP_LATENCY, labels,
                                                  self._warmup_sums[(path, status)]))
                lines.append("%s_count{%s} %d" % (WARMUP_LATENCY, labels, cumulative))
        for collector in self._collectors:
            lines.extend(collector())
        return "\n".join(lines) + "\n"


def _histogram(lines, name, labels, bounds, buckets, total):
    cumulative = 0
    for bound, count in zip(list(bounds) + ["+Inf"], buckets):
        cumulative += count
        lines.append('%s_bucket{%s,le="%s"} %d' % (name, labels, bound, cumulative))
    lines.append("%s_sum{%s} %.0f" % (name, labels, total))
    lines.append("%s_count{%s} %d" % (name, labels, cumulative))


def request_log_lines(loggers):
    """TF Serving's request_log_count for {model: RequestLogger}: records written (OK)
    and dropped because the queue was full or a write failed (RESOURCE_EXHAUSTED)."""
    lines = ["# TYPE %s counter" % REQUEST_LOG_COUNT]
    for model, logger in sorted(loggers.items()):
        lines.append('%s{model_name="%s",status_code="OK"} %d' % (
            REQUEST_LOG_COUNT, _label(model), logger.written))
        lines.append('%s{model_name="%s",status_code="RESOURCE_EXHAUSTED"} %d' % (
            REQUEST_LOG_COUNT, _label(model), logger.dropped))
    return lines


def batch_totals(text):
    """(rows, batches) the batcher has run so far, from a rendered Prometheus text: the
    processed_batch_size histogram's sum and count (the tuner and bench-serve read the
    mean batch size this way from a running server)."""
    values = {}
    for line in text.splitlines():
        for field in ("sum", "count"):
            if line.startswith("%s_%s " % (BATCH_SIZE, field)):
                values[field] = int(float(line.rsplit(" ", 1)[1]))
    return values.get("sum", 0), values.get("count", 0)
