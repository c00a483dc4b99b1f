"""slimserve-server: the embedded TF-Serving-compatible model server (gRPC 8500, REST 8501).

Takes every one of tensorflow_model_server 2.15.1's flags, with the same meaning, so a
command line written for one runs the other:

    slimserve-server --port=8500 --rest_api_port=8501 --model_name=resnet \\
        --model_base_path=/models/resnet --enable_batching

The flags are the fields of serving/options.py's ServerOptions (same names, defaults, help
and bounds), generated from its config class (CONFIG), so this module only builds the
server and waits for a signal (SIGTERM or SIGINT: drain and stop; SIGUSR1: publish the
open request log files now; SIGUSR2: check the logged traffic's drift now). A shutdown
is bounded: --shutdown_grace_seconds (5) for the requests in flight, 20 s more to the
process's end
(past that, every thread's stack on stderr and exit status 1). Flags about hardware or
runtimes this server does not have are accepted and logged once as having no effect.
Unlike TF Serving it binds 127.0.0.1 unless --bind_address says otherwise. A start-up problem the user can fix (a flag, a
config file, a port in use) is one line naming it, exit status 1.
"""
import dataclasses
import faulthandler
import logging
import os
import signal
import sys
import threading
import time

from slimserve import errors as user_errors
from slimserve import fields
from slimserve.cli import logs
from slimserve.serving import options as options_lib
from slimserve.serving import server as server_lib
from slimserve.serving.core import errors

TF_SERVING_VERSION = "2.15.1"
SIGNAL_POLL_SECONDS = 1.0  # at most this long between a signal and its handler
STOP_DEADLINE_SECONDS = 20.0  # past the grace, until the process's end, whatever blocks


@dataclasses.dataclass
class ServerCommand:
    """slimserve-server's command line: the server's options, plus --version."""
    server: options_lib.ServerOptions = fields.section(options_lib.ServerOptions)
    version: bool = fields.option(False, "Print the version and exit.")


CONFIG = ServerCommand


def version_text():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    try:
        from importlib import metadata  # pylint: disable=import-outside-toplevel
        own = metadata.version("slimserve")
    except Exception:  # pylint: disable=broad-except
        own = "dev"
    return ("slimserve-server %s (TensorFlow ModelServer %s command line and APIs)\n"
            "TensorFlow Library: %s" % (own, TF_SERVING_VERSION, tf.__version__))


def main(config, args):
    del args  # tensorflow_model_server ignores positional arguments too
    if config.version:
        print(version_text(), flush=True)
        return
    server = server_lib.ModelServer(config.server)
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
    except errors.ServingError as error:  # e.g. a version label that names no version
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
    grace = config.server.shutdown_grace_seconds
    faulthandler.dump_traceback_later(grace + STOP_DEADLINE_SECONDS, exit=True)
    if server.stop(grace):
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


def run():
    logs.run(main, config=CONFIG)


if __name__ == "__main__":
    run()
