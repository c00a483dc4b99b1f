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
    for library in ("estimator", "export", "serving", "flywheel"):
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
            "print([n for n in ('estimator', 'export', 'serving', 'flywheel') if u.find_spec(n)])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_no_module_imports_the_libraries_by_their_bare_folder_names():
    bare = re.compile(r"^\s*(from|import)\s+(estimator|export|serving|flywheel)(\.|\s|$)", re.M)
    offenders = []
    for folder in ("slimserve", "estimator", "export", "serving", "flywheel", "scripts",
                   "benchmarks", "tests"):
        for root, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    with open(path) as handle:
                        if bare.search(handle.read()):
                            offenders.append(os.path.relpath(path, ROOT))
    assert not offenders, offenders


def test_another_checkouts_server_runs_that_checkouts_libraries(tmp_path):
    """The baseline rows of the benchmarks run another checkout's server through
    benchmarks/checkout.py: with PYTHONPATH alone, this editable install's mapping of
    slimserve.serving to this checkout's folder answered, and the 'baseline' ran this
    checkout's serving code."""
    other = tmp_path / "other"
    for folder in ("slimserve", "serving", "estimator", "export"):
        (other / folder).mkdir(parents=True)
        (other / folder / "__init__.py").write_text("")
    (other / "serving" / "where.py").write_text(
        "import slimserve, slimserve.export\n"
        "print(__file__, slimserve.__file__, slimserve.export.__file__)\n")
    runner = os.path.join(ROOT, "benchmarks", "checkout.py")
    out = subprocess.run([sys.executable, runner, str(other), "slimserve.serving.where"],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    assert out.split() == [str(other / "serving" / "where.py"),
                           str(other / "slimserve" / "__init__.py"),
                           str(other / "export" / "__init__.py")]
    # what the runner exists for: PYTHONPATH alone reaches this checkout's serving
    plain = subprocess.run(
        [sys.executable, "-c", "import slimserve.serving; print(slimserve.serving.__file__)"],
        check=True, capture_output=True, text=True, timeout=60, cwd=str(other),
        env=dict(os.environ, PYTHONPATH=str(other))).stdout
    assert not plain.strip().startswith(str(other))
    failed = subprocess.run([sys.executable, runner, str(tmp_path), "slimserve.serving"],
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode != 0 and "not a slimserve checkout" in failed.stderr
