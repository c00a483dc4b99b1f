"""The flywheel's last arrow (slimserve-retrain): new labels in, a checked version out,
published under `canary`.

    report = retrain.run(config)    # a RetrainConfig; report["passed"], ["published"]

Each step an existing piece called once, in a --model_dir that one retrain at a time
holds (`<model_dir>/retrain.lock`, taken before anything is written: a second run would
replace the held-out labels the first judges its candidate by):
1. publish.read_serving: the served model, the version that serves (stable), and the
   model config and versions as they are now (what publishing compares against);
2. convert: the class-folder tree slimserve-label wrote (--labels_dir) becomes TFRecords
   (estimator/dataset.py), a stratified --holdout_fraction of it held out;
3. merge.merge: the original data set's training split plus the new training part
   (--new_label_repeats times), its validation split unchanged plus the new held-out
   part, the serving model's classes; with --distill_weight, each original training
   image also carries the serving version's probabilities, which the fine-tune is held
   to (Learning without Forgetting: the old images keep their old answers);
4. fine_tune.run: fine-tune(s) from the serving version and the candidate export
   (a soup of seeds, an average with the serving weights);
5. canary.check: the candidate against the serving version on the logged traffic, the
   held-out new labels and the original validation split;
6. publish.publish, only for a candidate that passed (and unless --nopublish): a new
   version under `canary` (`stable` too with --promote), a compare-and-swap on what step
   1 read.
`<model_dir>/retrain_report.json` (written atomically) has every figure; run() returns
the same dictionary. Clients that must keep the stable version ask for version_label
"stable": TF Serving answers a request naming no version with the newest loaded version.
"""
import contextlib
import dataclasses
import json
import logging
import os

from slimserve import errors
from slimserve import fields
from slimserve import outputs
from slimserve.estimator import dataset
from slimserve.estimator import run_lock
from slimserve.estimator import train_config
from slimserve.flywheel import canary as canary_lib
from slimserve.flywheel import fine_tune as fine_tune_lib
from slimserve.flywheel import merge
from slimserve.flywheel import publish

REPORT = "retrain_report.json"


@dataclasses.dataclass
class RetrainConfig:
    """slimserve-retrain's flags: its own, the served model's (publishing), the
    candidate's (fine_tune) and the gate's (canary), then every slimserve-train flag
    (--data_dir is the data set the serving version was trained on, --model_dir the
    fine-tuning run)."""
    labels_dir: str = fields.option(
        None, "The class-folder tree slimserve-label wrote (<class>/<image>, "
        "provenance.jsonl): the new labels.", required=True)
    holdout_fraction: float = fields.option(
        0.25, "Share of each class of the new labels held out to judge the candidate.",
        fields.OPEN_FRACTION)
    new_label_repeats: int = fields.option(
        3, "Times the new training images appear in the merged training split (they "
        "weigh that much more against the original images).", fields.Bound(1, 100))
    progress: bool = fields.option(True, "Show progress bars.")
    publishing: publish.PublishConfig = fields.section(publish.PublishConfig)
    fine_tune: fine_tune_lib.FineTuneConfig = fields.section(fine_tune_lib.FineTuneConfig)
    canary: canary_lib.CanaryConfig = fields.section(canary_lib.CanaryConfig)
    train: train_config.TrainConfig = fields.section(train_config.TrainConfig)


def run(config):
    """The retrain (module docstring) -> its report: "passed", "refused_because" (the
    canary's reasons), and "published" ({version, labels, model_config_file}) or
    "publish_refused" (why publishing a candidate that passed was refused). A UserError
    for flags that cannot work together or a --model_dir another retrain holds, before
    anything is written."""
    publish.check_config(config.publishing)
    if not os.path.isdir(config.labels_dir):
        raise errors.UserError("--labels_dir %s is not a folder" % config.labels_dir)
    model_dir = config.train.run.model_dir
    with errors.writing(model_dir, "--model_dir"):
        lock = run_lock.RunLock.for_retrain(model_dir, config.train.guards.force_unlock)
        lock.acquire()
    try:
        return _run_locked(config)
    finally:
        lock.release()


def _run_locked(config):
    """run() once the retrain lock of --model_dir is held."""
    serving = publish.read_serving(config.publishing)
    original = config.train.data.data_dir
    model_dir = config.train.run.model_dir
    work = os.path.join(model_dir, "retrain")
    new_data, merged = os.path.join(work, "new_labels"), os.path.join(work, "data")
    logging.info("serving version %d of %s (%s); new labels from %s", serving.version,
                 serving.name, serving.version_dir, config.labels_dir)
    with errors.writing(work, "--model_dir"):
        os.makedirs(work, exist_ok=True)
        info = dataset.build_dataset(
            config.labels_dir, new_data, validation_fraction=config.holdout_fraction,
            train_shards=1, validation_shards=1, seed=config.train.run.seed,
            overwrite=True, show_progress=config.progress)
        with contextlib.ExitStack() as stack:
            teacher = (stack.enter_context(merge.teacher(serving.version_dir, serving.name,
                                                         serving.version))
                       if config.train.model.distill_weight else None)
            merged_info = merge.merge(original, new_data, merged, serving.class_names,
                                      config.new_label_repeats, teacher=teacher)
    logging.info("new labels: %d to train on, %d held out; merged training split %d "
                 "images, validation %d", info["splits"]["train"]["count"],
                 info["splits"]["validation"]["count"],
                 merged_info["splits"]["train"]["count"],
                 merged_info["splits"]["validation"]["count"])
    tuned = fine_tune_lib.run(config.fine_tune, config.train, serving.version_dir, merged,
                              warmup_from=config.canary.logs)
    result, candidate = tuned.runs[0][1], tuned.candidate
    report = {"serving": {"model": serving.name, "version": serving.version,
                          "path": serving.version_dir},
              "new_labels": {"train": info["splits"]["train"]["count"],
                             "holdout": info["splits"]["validation"]["count"]},
              "eval": _floats(result.eval_result),
              "soup": [{"model_dir": d, "seed": config.train.run.seed + i,
                        "eval": _floats(r.eval_result)}
                       for i, (d, r) in enumerate(tuned.runs)]
                      if config.fine_tune.soup_seeds > 1 else None,
              "candidate": candidate, "serving_weight": config.fine_tune.serving_weight,
              "distill_weight": config.train.model.distill_weight}
    if candidate is None:
        reasons = ["no export: %s" % ("; ".join(result.refused.values()) or
                                      "the run exported nothing")]
    else:
        checked, reasons = canary_lib.check(config.canary, serving.version_dir, candidate,
                                            new_data, original, progress=config.progress)
        report.update(checked)
    report["passed"] = not reasons
    report["refused_because"] = reasons
    if not reasons and config.publishing.publish:
        try:
            version, labels = publish.publish(config.publishing, serving, candidate)
            report["published"] = {"version": version, "labels": labels,
                                   "model_config_file": config.publishing.model_config_file}
        except errors.UserError as error:  # the candidate passed; publishing was refused
            report["publish_refused"] = str(error)
    with outputs.write_atomically(os.path.join(model_dir, REPORT), "--model_dir") as handle:
        json.dump(report, handle, indent=2, sort_keys=True)
    return report


def _floats(metrics):
    return {k: float(v) for k, v in (metrics or {}).items()}
