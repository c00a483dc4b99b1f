"""How slimserve-train, -export and -convert fail: a place the user gave that cannot be
written (a full disk, a read-only file system) is one line naming the flag and the path,
exit status 1, with nothing published; a bug (a ValueError from inside numpy) keeps its
traceback instead of passing for a user's mistake.

The disks are real: a small tmpfs mounted in a private mount namespace (`unshare -rm`,
as root or with user namespaces; skipped elsewhere, failed under CI=true), where the
commands run in process (slimserve/testing/commands.py)."""
import json
import os
import subprocess
import sys
import traceback

import numpy as np
import pytest

from slimserve import errors
from slimserve.estimator import inputs
from slimserve.testing.commands import run_command
from tests.helpers import ROOT

# Runs inside the namespace: mounts each case's tmpfs, runs its command in process, and
# prints what came back and what is left at the target.
_ON_SMALL_DISKS = r"""
import json, os, subprocess, sys
from slimserve.cli import logs
logs.quiet_tensorflow()
from slimserve.testing.commands import run_command
results = []
for case in json.loads(sys.argv[1]):
    os.makedirs(case["mount"], exist_ok=True)
    options = "size=%d%s" % (case["size"], ",ro" if case["read_only"] else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", case["mount"]], check=True)
    result = run_command(case["command"], *case["args"])
    target = case["target"]
    left = sorted(os.listdir(target)) if os.path.isdir(target) else []
    results.append({"code": result.code, "stdout": result.stdout, "stderr": result.stderr,
                    "left": left})
print("RESULTS " + json.dumps(results))
"""


def _on_small_disks(cases):
    """Runs each case's command onto its own tmpfs (cases: dicts with mount, size,
    read_only, command, args, target) -> [{code, stdout, stderr, left}]."""
    try:
        process = subprocess.run(["unshare", "-rm", sys.executable, "-c", _ON_SMALL_DISKS,
                                  json.dumps(cases)], capture_output=True, text=True,
                                 cwd=ROOT, timeout=900)
        refused = process.returncode != 0 and process.stderr.startswith("unshare: ")
        reason = process.stderr[-500:]
    except FileNotFoundError:
        refused, reason = True, "no unshare"
    if refused:
        message = "needs a private mount namespace (unshare -rm): %s" % reason
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    assert "RESULTS " in process.stdout, process.stderr[-3000:]
    return json.loads(process.stdout.split("RESULTS ", 1)[1])


def _disk(path, size, read_only, command, args, target):
    return {"mount": str(path), "size": size, "read_only": read_only, "command": command,
            "args": [str(a) for a in args], "target": str(target)}


def test_unwritable_or_full_targets_are_one_line_naming_the_path(trained_run, digits_dir,
                                                                  digits_data, tmp_path):
    disks = {name: tmp_path / name for name in
             ("export_full", "export_read_only", "convert_full", "convert_read_only",
              "train_read_only")}
    export = ["--model_dir", trained_run, "--export_min_metric=none", "--export_base"]
    convert = ["--input", digits_dir, "--noprogress", "--output_dir"]
    cases = [
        # A SavedModel of resnet_v1_50 is ~100 MB: its variables do not fit in 8 MiB.
        _disk(disks["export_full"], 8 << 20, False, "slimserve.cli.export",
              export + [disks["export_full"] / "models"], disks["export_full"] / "models"),
        _disk(disks["export_read_only"], 1 << 20, True, "slimserve.cli.export",
              export + [disks["export_read_only"] / "models"], disks["export_read_only"]),
        _disk(disks["convert_full"], 64 << 10, False, "slimserve.cli.convert",
              convert + [disks["convert_full"] / "data"], disks["convert_full"] / "data"),
        _disk(disks["convert_read_only"], 1 << 20, True, "slimserve.cli.convert",
              convert + [disks["convert_read_only"] / "data"], disks["convert_read_only"]),
        _disk(disks["train_read_only"], 1 << 20, True, "slimserve.cli.train",
              ["--data_dir", digits_data, "--model_dir", disks["train_read_only"] / "run"],
              disks["train_read_only"]),
    ]
    export_full, export_read_only, convert_full, convert_read_only, train_read_only = \
        _on_small_disks(cases)
    expected = [
        (export_full, "slimserve-export: --export_base %s: No space left on device"
         % (disks["export_full"] / "models")),
        (export_read_only, "slimserve-export: --export_base %s: Read-only file system"
         % (disks["export_read_only"] / "models")),
        (convert_full, "slimserve-convert: --output_dir %s: " % (disks["convert_full"] / "data")),
        (convert_read_only, "slimserve-convert: --output_dir %s: Read-only file system"
         % (disks["convert_read_only"] / "data")),
        (train_read_only, "slimserve-train: --model_dir %s: Read-only file system"
         % (disks["train_read_only"] / "run")),
    ]
    for result, line in expected:
        assert result["code"] == 1, result
        assert result["stderr"].strip().splitlines()[-1].startswith(line), result["stderr"]
        assert "Traceback" not in result["stderr"]
    assert "No space left on device" in convert_full["stderr"]
    # Nothing published: no version, no temporary version left; no finished data set.
    assert export_full["left"] == [] and export_full["stdout"] == ""
    assert export_read_only["left"] == [] and convert_read_only["left"] == []
    assert "dataset_info.json" not in convert_full["left"]
    assert train_read_only["left"] == []


def test_a_bug_keeps_its_traceback(monkeypatch, tmp_path):
    """A ValueError raised inside numpy is a bug, not a UserError: the command does not
    turn it into one line; in process it escapes with its frames, on a console it prints
    its traceback."""
    def broken(*_):
        np.reshape(np.arange(3), (2, 2))

    monkeypatch.setattr(inputs, "check_data_dir", broken)
    with pytest.raises(ValueError, match="cannot reshape") as raised:
        run_command("slimserve.cli.train", "--data_dir", tmp_path, "--model_dir",
                    tmp_path / "run")
    assert not isinstance(raised.value, errors.UserError)
    files = [frame.filename for frame in traceback.extract_tb(raised.tb)]
    assert any(os.sep + "numpy" + os.sep in name for name in files), files

    code = ("import sys, numpy\nfrom slimserve.estimator import inputs\n"
            "inputs.check_data_dir = lambda *_: numpy.reshape(numpy.arange(3), (2, 2))\n"
            "sys.argv = ['slimserve-train', '--data_dir=%s', '--model_dir=%s']\n"
            "from slimserve.cli import train\ntrain.run()\n" % (tmp_path, tmp_path / "run"))
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             cwd=ROOT, timeout=300)
    assert process.returncode == 1
    assert "Traceback (most recent call last)" in process.stderr
    assert process.stderr.strip().splitlines()[-1].startswith("ValueError: cannot reshape")
    assert "slimserve-train: cannot reshape" not in process.stderr
