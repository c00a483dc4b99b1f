"""A newcomer's first hour: every command's --help lists its own flags, the mistakes a new
user makes get an error naming the fix (before anything is written), the defaults fit
the run, and the export gate refuses a model that has barely learnt.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from slimserve import fields
from slimserve.estimator import model
from slimserve.estimator import train_config
from slimserve.export import blessing
from slimserve.testing import commands
from slimserve.testing import slim_checkpoints
from slimserve.testing.commands import run_command
from tests.helpers import IMAGE_SIZE, ROOT


def console_scripts():
    """(script name, module) of every console script setup.py declares."""
    with open(os.path.join(ROOT, "setup.py")) as handle:
        found = re.findall(r'"(slimserve-[\w-]+)=([\w.]+):run"', handle.read())
    assert len(found) >= 9, found
    return found


def _flags_in(text):
    return set(re.findall(r"^\s+(?:-\w,)?--(?:\[no\])?(\w+):", text, re.MULTILINE))


def _own_flags(module):
    """The flags the command module defines from its config class (what --helpfull lists
    under the module's own heading), read in this process."""
    values = commands.flag_values(module)
    return {flag.name for flag in values.flags_by_module_dict().get(module, [])}


# One interpreter imports every command module once (TensorFlow with them), then each
# --help runs in a fork of it, as pip's wrapper would run it: argv[0] the script's name,
# the module imported (not __main__). Fourteen fresh interpreters cost 14 TensorFlow
# imports; the forks cost one.
_HELP_OF_ALL = """
import importlib, json, os, sys, tempfile
entries = json.loads(sys.argv[1])
modules = {module: importlib.import_module(module) for _, module in entries}
results = {}
for name, module in entries:
    handle, path = tempfile.mkstemp()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.dup2(handle, 1)
        sys.argv = [name, "--help"]
        try:
            code = modules[module].run()
        except SystemExit as stop:
            code = stop.code
        sys.stdout.flush()
        os._exit(code if isinstance(code, int) else 1)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    with open(path) as output:
        results[name] = [status, output.read()]
    os.close(handle)
    os.remove(path)
print(json.dumps(results))
"""


def _help_of_all(entries):
    """{script name: (exit status, --help's stdout)} of every (name, module)."""
    process = subprocess.run([sys.executable, "-c", _HELP_OF_ALL, json.dumps(entries)],
                             capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert process.returncode == 0, process.stderr[-3000:]
    return json.loads(process.stdout.strip().splitlines()[-1])


@pytest.mark.cost(29)
def test_help_of_every_console_script_lists_its_own_flags():
    entries = console_scripts()
    helps = _help_of_all(entries)
    assert sorted(helps) == sorted(name for name, _ in entries)
    for name, module in entries:
        status, stdout = helps[name]  # (absl's --help exits 1)
        short = subprocess.CompletedProcess([name, "--help"], status, stdout, "")
        own = _own_flags(module)
        assert own, name
        listed = _flags_in(short.stdout)
        assert own <= listed, (name, sorted(own - listed), short.stdout[-1500:])
        assert "verbosity" in listed, name
        # Not the whole --helpfull: absl's and TensorFlow's other flags stay there.
        assert "logtostderr" not in listed and "log_dir" not in listed, name
        # The usage text is the command's own docstring, not "USAGE: <wrapper> [flags]".
        assert short.stdout.lstrip().startswith(name), (name, short.stdout[:300])


@pytest.mark.cost(10)
def test_data_dir_of_images_or_of_nothing_says_run_slimserve_convert(digits_dir, tmp_path):
    model_dir = tmp_path / "run"
    images = run_command("slimserve.cli.train", "--data_dir", digits_dir, "--model_dir",
                         model_dir, "--max_steps", 1)
    assert images.code == 1
    assert ("slimserve-train: --data_dir %s holds images (e.g. %s" % (digits_dir, digits_dir)
            in images.stderr), images.stderr[-2000:]
    assert "run slimserve-convert --input=%s --output_dir=" % digits_dir in images.stderr
    assert "--labels_file" not in images.stderr and "Traceback" not in images.stderr

    missing = str(tmp_path / "no_such_dir")
    nothing = run_command("slimserve.cli.train", "--data_dir", missing, "--model_dir",
                          model_dir, "--max_steps", 1)
    assert nothing.code == 1
    assert "--data_dir %s does not exist" % missing in nothing.stderr, nothing.stderr[-2000:]
    assert "run slimserve-convert --input=<your image folder> --output_dir=%s" % missing \
        in nothing.stderr
    assert "--labels_file" not in nothing.stderr and "Traceback" not in nothing.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    blank = run_command("slimserve.cli.train", "--data_dir", empty, "--model_dir", model_dir,
                        "--max_steps", 1)
    assert blank.code == 1
    assert "--data_dir %s holds no data set" % empty in blank.stderr, blank.stderr[-2000:]
    assert "slimserve-convert" in blank.stderr
    assert not os.path.exists(model_dir)  # nothing written for any of the three


@pytest.mark.cost(8)
def test_checkpoint_of_another_net_names_its_model_name_before_writing(digits_data,
                                                                       tmp_path):
    other = slim_checkpoints.make_imagenet_style_checkpoint(str(tmp_path / "v2"),
                                                            model_name="resnet_v2_50")
    model_dir = tmp_path / "run"
    out = run_command("slimserve.cli.train", "--data_dir", digits_data, "--model_dir",
                      model_dir, "--image_size", IMAGE_SIZE, "--max_steps", 1,
                      "--checkpoint_path", other, "--checkpoint_exclude_scopes",
                      "resnet_v1_50/logits")
    assert out.code == 1
    assert ("slimserve-train: --checkpoint_path %s is a resnet_v2_50 checkpoint (its variables "
            "are under resnet_v2_50/) but --model_name=resnet_v1_50: pass "
            "--model_name=resnet_v2_50 (and --checkpoint_exclude_scopes=resnet_v2_50/logits"
            % other) in out.stderr, out.stderr[-2000:]
    assert "ignore_missing_vars" not in out.stderr
    # Found before the graph was built (no model_fn ran) and before the lock or flags.txt.
    assert not os.path.exists(model_dir)
    assert "warm start" not in out.stderr and "Traceback" not in out.stderr


def _derived(*args):
    """TrainConfig.derived_defaults() of slimserve-train's command line `args`."""
    values = commands.flag_values("slimserve.cli.train")
    values(["slimserve-train", "--data_dir=d", "--model_dir=m"] + list(args))
    return fields.from_flags(train_config.TrainConfig, values).derived_defaults()[0]


def test_unset_epsilon_and_batch_norm_decay_follow_the_optimizer_and_run_length():
    assert _derived("--optimizer=adam", "--max_steps=300") == {
        "opt_epsilon": 1e-8, "batch_norm_decay": 0.9667, "decay_steps": 300}
    assert _derived("--optimizer=rmsprop", "--max_steps=5000") == {
        "opt_epsilon": 1.0, "batch_norm_decay": 0.997, "decay_steps": 5000}
    # A flag given on the command line always wins.
    assert _derived("--optimizer=adam", "--opt_epsilon=0.5", "--batch_norm_decay=0.99",
                    "--decay_steps=7") == {}
    # momentum: no epsilon
    assert _derived("--max_steps=50") == {"batch_norm_decay": 0.9, "decay_steps": 50}
    # A library user's ModelConfig gets the optimizer's epsilon when the graph is built.
    assert model.default_opt_epsilon("adam") == 1e-8
    assert model.ModelConfig(optimizer="adam").opt_epsilon is None
    assert model.ModelConfig(optimizer="adam").resolved().opt_epsilon == 1e-8


def test_auto_gate_refuses_a_barely_trained_model_and_states_the_rule():
    barely = {"accuracy": 0.21, "mean_per_class_accuracy": 0.21, "global_step": 300}
    with pytest.raises(blessing.ExportRefused) as refused:
        blessing.check(barely, "auto", num_classes=10)
    assert ("eval mean_per_class_accuracy 0.2100 at step 300 is not above 0.3700 "
            "(--export_min_metric=auto: chance 1/10 = 0.1000") in str(refused.value)
    assert "--export_min_metric=none" in str(refused.value)
    # The flag overrides the rule either way.
    assert "not gated" in blessing.check(barely, "none", num_classes=10)
    assert ">= --export_min_metric 0.2" in blessing.check(barely, "0.2", num_classes=10)

    trained = {"accuracy": 0.8, "mean_per_class_accuracy": 0.8, "global_step": 300}
    line = blessing.check(trained, "auto", num_classes=10, best_seen=(0.85, 200))
    assert line == ("eval mean_per_class_accuracy 0.8000 at step 300 clears "
                    "--export_min_metric=auto: > 0.3700 (chance 1/10 = 0.1000, what always "
                    "answering one class scores, plus 30% of the way to 1) and >= 0.7650 (90% "
                    "of this run's best, 0.8500 at step 200)")
    # Far below the run's best: not published over it.
    with pytest.raises(blessing.ExportRefused, match=r"0\.8000 at step 300 is below 0\.8550 "
                       r"\(--export_min_metric=auto: 90% of this run's best, 0\.9500 at step "
                       r"200\)"):
        blessing.check(trained, "auto", num_classes=10, best_seen=(0.95, 200))
    # Two classes: chance is 0.5, the bar 0.65.
    with pytest.raises(blessing.ExportRefused, match=r"is not above 0\.6500"):
        blessing.check({"mean_per_class_accuracy": 0.6}, "auto", num_classes=2)


def test_unset_checkpoint_cadence_follows_the_run_length():
    """A fixed number of evaluations per run (--evaluations, 5): a longer run is not ten
    times the evaluations of a short one; an explicit cadence, steps or seconds, wins."""
    values = commands.flag_values("slimserve.cli.train")
    values(["slimserve-train", "--data_dir=d", "--model_dir=m", "--max_steps=1000"])
    config = fields.from_flags(train_config.TrainConfig, values)
    assert config.run.checkpoint_steps() == 200
    assert ("--save_checkpoints_steps=200 (--max_steps=1000 / --evaluations=5, rounded up)"
            in config.derived_defaults()[1])
    for args, steps in ((["--max_steps=301"], 61), (["--max_steps=300", "--evaluations=3"], 100),
                        (["--save_checkpoints_steps=50"], 50),
                        (["--save_checkpoints_secs=60"], None)):
        values = commands.flag_values("slimserve.cli.train")
        values(["slimserve-train", "--data_dir=d", "--model_dir=m"] + args)
        assert fields.from_flags(train_config.TrainConfig, values).run.checkpoint_steps() \
            == steps, args


@pytest.mark.parametrize("how", [
    ("--recipe=finetune",),
    ("--flagfile=" + os.path.join(ROOT, "configs", "own_images_finetune.flags"),),
    ("--freeze_scopes=resnet_v1_50/conv1,resnet_v1_50/block1",
     "--checkpoint_exclude_scopes=resnet_v1_50/logits")])
def test_frozen_and_excluded_scopes_without_a_checkpoint_are_refused_from_any_folder(
        how, digits_data, tmp_path, monkeypatch):
    """The fine-tuning flagfile without --checkpoint_path froze conv1 and block1 at their
    random values, silently: scopes that only mean something for restored weights are
    refused now, before anything is written, from any folder (the recipe is installed
    with the package)."""
    monkeypatch.chdir(tmp_path)
    model_dir = tmp_path / "run"
    out = run_command("slimserve.cli.train", "--data_dir", digits_data, "--model_dir",
                      model_dir, "--image_size", IMAGE_SIZE, "--max_steps", 2, *how)
    assert out.code == 1, out.output[-2000:]
    if len(how) == 2:
        assert ("slimserve-train: --freeze_scopes=resnet_v1_50/conv1,resnet_v1_50/block1 and "
                "--checkpoint_exclude_scopes=resnet_v1_50/logits need a checkpoint to "
                "restore, but no --checkpoint_path is given: frozen layers would keep their "
                "random initial values. Pass --checkpoint_path, or leave them out"
                ) in out.stderr, out.stderr[-2000:]
    else:
        assert ("slimserve-train: --checkpoint_exclude_scopes=resnet_v1_50/logits needs a "
                "checkpoint to restore, but no --checkpoint_path is given. Pass "
                "--checkpoint_path, or leave it out") in out.stderr, out.stderr[-2000:]
    assert "--recipe=auto" in out.stderr and "Traceback" not in out.stderr
    assert not os.path.exists(model_dir)


def test_a_mid_run_refusal_is_not_a_warning_and_names_no_recipe():
    """The step-50 "barely learnt ... (configs/own_images_finetune.flags)" warning appeared
    while a recipe was in use: the gate's advice names no recipe, and an evaluation
    before the last is logged as not exported yet, without the advice."""
    barely = {"accuracy": 0.2, "mean_per_class_accuracy": 0.2, "global_step": 60}
    with pytest.raises(blessing.ExportRefused) as refused:
        blessing.check(barely, "auto", num_classes=10)
    assert "configs/" not in str(refused.value) and "recipe" not in str(refused.value)
    assert "train longer (--max_steps)" in str(refused.value)
