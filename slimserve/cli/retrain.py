r"""slimserve-retrain: new labels in, a checked version out, published under `canary`.

    slimserve-retrain --labels_dir=new_labels/ --data_dir=data/ \
        --model_config_file=models.config --logs='/logs/resnet*' \
        --model_dir=runs/retrain-1 --flagfile=runs/first/flags.txt --max_steps=300
    # a server polling models.config now also serves the new version as `canary`;
    # the same command with --promote moves `stable` to it as well

The flywheel's last arrow, each step an existing piece called once:
1. convert: the class-folder tree slimserve-label wrote (--labels_dir) becomes TFRecords
   (estimator/dataset.py), a stratified --holdout_fraction of it held out;
2. merge (estimator/merge.py): the original data set's training split plus the new
   training part (--new_label_repeats times), its validation split unchanged plus the new
   held-out part, the serving model's classes; with --distill_weight, each original
   training image also carries the serving version's probabilities, which the fine-tune
   is held to (Learning without Forgetting: the old images keep their old answers);
3. fine-tune from the serving version (training.run: its variables/variables are a
   checkpoint with slim's names, the head kept) and export (export/exporters.py: the
   Final and Best exporters, each export with its reference); with --soup_seeds N > 1,
   N fine-tunes that differ only in their seed (--seed, --seed + 1, ...; each under
   <model_dir>/soup/) are averaged into one (a model soup: when the runs stay in one
   basin it varies less from seed to seed than one run; measured on the flywheel demo it
   did worse, so it is off by default); with --serving_weight, the fine-tuned weights
   are also averaged with the serving version's (estimator/weight_averaging.py); an
   average is exported after the runs;
4. the canary check (serving/tools/compare.py) of the new export against the serving
   version: on the logged traffic (--logs: refusals), on the labelled hold-out and on the
   original validation split (accuracy);
5. only if the candidate refuses no more logged requests than allowed, is better on the
   held-out new labels (by more than --min_gain) and loses at most --max_regression on
   the original validation split: the version is copied into the model's base path and
   labelled `canary` in --model_config_file (`stable` stays on the serving version, both
   stay loaded); --promote moves `stable` too.
Exit status 0 when the candidate passed (and was published unless --nopublish), 1 when
it was refused or on an error; `<model_dir>/retrain_report.json` has every figure.
Clients that must keep the stable version ask for version_label "stable": TF Serving
answers a request naming no version with the newest loaded version.
"""
import contextlib
import dataclasses
import json
import logging
import os
import sys

from slimserve import errors
from slimserve import fields
from slimserve.cli import logs
from slimserve.estimator import train_config

REPORT = "retrain_report.json"
STABLE, CANARY = "stable", "canary"


