"""Drift: is a window of served traffic still like what the model saw in training?

Four two-sample statistics compare a window of served images with the version's
reference (serving/observability/reference.py: a sample of validation images as the
export saw them):

- `class_prior`: the predicted classes' shares (total variation distance between the
  window's and the reference's predicted-class histograms);
- `confidence`: the top-1 probability (Kolmogorov-Smirnov distance);
- `image_stats`: width, height, channels, brightness and contrast (the largest of the
  five Kolmogorov-Smirnov distances; the report names the feature that moved);
- `embeddings`: the penultimate-layer features (squared maximum mean discrepancy with a
  Gaussian kernel whose width is the reference's median pairwise distance).

Each threshold is calibrated by permutation (the reference and the window pooled and
split at random `permutations` times, with one seeded set of splits for all
statistics): a statistic flags its window when it exceeds its threshold, which happens
by chance with probability at most alpha / (statistics computed) when the window comes
from the reference's distribution (Bonferroni), so a window is flagged by chance with
probability at most `alpha` (5% by default). The p-values are exact up to the
permutations' resolution, 1 / (permutations + 1); DriftOptions refuses fewer
permutations than the level needs.

Everything here is numpy over arrays already in memory: reading logs and computing
served images' features is drift_pipeline.py's job.
"""
import dataclasses
import math
from typing import Dict, Optional

import numpy as np

from slimserve import errors
from slimserve import fields
from slimserve.serving.observability import image_stats

STATISTICS = ("class_prior", "confidence", "image_stats", "embeddings")
DESCRIPTIONS = {
    "class_prior": "predicted-class shares (total variation distance)",
    "confidence": "top-1 probability (Kolmogorov-Smirnov distance)",
    "image_stats": "image size, channels, brightness, contrast (largest KS distance)",
    "embeddings": "penultimate-layer embeddings (MMD^2, Gaussian kernel)",
}
MAX_PERMUTATIONS = 100_000


@dataclasses.dataclass
class DriftOptions:
    """How windows of traffic are formed and tested; the flags of slimserve-drift (the
    server maps its --drift_* flags onto the same fields)."""
    window_size: int = fields.option(
        200, "Served images per window: each window is tested against the reference.",
        fields.Bound(10, 100_000))
    window_step: int = fields.option(
        None, "Images between the ends of two windows (default: --window_size, windows that "
        "do not overlap; smaller: sliding windows, a finer 'since when').",
        fields.Bound(1, 100_000), kind=int)
    alpha: float = fields.option(
        0.05, "Chance that a window of traffic like the reference's is flagged (the false "
        "alarm rate per window), split equally among the statistics.", fields.OPEN_FRACTION)
    permutations: int = fields.option(
        500, "Random splits of reference + window that calibrate each threshold.",
        fields.Bound(20, MAX_PERMUTATIONS))
    max_reference: int = fields.option(
        512, "Reference images compared at most (a seeded subsample of a larger reference).",
        fields.Bound(10, 100_000))
    seed: int = fields.option(0, "Seed of the permutations and subsamples.",
                              fields.Bound(0, fields.INT32_MAX - 1))

    @property
    def step(self):
        return self.window_step or self.window_size

    def validate(self, statistics=len(STATISTICS)):
        """Raises UserError unless the permutations can reach each statistic's level;
        returns self."""
        fields.check(self)
        needed = math.ceil(statistics / self.alpha)
        if self.permutations + 1 < needed:
            raise errors.UserError(
                "--permutations=%d cannot reach the level alpha/%d = %.4g: give at least %d"
                % (self.permutations, statistics, self.alpha / statistics, needed - 1))
        return self


@dataclasses.dataclass
class StatisticResult:
    """One statistic of one window."""
    name: str
    value: float
    threshold: float   # the value above which the window is flagged (calibrated)
    p_value: float
    level: float       # alpha / statistics computed
    drift: bool
    detail: str = ""   # what moved, in words

    def to_json(self):
        return {"value": self.value, "threshold": self.threshold, "p_value": self.p_value,
                "level": self.level, "drift": self.drift, "detail": self.detail,
                "description": DESCRIPTIONS[self.name]}


