"""Exports from a real short training run: signatures, saved_model_cli, Classify,
a TF-only process, bad images, atomic publication."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from slimserve.estimator import preprocessing
from slimserve.estimator import schema
from slimserve import fields
from slimserve.estimator import splits
from slimserve.estimator import train_config
from slimserve.estimator import training
from slimserve.export import signatures
from slimserve.export import verify
from slimserve.export import writer
from slimserve.serving.core import servable as servable_lib
from slimserve.testing import commands
from slimserve.testing.commands import run_command

CLI = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")


def _validation_examples(data_dir, count):
    return splits.read_examples(data_dir, "validation", count)


def _encoded(example):
    return example.features.feature[schema.ENCODED].bytes_list.value[0]


def _label(example):
    return example.features.feature[schema.LABEL].int64_list.value[0]


def test_final_and_best_exports_exist_with_assets(trained_run, export_dir):
    assert sorted(os.listdir(os.path.join(trained_run, "export"))) == ["best", "final"]
    assert os.path.exists(os.path.join(export_dir, "saved_model.pb"))
    labels = open(os.path.join(export_dir, "assets", signatures.LABELS_ASSET)).read()
    assert labels.splitlines()[:2] == ["0:0", "1:1"]
    assert os.path.getsize(os.path.join(export_dir, servable_lib.WARMUP_PATH)) > 1000
    best = os.path.join(trained_run, "export", "best")
    version = sorted(os.listdir(best))[-1]
    result = json.load(open(os.path.join(best, version, signatures.EXTRA_DIR, "eval_result.json")))
    assert 0.0 <= result["accuracy"] <= 1.0


def test_checkpoints_carry_no_text_graph_unless_asked_and_tensorboard_keeps_the_graph(
        trained_run, tmp_path):
    names = os.listdir(trained_run)
    assert "model.ckpt-60.index" in names
    assert not [n for n in names if n.endswith((".meta", ".pbtxt"))], names
    graphs = []
    for path in glob.glob(os.path.join(trained_run, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            if event.graph_def:
                graphs.append(tf.compat.v1.GraphDef.FromString(event.graph_def))
    assert graphs and any(n.name.startswith("resnet_v1_50/block4/") for n in graphs[0].node)
    for flag in ("--checkpoint_save_graph_def", "--nocheckpoint_save_graph_def"):
        values = commands.flag_values("slimserve.cli.train")
        values(["slimserve-train", "--data_dir=d", "--model_dir=%s" % tmp_path, flag])
        config = fields.from_flags(train_config.TrainConfig, values)
        estimator = training.make_estimator(config, config.model)
        assert estimator.config.checkpoint_save_graph_def == (not flag.startswith("--no"))


def test_a_checkpoint_both_exporters_want_is_exported_once_and_copied(trained_run,
                                                                       export_dir):
    """The run evaluates once (step 60), the final and the best export want the same
    checkpoint: it is written and verified once, and the other version is a copy of it
    (file for file, times included), not a second export."""
    best = os.path.join(trained_run, "export", "best")
    copy = os.path.join(best, sorted(os.listdir(best))[-1])
    names = sorted(os.path.relpath(os.path.join(d, f), export_dir)
                   for d, _, files in os.walk(export_dir) for f in files)
    assert names == sorted(os.path.relpath(os.path.join(d, f), copy)
                           for d, _, files in os.walk(copy) for f in files)
    for name in names:
        one, other = os.path.join(export_dir, name), os.path.join(copy, name)
        assert open(one, "rb").read() == open(other, "rb").read(), name
        assert os.stat(one).st_mtime == os.stat(other).st_mtime, name


def test_run_summary_lists_only_exports_that_still_exist(tmp_path):
    """export/best prunes old versions: the end-of-run summary names only those left."""
    kept = tmp_path / "best" / "2"
    kept.mkdir(parents=True)

    class Pruning:  # an exporter as training.TrainResult reads one
        name, refusal = "best", None
        exported = [str(tmp_path / "best" / "1"), str(kept)]

    result = training.TrainResult.of({"accuracy": 0.9}, [Pruning()], 1.0)
    assert result.exported == [str(kept)]


def test_export_carries_the_ema_weights(trained_run, export_dir):
    """Trained with --moving_average_decay: the export holds the averaged weights."""
    trained = tf.train.load_checkpoint(tf.train.latest_checkpoint(trained_run))
    exported = tf.train.load_checkpoint(os.path.join(export_dir, "variables", "variables"))
    name = "resnet_v1_50/logits/weights"
    average = trained.get_tensor(name + "/ExponentialMovingAverage")
    assert not np.array_equal(average, trained.get_tensor(name))
    np.testing.assert_array_equal(exported.get_tensor(name + "/ExponentialMovingAverage"),
                                  average)


def test_saved_model_cli_lists_four_signatures_with_methods(export_dir):
    shown = subprocess.run([CLI, "show", "--dir", export_dir, "--all"], capture_output=True,
                           text=True, check=True).stdout
    for name in (signatures.DEFAULT, signatures.PREDICT_IMAGES, signatures.CLASSIFY,
                 signatures.EMBEDDINGS_SIGNATURE):
        assert "signature_def['%s']" % name in shown
    assert shown.count("Method name is: tensorflow/serving/predict") == 3
    assert shown.count("Method name is: tensorflow/serving/classify") == 1
    assert "inputs['image_bytes'] tensor_info:\n        dtype: DT_STRING\n        shape: (-1)" \
        in shown


def test_saved_model_cli_run_on_a_real_jpeg(export_dir, digits_data, tmp_path):
    examples = _validation_examples(digits_data, 40)
    expected = _reference(export_dir, [_encoded(e) for e in examples])
    # pick an image the model classifies correctly, then run it through the CLI
    index = next(i for i, e in enumerate(examples) if expected[i] == _label(e))
    np.save(tmp_path / "batch.npy", np.array([_encoded(examples[index])], dtype=object))
    out = subprocess.run([CLI, "run", "--dir", export_dir, "--tag_set", "serve",
                          "--signature_def", signatures.DEFAULT, "--inputs",
                          "image_bytes=%s" % (tmp_path / "batch.npy")],
                         capture_output=True, text=True, check=True).stdout
    assert "classes" in out
    classes_line = out[out.index("Result for output key classes:"):].splitlines()[1]
    assert classes_line.strip() == "[%d]" % _label(examples[index])


def _reference(export_dir, images):
    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        out = verify.run_signature(session, meta, signatures.DEFAULT,
                                   {signatures.IMAGE_BYTES: np.array(images, dtype=object)})
    return out[signatures.CLASSES]


def test_all_signatures_agree_and_classify_reads_validation_examples(export_dir, digits_data):
    examples = _validation_examples(digits_data, 12)
    pixels = np.stack([tf.image.resize(tf.io.decode_jpeg(_encoded(e), channels=3),
                                       [32, 32]).numpy() for e in examples])
    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        by_bytes = verify.run_signature(session, meta, signatures.DEFAULT, {
            signatures.IMAGE_BYTES: np.array([_encoded(e) for e in examples], dtype=object)})
        by_example = verify.run_signature(session, meta, signatures.CLASSIFY, {
            signatures.EXAMPLES: np.array([e.SerializeToString() for e in examples],
                                          dtype=object)})
        by_pixels = verify.run_signature(session, meta, signatures.PREDICT_IMAGES,
                                         {signatures.IMAGES: pixels})
    probabilities = by_bytes[signatures.PROBABILITIES]
    np.testing.assert_allclose(by_example[signatures.SCORES], probabilities, atol=1e-6)
    assert by_example[signatures.CLASSES].shape == (12, 10)
    assert by_example[signatures.CLASSES][0].tolist() == [str(i).encode() for i in range(10)]
    # 32x32 sources resized to 32x32 are the same pixels the bytes path computes
    np.testing.assert_allclose(by_pixels[signatures.PROBABILITIES], probabilities, atol=1e-5)
    names = by_bytes[signatures.CLASS_NAMES]
    assert [n.decode() for n in names] == [str(c) for c in by_bytes[signatures.CLASSES]]


# The first lines of a TensorFlow-only child: our packages cannot be imported there (a
# finder ahead of every other refuses them), and an import that something caught and
# went on without is still reported by _TF_ONLY_END.
_TF_ONLY = """
import sys
OURS = ('slimserve', 'estimator', 'export', 'serving')
assert not [m for m in sys.modules if m.split('.')[0] in OURS], 'imported at start'
attempts = []
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in OURS:
            attempts.append(name)
            raise ImportError('a TensorFlow-only process imported ' + name)
        return None
