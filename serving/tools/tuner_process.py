"""The tuner's `slimserve-server` children, which never outlive the tuner.

Each setting runs in a fresh server process. Three ways it could be left behind, and what
stops each:
- the tuner finishes or fails: `ServerProcess.stop()` in a `finally`;
- the tuner gets SIGTERM / SIGINT: the command's handler calls `signal_all()` (SIGTERM to
  every live child: the load generator's requests then fail at once instead of running
  out their deadline) and raises; the `finally` blocks reap, then `stop_all()`;
- the tuner is killed outright (SIGKILL, OOM killer): the child was started through a
  tiny launcher that sets PR_SET_PDEATHSIG before exec'ing the server, so the kernel
  kills it when the tuner dies (Linux; elsewhere only the first two hold).
The launcher is a separate interpreter rather than a `preexec_fn` because preexec_fn is
unsafe in a process that already runs threads (gRPC's, the load generator's).
"""
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import urllib.request

from slimserve.serving import server as server_lib
from slimserve.serving.observability import metrics

# argv: tuner pid, then the command to exec. PR_SET_PDEATHSIG is 1 in <linux/prctl.h>.
# It is set before the exec and survives it; the getppid check closes the window in which
# the tuner died before the prctl call.
_LAUNCHER = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit("slimserve-tune: the tuner exited before its server started")
os.execv(sys.argv[2], sys.argv[2:])
"""

_LIVE = set()
_LIVE_LOCK = threading.RLock()  # re-entrant: a signal handler runs in the main thread
# Set by signal_all: the tuner's clients then fail every call at once, so a load level
# with thousands of requests left unwinds in moments instead of trying each of them.
STOPPING = threading.Event()


def live_pids():
    """Process ids of the server children not yet stopped."""
    with _LIVE_LOCK:
        return sorted(p.process.pid for p in _LIVE)


def signal_all(signum=signal.SIGTERM):
    """Sends `signum` to every live child without waiting: safe in a signal handler."""
    STOPPING.set()
    with _LIVE_LOCK:
        children = list(_LIVE)
    for child in children:
        try:
            child.process.send_signal(signum)
        except OSError:
            pass
    return len(children)


def stop_all(grace_seconds=10.0):
    """Stops and reaps every live child; returns how many there were."""
    with _LIVE_LOCK:
        children = list(_LIVE)
    for child in children:
        child.stop(grace_seconds)
    return len(children)


def _gist(text):
    """The line of a failed server's stderr that says why: its own exit message or the
    last error line, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("slimserve-server:") or "rror" in line or "FATAL" in line:
            return line
    return lines[-1] if lines else "(no output)"


class ServerProcess:
    """One `slimserve-server` child on free ports, started with `flags`; ready when
    constructed (RuntimeError with the server's last words if it does not start)."""

    def __init__(self, flags, label, log_path, start_timeout=300.0):
        self.label = label
        command = [sys.executable, "-m", "slimserve.cli.server", "--port=-1",
                   "--rest_api_port=-1"] + list(flags)
        self.log_path = log_path
        self._log = open(log_path, "w")  # a file, so a chatty server never blocks on a pipe
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _LAUNCHER, str(os.getpid())] + command,
                stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL,
                text=True, start_new_session=True)  # a terminal's ^C reaches the tuner only
        except OSError:
            self._log.close()
            raise
        try:
            with _LIVE_LOCK:
                _LIVE.add(self)
            ready, _, _ = select.select([self.process.stdout], [], [], start_timeout)
            line = self.process.stdout.readline() if ready else ""  # printed once serving
            self.port, self.rest_port = server_lib.parse_ready_line(line)
        except ValueError:
            self.stop()
            words = self.last_words()
            logging.warning("%s: slimserve-server did not start; its stderr ends:\n%s",
                            label, words)
            raise RuntimeError("slimserve-server did not start for %s: %s" % (
                label, _gist(words))) from None
        except BaseException:
            self.stop()
            raise
        logging.info("%s: slimserve-server pid %d serving on gRPC port %d",
                     label, self.process.pid, self.port)

    def last_words(self, limit=2000):
        """The tail of the server's stderr."""
        with open(self.log_path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(self.log_path) - limit))
            return handle.read().decode("utf-8", "replace").strip()

    def batch_totals(self):
        """(rows, batches) run so far, from the processed_batch_size metric."""
        url = "http://127.0.0.1:%d%s" % (self.rest_port, metrics.PATH)
        with urllib.request.urlopen(url, timeout=10) as response:
            return metrics.batch_totals(response.read().decode())

    def stop(self, grace_seconds=30.0):
        """SIGTERM (the server drains and exits), SIGKILL after `grace_seconds`; reaps.
        Safe to call twice."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=grace_seconds)
                except subprocess.TimeoutExpired:
                    logging.warning("%s: server pid %d still running %.0f s after SIGTERM; "
                                    "killing it", self.label, self.process.pid, grace_seconds)
                    self.process.kill()
                    self.process.wait(timeout=grace_seconds)
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)
            for stream in (self.process.stdout, self._log):
                if not stream.closed:
                    stream.close()
