"""Versions come and go without an outage: broken or half-copied successors, retries,
run-time reloads of the model set, version labels and the version-state metrics.

Real SavedModels (slimserve/testing/tiny_models.py) copied the way `cp -r` copies them; the manager
is polled by calling poll() directly, so every step is deterministic.
"""
import os
import shutil
import threading
import urllib.request

import grpc
import numpy as np
import pytest

from slimserve.serving.clients import client as client_lib
from slimserve.serving.config import messages
from slimserve.serving.config import model_config
from slimserve.serving.core import errors
from slimserve.serving.core import manager as manager_lib
from slimserve.serving.core import servable as servable_lib
from slimserve.serving.core import version_policy
from slimserve.serving.observability import metrics as metrics_lib
from slimserve.testing import tiny_models
from slimserve.testing.servers import serve_in_process

NEVER_MICROS = 3600 * 1000 * 1000  # a retry interval no test outlives


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    """One tiny SavedModel, copied into place as any version number."""
    return tiny_models.write_tiny_model(str(tmp_path_factory.mktemp("tiny")), 1)


def _copy_pb(source, base, version):
    """The first half of a non-atomic copy: saved_model.pb without variables/."""
    path = os.path.join(str(base), str(version))
    os.makedirs(path, exist_ok=True)
    shutil.copy(os.path.join(source, "saved_model.pb"), path)
    return path


def _copy_rest(source, path):
    """The second half: variables/ (and anything else) arrives later."""
    shutil.copytree(source, path, dirs_exist_ok=True)


def _copy_version(source, base, version):
    path = _copy_pb(source, base, version)
    _copy_rest(source, path)
    return path


def _predict(manager, name="m", version=None, label=None):
    """(version that answered, y) for one real request through the manager."""
    servable = manager.acquire(name, version, label)
    try:
        _, sig = servable.signature("")
        y = servable.run(sig, {"x": np.array([[1.0, 2.0]], np.float32)}, ["y"])["y"]
        return servable.version, float(y[0][0])
    finally:
        servable.release()


def _metric(text, name, **labels):
    """The value of one sample of a Prometheus exposition, read by prometheus_client's
    parser (None when absent); a counter's sample is NAME_total there."""
    family = metrics_lib.families_from_text(text).get(name)
    for sample in family.samples if family else ():
        if sample.name in (name, name + "_total") and sample.labels == labels:
            return sample.value
    return None


def _manager(configs, metrics=None, **options):
    """A ModelManager with warmup on and no timed retries; `options`: ManagerOptions
    fields."""
    metrics = metrics or metrics_lib.Metrics()
    options.setdefault("load_retry_interval_micros", NEVER_MICROS)
    return manager_lib.ModelManager(configs, manager_lib.ManagerOptions(warmup=True, **options),
                                    on_change=metrics.model_event, on_load=metrics.model_load)


EXPECTED_Y = tiny_models.expected_y([[1.0, 2.0]])[0]


@pytest.mark.parametrize("aspired, available, unload", [
    ({2}, [1], []),  # successor not ready yet: the old version stays
    ({2}, [1, 2], [1]),  # successor ready: the old one goes
    ({3, 4}, [1, 2], [1]),  # latest 2, neither ready: keep the newest old one only
    ({3, 4}, [1, 2, 4], [1, 2]),  # one of them ready: every old one goes
    (set(), [1], [1]),  # nothing on disk any more: nothing to preserve
])
def test_availability_preserving_unloads(aspired, available, unload):
    available, unloaded = list(available), []
    while version_policy.next_unload(aspired, available) is not None:  # one at a time
        unloaded.append(version_policy.next_unload(aspired, available))
        available.remove(unloaded[-1])
    assert unloaded == unload