sys.meta_path.insert(0, Refuse())
"""
_TF_ONLY_END = "\nassert not attempts, 'our code was imported: %s' % attempts\n"


def test_a_tensorflow_only_process_reproduces_the_probabilities(export_dir, digits_data,
                                                                 tmp_path):
    """The SavedModel needs TensorFlow alone: a process in which our packages cannot be
    imported (_TF_ONLY) loads it and computes the same probabilities. The child inherits
    this process's TF_ENABLE_ONEDNN_OPTS, so both run the same kernels."""
    images = [_encoded(e) for e in _validation_examples(digits_data, 6)]
    np.save(tmp_path / "images.npy", np.array(images, dtype=object))
    script = _TF_ONLY + """
import numpy as np, tensorflow as tf
images = np.load(sys.argv[2], allow_pickle=True)
loaded = tf.saved_model.load(sys.argv[1])
out = loaded.signatures['serving_default'](image_bytes=tf.constant(list(images)))
np.save(sys.argv[3], out['probabilities'].numpy())
""" + _TF_ONLY_END
    child = subprocess.run([sys.executable, "-c", script, export_dir,
                            str(tmp_path / "images.npy"), str(tmp_path / "out.npy")],
                           cwd=str(tmp_path), capture_output=True, text=True)
    assert child.returncode == 0, child.stderr[-3000:]
    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        here = verify.run_signature(session, meta, signatures.DEFAULT, {
            signatures.IMAGE_BYTES: np.array(images, dtype=object)})[signatures.PROBABILITIES]
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), here, atol=1e-6)


