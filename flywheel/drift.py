"""The operator's drift report: is the served traffic still like what the model saw in
training, and which images are worth labelling?

    result = drift.run(drift.DriftConfig(logs="/logs/resnet*", model_base_path="/models/r",
                                         output_dir="drift/"))
    result.lines()        # one line per statistic, then `drift: yes|no|unknown`
    result.verdict        # True, False, or None: a statistic could not be computed

The windows and statistics are serving's own drift pipeline
(serving/observability/drift_pipeline.py, what the server's monitor runs); this module
adds what only the report needs: the version's directory under --model_base_path, the
candidates for labelling (scored on the way by `CandidateScorer`: low confidence,
atypical embeddings, disagreement with --compare_version), the most atypical images'
thumbnails, and the files drift_report.py writes (report.json, report.html,
candidates.jsonl).
"""
import dataclasses
import hashlib
import logging
import os
import sys

import numpy as np

import tensorflow as tf
from tqdm import tqdm

from slimserve import errors
from slimserve import fields
from slimserve.flywheel import candidates
from slimserve.flywheel import drift_report
from slimserve.serving.observability import drift as drift_lib
from slimserve.serving.observability import drift_pipeline
from slimserve.serving.observability import log_reader
from slimserve.serving.observability import reference as reference_lib
from slimserve.serving.observability import thumbnails

THUMBNAIL_SIZE = 96


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


@dataclasses.dataclass
class DriftResult:
    """What run() found and wrote: the report dict (drift_report.build), the pipeline's
    DriftOutcome (None without a reference), the reference, the candidates (best first),
    the most atypical images [(Candidate, PNG bytes)] and the paths written."""
    report: dict
    outcome: object = None
    reference: object = None
    candidates: list = dataclasses.field(default_factory=list)
    atypical: list = dataclasses.field(default_factory=list)
    paths: dict = dataclasses.field(default_factory=dict)

    @property
    def verdict(self):
        return self.report["drift"]

    def lines(self):
        return drift_report.lines(self.report)

    def unknown_reason(self):
        """Why the run could not tell (for a verdict of None)."""
        missing = sorted(self.report["not_computed"].items())
        return "could not tell whether the traffic drifts: %s" % "; ".join(
            "%s not computed (%s)" % item for item in missing)


class CandidateScorer:
    """The DriftRun observer that scores each served image for labelling while its bytes
    are still there: low confidence, atypical embeddings (against the reference's) and,
    with `other` (a VersionModel of another version), disagreement. Keeps the best
    `max_candidates` and the `max_thumbnails` most atypical (with PNGs), bounded."""

    def __init__(self, reference_embeddings, class_names, other=None, max_candidates=200,
                 max_thumbnails=24, max_pixels=thumbnails.DEFAULT_MAX_PIXELS,
                 max_bytes=thumbnails.DEFAULT_MAX_BYTES, has_embeddings=True):
        self.other = other
        self.atypical = None
        if has_embeddings and reference_embeddings is not None:
            self.atypical = candidates.Atypical(reference_embeddings)
        self.disagreement = candidates.Disagreement(
            other_version=None if other is None else other.servable.version,
            class_names=class_names)
        self.best = candidates.Best(max_candidates)
        self.most_atypical = candidates.Best(max_thumbnails)
        self.max_pixels, self.max_bytes = max_pixels, max_bytes

    def __call__(self, batch, embeddings):
        others = self.other.probabilities([s.image for s in batch]) \
            if self.other is not None else None
        for row, served in enumerate(batch):
            self._score(served, None if embeddings is None else embeddings[row],
                        None if others is None else others[row])

    def _candidate(self, served, scores):
        return candidates.Candidate(
            served.log, served.index, served.item,
            log_reader.request_id(served.log, served.index, served.item),
            max(s for s, _ in scores), [r for _, r in scores], served.model_name,
            served.model_version, served.timestamp,
            log_reader.LoggedImage(b"", served.probabilities).top())

    def _score(self, served, embedding, other):
        scores = [candidates.low_confidence(
            log_reader.LoggedImage(b"", served.probabilities))]
        atypical = None
        if self.atypical is not None and embedding is not None and np.all(
                np.isfinite(embedding)):
            atypical = self.atypical.score_embeddings(embedding[None])[0]
            scores.append(atypical)
        if other is not None and np.all(np.isfinite(other)):
            found = self.disagreement.score(served.probabilities, other)
            if found is not None:
                scores.append(found)
        digest = hashlib.sha256(served.image).digest()
        self.best.offer(self._candidate(served, scores), digest)
        if atypical is not None:
            image = served.image
            self.most_atypical.offer(self._candidate(served, [atypical]), digest,
                                     payload=lambda _: self._thumbnail(image))

    def _thumbnail(self, image):
        try:
            return thumbnails.thumbnail(image, THUMBNAIL_SIZE, self.max_pixels,
                                        self.max_bytes)[0]
        except thumbnails.NotAnImage:
            return None

    def found(self):
        """(candidates best first, [(Candidate, PNG)] of the most atypical)."""
        atypical = [(c, self.most_atypical.payloads.get(c.request_id))
                    for c in self.most_atypical.best()]
        return self.best.best(), [(c, png) for c, png in atypical if png]


