"""Distillation in slimserve-retrain (--distill_weight, Learning without Forgetting): the
merge gives every original training record the serving version's probabilities and the
new labels none, the input pipeline hands them to the model_fn (zeros where there are
none), the loss counts only the records that have them, and a data set without them is
refused by name."""
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from slimserve import errors
from slimserve.estimator import dataset
from slimserve.estimator import inputs
from slimserve.estimator import model
from slimserve.estimator import schema
from slimserve.estimator import splits
from slimserve.estimator import train_config
from slimserve.estimator import training
from slimserve.flywheel import merge
from slimserve.flywheel import publish
from slimserve.testing import digits_traffic
from tests.drift_fixtures import MODEL, drift_model, drift_parts  # noqa: F401

CLASSES = [str(d) for d in range(10)]


@pytest.fixture(scope="module")
def new_labels(tmp_path_factory, drift_parts):
    """New labels converted (train and a held-out part): inverted traffic digits."""
    work = tmp_path_factory.mktemp("new")
    tree = str(work / "tree")
    digits_traffic.write_tree(drift_parts["traffic"][:60], tree,
                              lambda data: digits_traffic.shift(data, "invert"))
    new = str(work / "data")
    dataset.build_dataset(tree, new, validation_fraction=0.25, train_shards=1,
                          validation_shards=1, show_progress=False, num_workers=1)
    return new


@pytest.fixture(scope="module")
def distilled(tmp_path_factory, drift_model, new_labels):
    """(merged data set with the served digits model as teacher, original data set)."""
    work = tmp_path_factory.mktemp("served")
    base = work / "models" / MODEL
    shutil.copytree(os.path.join(drift_model, "1"), base / "1")
    serving = publish.read_serving(publish.PublishConfig(model_base_path=str(base)))
    original = os.path.join(os.path.dirname(drift_model), "data-1")
    merged = str(work / "merged")
    with merge.teacher(serving.version_dir, serving.name, serving.version) as teacher:
        info = merge.merge(original, new_labels, merged, CLASSES, repeats=2, teacher=teacher)
    assert info["teacher"] is True
    return merged, original


def _teacher_rows(examples):
    return [list(e.features.feature[schema.TEACHER].float_list.value) for e in examples]


def test_original_training_records_carry_the_serving_versions_probabilities(distilled):
    merged, original = distilled
    train = splits.read_examples(merged, "train")
    before = splits.read_examples(original, "train")
    rows = _teacher_rows(train)
    taught = [row for row in rows if row]
    assert len(taught) == len(before)  # every original record, and only those
    assert all(len(row) == len(CLASSES) for row in taught)
    np.testing.assert_allclose([sum(row) for row in taught], 1.0, atol=1e-4)
    labels = [e.features.feature[schema.LABEL].int64_list.value[0] for e in train if
              e.features.feature[schema.TEACHER].float_list.value]
    agree = np.mean(np.argmax(taught, axis=1) == np.array(labels))
    assert agree > 0.8, agree  # the served model on the images it was fitted on
    # the same images, in order, as the original shards hold
    assert [e.features.feature[schema.ENCODED].bytes_list.value[0] for e in train][
        :len(before)] == [e.features.feature[schema.ENCODED].bytes_list.value[0]
                          for e in before]
    # the held-out and original validation records have no teacher
    assert not any(_teacher_rows(splits.read_examples(merged, "validation")))
    info = json.load(open(os.path.join(merged, schema.INFO_FILE)))
    assert info["teacher"] is True


def test_the_input_pipeline_hands_teacher_rows_to_the_model_zeros_without(distilled):
    merged, _ = distilled
    config = train_config.TrainConfig(
        data=train_config.DataOptions(data_dir=merged),
        input=inputs.InputConfig(image_size=32, batch_size=64))
    preprocess = config.preprocess()
    features, labels = next(iter(inputs.make_input_fn(
        merged, "train", True, config.input, preprocess, config.run.seed,
        teacher_classes=len(CLASSES))()))
    teacher = features["teacher"].numpy()
    assert teacher.shape == (64, len(CLASSES)) and labels.shape == (64,)
    sums = teacher.sum(axis=1)
    assert np.all((np.abs(sums - 1.0) < 1e-4) | (sums == 0.0))
    assert (sums == 0.0).any() and (sums > 0).any()  # new labels and original images mixed
    plain, _ = next(iter(inputs.make_input_fn(merged, "train", True, config.input,
                                              preprocess, config.run.seed)()))
    assert set(plain) == {"image"}


def test_the_loss_counts_only_records_with_a_teacher():
    logits = tf.constant([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
    teacher = tf.constant([[0.25, 0.75], [0.0, 0.0], [1.0, 0.0]])
    expected = np.mean([-(0.25 * np.log(np.exp(2) / (np.exp(2) + 1)) +
                          0.75 * np.log(1 / (np.exp(2) + 1))), np.log(2.0)])
    loss = model.distillation_loss({"teacher": teacher, "image": None}, logits)
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)
    none = model.distillation_loss({"teacher": tf.zeros([3, 2])}, logits)
    assert none.numpy() == 0.0
    with pytest.raises(errors.UserError, match="--distill_weight needs training records"):
        model.distillation_loss({"image": None}, logits)


def test_a_teacher_of_the_wrong_width_publishes_nothing(tmp_path, drift_model, new_labels):
    original = os.path.join(os.path.dirname(drift_model), "data-1")
    merged = str(tmp_path / "merged")
    with pytest.raises(dataset.DatasetError, match="train-.*rows of 3 values for 64 images; each "
                       "needs 10, one per class"):
        merge.merge(original, new_labels, merged, CLASSES,
                    teacher=lambda images: [[0.2, 0.3, 0.5]] * len(images))
    assert not os.path.exists(os.path.join(merged, schema.INFO_FILE))


def test_distilling_a_data_set_without_teachers_names_the_flag_and_the_folder(
        drift_model):
    original = os.path.join(os.path.dirname(drift_model), "data-1")
    config = train_config.TrainConfig(data=train_config.DataOptions(data_dir=original))
    with pytest.raises(errors.UserError, match=r"--distill_weight 0.5: --data_dir %s has "
                       "no teacher" % original):
        training._teacher_classes(  # pylint: disable=protected-access
            config, model.ModelConfig(num_classes=10, distill_weight=0.5))
    assert training._teacher_classes(  # pylint: disable=protected-access
        config, model.ModelConfig(num_classes=10)) == 0


def test_an_unreadable_data_set_info_is_one_error_naming_it(tmp_path):
    (tmp_path / schema.INFO_FILE).write_bytes(b'{"teacher": tru')  # cut short
    config = train_config.TrainConfig(data=train_config.DataOptions(data_dir=str(tmp_path)))
    with pytest.raises(errors.UserError, match="--data_dir: .*dataset_info.json cannot be "
                       "read"):
        training._teacher_classes(  # pylint: disable=protected-access
            config, model.ModelConfig(num_classes=10, distill_weight=1.0))
