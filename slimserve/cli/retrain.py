r"""slimserve-retrain: new labels in, a checked version out, published under `canary`.

    slimserve-retrain --labels_dir=new_labels/ --data_dir=data/ \
        --model_config_file=models.config --logs='/logs/resnet*' \
        --model_dir=runs/retrain-1 --flagfile=runs/first/flags.txt --max_steps=300
    # a server polling models.config now also serves the new version as `canary`;
    # the same command with --promote moves `stable` to it as well

The flywheel's last arrow: the new labels (slimserve-label's class-folder tree) are
converted with a held-out part, merged into the serving version's data set, fine-tuned
from the serving version, checked against it (logged traffic, held-out new labels,
original validation split) and, only if the candidate refuses no more logged requests
than allowed, is better on the held-out new labels (by more than --min_gain) and loses
at most --max_regression on the original validation split, copied into the model's base
path and labelled `canary` in --model_config_file (`stable` stays on the serving
version; --promote moves it too).
Exit status 0 when the candidate passed (and was published unless --nopublish), 1 when
it was refused or on an error; `<model_dir>/retrain_report.json` has every figure.
Clients that must keep the stable version ask for version_label "stable": TF Serving
answers a request naming no version with the newest loaded version.

The flags are the fields of flywheel/retrain.py's RetrainConfig (with every
slimserve-train flag); the pipeline is its `run`.
"""
import sys

from slimserve import errors
from slimserve.cli import logs
from slimserve.flywheel import retrain

CONFIG = retrain.RetrainConfig


def main(config, args):
    if args:
        raise errors.UserError("unexpected arguments: %s" % " ".join(args))
    report = retrain.run(config)
    for key, what in (("holdout", "held-out new labels"),
                      ("validation", "original validation")):
        if key in report:
            print("%s: accuracy %.4f -> %.4f (%d images)" % (
                what, report[key]["baseline_accuracy"], report[key]["candidate_accuracy"],
                report[key]["images"]))
    if "traffic" in report:
        print("logged traffic: %d requests, agreement %.4f, candidate error rate %.4f" % (
            report["traffic"]["requests"], report["traffic"]["agreement"],
            report["traffic"]["candidate_error_rate"]))
    if report["refused_because"]:
        print("slimserve-retrain: candidate REFUSED: %s" % "; ".join(
            report["refused_because"]), file=sys.stderr)
        sys.exit(1)
    if "publish_refused" in report:
        raise errors.UserError("the candidate passed, publishing it was refused: %s (the "
                               "candidate: %s)" % (report["publish_refused"],
                                                   report["candidate"]))
    if "published" in report:
        print("published version %d: %s" % (report["published"]["version"], ", ".join(
            "%s=%d" % item for item in sorted(report["published"]["labels"].items()))))
    else:
        print("passed (not published: --nopublish): %s" % report["candidate"])
    return 0


def run():
    logs.run(main, config=CONFIG, concise=True)


if __name__ == "__main__":
    run()
