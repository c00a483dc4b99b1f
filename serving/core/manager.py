"""Keeps the versions a version policy asks for loaded, polling each base path like TF
Serving's file-system source, and swaps the served model set at run time.

Guarantees (TF Serving's AspiredVersionsManager with its availability-preserving policy):
- every int64-named child of a base path is a version (version_dirs.aspirable_versions);
  one that cannot load ends END with its load error in GetModelStatus, and the version
  it was to replace keeps serving;
- one action at a time, as AvailabilityPreservingPolicy::GetNextAction: the lowest
  version no longer wanted is unloaded first whenever a wanted version is available (or
  nothing is wanted, or more than one unwanted version serves), else the highest new
  wanted version is loaded; so a model never drops to zero available versions because
  its successor is incomplete or broken;
- a failed version is tried again after `load_retry_interval_micros`, up to
  `max_num_load_retries` times, then no more while it stays wanted (TF Serving's
  ReloadAspiredError); with `retry_failed_versions_on_change` (slimserve only) also
  whenever its files change (names, sizes, mtimes);
- a base path that cannot be read (gone, unmounted) changes nothing: its versions keep
  serving until it is back;
- retired versions close their session only when their last in-flight request ends;
- `reload()` loads new models before removed ones are unloaded.
Loading happens in `poll()` (the poller thread), never on the request path.
"""
import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
import typing

import grpc
import tensorflow as tf
from google.protobuf import message as proto_message

from slimserve import errors as user_errors
from slimserve import fields
from slimserve.serving import limits
from slimserve.serving.core import custom_ops
from slimserve.serving.core import errors
from slimserve.serving.core import health as health_lib
from slimserve.serving.core import heap
from slimserve.serving.core import openvino_servable
from slimserve.serving.core import tflite_model
from slimserve.serving.core import tflite_servable
from slimserve.serving.core.servable import WARMUP_PATH, Servable
from slimserve.serving.core.version_dirs import (BasePathError, aspirable_versions,
                                                  diagnose_base_path, version_fingerprint)
from slimserve.serving.core.version_policy import next_unload

LOADING, AVAILABLE, UNLOADING, END = "LOADING", "AVAILABLE", "UNLOADING", "END"
DEFAULT_LOAD_RETRY_INTERVAL_MICROS = 60 * 1000 * 1000  # TF Serving's default: 1 minute
# How many served names (and how much of each) a NOT_FOUND for an unknown model lists.
MAX_NAMES_LISTED = 10
MAX_NAME_CHARS = 64
HINT_LOG_INTERVAL_SECONDS = 60.0  # an unknown model's hint is logged at most this often
# The manager's background components, as the health registry names them.
POLLER, LOADER, UNLOADER = "version poller", "model loader", "unload worker"


def _describe(error):
    """A one-line load error for GetModelStatus and logs."""
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return "%s: %s" % (type(error).__name__, " ".join(lines[:2]) if lines else message)


def load_error_code(error):
    """The canonical code of a failed load, as TF Serving reports it in GetModelStatus:
    TensorFlow's own status for TF errors (a warmup record's failing run included),
    DATA_LOSS for a saved_model.pb that does not parse, NOT_FOUND for a file or tag-set
    that is not there, else UNKNOWN (a Python-level failure has no canonical code)."""
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or error.__context__
    for item in chain:
        if isinstance(item, tf.errors.OpError):
            return item.error_code
        if isinstance(item, errors.ServingError):
            return item.code.value[0]
        if isinstance(item, proto_message.DecodeError):
            return grpc.StatusCode.DATA_LOSS.value[0]
    for item in chain:
        if isinstance(item, FileNotFoundError) or (
                isinstance(item, (OSError, RuntimeError)) and
                ("could not be found" in str(item) or "does not exist" in str(item))):
            return grpc.StatusCode.NOT_FOUND.value[0]
    return grpc.StatusCode.UNKNOWN.value[0]


