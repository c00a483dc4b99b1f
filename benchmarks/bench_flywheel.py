"""Drift detection's two acceptance figures, measured on real digits and a real model:
how often a window of unshifted traffic is flagged (the false alarm rate, stated at 5%),
and how many requests after a shift begins the alarm fires.

    python benchmarks/bench_flywheel.py                          # small: a cheap model
    python benchmarks/bench_flywheel.py --demo_dir demo_out/flywheel   # the demo's ResNet

Unshifted traffic is held-out digits (never trained on, not in the reference), drawn at
random into `--windows` windows of `--window_size`; each is tested against the served
version's reference as slimserve-drift tests a window (serving/observability/drift.py).
Shifted traffic: `--trials` streams of `--window_size` held-out digits followed by the
same digits written in another style (`--shift`), windows of `--window_size` ending every
`--window_step` requests; the delay is the requests from the first shifted one to the end
of the first flagged window. Every image's features (its logged probabilities, image
statistics, embeddings through the version's own signature) are computed once.

Without --demo_dir the model is the cheap digits classifier the tests use (logistic
regression on 8x8 grey features: 64-dimensional embeddings), fitted and given its
reference here; with it, the demo's served resnet_v1_50 export (2048-dimensional
embeddings) and the demo's held-out digits.
"""
import argparse
import json
import os
import time

import numpy as np

import common  # pylint: disable=wrong-import-order

from slimserve.cli import logs  # pylint: disable=wrong-import-order

logs.quiet_tensorflow()
from slimserve.serving.observability import drift  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.serving.observability import image_stats  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.serving.observability import reference as reference_lib  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.serving.observability import drift_pipeline  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.testing import digits_traffic  # noqa: E402  pylint: disable=wrong-import-position


def features(model, images):
    """A drift.Window of every image (probabilities as the served version answers)."""
    return drift.Window(model.probabilities(images),
                        np.stack([image_stats.statistics(i) for i in images]),
                        model.embeddings(images))


def rows(window, index):
    return drift.Window(window.probabilities[index], window.image_stats[index],
                        window.embeddings[index])


def setup(args):
    """(version dir, held-out image paths)."""
    if args.demo_dir:
        base = os.path.join(args.demo_dir, "models", "digits")
        version = min(int(v) for v in os.listdir(base) if v.isdigit())  # the first served
        parts = digits_traffic.split(os.path.join(args.demo_dir, "all_images"),
                                     {"train": 0.55, "traffic": 0.30, "test": 0.15})
        return os.path.join(base, str(version)), parts["traffic"] + parts["test"]
    work = common.work_dir("flywheel")
    import make_digits  # pylint: disable=import-outside-toplevel
    images = os.path.join(work, "images")
    if not os.path.exists(images):
        make_digits.write_digits(images, size=32)
    parts = digits_traffic.split(images, {"fit": 0.45, "reference": 0.2, "held_out": 0.35})
    base = os.path.join(work, "model")
    if not os.path.exists(os.path.join(base, "1")):
        digits_traffic.digits_model(work, parts["fit"], parts["reference"], base=base)
    return os.path.join(base, "1"), parts["held_out"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo_dir", default=None,
                        help="The flywheel demo's --work_dir: measure its served model.")
    parser.add_argument("--windows", type=int, default=200, help="Unshifted windows.")
    parser.add_argument("--trials", type=int, default=50, help="Shifted streams.")
    parser.add_argument("--window_size", type=int, default=100)
    parser.add_argument("--window_step", type=int, default=10)
    parser.add_argument("--shift", default="invert", help=", ".join(digits_traffic.SHIFTS))
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--permutations", type=int, default=500)
    parser.add_argument("--output", default=os.path.join(common.WORK, "flywheel.json"))
    args = parser.parse_args()
    started = time.time()
    version_dir, held_out = setup(args)
    reference = reference_lib.read(version_dir)
    model = drift_pipeline.VersionModel(version_dir)
    plain_bytes = [open(p, "rb").read() for p, _ in held_out]
    plain = features(model, plain_bytes)
    shifted = features(model, [digits_traffic.shift(b, args.shift) for b in plain_bytes])
    model.close()
    options = drift.DriftOptions(window_size=args.window_size, alpha=args.alpha,
                                 permutations=args.permutations)
    prepared = drift.Prepared(reference, options)
    rng = np.random.RandomState(0)
    size = args.window_size

    flagged, per_statistic = 0, dict.fromkeys(drift.STATISTICS, 0)
    for _ in range(args.windows):
        result = prepared.evaluate(rows(plain, rng.choice(plain.size, size, replace=False)))
        flagged += result.drift
        for name in result.moved():
            per_statistic[name] += 1

    delays = []
    for _ in range(args.trials):
        order = rng.permutation(plain.size)
        before, after = order[:size], order[size:]
        stream_plain = rows(plain, before)
        stream_shifted = rows(shifted, after)
        delay = None
        for end in range(size + args.window_step, size + len(after) + 1, args.window_step):
            shifted_count = end - size
            index_plain = np.arange(size)[shifted_count:] if shifted_count < size else []
            window = drift.Window(
                np.concatenate([stream_plain.probabilities[index_plain],
                                stream_shifted.probabilities[max(0, shifted_count - size):
                                                             shifted_count]]),
                np.concatenate([stream_plain.image_stats[index_plain],
                                stream_shifted.image_stats[max(0, shifted_count - size):
                                                           shifted_count]]),
                np.concatenate([stream_plain.embeddings[index_plain],
                                stream_shifted.embeddings[max(0, shifted_count - size):
                                                          shifted_count]]))
            if prepared.evaluate(window).drift:
                delay = shifted_count
                break
        delays.append(delay)
    detected = [d for d in delays if d is not None]
    result = {
        "model": "demo resnet_v1_50 (%s)" % version_dir if args.demo_dir else
                 "cheap digits classifier (64-d embeddings)",
        "embedding_size": int(reference.embeddings.shape[1]), "reference_images":
        reference.size, "held_out_images": plain.size, "window_size": size,
        "window_step": args.window_step, "alpha": args.alpha,
        "permutations": args.permutations, "shift": args.shift,
        "unshifted_windows": args.windows, "unshifted_flagged": flagged,
        "false_alarm_rate": flagged / float(args.windows),
        "unshifted_flagged_by_statistic": per_statistic,
        "shift_trials": args.trials, "detected": len(detected),
        "requests_to_detect": {"median": float(np.median(detected)) if detected else None,
                               "p90": float(np.percentile(detected, 90)) if detected
                               else None, "max": max(detected) if detected else None},
        "detected_within_200": sum(d <= 200 for d in detected),
        "seconds": round(time.time() - started, 1)}
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as handle:
        json.dump(result, handle, indent=2)
    common.table("drift on %s" % result["model"], ["figure", "value"], [
        ("unshifted windows flagged", "%d of %d (%.1f%%, stated <= %.0f%%)" % (
            flagged, args.windows, 100 * result["false_alarm_rate"], 100 * args.alpha)),
        ("... by statistic", ", ".join("%s %d" % item for item in per_statistic.items())),
        ("%s streams detected" % args.shift, "%d of %d" % (len(detected), args.trials)),
        ("requests to detect (median / p90 / max)", "%s / %s / %s" % (
            result["requests_to_detect"]["median"], result["requests_to_detect"]["p90"],
            result["requests_to_detect"]["max"])),
        ("detected within 200 requests", "%d of %d" % (result["detected_within_200"],
                                                        args.trials)),
        ("seconds", result["seconds"])])
    print("\nwritten: %s" % args.output)


if __name__ == "__main__":
    main()
