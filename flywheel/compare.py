"""A canary check from served traffic: replay logged requests against a baseline and a
candidate SavedModel in process and say how often they agree (slimserve-compare: a
CompareConfig and `run`; slimserve-retrain's gate, flywheel/canary.py, replays with it too).

What TFX's Evaluator and InfraValidator do inside a pipeline, done here from the
request logs the server writes (serving/observability/request_log.py), so a deployment script can
refuse a candidate before it takes traffic. Both models answer every request in turn
(the order alternating), so their latencies see the same machine.

A canary that can fail: a request the candidate refuses where the baseline answers is a
disagreement (not a skipped request), both error rates are reported, and `verdict`
refuses a candidate above --max_candidate_error_rate or below --min_agreement. Classes
are compared and listed by name, from each model's labels.txt.
"""
import collections
import contextlib
import dataclasses
import json
import time

import numpy as np
import tensorflow as tf

from slimserve import conventions
from slimserve import fields
from slimserve.errors import UserError
from slimserve.serving.clients import image_classifier
from slimserve.serving.core import errors
from slimserve.serving.core import servable as servable_lib
from slimserve.serving.core import tensors
from slimserve import outputs as outputs_lib
from slimserve.serving.observability import log_reader


REPLAYABLE = ("predict_log", "classify_log", "regress_log")


@dataclasses.dataclass
class CompareConfig:
    """slimserve-compare's flags."""
    logs: str = fields.option(None, "Glob of request log files (TFRecords of PredictionLog, "
                              "as the server's logging_config writes them).", required=True)
    baseline: str = fields.option(
        None, "SavedModel directory, or a base path (its newest version is used).",
        required=True)
    candidate: str = fields.option(
        None, "SavedModel directory, or a base path (its newest version is used).",
        required=True)
    min_agreement: float = fields.option(
        None, "Exit 1 when class agreement is below this (0..1); without it the report is "
        "informational.", fields.PROBABILITY, kind=float)
    max_candidate_error_rate: float = fields.option(
        0.0, "Exit 1 when the candidate refuses (errors on) more than this fraction of the "
        "replayed requests (0..1; default 0: any refusal fails the canary).",
        fields.PROBABILITY)
    max_requests: int = fields.option(10000, "Logged requests replayed at most.",
                                      fields.Bound(1, 10_000_000))
    json_output: str = fields.option(None, "Also write the report as JSON to this file.")
    progress: bool = fields.option(True, "Show a progress bar.")


def run(config):
    """slimserve-compare: replays the logged requests on both models and judges the
    candidate; returns the report ("passed", "refused_because": the reasons), also written
    atomically to config.json_output (checked writable before anything is replayed)."""
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    outputs_lib.check_output(config.json_output, "--json_output")
    scan = log_reader.Scan()
    requests = read_requests(config.logs, config.max_requests, scan)
    with tqdm(total=len(requests), disable=not config.progress, unit="req") as bar:
        report = compare(requests, config.baseline, config.candidate, progress=bar.update)
    report["skipped_logs"] = skipped_json(scan)
    report["min_agreement"] = config.min_agreement
    report["max_candidate_error_rate"] = config.max_candidate_error_rate
    reasons = verdict(report, config.min_agreement, config.max_candidate_error_rate)
    report["passed"] = not reasons
    report["refused_because"] = reasons
    if config.json_output:
        with outputs_lib.write_atomically(config.json_output, "--json_output") as handle:
            json.dump(report, handle, indent=2)
    return report


def summary(report):
    """What slimserve-compare prints of run()'s report: the table (format_report) and
    what was not replayed."""
    text = format_report(report, report["min_agreement"], report["max_candidate_error_rate"])
    skipped = report["skipped_logs"]
    if skipped["records"]:
        text += "\nnot replayed: %s" % "; ".join(
            ["%d %s" % (n, why) for why, n in sorted(skipped["records"].items())] +
            ["%s (%s)" % (f["log"], f["reason"]) for f in skipped["files"]])
    return text