@dataclasses.dataclass
class ManagerOptions:
    """How the manager loads, warms up, retries and unloads versions: its part of the
    server's flags (each field names its flag; ModelServer builds it from ServerOptions),
    checked once when the manager is made."""
    warmup: bool = fields.option(
        True, "Replay assets.extra/tf_serving_warmup_requests before serving a version.",
        flag="enable_model_warmup")
    warmup_iterations: int = fields.option(
        1, "Times each warmup record is replayed in a row.",
        bound=fields.Bound(1, limits.MAX_WARMUP_ITERATIONS),
        flag="num_request_iterations_for_warmup")
    max_num_load_retries: int = fields.option(
        5, "Retries after a failed load before giving up on the version while it stays "
        "aspired (0: one attempt).", bound=fields.Bound(0, limits.MAX_RETRIES))
    load_retry_interval_micros: int = fields.option(
        DEFAULT_LOAD_RETRY_INTERVAL_MICROS, "Wait between those retries (negative: none).",
        bound=fields.Bound(-limits.DAY_MICROS, limits.DAY_MICROS))
    num_load_threads: int = fields.option(
        0, "> 1 loads different models in parallel (versions of one model load one at a "
        "time, highest first); 0 or 1 loads serially.", bound=limits.THREADS_OR_ZERO)
    num_unload_threads: int = fields.option(
        0, "> 0 unloads (retiring a version, closing its session) in a pool of that many "
        "threads, so a slow unload never holds up loading; 0 unloads in the polling "
        "thread.", bound=limits.THREADS_OR_ZERO)
    allow_version_labels_for_unavailable_models: bool = fields.option(
        False, "Let a new label (or an unchanged one) name a version that is not "
        "AVAILABLE; by default every label must.")
    error_hints: bool = fields.option(
        False, "Add hints to NOT_FOUND answers: the served model names for a model this "
        "server does not serve, and why a served model's base path holds no version (then "
        "UNAVAILABLE, so clients retry). Off: TF Serving's exact statuses and messages; "
        "the hints go to the server log only (an unknown model's at most once a minute).")
    retry_failed_versions_on_change: bool = fields.option(
        False, "Load a failed version again, at once, whenever its files change (names, "
        "sizes, mtimes), e.g. once a half-copied version is complete. Off: as TF Serving, "
        "a failed version that stays aspired is not loaded again.")
    freeze_loaded_objects: bool = fields.option(
        False, "After each load, freeze the objects Python's collector tracks, so full "
        "collections skip the served graphs (a 150-175 ms pause of every thread, about "
        "every 17 s under load, at 32x32); after each unload, thaw, collect and freeze "
        "again (core/heap.py). For a server that owns its process, not a library.")
    # How a SavedModel version loads: the meta graph's tags (None: serve) and every
    # session's ConfigProto (config/session.py).
    saved_model_tags: typing.Any = None
    session_config: typing.Any = None
    # A tflite_servable.TfLiteOptions for --prefer_tflite_model: a version holding
    # model.tflite is served from it (else from its SavedModel). None: never.
    tflite: typing.Any = None
    # An openvino_servable.OpenVinoOptions: how a version runs on OpenVINO (a model whose
    # config says model_platform "openvino", or every model with prefer_openvino).
    # None: its defaults.
    openvino: typing.Any = None
    prefer_openvino: bool = False  # --prefer_openvino_model


class _Version:
    """What the manager knows of one version of one model."""

    def __init__(self, number):
        self.number = number
        self.state = None  # None until first aspired and tried
        self.error = ""
        self.code = 0  # the failed load's canonical status code (0: none)
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
        self.diagnosis = ""  # why the base path has no version (diagnose_base_path), or ""