@dataclasses.dataclass
class Window:
    """The served images of one window, as arrays (row i = image i)."""
    probabilities: np.ndarray          # [n, C]
    image_stats: np.ndarray            # [n, 5]; rows of NaN for images that did not decode
    embeddings: Optional[np.ndarray]   # [n, D] (NaN rows: not computed) or None

    @property
    def size(self):
        return int(self.probabilities.shape[0])


@dataclasses.dataclass
class WindowResult:
    statistics: Dict[str, StatisticResult]
    images: int

    @property
    def drift(self):
        return any(s.drift for s in self.statistics.values())

    def moved(self):
        """Names of the statistics that flagged the window."""
        return [name for name in STATISTICS if name in self.statistics and
                self.statistics[name].drift]


def _threshold(permuted, level):
    """(threshold, reachable): the (r+1)-th largest permuted value, r = floor(level *
    (P + 1)) - 1, so that value > threshold <=> p-value <= level."""
    rank = int(math.floor(level * (len(permuted) + 1))) - 1
    if rank < 0:
        return float("inf"), False
    ordered = np.sort(permuted)[::-1]
    return float(ordered[rank]), True


def _p_value(observed, permuted):
    return float((1 + np.sum(permuted >= observed - 1e-12)) / (len(permuted) + 1))


