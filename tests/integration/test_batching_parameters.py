"""BatchingParameters as TF Serving documents them (batching_session.cc,
shared_batch_scheduler.h, bundle_factory_util.cc): allowed_batch_sizes pads a batch up with
real rows and slices the padding off, pad_variable_length_inputs pads dimensions past the
first, enable_large_batch_splitting / max_execution_batch_size split a large request
across batches; --enable_per_model_batching_parameters reads a version's
batching_params.pbtxt; --platform_config_file's SessionBundleConfig replaces the flags.
The probe model answers, per row, the batch size and width of the run it was part of."""
import concurrent.futures
import os

import grpc
import numpy as np
import pytest

from slimserve import errors as user_errors
from slimserve.serving.clients import client as client_lib
from slimserve.serving.config import files
from slimserve.serving.config import messages
from slimserve.serving.config import model_config
from slimserve.serving.config import platform
from slimserve.serving.core import batching
from slimserve.serving.core import errors
from slimserve.serving.core import servable as servable_lib
from slimserve.testing import tiny_models
from slimserve.testing.servers import serve_in_process

SLOW = 500 * 1000  # a batch timeout long enough for concurrent requests to meet


@pytest.fixture(scope="module")
def probe_base(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("probe") / "probe")
    tiny_models.write_batch_probe_model(base)
    return base


@pytest.fixture(scope="module")
def probe(probe_base):
    servable = servable_lib.Servable("probe", 1, probe_base + "/1")
    yield servable
    servable.retire()


def _together(params, servable, inputs):
    """Runs `inputs` (one array each) as concurrent requests through a Batcher with
    `params` -> ([outputs or ServingError per input], [batch size per batch run])."""
    seen = []
    batcher = batching.Batcher(params, on_batch=lambda rows, label: seen.append(rows))
    _, sig = servable.signature("serving_default")
    pool = concurrent.futures.ThreadPoolExecutor(len(inputs))

    def call(x):
        try:
            return batcher.run(servable, "serving_default", sig, {"x": x},
                               ["echo", "rows", "total", "width"])
        except errors.ServingError as error:
            return error

    try:
        return list(pool.map(call, inputs)), seen
    finally:
        pool.shutdown()
        batcher.stop()


def _rows(n, width=2, start=0.0):
    return (np.arange(n * width, dtype=np.float32).reshape(n, width) + start)


def test_allowed_batch_sizes_pad_up_with_real_rows_and_slice_them_off(probe):
    inputs = [_rows(1, start=10 * i) for i in range(3)]
    params = batching.BatchingParameters(max_batch_size=8, allowed_batch_sizes=(2, 4, 8),
                                         batch_timeout_micros=SLOW)
    results, seen = _together(params, probe, inputs)
    assert seen == [4]  # 3 rows padded to the next allowed size; the metric sees 4
    for x, out in zip(inputs, results):
        assert out["rows"].tolist() == [4]  # the graph ran on 4 rows
        np.testing.assert_array_equal(out["echo"], x)  # each gets exactly its own rows
        np.testing.assert_allclose(out["total"], x.sum(1))
    results, seen = _together(batching.BatchingParameters(
        max_batch_size=8, batch_timeout_micros=SLOW), probe, inputs)
    assert seen == [3] and all(out["rows"].tolist() == [3] for out in results)


def test_pad_variable_length_inputs(probe):
    narrow, wide = np.array([[5.0, 1.0]], np.float32), np.array([[1.0, 2.0, 3.0]], np.float32)
    params = batching.BatchingParameters(max_batch_size=2, batch_timeout_micros=SLOW,
                                         pad_variable_length_inputs=True)
    (got_narrow, got_wide), seen = _together(params, probe, [narrow, wide])
    assert seen == [2]
    assert got_narrow["width"].tolist() == got_wide["width"].tolist() == [3]
    # padded at the end with the request's own first element, as batching_util.cc does
    np.testing.assert_array_equal(got_narrow["echo"], [[5.0, 1.0, 5.0]])
    np.testing.assert_array_equal(got_wide["echo"], wide)
    # without padding, different widths never share a batch (and never fail each other)
    params = batching.BatchingParameters(max_batch_size=2, batch_timeout_micros=SLOW)
    (got_narrow, got_wide), seen = _together(params, probe, [narrow, wide])
    assert sorted(seen) == [1, 1]
    assert (got_narrow["width"].tolist(), got_wide["width"].tolist()) == ([2], [3])


