"""The model lifecycle as TF Serving 2.15.1 runs it (issue 50, part A), seen from outside:
the server process's exit, gRPC ModelService (HandleReloadConfigRequest,
GetModelStatus), Predict, the polled config file and the model directory. Each test is
this project's own reading of a behaviour TF Serving's C++ tests pin (server_core_test,
aspired_versions_manager_test, availability_preserving_policy_test,
file_system_storage_path_source_test), never a copy of one.

Cost: in-process servers on tiny models (a module-scoped one for the reload tests), two
short-lived server processes for the exits at start-up.
"""
import logging
import os
import shutil
import subprocess
import sys
import time

import grpc
import pytest
from google.protobuf import text_format
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import model_management_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from slimserve import errors as user_errors
from slimserve.export import versions as export_versions
from slimserve.serving import server as server_lib
from slimserve.serving import server_process
from slimserve.serving.config import model_config
from slimserve.testing import tiny_models
from slimserve.testing.servers import MEMORY_CAP, wait_until
from tests.helpers import ROOT

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
POLL = 0.2  # --file_system_poll_wait_seconds of the servers that watch a directory
AVAILABLE, END = (get_model_status_pb2.ModelVersionStatus.AVAILABLE,
                  get_model_status_pb2.ModelVersionStatus.END)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A base path with versions 1 and 2 of the tiny model (never changed by a test)."""
    return tiny_models.write_tiny_versions(str(tmp_path_factory.mktemp("models") / "tiny"),
                                           1, 2)


def _copy(source, base, *versions):
    """Publishes versions of the tiny model under `base` the way an exporter does: written
    beside (a name that is no version), then renamed into place."""
    for version in versions:
        path = os.path.join(base, str(version))
        shutil.copytree(os.path.join(source, "1"), path + ".partial")
        os.rename(path + ".partial", path)
    return str(base)


def _entry(name, base, extra=""):
    return 'config { name: "%s" base_path: "%s" %s }' % (name, base, extra)


def _config(*entries):
    return text_format.Parse("model_config_list { %s }" % " ".join(entries),
                             model_server_config_pb2.ModelServerConfig())


def _serve(configs=None, **options):
    """A started in-process ModelServer on loopback gRPC (REST off) and its channel."""
    options.setdefault("file_system_poll_wait_seconds", 0)
    if configs is not None:
        options["model_server_config"] = configs
    server = server_lib.ModelServer(port=server_lib.PICK_FREE_PORT, rest_api_port=0,
                                    freeze_loaded_objects=False, **options).start()
    return server, grpc.insecure_channel("127.0.0.1:%d" % server.port)


def _stop(server, channel):
    channel.close()
    server.stop(grace=1.0)


def _reload(channel, config):
    """HandleReloadConfigRequest -> (gRPC code, the status's error message)."""
    request = model_management_pb2.ReloadConfigRequest()
    request.config.CopyFrom(config)
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    try:
        response = stub.HandleReloadConfigRequest(request, timeout=120)
    except grpc.RpcError as error:
        return error.code(), error.details()
    return grpc.StatusCode(next(c for c in grpc.StatusCode
                                if c.value[0] == response.status.error_code)), \
        response.status.error_message


def _status(channel, name):
    """{version: (state, error code)} from GetModelStatus, or the gRPC code it failed
    with."""
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    try:
        response = stub.GetModelStatus(request, timeout=30)
    except grpc.RpcError as error:
        return error.code()
    return {s.version: (s.state, s.status.error_code) for s in response.model_version_status}


_predict = tiny_models.predict_version


def _start_fails(flags):
    """Runs slimserve-server to its exit (it must not start) under the memory cap ->
    (exit status, stderr)."""
    argv = [sys.executable, "-m", server_process.SERVER_MODULE, "--port=-1",
            "--rest_api_port=0"] + list(flags)
    process = subprocess.run(server_process.launcher_argv(argv, MEMORY_CAP), cwd=ROOT,
                             capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL)
    assert process.stdout == "", "it started: %s" % process.stdout
    return process.returncode, process.stderr


# --- reloads against one served model ------------------------------------------------------

@pytest.fixture(scope="module")
def served(tiny):
    """One server of model `tiny` (latest 1: version 2) for the reload tests; each test
    leaves it serving exactly that."""
    server, channel = _serve([model_config.ServedModel("tiny", tiny)])
    yield channel
    _stop(server, channel)


def test_reload_refuses_a_relative_base_path(served, tiny):
    relative = os.path.relpath(tiny)  # resolvable from here: still refused
    code, message = _reload(served, _config(_entry("tiny", tiny), _entry("more", relative)))
    assert code == INVALID
    assert ("Expected model more to have an absolute path or URI; got base_path()=%s"
            % relative) in message
    assert _status(served, "more") == NOT_FOUND
    assert _predict(served, "tiny") == 2
    assert not model_config.is_relative("gs://bucket/m")  # a URI is not relative


def test_reload_refuses_model_type_with_model_platform(served, tiny):
    both = _entry("tiny", tiny, 'model_type: TENSORFLOW model_platform: "tensorflow"')
    code, message = _reload(served, _config(both))
    assert code == INVALID
    assert ("Illegal setting both ModelServerConfig::model_type (deprecated) and "
            "ModelServerConfig::model_platform, model name is tiny") in message
    # the deprecated field alone still names the tensorflow platform
    assert _reload(served, _config(_entry("tiny", tiny, "model_type: TENSORFLOW")))[0] == \
        grpc.StatusCode.OK
    assert _predict(served, "tiny") == 2


def test_reload_refuses_a_platform_change_before_looking_the_platform_up(served, tiny):
    code, message = _reload(served, _config(_entry("tiny", tiny, 'model_platform: "tflite"')))
    assert code == INVALID
    assert message.endswith("Illegal to change a model's platform. For model tiny platform "
                            "was tensorflow and new platform requested is tflite")
    # a new model with a platform this server lacks is refused by the lookup
    code, message = _reload(served, _config(_entry("tiny", tiny),
                                            _entry("other", tiny, 'model_platform: "x"')))
    assert code == INVALID and "Model other requests unsupported platform x" in message
    assert _predict(served, "tiny") == 2


def test_reload_with_an_empty_model_list_unloads_every_model(served, tiny):
    # no config kind at all is not a model list (TF Serving's ModelServiceImpl)
    assert _reload(served, model_server_config_pb2.ModelServerConfig())[0] == INVALID
    assert _predict(served, "tiny") == 2
    empty = model_server_config_pb2.ModelServerConfig()
    empty.model_config_list.SetInParent()
    assert _reload(served, empty) == (grpc.StatusCode.OK, "")
    wait_until(lambda: _status(served, "tiny") == {2: (END, 0)}, message="version 2 END")
    assert _predict(served, "tiny") == NOT_FOUND
    assert _reload(served, _config(_entry("tiny", tiny)))[0] == grpc.StatusCode.OK
    assert _predict(served, "tiny") == 2


# --- start-up ---------------------------------------------------------------------------

def test_start_refuses_a_relative_model_base_path():
    code, stderr = _start_fails(["--model_base_path=models/m", "--model_name=m"])
    assert code != 0
    assert "Expected model m to have an absolute path or URI; got base_path()=models/m" \
        in stderr


def test_start_exits_when_the_only_version_cannot_load(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)  # an empty version: its load fails
    code, stderr = _start_fails(["--model_base_path=%s" % (tmp_path / "m"), "--model_name=m",
                                 "--max_num_load_retries=0"])
    assert code != 0
    assert "1 model(s) did not become available: {{{name: m version: 1} due to error: " \
        in stderr


def test_start_refuses_a_config_file_with_a_relative_path_or_both_platform_fields(
        tmp_path, tiny):
    config = tmp_path / "models.config"
    config.write_text("model_config_list { %s }" % _entry("m", "models/m"))
    with pytest.raises(user_errors.UserError, match=r"Expected model m to have an absolute "
                       r"path or URI; got base_path\(\)=models/m"):
        server_lib.ModelServer(model_config_file=str(config), port=server_lib.PICK_FREE_PORT,
                               rest_api_port=0)
    config.write_text("model_config_list { %s }" % _entry(
        "m", tiny, 'model_type: TENSORFLOW model_platform: "tensorflow"'))
    with pytest.raises(user_errors.UserError, match="Illegal setting both"):
        server_lib.ModelServer(model_config_file=str(config), port=server_lib.PICK_FREE_PORT,
                               rest_api_port=0)


def test_empty_model_list_starts_and_a_polled_edit_unloads_every_model(tmp_path, tiny):
    config = tmp_path / "models.config"
    config.write_text("model_config_list {}")
    server, channel = _serve(model_config_file=str(config),
                             model_config_file_poll_wait_seconds=1)
    try:
        assert _predict(channel, "tiny") == NOT_FOUND  # serving, with no model
        config.write_text("model_config_list { %s }" % _entry("tiny", tiny))
        wait_until(lambda: _predict(channel, "tiny") == 2, message="tiny served")
        config.write_text("")  # no config kind: ServerCore takes no action
        time.sleep(2.5)  # two polls
        assert _predict(channel, "tiny") == 2
        config.write_text("model_config_list { }")
        wait_until(lambda: _status(channel, "tiny") == {2: (END, 0)}, message="tiny unloaded")
        assert _predict(channel, "tiny") == NOT_FOUND
    finally:
        _stop(server, channel)


# --- versions on disk -----------------------------------------------------------------

def _transitions(records, name):
    """["1 UNLOADING", "3 LOADING", ...] of model `name` from the server's log."""
    prefix = "model %s version " % name
    return [r.getMessage()[len(prefix):].split(" (")[0] for r in records
            if r.getMessage().startswith(prefix) and ": " in r.getMessage()
            and r.getMessage().split(": ")[1].split(" ")[0] in ("LOADING", "UNLOADING")]


def test_unaspired_version_unloads_before_a_new_one_loads_when_another_serves(
        tmp_path, tiny, caplog):
    base = _copy(tiny, tmp_path / "m", 1, 2)
    policy = "model_version_policy { latest { num_versions: 2 } }"
    server, channel = _serve(model_config.served_models_from_proto(
        _config(_entry("m", base, policy)), "test"), file_system_poll_wait_seconds=POLL)
    try:
        assert set(_status(channel, "m")) == {1, 2}
        caplog.clear()
        with caplog.at_level(logging.INFO):
            _copy(tiny, base, 3)  # latest 2 is now {2, 3}: 2 keeps serving
            wait_until(lambda: _status(channel, "m") == {1: (END, 0), 2: (AVAILABLE, 0),
                                                         3: (AVAILABLE, 0)},
                       message="3 served, 1 gone")
        assert _transitions(caplog.records, "m") == ["1: UNLOADING", "3: LOADING"]
    finally:
        _stop(server, channel)


def test_new_version_loads_before_the_only_served_one_unloads(tmp_path, tiny, caplog):
    base = _copy(tiny, tmp_path / "m", 1)
    server, channel = _serve([model_config.ServedModel("m", base)],
                             file_system_poll_wait_seconds=POLL)
    try:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            _copy(tiny, base, 2)  # latest 1: nothing else would serve while 1 unloads
            wait_until(lambda: _status(channel, "m") == {1: (END, 0), 2: (AVAILABLE, 0)},
                       message="2 served, 1 gone")
        assert _transitions(caplog.records, "m") == ["2: LOADING", "1: UNLOADING"]
    finally:
        _stop(server, channel)


def test_every_int64_named_child_is_a_version_and_a_failed_one_keeps_the_last(
        tmp_path, tiny):
    base = _copy(tiny, tmp_path / "m", 1)
    server, channel = _serve([model_config.ServedModel("m", base)],
                             file_system_poll_wait_seconds=POLL)
    try:
        # an export in progress (export/versions.py's temporary name) is no version
        os.mkdir(os.path.join(base, "%s%d" % (export_versions.TEMP_PREFIX, 5)))
        os.mkdir(os.path.join(base, "not-a-number"))
        os.mkdir(os.path.join(base, "2"))  # empty: aspired (latest), and its load fails
        wait_until(lambda: _status(channel, "m").get(2, (None,))[0] == END,
                   message="version 2 ends")
        status = _status(channel, "m")
        assert set(status) == {1, 2}
        assert status[1] == (AVAILABLE, 0) and status[2][1] != 0  # END with its error
        assert _predict(channel, "m") == 1  # the previous latest keeps serving
        assert _predict(channel, "m", 2) == NOT_FOUND
    finally:
        _stop(server, channel)


def test_a_base_path_that_disappears_changes_nothing(tmp_path, tiny):
    base = _copy(tiny, tmp_path / "m", 1)
    server, channel = _serve([model_config.ServedModel("m", base)],
                             file_system_poll_wait_seconds=POLL)
    try:
        os.rename(base, base + ".away")  # unmounted, renamed
        for _ in range(5):  # polls keep failing; nothing changes
            time.sleep(POLL)
            assert _predict(channel, "m") == 1
            assert _status(channel, "m") == {1: (AVAILABLE, 0)}
        os.rename(base + ".away", base)
        _copy(tiny, base, 2)
        wait_until(lambda: _predict(channel, "m") == 2, message="polling resumes")
    finally:
        _stop(server, channel)


@pytest.mark.parametrize("retry", [False, True])
def test_a_failed_aspired_version_is_not_retried_when_its_files_change(tmp_path, tiny, retry):
    base = _copy(tiny, tmp_path / "m", 1)
    server, channel = _serve([model_config.ServedModel("m", base)],
                             file_system_poll_wait_seconds=POLL,
                             retry_failed_versions_on_change=retry)
    try:
        broken = os.path.join(base, "2")
        os.mkdir(broken)
        with open(os.path.join(broken, "saved_model.pb"), "wb") as handle:
            handle.write(b"not a SavedModel")
        wait_until(lambda: _status(channel, "m").get(2, (None,))[0] == END,
                   message="version 2 ends")
        shutil.rmtree(broken)  # fixed in one step, between two polls: still aspired
        shutil.copytree(os.path.join(tiny, "1"), broken + ".new")
        os.rename(broken + ".new", broken)
        if retry:  # --retry_failed_versions_on_change (slimserve only)
            wait_until(lambda: _predict(channel, "m") == 2, message="version 2 retried")
        else:  # TF Serving (ReloadAspiredError): not loaded again while aspired
            for _ in range(5):
                time.sleep(POLL)
                assert _predict(channel, "m") == 1
            assert _status(channel, "m")[2][0] == END
    finally:
        _stop(server, channel)
