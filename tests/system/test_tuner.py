"""slimserve-tune: a small grid end to end on the trained digits export (real server
processes, the real validation split), a candidate that breaks agreement is rejected,
interrupted runs leave no server behind, and the pieces (inputs, search order, choice)
on their own."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import model_pb2
from tensorflow_serving.apis import predict_pb2

from slimserve import conventions
from slimserve import cpu
from slimserve import errors as user_errors
from slimserve.serving.core import batching
from slimserve.serving.observability import request_log
from slimserve.serving.tuning import batching_tuner
from slimserve.serving.tuning import inputs as tuner_inputs
from slimserve.serving.tuning import tuner as tuner_lib
from slimserve.testing.commands import run_command
from slimserve.testing.servers import wait_until
from tests.helpers import ROOT, run_cli

# Validation images each setting's server answers before its load: a sample of the ~360
# is enough for the agreement checks and saves each server a few CPU seconds.
COMPARED = 120
B8 = batching_tuner.Setting(max_batch_size=8, batch_timeout_micros=5000, num_batch_threads=1,
                            max_enqueued_batches=100)


def _validation_count(data_dir):
    pattern = conventions.shard_pattern(data_dir, conventions.VALIDATION)
    return sum(1 for f in tf.io.gfile.glob(pattern) for _ in tf.compat.v1.io.tf_record_iterator(f))


def _table_rows(text):
    return [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
            if line.startswith("| ") and "precision" not in line]


@pytest.mark.cost(44)
def test_small_grid_end_to_end_writes_flags_config_table_and_plot(export_dir, digits_data,
                                                                   tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    flagfile, config, png = out / "server.flags", out / "batching.config", out / "tune.png"
    process = run_cli(
        "slimserve.cli.tune", "--model_base_path", os.path.dirname(export_dir),
        "--data_dir", digits_data, "--latency_budget_ms", 100000, "--concurrency", 4,
        "--requests", 40, "--compare_images", COMPARED, "--precisions", "auto", "--xla",
        "false", "--runtimes", "tensorflow", "--max_batch_sizes", 8,
        "--batch_timeouts_micros", 5000, "--num_batch_threads", 1, "--nocompare_documented",
        "--output_flags", flagfile, "--output_config", config, "--output_png", png,
        "--work_dir", tmp_path, "--noprogress", "--max_minutes", 10, timeout=900)
    rows = _table_rows(process.stdout)
    precisions = ["fp32", "bf16"] if cpu.cpu_supports_bf16() else ["fp32"]
    # The baseline (fp32, no batching), then each precision at the one batching setting.
    assert [(r[0], r[2]) for r in rows] == [("fp32", "off")] + [(p, "8") for p in precisions]
    images = min(COMPARED, _validation_count(digits_data))
    assert "compared on %d validation images" % images in process.stdout
    assert rows[0][11] == "1.0000 (%d)" % images and rows[0][13] in ("baseline", "**chosen**")
    assert all(r[11].endswith("(%d)" % images) for r in rows)  # the same inputs for all
    assert all(float(r[9]) > 1.0 for r in rows[1:])  # four clients and a 5 ms window batch
    chosen = [r for r in rows if r[13] == "**chosen**"]
    assert len(chosen) == 1 and float(chosen[0][11].split()[0]) >= 0.995

    lines = [l for l in flagfile.read_text().splitlines() if l and not l.startswith("#")]
    assert lines[:2] == ["--model_name=resnet",
                         "--model_base_path=%s" % os.path.dirname(export_dir)]
    if chosen[0][2] == "8":
        assert "--enable_batching=true" in lines
        assert "--batching_parameters_file=%s" % config in lines
        assert batching.BatchingParameters.from_file(str(config)).max_batch_size == 8
        assert "agreement" in config.read_text()  # the measured table rides along
    assert ("--mixed_precision=bfloat16" in lines) == (chosen[0][0] == "bf16")
    assert "tensorflow_model_server --model_name=resnet" in flagfile.read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The flagfile is one slimserve-server parses (every flag known, every value valid).
    parsed = run_cli("slimserve.cli.server", "--flagfile=%s" % flagfile, "--version")
    assert "slimserve-server" in parsed.stdout


def _swapped_classes_model(export_dir, base_path, first=3, second=4):
    """The trained model with two classes' probabilities swapped: it disagrees exactly
    where the original picks one of the two, so the expected agreement is known. Built in
    the exported graph itself (a gather after the softmax), so every other number is the
    original's bit for bit."""
    path = os.path.join(base_path, "1")
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        signature = meta_graph.signature_def[conventions.DEFAULT_SIGNATURE]
        tensor = lambda info: graph.get_tensor_by_name(info.name)  # noqa: E731
        original = tensor(signature.outputs[conventions.PROBABILITIES])
        order = list(range(original.shape[-1]))
        order[first], order[second] = second, first
        probabilities = tf.gather(original, order, axis=1)
        builder = tf.compat.v1.saved_model.Builder(path)
        builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
            conventions.DEFAULT_SIGNATURE: tf.compat.v1.saved_model.predict_signature_def(
                {k: tensor(v) for k, v in signature.inputs.items()},
                {conventions.PROBABILITIES: probabilities,
                 conventions.CLASSES: tf.argmax(probabilities, axis=1)})})
        builder.save()
    return base_path


