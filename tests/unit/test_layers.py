"""The suite's layers stay what their folders say (tests/unit, tests/integration,
tests/system; each folder's __init__ says what belongs there): every test file is in one,
and a unit test starts no server, no command and no browser."""
import glob
import os
import re

from tests.helpers import ROOT

LAYERS = ("unit", "integration", "system")
# What only the integration or system layers may use (a socket, a child of ours, a browser).
_NOT_UNIT = re.compile(r"\b(serve_in_process|start_server\w*|shared_server|run_cli|"
                       r"ServerProcess|selenium)\b")


def test_every_test_file_is_in_a_layer():
    loose = sorted(os.path.relpath(p, ROOT)
                   for p in glob.glob(os.path.join(ROOT, "tests", "test_*.py")))
    assert not loose, "move into tests/unit, tests/integration or tests/system: %s" % loose
    for layer in LAYERS:
        assert os.path.isfile(os.path.join(ROOT, "tests", layer, "__init__.py")), layer


def test_unit_tests_start_no_server_command_or_browser():
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "unit", "test_*.py"))):
        if os.path.basename(path) == "test_layers.py":
            continue
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                match = _NOT_UNIT.search(line)
                if match:
                    found.append("%s:%d: %s" % (os.path.relpath(path, ROOT), number,
                                                match.group(0)))
    assert not found, "belongs in tests/integration or tests/system:\n" + "\n".join(found)
