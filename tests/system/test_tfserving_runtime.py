"""Flags and runtime pieces TF Serving gives an effect, here too: --num_unload_threads
(unloads in a pool), --num_request_iterations_for_warmup (each record replayed N times),
TF Text's ops registered before models load (TF Serving links them in), and the harness
that runs TF Serving's own suite against slimserve-server."""
import os
import subprocess
import sys
import threading

import grpc
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_log_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from slimserve import conventions
from slimserve.serving.config import model_config
from slimserve.serving.core import manager as manager_lib
from slimserve.testing import tiny_models
from slimserve.testing.saved_models import signature, write_saved_model
from slimserve.testing.servers import serve_in_process, wait_until
from tests.helpers import ROOT, start_server_process


def _counter_model(base, version=1):
    """`bump` adds 1 to a counter variable per run; `read` returns it. Its warmup file
    holds one `bump` request."""
    def build():
        counter = tf.compat.v1.get_variable("counter", initializer=0.0, use_resource=True)
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        return {"bump": signature({"x": x}, {"y": x * 0.0 + counter.assign_add(1.0)}),
                "serving_default": signature({"x": x}, {"y": x * 0.0 + counter.read_value()})}

    path = write_saved_model(os.path.join(base, str(version)), build)
    log = prediction_log_pb2.PredictionLog()
    log.predict_log.request.model_spec.signature_name = "bump"
    log.predict_log.request.inputs["x"].CopyFrom(tf.make_tensor_proto([1.0]))
    os.makedirs(os.path.dirname(os.path.join(path, conventions.WARMUP_PATH)), exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(path, conventions.WARMUP_PATH)) as writer:
        writer.write(log.SerializeToString())
    return path


def _read_counter(server):
    channel = grpc.insecure_channel("127.0.0.1:%d" % server.port)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "counter"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([0.0]))
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
        request, timeout=60)
    channel.close()
    return list(response.outputs["y"].float_val)


@pytest.mark.parametrize("iterations, expected", [(0, 1.0), (1, 1.0), (3, 3.0)])
def test_each_warmup_record_is_replayed_num_request_iterations_times(tmp_path, iterations,
                                                                     expected):
    base = str(tmp_path / "counter")
    _counter_model(base)
    server = serve_in_process([model_config.ServedModel("counter", base)],
                              num_request_iterations_for_warmup=iterations)
    try:
        assert _read_counter(server) == [expected]
    finally:
        server.stop()


@pytest.mark.parametrize("threads, pooled", [(0, False), (2, True)])
def test_unloads_run_in_a_pool_of_num_unload_threads(tmp_path, threads, pooled):
    """A superseded version is retired (its session closed) on a `model-unload` thread
    when the pool is on, in the polling thread when it is off, as TF Serving's flag."""
    base = str(tmp_path / "tiny")
    tiny_models.write_tiny_model(base, version=1)
    ended = {}

    def on_change(name, version, state, error):
        del name, error
        if state == manager_lib.END:
            ended[version] = threading.current_thread().name

    manager = manager_lib.ModelManager(
        [model_config.ServedModel("tiny", base)],
        manager_lib.ManagerOptions(warmup=False, num_unload_threads=threads),
        on_change=on_change)
    try:
        manager.poll()
        tiny_models.write_tiny_model(base, version=2)
        manager.poll()  # 2 loads, then 1 is unloaded
        wait_until(lambda: 1 in ended, 60, message="version 1 to unload")
        assert ended[1].startswith("model-unload") == pooled, ended
        assert manager.status("tiny") == [(2, "AVAILABLE", ""), (1, "END", "")]
    finally:
        manager.stop()


def test_server_passes_num_unload_threads_to_its_manager(tmp_path):
    base = str(tmp_path / "tiny")
    tiny_models.write_tiny_model(base, version=1)
    server = serve_in_process([model_config.ServedModel("tiny", base)], num_unload_threads=1)
    ended = {}
    original = server.manager.on_change

    def on_change(name, version, state, error):
        original(name, version, state, error)
        if state == manager_lib.END:
            ended[version] = threading.current_thread().name

    server.manager.on_change = on_change
    try:
        tiny_models.write_tiny_model(base, version=2)
        server.manager.poll()
        wait_until(lambda: 1 in ended, 60, message="version 1 to unload")
        assert ended[1].startswith("model-unload"), ended
    finally:
        server.stop()


