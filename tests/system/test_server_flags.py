"""tensorflow_model_server's command line and config files run slimserve-server unchanged:
a production-style command line starts it, and its config files parse with TF Serving's
own text-format grammar (unknown fields named, wrapper values read)."""
import contextlib
import ctypes
import os
import platform
import signal
import socket
import subprocess
import sys
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tensorflow_serving.apis import regression_pb2

from slimserve import errors as user_errors
from slimserve import fields
from slimserve.cli import server as server_cli
from slimserve.serving import options as options_lib
from slimserve.serving import server as server_lib
from slimserve.serving import server_process
from slimserve.serving.core import batching
from slimserve.testing import commands
from slimserve.testing import tiny_models
from tests.helpers import ROOT, kill_if_running, start_server_process

TFSERVING = os.path.join(ROOT, "serving", "tfserving")



def _predict(channel, name="tiny"):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.0, 2.0]], np.float32)))
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
        request, timeout=60)
    return tf.make_ndarray(response.outputs["y"]).ravel().tolist()


def test_a_production_tf_serving_command_line_runs_unchanged(tmp_path):
    base = str(tmp_path / "tiny")
    tiny_models.write_tiny_model(base, 1)
    config = tmp_path / "models.config"
    config.write_text('model_config_list { config { name: "tiny" base_path: "%s" '
                      'model_platform: "tensorflow" model_version_policy { latest { '
                      'num_versions: 1 } } } }\n' % base)
    session = tmp_path / "session.config"
    session.write_text("allow_soft_placement: true\ngpu_options { allow_growth: true }\n")
    socket_path = str(tmp_path / "grpc.sock")
    command = [
        "--model_config_file=%s" % config, "--model_config_file_poll_wait_seconds=60",
        "--file_system_poll_wait_seconds=1", "--enable_batching=true",
        "--batching_parameters_file=%s" % os.path.join(TFSERVING, "batching.config"),
        "--monitoring_config_file=%s" % os.path.join(TFSERVING, "monitoring.config"),
        "--rest_api_timeout_in_ms=5000", "--rest_api_num_threads=8",
        "--rest_api_enable_cors_support=true",
        "--tensorflow_intra_op_parallelism=2", "--tensorflow_inter_op_parallelism=2",
        "--tensorflow_session_config_file=%s" % session,
        "--per_process_gpu_memory_fraction=0.5", "--enable_model_warmup=true",
        "--grpc_channel_arguments=grpc.max_concurrent_streams=100,"
        "grpc.max_receive_message_length=33554432",
        "--grpc_max_threads=16", "--enable_grpc_healthcheck_service=true",
        "--grpc_socket_path=%s" % socket_path, "--max_num_load_retries=3",
        "--load_retry_interval_micros=1000000", "--num_load_threads=2",
        "--allow_version_labels_for_unavailable_models=true",
        "--enable_signature_method_name_check=true", "--saved_model_tags=serve",
        "--flush_filesystem_caches=true", "--skip_initialize_tpu=true",
    ]
    process, port, rest_port = start_server_process(
        command, prefix=["prlimit", "--as=6000000000"], cwd=ROOT)
    try:
        expected = tiny_models.expected_y([(1.0, 2.0)])
        with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
            assert _predict(channel) == pytest.approx(expected)
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="tensorflow.serving.PredictionService"),
                timeout=30)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            request = regression_pb2.RegressionRequest()
            request.model_spec.name, request.model_spec.signature_name = "tiny", "regress"
            request.input.example_list.examples.add().CopyFrom(
                tiny_models.tiny_example(1.0, 2.0))
            regressed = prediction_service_pb2_grpc.PredictionServiceStub(channel).Regress(
                request, timeout=30)
            assert [r.value for r in regressed.result.regressions] == pytest.approx(expected)
            # --enable_signature_method_name_check: a predict signature is no regression one
            request.model_spec.signature_name = "serving_default"
            with pytest.raises(grpc.RpcError) as caught:
                prediction_service_pb2_grpc.PredictionServiceStub(channel).Regress(
                    request, timeout=30)
            assert "Expected regression signature method_name" in caught.value.details()
        with grpc.insecure_channel("unix:" + socket_path) as channel:
            assert _predict(channel) == pytest.approx(expected)
        url = "http://127.0.0.1:%d/monitoring/prometheus/metrics" % rest_port
        with urllib.request.urlopen(url, timeout=30) as response:
            assert ':tensorflow:serving:request_count{model_name="tiny",status="OK"}' in \
                response.read().decode()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        errors = process.stderr.read()
        assert "--skip_initialize_tpu=True is accepted for TF Serving compatibility and has " \
            "no effect here" in errors
        # Given at its default value it changes nothing, so it is not reported.
        assert "--flush_filesystem_caches" not in errors
    finally:
        kill_if_running(process)