def test_junk_successor_never_interrupts_serving_and_loads_once_fixed(tiny_source, tmp_path):
    """With --retry_failed_versions_on_change (slimserve only; off: TF Serving's
    ReloadAspiredError, tests/test_tfserving_lifecycle.py)."""
    base = tmp_path / "m"
    _copy_version(tiny_source, base, 1)
    metrics = metrics_lib.Metrics()
    manager = _manager([model_config.ServedModel("m", str(base))], metrics,
                       retry_failed_versions_on_change=True)
    try:
        manager.poll()
        assert _predict(manager) == (1, EXPECTED_Y)

        junk = base / "2"
        junk.mkdir()
        (junk / "saved_model.pb").write_bytes(b"not a SavedModel")
        for _ in range(3):  # the retry interval has not passed: one attempt only
            manager.poll()
            assert _predict(manager) == (1, EXPECTED_Y)  # "latest" stays on the good one
        (two_state, two_error), one_state = manager.status("m")[0][1:], manager.status("m")[1]
        assert (two_state, one_state) == ("END", (1, "AVAILABLE", ""))
        assert two_error  # GetModelStatus says why version 2 is not served
        assert _metric(metrics.render(), metrics_lib.LOAD_ATTEMPTS, model_path=str(junk),
                       status="fail") == 1

        shutil.rmtree(junk)
        _copy_version(tiny_source, base, 2)  # fixed: its files changed, so retried at once
        manager.poll()
        assert _predict(manager) == (2, EXPECTED_Y)
        assert manager.status("m") == [(2, "AVAILABLE", ""), (1, "END", "")]
        text = metrics.render()
        state = metrics_lib.MODEL_STATE
        assert _metric(text, state, model_name="m", version="2", state="AVAILABLE") == 1
        assert _metric(text, state, model_name="m", version="1", state="END") == 1
        assert _metric(text, state, model_name="m", version="1", state="AVAILABLE") == 0
        assert _metric(text, metrics_lib.LOAD_ATTEMPTS, model_path=str(junk),
                       status="success") == 1
        assert _metric(text, metrics_lib.LOAD_LATENCY, model_path=str(junk)) > 0
    finally:
        manager.stop()


def test_version_copied_non_atomically_is_served_once_complete(tiny_source, tmp_path):
    """With --retry_failed_versions_on_change (slimserve only)."""
    base = tmp_path / "m"
    _copy_version(tiny_source, base, 1)
    manager = _manager([model_config.ServedModel("m", str(base))], max_num_load_retries=0,
                       retry_failed_versions_on_change=True)
    try:
        manager.poll()
        partial = _copy_pb(tiny_source, base, 2)  # saved_model.pb first, as cp -r does
        manager.poll()
        assert manager.status("m", 2)[0][1] == "END"
        assert "variables" in manager.status("m", 2)[0][2]
        assert _predict(manager) == (1, EXPECTED_Y)
        manager.poll()  # out of retries and nothing changed: not tried again
        assert manager.available_versions("m") == [1]
        _copy_rest(tiny_source, partial)  # variables/ arrives: the files changed
        manager.poll()
        assert manager.available_versions("m") == [2]
        assert _predict(manager) == (2, EXPECTED_Y)
    finally:
        manager.stop()


def test_failed_load_is_retried_max_num_load_retries_times(tiny_source, tmp_path):
    base = tmp_path / "m"
    _copy_version(tiny_source, base, 1)
    attempts = []
    manager = manager_lib.ModelManager(
        [model_config.ServedModel("m", str(base))], manager_lib.ManagerOptions(
            max_num_load_retries=2,
            load_retry_interval_micros=-1),  # negative: retry without waiting, as TF Serving
        on_load=lambda name, version, path, ok, *_: attempts.append((version, ok)))
    try:
        manager.poll()
        (base / "2").mkdir()
        (base / "2" / "saved_model.pb").write_bytes(b"junk")
        for _ in range(6):
            manager.poll()
        assert attempts == [(1, True)] + [(2, False)] * 3  # 1 attempt + 2 retries
        assert _predict(manager) == (1, EXPECTED_Y)
    finally:
        manager.stop()


