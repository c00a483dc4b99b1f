"""input_fn over real digits TFRecords: shapes, ranges, order, bad shards."""
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from slimserve.estimator import dataset
from slimserve.estimator import inputs
from slimserve.estimator import preprocessing
from slimserve.estimator import schema
from slimserve.estimator import splits


SEED = 1


def _config(batch_size=16, **overrides):
    """The flags' config, one batch size for training and evaluation."""
    return inputs.InputConfig(**dict(dict(batch_size=batch_size, eval_batch_size=batch_size,
                                          random_flip=False, min_crop_area=0.85),
                                     **overrides))


def _spec(style=preprocessing.VGG):
    return preprocessing.Spec(32, style, central_fraction=1.0)


def _labels(input_fn, batches=None):
    ds = input_fn()
    if batches:
        ds = ds.take(batches)
    return np.concatenate([labels.numpy() for _, labels in ds])


def test_eval_pass_returns_every_example_in_a_fixed_order(digits_data):
    expected = splits.read_images(digits_data, "validation")[1]
    input_fn = inputs.make_input_fn(digits_data, "validation", False, _config(), _spec(), SEED)
    first, second = _labels(input_fn), _labels(input_fn)
    assert first.tolist() == second.tolist()  # deterministic interleave
    assert sorted(first.tolist()) == sorted(expected)


def test_shapes_dtypes_and_value_ranges(digits_data):
    for style, low, high in ((preprocessing.VGG, -124.0, 152.0),
                             (preprocessing.INCEPTION, -1.0, 1.0)):
        for training in (True, False):
            input_fn = inputs.make_input_fn(digits_data, "train" if training else "validation",
                                            training, _config(), _spec(style), SEED)
            features, labels = next(iter(input_fn()))
            image = features["image"].numpy()
            assert image.shape == (16, 32, 32, 3)
            assert image.dtype == np.float32
            assert labels.dtype == tf.int32
            assert low - 1e-3 <= image.min() and image.max() <= high + 1e-3
            assert image.std() > 0.1  # real pixels, not a constant
            assert set(labels.numpy()) <= set(range(10))


def test_training_order_is_fixed_by_the_seed_when_deterministic(digits_data):
    def labels(seed):
        config = _config(deterministic_input=True)
        return _labels(inputs.make_input_fn(digits_data, "train", True, config, _spec(), seed),
                       5).tolist()

    one, same, other = labels(1), labels(1), labels(2)
    assert one == same  # the same seed gives the same order, example for example
    assert one != other
    assert len(set(one)) == 10  # shuffling mixes shards: every class in the first batches


def test_a_data_dir_without_its_info_file_is_refused(digits_data, tmp_path):
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in os.listdir(digits_data):
        if name != "dataset_info.json":
            os.symlink(os.path.join(digits_data, name), partial / name)
    with pytest.raises(dataset.DatasetError, match="dataset_info.json.*not a finished"):
        inputs.make_input_fn(str(partial), "train", True, _config(), _spec(), SEED)


def test_training_drops_remainder_and_repeats(digits_data):
    input_fn = inputs.make_input_fn(digits_data, "train", True, _config(batch_size=100), _spec(),
                                    SEED)
    batches = list(input_fn().take(20))  # 2,000 > 1,438 examples: it repeats
    assert all(b[1].shape[0] == 100 for b in batches)


def _copy_shards(source, target, split="validation"):
    os.makedirs(target, exist_ok=True)
    for path in splits.split_files(source, split):
        shutil.copy(path, target)
    shutil.copy(os.path.join(source, schema.INFO_FILE), target)
    return splits.split_files(target, split)


def test_truncated_shard_is_an_error_naming_the_file(tmp_path, digits_data):
    files = _copy_shards(digits_data, str(tmp_path))
    size = os.path.getsize(files[1])
    with open(files[1], "r+b") as handle:
        handle.truncate(size - 100)
    with pytest.raises(dataset.DatasetError, match=os.path.basename(files[1]) + ".*truncated"):
        inputs.make_input_fn(str(tmp_path), "validation", False, _config(), _spec(), SEED)


def test_missing_shard_is_an_error_naming_the_file(tmp_path, digits_data):
    files = _copy_shards(digits_data, str(tmp_path))
    os.remove(files[0])
    with pytest.raises(dataset.DatasetError, match="missing shard.*validation-00000-of-00002"):
        inputs.make_input_fn(str(tmp_path), "validation", False, _config(), _spec(), SEED)


def test_corrupt_image_in_shard_is_skipped_not_fatal(tmp_path, digits_data):
    files = _copy_shards(digits_data, str(tmp_path))
    records = list(tf.compat.v1.io.tf_record_iterator(files[0]))
    bad = schema.make_example(b"\xff\xd8 this is not a jpeg", "jpeg", 3, "3", 8, 8)
    with tf.io.TFRecordWriter(files[0]) as writer:
        writer.write(records[0])
        writer.write(bad.SerializeToString())
        for record in records[1:]:
            writer.write(record)
    total = sum(1 for f in files for _ in tf.compat.v1.io.tf_record_iterator(f))
    for training in (False, True):
        input_fn = inputs.make_input_fn(str(tmp_path), "validation", training,
                                        _config(batch_size=1), _spec(), SEED, num_epochs=1)
        assert len(_labels(input_fn)) == total - 1
