"""The one way to run `slimserve-server` as a child process: the tuner, the tests, every
benchmark and the soak start their servers here.

    with ServerProcess(["--model_base_path=/models/resnet"], memory_cap=6 * 2**30) as server:
        channel = grpc.insecure_channel("127.0.0.1:%d" % server.port)

What it guarantees:
- Race-free ports: unless the flags name them, the server is started with `--port=-1
  --rest_api_port=-1`, binds free ports itself and prints them on its ready line, which is
  read here (server.parse_ready_line); nothing binds a port, closes it and hopes.
- Ready when constructed: the ready line has been printed (the first versions loaded), or
  ServerNotStarted is raised with the server's last words.
- Bounded memory: `memory_cap` (bytes) is the child's RLIMIT_AS, set before it execs, so a
  regression that allocates without bound fails that server instead of the machine.
- Never outlives its parent: the child is started through a tiny launcher interpreter that
  sets PR_SET_PDEATHSIG (SIGKILL) before exec'ing the server, so the kernel kills it when
  the thread that started it dies (SIGKILL, OOM killer; Linux). `stop()` in a `finally` or
  the context manager covers normal exits; `signal_all()` / `stop_all()` cover a parent's
  SIGTERM. The launcher is a separate interpreter because preexec_fn is unsafe in a
  process that already runs threads (gRPC's, a load generator's).
- stderr goes to a file (a chatty server never blocks on a full pipe); `last_words()` reads
  its tail, `stderr_text()` all of it.
"""
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request

from slimserve.serving import server as server_lib
from slimserve.serving.observability import metrics

SERVER_MODULE = "slimserve.cli.server"
# argv: parent pid, memory cap in bytes (0: none), then the command to exec.
# PR_SET_PDEATHSIG is 1 in <linux/prctl.h>; it is set before the exec and survives it. The
# getppid check closes the window in which the parent died before the prctl call.
_LAUNCHER = """
import ctypes, os, resource, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit("slimserve-server launcher: the parent exited before the server started")
cap = int(sys.argv[2])
if cap:
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
os.execv(sys.argv[3], sys.argv[3:])
"""

_LIVE = set()
_LIVE_LOCK = threading.RLock()  # re-entrant: a signal handler runs in the main thread
# Set by signal_all: load generators stop sending, so a run with thousands of requests
# left unwinds in moments instead of trying each of them against a stopped server.
STOPPING = threading.Event()


def launcher_argv(command, memory_cap=None, parent_pid=None):
    """The argv that runs `command` (a list: program and arguments) the way every server
    child runs: under an RLIMIT_AS of `memory_cap` bytes (None or 0: none) and killed when
    `parent_pid` (default: this process) dies. For a program that starts servers itself
    (TF Serving's own test suite, scripts/run_tfserving_suite.py) a wrapper script
    execs this with its parent's pid."""
    return [sys.executable, "-c", _LAUNCHER, str(os.getpid() if parent_pid is None
                                                 else parent_pid),
            str(int(memory_cap or 0))] + list(command)


class ServerNotStarted(RuntimeError):
    """The child exited or printed no ready line in time: the message names the line of
    its stderr that says why; `last_words` holds the tail of that stderr."""

    def __init__(self, message, last_words=""):
        super().__init__(message)
        self.last_words = last_words


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


