"""Multi-device and multi-worker training with the same train command.

Two logical CPU devices stand in for two GPUs (MirroredStrategy), and a local
cluster of processes on loopback ports (chief, worker, ps) for a multi-worker job.
"""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from slimserve.testing.commands import run_command
from tests.helpers import IMAGE_SIZE, ROOT, run_cli

COMMON = ["--image_size", IMAGE_SIZE, "--batch_size", 16, "--batch_norm_decay", 0.9,
          "--optimizer", "adam", "--learning_rate", 0.001, "--opt_epsilon", 1e-8,
          "--model_name", "resnet_v1_50", "--log_step_count_steps", 5]
FROZEN = "resnet_v1_50/conv1,resnet_v1_50/block1,resnet_v1_50/block2,resnet_v1_50/block3"


@pytest.mark.cost(50)
@pytest.mark.slow
def test_two_replica_training_evaluates_and_exports_on_one_device(digits_data,
                                                                  imagenet_checkpoint, tmp_path):
    model_dir = tmp_path / "mirrored"
    # A fine-tune, trained and evaluated over both replicas in one process (a second
    # process for a single-device evaluation cost a third of the test; the export below is
    # the single-device reader of the mirrored checkpoint). Blocks 1-3 frozen: 38 instead
    # of 60 CPU seconds, the gradients of block4 and the head still all-reduced.
    out = run_cli("slimserve.cli.train", "--data_dir", digits_data, "--model_dir", model_dir,
                  "--cpu_replicas", 2, "--max_steps", 4, "--save_checkpoints_steps", 4,
                  "--eval_steps", 2, "--noexport", "--checkpoint_path", imagenet_checkpoint,
                  "--checkpoint_exclude_scopes", "resnet_v1_50/logits",
                  "--freeze_scopes", FROZEN, *COMMON)
    assert "mirroring over ['/cpu:0', '/cpu:1']" in out.stderr
    assert "warm start from %s: 265 restored" % imagenet_checkpoint in out.stderr, \
        out.stderr[-3000:]
    frozen = "resnet_v1_50/block3/unit_6/bottleneck_v1/conv2/weights"
    assert np.array_equal(tf.train.load_checkpoint(str(model_dir)).get_tensor(frozen),
                          tf.train.load_checkpoint(imagenet_checkpoint).get_tensor(frozen))
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


# Run in a child: the logical CPUs must be made before TensorFlow starts its devices.
_MIRRORED_WARM_START = """
import json, sys
import numpy as np
import tensorflow as tf
from slimserve.estimator import compat, model, nets, run_config, warm_start
checkpoint = sys.argv[1]
strategy = compat.mirrored_strategy(run_config.split_cpu(2))
config = model.ModelConfig(checkpoint_path=checkpoint,
                           checkpoint_exclude_scopes=("resnet_v1_50/logits",))
with tf.Graph().as_default():
    with strategy.scope():
        def replica_fn():  # what model_fn does in each replica: the net, then the warm start
            tf.compat.v1.get_variable("resnet_v1_50/conv1/weights", [7, 7, 3, 64])
            tf.compat.v1.get_variable("resnet_v1_50/logits/biases", [10])
            warm_start.apply_warm_start(config, nets.get_net("resnet_v1_50"))
        strategy.extended.call_for_each_replica(replica_fn)
        mirrored = {v.name.split(":")[0]: v for v in tf.compat.v1.global_variables()}
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        print(json.dumps({name: [session.run(c).ravel()[:8].tolist() for c in v.values]
                          for name, v in mirrored.items()}))
"""


@pytest.mark.slow
def test_a_warm_start_under_mirroring_restores_every_replica_copy(imagenet_checkpoint):
    """model_fn runs once per replica, where a mirrored variable reads as that replica's
    copy: the warm start runs once, across replicas, and every copy holds the checkpoint's
    values (replica 1 looked for resnet_v1_50/conv1/weights/replica_1 in the checkpoint
    and the run failed)."""
    checkpoint = imagenet_checkpoint
    process = subprocess.run([sys.executable, "-c", _MIRRORED_WARM_START, checkpoint],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr[-3000:]
    copies = json.loads(process.stdout.strip().splitlines()[-1])
    restored = tf.train.load_checkpoint(checkpoint).get_tensor(
        "resnet_v1_50/conv1/weights").ravel()[:8]
    assert len(copies["resnet_v1_50/conv1/weights"]) == 2
    for copy in copies["resnet_v1_50/conv1/weights"]:
        np.testing.assert_allclose(copy, restored, rtol=1e-6)
    # the excluded head keeps its initial values, the same in both copies
    head = copies["resnet_v1_50/logits/biases"]
    assert head[0] == head[1]


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


@pytest.mark.cost(20)
@pytest.mark.slow
def test_parameter_server_cluster_on_loopback_trains_to_completion(digits_data,
                                                                  imagenet_checkpoint, tmp_path):
    chief, worker, ps = ["127.0.0.1:%d" % p for p in _free_ports(3)]
    cluster = {"chief": [chief], "worker": [worker], "ps": [ps]}
    model_dir = tmp_path / "cluster"
    args = [sys.executable, "-m", "slimserve.cli.train", "--data_dir", digits_data,
            "--model_dir", str(model_dir), "--max_steps", "12", "--save_checkpoints_steps",
            "12", "--mode", "train", "--checkpoint_path", str(imagenet_checkpoint),
            "--checkpoint_exclude_scopes", "resnet_v1_50/logits", "--freeze_scopes", FROZEN,
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
        assert processes["chief"].wait(timeout=600) == 0, _read(logs["chief"])[-5000:]
        assert processes["worker"].wait(timeout=300) == 0, _read(logs["worker"])[-5000:]
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    trained = tf.train.load_checkpoint(str(model_dir))
    assert trained.get_tensor("global_step") >= 12
    # a fine-tune: the chief's warm start initialised the ps's variables, blocks 1-3 frozen
    frozen = "resnet_v1_50/block3/unit_6/bottleneck_v1/conv2/weights"
    assert np.array_equal(trained.get_tensor(frozen),
                          tf.train.load_checkpoint(imagenet_checkpoint).get_tensor(frozen))
    chief_log = _read(logs["chief"])
    # --verbosity=1 brings back TensorFlow's INFO log, the RunConfig dump and all
    assert "Using config" in chief_log, chief_log[-5000:]
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
    return handle.read()
