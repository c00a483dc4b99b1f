"""Runs TensorFlow Serving's own model-server integration suite, unmodified, against
slimserve-server: the acceptance test of TF Serving compatibility.

    python scripts/run_tfserving_suite.py /path/to/tensorflow/serving [--tag=2.15.1]
    make tfserving-suite TFSERVING=/path/to/tensorflow/serving

The path is a git checkout or bare clone of github.com/tensorflow/serving. At run time,
into a temporary TEST_SRCDIR laid out as Bazel would (`tf_serving/tensorflow_serving/...`),
the script extracts from TAG (git archive; nothing of TF Serving is kept in this
repository):

    tensorflow_serving/model_servers/tensorflow_model_server_test.py
    tensorflow_serving/model_servers/test_util/tensorflow_model_server_test_base.py
    tensorflow_serving/servables/tensorflow/testdata/

puts a two-line wrapper where the suite expects the `tensorflow_model_server` binary (it
execs slimserve-server with the same arguments through serving/server_process.py's
launcher, as every server child runs: under an address-space cap, killed if the suite
dies), makes
`tensorflow_serving.model_servers.test_util` importable beside the installed
tensorflow-serving-api package (its `tensorflow_serving.__path__` gains the extracted
folder; no test file is touched), runs the test file with this Python, and prints the
final count. Extra arguments after `--` go to the test runner (e.g. test names).

Needs `six` (the suite imports it) and `wget` (the profiler test drives REST with it).
Exit status: the test run's.
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

TEST_FILE = "tensorflow_serving/model_servers/tensorflow_model_server_test.py"
TEST_BASE = "tensorflow_serving/model_servers/test_util/tensorflow_model_server_test_base.py"
TEST_DATA = "tensorflow_serving/servables/tensorflow/testdata"
# Where the suite runs the server binary: $TEST_SRCDIR/tf_serving/<this>.
SERVER_BINARY = "tensorflow_serving/model_servers/tensorflow_model_server"
# The suite starts a server per distinct set of arguments (about 15) and keeps each until
# it exits; every one runs under this address-space cap so a regression fails instead of
# exhausting the machine. TensorFlow reserves far more address space than it touches.
DEFAULT_SERVER_ADDRESS_SPACE = 8 * 1024 ** 3
# Python run in the test's interpreter before the test file: tensorflow_serving (the
# installed API package) gains the extracted tree, so its model_servers.test_util
# resolves as a namespace package next to the wheel's apis/ and config/. test_tf_text
# reads `tensorflow.python.platform.flags.os`, which resolved through the older absl-py
# TF Serving's build used (its absl.flags had no __all__, so `from absl.flags import *`
# re-exported the `os` module); with the absl-py TensorFlow 2.15 installs it is set here.
_BOOTSTRAP = """\
import os, runpy, sys
import tensorflow_serving
from tensorflow.python.platform import flags
if not hasattr(flags, "os"):  # absl-py >= 1.1 exports __all__; test_tf_text reads flags.os
    flags.os = os
tensorflow_serving.__path__.append(os.path.join(os.environ["TEST_SRCDIR"], "tf_serving",
                                                "tensorflow_serving"))