_TF_TEXT_EXPORT = """
import sys
import tensorflow as tf
import tensorflow_text as text

class Tokens(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="x")])
    def __call__(self, x):
        return {"count": text.WhitespaceTokenizer().tokenize(x).row_lengths()}

module = Tokens()
tf.saved_model.save(module, sys.argv[1], signatures=module.__call__)
"""


@pytest.mark.cost(11)
def test_models_using_tf_text_ops_load_and_serve(tmp_path):
    """TF Serving links TF Text's ops into its binary (its suite's test_tf_text); a model
    exported with tensorflow_text loads here without the client importing anything."""
    path = str(tmp_path / "tokens" / "1")
    subprocess.run([sys.executable, "-c", _TF_TEXT_EXPORT, path], check=True,
                   capture_output=True, timeout=600)
    log = open(tmp_path / "server.log", "w")
    process, port, _ = start_server_process(
        ["--model_name=tokens", "--model_base_path=%s" % os.path.dirname(path),
         "--rest_api_port=0", "--file_system_poll_wait_seconds=0"],
        prefix=["prlimit", "--as=%d" % (6 * 1024 ** 3)], stderr=log)
    try:
        channel = grpc.insecure_channel("127.0.0.1:%d" % port)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "tokens"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto([b"a b c", b"d"]))
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            request, timeout=60)
        assert tf.make_ndarray(response.outputs["count"]).tolist() == [3, 1]
        channel.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise AssertionError("slimserve-server did not exit within 60 s of SIGTERM; its "
                                 "log ends:\n" + (tmp_path / "server.log").read_text()[-4000:])
        finally:
            log.close()


# --- the harness for TF Serving's own suite ------------------------------------------

_FAKE_TEST = '''
import os
import subprocess
import unittest

from tensorflow_serving.apis import predict_pb2  # the installed wheel still resolves
from tensorflow_serving.model_servers.test_util import tensorflow_model_server_test_base


class T(unittest.TestCase):
    def test_wrapper_runs_slimserve_server(self):
        binary = os.path.join(os.environ["TEST_SRCDIR"], "tf_serving", "tensorflow_serving",
                              "model_servers", "tensorflow_model_server")
        out = subprocess.run([binary, "--version"], capture_output=True, text=True)
        self.assertIn("slimserve-server", out.stdout)

    def test_test_data_is_laid_out(self):
        self.assertEqual(tensorflow_model_server_test_base.MARK, "base")
        path = os.path.join(os.environ["TEST_SRCDIR"], "tf_serving", "tensorflow_serving",
                            "servables", "tensorflow", "testdata", "data.txt")
        with open(path) as data:
            self.assertEqual(data.read(), "data")

    def test_fails(self):
        self.fail("counted as failed")


if __name__ == "__main__":
    unittest.main()
'''


@pytest.mark.cost(11)
def test_harness_runs_a_tagged_suite_against_slimserve_server(tmp_path):
    """The harness extracts the suite at a tag from a git repository, puts the wrapper
    where the binary goes, makes test_util importable beside the installed API package,
    and prints the count."""
    repo = tmp_path / "serving"
    files = {
        "tensorflow_serving/model_servers/tensorflow_model_server_test.py": _FAKE_TEST,
        "tensorflow_serving/model_servers/test_util/tensorflow_model_server_test_base.py":
            'MARK = "base"\n',
        "tensorflow_serving/servables/tensorflow/testdata/data.txt": "data",
    }
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "suite"], check=True)
    subprocess.run(git + ["tag", "9.9.9"], check=True)
    run = subprocess.run([sys.executable, os.path.join(ROOT, "scripts",
                                                       "run_tfserving_suite.py"),
                          str(repo), "--tag=9.9.9"], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 1, run.stdout[-3000:]
    assert "9.9.9 suite against" in run.stdout
    assert run.stdout.rstrip().endswith("2 passed, 1 failed, 0 skipped"), run.stdout[-3000:]
    missing = subprocess.run([sys.executable, os.path.join(ROOT, "scripts",
                                                           "run_tfserving_suite.py"),
                              str(repo), "--tag=no-such-tag"], capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode != 0 and "no-such-tag" in missing.stderr
