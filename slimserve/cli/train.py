r"""slimserve-train: fine-tune a slim net on TFRecords with tf.estimator.train_and_evaluate.

    slimserve-train --flagfile=configs/own_images_finetune.flags --data_dir=data/ \
        --model_dir=runs/mine --checkpoint_path=resnet_v1_50.ckpt

--data_dir is the output of slimserve-convert. The console shows progress, each
evaluation and each export; --verbosity=1 adds TensorFlow's own INFO log. Every flag is
written to `<model_dir>/flags.txt` (usable as --flagfile) and the model/input settings
that export needs to `<model_dir>/slimserve.json`.

The flags are the fields of estimator/train_config.py's TrainConfig; the run is
estimator/training.py's `run`, with export/exporters.py's exporters wired in here.
"""
import sys

from slimserve.cli import logs
from slimserve.estimator import train_config
from slimserve.estimator import training
from slimserve.export import exporters

CONFIG = train_config.TrainConfig

# Exit status of a run that trained but exported nothing: no evaluation cleared
# --export_min_metric. (A final export refused for falling below the run's best while
# export/best holds that best is reported, not an error.)
EXIT_EXPORT_REFUSED = 3


def main(config, args):
    del args
    result = training.run(config, exporters_factory=exporters.for_training)
    if result.eval_result:
        print("eval: " + ", ".join("%s=%.4f" % (k, float(v))
                                   for k, v in sorted(result.eval_result.items())))
    for name, reason in result.refused.items():
        print("export/%s: nothing exported: %s" % (name, reason), file=sys.stderr)
    for path in result.exported:
        print("exported %s" % path)
    if result.export_refused:
        sys.exit(EXIT_EXPORT_REFUSED)


def run():
    logs.run(main, config=CONFIG, concise=True)


if __name__ == "__main__":
    run()