def test_broken_only_version_leaves_model_unavailable_not_crashed(tmp_path):
    base = tmp_path / "m"
    (base / "3").mkdir(parents=True)
    (base / "3" / "saved_model.pb").write_bytes(b"junk")
    manager = _manager([model_config.ServedModel("m", str(base))])
    try:
        manager.poll()
        with pytest.raises(errors.ServingError) as caught:
            manager.acquire("m")
        # TF Serving's answer when no version of a served model is loaded
        assert caught.value.code == grpc.StatusCode.NOT_FOUND
        assert caught.value.message == "Servable not found for request: Latest(m)"
        assert manager.status("m")[0][:2] == (3, "END")
    finally:
        manager.stop()


def test_models_load_in_parallel_with_num_load_threads(tiny_source, tmp_path):
    for name in ("a", "b"):
        _copy_version(tiny_source, tmp_path / name, 1)
    both_loading = threading.Barrier(2, timeout=30)  # breaks if loads run one at a time
    met = []

    def on_change(name, version, state, error):
        del version, error
        if state == "LOADING":
            both_loading.wait()
            met.append(name)

    manager = manager_lib.ModelManager(
        [model_config.ServedModel(n, str(tmp_path / n)) for n in ("a", "b")],
        manager_lib.ManagerOptions(num_load_threads=2), on_change=on_change)
    try:
        manager.poll()
        assert sorted(met) == ["a", "b"]
        assert _predict(manager, "a") == _predict(manager, "b") == (1, EXPECTED_Y)
    finally:
        manager.stop()


def test_reload_loads_new_models_before_unloading_removed_ones(tiny_source, tmp_path):
    _copy_version(tiny_source, tmp_path / "a", 1)
    for version in (1, 2):
        _copy_version(tiny_source, tmp_path / "b", version)
    events = []
    manager = manager_lib.ModelManager(
        [model_config.ServedModel("a", str(tmp_path / "a"))],
        on_change=lambda name, version, state, error: events.append((name, version, state)))
    try:
        manager.poll()
        manager.reload([model_config.ServedModel("b", str(tmp_path / "b"))])
        assert manager.model_names == ["b"]
        assert events.index(("b", 2, "AVAILABLE")) < events.index(("a", 1, "UNLOADING"))
        assert _predict(manager, "b") == (2, EXPECTED_Y)
        with pytest.raises(errors.ServingError) as caught:
            manager.acquire("a")
        assert caught.value.code == grpc.StatusCode.NOT_FOUND
        assert manager.status("a") == [(1, "END", "")]  # history stays, as in TF Serving

        # a new model that cannot load fails the reload and changes nothing
        (tmp_path / "c" / "1").mkdir(parents=True)
        (tmp_path / "c" / "1" / "saved_model.pb").write_bytes(b"junk")
        with pytest.raises(errors.ServingError) as caught:
            manager.reload([model_config.ServedModel("b", str(tmp_path / "b")),
                            model_config.ServedModel("c", str(tmp_path / "c"))])
        assert caught.value.code == grpc.StatusCode.UNKNOWN and "c" in caught.value.message
        assert manager.model_names == ["b"] and _predict(manager, "b")[0] == 2

        # a changed policy applies; a changed base path swaps once the new path loaded
        manager.reload([model_config.ServedModel("b", str(tmp_path / "b"),
                                           version_policy.VersionPolicy("specific", versions=[1]))])
        assert manager.available_versions("b") == [1]
        _copy_version(tiny_source, tmp_path / "b2", 5)
        manager.reload([model_config.ServedModel("b", str(tmp_path / "b2"))])
        assert _predict(manager, "b") == (5, EXPECTED_Y)
        assert manager.status("b") == [(5, "AVAILABLE", "")]
    finally:
        manager.stop()