@dataclasses.dataclass
class RetrainConfig:
    """slimserve-retrain's flags: its own, then every slimserve-train flag (--data_dir is
    the data set the serving version was trained on, --model_dir the fine-tuning run)."""
    labels_dir: str = fields.option(
        None, "The class-folder tree slimserve-label wrote (<class>/<image>, "
        "provenance.jsonl): the new labels.", required=True)
    logs: str = fields.option(
        None, "Glob of request log files: the canary check replays this traffic on both "
        "versions, and the new version's warmup requests come from it.")
    model_config_file: str = fields.option(
        None, "The server's --model_config_file: the new version is published in its "
        "model's version labels (canary; stable with --promote).")
    served_model: str = fields.option(
        None, "The model's name in --model_config_file (default: its only model).")
    model_base_path: str = fields.option(
        None, "The served model's base path (default: its base_path in "
        "--model_config_file).")
    serving_version: int = fields.option(
        None, "The version to fine-tune from and compare with (default: the version "
        "labelled stable, else the newest).", fields.Bound(0, fields.INT64_MAX), kind=int)
    holdout_fraction: float = fields.option(
        0.25, "Share of each class of the new labels held out to judge the candidate.",
        fields.OPEN_FRACTION)
    new_label_repeats: int = fields.option(
        3, "Times the new training images appear in the merged training split (they "
        "weigh that much more against the original images).", fields.Bound(1, 100))
    serving_weight: float = fields.option(
        0.0, "Share of the serving version's weights averaged into the fine-tuned ones "
        "before the check (WiSE-FT: keeps more of the original task at some cost on the "
        "new one); 0: the fine-tuned weights as they are.",
        fields.Bound(0.0, 1.0, upper_open=True))
    soup_seeds: int = fields.option(
        1, "Fine-tunes averaged into the candidate (a model soup): each from the serving "
        "version on the same data, seeds --seed, --seed + 1, ...; their weights and "
        "BatchNorm statistics averaged. N costs N fine-tunes; it helps only when the runs "
        "stay close enough to average (the flywheel demo's do not: docs/benchmarks.md).",
        fields.Bound(1, 16))
    min_gain: float = fields.option(
        0.0, "The candidate's accuracy on the held-out new labels must exceed the serving "
        "version's by more than this; a negative value tolerates that much loss (e.g. "
        "-1 when only the original validation split should decide).",
        fields.Bound(-1.0, 1.0, upper_open=True))
    max_regression: float = fields.option(
        0.01, "Accuracy on the original validation split the candidate may lose at most "
        "(0.01: one point).", fields.PROBABILITY)
    max_candidate_error_rate: float = fields.option(
        0.0, "Share of the replayed logged requests the candidate may refuse.",
        fields.PROBABILITY)
    max_requests: int = fields.option(2000, "Logged requests replayed at most.",
                                      fields.Bound(1, 10_000_000))
    publish: bool = fields.option(
        True, "Publish a candidate that passes (--nopublish: check and report only).")
    promote: bool = fields.option(
        False, "Also move the stable label to a candidate that passes.")
    progress: bool = fields.option(True, "Show progress bars.")
    train: train_config.TrainConfig = fields.section(train_config.TrainConfig)


CONFIG = RetrainConfig


@dataclasses.dataclass
class Serving:
    """The served model: where its versions are and which one serves (stable), and what
    publishing compares against: the model config file and the published versions as
    the run read them at its start."""
    name: str
    base_path: str
    version: int
    version_dir: str
    class_names: list
    labels: dict
    snapshot: object = None  # model_config.Snapshot of --model_config_file
    published: list = dataclasses.field(default_factory=list)  # versions under base_path


def _serving(config):
    from slimserve.export import versions as export_versions  # pylint: disable=import-outside-toplevel
    from slimserve.serving.config import model_config  # pylint: disable=import-outside-toplevel
    from slimserve.serving.core import version_dirs  # pylint: disable=import-outside-toplevel
    from slimserve.serving.clients import image_classifier  # pylint: disable=import-outside-toplevel
    name, base, labels, snapshot = config.served_model, config.model_base_path, {}, None
    if config.model_config_file:
        where = "--model_config_file %s" % config.model_config_file
        snapshot = model_config.read_snapshot(config.model_config_file)
        entry = model_config.model_entry(snapshot.config, name, where)
        name, labels = entry.name, dict(entry.version_labels)
        base = base or entry.base_path
    if not base:
        raise errors.UserError("give --model_config_file (the server's) or --model_base_path")
    versions = version_dirs.list_version_dirs(base)
    version = config.serving_version
    if version is None:
        version = labels.get(STABLE) or (max(versions) if versions else None)
    if version not in versions:
        raise errors.UserError("--model_base_path %s has no version %s holding "
                               "saved_model.pb" % (base, version))
    path = versions[version]
    names = image_classifier.read_model_labels(path)
    if not names:
        raise errors.UserError("%s has no assets/labels.txt: its classes are unknown" % path)
    return Serving(name or os.path.basename(base.rstrip("/")), base, version, path, names,
                   labels, snapshot, export_versions.list_versions(base))


