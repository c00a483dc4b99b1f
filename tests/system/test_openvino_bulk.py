"""slimserve-predict --runtime=openvino: bulk inference with the network on OpenVINO, in
process and on Beam's RunInference (DirectRunner), through the servable the server uses;
on the trained digits export (no IR in it: converted at load, as the server does) both
give TensorFlow's class for every validation image and its probabilities within the
tolerance tests/test_openvino.py allows. Cost: three loads of the 32x32 export (two
conversions, ~3 s each) over its validation split. Skipped where openvino is not
installed."""
import json
import logging
import os

import numpy as np
import pytest

from slimserve.cli import beam as beam_cli
from slimserve.serving.bulk import beam as beam_inference
from slimserve.serving.bulk import predict as bulk_predict
from slimserve.serving.clients import image_classifier
from slimserve.testing.commands import run_command

pytest.importorskip("openvino")

PROBABILITY_TOLERANCE = 1e-4  # as tests/test_openvino.py: the same float32 network


def _rows(path):
    with open(path) as handle:
        return {row["path"]: row for row in map(json.loads, handle)}


def _assert_same(got, expected):
    assert sorted(got) == sorted(expected) and len(expected) > 50
    for path, row in expected.items():
        assert got[path]["class_id"] == row["class_id"], path
        assert got[path]["class_name"] == row["class_name"], path
        np.testing.assert_allclose(got[path]["top_k"][0]["probability"],
                                   row["top_k"][0]["probability"], atol=PROBABILITY_TOLERANCE)


@pytest.fixture(scope="module")
def tensorflow_rows(export_dir, digits_data, tmp_path_factory):
    output = str(tmp_path_factory.mktemp("bulk_tf") / "tf.jsonl")
    bulk_predict.predict_local(os.path.dirname(export_dir),
                               os.path.join(digits_data, "validation-*-of-*"), output,
                               batch_size=32, top_k=3, show_progress=False)
    return _rows(output)


@pytest.mark.cost(20)
def test_local_and_beam_on_openvino_give_tensorflows_classes(export_dir, digits_data,
                                                             tensorflow_rows, tmp_path,
                                                             caplog, monkeypatch):
    base, inputs = os.path.dirname(export_dir), os.path.join(digits_data, "validation-*-of-*")
    loaded = []
    real = image_classifier.ImageClassifier.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        loaded.append(getattr(self.servable, "runtime", "tensorflow"))

    monkeypatch.setattr(image_classifier.ImageClassifier, "__init__", spy)
    local, beam = str(tmp_path / "local.jsonl"), str(tmp_path / "beam.jsonl")
    with caplog.at_level(logging.INFO):
        summary = bulk_predict.predict_local(base, inputs, local, batch_size=32, top_k=3,
                                             show_progress=False, runtime="openvino")
        beam_inference.predict_beam(base, inputs, beam,
                                    beam_cli.pipeline_options("DirectRunner"), batch_size=32,
                                    top_k=3, runtime="openvino")
    # Both ran the network on OpenVINO (converted at load: the export has no IR), not
    # on TensorFlow after a fallback line.
    assert loaded == ["openvino", "openvino"]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("converted at load" in m for m in messages) == 2, messages
    assert not [m for m in messages if "OpenVINO cannot serve it" in m]
    assert summary["errors"] == 0
    _assert_same(_rows(local), tensorflow_rows)
    _assert_same(_rows(beam), tensorflow_rows)


def test_the_runtime_flags_are_checked(export_dir, tmp_path):
    bad = run_command("slimserve.cli.predict", "--model_base_path", os.path.dirname(export_dir),
                      "--input", str(tmp_path), "--output", str(tmp_path / "o.jsonl"),
                      "--runtime", "onnx")
    assert bad.code != 0 and "Traceback" not in bad.stderr
    assert "--runtime" in bad.stderr and "tensorflow" in bad.stderr
    bad = run_command("slimserve.cli.predict", "--model_base_path", os.path.dirname(export_dir),
                      "--input", str(tmp_path), "--output", str(tmp_path / "o.jsonl"),
                      "--openvino_precision", "fp16")
    assert bad.code != 0 and "--openvino_precision" in bad.stderr
    with pytest.raises(bulk_predict.BulkPredictError, match="--runtime must be one of "
                       "tensorflow, openvino, got 'onnx'"):
        image_classifier.ImageClassifier(export_dir, runtime="onnx")