def test_version_labels_must_name_available_versions(tiny_source, tmp_path):
    for version in (1, 2):
        _copy_version(tiny_source, tmp_path / "m", version)
    base = str(tmp_path / "m")
    every = version_policy.VersionPolicy("all")
    manager = manager_lib.ModelManager([model_config.ServedModel("m", base, every, {"stable": 1})])
    try:
        manager.poll()
        assert _predict(manager, label="stable")[0] == 1
        with pytest.raises(errors.ServingError) as caught:
            manager.reload([model_config.ServedModel("m", base, every, {"stable": 1, "canary": 7})])
        assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "version 7 of model m" in caught.value.message
        manager.reload([model_config.ServedModel("m", base, every, {"stable": 1, "canary": 2})])
        assert _predict(manager, label="canary")[0] == 2
    finally:
        manager.stop()

    lenient = manager_lib.ModelManager(
        [model_config.ServedModel("m", base, every, {"stable": 1})],
        manager_lib.ManagerOptions(allow_version_labels_for_unavailable_models=True))
    try:
        lenient.poll()
        lenient.reload([model_config.ServedModel("m", base, every, {"stable": 1, "next": 3})])
        assert lenient.resolve_label("m", "next") == 3  # a new label may wait for its version
        with pytest.raises(errors.ServingError) as caught:
            lenient.acquire("m", label="next")
        assert caught.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(errors.ServingError) as caught:  # an existing one may not move there
            lenient.reload([model_config.ServedModel("m", base, every, {"stable": 3})])
        assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert _predict(lenient, label="stable")[0] == 1
    finally:
        lenient.stop()



def test_server_reports_failed_version_over_grpc_and_prometheus(tiny_source, tmp_path):
    base = tmp_path / "m"
    _copy_version(tiny_source, base, 1)
    server = serve_in_process(
        [model_config.ServedModel("m", str(base))],
        monitoring_config=messages.prometheus_monitoring(metrics_lib.PATH))
    try:
        (base / "2").mkdir()
        (base / "2" / "saved_model.pb").write_bytes(b"junk")
        server.manager.poll()
        client = client_lib.Client("127.0.0.1:%d" % server.port, model_name="m", retries=0)
        (two, two_state, two_error), one = client.status()
        assert (two, two_state, one) == (2, "END", (1, "AVAILABLE", ""))
        assert two_error
        url = "http://127.0.0.1:%d%s" % (server.rest_api_port, metrics_lib.PATH)
        with urllib.request.urlopen(url) as response:
            text = response.read().decode()
        state = metrics_lib.MODEL_STATE
        assert _metric(text, state, model_name="m", version="1", state="AVAILABLE") == 1
        assert _metric(text, state, model_name="m", version="2", state="END") == 1
        assert _metric(text, metrics_lib.LOAD_ATTEMPTS, model_path=str(base / "2"),
                       status="fail") == 1
    finally:
        server.stop()


def _write_warmup(version_path, rows):
    """assets.extra/tf_serving_warmup_requests with one predict request of `rows`."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tensorflow_serving.apis import predict_pb2  # pylint: disable=import-outside-toplevel
    from tensorflow_serving.apis import prediction_log_pb2  # pylint: disable=import-outside-toplevel
    request = predict_pb2.PredictRequest()
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(rows, np.float32)))
    log = prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request))
    path = os.path.join(version_path, servable_lib.WARMUP_PATH)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(log.SerializeToString())


def test_servable_api_and_a_failing_warmup_keeps_a_version_out(tiny_source, tmp_path):
    good = _copy_version(tiny_source, tmp_path / "m", 1)
    _write_warmup(good, [[1.0, 2.0]])
    servable = servable_lib.Servable.load(good)  # what export verification loads through
    try:
        assert (servable.name, servable.version) == ("m", 1)
        name, sig = servable.signature("")
        assert name == "serving_default"
        y = servable.run(sig, {"x": np.array([[1.0, 2.0]], np.float32)}, ["y"])["y"]
        assert float(y[0][0]) == EXPECTED_Y
        assert servable.warm_up() == 1
    finally:
        servable.retire()

    manager = _manager([model_config.ServedModel("m", str(tmp_path / "m"))])
    try:
        manager.poll()
        bad = _copy_version(tiny_source, tmp_path / "m", 2)
        _write_warmup(bad, [[1.0, 2.0, 3.0]])  # wrong shape: warmup fails, so does the load
        manager.poll()
        assert manager.available_versions("m") == [1]
        state, error = manager.status("m", 2)[0][1:]
        assert state == "END" and "warmup record 1" in error and "[1,3]" in error
    finally:
        manager.stop()
