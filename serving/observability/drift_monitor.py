"""The server's own drift checks: each served version's traffic, read back from the
server's own request logs, against the reference its export recorded; the status page
and the Prometheus metrics show the last result per model and version.

    monitor = DriftMonitor(manager, request_logs, MonitorOptions(), drift.DriftOptions())
    monitor.start()        # a check every check_interval_seconds (0: only on demand)
    monitor.check_now()    # on demand (slimserve-server: SIGUSR2)
    monitor.results()      # {(model, version): VersionDrift}

Off the request path and bounded: one daemon thread runs the checks, one at a time; a
check publishes each model's open request log file (as SIGUSR1 does), then for each
AVAILABLE version reads only the newest log files until they hold `max_images` of its
images (drift_pipeline.py, the pipeline the flywheel's drift report runs too), runs that
version's `embeddings` signature on them through the loaded version itself (one
in-flight reference held meanwhile, as a request holds one), and keeps a few numbers per
version. A version without a reference or without logged traffic says so; one whose
statistics were not all computed (no embeddings signature, no decodable image) and none
of the computed ones drifts is unknown (drift None, the note says which), never "no
drift", as slimserve-drift says `unknown`: a statistic not computed is no evidence. Only
models with request logging (a logging_config) are checked. Gauges: drift {model_name,
model_version} (1: the newest window drifts; no series while unknown), drift_statistic,
drift_threshold and drift_p_value {model_name, model_version, statistic}: series only for
served versions and the statistics computed.
"""
import dataclasses
import glob
import logging
import threading
import time
from typing import Dict, Optional

from prometheus_client.core import GaugeMetricFamily

from slimserve import fields
from slimserve import errors as user_errors
from slimserve.serving.core import errors
from slimserve.serving.observability import drift as drift_lib
from slimserve.serving.observability import drift_pipeline
from slimserve.serving.observability import reference as reference_lib

DRIFT = ":slimserve:serving:drift"
DRIFT_STATISTIC = ":slimserve:serving:drift_statistic"
DRIFT_THRESHOLD = ":slimserve:serving:drift_threshold"
DRIFT_P_VALUE = ":slimserve:serving:drift_p_value"
MAX_RESULTS = 64  # versions remembered at most (served ones are kept first)


@dataclasses.dataclass
class MonitorOptions:
    """When and how much the server checks (its --drift_* flags)."""
    check_interval_seconds: float = fields.option(
        600.0, "Seconds between two drift checks of every logged model's versions (0: "
        "only on demand, SIGUSR2).", fields.Bound(0, 7 * 86400))
    max_images: int = fields.option(
        1000, "Newest logged images of a version one check reads at most (each runs "
        "through the version's embeddings signature).", fields.Bound(10, 1_000_000))


@dataclasses.dataclass
class VersionDrift:
    """The last check of one model version."""
    model: str
    version: int
    checked_at: float
    images: int = 0
    drift: Optional[bool] = None  # None: not tested, or unknown (note says why)
    statistics: Dict[str, drift_lib.StatisticResult] = dataclasses.field(default_factory=dict)
    since: Optional[int] = None   # logged time of the first window of the drift
    note: str = ""