def read_requests(pattern, limit, scan=None):
    """The first `limit` replayable logged requests (Predict, Classify, Regress) of the
    request-log files `pattern` (--logs) matches, read by the flywheel's one log reader
    (log_reader.iter_indexed): other records, damaged files and files of another
    program's records are counted (and the files named) in `scan`, a
    log_reader.Scan, never fatal. A UserError naming --logs when no file matches,
    and naming what was skipped when no request is left to replay."""
    scan = scan if scan is not None else log_reader.Scan()
    requests = []
    for _, _, log in log_reader.iter_indexed(pattern, scan):
        kind = log.WhichOneof("log_type")
        if kind not in REPLAYABLE:
            scan.skipped["record without a replayable request (%s)" % (kind or "none")] += 1
            continue
        requests.append(log)
        if len(requests) >= limit:
            break
    if not requests:
        raise UserError("--logs %s: no logged request to replay (%s)" % (
            pattern, scan.describe()))
    return requests


def skipped_json(scan):
    """What read_requests skipped, for a report: {"records": {why: count}, "files":
    [{"log", "kind", "reason"}]}."""
    return {"records": dict(scan.skipped), "files": scan.files_json()}


def _feeds(log, signature_def):
    """The request a PredictionLog holds, as the feeds of its signature."""
    kind = log.WhichOneof("log_type")
    if kind == "predict_log":
        request = log.predict_log.request
        return tensors.decode_inputs(request.inputs, signature_def.inputs)
    if kind in ("classify_log", "regress_log"):
        request = getattr(log, kind).request
        examples = [e.SerializeToString() for e in request.input.example_list.examples]
        return {next(iter(signature_def.inputs)): np.array(examples, dtype=object)}
    raise UserError("request log type %s cannot be replayed" % kind)


def _signature_name(log):
    kind = log.WhichOneof("log_type")
    return (getattr(log, kind).request.model_spec.signature_name
            or tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY)


def _refusal(error):
    """How a refused request is listed: its status code (ServingError) or the reason."""
    if isinstance(error, errors.ServingError):
        return error.code.name
    return "unreplayable: %s" % error


def _percentiles(values, keys=(50, 99)):
    millis = np.array(values) * 1e3
    return {"p%d" % k: float(np.percentile(millis, k)) if values else None for k in keys}


REFUSED = "(refused: %s)"  # the candidate's side of a flip it refused


def compare(logs, baseline_dir, candidate_dir, session_config=None, progress=None):
    """Replays `logs` (PredictionLog) against both models; returns the report dict.

    A request both answer compares their classes prediction by prediction, by class name
    (each model's labels.txt) so that two exports numbering classes differently compare
    right. A request the baseline answers and the candidate refuses counts as a
    disagreement for each of its predictions (a flip to "(refused: CODE)"); one the
    baseline refuses and the candidate answers is reported, not compared; one both refuse
    is counted. Error rates are per replayed request."""
    with _loaded(baseline_dir, candidate_dir, session_config) as models:
        return _replay(logs, models, progress)


@contextlib.contextmanager
def _loaded(baseline_dir, candidate_dir, session_config):
    """{role: (Servable, class names)} of both models, retired on the way out (the
    baseline too when the candidate fails to load)."""
    models = {}
    try:
        for role, directory in (("baseline", baseline_dir), ("candidate", candidate_dir)):
            path = image_classifier.resolve_model_dir(directory)
            models[role] = (servable_lib.Servable(role, 0, path, session_config),
                            image_classifier.read_model_labels(path))
        yield models
    finally:
        for servable, _ in models.values():
            servable.retire()


