"""Tools that take what the model or the user says, not a literal or a guess: the load
generator's input key comes from the served signature (GetModelMetadata), and a
--warmup_from pattern that matches a folder is a one-line error."""
import json
import os
import subprocess

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from slimserve import errors as user_errors
from slimserve.export import warmup
from slimserve.testing.commands import run_command
from slimserve.testing.saved_models import signature, write_saved_model
from tests.helpers import run_cli, start_server_process


def _write_string_model(base):
    """serving_default: `encoded` string [-1] -> `length` int32 [-1]; a model whose one
    string input is not called image_bytes."""
    def build():
        encoded = tf.compat.v1.placeholder(tf.string, [None], name="encoded")
        return {"serving_default": signature({"encoded": encoded},
                                             {"length": tf.strings.length(encoded)})}

    write_saved_model(os.path.join(base, "1"), build)


@pytest.mark.cost(10)
def test_loadtest_sends_to_the_input_the_signature_names(tmp_path):
    """Today every request went to a literal "image_bytes" and failed INVALID_ARGUMENT on
    any model whose input is named otherwise."""
    base = str(tmp_path / "strings")
    _write_string_model(base)
    images = tmp_path / "images"
    images.mkdir()
    for index in range(2):
        Image.fromarray(np.full((8, 8, 3), index * 100, np.uint8)).save(
            str(images / ("%d.png" % index)))
    process, port, _ = start_server_process(
        ["--model_name=strings", "--model_base_path=%s" % base, "--rest_api_port=0",
         "--file_system_poll_wait_seconds=0"],
        prefix=["prlimit", "--as=%d" % (4 * 1024 ** 3)], stderr=subprocess.DEVNULL)
    try:
        common = ["--server", "127.0.0.1:%d" % port, "--model_name", "strings", "--images",
                  images, "--requests", 6, "--concurrency", "1,2"]
        out = run_cli("slimserve.cli.loadtest", *common, "--json")
        levels = [json.loads(line) for line in out.stdout.splitlines()]
        assert [(l["concurrency"], l["requests"], l["errors"]) for l in levels] == [
            (1, 6, {}), (2, 6, {})]
        wrong = run_command("slimserve.cli.loadtest", *common, "--signature_name", "nope")
        assert wrong.code == 1 and wrong.stderr.strip().splitlines()[-1] == (
            "slimserve-loadtest: --signature_name nope: model strings has no such signature "
            "(it has serving_default)")
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_warmup_from_a_folder_is_a_one_line_error(trained_run, digits_data, tmp_path):
    """Today: a FailedPreconditionError traceback ("Is a directory") from the reader."""
    logs = tmp_path / "logs"
    logs.mkdir()
    with pytest.raises(user_errors.UserError, match="--warmup_from=%s matches the folder %s; request "
                       "logs are files" % (logs, logs)):
        warmup.traffic_warmup(str(logs))
    out = run_command("slimserve.cli.export", "--model_dir", trained_run, "--export_base",
                      tmp_path / "export", "--warmup_from", logs)
    assert out.code == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(
        "slimserve-export: --warmup_from=%s matches the folder" % logs)
    assert not os.listdir(tmp_path / "export") if (tmp_path / "export").exists() else True
    # slimserve-train says so before training, not at its first export
    out = run_command("slimserve.cli.train", "--data_dir", digits_data, "--model_dir",
                      tmp_path / "run", "--warmup_from", logs)
    assert out.code == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(
        "slimserve-train: --warmup_from=%s matches the folder" % logs)
    assert not (tmp_path / "run").exists() or not os.listdir(tmp_path / "run")