class DriftMonitor:
    """See the module docstring."""

    def __init__(self, manager, request_logs, options=None, drift_options=None):
        self.manager = manager
        self.request_logs = request_logs
        self.options = fields.check(options if options is not None else MonitorOptions())
        self.drift_options = (drift_options if drift_options is not None
                              else drift_lib.DriftOptions()).validate()
        self._results = {}
        self._prepared = {}  # version path -> drift_lib.Prepared (or None: no reference)
        self._lock = threading.Lock()  # the results
        self._check_lock = threading.Lock()  # one check at a time
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = None

    # --- running -----------------------------------------------------------------------

    def start(self):
        self._thread = threading.Thread(target=self._run, name="drift-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def request_check(self):
        """Asks the monitor's thread for a check now (a signal handler may call this)."""
        self._wake.set()

    def _run(self):
        interval = self.options.check_interval_seconds
        while not self._stop.is_set():
            self._wake.wait(interval if interval > 0 else None)
            if self._stop.is_set():
                return
            self._wake.clear()
            try:
                self.check_now()
            except Exception:  # pylint: disable=broad-except  (never the thread)
                logging.exception("drift check failed")

    def check_now(self):
        """Checks every logged model's available versions now; returns results()."""
        with self._check_lock:
            served = set()
            for name, logger in sorted(self.request_logs.loggers.items()):
                logger.flush(timeout=10.0)
                pattern = glob.escape(logger.filename_prefix) + "*"
                for version in self.manager.available_versions(name):
                    served.add((name, version))
                    result = self._check(name, version, pattern)
                    with self._lock:
                        self._results[(name, version)] = result
            with self._lock:
                stale = [key for key in self._results if key not in served]
                for key in stale[:max(0, len(self._results) - MAX_RESULTS)]:
                    del self._results[key]
        return self.results()

    def _check(self, name, version, pattern):
        now = time.time()
        try:
            servable = self.manager.acquire(name, version)
        except errors.ServingError as error:
            return VersionDrift(name, version, now, note=error.message)
        try:
            prepared = self._reference(servable.path)
            if prepared is None:
                return VersionDrift(name, version, now, note="no reference (exported "
                                    "before references were recorded)")
            try:
                selection = drift_pipeline.select(pattern, name, version,
                                                  self.options.max_images)
            except (user_errors.UserError, OSError) as error:  # no log file yet
                return VersionDrift(name, version, now, note=str(error))
            if not selection.images:
                return VersionDrift(name, version, now, note="no logged traffic yet")
            model = drift_pipeline.VersionModel(servable=servable)
            outcome = drift_pipeline.run(
                selection, prepared, self.drift_options, model, self.options.max_images,
                max_windows=max(1, self.options.max_images //
                                self.drift_options.window_size + 1))
        finally:
            servable.release()
        if outcome.latest is None:
            return VersionDrift(name, version, now, outcome.images,
                                note="%d logged image(s), fewer than a window" % outcome.images)
        first, _ = outcome.since()
        note = ""
        if outcome.verdict() is None:  # no evidence either way: slimserve-drift's `unknown`
            why = ("the version has no embeddings signature" if not model.has_embeddings
                   else "the reference has no embeddings" if prepared.embeddings is None
                   else "too few decodable images")
            note = "unknown: %s not computed (%s)" % (", ".join(outcome.not_computed()), why)
        return VersionDrift(name, version, now, outcome.images, outcome.verdict(),
                            dict(outcome.latest.result.statistics),
                            first.start_time if first is not None else None, note)

    def _reference(self, path):
        """The Prepared reference of a version directory (cached), None without one."""
        if path not in self._prepared:
            try:
                reference = reference_lib.read(path)
            except reference_lib.BadReference as error:
                logging.warning("drift: %s", error)
                reference = None
            self._prepared[path] = (None if reference is None
                                    else drift_lib.Prepared(reference, self.drift_options))
            while len(self._prepared) > MAX_RESULTS:
                self._prepared.pop(next(iter(self._prepared)))
        return self._prepared[path]

    # --- reading -----------------------------------------------------------------------

    def results(self):
        """{(model, version): VersionDrift} of the last checks (a copy)."""
        with self._lock:
            return dict(self._results)

    def families(self):
        """The gauges (module docstring) for the metrics exposition."""
        labels = ["model_name", "model_version"]
        flagged = GaugeMetricFamily(DRIFT, "1 when the newest window of the version's "
                                    "logged traffic drifts from its reference.", labels=labels)
        values = GaugeMetricFamily(DRIFT_STATISTIC, "Each drift statistic of the newest "
                                   "window.", labels=labels + ["statistic"])
        thresholds = GaugeMetricFamily(DRIFT_THRESHOLD, "Each drift statistic's calibrated "
                                       "threshold.", labels=labels + ["statistic"])
        p_values = GaugeMetricFamily(DRIFT_P_VALUE, "Each drift statistic's p-value.",
                                     labels=labels + ["statistic"])
        for (model, version), result in sorted(self.results().items()):
            key = [model, str(version)]
            if result.drift is not None:
                flagged.add_metric(key, 1.0 if result.drift else 0.0)
            for name, stat in result.statistics.items():
                values.add_metric(key + [name], stat.value)
                thresholds.add_metric(key + [name], stat.threshold)
                p_values.add_metric(key + [name], stat.p_value)
        return [flagged, values, thresholds, p_values]
