"""Training never exports a model that diverged, on the real digits.

A learning rate of 1e6 with Adam stops with an error; forced to train on, it is refused
by both exporters and by slimserve-export. One trainer per model_dir; flags checked
before anything runs; a broken newest checkpoint is skipped and kept aside; a head of
another class count is named before training.
"""
import logging
import os
import re
import socket
import subprocess
import sys

import pytest
import tensorflow as tf
from absl import flags

from slimserve import errors
from slimserve import fields
from slimserve.estimator import checkpoints
from slimserve.estimator import guards
from slimserve.estimator import model
from slimserve.estimator import nets
from slimserve.estimator import run_lock
from slimserve.estimator import train_config
from slimserve.testing import commands
from slimserve.testing import slim_checkpoints
from slimserve.testing.commands import run_command
from tests.helpers import IMAGE_SIZE, run_cli

# Real training runs (about two minutes together): part of `make test`, not of the quick loop.
pytestmark = pytest.mark.slow

TINY = ["--image_size", IMAGE_SIZE, "--batch_size", 8, "--eval_batch_size", 32,
        "--eval_steps", 2, "--batch_norm_decay", 0.9, "--optimizer", "adam",
        "--log_step_count_steps", 5, "--noverify_export", "--num_summary_images", 0,
        "--save_summary_steps", 0]
DIVERGING = ["--learning_rate", 1e6, "--save_checkpoints_steps", 10, "--keep_checkpoint_max",
             3, "--eval_throttle_secs", 600]
UNGUARDED = ["--nostop_on_nonfinite_loss", "--max_loss_factor", 0]


@pytest.fixture(scope="module")
def diverged_run(digits_data, tmp_path_factory):
    """One model_dir: a guarded run that stops, then the same run forced on to step 10."""
    model_dir = str(tmp_path_factory.mktemp("diverged"))
    args = ["--data_dir", digits_data, "--model_dir", model_dir] + TINY + DIVERGING
    stopped = run_cli("slimserve.cli.train", *args, "--max_steps", 10, check=False)
    forced = run_cli("slimserve.cli.train", *args, *UNGUARDED, "--max_steps", 10, check=False)
    return model_dir, stopped, forced


@pytest.mark.cost(53)
def test_exploding_loss_stops_training_with_an_error(diverged_run):
    model_dir, stopped, _ = diverged_run
    assert stopped.returncode != 0, stopped.stderr[-3000:]
    assert "slimserve-train: training diverged at step" in stopped.stderr
    assert "--max_loss_factor" in stopped.stderr or "not finite" in stopped.stderr
    # Stopped before step 10 and before any evaluation or export.
    assert not os.path.exists(os.path.join(model_dir, "export"))


@pytest.mark.cost(15)
def test_chance_level_model_is_refused_by_both_exporters_and_slimserve_export(diverged_run):
    model_dir, _, forced = diverged_run
    assert forced.returncode == 3, forced.stderr[-3000:]
    assert "eval: accuracy=" in forced.stdout  # it did train and evaluate
    # The console is progress, evaluations and exports; TensorFlow's INFO log (the
    # RunConfig dump, "loss = ", "global_step/sec") waits for --verbosity=1.
    assert re.search(r"step 10/10 \(100%\)  loss \S+  ", forced.stderr), forced.stderr[-3000:]
    assert "eval at step 10: accuracy 0." in forced.stderr
    for noise in ("Using config", "global_step/sec", "Saving checkpoints for", "loss = "):
        assert noise not in forced.stderr, noise
    for name in ("final", "best"):
        refused = (r"export/%s: nothing exported: export refused: eval mean_per_class_accuracy "
                   r"0\.\d{4} at step 10 is not above 0\.3700 \(--export_min_metric=auto" % name)
        assert re.search(refused, forced.stderr), forced.stderr[-3000:]
        folder = os.path.join(model_dir, "export", name)
        assert not os.path.exists(folder) or not os.listdir(folder)
    # (--verbosity=1 brings TensorFlow's INFO log back: test_distributed.py's cluster
    # test reads the RunConfig dump from it.)
    manual = run_command("slimserve.cli.export", "--model_dir", model_dir)
    assert manual.code == 1
    assert "slimserve-export: export refused: eval mean_per_class_accuracy" in manual.stderr
    assert not os.path.exists(os.path.join(model_dir, "export", "manual"))


