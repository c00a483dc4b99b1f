"""One owner per output: a conversion locks its --output_dir as training locks its
model_dir (estimator/run_lock.py), and a server refuses a gRPC port or Unix socket another
server already serves."""
import json
import os
import re
import signal
import socket
import subprocess
import sys

import grpc
import pytest
import tensorflow as tf

from slimserve import errors as user_errors
from slimserve.estimator import dataset
from slimserve.estimator import run_lock
from slimserve.estimator import schema
from slimserve.serving import server as server_lib
from slimserve.serving.clients import client as client_lib
from slimserve.testing import tiny_models
from slimserve.testing.servers import wait_until
from tests.helpers import ROOT, run_cli, start_server_process

CONVERT = "slimserve.cli.convert"


def _labels_csv(digits_dir, path, classes):
    """A CSV of the digits of `classes`, labelled with other names than the folders'."""
    with open(path, "w") as handle:
        for label in classes:
            folder = os.path.join(digits_dir, str(label))
            for name in sorted(os.listdir(folder)):
                handle.write("%s,digit_%d\n" % (os.path.join(folder, name), label))
    return path


def _check_consistent(out):
    """dataset_info.json matches the shards record for record, and every record's label
    id is its class name's line in labels.txt."""
    with open(os.path.join(out, schema.INFO_FILE)) as handle:
        info = json.load(handle)
    names = schema.read_labels(os.path.join(out, schema.LABELS_FILE))
    assert names == info["labels"]
    for split, split_info in info["splits"].items():
        counted = 0
        for path in sorted(tf.io.gfile.glob(schema.shard_pattern(out, split))):
            for record in tf.compat.v1.io.tf_record_iterator(path):
                feature = tf.train.Example.FromString(record).features.feature
                text = feature[schema.TEXT].bytes_list.value[0].decode()
                assert names[feature[schema.LABEL].int64_list.value[0]] == text, path
                counted += 1
        assert counted == split_info["count"], (split, counted, split_info["count"])
    return info


def test_second_conversion_into_a_locked_output_dir_fails_naming_the_holder(digits_dir,
                                                                           tmp_path):
    out = tmp_path / "out"
    with run_lock.RunLock.for_output_dir(str(out)):  # this test process is the converter
        refused = run_cli(CONVERT, "--input", digits_dir, "--output_dir", out,
                          "--noprogress", check=False)
        assert refused.returncode == 1
        assert ("slimserve-convert: %s is held by another conversion, pid %d on host %s "
                "since " % (out / run_lock.CONVERT_LOCK_FILE, os.getpid(),
                            socket.gethostname())) in refused.stderr
        assert "Traceback" not in refused.stderr
        assert sorted(os.listdir(out)) == [run_lock.CONVERT_LOCK_FILE]  # nothing touched
    assert os.listdir(out) == []  # released

    # A lock left by a conversion that died (kill -9) is taken over, with a log line.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (out / run_lock.CONVERT_LOCK_FILE).write_text(json.dumps(
        {"host": socket.gethostname(), "pid": gone.pid, "started": "2026-01-01T00:00:00"}))
    taken = run_cli(CONVERT, "--input", digits_dir, "--output_dir", out, "--noprogress")
    assert "stale: pid %d" % gone.pid in taken.stderr
    _check_consistent(str(out))
    assert not (out / run_lock.CONVERT_LOCK_FILE).exists()


def test_a_conversion_into_a_folder_being_written_never_publishes_a_mixed_set(digits_dir,
                                                                          tmp_path):
    """A second conversion into a folder the first is writing (today: both print success,
    and the published shards, counts and label ids come from different runs) fails naming
    the first, which then publishes its own data set whole. The first run is paused
    (SIGSTOP) inside its writing, so the overlap is certain, not a race."""
    out = tmp_path / "out"
    five = _labels_csv(digits_dir, str(tmp_path / "five.csv"), range(5, 10))
    first = subprocess.Popen(
        [sys.executable, "-m", CONVERT, "--input", digits_dir, "--output_dir", str(out),
         "--noprogress", "--num_workers", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (out / dataset.PARTIAL_DIR).exists(), timeout=120,
                   interval=0.002, message="the first conversion to start writing")
        first.send_signal(signal.SIGSTOP)
        second = run_cli(CONVERT, "--input", five, "--output_dir", out, "--overwrite",
                         "--noprogress", check=False)
    finally:
        first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-3000:]
    assert second.returncode == 1, second.stdout
    assert "is held by another conversion, pid %d on host " % first.pid in second.stderr
    assert "Traceback" not in second.stderr
    info = _check_consistent(str(out))
    assert info["num_classes"] == 10 and info["splits"]["train"]["count"] == 1438
    assert not (out / run_lock.CONVERT_LOCK_FILE).exists()