@pytest.mark.cost(34)
def test_a_setting_that_breaks_agreement_is_rejected(export_dir, digits_data, tmp_path):
    # No serving knob changes this model's classes deterministically on every CPU (bf16
    # agrees on the trained digits), so the perturbed setting serves a test-only candidate
    # model through the setting's own server flags: exactly what a knob that changed
    # predictions would look like to the guard.
    candidate = _swapped_classes_model(export_dir, str(tmp_path / "swapped"))
    sources = tuner_inputs.Sources(data_dir=digits_data, compare_limit=COMPARED)
    tuner = tuner_lib.Tuner(os.path.dirname(export_dir), "resnet", sources, concurrency=4,
                            requests=20, scratch_dir=str(tmp_path))
    perturbed = tuner_lib.Setting(extra_flags=("--model_base_path=%s" % candidate,))
    rows = [tuner.measure(tuner_lib.BASELINE), tuner.measure(perturbed)]
    baseline, broken = rows
    swapped = sum(answer[0] in ("3", "4") for answer in tuner.baseline_answers)
    assert 0 < swapped < len(tuner.baseline_answers) == baseline["compared"] == broken["compared"]
    assert baseline["agreement"] == 1.0
    assert broken["agreement"] == pytest.approx(1 - swapped / len(tuner.baseline_answers))
    assert broken["errors"] == 0 and broken["max_abs_dp"] > 0.5
    assert not tuner_lib.accepted(broken, 0.995)
    # Rejected whatever its speed: even as the fastest row it is not chosen.
    broken_fast = dict(broken, images_per_s=baseline["images_per_s"] * 10)
    assert tuner_lib.choose([baseline, broken_fast], 1e9) is baseline
    table = tuner_lib.table([baseline, broken_fast], 1e9, 0.995, baseline)
    assert "rejected: agreement < 0.995" in table.splitlines()[-1]
    assert "%.4f" % broken["agreement"] in table.splitlines()[-1]


