"""The retrain's gate: a candidate version judged against the serving version before it
may be published.

    report, reasons = canary.check(config, serving_dir, candidate_dir, new_data, original)

Three checks, each by flywheel/compare.py's in-process replay (both models answer, classes
compared by name): the logged traffic (--logs; the candidate may refuse at most
--max_candidate_error_rate of it), the held-out part of the new labels (accuracy must
gain more than --min_gain) and the original validation split (accuracy may drop at most
--max_regression). `reasons` is empty when the candidate passes every one.
"""
import dataclasses
import sys

from slimserve import errors
from slimserve import fields
from slimserve.estimator import schema
from slimserve.estimator import splits
from slimserve.flywheel import compare
from slimserve.serving.observability import log_reader


@dataclasses.dataclass
class CanaryConfig:
    """What a retrain's candidate must pass."""
    logs: str = fields.option(
        None, "Glob of request log files: the canary check replays this traffic on both "
        "versions, and the new version's warmup requests come from it.")
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


def split_images(data_dir, split):
    """(encoded images, class names) of a converted split."""
    examples = splits.read_examples(data_dir, split)
    images = [e.features.feature[schema.ENCODED].bytes_list.value[0] for e in examples]
    names = [e.features.feature[schema.TEXT].bytes_list.value[0].decode("utf-8")
             for e in examples]
    return images, names


def _bar(progress, description, total):
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    return tqdm(total=total, desc=description, unit="image", disable=not progress,
                file=sys.stderr, leave=False)


def check(config, serving_dir, candidate, new_data, original_data, progress=False):
    """The canary check of the version `candidate` against `serving_dir`, on the logged
    traffic (when config.logs), the validation split of `new_data` (the held-out new
    labels) and that of `original_data`; returns (report dict, [reasons to refuse])."""
    report, reasons = {}, []
    if config.logs:
        scan = log_reader.Scan()
        requests = compare.read_requests(config.logs, config.max_requests, scan)
        with _bar(progress, "replaying logged traffic", len(requests)) as bar:
            traffic = compare.compare(requests, serving_dir, candidate, progress=bar.update)
        report["traffic"] = {key: traffic[key] for key in (
            "requests", "predictions", "agreement", "baseline_error_rate",
            "candidate_error_rate", "errors_candidate", "flips")}
        report["traffic"]["skipped_logs"] = compare.skipped_json(scan)
        reasons += compare.verdict(traffic, None, config.max_candidate_error_rate)
    sets = {}
    for key, data_dir, split in (("holdout", new_data, "validation"),
                                 ("validation", original_data, "validation")):
        sets[key] = split_images(data_dir, split)
        if not sets[key][0]:
            raise errors.UserError("%s: no %s images to judge the candidate by" % (
                data_dir, split))
    total = 2 * sum(len(images) for images, _ in sets.values())
    with _bar(progress, "checking on the held-out labels and the validation split",
              total) as bar:  # both models loaded once for both sets
        report.update(compare.labelled_sets(sets, serving_dir, candidate,
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