class ModelManager:
    """All served models and versions; `poll()` reconciles them with the file system and
    `reload()` replaces the model set."""

    def __init__(self, configs, options=None, on_change=None, on_load=None,
                 batching_for=None, health=None):
        """
        Args:
          configs: [ServedModel] served from the first poll on.
          options: a ManagerOptions (default: its defaults), checked here.
          on_change: callback(name, version, state, error) on every state change.
          on_load: callback(name, version, path, ok, load_seconds, warmup_seconds) after
            every load attempt (warmup_seconds None when no warmup ran).
          batching_for: callback(version dir) -> the version's batching parameters
            (core/batching/parameters.py's parameters_for_version), set on each loaded servable; a
            failure fails the load.
          health: the server's core.health.Health, which the version poller, the model
            loader, the unload workers and broken servables report to (default: one of
            its own).
        """
        self.health = health if health is not None else health_lib.standalone()
        _check_unique(configs)
        options = fields.check(options if options is not None else ManagerOptions())
        if options.tflite is not None:
            fields.check(options.tflite)
        if options.openvino is not None:
            fields.check(options.openvino)
        self.options = options
        self._tags = list(options.saved_model_tags) if options.saved_model_tags else None
        self._batching_for = batching_for
        self._retry_interval = options.load_retry_interval_micros / 1e6
        self.on_change = on_change
        self.on_load = on_load
        self._lock = threading.Lock()  # guards _models, _labels and version records
        self._poll_lock = threading.RLock()  # one reconciliation or reload at a time
        self._models = {c.name: _Model(c) for c in configs}
        self._labels = None  # {name: {label: version}} once the config's labels applied
        self._removed = {}  # name -> _Model no longer served (GetModelStatus history)
        self._pool = (concurrent.futures.ThreadPoolExecutor(
            options.num_load_threads, thread_name_prefix="model-load")
                      if options.num_load_threads > 1 else None)
        self._unload_pool = (concurrent.futures.ThreadPoolExecutor(
            options.num_unload_threads, thread_name_prefix="model-unload")
            if options.num_unload_threads > 0 else None)
        custom_ops.load_tf_text_ops()
        self._stop = threading.Event()
        self._thread = None
        self._next_hint_log = 0.0  # time.monotonic() before which no unknown-model hint

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

    def _reconcile_all(self, models, unload=True):
        if self._pool is not None and len(models) > 1:
            list(self._pool.map(lambda model: self._reconcile_logged(model, unload), models))
        else:
            for model in models:
                self._reconcile_logged(model, unload)

    def _reconcile_logged(self, model, unload=True):
        with self.health.guard("%s: model %s" % (POLLER, model.config.name),
                               model.config.name):
            self._reconcile(model, unload)

    def _reconcile(self, model, unload=True):
        """Brings the model's versions to what its policy wants, one action at a time in
        AvailabilityPreservingPolicy's order (module docstring); with `unload` False
        (reload() defers that until it commits) only loads. A base path that cannot be
        read changes nothing."""
        config = model.config
        self._retire_broken(model)
        try:
            on_disk = aspirable_versions(config.base_path)
        except BasePathError as error:
            self._note_diagnosis(model, diagnose_base_path(config.base_path) or str(error))
            if any(v.state == AVAILABLE for v in model.versions.values()):
                logging.warning("model %s: %s; the versions it serves keep serving",
                                config.name, error)
            return
        self._note_diagnosis(model, "" if on_disk else diagnose_base_path(config.base_path))
        aspired = config.policy.select(on_disk)
        with self._lock:
            for number, version in model.versions.items():
                reaspired = number in aspired and not version.aspired
                version.aspired = number in aspired
                if reaspired:  # wanted again: a fresh start, as TF Serving re-aspires
                    version.failures, version.retry_at = 0, 0.0
            for number in aspired:
                model.versions.setdefault(number, _Version(number)).aspired = True
        tried = set()  # each version is tried once per pass (a retry waits for the next)
        while True:
            with self._lock:
                available = [n for n, v in model.versions.items() if v.state == AVAILABLE]
            number = next_unload(aspired, available) if unload else None
            if number is not None:
                self._unload(model, model.versions[number])
                continue
            due = [n for n in sorted(aspired, reverse=True) if n not in tried and
                   model.versions[n].state not in (LOADING, AVAILABLE, UNLOADING) and
                   self._load_due(model.versions[n], on_disk[n])]
            if not due:
                return
            tried.add(due[0])
            self._load(model, model.versions[due[0]], on_disk[due[0]])

    def _retire_broken(self, model):
        """An AVAILABLE version whose servable can serve nothing any more (a TFLite pool
        with no interpreter left) ends with its failure (INTERNAL), so it is loaded again
        below, as a version whose files changed."""
        with self._lock:
            broken = [v for v in model.versions.values()
                      if v.state == AVAILABLE and v.servable is not None and
                      v.servable.failure]
        for version in broken:
            with self._lock:
                servable, version.servable = version.servable, None
                version.fingerprint = None  # reload at once
            self._set_state(model.config.name, version, END, "%s: %s" % (
                servable.component, servable.failure), grpc.StatusCode.INTERNAL.value[0])
            self._retire_servable(model.config.name, servable)

    def _note_diagnosis(self, model, diagnosis):
        """Keeps why the model's base path has no version, for GetModelStatus and requests
        (which never touch the file system), and logs it each time it changes."""
        if diagnosis == model.diagnosis:
            return
        model.diagnosis = diagnosis
        if diagnosis:
            logging.warning("model %s: %s", model.config.name, diagnosis)
        else:
            logging.info("model %s: %s now holds a version", model.config.name,
                         model.config.base_path)

    def _load_due(self, version, path):
        if version.state is None or not version.error:
            return True  # never tried, or unloaded cleanly and wanted again
        if self.options.retry_failed_versions_on_change and \
                version_fingerprint(path) != version.fingerprint:
            version.failures = 0  # its files changed since it failed: try at once
            return True
        if version.failures > self.options.max_num_load_retries:
            return False  # given up while it stays aspired
        return time.monotonic() >= version.retry_at

    def _load(self, model, version, path):
        """Loads one version; whatever fails (the model's files, or the loader itself)
        ends with the version END and its error, never stuck LOADING."""
        try:
            self._load_version(model, version, path)
        except Exception as error:  # pylint: disable=broad-except  (the loader itself)
            self.health.failed(LOADER, error, model.config.name)
            with self._lock:
                version.failures += 1
                version.retry_at = time.monotonic() + max(self._retry_interval, 0.0)
            self._set_state(model.config.name, version, END, "%s failed: %s" % (
                LOADER, _describe(error)), grpc.StatusCode.INTERNAL.value[0])
        else:
            self.health.ok(LOADER)

    def _load_version(self, model, version, path):
        name = model.config.name
        fingerprint = (version_fingerprint(path)
                       if self.options.retry_failed_versions_on_change else None)
        self._set_state(name, version, LOADING)
        started = time.monotonic()
        servable, load_seconds, warmup_seconds, warmed = None, 0.0, None, 0
        try:
            servable = self._servable(name, version.number, path, model.config)
            if self._batching_for is not None:
                servable.batching_parameters = self._batching_for(path)
            load_seconds = time.monotonic() - started
            if self.options.warmup and tf.io.gfile.exists(os.path.join(path, WARMUP_PATH)):
                warmed = servable.warm_up(self.options.warmup_iterations)
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
            attempts_left = self.options.max_num_load_retries + 1 - version.failures
            self._set_state(name, version, END, _describe(error), load_error_code(error))
            logging.warning("model %s version %d failed to load from %s (%s); %s", name,
                            version.number, path, version.error,
                            "retrying in %.0f s (%d attempts left)"
                            % (max(self._retry_interval, 0.0), attempts_left)
                            if attempts_left > 0 else "not retried while it stays aspired")
            self._notify_load(name, version.number, path, False, load_seconds, warmup_seconds)
            if self.options.freeze_loaded_objects:
                servable = None
                heap.release()  # the failed servable's objects
            return
        with self._lock:
            version.servable = servable
            version.failures, version.fingerprint = 0, None
        if self.options.freeze_loaded_objects:
            heap.settle()
        self._set_state(name, version, AVAILABLE)
        logging.info("loaded %s version %d in %.2f s (+%.2f s for %d warmup requests)", name,
                     version.number, load_seconds, warmup_seconds or 0.0, warmed)
        self._notify_load(name, version.number, path, True, load_seconds, warmup_seconds)

    def _servable(self, name, number, path, config=None):
        """The version on OpenVINO when its model's config or --prefer_openvino_model asks
        (core/openvino_servable.py); else its model.tflite with --prefer_tflite_model when
        it has one (as TF Serving's bundle factory); else its SavedModel."""
        if self.options.prefer_openvino or getattr(config, "platform", "") == \
                openvino_servable.OPENVINO:
            return openvino_servable.OpenVinoServable(
                name, number, path, self.options.session_config, self._tags,
                self.options.openvino)
        if self.options.tflite is not None and tflite_model.has_model(path):
            servable = tflite_servable.TfLiteServable(name, number, path, self.options.tflite,
                                                      self.health)
            self.health.ok(servable.component)  # a reloaded pool works again
            return servable
        return Servable(name, number, path, self.options.session_config, self._tags)

    def _unload(self, model, version):
        with self._lock:
            retired, version.servable = [version.servable], None
            version.state = UNLOADING
        self._publish(model.config.name, version)

        def finish():
            servable = retired.pop()  # held by this frame only, so release() can free it
            try:
                if servable is not None:
                    servable.retire()
            except Exception as error:  # pylint: disable=broad-except
                self.health.failed(UNLOADER, error, model.config.name)
                self._set_state(model.config.name, version, END, "%s failed: %s" % (
                    UNLOADER, _describe(error)), grpc.StatusCode.INTERNAL.value[0])
                return
            del servable
            if self.options.freeze_loaded_objects and not self._stop.is_set():
                heap.release()  # (stop() thaws once, after every unload)
            self.health.ok(UNLOADER)
            self._set_state(model.config.name, version, END)

        self._in_unloader(finish)

    def _retire_servable(self, name, servable):
        """Retires a servable whose version's state is already set."""
        retired = [servable]
        del servable

        def finish():
            with self.health.guard(UNLOADER, name):
                retired.pop().retire()
            if self.options.freeze_loaded_objects:
                heap.release()

        self._in_unloader(finish)

    def _in_unloader(self, work):
        """Runs an unload in the unload pool (--num_unload_threads), else here."""
        if self._unload_pool is not None:
            self._unload_pool.submit(work)
        else:
            work()

    def _set_state(self, name, version, state, error="", code=0):
        with self._lock:
            version.state, version.error, version.code = state, error, code
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
        """Serves exactly `configs` ([ServedModel]) from now on, or changes nothing.

        New models (and models whose base path changed) are loaded first; the reload
        fails unless each has an AVAILABLE version. Kept models then load the versions
        their new policy wants (nothing is unloaded yet), and every version label must
        name an AVAILABLE version (see allow_version_labels_for_unavailable_models). Any
        failure retires what this reload loaded and returns every kept model to its old
        config, so the served set is what it was. Only after that are removed models
        unloaded, and versions kept models no longer want, with the same
        availability-preserving rules as new versions on disk.
        Raises errors.ServingError (INVALID_ARGUMENT, UNKNOWN or FAILED_PRECONDITION).
        """
        try:
            _check_unique(configs)
        except user_errors.UserError as error:
            raise errors.invalid("%s", error) from None
        with self._poll_lock:
            with self._lock:
                old = dict(self._models)
            fresh, kept = {}, {}  # name -> _Model; name -> (_Model, its old config)
            for config in configs:
                model = old.get(config.name)
                if model is not None and model.config.base_path == config.base_path:
                    kept[config.name] = (model, model.config)
                else:
                    fresh[config.name] = _Model(config)
            candidates = dict(fresh)
            candidates.update((name, model) for name, (model, _) in kept.items())
            try:
                self._reconcile_all(list(fresh.values()))
                self._check_loaded(fresh)
                for config in configs:
                    if config.name in kept:
                        kept[config.name][0].config = config
                self._reconcile_all([model for model, _ in kept.values()], unload=False)
                labels = self._label_map(candidates.values())
            except errors.ServingError:
                for model, config in kept.values():
                    model.config = config
                self._reconcile_all([model for model, _ in kept.values()])  # back as it was
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
            self._reconcile_all([model for model, _ in kept.values()])  # now unload
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
                                if e) or model.diagnosis or "no version under %s" % (
                                    model.config.base_path)
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
                    if not ok and self.options.allow_version_labels_for_unavailable_models:
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
                with self.health.guard(POLLER):
                    try:
                        self.poll()
                    except errors.ServingError as error:  # labels waiting for a version
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
        for pool in (self._pool, self._unload_pool):
            if pool is not None:
                pool.shutdown(wait=True)
        if self.options.freeze_loaded_objects:
            heap.thaw()  # the retired versions' objects, in a process that goes on

    # --- the request path ------------------------------------------------------------

    def acquire(self, name, version=None, label=None):
        """The servable a ModelSpec names, with one in-flight reference taken.

        In TF Serving's order (ServerCore::ServableRequestFromModelSpec, then the
        manager): a label is resolved first, so a label of a model this server does not
        serve is INVALID_ARGUMENT `Unrecognized servable version label`; then the request
        is `Specific(name, version)` or `Latest(name)`, NOT_FOUND when nothing serves it."""
        with self._lock:
            if label:
                version = self._resolve_label_locked(name, label)
            model = self._models.get(name)
            if model is None:
                raise self._unknown_model_locked(name, version)
            available = {n: v.servable for n, v in model.versions.items()
                         if v.state == AVAILABLE and v.servable is not None and
                         not v.servable.failure}
            if version is None:
                if not available:
                    if self.options.error_hints:
                        raise errors.unavailable("Servable not found for request: "
                                                 "Latest(%s)%s", name,
                                                 _suffix(model.diagnosis))
                    raise errors.not_found("Servable not found for request: Latest(%s)", name)
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
            return self._resolve_label_locked(name, label)

    def _unknown_model_locked(self, name, version=None):
        """NOT_FOUND for a model this server does not serve, worded as TF Serving's manager
        words it (`Latest(name)` or `Specific(name, version)`). Which models it does serve
        is a hint for the server's log (at most once a minute: clients choose the names),
        and for the client only with `error_hints`."""
        request = ("Latest(%s)" % name if version is None
                   else "Specific(%s, %d)" % (name, version))
        hint = self._served_names_locked()
        now = time.monotonic()
        if now >= self._next_hint_log:
            self._next_hint_log = now + HINT_LOG_INTERVAL_SECONDS
            logging.warning("a request named model %r, which this server does not serve "
                            "(%s)", name[:MAX_NAME_CHARS], hint)
        if self.options.error_hints:
            return errors.not_found("Servable not found for request: %s; %s", request, hint)
        return errors.not_found("Servable not found for request: %s", request)

    def _served_names_locked(self):
        """`this server serves models a, b`: a bounded number of names, each of bounded
        length (names come from the operator's config, but a reply stays small)."""
        names = sorted(self._models)
        if not names:
            return "this server serves no model"
        shown = ", ".join(n if len(n) <= MAX_NAME_CHARS else n[:MAX_NAME_CHARS] + "..."
                          for n in names[:MAX_NAMES_LISTED])
        if len(names) > MAX_NAMES_LISTED:
            shown += " and %d more" % (len(names) - MAX_NAMES_LISTED)
        return "this server serves model%s %s" % ("s" if len(names) > 1 else "", shown)

    def _resolve_label_locked(self, name, label):
        number = (self._labels or {}).get(name, {}).get(label)
        if number is None:
            raise errors.invalid("Unrecognized servable version label: %s", label)
        return number

    def status(self, name, version=None, with_codes=False):
        """[(version, state, error)] newest first, for GetModelStatus: every version seen
        (END ones too, with their load error if they failed), or the one asked for.
        with_codes: (version, state, error, code), code the failed load's status code."""
        with self._lock:
            model = self._models.get(name) or self._removed.get(name)
            states = {} if model is None else {
                n: (v.state, v.error, v.code) for n, v in model.versions.items() if v.state}
            if not self.options.error_hints:
                why = ""  # TF Serving's words only; the log has the diagnosis
            elif model is None:
                why = self._served_names_locked()
            else:
                why = model.diagnosis if name in self._models else ""
        if version is not None:
            if version not in states:
                raise errors.not_found("Could not find version %d of model %s", version, name)
            states = {version: states[version]}
        if not states:
            raise errors.not_found("Could not find any versions of model %s%s", name,
                                   _suffix(why))
        return [(v, s, e, c) if with_codes else (v, s, e)
                for v, (s, e, c) in sorted(states.items(), reverse=True)]

    def diagnosis(self, name):
        """Why the model's base path had no version at the last poll, or ""."""
        with self._lock:
            model = self._models.get(name)
            return model.diagnosis if model is not None else ""

    def platforms(self):
        """{name: platform} of the models served now (a reload may not change one)."""
        with self._lock:
            return {name: getattr(model.config, "platform", "tensorflow")
                    for name, model in self._models.items()}

    def start_up_failures(self):
        """["{name: m version: 3} due to error: ..."] for each served model whose load
        ended in error with no version available and no retry pending: what stops a
        start, as ServerCore::WaitUntilModelsAvailable ("N model(s) did not become
        available"). A model with no version on disk yet is not one (it is polled)."""
        failed = []
        with self._lock:
            for name, model in sorted(self._models.items()):
                versions = model.versions
                if any(v.state == AVAILABLE for v in versions.values()):
                    continue
                ended = [v for _, v in sorted(versions.items())
                         if v.aspired and v.state == END and v.error]
                if ended and all(v.failures > self.options.max_num_load_retries
                                 for v in ended):
                    failed.append("{name: %s version: %d} due to error: %s"
                                  % (name, ended[0].number, ended[0].error))
        return failed

    def next_retry_seconds(self):
        """Seconds until the next due retry of a failed version of a model with no
        available version, or None when no such retry is pending."""
        now, waits = time.monotonic(), []
        with self._lock:
            for model in self._models.values():
                if any(v.state == AVAILABLE for v in model.versions.values()):
                    continue
                waits += [max(v.retry_at - now, 0.0) for v in model.versions.values()
                          if v.aspired and v.state == END and v.error and
                          v.failures <= self.options.max_num_load_retries]
        return min(waits) if waits else None

    def available_versions(self, name):
        with self._lock:
            model = self._models.get(name)
            if model is None:
                return []
            return sorted(n for n, v in model.versions.items() if v.state == AVAILABLE)


def _suffix(diagnosis):
    return ": " + diagnosis if diagnosis else ""


def _check_unique(configs):
    names = [c.name for c in configs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise user_errors.UserError("model %s is configured twice" % ", ".join(twice))
