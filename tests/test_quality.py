"""Fine-tuning quality on real digits, through the CLIs and flagfiles the demo uses.

A slim-format source checkpoint (resnet_v1_50 trained from scratch on digits 0-4) stands
in for the official one; fine-tuning on all ten digits with the head excluded and the stem
and block1 frozen must reach 96% validation accuracy, leaving frozen weights and BN
statistics bit-identical. That the recipe learns from scratch is the source run's own
evaluation.

The two trainings are run-wide fixtures (tests/run_once.py), built once for all workers
and evaluated once each, at their last step (the demo evaluates every 50 steps; the
figures along the way are docs/benchmarks.md's). A from-scratch run of the fine-tune's
recipe to step 100, to compare with the fine-tune there, was dropped: across runs the
fine-tune scored 83.3-97.2% at step 100 and scratch 81-88%, so the order is not a
property of the recipe (a clean-clone CI run saw 83.3% against 88.3%), and it cost the
suite a minute of CPU.
"""
import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from slimserve.estimator import dataset
from tests import run_once
from tests.helpers import ROOT, run_cli

FLAGS = os.path.join(ROOT, "configs")
FROZEN = ("resnet_v1_50/conv1/", "resnet_v1_50/block1/")
EVALUATED = [300]  # EVERY: the demo evaluates every 50 steps, the suite at the end
EVERY = ["--save_checkpoints_steps=300"]

pytestmark = pytest.mark.slow


def eval_accuracy_by_step(model_dir):
    points = {}
    for path in glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "accuracy":
                    points[event.step] = value.simple_value
    return points


@pytest.fixture(scope="session")
def source_run(tmp_path_factory, digits_dir):
    """The source checkpoint: the demo's recipe on digits 0-4 only."""
    def build(folder):
        images = os.path.join(folder, "images")
        os.mkdir(images)
        for digit in "01234":
            os.symlink(os.path.join(digits_dir, digit), os.path.join(images, digit))
        data = os.path.join(folder, "data")
        dataset.build_dataset(images, data, 0.2, train_shards=4, validation_shards=1,
                              show_progress=False)
        model_dir = os.path.join(folder, "run")
        run_cli("slimserve.cli.train", "--flagfile", os.path.join(FLAGS, "digits_source.flags"),
                "--data_dir", data, "--model_dir", model_dir)  # evaluated once, at the end
        return model_dir
    return run_once.build_once(tmp_path_factory, "quality_source", build)


@pytest.fixture(scope="session")
def finetuned_run(tmp_path_factory, digits_data, source_run):
    def build(model_dir):
        # Exporting (and verifying exports) is the session's trained run's and
        # tests/test_export.py's subject; here the Best and Final exports would only be
        # the demo's publication, at about 15 CPU seconds.
        run_cli("slimserve.cli.train", "--flagfile",
                os.path.join(FLAGS, "digits_finetune.flags"), "--data_dir", digits_data,
                "--model_dir", model_dir, "--checkpoint_path", source_run, "--noexport",
                *EVERY)
        return model_dir
    return run_once.build_once(tmp_path_factory, "quality_finetune", build)


def test_training_from_scratch_learns_within_the_budget(source_run):
    fresh = eval_accuracy_by_step(source_run)
    print("from scratch on digits 0-4:", fresh)
    assert sorted(fresh) == [300]
    # The demo's source recipe from random weights; earlier runs ended at 98.3% (five
    # classes: chance is 20%).
    assert fresh[300] >= 0.9


def test_finetuning_reaches_high_accuracy_with_frozen_layers_bit_identical(source_run,
                                                                           finetuned_run):
    tuned = eval_accuracy_by_step(finetuned_run)
    print("fine-tuned:", tuned)
    assert sorted(tuned) == EVALUATED
    # Eight fp32 runs of this recipe ended at 96.9-98.9% (docs/benchmarks.md; the 96.9% was
    # a clean-clone CI run's); one image is 0.28%, so 96% allows 14 of 359 wrong.
    assert tuned[300] >= 0.96

    before = tf.train.load_checkpoint(source_run)
    after = tf.train.load_checkpoint(finetuned_run)
    frozen = [n for n, _ in tf.train.list_variables(source_run)
              if n.startswith(FROZEN) and not n.endswith(("/Adam", "/Adam_1"))]  # not slots
    assert len(frozen) > 40
    for name in frozen:
        assert np.array_equal(before.get_tensor(name), after.get_tensor(name)), name
