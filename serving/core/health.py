"""The health of the server's background components: the one place the health endpoints
(the gRPC health service, GetModelStatus, the status page) learn that one is failing.

Every background thread (the config-file poller, the version poller, each request log's
writer, the load and unload workers, each TFLite interpreter pool) runs its steps inside
`health.guard(component)`: a step that raises is logged naming the component, with its
traceback, once per spell of failures (then counted silently), and the thread carries on
with its next step. After FAILING_AFTER failures in a row, or at once for a failure the
component cannot recover from (`fail`), the component is *failing*: `healthy` turns
False (the gRPC health service answers NOT_SERVING), and a component of a model puts
its failure on that model's GetModelStatus entries and the status page. The next step
that succeeds clears it, with one line saying so.

    health = Health(on_change=lambda healthy: ...)
    with health.guard("version poller"):
        manager.poll()                     # an exception here is logged and swallowed
    health.failing()                       # {component: Failure}
"""
import contextlib
import dataclasses
import logging
import threading
import time

FAILING_AFTER = 3  # failures in a row before a component counts as failing


@dataclasses.dataclass
class Failure:
    """A component's current spell of failures."""
    message: str
    model: str = None  # the model the component belongs to, or None (the server's)
    count: int = 0  # failures in a row
    since: float = 0.0  # time.time() of the first
    permanent: bool = False  # reported by fail(): failing until cleared by ok()

    @property
    def failing(self):
        return self.permanent or self.count >= FAILING_AFTER


class Health:
    """Thread-safe; see the module docstring."""

    def __init__(self, on_change=None):
        """on_change: callback(healthy) whenever `healthy` changes."""
        self._lock = threading.Lock()
        self._failures = {}  # component -> Failure
        self._healthy = True
        self.on_change = on_change

    @contextlib.contextmanager
    def guard(self, component, model=None):
        """Runs one step of `component`: an exception is logged (the first of a spell
        with its traceback) and swallowed; success clears an earlier failure."""
        try:
            yield
        except Exception as error:  # pylint: disable=broad-except  (the thread carries on)
            self.failed(component, error, model)
        else:
            self.ok(component)

    def failed(self, component, error, model=None, log=True):
        """Counts one failure of `component` (an exception, or a message)."""
        message = _describe(error)
        with self._lock:
            failure = self._failures.get(component)
            first = failure is None
            if first:
                failure = self._failures[component] = Failure(message, model,
                                                               since=time.time())
            failure.count += 1
            failure.message = message
            count = failure.count
        if log and first:
            logging.error("%s failed: %s; it carries on (this is logged once until it "
                          "works again)", component, message,
                          exc_info=error if isinstance(error, BaseException) else None)
        elif log and count == FAILING_AFTER:
            logging.error("%s failed %d times in a row (%s): reported as failing to the "
                          "health service, GetModelStatus and the status page", component,
                          count, message)
        self._changed()

    def fail(self, component, message, model=None):
        """`component` cannot recover by itself: failing until ok() clears it."""
        with self._lock:
            failure = self._failures.setdefault(component, Failure(message, model,
                                                                   since=time.time()))
            failure.message, failure.permanent = message, True
            failure.count += 1
        logging.error("%s cannot recover: %s", component, message)
        self._changed()

    def ok(self, component):
        """`component` worked: an earlier failure is cleared (one line says so)."""
        with self._lock:
            failure = self._failures.pop(component, None)
        if failure is not None:
            logging.warning("%s works again after %d failure(s) since %s", component,
                            failure.count, time.strftime("%H:%M:%S",
                                                         time.localtime(failure.since)))
            self._changed()

    def forget(self, component):
        """Drops `component` (it was removed, e.g. the logger of an unloaded model)."""
        with self._lock:
            self._failures.pop(component, None)
        self._changed()

    def failing(self, model=None):
        """{component: Failure} of the failing components (of `model` when given)."""
        with self._lock:
            return {component: dataclasses.replace(failure)
                    for component, failure in self._failures.items()
                    if failure.failing and (model is None or failure.model == model)}

    @property
    def healthy(self):
        return not self.failing()

    def _changed(self):
        healthy = self.healthy
        with self._lock:
            changed, self._healthy = healthy != self._healthy, healthy
        if changed and self.on_change is not None:
            try:
                self.on_change(healthy)
            except Exception:  # pylint: disable=broad-except
                logging.exception("health listener failed")


def _describe(error):
    if isinstance(error, BaseException):
        text = str(error).strip().splitlines()
        return "%s: %s" % (type(error).__name__, text[0]) if text else type(error).__name__
    return str(error)


# A registry for callers that were given none (a library user, a test of one piece): its
# state is read by nobody but the log still says what failed.
def standalone():
    return Health()
