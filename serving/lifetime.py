"""A ModelServer's life as the `slimserve-server` process: started, serving until SIGTERM
or SIGINT, then drained within a bound and exited.

Signals (the handlers only set flags or queue work; the main thread does the rest):
SIGTERM / SIGINT drain and stop; SIGUSR1 publishes the open request log files now;
SIGUSR2 checks the logged traffic's drift now. A shutdown is bounded: `grace_seconds`
(--shutdown_grace_seconds) for the requests in flight, STOP_DEADLINE_SECONDS more to the
process's end; past that every thread's stack goes to stderr and the exit status is 1.
"""
import faulthandler
import logging
import os
import signal
import sys
import threading
import time

from slimserve import errors as user_errors
from slimserve.serving import server as server_lib
from slimserve.serving.core import errors

SIGNAL_POLL_SECONDS = 1.0  # at most this long between a signal and its handler
STOP_DEADLINE_SECONDS = 20.0  # past the grace, until the process's end, whatever blocks


def serve(server, grace_seconds):
    """Starts `server` (a ModelServer), prints its ready line, serves until SIGTERM or
    SIGINT, stops it and ends the process (never returns once started). A start the user
    can fix (e.g. a version label that names no version) is a UserError."""
    stopping = threading.Event()

    def on_signal(signum, frame):
        del frame
        logging.info("signal %d: shutting down gracefully", signum)
        stopping.set()

    def on_flush(signum, frame):
        del signum, frame
        logging.info("SIGUSR1: publishing the open request log files")
        server.flush_request_logs()  # queues a flush behind each logger's records

    def on_drift(signum, frame):
        del signum, frame
        logging.info("SIGUSR2: checking drift of the logged traffic now")
        server.check_drift(wait=False)  # the monitor's thread runs it

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGUSR1, on_flush)
    signal.signal(signal.SIGUSR2, on_drift)
    try:
        server.start()
    except errors.ServingError as error:
        server.stop()
        raise user_errors.UserError(error.message) from None
    print(server_lib.ready_line(server), flush=True)
    # Woken every second, not blocked until set: a process-directed SIGTERM may be
    # delivered to one of gRPC's or TensorFlow's threads, and Python runs its handler in the
    # main thread only once that thread next executes bytecode; a main thread blocked in a
    # lock wait with no timeout is never interrupted by it (a clean-clone CI run saw a
    # server that had not logged the signal 60 s after SIGTERM).
    while not stopping.wait(SIGNAL_POLL_SECONDS):
        pass
    # A shutdown that never ends (a thread that does not return, a library's exit hook) must
    # not keep a pod or a test waiting on it: past this deadline every thread's stack goes
    # to stderr and the process exits with status 1 (faulthandler's watchdog is a C thread:
    # it fires even while the interpreter is finalizing).
    faulthandler.dump_traceback_later(grace_seconds + STOP_DEADLINE_SECONDS, exit=True)
    if server.stop(grace_seconds):
        logging.info("stopped")
    else:
        logging.warning("stopped; some requests were still running after the grace period")
    exit_now()


def exit_now(wait_seconds=5.0):
    """Ends the process once stop() has drained the APIs and closed the logs and sessions:
    a thread still alive (a gRPC worker finishing a cancelled call) gets `wait_seconds` and
    is then named in the log, and the interpreter's own finalization is skipped. Nothing
    is left for it to save, and it can block: it joins every non-daemon thread and runs
    gRPC's and TensorFlow's exit hooks (a clean-clone CI run saw a server that had not
    exited 30 s after SIGTERM). TF Serving's main likewise returns once its server has
    stopped."""
    deadline = time.monotonic() + wait_seconds
    others = [t for t in threading.enumerate()
              if t is not threading.main_thread() and not t.daemon]
    for thread in others:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [t.name for t in others if t.is_alive()]
    if left:
        logging.warning("exiting with %d thread(s) still running: %s", len(left),
                        ", ".join(sorted(left)))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # pylint: disable=protected-access
