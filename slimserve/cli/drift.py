r"""slimserve-drift: is the served traffic still like what the model saw in training?

    slimserve-drift --logs='/logs/resnet*' --model_base_path=/models/resnet \
        --output_dir=drift/
    # then: slimserve-label --candidates=drift/candidates.jsonl ...

Reads the request logs (TF Serving's PredictionLog files the server writes) and the
model version that answered them (default: the one that answered last), and tests
windows of its traffic against the reference the version's export recorded
(assets.extra/reference/): class-prior, confidence, image-statistics and embedding shift,
each with a threshold calibrated by permutation. Prints one line per statistic of the
newest window and, last, `drift: yes` or `drift: no`, and exits 0 either way; when a
statistic could not be computed and none of the others drifts, `drift: unknown` and exit
status 1 (a statistic not computed is no evidence of no drift), as on an error. With --output_dir: report.json ("drift": true|false and each statistic with its
threshold), report.html (which statistic moved, since when, the most atypical served
images) and candidates.jsonl (the images most worth labelling, for slimserve-label).
"""
import dataclasses
import logging
import os
import sys

from slimserve import errors
from slimserve import fields
from slimserve.cli import logs
from slimserve.serving.observability import drift as drift_lib


@dataclasses.dataclass
class DriftConfig:
    """slimserve-drift's flags."""
    logs: str = fields.option(
        None, "Glob of request log files (TFRecords of PredictionLog, as the server's "
        "logging_config writes them).", required=True)
    model_base_path: str = fields.option(
        None, "The model's base path: the logged version's directory under it holds the "
        "reference (assets.extra/reference/) and the embeddings signature.", required=True)
    output_dir: str = fields.option(
        None, "Folder for report.json, report.html and candidates.jsonl (created; files "
        "are replaced whole).")
    model_name: str = fields.option(
        None, "Only this model's requests (default: the model that answered last).")
    model_version: int = fields.option(
        None, "The version whose traffic is tested (default: the version that answered "
        "last).", fields.Bound(0, fields.INT64_MAX), kind=int)
    compare_version: int = fields.option(
        None, "Another version of the model to run on the same images: candidates where "
        "the two disagree rank higher.", fields.Bound(0, fields.INT64_MAX), kind=int)
    max_images: int = fields.option(
        20000, "The newest served images of the version tested at most (log files are "
        "read newest first until they hold that many; older ones are not read).",
        fields.Bound(10, 10_000_000))
    max_windows: int = fields.option(
        100, "Windows kept in the report (the newest).", fields.Bound(1, 100_000))
    max_candidates: int = fields.option(
        200, "Images written to candidates.jsonl at most (the most worth labelling).",
        fields.Bound(0, 100_000))
    thumbnails: int = fields.option(
        24, "Most atypical served images shown in report.html.", fields.Bound(0, 1000))
    max_image_pixels: int = fields.option(
        50_000_000, "Logged images whose header claims more pixels are not decoded "
        "(decompression bombs).", fields.Bound(1, fields.INT64_MAX))
    max_image_bytes: int = fields.option(
        32 * 1024 * 1024, "Logged images larger than this are not decoded.",
        fields.Bound(1, fields.INT64_MAX))
    progress: bool = fields.option(True, "Show progress bars while reading the logs.")
    drift: drift_lib.DriftOptions = fields.section(drift_lib.DriftOptions)


CONFIG = DriftConfig


def _bar(config, description, total=None):
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    return tqdm(total=total, desc=description, unit="record" if total is None else "image",
                disable=not config.progress, file=sys.stderr, leave=False)


def _check_selection(config, selection):
    """UserError unless pass 1 found images of the version to test."""
    if selection.images:
        return
    if config.model_version is not None and selection.seen:
        model = config.model_name or next(iter(selection.seen))[0]
        raise errors.UserError("--model_version %d: no image prediction of model %s by that "
                               "version in --logs (logged versions: %s)" % (
                                   config.model_version, model,
                                   ", ".join(map(str, selection.versions_of(model)))
                                   or "none"))
    raise errors.UserError("--logs %s: no image predictions%s (records read: %s)" % (
        config.logs, " of model %s" % config.model_name if config.model_name else "",
        selection.scan.describe()))


def _version_dir(config, version, flag):
    path = os.path.join(config.model_base_path, str(version))
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if not tf.io.gfile.exists(os.path.join(path, "saved_model.pb")):
        raise errors.UserError("%s: --model_base_path %s has no version %d (no %s)" % (
            flag, config.model_base_path, version, os.path.join(path, "saved_model.pb")))
    return path


