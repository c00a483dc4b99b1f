"""Averaging fine-tuned checkpoints with each other (slimserve-retrain --soup_seeds) and
with the serving version's weights (--serving_weight): real TensorFlow checkpoints written
by a Saver, read back by name."""
import os

import numpy as np
import pytest
import tensorflow as tf

from slimserve import errors
from slimserve.estimator import weight_averaging


def _write(prefix, values):
    graph = tf.Graph()
    with graph.as_default():
        variables = {name: tf.compat.v1.Variable(value, name="v%d" % i)
                     for i, (name, value) in enumerate(values.items())}
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, str(prefix), write_meta_graph=False, write_state=False)
    return str(prefix)


@pytest.fixture
def checkpoints(tmp_path):
    tuned = _write(tmp_path / "tuned" / "model.ckpt-7", {
        "net/weights": np.full((2, 3), 4.0, np.float32),
        "net/weights/ExponentialMovingAverage": np.full((2, 3), 6.0, np.float32),
        "net/weights/Adam": np.ones((2, 3), np.float32),          # a slot: start lacks it
        "net/BatchNorm/moving_mean": np.array([10.0, 20.0], np.float32),
        "net/logits/biases": np.zeros(5, np.float32),              # shape differs
        "global_step": np.int64(7)})
    start = _write(tmp_path / "serving" / "variables", {
        "net/weights": np.zeros((2, 3), np.float32),
        "net/BatchNorm/moving_mean": np.array([0.0, 0.0], np.float32),
        "net/logits/biases": np.zeros(4, np.float32),
        "global_step": np.int64(100)})
    return tuned, start, tmp_path / "out" / "model.ckpt-7"


def test_floats_both_hold_are_mixed_and_everything_else_is_copied(checkpoints):
    tuned, start, output = checkpoints
    prefix, count = weight_averaging.average_checkpoints(tuned, start, 0.25, str(output))
    reader = tf.train.load_checkpoint(prefix)
    assert sorted(reader.get_variable_to_shape_map()) == sorted(
        tf.train.load_checkpoint(tuned).get_variable_to_shape_map())
    np.testing.assert_allclose(reader.get_tensor("net/weights"), np.full((2, 3), 3.0))
    # the shadow is mixed with the weights it shadows (an export holds it under that name)
    np.testing.assert_allclose(reader.get_tensor("net/weights/ExponentialMovingAverage"),
                               np.full((2, 3), 4.5))
    np.testing.assert_allclose(reader.get_tensor("net/BatchNorm/moving_mean"), [7.5, 15.0])
    np.testing.assert_array_equal(reader.get_tensor("net/weights/Adam"), np.ones((2, 3)))
    np.testing.assert_array_equal(reader.get_tensor("net/logits/biases"), np.zeros(5))
    assert reader.get_tensor("global_step") == 7  # the run's step, not the serving one's
    assert reader.get_variable_to_dtype_map()["net/weights"] == tf.float32
    assert count == 3


def test_serving_weights_under_shadow_names_are_found(tmp_path):
    """An export of a run with --moving_average_decay holds only the shadow names."""
    tuned = _write(tmp_path / "tuned" / "model.ckpt-3", {
        "net/weights": np.full(3, 2.0, np.float32),
        "net/weights/ExponentialMovingAverage": np.full(3, 4.0, np.float32)})
    start = _write(tmp_path / "serving" / "variables", {
        "net/weights/ExponentialMovingAverage": np.zeros(3, np.float32)})
    prefix, count = weight_averaging.average_checkpoints(
        tuned, start, 0.5, str(tmp_path / "out" / "model.ckpt-3"))
    reader = tf.train.load_checkpoint(prefix)
    np.testing.assert_allclose(reader.get_tensor("net/weights"), np.full(3, 1.0))
    np.testing.assert_allclose(reader.get_tensor("net/weights/ExponentialMovingAverage"),
                               np.full(3, 2.0))
    assert count == 2


def test_weight_zero_copies_the_fine_tune(checkpoints):
    tuned, start, output = checkpoints
    prefix, count = weight_averaging.average_checkpoints(tuned, start, 0.0, str(output))
    assert count == 0
    np.testing.assert_array_equal(tf.train.load_checkpoint(prefix).get_tensor("net/weights"),
                                  np.full((2, 3), 4.0))