def _link_tree(source, target):
    """Hard links of every file (no copy); a test replaces files, never writes into them."""
    os.makedirs(target)
    for name in os.listdir(source):
        if os.path.isfile(os.path.join(source, name)):
            os.link(os.path.join(source, name), os.path.join(target, name))


def _replace(path, content):
    os.remove(path)  # break the hard link first
    with open(path, "wb") as handle:
        handle.write(content)


@pytest.mark.cost(29)
def test_truncated_newest_checkpoint_resumes_from_the_newest_intact_one(
        diverged_run, digits_data, tmp_path):
    source, _, _ = diverged_run
    model_dir = str(tmp_path / "run")
    _link_tree(source, model_dir)
    newest = tf.train.latest_checkpoint(model_dir)
    assert newest.endswith("model.ckpt-10")  # and model.ckpt-0, from the start
    data = newest + ".data-00000-of-00001"
    with open(data, "rb") as handle:
        _replace(data, handle.read()[: os.path.getsize(data) // 2])
    resumed = run_cli("slimserve.cli.train", "--data_dir", digits_data, "--model_dir", model_dir,
                      *TINY, *DIVERGING, *UNGUARDED, "--mode", "train", "--max_steps", 2)
    assert "checkpoint %s is unreadable" % newest in resumed.stderr
    assert "resuming from %s, the newest intact checkpoint" % os.path.join(
        model_dir, "model.ckpt-0") in resumed.stderr
    assert tf.train.load_checkpoint(model_dir).get_tensor("global_step") == 2
    kept = os.listdir(os.path.join(model_dir, checkpoints.CORRUPT_DIR))
    assert "model.ckpt-10.data-00000-of-00001" in kept  # kept aside, not deleted

    # Every listed checkpoint broken (a garbage .index): an error naming each file.
    for prefix in checkpoints.listed_checkpoints(model_dir):
        _replace(prefix + ".index", b"not a checkpoint index")
    with pytest.raises(checkpoints.CheckpointError) as error:
        checkpoints.resume_checkpoint(model_dir)
    assert "no intact checkpoint in --model_dir %s" % model_dir in str(error.value)
    assert "model.ckpt-2" in str(error.value) and "new --model_dir" in str(error.value)


@pytest.mark.cost(13)
def test_resuming_a_five_class_checkpoint_on_ten_classes_names_the_head(digits_data, tmp_path):
    model_dir = tmp_path / "five"
    checkpoint = slim_checkpoints.make_imagenet_style_checkpoint(str(model_dir), num_classes=5)
    out = run_command("slimserve.cli.train", "--data_dir", digits_data, "--model_dir",
                      model_dir, *TINY, "--max_steps", 1)
    assert out.code == 1
    assert ("slimserve-train: %s has a 5-class head (resnet_v1_50/logits/weights is "
            "[1, 1, 2048, 5]) but the labels in %s name 10 classes"
            % (checkpoint, os.path.join(digits_data, "labels.txt"))) in out.stderr
    assert "Use a new --model_dir" in out.stderr


def test_second_trainer_on_a_model_dir_is_refused_naming_the_holder(digits_data, tmp_path):
    model_dir = tmp_path / "locked"
    with run_lock.RunLock(str(model_dir)):  # this test process is the running trainer
        out = run_cli("slimserve.cli.train", "--data_dir", digits_data, "--model_dir",
                      model_dir, *TINY, "--max_steps", 1, check=False)
    assert out.returncode != 0
    assert "is held by another trainer, pid %d on host %s since " % (
        os.getpid(), socket.gethostname()) in out.stderr
    assert not os.path.exists(model_dir / "flags.txt")  # the holder's run files untouched
    assert not os.path.exists(model_dir / run_lock.LOCK_FILE)  # released


def _write_lock(model_dir, host, pid):
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, run_lock.LOCK_FILE), "w") as handle:
        handle.write('{"host": "%s", "pid": %d, "started": "2026-01-01T00:00:00+00:00"}'
                     % (host, pid))


def test_stale_lock_is_taken_over_and_another_hosts_lock_needs_force(tmp_path, caplog):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    model_dir = str(tmp_path / "stale")
    _write_lock(model_dir, socket.gethostname(), gone.pid)
    with caplog.at_level(logging.WARNING):
        with run_lock.RunLock(model_dir):
            pass
    assert "stale: pid %d on host %s" % (gone.pid, socket.gethostname()) in caplog.text

    _write_lock(model_dir, "another-host", 4242)
    with pytest.raises(run_lock.LockedError, match="another host, pid 4242 on host "
                       "another-host since 2026-01-01.*--force_unlock"):
        run_lock.RunLock(model_dir).acquire()
    with run_lock.RunLock(model_dir, force=True):
        pass
    assert not os.path.exists(os.path.join(model_dir, run_lock.LOCK_FILE))