@pytest.mark.parametrize("body", ["import slimserve", "try:\n    import serving\nexcept "
                                  "ImportError:\n    pass"])
def test_the_tensorflow_only_guard_fails_a_child_that_imports_our_code(body, tmp_path):
    """The guard above can fail: an import of ours, even one caught, fails the child."""
    child = subprocess.run([sys.executable, "-c", _TF_ONLY + body + _TF_ONLY_END],
                           cwd=str(tmp_path), capture_output=True, text=True)
    assert child.returncode == 1 and "imported" in child.stderr, child.stderr[-3000:]


def test_undecodable_image_fails_the_request_cleanly(export_dir):
    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        with pytest.raises(tf.errors.InvalidArgumentError, match="image"):
            verify.run_signature(session, meta, signatures.DEFAULT,
                                 {signatures.IMAGE_BYTES: np.array([b"\xff\xd8garbage"],
                                                                   dtype=object)})
        # the session still serves after the failed request
        good = verify.run_signature(session, meta, signatures.PREDICT_IMAGES,
                                    {signatures.IMAGES: np.zeros([1, 32, 32, 3], np.float32)})
        assert good[signatures.PROBABILITIES].shape == (1, 10)


@pytest.mark.cost(26)
def test_export_cli_publishes_atomically_and_rejects_a_failed_verification(
        trained_run, tmp_path, monkeypatch):
    from tests.helpers import run_cli  # pylint: disable=import-outside-toplevel
    base = tmp_path / "models"
    out = run_cli("slimserve.cli.export", "--model_dir", trained_run, "--export_base", base)
    version_dir = out.stdout.strip().splitlines()[-1]
    assert os.path.dirname(version_dir) == str(base)
    assert os.listdir(base) == [os.path.basename(version_dir)]

    # A verification failure leaves nothing behind: no version, no temporary dir.
    from slimserve.estimator import model  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import run_files
    run = run_files.read(trained_run)
    config = model.ModelConfig(**run["model"])
    seen = []

    def fail(temp_dir):
        seen.append(sorted(os.listdir(temp_dir)))
        assert os.path.basename(temp_dir).startswith(writer.TEMP_PREFIX)
        raise verify.ExportVerificationError("simulated mismatch")

    with pytest.raises(verify.ExportVerificationError):
        writer.write_saved_model(str(base), tf.train.latest_checkpoint(trained_run), config,
                                 preprocessing.Spec.from_dict(run["serving"]),
                                 before_publish=fail)
    assert seen and "saved_model.pb" in seen[0] and "assets.extra" in seen[0]
    assert os.listdir(base) == [os.path.basename(version_dir)]


def test_export_cli_names_a_missing_run(tmp_path):
    out = run_command("slimserve.cli.export", "--model_dir", tmp_path)
    assert out.code == 1
    assert out.stderr == "slimserve-export: %s not found: the model_dir must be a " \
        "slimserve-train run\n" % (tmp_path / "slimserve.json")
