"""The report of a bulk inference run: counts, and with true labels the accuracy,
per-class precision and recall and the confusion matrix (as JSON, optionally as a PNG).

Read back from the written JSON lines in one pass, holding only counts, so a run of any
length is summarized in bounded memory; written whole or not at all at the path the user
gave (serving/tools/outputs.py).
"""
import collections
import json

import numpy as np
import tensorflow as tf

from slimserve import errors
from slimserve.serving.tools import outputs


def summarize_file(output, class_names=None):
    """summarize() over a written JSONL file, streamed (rows are not all held)."""
    with tf.io.gfile.GFile(output) as handle:
        return summarize((json.loads(line) for line in handle if line.strip()), class_names)


def summarize(rows, class_names=None):
    """Counts; with true labels: accuracy, per-class precision/recall, confusion matrix.
    One pass over `rows` (any iterable), holding only counts.

    Rows with an error count as errors, not as wrong predictions.
    """
    images = errors_count = 0
    pairs = collections.Counter()  # (true label, predicted name) -> count
    for row in rows:
        images += 1
        if "error" in row:
            errors_count += 1
        elif row.get("label") is not None:
            pairs[(row["label"], row["class_name"])] += 1
    summary = {"images": images, "predicted": images - errors_count,
               "errors": errors_count}
    if not pairs:
        return summary
    labelled = sum(pairs.values())
    names = sorted(class_names or {label for label, _ in pairs} |
                   {name for _, name in pairs})
    index = {name: i for i, name in enumerate(names)}
    matrix = np.zeros((len(names), len(names)), dtype=np.int64)
    for (label, name), count in pairs.items():
        matrix[index[label], index[name]] += count
    correct = int(np.trace(matrix))
    per_class = {}
    for name, i in index.items():
        predicted, actual = int(matrix[:, i].sum()), int(matrix[i, :].sum())
        per_class[name] = {
            "precision": float(matrix[i, i] / predicted) if predicted else None,
            "recall": float(matrix[i, i] / actual) if actual else None,
            "support": actual}
    summary.update({"labelled": labelled, "correct": correct,
                    "accuracy": correct / float(labelled), "classes": names,
                    "per_class": per_class, "confusion_matrix": matrix.tolist()})
    return summary


def write_summary(summary, path, confusion_png=None):
    """The summary as JSON (--summary); the confusion matrix as a PNG when asked
    (--confusion_matrix, needs matplotlib). Each file is whole or absent."""
    with outputs.write_atomically(path, "--summary") as handle:
        json.dump(summary, handle, indent=2, sort_keys=True)
    if confusion_png and "confusion_matrix" in summary:
        plot_confusion(summary, confusion_png)


def plot_confusion(summary, path):
    """The confusion matrix as a PNG at `path` (--confusion_matrix)."""
    try:
        import matplotlib  # pylint: disable=g-import-not-at-top
        matplotlib.use("Agg")
        from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
    except ImportError:
        raise errors.UserError("--confusion_matrix needs matplotlib: pip install "
                               "matplotlib") from None
    matrix = np.asarray(summary["confusion_matrix"])
    names = summary["classes"]
    size = max(4, 0.5 * len(names) + 2)
    figure, axes = pyplot.subplots(figsize=(size, size))
    axes.imshow(matrix, cmap="Blues")
    axes.set_xticks(range(len(names)), names, rotation=90)
    axes.set_yticks(range(len(names)), names)
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    axes.set_title("accuracy %.4f (%d images)" % (summary["accuracy"], summary["labelled"]))
    for (i, j), value in np.ndenumerate(matrix):
        if value:
            axes.text(j, i, str(value), ha="center", va="center", fontsize=7,
                      color="white" if value > matrix.max() / 2 else "black")
    figure.tight_layout()
    try:
        outputs.write_file(path, "--confusion_matrix",
                           lambda name: figure.savefig(name, dpi=100, format="png"))
    finally:
        pyplot.close(figure)