def _ks_many(values, masks):
    """Kolmogorov-Smirnov distance between the masked (True) and unmasked values, for
    each row of masks [P, n] (the first row may be the observed split)."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    member = masks[:, order].astype(np.float64)
    n_in = member.sum(axis=1, keepdims=True)
    n_out = member.shape[1] - n_in
    cdf_in = np.cumsum(member, axis=1) / n_in
    cdf_out = np.cumsum(1.0 - member, axis=1) / n_out
    # Compare the CDFs only where the value changes (ties count together).
    last = np.append(sorted_values[1:] != sorted_values[:-1], True)
    return np.max(np.abs(cdf_in - cdf_out)[:, last], axis=1)


def _tv_many(classes, num_classes, masks):
    onehot = np.zeros((len(classes), num_classes))
    onehot[np.arange(len(classes)), classes] = 1.0
    member = masks.astype(np.float64)
    counts_in = member @ onehot
    counts_all = onehot.sum(axis=0)
    n_in = member.sum(axis=1, keepdims=True)
    share_in = counts_in / n_in
    share_out = (counts_all - counts_in) / (len(classes) - n_in)
    return 0.5 * np.abs(share_in - share_out).sum(axis=1)


def _sq_distances(a, b):
    a2 = np.sum(a * a, axis=1)[:, None]
    b2 = np.sum(b * b, axis=1)[None, :]
    return np.maximum(a2 + b2 - 2.0 * (a @ b.T), 0.0)


def _mmd_many(kernel, masks):
    """Biased squared MMD of each split of the pooled kernel matrix."""
    member = masks.astype(np.float64)
    n_in = member.sum(axis=1, keepdims=True)
    weights = member / n_in - (1.0 - member) / (member.shape[1] - n_in)
    return np.einsum("pi,pi->p", weights @ kernel, weights)


class Prepared:
    """A reference made ready for many windows: subsampled, its kernel block computed."""

    def __init__(self, reference, options):
        self.options = options.validate()
        rng = np.random.RandomState(options.seed)
        keep = np.arange(reference.size)
        if reference.size > options.max_reference:
            keep = np.sort(rng.choice(reference.size, options.max_reference, replace=False))
        self.reference = reference
        self._masks = {}
        self.num_classes = len(reference.class_names)
        self.classes = reference.predicted[keep]
        self.confidences = reference.confidences[keep].astype(np.float64)
        self.stats = reference.image_stats[keep]
        self.embeddings = None
        if reference.embeddings is not None:
            self.embeddings = reference.embeddings[keep].astype(np.float64)
            distances = _sq_distances(self.embeddings, self.embeddings)
            upper = distances[np.triu_indices(len(keep), 1)]
            median = float(np.median(upper[upper > 0])) if np.any(upper > 0) else 1.0
            self.bandwidth = median  # squared distance scale of the Gaussian kernel
            self.kernel_rr = np.exp(-distances / self.bandwidth)

    @property
    def size(self):
        return len(self.classes)

    def masks(self, window_size):
        """[P + 1, n_ref + n_window] booleans: row 0 the observed split (the window is the
        True part), rows 1.. the seeded random splits, the same for every window of one
        size (kept for the last few sizes asked)."""
        if window_size in self._masks:
            return self._masks[window_size]
        if len(self._masks) >= 4:
            self._masks.pop(next(iter(self._masks)))
        total = self.size + window_size
        rng = np.random.RandomState(self.options.seed + 1)
        masks = np.zeros((self.options.permutations + 1, total), bool)
        masks[0, self.size:] = True
        for row in range(1, len(masks)):
            masks[row, rng.choice(total, window_size, replace=False)] = True
        self._masks[window_size] = masks
        return masks

    def evaluate(self, window, masks=None):
        """WindowResult of `window` (a Window) against this reference."""
        n = window.size
        if n < 2:
            raise ValueError("a window needs at least 2 images")
        masks = self.masks(n) if masks is None else masks
        computed = {}
        classes = np.concatenate([self.classes, window.probabilities.argmax(axis=1)])
        computed["class_prior"] = (_tv_many(classes, max(self.num_classes,
                                                         int(classes.max()) + 1), masks),
                                   self._class_detail(window))
        confidences = np.concatenate([self.confidences, window.probabilities.max(axis=1)])
        computed["confidence"] = (_ks_many(confidences, masks),
                                  "median %.3f -> %.3f" % (
                                      np.median(self.confidences),
                                      np.median(window.probabilities.max(axis=1))))
        decoded = np.all(np.isfinite(window.image_stats), axis=1)
        if decoded.sum() >= 2:
            computed["image_stats"] = self._image_stats(
                window.image_stats[decoded],
                masks if decoded.all() else self.masks(int(decoded.sum())))
        if self.embeddings is not None and window.embeddings is not None:
            embedded = np.all(np.isfinite(window.embeddings), axis=1)
            if embedded.sum() >= 2:
                computed["embeddings"] = self._embeddings(
                    window.embeddings[embedded].astype(np.float64),
                    masks if embedded.all() else self.masks(int(embedded.sum())))
        level = self.options.alpha / len(computed)
        results = {}
        for name in STATISTICS:
            if name not in computed:
                continue
            values, detail = computed[name]
            observed, permuted = float(values[0]), values[1:]
            threshold, _ = _threshold(permuted, level)
            results[name] = StatisticResult(name, observed, threshold,
                                            _p_value(observed, permuted), level,
                                            observed > threshold, detail)
        return WindowResult(results, n)

    def _class_detail(self, window):
        ref = np.bincount(self.classes, minlength=self.num_classes) / float(self.size)
        got = np.bincount(window.probabilities.argmax(axis=1),
                          minlength=self.num_classes)[:self.num_classes] / float(window.size)
        moved = int(np.argmax(np.abs(got - ref)))
        name = self.reference.class_names[moved]
        return "%s: %.1f%% -> %.1f%% of predictions" % (name, 100 * ref[moved],
                                                        100 * got[moved])

    def _embeddings(self, embeddings, masks):
        """Squared MMD of the pooled kernel matrix (the reference block computed once)."""
        m = self.size
        kernel = np.empty((m + len(embeddings), m + len(embeddings)))
        kernel[:m, :m] = self.kernel_rr
        cross = np.exp(-_sq_distances(embeddings, self.embeddings) / self.bandwidth)
        kernel[m:, :m] = cross
        kernel[:m, m:] = cross.T
        kernel[m:, m:] = np.exp(-_sq_distances(embeddings, embeddings) / self.bandwidth)
        values = _mmd_many(kernel, masks)
        return values, "MMD^2 %.4f" % values[0]

    def _image_stats(self, stats, masks):
        """Largest KS distance over the five features, of the window's images that
        decoded (`masks` split the reference and those)."""
        pooled = np.concatenate([self.stats, stats])
        per_feature = np.stack([_ks_many(pooled[:, j], masks)
                                for j in range(pooled.shape[1])])
        values = per_feature.max(axis=0)
        j = int(np.argmax(per_feature[:, 0]))
        name = image_stats.NAMES[j]
        return values, "%s: mean %.3g -> %.3g" % (name, self.stats[:, j].mean(),
                                                  stats[:, j].mean())
