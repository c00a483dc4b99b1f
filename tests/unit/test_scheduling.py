"""The suite's own order (tests/scheduling.py): costliest units first, and a long run-wide
build charged to the one unit that will build it, so it starts early."""
import types

from tests import scheduling


def _item(name, *fixtures):
    return types.SimpleNamespace(nodeid="tests/" + name, fixturenames=list(fixtures))


def test_a_run_wide_build_is_charged_to_its_costliest_user_only(monkeypatch):
    monkeypatch.setattr(scheduling, "COSTS", {"a.py::big": 30, "a.py::small": 2,
                                              "b.py::other": 40})
    monkeypatch.setattr(scheduling, "RUN_WIDE_COSTS", {"trained_run": 55})
    items = [_item("a.py::small", "trained_run"), _item("b.py::other"),
             _item("a.py::big", "export_dir", "trained_run"), _item("c.py::cheap")]
    costs = scheduling._unit_costs({i.nodeid: [i] for i in items})  # pylint: disable=protected-access
    assert costs == {"tests/a.py::small": 2, "tests/b.py::other": 40,
                     "tests/a.py::big": 30 + 55, "tests/c.py::cheap": 1.0}
    scheduling.arrange(items)
    # The builder goes before a costlier test that needs nothing; its fellow user does not.
    assert [i.nodeid for i in items] == ["tests/a.py::big", "tests/b.py::other",
                                         "tests/a.py::small", "tests/c.py::cheap"]
