"""The distribution adds exactly one top-level import name, `slimserve`, in normal and in
editable installs; no module imports the repository folders by their bare names."""
import os
import re
import subprocess
import sys
import zipfile

from tests.helpers import ROOT


def test_the_wheel_holds_one_top_level_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "--wheel-dir", str(tmp_path), ROOT], check=True, timeout=600,
                   capture_output=True)
    (wheel,) = [name for name in os.listdir(tmp_path) if name.endswith(".whl")]
    names = zipfile.ZipFile(tmp_path / wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(
        (".dist-info", ".data"))}
    assert top == {"slimserve"}, top
    for library in ("estimator", "export", "serving"):
        assert "slimserve/%s/__init__.py" % library in names
    assert "slimserve/serving/core/servable.py" in names
    assert "slimserve/serving/tfserving/batching.config" in names  # package data
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    scripts = zipfile.ZipFile(tmp_path / wheel).read(entry_points).decode()
    assert "slimserve-server = slimserve.cli.server:run" in scripts


def test_installed_package_imports_under_one_name_only(tmp_path):
    """Run outside the repository (so its folders are not on sys.path): the libraries are
    reachable as slimserve.*, never as bare top-level names."""
    code = ("import importlib.util as u, slimserve.serving.core.servable, "
            "slimserve.estimator.schema, slimserve.export.signatures; "
            "print([n for n in ('estimator', 'export', 'serving') if u.find_spec(n)])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_no_module_imports_the_libraries_by_their_bare_folder_names():
    bare = re.compile(r"^\s*(from|import)\s+(estimator|export|serving)(\.|\s|$)", re.M)
    offenders = []
    for folder in ("slimserve", "estimator", "export", "serving", "scripts", "benchmarks",
                   "tests"):
        for root, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    with open(path) as handle:
                        if bare.search(handle.read()):
                            offenders.append(os.path.relpath(path, ROOT))
    assert not offenders, offenders
