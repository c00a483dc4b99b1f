"""Keeps the versions a version policy asks for loaded, polling each base path like TF
Serving's file-system source, and swaps the served model set at run time.

Guarantees (TF Serving's availability-preserving policy, plus retries on change):
- a version that is no longer wanted keeps serving until a wanted one has loaded and
  warmed up, so a broken or half-copied newer version never takes the model down;
- a version that failed to load is tried again after `load_retry_interval_micros`, up to
  `max_num_load_retries` times, and again whenever its files change (names, sizes,
  mtimes), so a version copied non-atomically is served as soon as it is complete;
- a failed version shows in GetModelStatus as END with its load error;
- retired versions close their session only when their last in-flight request ends;
- `reload()` loads new models before removed ones are unloaded.
Loading happens in `poll()` (the poller thread), never on the request path.
"""
import concurrent.futures
import logging
import os
import threading
import time

import grpc
import tensorflow as tf

from slimserve.serving.core import errors
from slimserve.serving.core.servable import WARMUP_PATH, Servable
from slimserve.serving.core.version_dirs import list_version_dirs, version_fingerprint
from slimserve.serving.core.version_policy import versions_to_unload

LOADING, AVAILABLE, UNLOADING, END = "LOADING", "AVAILABLE", "UNLOADING", "END"
DEFAULT_LOAD_RETRY_INTERVAL_MICROS = 60 * 1000 * 1000  # TF Serving's default: 1 minute


def _describe(error):
    """A one-line load error for GetModelStatus and logs."""
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return "%s: %s" % (type(error).__name__, " ".join(lines[:2]) if lines else message)


class _Version:
    """What the manager knows of one version of one model."""

    def __init__(self, number):
        self.number = number
        self.state = None  # None until first aspired and tried
        self.error = ""
        self.servable = None
        self.aspired = False
        self.failures = 0  # failed loads since the files last changed
        self.fingerprint = None  # of the files as they were at the last failed load
        self.retry_at = 0.0  # time.monotonic() after which a failed load may be retried


class _Model:
    """One served model: its config and its versions."""

    def __init__(self, config):
        self.config = config
        self.versions = {}  # number -> _Version


