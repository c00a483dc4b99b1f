"""slimserve-tune's runtime axis: TensorFlow and OpenVINO candidates measured on the
trained digits export (real server processes, the real validation split), each guarded
by agreement with TensorFlow fp32 and by validation accuracy; the chosen runtime written
as server flags that an in-process server loads and runs on that runtime; which
candidates the CPU and the export allow; the new flags' bounds. Cost: three server
processes on the 32x32 export (one converts it to OpenVINO at load) and two in-process
servers. Skipped where openvino is not installed."""
import os
import shutil

import pytest

from slimserve import cpu
from slimserve import errors as user_errors
from slimserve import fields
from slimserve.cli import tune as tune_cli
from slimserve.cli.tuning import TuningOptions
from slimserve.serving import options as options_lib
from slimserve.serving.core import openvino_model
from slimserve.serving.observability import metrics
from slimserve.serving.tuning import batching_tuner
from slimserve.serving.tuning import run as tuner_run
from slimserve.serving.tuning import tuner as tuner_lib
from slimserve.testing.servers import serve_in_process
from tests.helpers import run_cli

pytest.importorskip("openvino")

COMPARED = 90  # validation images each setting answers before its load
OPENVINO_LABEL = "openvino fp32 streams auto"


def _table_rows(text):
    return [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
            if line.startswith("| ") and "precision" not in line]


def _serve_flagfile(lines, source):
    """An in-process server started from a tuner's server flags -> its runtime metric
    line for model "resnet"."""
    parsed = fields.parse_flag_lines(options_lib.ServerOptions, lines, source)
    server = serve_in_process(None, rest_api_port=0, **{path[-1]: value
                                                         for path, value in parsed.items()})
    try:
        (line,) = [line for line in server.metrics.render().splitlines()
                   if line.startswith(metrics.MODEL_RUNTIME + "{")]
        return line
    finally:
        server.stop()


@pytest.mark.cost(40)
def test_tensorflow_and_openvino_measured_and_the_choice_served(export_dir, digits_data,
                                                                tmp_path):
    flagfile, config = tmp_path / "server.flags", tmp_path / "batching.config"
    model_config_path = tmp_path / "models.config"
    process = run_cli(
        "slimserve.cli.tune", "--model_base_path", os.path.dirname(export_dir),
        "--data_dir", digits_data, "--latency_budget_ms", 100000, "--concurrency", 4,
        "--requests", 40, "--compare_images", COMPARED, "--runtimes", "tensorflow,openvino",
        "--precisions", "fp32", "--xla", "false", "--openvino_precisions", "fp32",
        "--openvino_streams", 0, "--max_batch_sizes", 8, "--batch_timeouts_micros", 5000,
        "--num_batch_threads", 1, "--nocompare_documented", "--output_flags", flagfile,
        "--output_config", config, "--output_png", "", "--work_dir", tmp_path,
        "--output_model_config", model_config_path,
        "--noprogress", "--max_minutes", 10, timeout=900)
    rows = _table_rows(process.stdout)
    # The baseline (TensorFlow fp32, no batching), then each runtime at the one batching.
    assert [(r[0], r[1], r[2]) for r in rows] == [("fp32", "off", "off"), ("fp32", "off", "8"),
                                                  (OPENVINO_LABEL, "-", "8")], process.stdout
    assert "or more than 0.005 below its validation accuracy" in process.stdout
    baseline, _, openvino = rows
    # OpenVINO's fp32 network gives TensorFlow's class on every comparison image, so the
    # same validation accuracy (a real one: the trained model beats chance).
    assert openvino[11] == baseline[11] == "1.0000 (%d)" % COMPARED
    assert openvino[14] == baseline[14] and float(baseline[14]) > 0.2
    assert float(openvino[9]) > 1.0  # four clients and a 5 ms window batch on OpenVINO
    (chosen,) = [r for r in rows if r[13] == "**chosen**"]
    lines = [l for l in flagfile.read_text().splitlines() if l and not l.startswith("#")]
    chose_openvino = chosen[0] == OPENVINO_LABEL
    # The model config names the chosen runtime; the flagfile names the model config.
    assert "--model_config_file=%s" % model_config_path in lines
    assert 'model_platform: "%s"' % ("openvino" if chose_openvino else "tensorflow") in \
        model_config_path.read_text()
    assert "--prefer_openvino_model=true" not in lines
    assert ("--openvino_precision=fp32" in lines) == chose_openvino
    if chose_openvino:
        assert "TF Serving has no OpenVINO runtime" in flagfile.read_text()
    # The written flags are ones the server loads, on the runtime they name.
    line = _serve_flagfile(flagfile.read_text().splitlines(), str(flagfile))
    assert 'runtime="%s"' % ("openvino" if chose_openvino else "tensorflow") in line, line
    # Whichever won here, the OpenVINO row's flags load on OpenVINO too.
    row = {"runtime": "openvino", "precision": "fp32", "xla": False, "streams": 2,
           "batching": False, "extra_flags": []}
    flags = tuner_lib.server_flags(row, "resnet", os.path.dirname(export_dir), None)
    assert flags[2:] == ["--prefer_openvino_model=true", "--openvino_precision=fp32",
                         "--openvino_num_streams=2"]
    line = _serve_flagfile(flags, "openvino row")
    assert 'runtime="openvino"' in line and 'precision="fp32"' in line, line
    # ... and so does the same row written as a model config (model_platform "openvino").
    path = str(tmp_path / "openvino.config")
    tuner_lib.write_model_config(path, row, "resnet", os.path.dirname(export_dir))
    flags = tuner_lib.server_flags(row, "resnet", None, None, model_config_file=path)
    assert flags == ["--model_config_file=%s" % path, "--openvino_precision=fp32",
                     "--openvino_num_streams=2"]
    line = _serve_flagfile(flags, "openvino model config")
    assert 'runtime="openvino"' in line, line