def test_version_flag_prints_and_exits():
    out = subprocess.run([sys.executable, "-m", "slimserve.cli.server", "--version"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "TensorFlow ModelServer 2.15.1" in out.stdout
    assert "TensorFlow Library: %s" % tf.__version__ in out.stdout


def test_batching_file_reads_tf_serving_grammar(tmp_path):
    path = tmp_path / "batching.config"
    path.write_text("max_batch_size { value: 16 }\n"
                    "batch_timeout_micros: { value: 500 }  # colon before a message is legal\n"
                    "num_batch_threads { value: 3 }\n"
                    "allowed_batch_sizes: 8\nallowed_batch_sizes: 16\n"
                    'thread_pool_name { value: "batch" }\n')
    params = batching.BatchingParameters.from_file(str(path))
    assert (params.max_batch_size, params.batch_timeout_micros, params.num_batch_threads,
            params.max_enqueued_batches) == (16, 500, 3,
                                             batching.BatchingParameters.max_enqueued_batches)


@pytest.mark.parametrize("text, expected", [
    ("max_batch_size { value: 8 }\nmax_batch_sise { value: 8 }\n", '"max_batch_sise"'),
    ("max_batch_size: 8\n", 'Expected "{"'),
    ("max_batch_size { value: -1 }\n", "max_batch_size must be positive; was -1"),
])
def test_bad_batching_file_names_flag_file_and_field(tmp_path, text, expected):
    path = tmp_path / "batching.config"
    path.write_text(text)
    with pytest.raises(user_errors.UserError) as caught:
        batching.BatchingParameters.from_file(str(path))
    assert "--batching_parameters_file" in str(caught.value)
    assert str(path) in str(caught.value) and expected in str(caught.value)


@pytest.mark.parametrize("text, expected", [
    ('prometheus_config { enable: true, path: "/metrics" }', "/metrics"),
    ("prometheus_config { enable: true }", "/monitoring/prometheus/metrics"),
    ("prometheus_config { enable: false }", None),
    ("", None),
])
def test_monitoring_config_as_tf_serving_reads_it(tmp_path, text, expected):
    path = tmp_path / "monitoring.config"
    path.write_text(text)
    assert server_lib.read_monitoring_path(str(path)) == expected


def test_bad_monitoring_config_names_the_field(tmp_path):
    path = tmp_path / "monitoring.config"
    path.write_text("prometheus_config { enable: true pth: \"/x\" }")
    with pytest.raises(user_errors.UserError) as caught:
        server_lib.read_monitoring_path(str(path))
    assert "--monitoring_config_file" in str(caught.value) and '"pth"' in str(caught.value)


# --- the command line as a config class, in process ---------------------------------------

def test_every_numeric_flag_is_bounded_above_and_below():
    """A flag's bound is written once, on its field, and checked before use; every number
    has a floor and a ceiling."""
    numeric = [f for _, f in fields.walk(options_lib.ServerOptions)
               if f.metadata["kind"] in (int, float)]
    assert numeric
    loose = [f.name for f in numeric if f.metadata.get("bound") is None or
             f.metadata["bound"].lower is None or f.metadata["bound"].upper is None]
    assert not loose, loose
    assert fields.flags_of(server_cli.CONFIG) == dict(
        fields.flags_of(options_lib.ServerOptions),
        version=(False, "Print the version and exit."))


@pytest.mark.parametrize("args, message", [
    (["--port=70000"], "flag --port=70000: --port must be -1 or in [0, 65535]"),
    (["--model_base_path=/x", "--rest_api_num_threads=100000"],
     "--rest_api_num_threads must be in [1, 4096]"),
    (["--model_base_path=/x", "--model_config_file=/y"],
     "slimserve-server: give exactly one of --model_base_path or --model_config_file"),
    (["--model_config_file=/nowhere/models.config"],
     "slimserve-server: --model_config_file /nowhere/models.config: No such file"),
    (["--model_base_path=/x", "--grpc_channel_arguments=nokey"],
     "slimserve-server: --grpc_channel_arguments: expected key=value, got 'nokey'"),
])
def test_bad_command_lines_are_one_line_naming_the_flag(args, message):
    result = commands.run_command("slimserve.cli.server", *args)
    assert result.code == 1 and message in result.stderr, result.output
    assert "Traceback" not in result.output


def test_version_runs_in_process():
    result = commands.run_command("slimserve.cli.server", "--version")
    assert result.code == 0 and "TensorFlow ModelServer 2.15.1" in result.stdout


def test_a_port_in_use_is_a_user_error_naming_the_flag(tmp_path):
    base = str(tmp_path / "tiny")
    tiny_models.write_tiny_model(base)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        for flag, changes in (("--port", dict(port=port, rest_api_port=0)),
                              ("--rest_api_port", dict(port=0, rest_api_port=port,
                                                       grpc_socket_path=str(
                                                           tmp_path / "grpc.sock")))):
            with pytest.raises(user_errors.UserError) as caught:
                server_lib.ModelServer(model_base_path=base, **changes)
            assert str(caught.value).startswith("%s %d: cannot bind" % (flag, port))
            assert "already in use" in str(caught.value)


# tgkill(2), to send a signal to one thread of another process (os.kill picks the thread).
_TGKILL = {"x86_64": 234, "aarch64": 131}


def _thread_without_sigterm_blocked(pid):
    """A thread of process `pid` other than its main one that does not block SIGTERM."""
    for name in sorted(os.listdir("/proc/%d/task" % pid)):
        with open("/proc/%d/task/%s/status" % (pid, name)) as status:
            blocked = next(int(line.split()[1], 16) for line in status
                           if line.startswith("SigBlk:"))
        if int(name) != pid and not blocked & (1 << (signal.SIGTERM - 1)):
            return int(name)
    return None


@contextlib.contextmanager
def _tiny_server_child(tmp_path, label, *flags, **kwargs):
    """A slimserve-server child serving the tiny model from `tmp_path`, its stderr piped,
    killed if still running when the block ends; `kwargs` go to ServerProcess (e.g.
    another `command`)."""
    base = str(tmp_path / "tiny")
    tiny_models.write_tiny_model(base)
    process = server_process.ServerProcess(
        ["--model_base_path=%s" % base, "--model_name=tiny", "--rest_api_port=0",
         "--file_system_poll_wait_seconds=0", *flags], label=label,
        memory_cap=3 * 2 ** 30, stderr=subprocess.PIPE, cwd=ROOT, **kwargs).process
    try:
        yield process
    finally:
        kill_if_running(process)


@pytest.mark.skipif(platform.machine() not in _TGKILL or not os.path.isdir("/proc/self/task"),
                    reason="tgkill's syscall number is known for x86_64 and aarch64 Linux")
def test_a_sigterm_delivered_to_another_thread_still_stops_the_server(tmp_path):
    """Linux delivers a process-directed signal to any thread that does not block it, and
    the server has many (gRPC's, TensorFlow's, its own). Python runs the handler in the
    main thread, and only once that thread executes bytecode again: a main thread blocked
    in a wait without a timeout never ran it (a clean-clone CI run saw a server that had
    not logged the signal 60 s after SIGTERM)."""
    with _tiny_server_child(tmp_path, "tgkill") as process:
        thread = _thread_without_sigterm_blocked(process.pid)
        assert thread is not None
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(_TGKILL[platform.machine()], process.pid, thread,
                            signal.SIGTERM) == 0, os.strerror(ctypes.get_errno())
        code = process.wait(timeout=30)
        errors = process.stderr.read()
    assert code == 0, errors[-3000:]
    assert "signal 15: shutting down gracefully" in errors


# A server whose stop() never returns (as a hung library thread would make it), with a
# 2-second deadline instead of 25: the process must still end, saying where each thread was.
_HANGING_STOP = """
import sys, threading
from slimserve.cli import server
from slimserve.serving import lifetime
from slimserve.serving import server as server_lib
lifetime.STOP_DEADLINE_SECONDS = 2.0
server_lib.ModelServer.stop = lambda self, grace=5.0: threading.Event().wait()
sys.argv[0] = "slimserve-server"
server.run()
"""


def test_a_shutdown_that_hangs_ends_at_its_deadline_with_every_threads_stack(tmp_path):
    with _tiny_server_child(tmp_path, "hanging stop", "--shutdown_grace_seconds=0",
                            command=[sys.executable, "-c", _HANGING_STOP]) as process:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
        errors = process.stderr.read()
    assert code == 1, errors[-3000:]
    assert "shutting down gracefully" in errors
    assert "Timeout (0:00:02)!" in errors and "most recent call first" in errors
    assert "in <lambda>" in errors  # the hung stop() is named in the main thread's stack
