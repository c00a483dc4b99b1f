"""--model_config_file_poll_wait_seconds: re-reads --model_config_file and applies each
edit, as TF Serving's server.cc polls it.

    poller = ConfigFilePoller(path, 60, apply=server.apply_operator_config, loaded=config)
    poller.start()      # a daemon thread; poller.stop() ends it

Survives anything a bad edit does: the error is logged once per edit (the same broken
file is not logged again at every poll) and the file is read again at the next poll; the
server keeps serving the previous config. Anything else a poll raises (a failure of the
poller itself) is the thread's health's (core/health.py, component COMPONENT): logged
naming the poller, the thread carries on, and after failures in a row the health
endpoints say so until a poll works again.
"""
import logging
import threading

from slimserve import errors as user_errors
from slimserve.serving.config import files
from slimserve.serving.core import errors
from slimserve.serving.core import health as health_lib

COMPONENT = "model config poller"


class ConfigFilePoller:
    """Reads `path` every `interval_seconds` and calls apply(config, where) for each
    ModelServerConfig that differs from the last one applied (`loaded`: the one read at
    start). apply raises a UserError or ServingError when the edit cannot be served (a
    ServingError INTERNAL when the server failed; reload_models has logged its traceback);
    anything else raised is the poller's own failure."""

    def __init__(self, path, interval_seconds, apply, loaded=None, health=None):
        """health: the server's core.health.Health (default: one of its own)."""
        self.health = health if health is not None else health_lib.standalone()
        self.path = path
        self.interval_seconds = interval_seconds
        self._apply = apply
        self._loaded = loaded
        self._where = "--model_config_file %s" % path
        self._failed = None  # (config bytes, message) of the last failed edit, logged once
        self._stopping = threading.Event()
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self._run, name="model-config-poller",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout=10):
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def poll_once(self):
        """One read of the file; applies it when it changed. A bad edit is logged, not
        raised; anything else (the poller failing) is raised."""
        config = None
        try:
            config = files.read_model_server_config(self.path)
            if config == self._loaded:
                return
            logging.info("%s changed: reloading", self._where)
            self._apply(config, self._where)
            self._loaded = config
            self._failed = None
        except (user_errors.UserError, errors.ServingError) as error:
            self._log_failure(config, getattr(error, "full_message", None) or error)

    def _run(self):
        while not self._stopping.wait(self.interval_seconds):
            with self.health.guard(COMPONENT):
                self.poll_once()

    def _log_failure(self, config, error):
        key = (config.SerializeToString() if config is not None else None, str(error))
        if key != self._failed:
            logging.error("Failed to reload --model_config_file: %s (serving the previous "
                          "config; the file is read again every %d s)", error,
                          self.interval_seconds)
            self._failed = key