def _config(**changes):
    config = tune_cli.TuneConfig(tuning=TuningOptions(model_base_path="m",
                                                      latency_budget_ms=10.0))
    return fields.replace(config, **changes)


def test_the_candidates_are_what_the_cpu_and_the_export_allow(export_dir, tmp_path, capsys):
    base = tmp_path / "base"
    shutil.copytree(export_dir, str(base / "1"))
    config = fields.replace(_config(), tuning=TuningOptions(model_base_path=str(base),
                                                            latency_budget_ms=10.0),
                            openvino_streams=(0, 2))
    found, runtimes = tuner_run.openvino_candidates(config, "t")
    expected = ["fp32", "bf16"] if cpu.cpu_supports_bf16() else ["fp32"]
    assert runtimes == ["tensorflow", "openvino"]
    assert found == [(p, n) for p in expected for n in (0, 2)]
    err = capsys.readouterr().err
    assert "int8 left out: %s has no openvino/model_int8.xml" % (base / "1") in err
    assert ("bf16 left out: this CPU has no AVX512_BF16 or AMX" in err) == (
        not cpu.cpu_supports_bf16())
    # An int8 IR in the newest version (its presence is what counts here) adds int8.
    int8 = base / "1" / openvino_model.INT8_MODEL_FILE
    int8.parent.mkdir(parents=True)
    int8.write_text("<net/>")
    found, _ = tuner_run.openvino_candidates(config, "t")
    assert [p for p, _ in found][-2:] == ["int8", "int8"]
    # Named precisions are taken as they are; TensorFlow alone asks OpenVINO nothing.
    config = fields.replace(config, openvino_precisions=("int8", "fp32"), openvino_streams=(1,))
    assert tuner_run.openvino_candidates(config, "t")[0] == [("int8", 1), ("fp32", 1)]
    config = fields.replace(config, runtimes=("tensorflow",))
    assert tuner_run.openvino_candidates(config, "t") == ([], ["tensorflow"])
    with pytest.raises(user_errors.UserError, match="--runtimes: expected some of "
                       "tensorflow,openvino, got tensorflow,onnx"):
        tuner_run.openvino_candidates(fields.replace(config, runtimes=("tensorflow", "onnx")),
                                      "t")
    with pytest.raises(user_errors.UserError, match="--openvino_precisions: expected some of "
                       "auto,fp32,bf16,int8, got fp16"):
        tuner_run.openvino_candidates(fields.replace(
            config, runtimes=("openvino",), openvino_precisions=("fp16",)), "t")