@pytest.mark.parametrize("weight", [1.0, -0.1, 2.0])
def test_a_weight_outside_zero_to_one_is_refused(checkpoints, weight):
    tuned, start, output = checkpoints
    with pytest.raises(errors.UserError, match="must be in"):
        weight_averaging.average_checkpoints(tuned, start, weight, str(output))
    assert not output.parent.exists()


def test_an_unreadable_checkpoint_is_named(checkpoints, tmp_path):
    tuned, _, output = checkpoints
    missing = str(tmp_path / "nowhere" / "variables")
    with pytest.raises(errors.UserError, match="serving checkpoint %s" % missing):
        weight_averaging.average_checkpoints(tuned, missing, 0.5, str(output))
    assert not output.parent.exists()


def test_a_soup_is_the_mean_of_the_runs_then_mixed_with_the_start(checkpoints, tmp_path):
    """--soup_seeds: the runs' floats averaged first (EMA shadows and BatchNorm statistics
    too), then mixed with the serving weights; the step and integers are the first run's."""
    tuned, start, output = checkpoints
    other = _write(tmp_path / "tuned2" / "model.ckpt-9", {
        "net/weights": np.full((2, 3), 8.0, np.float32),
        "net/weights/ExponentialMovingAverage": np.full((2, 3), 2.0, np.float32),
        "net/weights/Adam": np.full((2, 3), 3.0, np.float32),
        "net/BatchNorm/moving_mean": np.array([20.0, 40.0], np.float32),
        "net/logits/biases": np.ones(5, np.float32),
        "global_step": np.int64(9)})
    prefix, count = weight_averaging.average_checkpoints([tuned, other], start, 0.5,
                                                         str(output))
    reader = tf.train.load_checkpoint(prefix)
    np.testing.assert_allclose(reader.get_tensor("net/weights"), np.full((2, 3), 3.0))
    np.testing.assert_allclose(reader.get_tensor("net/weights/ExponentialMovingAverage"),
                               np.full((2, 3), 2.0))
    np.testing.assert_allclose(reader.get_tensor("net/BatchNorm/moving_mean"), [7.5, 15.0])
    # floats the start lacks (or holds in another shape) are the runs' mean alone
    np.testing.assert_allclose(reader.get_tensor("net/weights/Adam"), np.full((2, 3), 2.0))
    np.testing.assert_allclose(reader.get_tensor("net/logits/biases"), np.full(5, 0.5))
    assert reader.get_tensor("global_step") == 7
    assert count == 3
    # without the start's share it is the plain mean of the runs
    plain, _ = weight_averaging.average_checkpoints([tuned, other], start, 0.0,
                                                    str(tmp_path / "plain" / "model.ckpt-7"))
    np.testing.assert_allclose(tf.train.load_checkpoint(plain).get_tensor("net/weights"),
                               np.full((2, 3), 6.0))


def test_runs_of_different_networks_are_refused_by_name(checkpoints, tmp_path):
    tuned, start, output = checkpoints
    lacking = _write(tmp_path / "other" / "model.ckpt-7", {
        "net/weights": np.zeros((2, 3), np.float32), "global_step": np.int64(7)})
    with pytest.raises(errors.UserError, match="net/BatchNorm/moving_mean is \\(2,\\) in "
                       ".* and missing in %s" % lacking):
        weight_averaging.average_checkpoints([tuned, lacking], start, 0.0, str(output))
    other_shape = _write(tmp_path / "third" / "model.ckpt-7", {
        "net/BatchNorm/moving_mean": np.zeros(2, np.float32),
        "net/logits/biases": np.zeros(5, np.float32),
        "net/weights": np.zeros((3, 3), np.float32)})
    with pytest.raises(errors.UserError, match=r"net/weights is \(2, 3\) in .* and \(3, 3\)"):
        weight_averaging.average_checkpoints([tuned, other_shape], start, 0.0, str(output))
    assert not os.path.exists(str(output) + ".index")  # nothing written
    with pytest.raises(errors.UserError, match="cannot read the fine-tuned checkpoint"):
        weight_averaging.average_checkpoints([tuned, str(tmp_path / "missing")], start, 0.0,
                                             str(output))
