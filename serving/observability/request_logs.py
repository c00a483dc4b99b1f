"""The request loggers of every served model (TF Serving's logging_config), and where they
may write: one object the server makes once and updates on every reload.

    logs = RequestLogs(log_dir="/logs", options=request_log.RequestLogOptions())
    logs.update(configs, "--model_config_file models.config", from_operator=True)
    logs.get("resnet")          # the model's RequestLogger, or None
    plan = logs.plan(configs, "ReloadConfigRequest", from_operator=False)   # checks only
    ...                         # the manager reloads; only if that worked:
    logs.apply(plan, from_operator=False)
    logs.flush(); logs.close()

Where logs may go: with `log_dir` (--request_log_dir) every filename_prefix lies under it
(request_log.resolve_prefix), whoever sent the config. Without it, the operator's config
(the --model_config_file as read at start or polled, or the in-process config) may name
any prefix, and a ReloadConfigRequest (a network client: from_operator False) only one of
those. A logger whose model is removed or whose prefix or rate changes is closed (its
file published) and its counts kept, so request_log_count never goes down.
"""
import logging
import os
import threading

from slimserve import errors
from slimserve.serving.observability import metrics as metrics_lib
from slimserve.serving.observability import request_log


def resolve_log_dir(log_dir, flag="--request_log_dir"):
    """`log_dir` made absolute (symlinks resolved) and created, or None when empty; a
    UserError naming the flag when it cannot be created."""
    if not log_dir:
        return None
    path = os.path.realpath(log_dir)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise errors.UserError("%s %s: cannot create it: %s"
                               % (flag, log_dir, error.strerror or error)) from None
    return path


class RequestLogs:
    """Every model's RequestLogger (see the module docstring); thread-safe."""

    def __init__(self, log_dir=None, options=None, health=None):
        """log_dir: --request_log_dir (created here; None or "": none). options: the
        request_log.RequestLogOptions every logger gets. health: the core.health.Health
        each logger's writer thread reports to."""
        self.log_dir = resolve_log_dir(log_dir)
        self.options = options
        self.health = health
        self._loggers = {}  # model name -> RequestLogger
        self._retired = {}  # (model, status_code) -> records counted by closed loggers
        self._lock = threading.Lock()  # a logger retires and its counts move at once
        # Locations the operator's own config names: without log_dir, the only ones a
        # ReloadConfigRequest may use.
        self._operator_prefixes = frozenset()

    def plan(self, configs, where, from_operator):
        """{model: (resolved filename_prefix, sampling_rate)} for the configs'
        logging_config, checked and with their directories made, before anything changes.
        Raises a UserError naming `where`, the model and the prefix."""
        plan = {}
        for config in configs:
            logging_config = getattr(config, "logging_config", None)
            if logging_config is None:
                continue
            collector = logging_config.log_collector_config
            if not collector.filename_prefix and not collector.type:
                continue
            try:
                prefix = request_log.resolve_prefix(collector.filename_prefix, self.log_dir)
                rate = logging_config.sampling_config.sampling_rate
                request_log.check_sampling_rate(rate)
                if not from_operator and self.log_dir is None and \
                        prefix not in self._operator_prefixes:
                    raise errors.UserError(
                        "filename_prefix %r is not a request log location this server's own "
                        "config names; a ReloadConfigRequest may choose where logs go only "
                        "under --request_log_dir" % collector.filename_prefix)
                try:
                    request_log.make_directory(prefix)
                except errors.UserError as error:
                    raise errors.UserError("filename_prefix %r: %s"
                                     % (collector.filename_prefix, error)) from None
            except errors.UserError as error:
                raise errors.UserError("%s: model %s: %s" % (where, config.name, error)) \
                    from None
            plan[config.name] = (prefix, rate)
        return plan

    def apply(self, plan, from_operator):
        """One RequestLogger per model of `plan` (from `plan()`); loggers of removed or
        changed models are closed (their files published), their counts kept. A plan
        from the operator's config also sets the locations a reload may name."""
        retiring = []
        with self._lock:
            for name, logger in list(self._loggers.items()):
                if plan.get(name) != (logger.filename_prefix, logger.sampling_rate):
                    retiring.append((name, logger))
        for name, logger in retiring:
            logger.close()  # requests see it closed and stop sampling
            logger.health.forget(logger.component)
            with self._lock:
                del self._loggers[name]
                for code, count in [("OK", logger.written)] + list(logger.drops.items()):
                    key = (name, code)
                    self._retired[key] = self._retired.get(key, 0) + count
        for name, (prefix, rate) in plan.items():
            with self._lock:
                if name in self._loggers:
                    continue
            logger = request_log.RequestLogger(prefix, rate, self.options, model=name,
                                               health=self.health)
            with self._lock:
                self._loggers[name] = logger
        if from_operator:
            self._operator_prefixes = frozenset(prefix for prefix, _ in plan.values())

    def update(self, configs, where, from_operator):
        """plan() then apply(): the loggers `configs` ask for, or a UserError and no
        change."""
        self.apply(self.plan(configs, where, from_operator), from_operator)

    def get(self, model):
        """The model's RequestLogger, or None (no logging_config)."""
        return self._loggers.get(model)

    @property
    def loggers(self):
        """{model: RequestLogger} now (a copy)."""
        with self._lock:
            return dict(self._loggers)

    def families(self):
        """request_log_count for the metrics exposition (closed loggers included)."""
        with self._lock:
            return metrics_lib.request_log_families(self._loggers, self._retired)

    def flush(self, timeout=None):
        """Publishes every model's open file now (SIGUSR1 to slimserve-server), so a
        canary can read the traffic without waiting for rotation. With a timeout, waits
        and says whether all were published in time."""
        results = [logger.flush(timeout) for logger in self.loggers.values()]
        return all(results) if timeout is not None else None

    def close(self):
        """Writes what is queued and publishes every file (as on SIGTERM)."""
        for name, logger in self.loggers.items():
            try:
                logger.close()
            except Exception:  # pylint: disable=broad-except  (close the others too)
                logging.exception("request log of %s: close failed", name)