def test_the_search_runs_openvino_candidates_and_batching_under_the_best():
    """Stage 1 measures TensorFlow's pairs and OpenVINO's (precision, streams) at the
    probe batching; stage 2 the grid under the fastest accepted one (OpenVINO int8 here,
    the faster int8 with 2 streams losing accuracy)."""
    measured = []

    class Measurer:
        def measure(self, setting):
            measured.append(setting)
            speed = {("tensorflow", "fp32"): 10.0, ("openvino", "fp32"): 20.0,
                     ("openvino", "int8"): 30.0 + setting.streams}[setting.runtime,
                                                                   setting.precision]
            return {"errors": 0, "p99_ms": 1.0, "images_per_s": speed, "agreement": 1.0,
                    "accuracy_ok": not (setting.precision == "int8" and setting.streams == 2)}

    grid = list(batching_tuner.grid([4, 16], [0], [1], [100]))
    openvino = [("fp32", 0), ("int8", 0), ("int8", 2)]
    rows = tuner_lib.sweep(Measurer(), ["fp32"], [False], grid, openvino=openvino)
    probe = tuner_lib.probe_batching(grid)
    assert measured[1:5] == [tuner_lib.Setting("fp32", batching=probe)] + [
        tuner_lib.Setting(p, batching=probe, runtime="openvino", streams=n)
        for p, n in openvino]
    assert measured[5:] == [tuner_lib.Setting("int8", batching=grid[0], runtime="openvino")]
    assert len(rows) == tuner_lib.planned(["fp32"], [False], grid, openvino=openvino) == 6
    assert not tuner_lib.accepted(rows[4], 0.995)
    assert tuner_lib.verdict(dict(rows[4], failure=""), 1e9, 0.995) == "rejected: accuracy drop"
    setting = tuner_lib.Setting("int8", runtime="openvino", streams=2)
    assert setting.server_flags() == ["--prefer_openvino_model=true",
                                      "--openvino_precision=int8", "--openvino_num_streams=2"]
    assert tuner_lib.tfserving_flags(setting.server_flags()) == []  # slimserve's own
    for bad in (dict(precision="fp16", runtime="openvino"), dict(runtime="onnx"),
                dict(xla=True, runtime="openvino"), dict(precision="int8")):
        with pytest.raises(ValueError):
            tuner_lib.Setting(**bad)


def test_accuracy_counts_ids_or_class_texts_and_failures_as_wrong():
    labels = [(3, "three"), (4, "four"), (5, "five"), (6, "six")]
    answers = [("3", None), ("four", None), None, ("7", None)]
    assert tuner_lib.accuracy(answers, labels) == 0.5


@pytest.mark.parametrize("name, value, ok", [
    ("openvino_streams", (0,), True), ("openvino_streams", (-1,), False),
    ("openvino_streams", (2 ** 31,), False), ("openvino_streams", (2 ** 63 - 1,), False),
    ("max_accuracy_drop", 0.0, True), ("max_accuracy_drop", -1.0, False),
    ("max_accuracy_drop", float(2 ** 31), False), ("max_accuracy_drop", float(2 ** 63 - 1),
                                                   False)])
def test_the_new_flags_are_bounded(name, value, ok):
    if ok:
        assert getattr(_config(**{name: value}), name) == value
    else:
        with pytest.raises(user_errors.UserError, match="--%s must be" % name):
            _config(**{name: value})
