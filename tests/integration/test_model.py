"""model_fn on real graphs: warm start, exclusion, freezing, resume."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from slimserve.estimator import inputs
from slimserve.estimator import model
from slimserve.estimator import preprocessing
from slimserve.estimator import warm_start
from slimserve.testing import slim_checkpoints

HEAD = "resnet_v1_50/logits"
EARLY = ["resnet_v1_50/conv1", "resnet_v1_50/block1", "resnet_v1_50/block2"]


def _config(checkpoint, **overrides):
    values = dict(model_name="resnet_v1_50", num_classes=10,
                  checkpoint_path=checkpoint, checkpoint_exclude_scopes=[HEAD],
                  batch_norm_decay=0.9, learning_rate=0.01)
    values.update(overrides)
    return model.ModelConfig(**values)


def _build_train_graph(config):
    graph = tf.Graph()
    with graph.as_default():
        images = tf.compat.v1.placeholder(tf.float32, [4, 32, 32, 3])
        labels = tf.compat.v1.placeholder(tf.int32, [4])
        spec = model.model_fn({"image": images}, labels, tf.estimator.ModeKeys.TRAIN,
                              dataclasses.asdict(config))
    return graph, images, labels, spec


@pytest.mark.cost(23)
def test_warm_start_restores_every_variable_including_bn_statistics(imagenet_checkpoint):
    reader = tf.train.load_checkpoint(imagenet_checkpoint)
    expected = {name for name, _ in tf.train.list_variables(imagenet_checkpoint)
                if not name.startswith(HEAD + "/")}
    graph, _, _, _ = _build_train_graph(_config(imagenet_checkpoint))
    with graph.as_default(), tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        restored = set()
        for var in tf.compat.v1.global_variables():
            name = var.op.name
            if not name.startswith("resnet_v1_50/") or name.endswith("/Momentum"):
                continue
            value = session.run(var)
            if name.startswith(HEAD):
                assert value.shape[-1] == 10
                continue
            assert np.array_equal(value, reader.get_tensor(name)), name
            restored.add(name)
    # Every checkpoint variable but the excluded head, and nothing else.
    assert restored == expected
    statistics = [n for n in restored if n.endswith(("moving_mean", "moving_variance"))]
    assert len(statistics) > 100
    # The checkpoint's statistics are not the initialisers' zeros/ones, so equality above
    # proves they were restored rather than initialised.
    mean = reader.get_tensor("resnet_v1_50/conv1/BatchNorm/moving_mean")
    assert mean.min() >= 0.5 and not np.allclose(mean, 1.0)


@pytest.mark.cost(12)
def test_head_shape_mismatch_names_the_variable_and_shapes(imagenet_checkpoint):
    with pytest.raises(warm_start.WarmStartError,
                       match=r"resnet_v1_50/logits/(weights|biases).*\[.*1000\].*\[.*10\]"):
        _build_train_graph(_config(imagenet_checkpoint, checkpoint_exclude_scopes=[]))


@pytest.mark.cost(29)
def test_missing_variables_fail_unless_ignored(tmp_path):
    partial = slim_checkpoints.make_imagenet_style_checkpoint(
        str(tmp_path), drop_scopes=["resnet_v1_50/block4"])
    with pytest.raises(warm_start.WarmStartError, match="not in .*block4|block4.*ignore_missing"):
        _build_train_graph(_config(partial))
    _build_train_graph(_config(partial, ignore_missing_vars=True))


def test_no_gradient_is_computed_below_the_trained_scopes(imagenet_checkpoint):
    config = _config(imagenet_checkpoint, trainable_scopes=["resnet_v1_50/block4", HEAD])
    graph, _, _, _ = _build_train_graph(config)
    names = [op.name for op in graph.get_operations()]
    grads = [n for n in names if n.startswith("gradients/")]
    assert any("resnet_v1_50/block4" in n for n in grads)
    for scope in EARLY + ["resnet_v1_50/block3"]:
        assert not any(scope + "/" in n for n in grads), scope
    update_ops = graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    assert update_ops and all("block4" in op.name for op in update_ops)


@pytest.mark.cost(32)
def test_frozen_weights_and_bn_statistics_stay_bit_identical(imagenet_checkpoint, digits_data,
                                                            tmp_path):
    config = _config(imagenet_checkpoint, freeze_scopes=EARLY)
    estimator = tf.estimator.Estimator(
        model.model_fn, model_dir=str(tmp_path / "run"), params=dataclasses.asdict(config),
        config=tf.estimator.RunConfig(tf_random_seed=1, save_checkpoints_steps=1000))
    input_fn = inputs.make_input_fn(digits_data, "train", True,
                                    inputs.InputConfig(batch_size=8),
                                    preprocessing.Spec(32, preprocessing.VGG), seed=1)
    estimator.train(input_fn, max_steps=4)
    before = tf.train.load_checkpoint(imagenet_checkpoint)
    after = tf.train.load_checkpoint(estimator.latest_checkpoint())
    frozen = trained = 0
    for name, _ in tf.train.list_variables(imagenet_checkpoint):
        if name.startswith(HEAD):
            continue
        same = np.array_equal(before.get_tensor(name), after.get_tensor(name))
        if any(name.startswith(scope + "/") for scope in EARLY):
            assert same, name
            frozen += 1
        elif name.endswith(("/weights", "moving_mean", "moving_variance")):
            assert not same, name
            trained += 1
    assert frozen > 50 and trained > 50

    # Resume wins: a second run continues from model_dir and does not even read the
    # warm-start checkpoint (here a path that no longer exists).
    gone = dataclasses.replace(config, checkpoint_path=str(tmp_path / "gone" / "model.ckpt"))
    resumed = tf.estimator.Estimator(model.model_fn, model_dir=str(tmp_path / "run"),
                                     params=dataclasses.asdict(gone))
    resumed.train(input_fn, max_steps=6)
    assert resumed.get_variable_value("global_step") == 6