def analyse(config):
    """(report dict, DriftOutcome or None, reference or None): everything but printing
    and writing."""
    from slimserve.serving.observability import reference as reference_lib  # pylint: disable=import-outside-toplevel
    from slimserve.serving.tools import drift_reader  # pylint: disable=import-outside-toplevel
    from slimserve.serving.tools import drift_report  # pylint: disable=import-outside-toplevel
    from slimserve.serving.tools import label_candidates  # pylint: disable=import-outside-toplevel
    options = config.drift.validate()
    label_candidates.log_files(config.logs)  # none match: one line before any progress
    with _bar(config, "counting logged images") as bar:
        selection = drift_reader.select(config.logs, config.model_name, config.model_version,
                                        config.max_images, bar.update)
    _check_selection(config, selection)
    model_name, version = selection.model, selection.version
    version_dir = _version_dir(config, version, "the logged version")
    other_dir = None
    if config.compare_version is not None:
        other_dir = _version_dir(config, config.compare_version, "--compare_version")
    reference = reference_lib.read(version_dir)
    available = selection.images
    context = {"model_name": model_name, "model_version": version,
               "version_dir": version_dir, "logs": config.logs, "reference": reference,
               "options": dataclasses.asdict(options), "scan": selection.scan,
               "notes": ["the newest %d image(s) of version %d tested, from %d log file(s)"
                         % (min(available, config.max_images), version,
                            len(selection.files))]}
    if reference is None:
        why = ("version %d has no reference (no %s): exported before references were "
               "recorded; export it again to compare its traffic"
               % (version, reference_lib.directory(version_dir)))
        context["not_computed"] = {name: why for name in drift_lib.STATISTICS}
        logging.warning("%s", why)
        return drift_report.build(None, context), None, None
    model = drift_reader.VersionModel(version_dir)
    other = drift_reader.VersionModel(other_dir) if other_dir else None
    try:
        run = drift_reader.DriftRun(
            reference, options, model, other, config.max_windows, config.max_candidates,
            config.thumbnails, config.max_image_pixels, config.max_image_bytes)
        tested = label_candidates.Scan()
        with _bar(config, "testing served images", min(available, config.max_images)) as bar:
            for served in drift_reader.served_images(
                    selection, max(0, available - config.max_images), tested, bar.update):
                run.add(served)
        outcome = run.finish()
    finally:
        model.close()
        if other is not None:
            other.close()
    # Pass 1 decoded every record of every file read: its counts are the report's; pass 2
    # adds the records of other versions in the files tested (and a file damaged since).
    scan = selection.scan
    scan.skipped.update({why: n for why, n in tested.skipped.items()
                         if why == "other model or version"})
    scan.add_files(tested)
    context["scan"] = scan
    if not model.has_embeddings:
        context["not_computed"] = {"embeddings": "version %d has no embeddings signature"
                                   % version}
    if not outcome.windows:
        context["not_computed"] = {name: "%d image(s) read, fewer than a window needs"
                                   % outcome.images for name in drift_lib.STATISTICS}
    return drift_report.build(outcome, context), outcome, reference


def main(config, args):
    if args:
        raise errors.UserError("unexpected arguments: %s" % " ".join(args))
    from slimserve.serving.tools import drift_report  # pylint: disable=import-outside-toplevel
    if config.output_dir:
        with errors.writing(config.output_dir, "--output_dir"):
            os.makedirs(config.output_dir, exist_ok=True)
    report, outcome, reference = analyse(config)
    since = report.get("since")
    if since:
        logging.info("drifting since window %d (image %d, logged %s)", since["window"],
                     since["first_image"], since["start_utc"])
    if config.output_dir:
        paths = drift_report.write(
            config.output_dir, report, outcome,
            reference.class_names if reference is not None else (),
            drift_report.class_shares(reference, outcome))
        logging.info("report: %s", paths["html"])
        if "candidates" in paths:
            logging.info("%d candidate(s) for slimserve-label --candidates=%s",
                         len(outcome.candidates), paths["candidates"])
    for line in drift_report.lines(report):
        print(line, flush=True)
    if report["drift"] is None:
        raise errors.UserError("could not tell whether the traffic drifts: %s" % "; ".join(
            "%s not computed (%s)" % item for item in sorted(report["not_computed"].items())))
    return 0


def run():
    logs.run(main, config=CONFIG, concise=True)


if __name__ == "__main__":
    run()
