"""Errors that name the fix, for a newcomer's first hour: a base path that is missing,
empty, or a version folder given as the base path; a request for a model the server does
not serve; a client pointed at a port where nothing listens.

The hints ride on answers only with --error_hints (TF Serving's exact messages
otherwise, the hints then in the server log); these tests turn it on."""
import logging
import os
import shutil
import socket
import threading

import grpc
import pytest

from slimserve.serving import server as server_lib
from slimserve.serving.clients import client as client_lib
from slimserve.serving.config import model_config
from slimserve.serving.core import version_dirs
from slimserve.testing.commands import run_command
from slimserve.testing.servers import serve_in_process
from tests.helpers import ROOT, rest_json, run_cli, start_server_process
from slimserve.testing.tiny_models import write_tiny_model

SERVABLE_NOT_FOUND = "Servable not found for request: Latest(%s)"


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """One folder per case; `good` serves version 1 of the tiny model."""
    root = tmp_path_factory.mktemp("bases")
    write_tiny_model(str(root / "good"), 1)
    (root / "empty").mkdir()
    write_tiny_model(str(root / "flowers"), 3)  # flowers/3/saved_model.pb
    write_tiny_model(str(root / "export" / "final"), 1)  # a run's export/, one level up
    return root


CASES = {  # model name -> (base path under `bases`, what its message must say)
    "missing": ("nowhere", ["does not exist", "folder that holds numbered version folders"]),
    "empty": ("empty", ["is empty", "export a model into it"]),
    "version": ("flowers/3", ["holds saved_model.pb itself", "it is one version, not a base "
                              "path", "give its parent"]),
    "toohigh": ("export", ["did you mean", "its sub-folder final holds versions"]),
}


@pytest.fixture(scope="module")
def server(bases):
    models = [model_config.ServedModel("good", str(bases / "good"))] + [
        model_config.ServedModel(name, str(bases / path)) for name, (path, _) in CASES.items()]
    instance = serve_in_process(models, error_hints=True)
    yield instance
    instance.stop()


def _rest(server, path):
    return rest_json(server.rest_api_port, path)


def test_each_base_path_problem_has_its_own_message(bases):
    messages = {name: version_dirs.diagnose_base_path(str(bases / path))
                for name, (path, _) in CASES.items()}
    for name, (_, phrases) in CASES.items():
        for phrase in phrases:
            assert phrase in messages[name], (name, messages[name])
    assert len(set(messages.values())) == len(CASES)
    assert version_dirs.diagnose_base_path(str(bases / "good")) == ""
    assert "--model_base_path" in messages["missing"]
    assert messages["version"].endswith("give its parent %s as the base path"
                                        % (bases / "flowers"))


def test_get_model_status_says_what_is_wrong_with_the_base_path(server, bases):
    for name, (_, phrases) in CASES.items():
        client = client_lib.Client("127.0.0.1:%d" % server.port, model_name=name, retries=0)
        with pytest.raises(grpc.RpcError) as caught:
            client.status()
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        details = caught.value.details()
        assert details.startswith("Could not find any versions of model %s: base path "
                                  % name), details
        for phrase in phrases:
            assert phrase in details, details
        assert str(bases) not in details  # the server's paths stay on the server
        status, body = _rest(server, "/v1/models/%s" % name)
        assert status == 404 and body["error"] == details
        with pytest.raises(grpc.RpcError) as caught:  # a request says it too
            client.predict({"x": [[1.0, 2.0]]})
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert caught.value.details().startswith(SERVABLE_NOT_FOUND % name + ": base path ")


def test_the_log_says_it_once_and_again_when_it_changes(bases, caplog):
    caplog.set_level(logging.INFO)
    base = bases / "later"
    base.mkdir()
    instance = serve_in_process([model_config.ServedModel("later", str(base))],
                                rest_api_port=0, error_hints=True)
    try:
        for _ in range(3):
            instance.manager.poll()
        write_tiny_model(str(base / "sub"), 1)  # base/sub/1: one level too deep
        instance.manager.poll()
        instance.manager.poll()
        shutil.move(str(base / "sub" / "1"), str(base / "1"))
        instance.manager.poll()
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(
            "model later: ")]
        assert len(said) == 3, said  # one line per change, none per poll
        assert said[0].startswith("model later: base path %s is empty" % base)
        assert "did you mean %s?" % (base / "sub") in said[1]
        assert said[2] == "model later: %s now holds a version" % base
        assert any("model later has no loadable version yet" in r.getMessage()
                   for r in caplog.records)
        assert instance.manager.available_versions("later") == [1]
        assert instance.manager.diagnosis("later") == ""
    finally:
        instance.stop()