def test_large_batch_splitting_and_max_execution_batch_size(probe):
    x = _rows(7)
    params = batching.BatchingParameters(max_batch_size=8, max_execution_batch_size=3,
                                         enable_large_batch_splitting=True)
    (out,), seen = _together(params, probe, [x])
    assert seen == [3, 3, 1]  # split across batches of at most 3 rows
    assert out["rows"].tolist() == [3, 3, 3, 3, 3, 3, 1]
    np.testing.assert_array_equal(out["echo"], x)  # reassembled in order
    # a request above max_batch_size: TF Serving's INVALID_ARGUMENT, split or not
    for splitting in (True, False):
        params = batching.BatchingParameters(max_batch_size=8, max_execution_batch_size=3,
                                             enable_large_batch_splitting=splitting)
        (error,), seen = _together(params, probe, [_rows(9)])
        assert isinstance(error, errors.ServingError) and seen == []
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT
        assert error.message == "Task size 9 is larger than maximum input batch size 8"
    # without splitting, max_execution_batch_size has no effect (as in TF Serving)
    (out,), seen = _together(batching.BatchingParameters(
        max_batch_size=8, max_execution_batch_size=3), probe, [x])
    assert seen == [7] and out["rows"].tolist() == [7] * 7


@pytest.mark.parametrize("text, expected", [
    ("max_batch_size { value: 8 } allowed_batch_sizes: 4",
     "Last entry in allowed_batch_sizes must match max_batch_size; last entry was 4; "
     "expected 8"),
    ("max_batch_size { value: 8 } allowed_batch_sizes: 4 allowed_batch_sizes: 2 "
     "allowed_batch_sizes: 8", "monotonically increasing"),
    ("max_batch_size { value: 4 } enable_large_batch_splitting { value: true } "
     "max_execution_batch_size { value: 8 }", "greater than or equal to "
     "max_execution_batch_size"),
    ("max_enqueued_batches { value: 0 } enable_large_batch_splitting { value: true }",
     "max_enqueued_batches must be positive"),
])
def test_parameters_tf_serving_refuses_are_refused(tmp_path, text, expected):
    path = tmp_path / "batching.config"
    path.write_text(text)
    with pytest.raises(user_errors.UserError) as raised:
        batching.BatchingParameters.from_file(str(path))
    assert "--batching_parameters_file %s" % path in str(raised.value)
    assert expected in str(raised.value)


def test_every_field_is_read(tmp_path):
    path = tmp_path / "batching.config"
    path.write_text("max_batch_size { value: 8 } batch_timeout_micros { value: 7 } "
                    "max_enqueued_batches { value: 0 } num_batch_threads { value: 3 } "
                    'thread_pool_name { value: "pool" } allowed_batch_sizes: 4 '
                    "allowed_batch_sizes: 8 pad_variable_length_inputs: true "
                    "enable_large_batch_splitting { value: true } "
                    "max_execution_batch_size { value: 4 }")
    with pytest.raises(user_errors.UserError):  # 0 enqueued batches is refused with splitting...
        batching.BatchingParameters.from_file(str(path))
    path.write_text(path.read_text().replace("enable_large_batch_splitting { value: true }",
                                             ""))
    params = batching.BatchingParameters.from_file(str(path))
    assert params == batching.BatchingParameters(  # ...and read as 1 without (TF Serving)
        max_batch_size=8, batch_timeout_micros=7, max_enqueued_batches=1,
        num_batch_threads=3, thread_pool_name="pool", allowed_batch_sizes=(4, 8),
        pad_variable_length_inputs=True, max_execution_batch_size=4)
    assert params.execution_batch_size == 8  # max_execution_batch_size needs splitting


def _predict(port, model, x):
    client = client_lib.Client("127.0.0.1:%d" % port, model_name=model, retries=0)
    try:
        return client.predict({"x": x})
    finally:
        client.close()


def _probe_with(base, batching_text=None):
    """A probe model at `base`, its version holding `batching_text` as its
    assets.extra/batching_params.pbtxt when given."""
    tiny_models.write_batch_probe_model(base)
    if batching_text is not None:
        extra = os.path.join(base, "1", "assets.extra")
        os.makedirs(extra, exist_ok=True)
        with open(os.path.join(extra, "batching_params.pbtxt"), "w") as handle:
            handle.write(batching_text)
    return base


def _serve(bases, common=None, per_model=True):
    """The probe models {name: base} in process, without warmup or REST, batched by
    `common` (default parameters), with --enable_per_model_batching_parameters; a failed
    load is not retried (TF Serving's default retries for 5 minutes)."""
    return serve_in_process(
        [model_config.ServedModel(name, base) for name, base in bases.items()],
        enable_model_warmup=False, rest_api_port=0, max_num_load_retries=0,
        batching_parameters=common or batching.BatchingParameters(),
        enable_per_model_batching_parameters=per_model)