def _replay(logs, models, progress):
    latencies = {"baseline": [], "candidate": []}
    refusals = {"baseline": collections.Counter(), "candidate": collections.Counter()}
    agree = total = replayed = both_refused = 0
    candidate_only_refused = baseline_only_refused = 0
    max_dp = []
    flips = collections.Counter()
    per_class = collections.Counter()
    order = ("baseline", "candidate")
    for index, log in enumerate(logs):
        replayed += 1
        name = _signature_name(log)
        answers = {}
        for role in (order if index % 2 == 0 else order[::-1]):
            servable, names = models[role]
            try:
                _, signature_def = servable.signature(name)
                feeds = _feeds(log, signature_def)
                started = time.perf_counter()
                outputs = servable.run(signature_def, feeds, sorted(signature_def.outputs))
                latencies[role].append(time.perf_counter() - started)
                answers[role] = image_classifier.decision(outputs, names)
            except (errors.ServingError, UserError, ValueError) as error:
                answers[role] = _refusal(error)
                refusals[role][answers[role]] += 1
        if progress:
            progress()
        base, cand = answers["baseline"], answers["candidate"]
        if isinstance(base, str):
            both_refused += isinstance(cand, str)
            baseline_only_refused += not isinstance(cand, str)
            continue
        base_classes, base_scores = base
        if isinstance(cand, str):
            candidate_only_refused += 1
            cand_classes, cand_scores = [REFUSED % cand] * len(base_classes), None
        else:
            cand_classes, cand_scores = cand
        for base_class, cand_class in zip(base_classes, cand_classes):
            total += 1
            per_class[base_class] += 1
            if base_class == cand_class:
                agree += 1
            else:
                flips[(base_class, cand_class)] += 1
        if base_scores is not None and cand_scores is not None and (
                base_scores.shape == cand_scores.shape):
            max_dp.extend(np.max(np.abs(base_scores - cand_scores), axis=1).tolist())
    if not total:
        raise UserError("none of the %d logged requests was answered by the baseline "
                        "(%d refused by both; baseline refusals: %s)" % (
                            replayed, both_refused, dict(refusals["baseline"])))
    report = {
        "requests": replayed,
        "skipped_requests": both_refused + baseline_only_refused,
        "predictions": total,
        "agreement": agree / total,
        "baseline_error_rate": sum(refusals["baseline"].values()) / replayed,
        "candidate_error_rate": sum(refusals["candidate"].values()) / replayed,
        "errors_baseline": dict(refusals["baseline"]),
        "errors_candidate": dict(refusals["candidate"]),
        "refused_by_candidate_only": candidate_only_refused,
        "refused_by_baseline_only": baseline_only_refused,
        "refused_by_both": both_refused,
        "flips": [{"baseline": b, "candidate": c, "count": n}
                  for (b, c), n in flips.most_common()],
        "flip_rate_by_baseline_class": {
            cls: sum(n for (b, _), n in flips.items() if b == cls) / count
            for cls, count in sorted(per_class.items())},
    }
    if max_dp:
        values = np.array(max_dp)
        report["max_abs_dp"] = {"p50": float(np.percentile(values, 50)),
                                "p90": float(np.percentile(values, 90)),
                                "p99": float(np.percentile(values, 99)),
                                "max": float(values.max())}
    for role, values in latencies.items():
        report["latency_ms_" + role] = _percentiles(values)
    return report


def labelled(images, labels, baseline_dir, candidate_dir, session_config=None, batch=32,
             progress=None):
    """The canary check on labelled images (a labelled hold-out, a validation split):
    both models answer every image through serving_default (encoded bytes in), and each
    answer is compared by class name (each model's labels.txt) with `labels`, the images'
    class names. Returns {"images", "baseline_accuracy", "candidate_accuracy", "fixed"
    (wrong -> right), "broken" (right -> wrong)}; an image a model refuses counts as
    wrong for that model."""
    return labelled_sets({None: (images, labels)}, baseline_dir, candidate_dir,
                         session_config, batch, progress)[None]