@contextlib.contextmanager
def _teacher(serving):
    """encoded images -> the serving version's probabilities (its serving_default
    signature, as the server answers), for --distill_weight."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    from slimserve import conventions  # pylint: disable=import-outside-toplevel
    from slimserve.serving.core import servable as servable_lib  # pylint: disable=import-outside-toplevel
    servable = servable_lib.Servable(serving.name, serving.version, serving.version_dir)
    try:
        _, signature_def = servable.signature(conventions.DEFAULT_SIGNATURE)

        def probabilities(images):
            feeds = {conventions.IMAGE_BYTES: np.array(images, dtype=object)}
            return servable.run(signature_def, feeds,
                                [conventions.PROBABILITIES])[conventions.PROBABILITIES]
        yield probabilities
    finally:
        servable.retire()


def _train_config(config, serving, merged):
    """The fine-tune: the merged data, warm-started from the serving version (its head
    too: the classes are the same), exporting with warmup from the logged traffic (unless
    the export is of an average, made after the run)."""
    train = config.train
    if train.model.checkpoint_exclude_scopes:
        logging.info("--checkpoint_exclude_scopes=%s ignored: the serving version's head "
                     "fits the same classes", ",".join(train.model.checkpoint_exclude_scopes))
    checkpoint = os.path.join(serving.version_dir, "variables", "variables")
    return dataclasses.replace(
        train,
        data=dataclasses.replace(train.data, data_dir=merged, labels_file=None),
        model=dataclasses.replace(train.model, checkpoint_path=checkpoint,
                                  checkpoint_exclude_scopes=()),
        run=dataclasses.replace(train.run, mode="train_and_eval"),
        export=dataclasses.replace(train.export, export=not _averages(config),
                                   warmup_from=train.export.warmup_from or config.logs))


def _averages(config):
    """Whether the candidate is an average made after the run(s), not the run's export."""
    return bool(config.serving_weight) or config.soup_seeds > 1


def _fine_tune(config, serving, merged):
    """The fine-tune(s): one run in --model_dir, or with --soup_seeds N, N runs under
    <model_dir>/soup/ with seeds --seed, --seed + 1, ... -> [(model_dir, TrainResult)]."""
    from slimserve.estimator import training  # pylint: disable=import-outside-toplevel
    from slimserve.export import exporters  # pylint: disable=import-outside-toplevel
    train = _train_config(config, serving, merged)
    if config.soup_seeds == 1:
        return [(train.run.model_dir, training.run(train, exporters.for_training))]
    runs = []
    for member in range(config.soup_seeds):
        seed = train.run.seed + member
        model_dir = os.path.join(train.run.model_dir, "soup", "seed%d" % seed)
        logging.info("soup: fine-tune %d of %d (--seed %d) in %s", member + 1,
                     config.soup_seeds, seed, model_dir)
        member_config = dataclasses.replace(
            train, run=dataclasses.replace(train.run, model_dir=model_dir, seed=seed))
        runs.append((model_dir, training.run(member_config, exporters.for_training)))
    return runs


def _export_average(config, serving, run_dirs, model_dir, work):
    """--soup_seeds / --serving_weight: the runs' last checkpoints averaged (with the serving
    version's weights), exported under <model_dir>/export/averaged (the average was never
    evaluated: the check judges it)."""
    from slimserve.estimator import weight_averaging  # pylint: disable=import-outside-toplevel
    from slimserve.export import run_export  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tuned = [tf.train.latest_checkpoint(run_dir) for run_dir in run_dirs]
    if None in tuned:
        return None
    averaged, _ = weight_averaging.average_checkpoints(
        tuned, os.path.join(serving.version_dir, "variables", "variables"),
        config.serving_weight, os.path.join(work, "averaged", os.path.basename(tuned[0])))
    export = config.train.export
    return run_export.export_run(run_export.ExportConfig(
        model_dir=run_dirs[0], checkpoint_path=averaged,
        export_base=os.path.join(model_dir, "export", "averaged"), verify=export.verify_export,
        warmup_from=export.warmup_from or config.logs, export_min_metric="none")).path


def _candidate(result, model_dir):
    """The newest version export/final wrote in this run (else export/best's)."""
    for name in ("final", "best"):
        found = [p for p in result.exported
                 if os.path.dirname(os.path.abspath(p)) ==
                 os.path.join(os.path.abspath(model_dir), "export", name)]
        if found:
            return found[-1]
    return None


