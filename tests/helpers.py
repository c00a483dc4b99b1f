"""What the test modules share besides fixtures: where the repository is, how a command
runs as a user would run it, and which outside tools a test needs. Models, servers, waits
and memory caps are in slimserve/testing/ (shared with the benchmarks)."""
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE_SIZE = 32  # small enough for 2 cores, large enough for ResNet's five strides


# How long a command may print nothing before a test calls it hung, and its overall
# ceiling. A test's time bound must hold on the slowest CPU these machines have (an
# AVX2-only EPYC with TensorFlow's oneDNN off trains about 4x slower than an AMX Xeon), so
# commands are judged by their progress, not by a wall-clock budget measured on one CPU:
# training prints a progress line every 20 steps, conversion and bulk inference a bar.
# 30 minutes: 20 Eigen steps of the suite's 32x32 resnet_v1_50 on a starved core of an
# AVX2 EPYC (TF_ENABLE_ONEDNN_OPTS=0, three workers on two cores) took over 10.
IDLE_SECONDS = 1800
CEILING_SECONDS = 3 * 3600


def _pump(stream, chunks, activity):
    for line in iter(stream.readline, ""):
        chunks.append(line)
        activity[0] = time.monotonic()
    stream.close()


def run_cli(module, *args, check=True, timeout=CEILING_SECONDS, env=None,
            idle_timeout=IDLE_SECONDS):
    """Runs one of our command modules in a fresh interpreter, as a user would ->
    CompletedProcess. Fails the test (naming the command and its last words) when the
    command prints nothing for `idle_timeout` seconds or runs past `timeout`."""
    import threading  # pylint: disable=import-outside-toplevel
    command = [sys.executable, "-m", module] + [str(a) for a in args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=ROOT, env=env)
    activity, out, err = [time.monotonic()], [], []
    pumps = [threading.Thread(target=_pump, args=(stream, chunks, activity), daemon=True)
             for stream, chunks in ((process.stdout, out), (process.stderr, err))]
    for pump in pumps:
        pump.start()
    started, hung = time.monotonic(), None
    while process.poll() is None:
        now = time.monotonic()
        if now - activity[0] > idle_timeout:
            hung = "printed nothing for %d s" % idle_timeout
        elif now - started > timeout:
            hung = "ran past its %d s ceiling" % timeout
        if hung:
            process.kill()
            break
        time.sleep(0.2)
    process.wait()
    for pump in pumps:
        pump.join()
    stdout, stderr = "".join(out), "".join(err)
    if hung:
        raise AssertionError("%s %s:\n%s\n%s" % (module, hung, stdout[-3000:], stderr[-6000:]))
    if check and process.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s\n%s" % (
            module, process.returncode, stdout[-3000:], stderr[-6000:]))
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def start_server_process(args, prefix=(), timeout=300, **popen):
    """Runs `slimserve-server ARGS` (behind `prefix`, e.g. prlimit) through the one launcher
    (serving/server_process.py: free ports picked by the server, dies with this
    process) -> (Popen, gRPC port, REST port or 0), for tests that drive the raw process:
    its stderr is a pipe unless `stderr` says otherwise. Fails the test if it does not
    start in time."""
    import shutil  # pylint: disable=import-outside-toplevel
    from slimserve.serving import server_process  # pylint: disable=import-outside-toplevel
    popen.setdefault("stderr", subprocess.PIPE)
    command = [shutil.which(prefix[0]) or prefix[0]] + list(prefix[1:]) if prefix else []
    try:
        server = server_process.ServerProcess(
            args, label="test", start_timeout=timeout,
            command=command + [sys.executable, "-m", server_process.SERVER_MODULE], **popen)
    except server_process.ServerNotStarted as error:
        raise AssertionError("%s\n%s" % (error, error.last_words[-4000:])) from None
    return server.process, server.port, server.rest_port


def kill_if_running(process):
    """Kills and reaps a child still running when a test ends (it failed before the child
    exited), so no test leaves a process behind."""
    if process.poll() is None:
        process.kill()
        process.wait()


def stop_process(process, timeout=30):
    """Terminates a server child started by start_server_process and reaps it, killing it
    if it ignores SIGTERM for `timeout` seconds, so no test leaves a process behind."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def rest_json(port, path, body=None, timeout=30):
    """(status, decoded JSON answer) of a REST call on loopback, error statuses included:
    a POST of `body` (bytes as sent, anything else as JSON), or a GET without one."""
    url = "http://127.0.0.1:%d%s" % (port, path)
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data),
                                    timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def require_tool(*names):
    """The path of the first of `names` on PATH. Missing, the test skips on a developer's
    machine but fails under CI=true: `make test` installs every tool a test needs (iproute2's
    ss, Debian's chromium), so a skip there would hide a broken install step."""
    import shutil  # pylint: disable=import-outside-toplevel
    import pytest  # pylint: disable=import-outside-toplevel
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    message = "needs %s (`make test` installs it: scripts/test_tools.sh)" % " or ".join(names)
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)
    return None
