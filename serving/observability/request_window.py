"""The last minute of requests, for the status page: rates and latency percentiles per
model, version and API that the cumulative Prometheus counters cannot give directly.

Bounded twice, by age (`window_seconds`) and by count (`max_entries`), so a flood of
requests costs a fixed amount of memory; under such a flood the rates are those of the
newest `max_entries` requests. Entries are keyed by `label(model name)` (the server passes
Metrics.model_label: served names, or one label for every unknown one), so neither a
client's names nor their bytes are kept, and the status page has a row per served model,
version and API.
"""
import collections
import threading
import time

import numpy as np


class RequestWindow:
    def __init__(self, window_seconds=60.0, max_entries=20000, label=None):
        self.window_seconds = window_seconds
        self._label = label or (lambda name: name)
        self._entries = collections.deque(maxlen=max_entries)  # (time, key, ms, ok)
        self._lock = threading.Lock()

    def add(self, model, version, api, seconds, ok=True, now=None):
        with self._lock:
            self._entries.append((now if now is not None else time.monotonic(),
                                  (self._label(model), version, api), seconds * 1000.0, ok))

    def summary(self, now=None):
        """{(model, version, api): {"rate": req/s, "errors": n, "p50_ms", "p90_ms",
        "p99_ms"}} over the window."""
        now = now if now is not None else time.monotonic()
        cutoff = now - self.window_seconds
        grouped = collections.defaultdict(list)
        errors = collections.Counter()
        with self._lock:
            while self._entries and self._entries[0][0] < cutoff:
                self._entries.popleft()
            entries = list(self._entries)
        if not entries:
            return {}
        span = max(1e-3, min(self.window_seconds, now - entries[0][0]))
        for _, key, millis, ok in entries:
            grouped[key].append(millis)
            if not ok:
                errors[key] += 1
        out = {}
        for key, values in grouped.items():
            values = np.array(values)
            out[key] = {"rate": len(values) / span, "errors": errors[key],
                        "p50_ms": float(np.percentile(values, 50)),
                        "p90_ms": float(np.percentile(values, 90)),
                        "p99_ms": float(np.percentile(values, 99))}
        return out
