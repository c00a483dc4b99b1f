"""The chain under faults: SIGKILLed training, conversion and export."""
import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from slimserve.estimator import schema
from slimserve.serving.core import errors
from slimserve.serving.config import model_config
from slimserve.serving.core import manager as manager_lib
from slimserve.testing.servers import wait_until
from tests.helpers import IMAGE_SIZE, ROOT, run_cli


def _kill_when(args, ready, timeout=300):
    """Starts a CLI, waits until ready() holds, then SIGKILLs it. Returns True if it was
    killed while still running."""
    process = subprocess.Popen([sys.executable, "-m"] + [str(a) for a in args], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and process.poll() is None and not ready():
            time.sleep(0.01)
        running = process.poll() is None
        process.send_signal(signal.SIGKILL)
        process.wait()
        return running
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.cost(62)
@pytest.mark.slow
def test_killed_training_resumes_without_rewarming_and_exports(digits_data,
                                                              imagenet_checkpoint, tmp_path):
    pretrained = imagenet_checkpoint
    model_dir = tmp_path / "run"
    command = ["slimserve.cli.train", "--data_dir", digits_data, "--model_dir", model_dir,
               "--checkpoint_path", pretrained, "--checkpoint_exclude_scopes",
               "resnet_v1_50/logits", "--image_size", IMAGE_SIZE, "--batch_size", 16,
               # blocks 1-3 frozen, as a fine-tune does: 39 instead of 50 CPU seconds a run
               "--freeze_scopes", "resnet_v1_50/conv1,resnet_v1_50/block1,"
               "resnet_v1_50/block2,resnet_v1_50/block3",
               "--max_steps", 20, "--save_checkpoints_steps", 5, "--eval_throttle_secs", 600,
               "--batch_norm_decay", 0.9, "--optimizer", "adam", "--learning_rate", 1e-3,
               "--opt_epsilon", 1e-8, "--log_step_count_steps", 5, "--noverify_export",
               # 20 steps from random weights end near chance (40 steps: mean per-class
               # accuracy 0.18 measured): this test is about resuming, so export is not
               # gated.
               "--export_min_metric", "none"]
    steps = []

    def newest_step():
        latest = tf.train.latest_checkpoint(str(model_dir))
        return int(latest.rsplit("-", 1)[1]) if latest else 0

    def saving_a_new_checkpoint():
        """Mid-save: a newer checkpoint's files exist before the state file names it."""
        newer = [n for n in os.listdir(model_dir) if n.startswith("model.ckpt-")
                 and n.endswith(".index") and int(n[11:-6]) > max(steps, default=0)]
        return bool(newer)

    def new_checkpoint_listed():
        return newest_step() > max(steps, default=0)

    def training_past_a_new_checkpoint():
        """Mid-step: a new checkpoint is listed and the run has logged progress since."""
        if not new_checkpoint_listed():
            return False
        events = [n for n in os.listdir(model_dir) if n.startswith("events.out")]
        return bool(events) and max(os.path.getmtime(os.path.join(model_dir, n))
                                    for n in events) > os.path.getmtime(
                                        os.path.join(model_dir, "checkpoint"))

    # Two kills at two moments of the save/train cycle, each a condition: mid-step after
    # a checkpoint was listed, then mid-save (a kill just after a listing is the former's
    # first instant, and cost a third training start).
    for killed_when in (training_past_a_new_checkpoint, saving_a_new_checkpoint):
        _kill_when(command, lambda: model_dir.exists() and killed_when())
        latest = tf.train.latest_checkpoint(str(model_dir))
        steps.append(int(latest.rsplit("-", 1)[1]))
        # whatever the moment, the listed checkpoint is whole (a kill mid-save may leave
        # the previous one listed: then the same step comes back, which is right)
        assert tf.train.load_checkpoint(latest).get_tensor("global_step") == steps[-1]
    assert steps == sorted(steps) and steps[0] >= 5
    finished = run_cli(*command)
    assert "warm start from %s skipped" % pretrained in finished.stderr
    assert "warm start from %s: " % pretrained not in finished.stderr
    assert tf.train.load_checkpoint(str(model_dir)).get_tensor("global_step") == 20
    final = model_dir / "export" / "final"
    assert len(os.listdir(final)) == 1
    version = os.path.join(final, os.listdir(final)[0])
    assert os.path.exists(os.path.join(version, "saved_model.pb"))


@pytest.mark.cost(13)
@pytest.mark.slow
def test_killed_conversion_never_leaves_a_finished_looking_shard(tmp_path):
    import make_digits  # pylint: disable=import-outside-toplevel
    images = tmp_path / "images"
    make_digits.write_digits(str(images), size=160, png_every=1)  # PNGs: slow to convert
    out = tmp_path / "out"
    command = ["slimserve.cli.convert", "--input", images, "--output_dir", out, "--train_shards",
               4, "--validation_shards", 2, "--noprogress", "--num_workers", 1]

    def writing():
        partial = out / ".partial"
        return partial.exists() and any(n.startswith("train") for n in os.listdir(partial))

    assert _kill_when(command, writing), "conversion finished before it could be killed"
    published = [n for n in os.listdir(out) if not n.startswith(".")]
    assert published == []
    run_cli(*command)
    names = sorted(os.listdir(out))
    assert schema.INFO_FILE in names and ".partial" not in names
    assert len([n for n in names if n.startswith("train-")]) == 4
    total = sum(1 for name in names if "-of-" in name
                for _ in tf.compat.v1.io.tf_record_iterator(str(out / name)))
    assert total == 1797


@pytest.mark.cost(18)
def test_killed_export_is_never_loaded_by_a_polling_server(trained_run, tmp_path):
    base = tmp_path / "models"
    base.mkdir()
    manager = manager_lib.ModelManager([model_config.ServedModel("resnet", str(base))],
                                       manager_lib.ManagerOptions(warmup=True))
    manager.start_polling(0.05)
    try:
        def temp_dir_exists():
            """Mid-write: a claimed `.tmp-<version>` whose owner file is written (killed in
            the microseconds between the two, an export leaves a directory that only its
            age removes, STALE_TEMP_SECONDS later: a run under three workers hit that)."""
            names = os.listdir(base)
            return any(n.startswith(".tmp-") and n + ".owner" in names for n in names)

        assert _kill_when(["slimserve.cli.export", "--model_dir", trained_run, "--export_base", base],
                          temp_dir_exists), "export finished before it could be killed"
        manager.poll()  # a scan after the kill, not a sleep: it must find nothing to load
        assert [n for n in os.listdir(base) if n.isdigit()] == []
        assert manager.available_versions("resnet") == []
        with pytest.raises(errors.ServingError):
            manager.status("resnet")
        out = run_cli("slimserve.cli.export", "--model_dir", trained_run, "--export_base", base,
                      "--noverify")  # the reload-and-compare is tests/test_export.py's
        assert "removed" in out.stdout and ".tmp-" in out.stdout  # the stale dir is cleaned
        version = int(os.path.basename(out.stdout.strip().splitlines()[-1]))
        wait_until(lambda: manager.available_versions("resnet") == [version], timeout=60,
                   message="version %d to load" % version)
    finally:
        manager.stop()