def _split_images(data_dir, split, class_names=None):
    """(encoded images, class names) of a converted split."""
    from slimserve.estimator import schema  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import splits  # pylint: disable=import-outside-toplevel
    examples = splits.read_examples(data_dir, split)
    images = [e.features.feature[schema.ENCODED].bytes_list.value[0] for e in examples]
    names = [e.features.feature[schema.TEXT].bytes_list.value[0].decode("utf-8")
             for e in examples]
    return images, names


def _bar(config, description, total):
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    return tqdm(total=total, desc=description, unit="image", disable=not config.progress,
                file=sys.stderr, leave=False)


def check(config, serving, candidate, new_data, original_data):
    """The canary check; returns (report dict, [reasons to refuse])."""
    from slimserve.serving.tools import compare  # pylint: disable=import-outside-toplevel
    from slimserve.serving.observability import log_reader as label_candidates  # pylint: disable=import-outside-toplevel
    report, reasons = {}, []
    if config.logs:
        scan = label_candidates.Scan()
        requests = compare.read_requests(config.logs, config.max_requests, scan)
        with _bar(config, "replaying logged traffic", len(requests)) as bar:
            traffic = compare.compare(requests, serving.version_dir, candidate,
                                      progress=bar.update)
        report["traffic"] = {key: traffic[key] for key in (
            "requests", "predictions", "agreement", "baseline_error_rate",
            "candidate_error_rate", "errors_candidate", "flips")}
        report["traffic"]["skipped_logs"] = compare.skipped_json(scan)
        reasons += compare.verdict(traffic, None, config.max_candidate_error_rate)
    sets = {}
    for key, data_dir, split in (("holdout", new_data, "validation"),
                                 ("validation", original_data, "validation")):
        sets[key] = _split_images(data_dir, split)
        if not sets[key][0]:
            raise errors.UserError("%s: no %s images to judge the candidate by" % (
                data_dir, split))
    total = 2 * sum(len(images) for images, _ in sets.values())
    with _bar(config, "checking on the held-out labels and the validation split",
              total) as bar:  # both models loaded once for both sets
        report.update(compare.labelled_sets(sets, serving.version_dir, candidate,
                                            progress=bar.update))
    holdout, validation = report["holdout"], report["validation"]
    gain = holdout["candidate_accuracy"] - holdout["baseline_accuracy"]
    if not gain > config.min_gain:
        reasons.append("held-out new labels: accuracy %.4f -> %.4f, a gain of %+.4f, not "
                       "more than --min_gain %g" % (holdout["baseline_accuracy"],
                                                    holdout["candidate_accuracy"], gain,
                                                    config.min_gain))
    loss = validation["baseline_accuracy"] - validation["candidate_accuracy"]
    if loss > config.max_regression + 1e-12:
        reasons.append("original validation split: accuracy %.4f -> %.4f, a loss of %.4f, "
                       "more than --max_regression %g" % (
                           validation["baseline_accuracy"], validation["candidate_accuracy"],
                           loss, config.max_regression))
    return report, reasons


def publish(config, serving, candidate):
    """Copies the candidate into the base path as a new version labelled canary (and
    stable with --promote) in --model_config_file; returns (version, labels). A
    compare-and-swap on what the run read at its start (serving.snapshot, the versions
    serving.published): a config someone changed, a version added or removed, or a
    config that cannot be written refuses it (a UserError naming what) with nothing
    servable left behind; the config names the version before it appears
    (export/versions.py publish_announced has the order and its crash points)."""
    from slimserve.export import versions  # pylint: disable=import-outside-toplevel
    from slimserve.serving.config import model_config  # pylint: disable=import-outside-toplevel
    labels = dict(serving.labels)

    def announce(version):
        labels.setdefault(STABLE, serving.version)
        labels[CANARY] = version
        if config.promote:
            labels[STABLE] = version
        return model_config.prepare_version_labels(
            config.model_config_file, serving.name, labels,
            set(labels.values()) | {serving.version}, expected=serving.snapshot)

    with errors.writing(serving.base_path, "--model_base_path"):
        version, final = versions.publish_announced(serving.base_path, candidate,
                                                    serving.published, announce)
    logging.info("published %s as %s", candidate, final)
    return version, labels


