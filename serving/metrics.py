"""Prometheus text-format metrics: request counts by model/API/status, a latency
histogram and, with batching on, the sizes of the batches actually run (what tells
whether batching is filling); served at TF Serving's default path
/monitoring/prometheus/metrics."""
import bisect
import collections
import threading

PATH = "/monitoring/prometheus/metrics"
BATCH_SIZE = ":tensorflow:serving:batching_session:processed_batch_size"  # TF Serving's name
_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self._counts = collections.Counter()  # (model, api, status) -> n
        self._buckets = collections.defaultdict(lambda: [0] * (len(_BUCKETS_MS) + 1))
        self._sums = collections.Counter()
        self._loads = collections.Counter()  # (model, state) -> n
        self._batch_sizes = collections.Counter()  # rows in one batch -> number of batches

    def observe(self, model, api, status, seconds):
        millis = seconds * 1000.0
        with self._lock:
            self._counts[(model, api, status)] += 1
            self._buckets[(model, api)][bisect.bisect_left(_BUCKETS_MS, millis)] += 1
            self._sums[(model, api)] += millis

    def observe_batch(self, rows):
        with self._lock:
            self._batch_sizes[rows] += 1

    def model_event(self, model, state):
        with self._lock:
            self._loads[(model, state)] += 1

    def render(self):
        lines = ["# TYPE :tensorflow:serving:request_count counter"]
        with self._lock:
            for (model, api, status), count in sorted(self._counts.items()):
                lines.append(':tensorflow:serving:request_count{model_name="%s",api="%s",'
                             'status="%s"} %d' % (model, api, status, count))
            lines.append("# TYPE :tensorflow:serving:request_latency_ms histogram")
            for (model, api), buckets in sorted(self._buckets.items()):
                cumulative = 0
                for bound, count in zip(list(_BUCKETS_MS) + ["+Inf"], buckets):
                    cumulative += count
                    lines.append(':tensorflow:serving:request_latency_ms_bucket{model_name="%s",'
                                 'api="%s",le="%s"} %d' % (model, api, bound, cumulative))
                lines.append(':tensorflow:serving:request_latency_ms_sum{model_name="%s",'
                             'api="%s"} %.3f' % (model, api, self._sums[(model, api)]))
                lines.append(':tensorflow:serving:request_latency_ms_count{model_name="%s",'
                             'api="%s"} %d' % (model, api, cumulative))
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
            lines.append("# TYPE :tensorflow:core:servable_state_changes counter")
            for (model, state), count in sorted(self._loads.items()):
                lines.append(':tensorflow:core:servable_state_changes{model_name="%s",'
                             'state="%s"} %d' % (model, state, count))
        return "\n".join(lines) + "\n"
