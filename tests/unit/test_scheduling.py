"""The suite's own order (tests/scheduling.py): costliest units first, by the cost marker in
each test's file, and a long run-wide build charged to the one unit that will build it,
so it starts early."""
import json
import types

import pytest

from tests import scheduling


def _item(name, seconds=None, *fixtures):
    """A collected test as scheduling sees it: its id, its fixtures, its closest markers."""
    marks = {"cost": pytest.mark.cost(seconds).mark} if seconds is not None else {}
    return types.SimpleNamespace(nodeid="tests/unit/" + name, fixturenames=list(fixtures),
                                 get_closest_marker=marks.get)


def test_a_run_wide_build_is_charged_to_its_costliest_user_only(monkeypatch):
    monkeypatch.setattr(scheduling, "RUN_WIDE_COSTS", {"trained_run": 55})
    items = [_item("a.py::small", 2, "trained_run"), _item("b.py::other", 40),
             _item("a.py::big", 30, "export_dir", "trained_run"), _item("c.py::cheap")]
    costs = scheduling._unit_costs({i.nodeid: [i] for i in items})  # pylint: disable=protected-access
    assert costs == {"tests/unit/a.py::small": 2, "tests/unit/b.py::other": 40,
                     "tests/unit/a.py::big": 30 + 55, "tests/unit/c.py::cheap": 1.0}
    scheduling.arrange(items)
    # The builder goes before a costlier test that needs nothing; its fellow user does not.
    assert [i.nodeid for i in items] == ["tests/unit/a.py::big", "tests/unit/b.py::other",
                                         "tests/unit/a.py::small", "tests/unit/c.py::cheap"]


def test_the_cost_marker_decides_what_is_slow():
    assert scheduling.is_slow(_item("a.py::trains", scheduling.SLOW_SECONDS))
    assert not scheduling.is_slow(_item("a.py::quick", scheduling.SLOW_SECONDS - 1))
    assert not scheduling.is_slow(_item("a.py::unmarked"))
    assert scheduling.is_slow(_item("a.py::uses_the_run", None, "export_dir"))


def test_the_units_file_carries_each_tests_cost_for_the_controller(tmp_path):
    """The controller has test ids, not items: it reads the costs the workers wrote."""
    items = [_item("a.py::cheap"), _item("b.py::long", 44)]
    scheduling.arrange(items, str(tmp_path / "units.json"))
    assert json.loads((tmp_path / "units.json").read_text()) == {
        "tests/unit/b.py::long": ["tests/unit/b.py::long", 44.0],
        "tests/unit/a.py::cheap": ["tests/unit/a.py::cheap", 1.0]}


@pytest.mark.cost(3)
def test_a_marker_in_the_file_is_what_the_scheduler_reads(request):
    """A real collected item: its cost marker, its layer's marker from its folder."""
    assert scheduling.cost(request.node) == 3
    assert request.node.get_closest_marker("unit") and not request.node.get_closest_marker(
        "slow")
