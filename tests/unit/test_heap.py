"""The server's heap settling (serving/core/heap.py): after a load the served objects are
frozen, so Python's full collections no longer walk them (150-175 ms of every thread
stopped, about every 17 s under load at 32x32); after an unload the retired version's
graph, full of reference cycles, is still collected, not frozen for good."""
import gc
import weakref

import pytest

from slimserve.serving.config import model_config
from slimserve.serving.core import manager as manager_lib
from slimserve.testing import tiny_models

NEVER_MICROS = 3600 * 10 ** 6


@pytest.fixture(autouse=True)
def thawed():
    """Each test starts and ends with nothing frozen (the rest of this process's tests
    run with Python's default collection)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def _serve(base, freeze):
    manager = manager_lib.ModelManager(
        [model_config.ServedModel("m", str(base))], manager_lib.ManagerOptions(
            warmup=False, load_retry_interval_micros=NEVER_MICROS,
            freeze_loaded_objects=freeze))
    manager.poll()
    return manager


def _graph_of(manager, version):
    servable = manager.acquire("m", version)
    try:
        return weakref.ref(servable.graph), len(servable.graph.get_operations())
    finally:
        servable.release()


def test_a_loaded_version_is_frozen_and_an_unloaded_one_is_collected(tmp_path):
    base = tmp_path / "m"
    tiny_models.write_tiny_model(str(base), version=1)
    manager = _serve(base, freeze=True)
    try:
        graph, operations = _graph_of(manager, 1)
        frozen = gc.get_freeze_count()
        assert frozen > operations  # the graph's objects and everything else tracked
        assert graph() is not None
        tiny_models.write_tiny_model(str(base), version=2)
        manager.poll()  # version 2 loads, version 1 unloads
        assert dict((v, s) for v, s, _ in manager.status("m"))[1] == manager_lib.END
        gc.collect()  # what frozen objects would survive
        assert graph() is None, "the unloaded version's graph was frozen, never collected"
        assert _graph_of(manager, 2)[0]() is not None
        assert gc.get_freeze_count() > 0  # version 2's objects, frozen after its load
    finally:
        manager.stop()
    assert gc.get_freeze_count() == 0  # a stopped manager leaves nothing frozen


def test_without_the_option_the_manager_leaves_the_collector_alone(tmp_path):
    base = tmp_path / "m"
    tiny_models.write_tiny_model(str(base), version=1)
    manager = _serve(base, freeze=False)
    try:
        assert gc.get_freeze_count() == 0
    finally:
        manager.stop()
    assert gc.get_freeze_count() == 0