def _serve(args, timeout=120):
    """slimserve-server ARGS expected to refuse to start: (exit code, stderr)."""
    out = run_cli("slimserve.cli.server", *args, check=False, timeout=timeout)
    return out.returncode, out.stderr


@pytest.mark.cost(10)
def test_a_second_server_refuses_a_served_grpc_port_and_takes_a_socket_over(tmp_path):
    """With SO_REUSEPORT a second server shared the first one's port: it now refuses to
    start, naming the port, and the first keeps serving. A served Unix socket path is
    taken over, as TF Serving (gRPC) does and its own suite relies on: the second server
    says so, new connections on the path reach it, the first keeps its TCP port."""
    base = str(tmp_path / "tiny")
    tiny_models.write_tiny_model(base)
    socket_path = str(tmp_path / "grpc.sock")
    common = ["--model_base_path=%s" % base, "--file_system_poll_wait_seconds=0"]
    cap = ["prlimit", "--as=%d" % (4 * 1024 ** 3)]
    first, port, _ = start_server_process(
        common + ["--model_name=tiny", "--grpc_socket_path=%s" % socket_path], prefix=cap)
    second = None
    try:
        code, stderr = _serve(common + ["--model_name=tiny", "--port=%d" % port,
                                        "--rest_api_port=0"])
        assert code == 1 and ("slimserve-server: --port %d: cannot bind gRPC to "
                              "127.0.0.1:%d: port %d is already in use" % (port, port, port)
                              ) in stderr, stderr[-2000:]
        assert "Traceback" not in stderr
        second, _, second_err = start_server_process(
            common + ["--model_name=other", "--grpc_socket_path=%s" % socket_path],
            prefix=cap, stderr=subprocess.PIPE)
        names = {}
        for target in ("127.0.0.1:%d" % port, "unix:%s" % socket_path):
            for name in ("tiny", "other"):
                client = client_lib.Client(target, name, retries=0, timeout=10)
                try:
                    names.setdefault(target, []).append((name, client.status()[0][1]))
                except grpc.RpcError as error:
                    assert error.code() == grpc.StatusCode.NOT_FOUND
                finally:
                    client.close()
        assert names == {"127.0.0.1:%d" % port: [("tiny", "AVAILABLE")],
                         "unix:%s" % socket_path: [("other", "AVAILABLE")]}
        second.terminate()
        second.wait(timeout=60)
        assert ("--grpc_socket_path %s: another server listens on it; taking it over"
                % socket_path) in second.stderr.read()
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=60)


def test_unusable_socket_paths_get_one_line_errors(tmp_path):
    regular = tmp_path / "notes.txt"
    regular.write_text("keep me")
    base = str(tmp_path / "tiny")
    tiny_models.write_tiny_model(base)
    code, stderr = _serve(["--model_name=tiny", "--model_base_path=%s" % base, "--port=0",
                           "--rest_api_port=0", "--grpc_socket_path=%s" % regular])
    assert code == 1 and stderr.strip().splitlines()[-1] == (
        "slimserve-server: --grpc_socket_path %s exists and is a regular file; refusing to "
        "replace it with a socket" % regular)
    assert "Traceback" not in stderr and regular.read_text() == "keep me"
    too_long = str(tmp_path / ("s" * 120))
    cases = {str(tmp_path / "missing" / "grpc.sock"):
             "folder %s does not exist" % (tmp_path / "missing"),
             too_long: "%s: %d bytes, longer than the 107 a Unix socket path may have" % (
                 too_long, len(too_long)),
             str(tmp_path): "exists and is a directory"}
    for path, message in cases.items():
        with pytest.raises(user_errors.UserError, match="--grpc_socket_path .*" + re.escape(message)):
            server_lib.ModelServer(model_name="tiny", model_base_path=base, port=0,
                                   rest_api_port=0, grpc_socket_path=path)
