"""A canary check from served traffic: replay logged requests against a baseline and a
candidate SavedModel in process and say how often they agree.

What TFX's Evaluator and InfraValidator do inside a pipeline, done here from the
request logs the server writes (serving/observability/request_log.py), so a deployment script can
refuse a candidate before it takes traffic. Both models answer every request in turn
(the order alternating), so their latencies see the same machine.
"""
import collections
import time

import numpy as np
import tensorflow as tf

from slimserve import conventions
from slimserve.serving.core import errors
from slimserve.serving.core import servable as servable_lib
from slimserve.serving.core import version_dirs
from slimserve.serving.core import tensors

# Output keys read for the class decision and for the probabilities, in order of
# preference: slimserve's predict signatures, then TF Serving's classify convention.
CLASS_KEYS = (conventions.CLASSES,)
SCORE_KEYS = (conventions.PROBABILITIES, conventions.SCORES)


def resolve_model_dir(path):
    """A SavedModel directory, or a base path whose newest integer version is used."""
    if tf.io.gfile.exists(tf.io.gfile.join(path, "saved_model.pb")):
        return path
    versions = version_dirs.list_version_dirs(path)
    if not versions:
        raise ValueError("%s is neither a SavedModel directory nor a base path with an "
                         "integer version holding saved_model.pb" % path)
    return versions[max(versions)]


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
    raise ValueError("request log type %s cannot be replayed" % kind)


def _signature_name(log):
    kind = log.WhichOneof("log_type")
    return (getattr(log, kind).request.model_spec.signature_name
            or tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY)


def _decision(outputs):
    """(classes [B], scores [B, C] or None) from a signature's outputs."""
    scores = next((outputs[k] for k in SCORE_KEYS if k in outputs), None)
    classes = next((outputs[k] for k in CLASS_KEYS if k in outputs), None)
    if scores is not None and scores.ndim == 2:
        chosen = np.argmax(scores, axis=1)
        if classes is not None and classes.ndim == 2:  # classify: class names per column
            chosen = np.array([classes[i, j] for i, j in enumerate(chosen)], dtype=object)
        return chosen, scores
    if classes is not None:
        return classes.reshape(len(classes), -1)[:, 0], None
    raise ValueError("outputs %s have neither class ids nor scores to compare"
                     % sorted(outputs))


def _key(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def compare(logs, baseline_dir, candidate_dir, session_config=None, progress=None):
    """Replays `logs` (PredictionLog) against both models; returns the report dict."""
    baseline = servable_lib.Servable("baseline", 0, resolve_model_dir(baseline_dir), session_config)
    candidate = servable_lib.Servable("candidate", 0, resolve_model_dir(candidate_dir),
                                session_config)
    latencies = {"baseline": [], "candidate": []}
    agree = total = skipped = 0
    max_dp = []
    flips = collections.Counter()
    per_class = collections.Counter()
    try:
        for index, log in enumerate(logs):
            name = _signature_name(log)
            answers = {}
            order = (("baseline", baseline), ("candidate", candidate))
            for role, servable in (order if index % 2 == 0 else order[::-1]):
                try:
                    _, signature_def = servable.signature(name)
                    feeds = _feeds(log, signature_def)
                    started = time.perf_counter()
                    outputs = servable.run(signature_def, feeds, sorted(signature_def.outputs))
                    latencies[role].append(time.perf_counter() - started)
                    answers[role] = _decision(outputs)
                except (errors.ServingError, ValueError):
                    answers[role] = None
            if progress:
                progress()
            if answers["baseline"] is None or answers["candidate"] is None:
                skipped += 1
                continue
            (base_classes, base_scores), (cand_classes, cand_scores) = (
                answers["baseline"], answers["candidate"])
            for base, cand in zip(base_classes, cand_classes):
                total += 1
                per_class[_key(base)] += 1
                if _key(base) == _key(cand):
                    agree += 1
                else:
                    flips[(_key(base), _key(cand))] += 1
            if base_scores is not None and cand_scores is not None and (
                    base_scores.shape == cand_scores.shape):
                max_dp.extend(np.max(np.abs(base_scores - cand_scores), axis=1).tolist())
    finally:
        baseline.retire()
        candidate.retire()
    if not total:
        raise ValueError("none of the %d logged requests could be replayed against both "
                         "models (%d skipped)" % (len(logs), skipped))
    report = {
        "requests": len(logs), "skipped_requests": skipped, "predictions": total,
        "agreement": agree / total,
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
        millis = np.array(values) * 1e3
        report["latency_ms_" + role] = {"p50": float(np.percentile(millis, 50)),
                                        "p99": float(np.percentile(millis, 99))}
    return report


def format_report(report, min_agreement=None):
    """A short human-readable table of the report."""
    lines = ["requests replayed: %d (%d skipped), predictions compared: %d" % (
        report["requests"], report["skipped_requests"], report["predictions"]),
             "class agreement: %.4f%s" % (report["agreement"], "" if min_agreement is None
                                          else " (required >= %.4f)" % min_agreement)]
    if "max_abs_dp" in report:
        dp = report["max_abs_dp"]
        lines.append("max |dp| per prediction: p50 %.3g  p90 %.3g  p99 %.3g  max %.3g" % (
            dp["p50"], dp["p90"], dp["p99"], dp["max"]))
    lines.append("latency ms   p50      p99")
    for role in ("baseline", "candidate"):
        latency = report["latency_ms_" + role]
        lines.append("%-10s %7.2f  %7.2f" % (role, latency["p50"], latency["p99"]))
    if report["flips"]:
        lines.append("flips (baseline -> candidate: count)")
        lines += ["  %s -> %s: %d" % (f["baseline"], f["candidate"], f["count"])
                  for f in report["flips"][:20]]
    return "\n".join(lines)