def main(config, args):
    if args:
        raise errors.UserError("unexpected arguments: %s" % " ".join(args))
    from slimserve.estimator import run_lock  # pylint: disable=import-outside-toplevel
    if config.publish and not config.model_config_file:
        raise errors.UserError("--model_config_file is needed to publish under the canary "
                               "label (or pass --nopublish to check only)")
    if config.promote and not config.publish:
        raise errors.UserError("--promote needs --publish")
    if not os.path.isdir(config.labels_dir):
        raise errors.UserError("--labels_dir %s is not a folder" % config.labels_dir)
    model_dir = config.train.run.model_dir
    # One retrain per --model_dir, refused before anything is written there: a second
    # one would replace the held-out labels the first judges its candidate by.
    with errors.writing(model_dir, "--model_dir"):
        lock = run_lock.RunLock.for_retrain(model_dir, config.train.guards.force_unlock)
        lock.acquire()
    try:
        return _locked_main(config)
    finally:
        lock.release()


def _locked_main(config):
    """main() once the retrain lock of --model_dir is held."""
    from slimserve.estimator import dataset  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import merge  # pylint: disable=import-outside-toplevel
    from slimserve import outputs  # pylint: disable=import-outside-toplevel
    serving = _serving(config)
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
            teacher = (stack.enter_context(_teacher(serving))
                       if config.train.model.distill_weight else None)
            merged_info = merge.merge(original, new_data, merged, serving.class_names,
                                      config.new_label_repeats, teacher=teacher)
    logging.info("new labels: %d to train on, %d held out; merged training split %d "
                 "images, validation %d", info["splits"]["train"]["count"],
                 info["splits"]["validation"]["count"],
                 merged_info["splits"]["train"]["count"],
                 merged_info["splits"]["validation"]["count"])
    runs = _fine_tune(config, serving, merged)
    result = runs[0][1]
    if _averages(config):
        with errors.writing(work, "--model_dir"):
            candidate = _export_average(config, serving, [d for d, _ in runs], model_dir,
                                        work)
    else:
        candidate = _candidate(result, model_dir)
    report = {"serving": {"model": serving.name, "version": serving.version,
                          "path": serving.version_dir},
              "new_labels": {"train": info["splits"]["train"]["count"],
                             "holdout": info["splits"]["validation"]["count"]},
              "eval": {k: float(v) for k, v in (result.eval_result or {}).items()},
              "soup": [{"model_dir": d, "seed": config.train.run.seed + i,
                        "eval": {k: float(v) for k, v in (r.eval_result or {}).items()}}
                       for i, (d, r) in enumerate(runs)] if config.soup_seeds > 1 else None,
              "candidate": candidate, "serving_weight": config.serving_weight,
              "distill_weight": config.train.model.distill_weight}
    if candidate is None:
        reasons = ["no export: %s" % ("; ".join(result.refused.values()) or
                                      "the run exported nothing")]
    else:
        checked, reasons = check(config, serving, candidate, new_data, original)
        report.update(checked)
    report["passed"] = not reasons
    report["refused_because"] = reasons
    if not reasons and config.publish:
        try:
            version, labels = publish(config, serving, candidate)
            report["published"] = {"version": version, "labels": labels,
                                   "model_config_file": config.model_config_file}
        except errors.UserError as error:  # the candidate passed; publishing was refused
            report["publish_refused"] = str(error)
    with outputs.write_atomically(os.path.join(model_dir, REPORT), "--model_dir") as handle:
        json.dump(report, handle, indent=2, sort_keys=True)
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
    if reasons:
        print("slimserve-retrain: candidate REFUSED: %s" % "; ".join(reasons),
              file=sys.stderr)
        sys.exit(1)
    if "publish_refused" in report:
        raise errors.UserError("the candidate passed, publishing it was refused: %s (the "
                               "candidate: %s)" % (report["publish_refused"], candidate))
    if "published" in report:
        print("published version %d: %s" % (report["published"]["version"], ", ".join(
            "%s=%d" % item for item in sorted(report["published"]["labels"].items()))))
    else:
        print("passed (not published: --nopublish): %s" % candidate)
    return 0


def run():
    logs.run(main, config=CONFIG, concise=True)


if __name__ == "__main__":
    run()