def _bar(config, description, total=None):
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
    if not tf.io.gfile.exists(os.path.join(path, "saved_model.pb")):
        raise errors.UserError("%s: --model_base_path %s has no version %d (no %s)" % (
            flag, config.model_base_path, version, os.path.join(path, "saved_model.pb")))
    return path


def analyse(config):
    """The DriftResult of `config` without writing anything."""
    options = config.drift.validate()
    log_reader.log_files(config.logs)  # none match: one line before any progress
    with _bar(config, "counting logged images") as bar:
        selection = drift_pipeline.select(config.logs, config.model_name,
                                          config.model_version, config.max_images, bar.update)
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
        return DriftResult(drift_report.build(None, context))
    model = drift_pipeline.VersionModel(version_dir)
    other = drift_pipeline.VersionModel(other_dir) if other_dir else None
    try:
        prepared = drift_lib.Prepared(reference, options)
        scorer = CandidateScorer(
            prepared.embeddings, reference.class_names, other, config.max_candidates,
            config.thumbnails, config.max_image_pixels, config.max_image_bytes,
            has_embeddings=model.has_embeddings)
        tested = log_reader.Scan()
        with _bar(config, "testing served images", min(available, config.max_images)) as bar:
            outcome = drift_pipeline.run(
                selection, prepared, options, model, config.max_images, tested, bar.update,
                max_windows=config.max_windows, max_pixels=config.max_image_pixels,
                max_bytes=config.max_image_bytes, observer=scorer)
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
    found, atypical = scorer.found()
    return DriftResult(drift_report.build(outcome, context), outcome, reference, found,
                       atypical)


def run(config):
    """Analyses `config`'s logs and, with --output_dir, writes the report's files (each
    whole or not at all); returns the DriftResult. A UserError for what the operator can
    fix (no logs, no such version, an output folder that cannot be made)."""
    config = fields.check(config)
    if config.output_dir:
        with errors.writing(config.output_dir, "--output_dir"):
            os.makedirs(config.output_dir, exist_ok=True)
    result = analyse(config)
    since = result.report.get("since")
    if since:
        logging.info("drifting since window %d (image %d, logged %s)", since["window"],
                     since["first_image"], since["start_utc"])
    if config.output_dir:
        reference = result.reference
        result.paths = drift_report.write(
            config.output_dir, result.report, result.candidates, result.atypical,
            reference.class_names if reference is not None else (),
            drift_report.class_shares(reference, result.outcome))
        logging.info("report: %s", result.paths["html"])
        if "candidates" in result.paths:
            logging.info("%d candidate(s) for slimserve-label --candidates=%s",
                         len(result.candidates), result.paths["candidates"])
    return result
