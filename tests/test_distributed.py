"""Multi-device and multi-worker training with the same train command.

Two logical CPU devices stand in for two GPUs (MirroredStrategy), and a local
cluster of processes on loopback ports (chief, worker, ps) for a multi-worker job.
"""
import json
import os
import socket
import subprocess
import sys

import pytest
import tensorflow as tf

from slimserve.testing.commands import run_command
from tests.helpers import IMAGE_SIZE, ROOT, run_cli

COMMON = ["--image_size", IMAGE_SIZE, "--batch_size", 16, "--batch_norm_decay", 0.9,
          "--optimizer", "adam", "--learning_rate", 0.001, "--opt_epsilon", 1e-8,
          "--model_name", "resnet_v1_50", "--log_step_count_steps", 5]


@pytest.mark.slow
def test_two_replica_training_evaluates_and_exports_on_one_device(digits_data, tmp_path):
    model_dir = tmp_path / "mirrored"
    # Trained and evaluated over both replicas in one process (a second process for a
    # single-device evaluation cost a third of the test; the export below is the
    # single-device reader of the mirrored checkpoint).
    out = run_cli("slimserve.cli.train", "--data_dir", digits_data, "--model_dir", model_dir,
                  "--cpu_replicas", 2, "--max_steps", 4, "--save_checkpoints_steps", 4,
                  "--eval_steps", 2, "--noexport", *COMMON)
    assert "mirroring over ['/cpu:0', '/cpu:1']" in out.stderr
    assert "eval: accuracy=" in out.stdout
    assert tf.train.load_checkpoint(str(model_dir)).get_tensor("global_step") == 4
    # Device-agnostic checkpoint: a plain single-device export reads it.
    # 4 steps from random weights are near chance: not gated (--export_min_metric).
    # (In this process: one device, as a TF Serving host would read it.)
    exported = run_command("slimserve.cli.export", "--model_dir", model_dir, "--export_base",
                           tmp_path / "models", "--export_min_metric", "none")
    assert exported.code == 0, exported.output[-3000:]
    version_dir = exported.stdout.strip().splitlines()[-1]
    graph_def = tf.compat.v1.saved_model.loader.load(
        tf.compat.v1.Session(graph=tf.Graph()), ["serve"], version_dir).graph_def
    assert not [n.device for n in graph_def.node if n.device]


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


@pytest.mark.slow
def test_parameter_server_cluster_on_loopback_trains_to_completion(digits_data, tmp_path):
    chief, worker, ps = ["127.0.0.1:%d" % p for p in _free_ports(3)]
    cluster = {"chief": [chief], "worker": [worker], "ps": [ps]}
    model_dir = tmp_path / "cluster"
    args = [sys.executable, "-m", "slimserve.cli.train", "--data_dir", digits_data,
            "--model_dir", str(model_dir), "--max_steps", "12", "--save_checkpoints_steps",
            "12", "--mode", "train",
            "--verbosity", "1"] + [str(a) for a in COMMON]  # 1: TF's RunConfig dump is logged
    processes = {}
    logs = {}
    for task_type in ("ps", "worker", "chief"):
        env = dict(os.environ, TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": task_type, "index": 0}}))
        logs[task_type] = open(tmp_path / (task_type + ".log"), "w+")
        # Each task names itself in a harmless flag, so the run files show who wrote them.
        processes[task_type] = subprocess.Popen(
            args + ["--num_summary_images", str(("ps", "worker", "chief").index(task_type))],
            env=env, cwd=ROOT, stdout=logs[task_type], stderr=subprocess.STDOUT)
    try:
        assert processes["chief"].wait(timeout=600) == 0, _read(logs["chief"])
        assert processes["worker"].wait(timeout=300) == 0, _read(logs["worker"])
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    assert tf.train.load_checkpoint(str(model_dir)).get_tensor("global_step") >= 12
    chief_log = _read(logs["chief"])
    # --verbosity=1 brings back TensorFlow's INFO log, the RunConfig dump and all
    assert "Using config" in chief_log, chief_log
    assert "'_num_ps_replicas': 1" in chief_log and "'_num_worker_replicas': 2" in chief_log
    # The run files are the chief's (--num_summary_images=2), never a worker's or the ps's.
    assert "--num_summary_images=2" in (model_dir / "flags.txt").read_text()
    assert json.loads((model_dir / "slimserve.json").read_text())["model"][
        "num_summary_images"] == 2


def test_only_the_chief_writes_run_files(monkeypatch):
    from slimserve.estimator import run_config  # pylint: disable=import-outside-toplevel
    cases = [
        (None, True),
        ({"cluster": {"chief": ["a"], "worker": ["b"]}, "task": {"type": "chief", "index": 0}},
         True),
        ({"cluster": {"chief": ["a"], "worker": ["b"]}, "task": {"type": "worker", "index": 0}},
         False),
        ({"cluster": {"worker": ["a", "b"]}, "task": {"type": "worker", "index": 0}}, True),
        ({"cluster": {"worker": ["a", "b"]}, "task": {"type": "worker", "index": 1}}, False),
        ({"cluster": {"worker": ["a"], "ps": ["p"]}, "task": {"type": "ps", "index": 0}}, False),
        ({"cluster": {"chief": ["a"], "evaluator": ["e"]}, "task": {"type": "evaluator"}},
         False),
    ]
    for tf_config, chief in cases:
        if tf_config is None:
            monkeypatch.delenv("TF_CONFIG", raising=False)
        else:
            monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
        assert run_config.is_chief() is chief, tf_config


def _read(handle):
    handle.flush()
    handle.seek(0)
    return handle.read()[-5000:]