class ModelManager:
    """All served models and versions; `poll()` reconciles them with the file system and
    `reload()` replaces the model set."""

    def __init__(self, configs, warmup=True, session_config=None, max_num_load_retries=5,
                 load_retry_interval_micros=DEFAULT_LOAD_RETRY_INTERVAL_MICROS,
                 num_load_threads=0, allow_version_labels_for_unavailable_models=False,
                 on_change=None, on_load=None, saved_model_tags=None, batching_for=None):
        """
        Args:
          configs: [ServedModel] served from the first poll on.
          warmup: replay assets.extra/tf_serving_warmup_requests before serving a version.
          max_num_load_retries: retries after a failed load before giving up until the
            version's files change (0: one attempt), as TF Serving's flag.
          load_retry_interval_micros: wait between those retries (negative: none).
          num_load_threads: > 1 loads different models in parallel (versions of one
            model load one at a time, highest first); 0 or 1 loads serially.
          allow_version_labels_for_unavailable_models: let a new label (or an unchanged
            one) name a version that is not AVAILABLE; by default every label must.
          on_change: callback(name, version, state, error) on every state change.
          on_load: callback(name, version, path, ok, load_seconds, warmup_seconds) after
            every load attempt (warmup_seconds None when no warmup ran).
          saved_model_tags: the meta graph's tags (TF Serving's --saved_model_tags);
            default `serve`.
          batching_for: callback(version dir) -> the version's batching parameters
            (core/batching.py's parameters_for_version), set on each loaded servable; a
            failure fails the load.
        """
        _check_unique(configs)
        self._warmup = warmup
        self._session_config = session_config
        self._tags = list(saved_model_tags) if saved_model_tags else None
        self._batching_for = batching_for
        self._max_retries = max_num_load_retries
        self._retry_interval = load_retry_interval_micros / 1e6
        self._allow_unavailable_labels = allow_version_labels_for_unavailable_models
        self.on_change = on_change
        self.on_load = on_load
        self._lock = threading.Lock()  # guards _models, _labels and version records
        self._poll_lock = threading.RLock()  # one reconciliation or reload at a time
        self._models = {c.name: _Model(c) for c in configs}
        self._labels = None  # {name: {label: version}} once the config's labels applied
        self._removed = {}  # name -> _Model no longer served (GetModelStatus history)
        self._pool = (concurrent.futures.ThreadPoolExecutor(num_load_threads,
                                                            thread_name_prefix="model-load")
                      if num_load_threads > 1 else None)
        self._stop = threading.Event()
        self._thread = None

    @property
    def model_names(self):
        with self._lock:
            return sorted(self._models)

    # --- reconciling with the file system -------------------------------------------

    def poll(self):
        """One pass: load newly wanted versions, retry failed ones that are due or
        changed, unload superseded ones. Applies the config's version labels once their
        versions are available (raises FAILED_PRECONDITION until they are)."""
        with self._poll_lock:
            with self._lock:
                models = list(self._models.values())
            self._reconcile_all(models)
            if self._labels is None:
                labels = self._label_map(models)
                with self._lock:
                    self._labels = labels

    def _reconcile_all(self, models):
        if self._pool is not None and len(models) > 1:
            list(self._pool.map(self._reconcile_logged, models))
        else:
            for model in models:
                self._reconcile_logged(model)

    def _reconcile_logged(self, model):
        try:
            self._reconcile(model)
        except Exception:  # pylint: disable=broad-except
            logging.exception("polling %s (model %s) failed", model.config.base_path,
                              model.config.name)

    def _reconcile(self, model):
        config = model.config
        on_disk = list_version_dirs(config.base_path)
        aspired = config.policy.select(on_disk)
        with self._lock:
            for number, version in model.versions.items():
                reaspired = number in aspired and not version.aspired
                version.aspired = number in aspired
                if reaspired:  # wanted again: a fresh start, as TF Serving re-aspires
                    version.failures, version.retry_at = 0, 0.0
            for number in aspired:
                model.versions.setdefault(number, _Version(number)).aspired = True
        for number in sorted(aspired, reverse=True):
            version = model.versions[number]
            if version.state in (LOADING, AVAILABLE, UNLOADING):
                continue
            if self._load_due(version, on_disk[number]):
                self._load(model, version, on_disk[number])
        with self._lock:
            available = [n for n, v in model.versions.items() if v.state == AVAILABLE]
        for number in versions_to_unload(aspired, available):
            self._unload(model, model.versions[number])

    def _load_due(self, version, path):
        if version.state is None or not version.error:
            return True  # never tried, or unloaded cleanly and wanted again
        if version_fingerprint(path) != version.fingerprint:
            version.failures = 0  # its files changed since it failed: try at once
            return True
        if version.failures > self._max_retries:
            return False  # given up until the files change
        return time.monotonic() >= version.retry_at

    def _load(self, model, version, path):
        name = model.config.name
        fingerprint = version_fingerprint(path)
        self._set_state(name, version, LOADING)
        started = time.monotonic()
        servable, load_seconds, warmup_seconds, warmed = None, 0.0, None, 0
        try:
            servable = Servable(name, version.number, path, self._session_config, self._tags)
            if self._batching_for is not None:
                servable.batching_parameters = self._batching_for(path)
            load_seconds = time.monotonic() - started
            if self._warmup and tf.io.gfile.exists(os.path.join(path, WARMUP_PATH)):
                warmed = servable.warm_up()
                warmup_seconds = time.monotonic() - started - load_seconds
        except Exception as error:  # pylint: disable=broad-except
            if servable is None:
                load_seconds = time.monotonic() - started
            else:
                servable.retire()
                warmup_seconds = time.monotonic() - started - load_seconds
            with self._lock:
                version.failures += 1
                version.fingerprint = fingerprint
                version.retry_at = time.monotonic() + max(self._retry_interval, 0.0)
            attempts_left = self._max_retries + 1 - version.failures
            self._set_state(name, version, END, _describe(error))
            logging.warning("model %s version %d failed to load from %s (%s); %s", name,
                            version.number, path, version.error,
                            "retrying in %.0f s (%d attempts left) or when its files change"
                            % (max(self._retry_interval, 0.0), attempts_left)
                            if attempts_left > 0 else "retrying when its files change")
            self._notify_load(name, version.number, path, False, load_seconds, warmup_seconds)
            return
        with self._lock:
            version.servable = servable
            version.failures, version.fingerprint = 0, None
        self._set_state(name, version, AVAILABLE)
        logging.info("loaded %s version %d in %.2f s (+%.2f s for %d warmup requests)", name,
                     version.number, load_seconds, warmup_seconds or 0.0, warmed)
        self._notify_load(name, version.number, path, True, load_seconds, warmup_seconds)

    def _unload(self, model, version):
        with self._lock:
            servable, version.servable = version.servable, None
            version.state = UNLOADING
        self._publish(model.config.name, version)
        if servable is not None:
            servable.retire()
        self._set_state(model.config.name, version, END)

    def _set_state(self, name, version, state, error=""):
        with self._lock:
            version.state, version.error = state, error
        self._publish(name, version)

    def _publish(self, name, version):
        logging.info("model %s version %d: %s%s", name, version.number, version.state,
                     (" (%s)" % version.error) if version.error else "")
        if self.on_change is not None:
            try:
                self.on_change(name, version.number, version.state, version.error)
            except Exception:  # pylint: disable=broad-except
                logging.exception("on_change callback failed")

    def _notify_load(self, *args):
        if self.on_load is not None:
            try:
                self.on_load(*args)
            except Exception:  # pylint: disable=broad-except
                logging.exception("on_load callback failed")

    # --- replacing the model set ----------------------------------------------------

    def reload(self, configs):
        """Serves exactly `configs` ([ServedModel]) from now on.

        New models (and models whose base path changed) are loaded first; the reload
        fails, changing nothing, unless each has an AVAILABLE version and every version
        label names an AVAILABLE version (see allow_version_labels_for_unavailable_models).
        Only then are removed models unloaded. Changed policies and labels of kept models
        apply with the same availability-preserving rules as new versions on disk.
        Raises errors.ServingError (INVALID_ARGUMENT, UNKNOWN or FAILED_PRECONDITION).
        """
        try:
            _check_unique(configs)
        except ValueError as error:
            raise errors.invalid("%s", error) from None
        if not configs:
            raise errors.invalid("the new config lists no model")
        with self._poll_lock:
            with self._lock:
                old = dict(self._models)
            fresh, kept = {}, {}  # name -> _Model; name -> (_Model, its old config)
            for config in configs:
                model = old.get(config.name)
                if model is not None and model.config.base_path == config.base_path:
                    kept[config.name] = (model, model.config)
                    model.config = config
                else:
                    fresh[config.name] = _Model(config)
            candidates = dict(fresh)
            candidates.update((name, model) for name, (model, _) in kept.items())
            self._reconcile_all(list(candidates.values()))
            try:
                self._check_loaded(fresh)
                labels = self._label_map(candidates.values())
            except errors.ServingError:
                for model, config in kept.values():
                    model.config = config  # the next poll returns to the old policy
                for name, model in fresh.items():
                    self._retire_model(model)
                    if name in old:
                        self._republish(old[name])
                raise
            with self._lock:
                self._models = candidates
                self._labels = labels
                for name in candidates:
                    self._removed.pop(name, None)
            for name, model in old.items():
                if candidates.get(name) is not model:
                    self._retire_model(model)
                    if name in candidates:
                        self._republish(candidates[name])
                    else:
                        with self._lock:
                            self._removed[name] = model
            logging.info("serving models %s", ", ".join(sorted(candidates)))

    def _check_loaded(self, fresh):
        missing = []
        for name, model in sorted(fresh.items()):
            with self._lock:
                states = {n: (v.state, v.error) for n, v in model.versions.items()}
            if not any(state == AVAILABLE for state, _ in states.values()):
                why = "; ".join("version %d: %s" % (n, e) for n, (s, e) in sorted(states.items())
                                if e) or "no version under %s" % model.config.base_path
                missing.append("{%s: %s}" % (name, why))
        if missing:
            raise errors.ServingError(grpc.StatusCode.UNKNOWN, "%d model(s) did not become "
                                      "available: %s" % (len(missing), ", ".join(missing)))

    def _label_map(self, models):
        """{name: {label: version}}, checked as TF Serving's UpdateModelVersionLabelMap."""
        with self._lock:
            current = self._labels or {}
            labels = {}
            for model in models:
                name = model.config.name
                for label, number in sorted(model.config.labels.items()):
                    version = model.versions.get(number)
                    ok = version is not None and version.state == AVAILABLE
                    if not ok and self._allow_unavailable_labels:
                        ok = current.get(name, {}).get(label, number) == number
                    if not ok:
                        raise errors.ServingError(
                            grpc.StatusCode.FAILED_PRECONDITION,
                            "Request to assign label %s to version %d of model %s, which is "
                            "not currently available for inference" % (label, number, name))
                    labels.setdefault(name, {})[label] = number
        return labels

    def _retire_model(self, model):
        for version in list(model.versions.values()):
            if version.state == AVAILABLE:
                self._unload(model, version)

    def _republish(self, model):
        """Re-announces a model's states after another entry of the same name changed
        them in on_change listeners (a base-path swap, or a rolled-back one)."""
        with self._lock:
            versions = [v for v in model.versions.values() if v.state is not None]
        for version in versions:
            self._publish(model.config.name, version)

    # --- the poller ------------------------------------------------------------------

    def start_polling(self, interval_seconds):
        """Polls every `interval_seconds` in a daemon thread (0: never)."""
        if interval_seconds <= 0:
            return

        def loop():
            while not self._stop.wait(interval_seconds):
                try:
                    self.poll()
                except errors.ServingError as error:
                    logging.warning("%s", error.message)

        self._thread = threading.Thread(target=loop, name="version-poller", daemon=True)
        self._thread.start()

    def stop(self):
        """Stops polling and retires every version (sessions close as requests end)."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=60)
        with self._poll_lock:
            with self._lock:
                models = list(self._models.values())
            for model in models:
                self._retire_model(model)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # --- the request path ------------------------------------------------------------

    def acquire(self, name, version=None, label=None):
        """The servable a ModelSpec names, with one in-flight reference taken."""
        with self._lock:
            model = self._models.get(name)
            if model is None:
                raise errors.not_found("Servable not found for request: Latest(%s)", name)
            if label:
                version = self._resolve_label_locked(name, label)
            available = {n: v.servable for n, v in model.versions.items()
                         if v.state == AVAILABLE and v.servable is not None}
            if version is None:
                if not available:
                    raise errors.unavailable("Servable not found for request: Latest(%s)", name)
                servable = available[max(available)]
            else:
                servable = available.get(version)
                if servable is None:
                    raise errors.not_found("Servable not found for request: Specific(%s, %d)",
                                           name, version)
            if not servable.acquire():  # retired between lookup and use
                raise errors.unavailable("version %d of %s is unloading", servable.version, name)
        return servable

    def resolve_label(self, name, label):
        with self._lock:
            if name not in self._models:
                raise errors.not_found("Servable not found for request: Latest(%s)", name)
            return self._resolve_label_locked(name, label)

    def _resolve_label_locked(self, name, label):
        number = (self._labels or {}).get(name, {}).get(label)
        if number is None:
            raise errors.invalid("Unrecognized servable version label: %s", label)
        return number

    def status(self, name, version=None):
        """[(version, state, error)] newest first, for GetModelStatus: every version seen
        (END ones too, with their load error if they failed), or the one asked for."""
        with self._lock:
            model = self._models.get(name) or self._removed.get(name)
            states = {} if model is None else {
                n: (v.state, v.error) for n, v in model.versions.items() if v.state}
        if version is not None:
            if version not in states:
                raise errors.not_found("Could not find version %d of model %s", version, name)
            states = {version: states[version]}
        if not states:
            raise errors.not_found("Could not find any versions of model %s", name)
        return [(v, s, e) for v, (s, e) in sorted(states.items(), reverse=True)]

    def available_versions(self, name):
        with self._lock:
            model = self._models.get(name)
            if model is None:
                return []
            return sorted(n for n, v in model.versions.items() if v.state == AVAILABLE)


def _check_unique(configs):
    names = [c.name for c in configs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError("model %s is configured twice" % ", ".join(twice))
