"""Shared real-data fixtures: the digits image tree, its TFRecords, and small slim
checkpoints made by the tests themselves (no downloads)."""
import os
import sys

import pytest

from slimserve.cli import logs
from tests.helpers import IMAGE_SIZE, ROOT, run_cli

logs.quiet_tensorflow()
sys.path.insert(0, os.path.join(ROOT, "scripts"))


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
    import make_digits  # pylint: disable=import-outside-toplevel
    folder = tmp_path_factory.mktemp("digits") / "images"
    make_digits.write_digits(str(folder), size=IMAGE_SIZE)
    return str(folder)


@pytest.fixture(scope="session")
def digits_data(tmp_path_factory, digits_dir):
    from slimserve.estimator import dataset  # pylint: disable=import-outside-toplevel
    out = str(tmp_path_factory.mktemp("digits_tfrecords"))
    dataset.build_dataset(digits_dir, out, validation_fraction=0.2, train_shards=4,
                          validation_shards=2, seed=0, show_progress=False)
    return out


@pytest.fixture(scope="session")
def imagenet_checkpoint(tmp_path_factory):
    """A resnet_v1_50 checkpoint shaped like the official one (1000-class head, slim
    names, non-trivial BatchNorm statistics), made once per session."""
    from slimserve.testing import slim_checkpoints  # pylint: disable=import-outside-toplevel
    return slim_checkpoints.make_imagenet_style_checkpoint(
        str(tmp_path_factory.mktemp("pretrained")))


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, digits_data):
    """A short resnet_v1_50 run on digits with EMA weights and the Final/Best exporters."""
    model_dir = str(tmp_path_factory.mktemp("run"))
    run_cli("slimserve.cli.train", "--data_dir", digits_data, "--model_dir", model_dir,
            "--image_size", IMAGE_SIZE, "--max_steps", 60, "--batch_size", 32,
            "--save_checkpoints_steps", 60, "--batch_norm_decay", 0.9,
            "--optimizer", "adam", "--learning_rate", 0.001, "--opt_epsilon", 1e-8,
            "--min_crop_area", 0.85, "--norandom_flip",
            "--eval_central_fraction", 1.0, "--log_step_count_steps", 30,
            "--moving_average_decay", 0.99)
    return model_dir


@pytest.fixture(scope="session")
def export_dir(trained_run):
    base = os.path.join(trained_run, "export", "final")
    versions = sorted(os.listdir(base))
    return os.path.join(base, versions[-1])
