"""Artefacts built once per test run, whichever pytest-xdist worker asks first.

Each worker is its own interpreter, so a session fixture alone would train the same run
once per worker. `build_once` keeps one copy in the folder all workers of a run share
(the parent of each worker's base temp, pytest-xdist's documented recipe) behind an
flock: the first caller builds, the others wait and reuse it. A build that failed is not
tried again by the next worker: it fails with the first one's traceback.

Built artefacts are read-only by convention: a test that changes one copies it first.
"""
import fcntl
import json
import os
import shutil
import traceback

import pytest


def shared_root(tmp_path_factory):
    """The folder every worker of this run sees (the base temp itself without xdist)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    root = base / "shared"
    root.mkdir(exist_ok=True)
    return root


def build_once(tmp_path_factory, name, build):
    """build(folder) -> a JSON-able value (e.g. a path inside folder), run once per test
    run across workers; every caller gets that value. `folder` is new and empty."""
    root = shared_root(tmp_path_factory)
    folder = root / name
    done, failed = root / (name + ".done.json"), root / (name + ".failed")
    with open(root / (name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if done.exists():
            return json.loads(done.read_text())["value"]
        if failed.exists():
            pytest.fail("building the shared %s failed in another worker:\n%s"
                        % (name, failed.read_text()), pytrace=False)
        shutil.rmtree(folder, ignore_errors=True)  # what an interrupted build left
        folder.mkdir()
        try:
            value = build(str(folder))
        except Exception:  # a skip or an interrupt is not a failed build
            failed.write_text(traceback.format_exc())
            raise
        done.write_text(json.dumps({"value": value}))
        return value