def labelled_sets(sets, baseline_dir, candidate_dir, session_config=None, batch=32,
                  progress=None):
    """labelled() for several sets of images ({key: (images, labels)} -> {key: report}),
    loading each model once (a ResNet-50 SavedModel costs seconds to load)."""
    for key, (images, labels) in sets.items():
        if len(images) != len(labels) or not images:
            raise UserError("labelled check%s: %d images, %d labels" % (
                "" if key is None else " (%s)" % key, len(images), len(labels)))
    reports = {}
    with _loaded(baseline_dir, candidate_dir, session_config) as models:
        for key, (images, labels) in sets.items():
            correct = {}
            for role, (servable, names) in models.items():
                _, signature_def = servable.signature(conventions.DEFAULT_SIGNATURE)
                right = []
                for start in range(0, len(images), batch):
                    chunk = images[start:start + batch]
                    answers = _answer_each(servable, signature_def, names, chunk)
                    right += [answer == label for answer, label in
                              zip(answers, labels[start:start + batch])]
                    if progress:
                        progress(len(chunk))
                correct[role] = np.array(right)
            reports[key] = {
                "images": len(images),
                "baseline_accuracy": float(correct["baseline"].mean()),
                "candidate_accuracy": float(correct["candidate"].mean()),
                "fixed": int(np.sum(~correct["baseline"] & correct["candidate"])),
                "broken": int(np.sum(correct["baseline"] & ~correct["candidate"]))}
    return reports


def _answer_each(servable, signature_def, names, images):
    """Class names of a batch (one image at a time when the batch is refused: a refused
    image answers None)."""
    feeds = {conventions.IMAGE_BYTES: np.array(images, dtype=object)}
    try:
        outputs = servable.run(signature_def, feeds, sorted(signature_def.outputs))
        return image_classifier.decision(outputs, names)[0]
    except errors.ServingError:
        if len(images) == 1:
            return [None]
    return [a for image in images
            for a in _answer_each(servable, signature_def, names, [image])]


def verdict(report, min_agreement=None, max_candidate_error_rate=0.0):
    """[reasons to refuse the candidate]; empty when it passes both gates."""
    reasons = []
    if report["candidate_error_rate"] > max_candidate_error_rate:
        reasons.append("candidate error rate %.4f > --max_candidate_error_rate %.4f (%s)" % (
            report["candidate_error_rate"], max_candidate_error_rate,
            ", ".join("%s: %d" % item for item in sorted(report["errors_candidate"].items()))))
    if min_agreement is not None and report["agreement"] < min_agreement:
        reasons.append("agreement %.4f < --min_agreement %.4f"
                       % (report["agreement"], min_agreement))
    return reasons


def format_report(report, min_agreement=None, max_candidate_error_rate=None):
    """A short human-readable table of the report."""
    lines = ["requests replayed: %d (%d not compared), predictions compared: %d" % (
        report["requests"], report["skipped_requests"], report["predictions"]),
             "class agreement: %.4f%s" % (report["agreement"], "" if min_agreement is None
                                          else " (required >= %.4f)" % min_agreement)]
    for role in ("baseline", "candidate"):
        counts = report["errors_" + role]
        lines.append("%s error rate: %.4f%s%s" % (
            role, report[role + "_error_rate"],
            " (allowed <= %.4f)" % max_candidate_error_rate
            if role == "candidate" and max_candidate_error_rate is not None else "",
            " [%s]" % ", ".join("%s: %d" % item for item in sorted(counts.items()))
            if counts else ""))
    if report["refused_by_baseline_only"]:
        lines.append("answered by the candidate only (not compared): %d"
                     % report["refused_by_baseline_only"])
    if "max_abs_dp" in report:
        dp = report["max_abs_dp"]
        lines.append("max |dp| per prediction: p50 %.3g  p90 %.3g  p99 %.3g  max %.3g" % (
            dp["p50"], dp["p90"], dp["p99"], dp["max"]))
    lines.append("latency ms   p50      p99")
    for role in ("baseline", "candidate"):
        latency = report["latency_ms_" + role]
        if latency["p50"] is None:
            lines.append("%-10s %7s  %7s" % (role, "-", "-"))
        else:
            lines.append("%-10s %7.2f  %7.2f" % (role, latency["p50"], latency["p99"]))
    if report["flips"]:
        lines.append("flips (baseline -> candidate: count)")
        lines += ["  %s -> %s: %d" % (f["baseline"], f["candidate"], f["count"])
                  for f in report["flips"][:20]]
    return "\n".join(lines)
