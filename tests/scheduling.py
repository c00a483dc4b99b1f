"""The order the suite runs in, and how pytest-xdist workers share it: the costliest work
first, so the long trainings overlap the many short tests instead of ending the run alone.

Work units: tests that share a module- or class-scoped fixture (a served model, a
diverged run) form one unit, given whole to one worker so the fixture is built once;
every other test is a unit by itself. Units are sorted by their cost, the sum of their
tests' costs. A test states its own cost in its file: `@pytest.mark.cost(55)` (seconds
on a 2-core machine, serial: the call plus the module fixtures it sets up, from
`pytest -p no:xdist --durations=60`), or a module's `pytestmark`; unmarked, it costs 1 s.
Only the order depends on the numbers: a stale or missing one costs time, never a result.
Session fixtures are not counted: tests/run_once.py builds them once for all workers.

Without xdist the sorted order is simply the run's order. Under `-n N` (xdist's default
`--dist load`) UnitScheduling hands each idle worker the costliest unit left. A worker
only starts a test once it holds the next one, so a worker about to run a long test is
given the cheapest unit left as that next one, not a second long unit that the other
worker could have taken. (xdist's own `--dist loadgroup` would need the group in the
test id, which pytest 9.2 no longer lets a plugin change.) `--dist loadfile` and the
other explicit modes keep xdist's schedulers.
"""
import collections
import json
import os

DEFAULT_COST = 1.0  # seconds: a test without a cost marker
LONG = 10.0  # seconds: a test this costly gets the cheapest unit queued behind it
UNITS_FILE = "units.json"


def _shared_fixture_module(item):
    """The item's module if it uses a fixture that lives longer than one test there."""
    info = getattr(item, "_fixtureinfo", None)
    for definitions in (info.name2fixturedefs.values() if info else ()):
        if definitions and definitions[-1].scope in ("class", "module", "package"):
            return item.nodeid.split("::")[0].rsplit("/", 1)[-1][:-len(".py")]
    return None


def cost(item):
    """The seconds its `cost` marker states (the closest: the test's, else its module's)."""
    marker = item.get_closest_marker("cost")
    return float(marker.args[0]) if marker else DEFAULT_COST


# The quick loop (`pytest -m "not slow"`) leaves out what trains: a test whose cost is
# SLOW_SECONDS or more, and every test of the session's trained run (building it alone is
# about a minute); `make test` runs everything.
SLOW_SECONDS = 5
SLOW_FIXTURES = {"trained_run", "export_dir"}


def is_slow(item):
    return (cost(item) >= SLOW_SECONDS
            or bool(SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))))


# Run-wide fixtures (tests/run_once.py) that take long to build, in seconds. The unit that
# builds one is the costliest unit using it, so it is charged the build: queued early, it
# builds the fixture before the other worker reaches a test that would wait for it (a run
# of 2026-11-26 lost ~45 s of a core to a worker waiting for the trained run).
RUN_WIDE_COSTS = {"trained_run": 55}


def _unit_costs(units):
    """{unit key: seconds}: its tests' costs, plus each run-wide build it is the first
    (costliest) user of."""
    costs = {key: sum(cost(i) for i in unit) for key, unit in units.items()}
    for fixture, seconds in RUN_WIDE_COSTS.items():
        users = [key for key, unit in units.items()
                 if any(fixture in getattr(i, "fixturenames", ()) for i in unit)]
        if users:
            costs[max(users, key=costs.get)] += seconds
    return costs


def arrange(items, units_path=None):
    """Reorders `items` in place into units, costliest first; writes each test's unit and
    cost to `units_path` (a worker's collection, read by the controller's UnitScheduling,
    which has test ids but no items to read markers from)."""
    units = collections.OrderedDict()
    for item in items:
        units.setdefault(_shared_fixture_module(item) or item.nodeid, []).append(item)
    costs = _unit_costs(units)
    ordered = [units[key] for key in sorted(units, key=lambda key: -costs[key])]
    items[:] = [item for unit in ordered for item in unit]
    if units_path:
        temporary = "%s.%d" % (units_path, os.getpid())
        with open(temporary, "w") as handle:
            json.dump({item.nodeid: [unit_key, cost(item)] for unit_key, unit in units.items()
                       for item in unit}, handle)
        os.replace(temporary, units_path)  # every worker writes the same map


def units_path(config):
    """Where workers leave the unit map for the controller: the run's shared folder."""
    # pylint: disable=protected-access
    base = config._tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return str(base / UNITS_FILE)


def _xdist_scheduler_class():
    from xdist.scheduler import LoadScopeScheduling  # pylint: disable=import-outside-toplevel

    class UnitScheduling(LoadScopeScheduling):
        """LoadScopeScheduling over arrange()'s units in arrange()'s order."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            config.option.loadscopereorder = False  # the collection order is the plan
            self._units = None

        def _unit_and_cost(self, nodeid):
            if self._units is None:
                try:
                    with open(units_path(self.config)) as handle:
                        self._units = json.load(handle)
                except OSError:
                    self._units = {}  # no map: every test is its own unit
            return self._units.get(nodeid, (nodeid, DEFAULT_COST))

        def _split_scope(self, nodeid):
            return self._unit_and_cost(nodeid)[0]

        def _assign_work_unit(self, node, cheapest=False):
            scope, work_unit = self.workqueue.popitem(last=cheapest)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid)
                                    for nodeid, done in work_unit.items() if not done])

        def _reschedule(self, node):
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            pending = [nodeid for unit in self.assigned_work[node].values()
                       for nodeid, done in unit.items() if not done]
            if len(pending) >= 2:
                return
            self._assign_work_unit(
                node, cheapest=bool(pending) and self._unit_and_cost(pending[0])[1] >= LONG)

    return UnitScheduling


class XdistPlugin:
    """Registered by conftest when pytest-xdist is installed."""

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        if config.getvalue("dist") != "load":
            return None  # an explicit --dist mode other than load: xdist's own
        return _xdist_scheduler_class()(config, log)
