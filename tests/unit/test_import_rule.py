"""The direction of imports between the four libraries and the commands (DESIGN.md,
"Direction of imports"), read from every module's source with ast: every import
statement counts, also one inside a function (a lazy import is still an arrow).

- serving/ never imports estimator/, export/ or flywheel/; its core/, api/, config/,
  observability/ and server.py, options.py, limits.py (what a server runs) never import
  serving's clients/, bulk/, tuning/, tools/ or server_process;
- export/ never imports serving's clients/, bulk/, tuning/, tools/ or flywheel/;
- estimator/ never imports export/, serving/ or flywheel/;
- nothing but the commands (slimserve/cli), tests, benchmarks and scripts imports
  flywheel/ (flywheel's own modules aside);
- no library, and no shared slimserve/ module, imports slimserve.cli.

A rule about a folder that does not exist (yet) holds vacuously; a violation is named
file:line with the module imported.
"""
import ast
import dataclasses
import functools
import os

import pytest

from tests.helpers import ROOT

FOLDERS = ("slimserve", "estimator", "export", "serving", "flywheel", "tests", "benchmarks",
           "scripts")
LIBRARIES = ("estimator", "export", "serving", "flywheel")
SERVER_PARTS = ("serving/core", "serving/api", "serving/config", "serving/observability",
                "serving/server.py", "serving/options.py", "serving/limits.py")


@dataclasses.dataclass
class Rule:
    name: str
    importers: tuple          # folders (or files) whose modules the rule reads
    forbidden: tuple          # module prefixes they may not import
    except_in: tuple = ()     # folders (or files) the rule leaves out


def _under(path, places):
    return any(path == place or path.startswith(place.rstrip("/") + "/") for place in places)


def _serving(*parts):
    return tuple("slimserve.serving." + part for part in parts)


RULES = [
    Rule("serving never imports estimator, export or flywheel", ("serving",),
         ("slimserve.estimator", "slimserve.export", "slimserve.flywheel")),
    Rule("the server's own parts never import serving's clients, bulk, tuning, tools or "
         "server_process", SERVER_PARTS,
         _serving("clients", "bulk", "tuning", "tools", "server_process")),
    Rule("export never imports serving's clients, bulk, tuning, tools or flywheel",
         ("export",), _serving("clients", "bulk", "tuning", "tools") + ("slimserve.flywheel",)),
    Rule("estimator never imports export, serving or flywheel", ("estimator",),
         ("slimserve.export", "slimserve.serving", "slimserve.flywheel")),
    Rule("only commands, tests, benchmarks and scripts import flywheel", FOLDERS,
         ("slimserve.flywheel",),
         except_in=("flywheel", "slimserve/cli", "tests", "benchmarks", "scripts")),
    Rule("no library or shared module imports slimserve.cli", LIBRARIES + ("slimserve",),
         ("slimserve.cli",), except_in=("slimserve/cli", "slimserve/testing")),
]


@functools.lru_cache(maxsize=None)
def python_files(root=ROOT):
    """Repository-relative paths of every .py file under FOLDERS."""
    found = []
    for folder in FOLDERS:
        for directory, subdirs, files in os.walk(os.path.join(root, folder)):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "__pycache__")))
            found += [os.path.relpath(os.path.join(directory, name), root)
                      for name in sorted(files) if name.endswith(".py")]
    return tuple(found)


def package_of(path):
    """The import name of the package a repository file is in (the libraries are
    installed under slimserve.<folder>)."""
    parts = path[:-len(".py")].split("/")[:-1]
    if parts and parts[0] in LIBRARIES:
        parts = ["slimserve"] + parts
    return ".".join(parts)


@functools.lru_cache(maxsize=None)
def imports(path, root=ROOT):
    """[(line, module)] of every import in the file, anywhere in it; `from a import b`
    counts as a and a.b (b may be a module); relative imports are resolved."""
    with open(os.path.join(root, path), encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = package_of(path).split(".")
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            found.append((node.lineno, base))
            found += [(node.lineno, "%s.%s" % (base, alias.name)) for alias in node.names]
    return tuple(found)


def _matches(module, prefixes):
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(rule, root=ROOT):
    """["file:line imports module"] of the rule's importers."""
    out = []
    for path in python_files(root):
        if not _under(path, rule.importers) or _under(path, rule.except_in):
            continue
        seen = set()
        for line, module in imports(path, root):
            if _matches(module, rule.forbidden) and (line, module) not in seen:
                seen.add((line, module))
                out.append("%s:%d imports %s" % (path, line, module))
    return out


@pytest.mark.parametrize("rule", RULES, ids=[rule.name for rule in RULES])
def test_imports_point_one_way(rule):
    found = violations(rule)
    assert not found, "%s:\n  %s" % (rule.name, "\n  ".join(found))


def test_the_reader_sees_lazy_relative_and_from_imports(tmp_path):
    """A planted violation of each kind is found, named file:line."""
    core = tmp_path / "serving" / "core"
    core.mkdir(parents=True)
    (core / "planted.py").write_text(
        "import os\n"
        "def later():\n"
        "    from slimserve import flywheel\n"
        "    from ..tools import client\n"
        "    import slimserve.export.signatures\n")
    (tmp_path / "estimator").mkdir()
    (tmp_path / "estimator" / "fine.py").write_text("from slimserve.estimator import x\n")
    found = [v for rule in RULES for v in violations(rule, str(tmp_path))]
    assert sorted(set(found)) == [
        "serving/core/planted.py:3 imports slimserve.flywheel",
        "serving/core/planted.py:4 imports slimserve.serving.tools",
        "serving/core/planted.py:4 imports slimserve.serving.tools.client",
        "serving/core/planted.py:5 imports slimserve.export.signatures",
    ]