def _refusal(*args):
    """Why slimserve-train refuses its command line `args` before it runs (the flag
    parser's validators, then TrainConfig.validate), or None."""
    values = commands.flag_values("slimserve.cli.train")
    try:
        values(["slimserve-train", "--data_dir=d", "--model_dir=m"] + list(args))
        fields.from_flags(train_config.TrainConfig, values).validate()
    except (flags.Error, errors.UserError) as error:
        return str(error)
    return None


def test_out_of_range_flags_are_refused_up_front_naming_the_flag(tmp_path):
    cases = ["--image_size=0", "--decay_steps=0", "--batch_size=0", "--max_steps=0",
             "--min_crop_area=0.9 --max_crop_area=0.5", "--label_smoothing=1.5",
             "--eval_central_fraction=0", "--export_min_metric=most",
             "--min_aspect_ratio=2 --max_aspect_ratio=1", "--max_loss_factor=0.5",
             "--boundaries=10,5 --learning_rate_schedule=piecewise --boundary_values=1,2,3",
             "--boundaries=ten"]
    for case in cases:
        refusal = _refusal(*case.split())
        assert refusal is not None, case
        assert "--" + case.split()[0].split("=")[0].lstrip("-") in refusal, (case, refusal)
    assert _refusal("--image_size=32", "--max_loss_factor=0") is None
    # The command says it in one line and writes nothing.
    out = run_command("slimserve.cli.train", "--data_dir", tmp_path / "data", "--model_dir",
                      tmp_path / "run", "--min_crop_area=0.9", "--max_crop_area=0.5")
    assert (out.code, out.stderr) == (1, "slimserve-train: --min_crop_area must be <= "
                                         "--max_crop_area, got 0.9 > 0.5\n")
    assert not (tmp_path / "run").exists()
    # Library users get the same check from ModelConfig.validate(), naming the flag.
    with pytest.raises(errors.UserError, match="--decay_steps must be > 0"):
        model.ModelConfig(learning_rate_schedule="cosine", decay_steps=0).validate()
    with pytest.raises(errors.UserError, match="--decay_steps must be given"):
        model.ModelConfig(learning_rate_schedule="cosine").validate()
    with pytest.raises(errors.UserError, match="--image_size must be > 0"):
        nets.preprocessing_spec("resnet_v1_50", image_size=0)


def _losses_seen_by_guard(losses, **guard_args):
    """Runs one step per loss value through a real MonitoredSession with the guard hook;
    returns the steps that ran before it stopped (and the error, if any)."""
    graph = tf.Graph()
    with graph.as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        values = tf.constant(losses, tf.float32)
        loss = tf.gather(values, tf.minimum(step, len(losses) - 1))
        tf.compat.v1.add_to_collection(guards.LOSS_COLLECTION, loss)
        with tf.control_dependencies([loss]):
            train_op = tf.compat.v1.assign_add(step, 1)
        done = 0
        with tf.compat.v1.train.MonitoredSession(
                hooks=[guards.LossGuardHook(**guard_args)]) as session:
            try:
                for _ in losses:
                    session.run(train_op)
                    done += 1
            except guards.DivergenceError as error:
                return done, str(error)
    return done, None


def test_loss_guard_stops_on_nan_and_explosion_but_not_on_a_resumed_low_loss():
    done, error = _losses_seen_by_guard([2.3, 2.2, float("nan"), 2.0])
    assert done == 2 and "training diverged at step 3: the loss is nan" in error
    assert _losses_seen_by_guard([2.3, float("inf")], stop_on_nonfinite=False) == (2, None)
    done, error = _losses_seen_by_guard([2.4, 50.0, 241.0, 1.0], loss_floor=2.3)
    assert done == 2 and "loss 241 is more than --max_loss_factor=100" in error
    # Resumed near 0: the reference is ln(10), so a bad batch at 5.0 is no divergence.
    assert _losses_seen_by_guard([0.01, 5.0, 0.02], loss_floor=2.3) == (3, None)
    assert _losses_seen_by_guard([2.4, 1e6], max_loss_factor=0) == (2, None)
