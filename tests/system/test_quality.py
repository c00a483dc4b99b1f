"""Fine-tuning quality on real digits, through the CLI and the flagfile the demo fine-tunes
with.

The suite's trained run (tests/conftest.py: resnet_v1_50 from scratch on all ten digits,
60 steps, EMA weights) stands in for the official slim checkpoint: fine-tuning from it
with `configs/digits_finetune.flags` (the head excluded and re-initialised, the stem and
block1 frozen) must reach 96% validation accuracy, leaving frozen weights and BN
statistics bit-identical. That the recipe's net learns from scratch is the trained run's
own evaluation.

The demo's source checkpoint (`configs/digits_source.flags`: 300 steps on digits 0-4) is
not trained here: it cost the suite about 160 CPU seconds, a tenth of it, for a source
whose only difference to the fine-tune's test is which digits it saw; `make demo` trains
it, and tests/test_command_flags.py checks the flagfile. Fine-tuning from the trained run
reached 98.1% at step 300 (from the digits 0-4 source: 96.9-98.9% over eight runs;
docs/benchmarks.md). The fine-tune is a run-wide fixture (tests/run_once.py), evaluated
once, at its last step.
"""
import glob
import os

import numpy as np
import pytest
import tensorflow as tf

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
def finetuned_run(tmp_path_factory, digits_data, trained_run):
    def build(model_dir):
        # Exporting (and verifying exports) is the session's trained run's and
        # tests/test_export.py's subject; here the Best and Final exports would only be
        # the demo's publication, at about 15 CPU seconds.
        run_cli("slimserve.cli.train", "--flagfile",
                os.path.join(FLAGS, "digits_finetune.flags"), "--data_dir", digits_data,
                "--model_dir", model_dir, "--checkpoint_path", trained_run, "--noexport",
                *EVERY)
        return model_dir
    return run_once.build_once(tmp_path_factory, "quality_finetune", build)


def test_training_from_scratch_learns_within_the_budget(trained_run):
    fresh = eval_accuracy_by_step(trained_run)
    print("from scratch on ten digits:", fresh)
    assert sorted(fresh) == [60]
    # 60 steps of batch 32 from random weights; runs ended at 87% (ten classes: chance 10%).
    assert fresh[60] >= 0.6


@pytest.mark.cost(110)
def test_finetuning_reaches_high_accuracy_with_frozen_layers_bit_identical(trained_run,
                                                                           finetuned_run):
    tuned = eval_accuracy_by_step(finetuned_run)
    print("fine-tuned:", tuned)
    assert sorted(tuned) == EVALUATED
    # From the digits 0-4 source, eight fp32 runs ended at 96.9-98.9% (docs/benchmarks.md);
    # from the trained run, 98.1%. One image is 0.28%, so 96% allows 14 of 359 wrong.
    assert tuned[300] >= 0.96

    before = tf.train.load_checkpoint(trained_run)
    after = tf.train.load_checkpoint(finetuned_run)
    # the net's variables, not the source's Adam slots or EMA shadows
    frozen = [n for n, _ in tf.train.list_variables(trained_run) if n.startswith(FROZEN)
              and not n.endswith(("/Adam", "/Adam_1", "/ExponentialMovingAverage"))]
    assert len(frozen) > 40
    for name in frozen:
        assert np.array_equal(before.get_tensor(name), after.get_tensor(name)), name
