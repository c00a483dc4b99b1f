"""What the test modules share besides fixtures: where the repository is, how a command
runs as a user would run it, and which outside tools a test needs. Models, servers, waits
and memory caps are in slimserve/testing/ (shared with the benchmarks)."""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE_SIZE = 32  # small enough for 2 cores, large enough for ResNet's five strides


def run_cli(module, *args, check=True, timeout=900, env=None):
    """Runs one of our command modules in a fresh interpreter, as a user would."""
    process = subprocess.run([sys.executable, "-m", module] + [str(a) for a in args],
                             capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                             env=env)
    if check and process.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s\n%s" % (
            module, process.returncode, process.stdout[-3000:], process.stderr[-6000:]))
    return process


def start_server_process(args, prefix=(), timeout=300, **popen):
    """Runs `slimserve-server ARGS` (behind `prefix`, e.g. prlimit) on free ports unless
    ARGS name them (--port=-1 / --rest_api_port=-1: the server picks and prints them) ->
    (Popen, gRPC port, REST port or 0). Fails the test if it does not start in time."""
    import select  # pylint: disable=import-outside-toplevel
    args = [str(a) for a in args]
    if not any(a.startswith("--port") for a in args):
        args.append("--port=-1")
    if not any(a.startswith("--rest_api_port") for a in args):
        args.append("--rest_api_port=-1")
    popen.setdefault("stderr", subprocess.PIPE)
    process = subprocess.Popen(list(prefix) + [sys.executable, "-m", "slimserve.cli.server"]
                               + args, stdout=subprocess.PIPE, text=True, **popen)
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else ""
    from slimserve.serving import server as server_lib  # pylint: disable=import-outside-toplevel
    try:
        return (process,) + server_lib.parse_ready_line(line)
    except ValueError:
        process.kill()
        _, err = process.communicate(timeout=30)
        raise AssertionError("slimserve-server did not start: %r\n%s"
                             % (line, (err or "")[-4000:])) from None


def require_tool(*names):
    """The path of the first of `names` on PATH. Missing, the test skips on a developer's
    machine but fails under CI=true: .ci/run installs every tool a test needs (iproute2's
    ss, Debian's chromium), so a skip there would hide a broken install step."""
    import shutil  # pylint: disable=import-outside-toplevel
    import pytest  # pylint: disable=import-outside-toplevel
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    message = "needs %s (.ci/run installs it)" % " or ".join(names)
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)
    return None
