"""Shared fixtures. Real data: the digits image tree, its TFRecords, and small slim
checkpoints made by the tests themselves (no downloads), each built once per run for all
pytest-xdist workers (tests/run_once.py) and read-only: a test that changes one works on a
copy. `stub`: a PredictionService stub on the gRPC port of the requesting module's own
`server` fixture. The run's order and work units are tests/scheduling.py's. Each test
carries the marker of its layer, the folder it is in (tests/unit, tests/integration,
tests/system: `pytest -m unit`)."""
import os
import sys

import pytest

from slimserve.cli import logs
from tests import run_once
from tests import scheduling
from tests.helpers import IMAGE_SIZE, ROOT, run_cli

logs.quiet_tensorflow()
sys.path.insert(0, os.path.join(ROOT, "scripts"))


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(scheduling.XdistPlugin())


LAYERS = ("unit", "integration", "system")


@pytest.hookimpl(tryfirst=True)  # marked before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.parent.name in LAYERS:
            item.add_marker(item.path.parent.name)
        if scheduling.is_slow(item):
            item.add_marker(pytest.mark.slow)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    scheduling.arrange(items, scheduling.units_path(config) if worker else None)


@pytest.fixture(scope="module")
def stub(server):
    """A PredictionService stub on the gRPC port of the module's own `server` fixture."""
    import grpc  # pylint: disable=import-outside-toplevel
    from tensorflow_serving.apis import (  # pylint: disable=import-outside-toplevel
        prediction_service_pb2_grpc)
    with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
    def build(folder):
        import make_digits  # pylint: disable=import-outside-toplevel
        images = os.path.join(folder, "images")
        make_digits.write_digits(images, size=IMAGE_SIZE)
        return images
    return run_once.build_once(tmp_path_factory, "digits", build)


@pytest.fixture(scope="session")
def digits_data(tmp_path_factory, digits_dir):
    def build(folder):
        from slimserve.estimator import dataset  # pylint: disable=import-outside-toplevel
        dataset.build_dataset(digits_dir, folder, validation_fraction=0.2, train_shards=4,
                              validation_shards=2, seed=0, show_progress=False)
        return folder
    return run_once.build_once(tmp_path_factory, "digits_tfrecords", build)


@pytest.fixture(scope="session")
def imagenet_checkpoint(tmp_path_factory):
    """A resnet_v1_50 checkpoint shaped like the official one (1000-class head, slim
    names, non-trivial BatchNorm statistics)."""
    def build(folder):
        from slimserve.testing import slim_checkpoints  # pylint: disable=import-outside-toplevel
        return slim_checkpoints.make_imagenet_style_checkpoint(folder)
    return run_once.build_once(tmp_path_factory, "pretrained", build)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, digits_data):
    """A short resnet_v1_50 run on digits with EMA weights and the Final/Best exporters."""
    def build(model_dir):
        run_cli("slimserve.cli.train", "--data_dir", digits_data, "--model_dir", model_dir,
                "--image_size", IMAGE_SIZE, "--max_steps", 60, "--batch_size", 32,
                "--save_checkpoints_steps", 60, "--batch_norm_decay", 0.9,
                "--optimizer", "adam", "--learning_rate", 0.001, "--opt_epsilon", 1e-8,
                "--min_crop_area", 0.85, "--norandom_flip",
                "--eval_central_fraction", 1.0, "--log_step_count_steps", 30,
                "--moving_average_decay", 0.99)
        return model_dir
    return run_once.build_once(tmp_path_factory, "run", build)


@pytest.fixture(scope="session")
def export_dir(trained_run):
    base = os.path.join(trained_run, "export", "final")
    versions = sorted(os.listdir(base))
    return os.path.join(base, versions[-1])