def gist(text):
    """The line of a failed server's stderr that says why: its own exit message or the
    last error line, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("slimserve-server:") or "rror" in line or "FATAL" in line:
            return line
    return lines[-1] if lines else "(no output)"


class ServerProcess:
    """One `slimserve-server` child started with `flags`, serving when constructed.

    flags: the server's command-line flags (strings or str()-able); without --port /
    --rest_api_port it picks free ones (`port`, `rest_port`: 0 when that API is off).
    label: names the server in logs and errors. log_path: where its stderr goes (default: a
    temporary file removed by stop()). memory_cap: RLIMIT_AS in bytes (None: none).
    command: what runs instead of `python -m slimserve.cli.server` (e.g. another
    interpreter). env, cwd: as for subprocess.Popen. stderr: subprocess.PIPE or DEVNULL
    instead of the log file, for a caller that reads the pipe itself (`process.stderr`)."""

    def __init__(self, flags, label="slimserve-server", log_path=None, memory_cap=None,
                 start_timeout=300.0, command=None, env=None, cwd=None, stderr=None):
        self.label = label
        self.flags = [str(f) for f in flags]
        argv = list(command or [sys.executable, "-m", SERVER_MODULE]) + list(self.flags)
        if not any(f == "--port" or f.startswith("--port=") for f in self.flags):
            argv.append("--port=-1")
        if not any(f.startswith("--rest_api_port") for f in self.flags):
            argv.append("--rest_api_port=-1")
        self._own_log = log_path is None and stderr is None
        self._log = None
        if stderr is None:
            if log_path is None:
                handle, log_path = tempfile.mkstemp(prefix="slimserve-server-", suffix=".log")
                os.close(handle)
            self._log = open(log_path, "w")  # a file: a chatty server never blocks on a pipe
        self.log_path = log_path
        self.port = self.rest_port = 0
        self._stderr_kept = ""  # stderr_text() once stop() removed a temporary log
        try:
            self.process = subprocess.Popen(
                launcher_argv(argv, memory_cap), stdout=subprocess.PIPE,
                stderr=self._log if stderr is None else stderr,
                stdin=subprocess.DEVNULL,
                text=True, start_new_session=True, env=env, cwd=cwd)  # ^C reaches the parent only
        except OSError:
            if self._log is not None:
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
            if self._log is None and stderr == subprocess.PIPE:
                self._stderr_kept = self.process.stderr.read()  # it exited: read to the end
            words = self.last_words()
            logging.warning("%s: slimserve-server did not start; its stderr ends:\n%s",
                            label, words)
            raise ServerNotStarted("slimserve-server did not start for %s: %s"
                                   % (label, gist(words)), words) from None
        except BaseException:
            self.stop()
            raise
        logging.info("%s: slimserve-server pid %d serving on gRPC port %d, REST port %d",
                     label, self.process.pid, self.port, self.rest_port)

    @property
    def pid(self):
        return self.process.pid

    @property
    def address(self):
        """host:port of the gRPC API."""
        return "127.0.0.1:%d" % self.port

    def alive(self):
        return self.process.poll() is None

    def stderr_text(self):
        """Everything the server wrote to stderr so far (with `stderr` given: only what a
        failed start left)."""
        if self.log_path is None:
            return self._stderr_kept
        try:
            with open(self.log_path, "rb") as handle:
                return handle.read().decode("utf-8", "replace")
        except OSError:
            return self._stderr_kept

    def last_words(self, limit=2000):
        """The tail of the server's stderr."""
        return self.stderr_text()[-limit:].strip()

    def batch_totals(self):
        """(rows, batches) run so far, from the processed_batch_size metric."""
        url = "http://127.0.0.1:%d%s" % (self.rest_port, metrics.PATH)
        with urllib.request.urlopen(url, timeout=10) as response:
            return metrics.batch_totals(response.read().decode())

    def send_signal(self, signum):
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def wait(self, timeout=None):
        """The exit status once the server exits (TimeoutExpired after `timeout`)."""
        return self.process.wait(timeout=timeout)

    def stop(self, grace_seconds=30.0):
        """SIGTERM (the server drains and exits), SIGKILL after `grace_seconds`; reaps and
        returns the exit status. Safe to call twice."""
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
                if stream is not None and not stream.closed:
                    stream.close()
            if self._own_log and os.path.exists(self.log_path):
                self._stderr_kept = self.stderr_text()
                os.unlink(self.log_path)
        return self.process.returncode

    def kill(self):
        """SIGKILL, reaped: what a crash or the OOM killer does."""
        if self.process.poll() is None:
            self.process.kill()
        return self.stop(grace_seconds=30.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