def test_per_model_batching_parameters(tmp_path):
    """With --enable_per_model_batching_parameters a version's own batching_params.pbtxt
    decides how it is batched; a version without one is not batched at all."""
    own = _probe_with(str(tmp_path / "own"),
                      "max_batch_size { value: 4 } allowed_batch_sizes: 4")
    none = _probe_with(str(tmp_path / "none"))
    common = batching.BatchingParameters(max_batch_size=16, allowed_batch_sizes=(16,))
    server = _serve({"own": own, "none": none}, common)
    try:
        assert _predict(server.port, "own", _rows(1))["rows"].tolist() == [4]  # its own file
        assert server.batcher.batches_run == 1
        assert _predict(server.port, "none", _rows(1))["rows"].tolist() == [1]
        assert server.batcher.batches_run == 1  # not batched
    finally:
        server.stop()
    # without the flag both use the server's parameters
    server = _serve({"own": own, "none": none}, common, per_model=False)
    try:
        assert _predict(server.port, "own", _rows(1))["rows"].tolist() == [16]
        assert _predict(server.port, "none", _rows(1))["rows"].tolist() == [16]
    finally:
        server.stop()


def test_per_model_file_that_does_not_parse_fails_the_load(tmp_path):
    """The version fails to load naming the file; as it is the model's only version, the
    server does not start, as TF Serving exits when a model never becomes available."""
    bad = _probe_with(str(tmp_path / "bad"), "max_batch_size: 4")
    with pytest.raises(user_errors.UserError) as caught:
        _serve({"bad": bad}).stop()
    message = str(caught.value)
    assert "did not become available" in message and "name: bad version: 1" in message
    assert "batching_params.pbtxt" in message and "Expected" in message


PLATFORM = """
platform_configs {
  key: "tensorflow"
  value {
    source_adapter_config {
      [type.googleapis.com/tensorflow.serving.SavedModelBundleSourceAdapterConfig] {
        legacy_config {
          session_config { intra_op_parallelism_threads: 1 inter_op_parallelism_threads: 1 }
          batching_parameters { max_batch_size { value: 4 } allowed_batch_sizes: 4 }
          enable_model_warmup: true
          model_warmup_options { num_request_iterations { value: 3 } }
          mixed_precision: "bfloat16"
          %s
        }
      }
    }
  }
}
"""


def test_platform_config_file_is_the_session_bundle_config(tmp_path, probe_base, caplog):
    path = tmp_path / "platform.config"
    path.write_text(PLATFORM % "")
    server = serve_in_process([model_config.ServedModel("probe", probe_base)],
                              rest_api_port=0, platform_config_file=str(path),
                              enable_batching=False, tensorflow_intra_op_parallelism=2)
    try:
        # its batching parameters apply although --enable_batching is off
        assert _predict(server.port, "probe", _rows(1))["rows"].tolist() == [4]
        settings = server.settings
        assert settings.enable_model_warmup and settings.warmup_iterations == 3
        assert settings.source == "--platform_config_file %s" % path
        config = server.manager.acquire("probe")
        try:
            assert config.precision == "bfloat16"
        finally:
            config.release()
        assert (settings.session_config.intra_op_parallelism_threads,
                settings.session_config.inter_op_parallelism_threads) == (1, 1)
        assert "--tensorflow_intra_op_parallelism" in caplog.text  # ignored, and said so
    finally:
        server.stop()


@pytest.mark.parametrize("text, expected", [
    (PLATFORM % "session_target: \"grpc://elsewhere:1\"", "only the local TensorFlow runtime"),
    ((PLATFORM % "").replace('key: "tensorflow"', 'key: "pytorch"'), "platform 'pytorch' has no "
     "source adapter here"),
    ((PLATFORM % "").replace("SavedModelBundleSourceAdapterConfig] {",
                      "ModelWarmupOptions] {").replace("legacy_config {", "x {"),
     'Error parsing text-format tensorflow.serving.PlatformConfigMap'),
    ('platform_configs { key: "tensorflow" value { source_adapter_config { '
     '[type.googleapis.com/tensorflow.serving.ModelWarmupOptions] { model_name: "x" } } } }',
     "source_adapter_config must hold a tensorflow.serving.SavedModelBundleSourceAdapterConfig"),
    (PLATFORM % "", None),
])
def test_bad_platform_config_names_the_file(tmp_path, text, expected):
    path = tmp_path / "platform.config"
    path.write_text(text)
    if expected is None:
        settings = platform.bundle_settings(_options(platform_config_file=str(path)))
        assert settings.batching.allowed_batch_sizes == (4,)
        # the text a platform config file holds round-trips
        again = files.parse_text(platform.to_text(platform.platform_config_map(
            settings.bundle)), messages.PlatformConfigMap, "round trip")
        assert platform.from_platform_config(again).batching == settings.batching
        return
    with pytest.raises(user_errors.UserError) as raised:
        platform.bundle_settings(_options(platform_config_file=str(path)))
    assert "--platform_config_file %s" % path in str(raised.value)
    assert expected in str(raised.value)