path = sys.argv[0] = sys.argv.pop(1)  # the test file, then its own arguments
sys.path.insert(0, os.path.dirname(path))
runpy.run_path(path, run_name="__main__")
"""


def _git(source, *args, **kwargs):
    return subprocess.run(["git", "-C", source] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, check=False, **kwargs)


def extract(source, tag, dest):
    """Writes the suite's files from `source` at `tag` under `dest` (git archive | tar).

    Returns the paths whose blobs the clone lacks (a partial or size-filtered mirror):
    they are left out, and the tests that need them fail for that reason."""
    if not os.path.isdir(source):
        sys.exit("run_tfserving_suite: %s is not a directory (give a checkout or bare clone "
                 "of tensorflow/serving)" % source)
    listing = _git(source, "ls-tree", "-r", "-z", tag, "--", TEST_FILE, TEST_BASE, TEST_DATA)
    if listing.returncode:
        sys.exit("run_tfserving_suite: cannot list %s at %s: %s" % (
            source, tag, listing.stderr.decode(errors="replace").strip()))
    blobs = [entry.split(b"\t", 1) for entry in listing.stdout.split(b"\0") if entry]
    blobs = [(meta.split()[2], path) for meta, path in blobs if meta.split()[1] == b"blob"]
    if not blobs:
        sys.exit("run_tfserving_suite: %s at %s has no %s" % (source, tag, TEST_FILE))
    check = _git(source, "cat-file", "--batch-check",
                 input=b"".join(obj + b"\n" for obj, _ in blobs))
    present, missing = [], []
    for (obj, path), line in zip(blobs, check.stdout.splitlines()):
        (missing if line.endswith(b" missing") else present).append(path.decode())
    archive = _git(source, "archive", "--format=tar", tag, "--", *present)
    if archive.returncode:
        sys.exit("run_tfserving_suite: git archive of %s at %s failed: %s" % (
            source, tag, archive.stderr.decode(errors="replace").strip()))
    subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True)
    return missing


def write_wrapper(path, server, address_space):
    """The stand-in for TF Serving's binary: exec slimserve-server with the arguments,
    through the one server launcher (serving/server_process.py): RLIMIT_AS of
    `address_space` bytes (0: none), killed when the test process that started it dies."""
    from slimserve.serving import server_process  # pylint: disable=import-outside-toplevel
    argv = server_process.launcher_argv([server], address_space, parent_pid="PARENT")
    words = ['"$PPID"' if word == "PARENT" else shlex.quote(word) for word in argv]
    with open(path, "w") as wrapper:
        wrapper.write("#!/bin/sh\nexec %s \"$@\"\n" % " ".join(words))
    os.chmod(path, 0o755)


def summarize(output):
    """unittest's closing lines -> (ran, failed, skipped), or None if it never got there."""
    ran = re.findall(r"^Ran (\d+) tests? in", output, re.MULTILINE)
    if not ran:
        return None
    verdict = re.findall(r"^(OK|FAILED)(?: \((.*)\))?\s*$", output, re.MULTILINE)
    counts = dict(re.findall(r"(\w+)=(\d+)", verdict[-1][1])) if verdict else {}
    failed = int(counts.get("failures", 0)) + int(counts.get("errors", 0))
    return int(ran[-1]), failed, int(counts.get("skipped", 0))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tfserving", help="git checkout or bare clone of tensorflow/serving")
    parser.add_argument("--tag", default="2.15.1", help="the TF Serving tag to test against")
    parser.add_argument("--server", default=os.path.join(os.path.dirname(sys.executable),
                                                         "slimserve-server"),
                        help="the slimserve-server to test (default: this Python's)")
    parser.add_argument("--server_address_space", type=int,
                        default=DEFAULT_SERVER_ADDRESS_SPACE,
                        help="address-space cap of each server in bytes (0: none)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary TEST_SRCDIR (its path is printed)")
    parser.add_argument("test_args", nargs="*",
                        help="after --: passed to the test runner (e.g. test names)")
    args = parser.parse_args(argv)
    if not os.access(args.server, os.X_OK):
        sys.exit("run_tfserving_suite: --server %s is not executable" % args.server)

    srcdir = tempfile.mkdtemp(prefix="tfserving-suite-")
    try:
        root = os.path.join(srcdir, "tf_serving")
        os.makedirs(root)
        missing = extract(os.path.abspath(args.tfserving), args.tag, root)
        for path in missing:
            print("run_tfserving_suite: %s is absent from this clone (its blob was not "
                  "fetched); tests that read it will fail" % path, flush=True)
        write_wrapper(os.path.join(root, SERVER_BINARY), os.path.abspath(args.server),
                      args.server_address_space)
        env = dict(os.environ, TEST_SRCDIR=srcdir,
                   TEST_TMPDIR=os.path.join(srcdir, "tmp"))
        os.makedirs(env["TEST_TMPDIR"])
        command = [sys.executable, "-c", _BOOTSTRAP, os.path.join(root, TEST_FILE)]
        command += args.test_args
        print("TEST_SRCDIR=%s\n$ %s" % (srcdir, " ".join(shlex.quote(c) for c in command)),
              flush=True)
        process = subprocess.Popen(command, env=env, cwd=srcdir, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT)
        lines = []
        for raw in process.stdout:  # streamed as it runs, and kept for the summary
            sys.stdout.buffer.write(raw)
            sys.stdout.buffer.flush()
            lines.append(raw.decode("utf-8", "replace"))
        code = process.wait()
        counts = summarize("".join(lines))
        if counts is None:
            print("\nTF Serving %s suite did not finish (exit status %d)" % (args.tag, code))
            return code or 1
        ran, failed, skipped = counts
        print("\nTF Serving %s suite against %s: %d passed, %d failed, %d skipped" % (
            args.tag, args.server, ran - failed - skipped, failed, skipped))
        if missing:
            print("(%d file(s) of the test data were absent from the clone: %s)" % (
                len(missing), ", ".join(missing)))
        return code
    finally:
        if args.keep:
            print("kept TEST_SRCDIR %s" % srcdir)
        else:
            shutil.rmtree(srcdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
