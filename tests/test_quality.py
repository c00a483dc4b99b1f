"""Fine-tuning quality on real digits, through the CLIs and flagfiles the demo uses.

A slim-format source checkpoint (resnet_v1_50 trained on digits 0-4) stands in for the
official one; fine-tuning on all ten digits with the head excluded and the stem and
block1 frozen must reach 97% validation accuracy and beat training from scratch at the
same step budget, leaving frozen weights and BN statistics bit-identical.
"""
import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from slimserve.estimator import dataset
from tests.helpers import ROOT, run_cli

FLAGS = os.path.join(ROOT, "configs")
FROZEN = ("resnet_v1_50/conv1/", "resnet_v1_50/block1/")


def eval_accuracy_by_step(model_dir):
    points = {}
    for path in glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "accuracy":
                    points[event.step] = value.simple_value
    return points


@pytest.mark.slow
def test_finetuning_beats_scratch_and_reaches_high_accuracy(digits_dir, digits_data, tmp_path):
    source_images = tmp_path / "source_images"
    source_images.mkdir()
    for digit in "01234":
        os.symlink(os.path.join(digits_dir, digit), source_images / digit)
    source_data = str(tmp_path / "source_data")
    dataset.build_dataset(str(source_images), source_data, 0.2, train_shards=4,
                          validation_shards=1, show_progress=False)
    source = tmp_path / "source"
    run_cli("slimserve.cli.train", "--flagfile", os.path.join(FLAGS, "digits_source.flags"),
            "--data_dir", source_data, "--model_dir", source)
    finetune = tmp_path / "finetune"
    run_cli("slimserve.cli.train", "--flagfile", os.path.join(FLAGS, "digits_finetune.flags"),
            "--data_dir", digits_data, "--model_dir", finetune, "--checkpoint_path", source)
    scratch = tmp_path / "scratch"
    run_cli("slimserve.cli.train", "--flagfile", os.path.join(FLAGS, "digits_finetune.flags"),
            "--data_dir", digits_data, "--model_dir", scratch, "--freeze_scopes=",
            "--checkpoint_exclude_scopes=", "--noexport")

    tuned, fresh = eval_accuracy_by_step(str(finetune)), eval_accuracy_by_step(str(scratch))
    print("fine-tuned:", tuned, "\nfrom scratch:", fresh)
    assert sorted(tuned) == sorted(fresh) == [50, 100, 150, 200, 250, 300]
    # Seven fp32 runs of this recipe ended at 97.8-98.9% (docs/benchmarks.md); one image is 0.28%.
    assert tuned[300] >= 0.97
    # Better over the whole budget: the mean of the six evaluations (the learning curve),
    # not a single point, which a few images decide once both runs are near 98%.
    assert np.mean(list(tuned.values())) > np.mean(list(fresh.values()))

    before = tf.train.load_checkpoint(str(source))
    after = tf.train.load_checkpoint(str(finetune))
    frozen = [n for n, _ in tf.train.list_variables(str(source))
              if n.startswith(FROZEN) and not n.endswith(("/Adam", "/Adam_1"))]  # not slots
    assert len(frozen) > 40
    for name in frozen:
        assert np.array_equal(before.get_tensor(name), after.get_tensor(name)), name
    assert os.listdir(finetune / "export" / "final")