def _options(**changes):
    from slimserve.serving import options as options_lib  # pylint: disable=import-outside-toplevel
    return options_lib.ServerOptions(**changes)


NUMERIC_FIELDS = ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches",
                  "num_batch_threads", "allowed_batch_sizes", "max_execution_batch_size")


@pytest.mark.parametrize("adaptive", [False, True], ids=["tf_serving", "adaptive"])
@pytest.mark.parametrize("field", NUMERIC_FIELDS)
@pytest.mark.parametrize("value", [0, -1, 2 ** 31, 2 ** 63 - 1])
def test_every_field_out_of_its_bound_is_refused_naming_file_and_field(
        tmp_path, probe, field, value, adaptive):
    """0, -1, 2^31 and 2^63-1 at every number of a batching file (TF Serving's and the
    adaptive scheduler's): a refusal naming the file and the field, or parameters that
    start batch threads and serve (a full batch runs at once, whatever the timeout)."""
    path = tmp_path / "batching.config"
    text = ("allowed_batch_sizes: %d" % value if field == "allowed_batch_sizes"
            else "%s { value: %d }" % (field, value))
    if adaptive:
        text += ' thread_pool_name { value: "%s" }' % batching.ADAPTIVE_POOL
    path.write_text(text)
    try:
        params = batching.BatchingParameters.from_file(str(path))
    except files.ConfigError as error:
        assert "--batching_parameters_file %s: " % path in str(error)
        assert field in str(error)
        assert len(str(error).splitlines()) == 1
        return
    assert (field, value) in {("batch_timeout_micros", 0), ("batch_timeout_micros", 2 ** 31),
                              ("max_enqueued_batches", 0), ("max_execution_batch_size", 0)}
    assert params.adaptive == adaptive
    full = _rows(params.max_batch_size)
    (out,), seen = _together(params, probe, [full])
    assert seen == [params.max_batch_size]
    np.testing.assert_array_equal(out["echo"], full)


def test_an_out_of_bound_file_stops_the_server_before_it_starts_a_thread(tmp_path,
                                                                           probe_base):
    """The issue's cases: a million batch threads, and a timeout of 2^63-1 microseconds
    (which once killed the batch thread in Condition.wait at the first full batch)."""
    from slimserve.serving import server as server_lib  # pylint: disable=import-outside-toplevel
    for text, field in (("num_batch_threads { value: 1000000 }", "num_batch_threads"),
                        ("batch_timeout_micros { value: 9223372036854775807 }",
                         "batch_timeout_micros")):
        path = tmp_path / "batching.config"
        path.write_text(text)
        with pytest.raises(files.ConfigError) as raised:
            server_lib.ModelServer(model_base_path=probe_base, model_name="probe",
                                   enable_batching=True,
                                   batching_parameters_file=str(path))
        assert "--batching_parameters_file %s: %s must be in" % (path, field) in \
            str(raised.value)


def test_batch_threads_the_process_cannot_start_are_a_clean_error(monkeypatch):
    import threading  # pylint: disable=import-outside-toplevel
    started = []
    original = threading.Thread.start

    def start(self):
        if len(started) == 3:
            raise RuntimeError("can't start new thread")
        started.append(self)
        original(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    params = batching.BatchingParameters(num_batch_threads=64,
                                         source="--batching_parameters_file b.config")
    with pytest.raises(files.ConfigError) as raised:
        batching.Batcher(params)
    assert str(raised.value).startswith("--batching_parameters_file b.config: "
                                        "num_batch_threads: cannot start 64 batch threads")
    monkeypatch.undo()
    for thread in started:  # the ones it did start were stopped
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_a_per_model_file_out_of_bound_keeps_the_old_version_serving(tmp_path):
    base = _probe_with(str(tmp_path / "probe"), "max_batch_size { value: 4 }")
    server = _serve({"probe": base})
    try:
        tiny_models.write_batch_probe_model(base, version=2)
        bad = os.path.join(base, "2", "assets.extra", "batching_params.pbtxt")
        os.makedirs(os.path.dirname(bad))
        with open(bad, "w") as handle:
            handle.write("max_batch_size { value: 2147483648 }")
        server.manager.poll()
        statuses = {v: (state, error) for v, state, error in server.manager.status("probe")}
        assert statuses[1][0] == "AVAILABLE"
        assert statuses[2][0] == "END"
        assert "batching_params.pbtxt: max_batch_size must be in" in statuses[2][1]
        assert _predict(server.port, "probe", _rows(1))["rows"].tolist() == [1]  # v1 serves
    finally:
        server.stop()


def test_the_bounds_table_in_reliability_md_is_the_code_s():
    from slimserve import fields  # pylint: disable=import-outside-toplevel
    page = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs",
                             "reliability.md")).read()
    for field, rule in fields.bounds_table(batching.BatchingParameters):
        assert "| `%s` | %s |" % (field, rule) in page, field
