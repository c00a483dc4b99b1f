"""Reloads that tell the truth and stay in their lane (issue 21, class 2): a failing
HandleReloadConfigRequest or config-file edit changes nothing, a network client cannot
pick where the server writes (--request_log_dir), the config poller survives any edit,
and a log directory that cannot be created is one clear line. Real gRPC on loopback."""
import os
import shutil
import threading

import grpc
import pytest
from google.protobuf import text_format
from tensorflow_serving.apis import model_management_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from slimserve.serving import server as server_lib
from slimserve.serving.config import model_config
from slimserve.serving.observability import request_log
from slimserve.testing import tiny_models
from slimserve.testing.servers import wait_until
from tests.helpers import run_cli

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    tiny, other = str(root / "tiny"), str(root / "other")
    tiny_models.write_tiny_model(tiny, 1)
    tiny_models.write_tiny_model(tiny, 2)
    tiny_models.write_tiny_model(other, 7)
    return tiny, other


def _entry(name, base, prefix=None, policy=""):
    logging_config = ""
    if prefix is not None:
        logging_config = ('logging_config { log_collector_config { type: "file" '
                          'filename_prefix: "%s" } sampling_config { sampling_rate: 1.0 } }'
                          % prefix)
    return ('config { name: "%s" base_path: "%s" model_platform: "tensorflow" %s %s }'
            % (name, base, policy, logging_config))


def _config_text(*entries):
    return "model_config_list { %s }" % " ".join(entries)


def _config(*entries):
    return text_format.Parse(_config_text(*entries),
                             model_server_config_pb2.ModelServerConfig())


_predict = tiny_models.predict_version


def _reload(channel, *entries):
    request = model_management_pb2.ReloadConfigRequest()
    request.config.CopyFrom(_config(*entries))
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    try:
        stub.HandleReloadConfigRequest(request, timeout=120)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as error:
        return error.code(), error.details()


def _server(tmp_path, *entries, **options):
    config_file = tmp_path / "models.config"
    config_file.write_text(_config_text(*entries))
    options.setdefault("file_system_poll_wait_seconds", 0)
    server = server_lib.ModelServer(
        model_config_file=str(config_file), port=server_lib.PICK_FREE_PORT, rest_api_port=0,
        enable_model_warmup=False, **options).start()
    return server, config_file


def test_a_reload_whose_log_directory_fails_changes_nothing(bases, tmp_path):
    tiny, other = bases
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a-file").write_text("not a directory")
    server, _ = _server(tmp_path, _entry("tiny", tiny, "tiny"), request_log_dir=str(logs))
    try:
        with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
            assert _predict(channel, "tiny") == 2
            # The new model would load, but its log directory cannot be created: refused
            # before anything is loaded or unloaded, naming the model and the prefix.
            code, details = _reload(channel, _entry("other", other, "a-file/other"))
            assert code == INVALID, details
            assert "model other" in details and "a-file/other" in details
            assert str(tmp_path) not in details  # no server path
            assert _predict(channel, "tiny") == 2
            assert _predict(channel, "other") == grpc.StatusCode.NOT_FOUND
            assert server.request_logs.loggers["tiny"].filename_prefix == str(logs / "tiny")
    finally:
        server.stop()


def test_a_reload_that_fails_to_load_changes_no_kept_model(bases, tmp_path):
    tiny, _ = bases
    server, _ = _server(tmp_path, _entry("tiny", tiny))
    try:
        with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
            assert _predict(channel, "tiny") == 2
            # A kept model's new policy is not applied when another model of the same
            # reload fails to load: version 2 keeps serving, version 1 stays unloaded.
            code, details = _reload(
                channel, _entry("tiny", tiny, None,
                                "model_version_policy { specific { versions: 1 } }"),
                _entry("missing", str(tmp_path / "no-such-model")))
            assert code == grpc.StatusCode.UNKNOWN and str(tmp_path) not in details
            assert "missing" in details
            assert _predict(channel, "tiny") == 2
            assert server.manager.available_versions("tiny") == [2]
            assert _predict(channel, "missing") == grpc.StatusCode.NOT_FOUND
    finally:
        server.stop()


def test_request_log_dir_confines_every_prefix(bases, tmp_path):
    tiny, other = bases
    logs = tmp_path / "logs"
    server, _ = _server(tmp_path, _entry("tiny", tiny, "tiny/requests"),
                        request_log_dir=str(logs))
    attacker = tmp_path / "attacker"
    try:
        with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
            assert _predict(channel, "tiny") == 2
            os.symlink(attacker, logs / "link")  # a symlink inside leading out
            for prefix in (str(attacker / "x"), "../attacker/x", "sub/../../attacker/x",
                           "gs://bucket/x", "link/x", str(logs / "link" / "x")):
                code, details = _reload(channel, _entry("tiny", tiny),
                                        _entry("other", other, prefix))
                assert code == INVALID, (prefix, details)
                assert "model other" in details and "filename_prefix" in details, details
            assert not attacker.exists()
            assert _predict(channel, "other") == grpc.StatusCode.NOT_FOUND
            # A relative prefix goes under the directory; so does an absolute one inside it.
            code, details = _reload(channel, _entry("tiny", tiny, str(logs / "t2")),
                                    _entry("other", other, "canary/other"))
            assert code == grpc.StatusCode.OK, details
            assert _predict(channel, "other") == 7 and _predict(channel, "tiny") == 2
    finally:
        server.stop()
    assert len(request_log.read_logs(str(logs / "tiny" / "requests*"))) == 1
    assert len(request_log.read_logs(str(logs / "t2*"))) == 1
    assert len(request_log.read_logs(str(logs / "canary" / "other*"))) == 1


