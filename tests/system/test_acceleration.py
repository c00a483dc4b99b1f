"""--precision=bf16 and --xla really change how the network runs on this CPU, and
the answers hold: bf16 runs the convolutions in bfloat16 with a trained model's
predictions kept; XLA compiles clusters of a training step (on a CPU, which needs
TensorFlow's CPU auto-jit switch, which run_config sets) and computes the same loss before
and after it."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from slimserve import compute
from slimserve.estimator import run_config
from slimserve.estimator import schema
from slimserve.estimator import splits
from slimserve.export import signatures
from tests.helpers import ROOT

# Runs in a fresh process with TF_XLA_FLAGS empty: only run_config's switch turns XLA on.
# Blocks 1-3 frozen, as a fine-tune may freeze them: the step still runs the whole net
# forward, and compiling a backward pass through block4 only took the probe from 46 to 15
# CPU seconds (73 XLA ops in the step's clusters, 379 with nothing frozen).
_XLA_PROBE = """
import dataclasses, json
import numpy as np, tensorflow as tf
from slimserve.estimator import model
from slimserve.estimator import run_config
config = model.ModelConfig(model_name="resnet_v1_50", num_classes=10,
                           optimizer="sgd", learning_rate=0.001, batch_norm_decay=0.9,
                           freeze_scopes=["resnet_v1_50/conv1", "resnet_v1_50/block1",
                                          "resnet_v1_50/block2", "resnet_v1_50/block3"])
graph = tf.Graph()
with graph.as_default():
    tf.compat.v1.set_random_seed(0)
    rng = np.random.RandomState(0)
    images = tf.constant(rng.rand(8, 64, 64, 3).astype(np.float32) * 255)
    labels = tf.constant(rng.randint(0, 10, 8).astype(np.int32))
    spec = model.model_fn({"image": images}, labels, tf.estimator.ModeKeys.TRAIN,
                          dataclasses.asdict(config))
    init = tf.compat.v1.global_variables_initializer()
out = {}
for xla in (True, False):
    with tf.compat.v1.Session(graph=graph, config=run_config.session_config(xla=xla)) as s:
        s.run(init)
        metadata = tf.compat.v1.RunMetadata()
        _, loss = s.run([spec.train_op, spec.loss],
                        options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                        run_metadata=metadata)
        out[str(xla)] = {"xla_ops": sum(n.op.startswith("_Xla") for g in
                                        metadata.partition_graphs for n in g.node),
                         "loss": float(loss), "next_loss": float(s.run(spec.loss))}
print(json.dumps(out))
"""


def _validation_images(data_dir, count):
    return splits.read_images(data_dir, schema.VALIDATION, count)[0]


def _predict(export_dir, precision, images):
    """-> (probabilities, bfloat16 ops in the graph that actually ran)."""
    session = tf.compat.v1.Session(graph=tf.Graph(),
                                   config=run_config.session_config(precision=precision))
    with session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        sig = meta.signature_def[signatures.DEFAULT]
        metadata = tf.compat.v1.RunMetadata()
        probabilities = session.run(
            sig.outputs["probabilities"].name,
            {sig.inputs[signatures.IMAGE_BYTES].name: np.array(images, dtype=object)},
            options=tf.compat.v1.RunOptions(output_partition_graphs=True),
            run_metadata=metadata)
    bf16_ops = [node.op for graph in metadata.partition_graphs for node in graph.node
                if node.op in ("Conv2D", "MatMul", "_FusedConv2D", "_MklNativeConv2D",
                               "_MklNativeFusedConv2D", "_MklFusedConv2D", "_MklConv2D")
                and node.attr["T"].type == tf.bfloat16.as_datatype_enum]
    return probabilities, bf16_ops


@pytest.mark.skipif(not run_config.cpu_supports_bf16() or compute.bfloat16_unavailable(),
                    reason="this CPU has neither AVX512_BF16 nor AMX, or oneDNN is off "
                    "(tests/test_precision.py checks the line that says so)")
def test_bf16_runs_convolutions_in_bfloat16_and_keeps_predictions(export_dir, digits_data):
    images = _validation_images(digits_data, 64)
    full, full_bf16_ops = _predict(export_dir, "fp32", images)
    mixed, bf16_ops = _predict(export_dir, "bf16", images)
    assert full_bf16_ops == []
    assert len(bf16_ops) > 40, "the bf16 rewrite left the convolutions in fp32"
    agree = np.mean(full.argmax(1) == mixed.argmax(1))
    per_image = np.abs(full - mixed).max(axis=1)
    print("bf16 vs fp32: argmax agreement %.3f, max |dp| per image: median %.4f, mean "
          "%.4f, 90th percentile %.4f, max %.4f" % (
              agree, np.median(per_image), per_image.mean(), np.percentile(per_image, 90),
              per_image.max()))
    assert agree >= 0.95, agree
    # A 60-step model leaves many images unsaturated, and near a decision boundary
    # bfloat16's 8-bit mantissa moves a probability by 0.05-0.25 (CI saw a 90th percentile
    # of 0.057 and a max of 0.12); the typical image must stay close, and the average too.
    assert np.median(per_image) < 0.01, per_image
    assert per_image.mean() < 0.05, per_image
    assert not np.array_equal(full, mixed)  # it really computed in lower precision


@pytest.mark.cost(12)
@pytest.mark.slow
def test_xla_compiles_a_training_step_on_cpu_and_computes_the_same():
    out = subprocess.run([sys.executable, "-c", _XLA_PROBE], cwd=ROOT, capture_output=True,
                         text=True, timeout=900, env={**os.environ, "TF_XLA_FLAGS": ""})
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["True"]["xla_ops"] > 0, "no XLA cluster was compiled"
    assert result["False"]["xla_ops"] == 0
    # the same loss from the same start; after one step both have learnt, by nearly the
    # same amount (fused gradients round differently, and a fresh net's batch statistics
    # amplify that: 2% apart measured)
    np.testing.assert_allclose(result["True"]["loss"], result["False"]["loss"], rtol=1e-3)
    for run in result.values():
        assert run["next_loss"] < run["loss"]
    np.testing.assert_allclose(result["True"]["next_loss"], result["False"]["next_loss"],
                               rtol=0.05)