def test_server_started_on_a_version_folder_says_so(bases):
    """The newcomer's mistake: --model_base_path=models/flowers/3."""
    process, port, _ = start_server_process(
        ["--model_name=flowers", "--model_base_path=%s" % (bases / "flowers" / "3"),
         "--rest_api_port=0", "--file_system_poll_wait_seconds=1", "--error_hints"])
    try:
        out = run_command("slimserve.cli.client", "status", "--server=127.0.0.1:%d" % port,
                          "--model_name=flowers")
    finally:
        process.terminate()
        _, err = process.communicate(timeout=60)
    assert "model flowers: base path %s holds saved_model.pb itself: it is one version, " \
        "not a base path; give its parent %s as the base path" % (
            bases / "flowers" / "3", bases / "flowers") in err
    assert "its base path is polled every 1 s" in err
    assert out.code == 1
    assert out.stderr.strip().splitlines() == [
        "slimserve-client: NOT_FOUND: Could not find any versions of model flowers: base "
        "path .../3 holds saved_model.pb itself: it is one version, not a base path; give "
        "its parent .../flowers as the base path"]


def test_unknown_model_is_told_which_models_exist(tmp_path):
    write_tiny_model(str(tmp_path / "m"), 1)
    long_name = "x" * 100
    names = ["model%02d" % i for i in range(11)] + [long_name]
    instance = serve_in_process([model_config.ServedModel(n, str(tmp_path / "m"))
                                 for n in names[:1]] +
                                [model_config.ServedModel(n, str(tmp_path / "none"))
                                 for n in names[1:]], error_hints=True)
    try:
        client = client_lib.Client("127.0.0.1:%d" % instance.port, model_name="nope", retries=0)
        with pytest.raises(grpc.RpcError) as caught:
            client.predict({"x": [[1.0, 2.0]]})
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        details = caught.value.details()
        # TF Serving's wording first: its tools match it.
        assert details == (SERVABLE_NOT_FOUND % "nope" + "; this server serves models "
                           + ", ".join(names[:10]) + " and 2 more")
        status, body = _rest(instance, "/v1/models/nope/metadata")
        assert status == 404 and body["error"].startswith(SERVABLE_NOT_FOUND % "nope")
        assert "model00, model01" in body["error"]
        with pytest.raises(grpc.RpcError) as caught:
            client.status()
        assert caught.value.details() == "Could not find any versions of model nope: this " \
            "server serves models " + ", ".join(names[:10]) + " and 2 more"
    finally:
        instance.stop()
    one = serve_in_process([model_config.ServedModel(long_name, str(tmp_path / "m"))],
                           rest_api_port=0, error_hints=True)
    try:
        client = client_lib.Client("127.0.0.1:%d" % one.port, model_name="nope", retries=0)
        with pytest.raises(grpc.RpcError) as caught:
            client.predict({"x": [[1.0, 2.0]]})
        assert caught.value.details() == (SERVABLE_NOT_FOUND % "nope" + "; this server serves "
                                          "model " + "x" * 64 + "...")
    finally:
        one.stop()


def test_client_to_a_port_with_nothing_listening_says_so_in_one_line():
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        target = "127.0.0.1:%d" % bound.getsockname()[1]
        for command in (["status"], ["predict", os.path.join(ROOT, "README.md")]):
            out = run_cli("slimserve.cli.client", *command, "--server=%s" % target,
                          check=False, timeout=300)
            assert out.returncode == 1 and out.stdout == ""
            assert out.stderr.strip().splitlines() == [
                "slimserve-client: nothing is listening on %s (Connection refused): start "
                "slimserve-server (or tensorflow_model_server) there, or point --server at "
                "its gRPC port (8500 by default); --connect_timeout waits longer for one "
                "that is starting" % target]


def test_client_waits_for_a_server_that_is_starting(tmp_path):
    """slimserve-server binds its port before it loads its models: the port accepts
    connections but gives no gRPC answer yet. That is "starting", not "nothing listening":
    the client waits (up to --timeout) instead of giving up after --connect_timeout."""
    write_tiny_model(str(tmp_path / "m"), 1)
    instance = server_lib.ModelServer(
        model_server_config=[model_config.ServedModel("tiny", str(tmp_path / "m"))],
        port=server_lib.PICK_FREE_PORT, rest_api_port=0, file_system_poll_wait_seconds=0)
    timer = threading.Timer(4.0, instance.start)  # bound now, serving in 4 s
    timer.start()
    try:
        out = run_cli("slimserve.cli.client", "status", "--server=127.0.0.1:%d" % instance.port,
                      "--model_name=tiny", "--connect_timeout=0.5", check=False, timeout=300)
    finally:
        timer.join()
        instance.stop()
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "version 1: AVAILABLE"