def test_without_request_log_dir_a_reload_cannot_pick_a_new_location(bases, tmp_path):
    tiny, other = bases
    operator = str(tmp_path / "operator" / "tiny")
    server, _ = _server(tmp_path, _entry("tiny", tiny, operator))
    elsewhere = tmp_path / "elsewhere"
    try:
        with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
            code, details = _reload(channel, _entry("tiny", tiny, str(elsewhere / "x")))
            assert code == INVALID and "--request_log_dir" in details, details
            assert not elsewhere.exists()
            # The operator's location may be reused (here by another model), or dropped.
            code, details = _reload(channel, _entry("tiny", tiny),
                                    _entry("other", other, operator))
            assert code == grpc.StatusCode.OK, details
            assert set(server.request_logs.loggers) == {"other"}
            assert _predict(channel, "other") == 7
    finally:
        server.stop()
    assert len(request_log.read_logs(operator + "*")) == 1


def test_the_config_poller_survives_a_failing_edit(bases, tmp_path, caplog):
    tiny, other = bases
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory would be")
    server, config_file = _server(tmp_path, _entry("tiny", tiny),
                                  model_config_file_poll_wait_seconds=1)
    try:
        with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
            config_file.write_text(_config_text(_entry("tiny", tiny),
                                                _entry("other", other, str(blocker / "x"))))
            wait_until(lambda: "Failed to reload --model_config_file" in caplog.text,
                       timeout=60, message="the poller to report the bad edit")
            assert _predict(channel, "other") == grpc.StatusCode.NOT_FOUND
            assert any(t.name == "model-config-poller" for t in threading.enumerate())
            config_file.write_text(_config_text(_entry("tiny", tiny), _entry("other", other)))
            wait_until(lambda: _predict(channel, "other") == 7, timeout=60,
                       message="the next, valid edit to be applied")
            assert _predict(channel, "tiny") == 2
    finally:
        server.stop()


def test_a_log_directory_that_cannot_be_created_is_one_line_at_startup(bases, tmp_path):
    tiny, _ = bases
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory would be")
    config_file = tmp_path / "models.config"
    config_file.write_text(_config_text(_entry("tiny", tiny, str(blocker / "logs" / "x"))))
    failed = run_cli("slimserve.cli.server", "--model_config_file=%s" % config_file,
                     "--port=-1", "--rest_api_port=0", check=False, timeout=300)
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("slimserve-server: --model_config_file %s: model tiny: " %
                           config_file) and "cannot create the request log directory" in last
    failed = run_cli("slimserve.cli.server", "--model_name=tiny", "--model_base_path=%s" % tiny,
                     "--request_log_dir=%s" % (blocker / "logs"), "--port=-1",
                     "--rest_api_port=0", check=False, timeout=300)
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    assert failed.stderr.strip().splitlines()[-1].startswith(
        "slimserve-server: --request_log_dir %s: cannot create it" % (blocker / "logs"))


def test_in_process_configs_are_the_operators(bases, tmp_path):
    """ServedModel lists (tests, the demo) are the operator's config: their prefixes are
    used as given, and later reloads may reuse them."""
    tiny, _ = bases
    prefix = str(tmp_path / "logs" / "tiny")
    from tests.system.test_operations import _logging_config  # pylint: disable=import-outside-toplevel
    server = server_lib.ModelServer(
        model_server_config=[model_config.ServedModel("tiny", tiny,
                                                      logging_config=_logging_config(prefix))],
        port=server_lib.PICK_FREE_PORT, rest_api_port=0, file_system_poll_wait_seconds=0,
        enable_model_warmup=False).start()
    try:
        server.reload_config(_config(_entry("tiny", tiny, prefix)))
        assert server.request_logs.loggers["tiny"].filename_prefix == prefix
    finally:
        server.stop()
    assert os.path.isdir(os.path.dirname(prefix))


def _tree(root):
    """{path: (size, mtime_ns)} of every file and directory under `root`."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            stat = os.lstat(path)
            found[path] = (stat.st_size, stat.st_mtime_ns)
    return found


def test_a_reload_only_reads_the_base_paths_and_warmup_it_names(bases, tmp_path):
    """A ReloadConfigRequest may name any base path (as in TF Serving: it is read, a
    version loaded, its warmup records replayed): nothing is written there or anywhere
    else the request names, `..` in the path included."""
    tiny, _ = bases
    target = tmp_path / "theirs" / "model"
    shutil.copytree(os.path.join(tiny, "2"), target / "5")
    from tests.integration.test_model_lifecycle import _write_warmup  # pylint: disable=import-outside-toplevel
    _write_warmup(str(target / "5"), [[1.0, 2.0]])
    server, _ = _server(tmp_path, _entry("tiny", tiny))
    server.manager.options.warmup = True  # replay the warmup of what the reload names
    before = _tree(tmp_path)
    try:
        with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
            dotted = str(tmp_path / "theirs" / ".." / "theirs" / "model")
            code, details = _reload(channel, _entry("tiny", tiny), _entry("theirs", dotted))
            assert code == grpc.StatusCode.OK, details
            assert _predict(channel, "theirs") == 5
    finally:
        server.stop()
    assert _tree(tmp_path) == before