def _servers_under(token):
    """Pids of live slimserve-server processes whose command line mentions `token`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as handle:
                command = handle.read().decode("utf-8", "replace")
            with open("/proc/%s/stat" % name) as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if "slimserve.cli.server" in command and token in command and state != "Z":
            found.append(int(name))
    return found


def _children(pid):
    children = []
    for name in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % name) as handle:
                if name.isdigit() and int(handle.read().rsplit(")", 1)[1].split()[1]) == pid:
                    children.append(int(name))
        except (OSError, ValueError):
            continue
    return children


def _start_tuner(module, export_dir, tmp_path, *args):
    """The command on a grid far too long to finish, stderr to a file."""
    log = open(tmp_path / "tuner.stderr", "w+")
    process = subprocess.Popen(
        [sys.executable, "-m", module, "--model_base_path", os.path.dirname(export_dir),
         "--latency_budget_ms", "1000", "--concurrency", "2", "--requests", "100000",
         "--max_seconds", "600", "--max_batch_sizes", "8", "--batch_timeouts_micros", "0",
         "--num_batch_threads", "1", "--noprogress", "--work_dir", str(tmp_path),
         "--output_config", str(tmp_path / "b.config"), "--output_png", ""] + list(args),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
    return process, log


@pytest.mark.cost(19)
def test_interrupted_tuner_stops_its_servers(export_dir, digits_data, digits_dir, tmp_path):
    token = str(tmp_path)  # every child's command line names its scratch folder under it
    # SIGTERM while a setting is being measured: the server goes, the tuner exits 143.
    process, log = _start_tuner("slimserve.cli.tune", export_dir, tmp_path, "--data_dir",
                                digits_data, "--output_flags", str(tmp_path / "s.flags"))
    try:
        wait_until(lambda: "serving on gRPC port" in open(log.name).read(), timeout=300,
                   message="the first setting's server")
        servers = _servers_under(token)
        assert len(servers) == 1 and set(servers) <= set(_children(process.pid))
        time.sleep(1.0)  # the comparison requests are in flight
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 128 + signal.SIGTERM
        assert "interrupted by SIGTERM" in open(log.name).read()
        assert _servers_under(token) == []  # stopped and reaped before the tuner exited
    finally:
        process.kill()
        process.wait()

    # SIGKILL, which no handler sees: the kernel stops the child (PR_SET_PDEATHSIG).
    token = os.path.join(str(tmp_path), "killed")
    os.mkdir(token)
    process, log = _start_tuner("slimserve.cli.tune_batching", export_dir,
                                tmp_path / "killed", "--images", digits_dir)
    try:
        servers = wait_until(lambda: _servers_under(token), timeout=120,
                             message="the server child to start")
        assert set(servers) <= set(_children(process.pid))
        process.kill()
        process.wait()
        wait_until(lambda: not _servers_under(token), timeout=30,
                   message="the orphaned server to die with its tuner")
    finally:
        process.kill()
        process.wait()
        for pid in _servers_under(token):  # never leave one behind, even on failure
            os.kill(pid, signal.SIGKILL)


def test_signature_name_is_checked_and_used_before_any_server_starts(export_dir, digits_data):
    base = os.path.dirname(export_dir)
    missing = run_command("slimserve.cli.tune", "--model_base_path", base, "--data_dir",
                          digits_data, "--latency_budget_ms", 100, "--signature_name", "nope")
    assert missing.code == 1 and "Traceback" not in missing.stderr
    assert ("--signature_name=nope: the model at %s has signatures classify, embeddings, "
            "predict_images, serving_default" % base) in missing.stderr
    # Each signature's own input key and form: images, examples, or refused by name.
    assert tuner_inputs.kind_for(base, "serving_default") == (tuner_inputs.IMAGES,
                                                              conventions.IMAGE_BYTES)
    assert tuner_inputs.kind_for(base, "classify") == (tuner_inputs.EXAMPLES,
                                                       conventions.EXAMPLES)
    with pytest.raises(user_errors.UserError, match="predict_images takes images .DT_FLOAT."):
        tuner_inputs.kind_for(base, "predict_images")


def test_comparison_inputs_from_the_validation_split_are_bounded(digits_data):
    images = tuner_inputs.from_data_dir(digits_data, tuner_inputs.IMAGES, 7, 1 << 30)
    assert len(images) == 7 and all(i[:2] == b"\xff\xd8" or i[:4] == b"\x89PNG" for i in images)
    examples = tuner_inputs.from_data_dir(digits_data, tuner_inputs.EXAMPLES, 3, 1 << 30)
    parsed = tf.train.Example.FromString(examples[0])
    assert parsed.features.feature[conventions.ENCODED].bytes_list.value[0] == images[0]
    with pytest.raises(user_errors.UserError, match="left of --max_input_mb"):
        tuner_inputs.from_data_dir(digits_data, tuner_inputs.IMAGES, 1000, 2000)


def test_comparison_inputs_from_request_logs_split_batches_and_keep_the_signature(tmp_path):
    prefix = str(tmp_path / "logs" / "resnet")
    logger = request_log.RequestLogger(prefix, 1.0)
    for signature, values in (("serving_default", [b"a", b"b"]), ("other", [b"x"]),
                              ("serving_default", [b"c"])):
        request = predict_pb2.PredictRequest()
        request.model_spec.name, request.model_spec.signature_name = "resnet", signature
        request.inputs[conventions.IMAGE_BYTES].CopyFrom(
            tf.make_tensor_proto(np.array(values, dtype=object)))
        logger.maybe_log("predict", request, predict_pb2.PredictResponse(),
                         model_pb2.ModelSpec(name="resnet", signature_name=signature))
    logger.close()
    rows = tuner_inputs.from_logs(prefix + "*", "serving_default", tuner_inputs.IMAGES,
                                  conventions.IMAGE_BYTES, 100, 1 << 20)
    assert rows == [b"a", b"b", b"c"]
    assert tuner_inputs.from_logs(prefix + "*", "serving_default", tuner_inputs.IMAGES,
                                  conventions.IMAGE_BYTES, 2, 1 << 20) == [b"a", b"b"]
    with pytest.raises(user_errors.UserError, match="no logged request to signature 'classify'"):
        tuner_inputs.from_logs(prefix + "*", "classify", tuner_inputs.IMAGES,
                               conventions.IMAGE_BYTES, 100, 1 << 20)


class _Measurer:
    """Stands in for the server-measuring Tuner to check the search order alone: bf16 is
    the fastest pair but disagrees, so stage 2 must run under fp32 with XLA."""

    def __init__(self):
        self.measured = []

    def measure(self, setting):
        self.measured.append(setting)
        speed = {("fp32", False): 10.0, ("fp32", True): 20.0, ("bf16", False): 40.0,
                 ("bf16", True): 30.0}[(setting.precision, setting.xla)]
        row = {"precision": setting.precision, "xla": setting.xla, "errors": 0, "p99_ms": 1.0,
               "images_per_s": speed + (setting.batching.max_batch_size if setting.batching
                                        else 0),
               "agreement": 0.9 if setting.precision == "bf16" else 1.0}
        return row


def test_staged_search_tunes_batching_under_the_fastest_accepted_pair():
    grid = list(batching_tuner.grid([4, 16], [0, 1000], [1], [100]))
    reference = batching_tuner.documented_cpu_start(2)
    measurer = _Measurer()
    rows = tuner_lib.sweep(measurer, ["fp32", "bf16"], [False, True], grid, [reference])
    probe = tuner_lib.probe_batching(grid)
    assert probe == batching_tuner.Setting(16, 1000, 1, 100)
    assert measurer.measured[0] == tuner_lib.BASELINE
    assert measurer.measured[1:5] == [tuner_lib.Setting(p, x, probe) for p in ("fp32", "bf16")
                                      for x in (False, True)]
    assert measurer.measured[5:] == [tuner_lib.Setting("fp32", True, b) for b in grid + [reference]
                                     if b != probe]
    assert len(rows) == tuner_lib.planned(["fp32", "bf16"], [False, True], grid, [reference])
    full = _Measurer()
    tuner_lib.sweep(full, ["fp32"], [False, True], grid, search="full", baseline=False)
    assert len(full.measured) == tuner_lib.planned(["fp32"], [False, True], grid, search="full",
                                                   baseline=False) == 8
    # A deadline that has passed starts nothing more.
    assert len(tuner_lib.sweep(_Measurer(), ["fp32"], [False], grid, deadline=0)) == 0


def test_settings_spell_their_flags_for_both_servers():
    setting = tuner_lib.Setting("bf16", True, B8)
    assert setting.server_flags("/b.config") == [
        "--enable_batching=true", "--batching_parameters_file=/b.config",
        "--mixed_precision=bfloat16", "--xla_cpu_compilation_enabled=true"]
    assert tuner_lib.BASELINE.server_flags() == []
    # tensorflow_model_server gets the same line minus slimserve's own flags.
    assert tuner_lib.tfserving_flags(["--model_name=m", "--bind_address=0.0.0.0",
                                      "--rest_max_body_bytes=9", "--enable_batching=true"]) == [
        "--model_name=m", "--enable_batching=true"]
    with pytest.raises(ValueError, match="precision must be one of"):
        tuner_lib.Setting("fp16")


def test_a_setting_whose_server_cannot_start_is_a_failed_row(export_dir, digits_dir, tmp_path):
    tuner = tuner_lib.Tuner(os.path.dirname(export_dir), "resnet",
                            tuner_inputs.Sources(images=os.path.join(digits_dir, "3")),
                            guard=False, scratch_dir=str(tmp_path))
    row = tuner.measure(tuner_lib.Setting(extra_flags=("--no_such_server_flag=1",)))
    assert "did not start" in row["failure"] and row["errors"] == 1
    assert "Unknown command line flag 'no_such_server_flag'" in row["failure"]
    assert tuner_lib.choose([row], 1e9) is None
    assert "failed: slimserve-server did not start" in tuner_lib.table([row], 1e9, 0.995)
