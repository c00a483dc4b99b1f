"""The report of a scoring run (bulk inference, or a served model scored through its
server): counts, and with true labels the accuracy, per-class precision and recall and
the confusion matrix (as JSON, as text, optionally as a PNG).

Read back from the written JSON lines in one pass, holding only counts, so a run of any
length is summarized in bounded memory; written whole or not at all at the path the user
gave (slimserve/outputs.py). True labels (folder names, a CSV's labels) that are not
classes of the model get no accuracy: the summary says which they are (`not_classes`)
instead of counting every such image as wrong.
"""
import collections
import json

import numpy as np
import tensorflow as tf

from slimserve import errors
from slimserve import outputs


def summarize_file(output, class_names=None):
    """summarize() over a written JSONL file, streamed (rows are not all held).
    class_names: the model's classes (labels.txt), to tell labels that are not classes."""
    with tf.io.gfile.GFile(output) as handle:
        return summarize((json.loads(line) for line in handle if line.strip()), class_names)


def summarize(rows, class_names=None):
    """Counts; with true labels: accuracy, per-class precision/recall, confusion matrix.
    One pass over `rows` (any iterable), holding only counts.

    Rows with an error count as errors, not as wrong predictions. `class_names`: the
    model's classes when known. A true label that is not one of them (or, when they are
    not known, when no label is a class the model answered) gives no accuracy:
    `not_classes` lists those labels and `no_accuracy` says why.
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
    labels = {label for label, _ in pairs}
    refused = labels_not_classes(labels, class_names, {name for _, name in pairs})
    if refused:
        summary.update({"labelled": labelled, "labels": sorted(labels),
                        "not_classes": refused["not_classes"],
                        "no_accuracy": refused["reason"]})
        return summary
    names = sorted(labels | {name for _, name in pairs})
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


def labels_not_classes(labels, class_names, answered):
    """{"not_classes": [...], "reason": sentence} when the true `labels` cannot be scored
    against the model: some are not among its `class_names`, or (classes unknown) none is
    a class it `answered`; None when they can."""
    if class_names:
        classes = set(class_names)
        missing = sorted(set(labels) - classes)
        if not missing:
            return None
        known = ", ".join(sorted(classes)[:20]) + (", ..." if len(classes) > 20 else "")
        which = ("no folder name (true label) is a class of the model"
                 if len(missing) == len(set(labels)) else
                 "%d of %d folder names (true labels) are not classes of the model"
                 % (len(missing), len(set(labels))))
        return {"not_classes": missing, "reason": (
            "%s: %s; its classes are %s. Accuracy would count every such image as wrong, "
            "so none is reported: name the folders (or the CSV's labels) as the model's "
            "classes" % (which, ", ".join(missing[:20]) + (", ..." if len(missing) > 20
                                                          else ""), known))}
    if set(labels) & set(answered):
        return None
    return {"not_classes": sorted(labels), "reason": (
        "no folder name (true label) is a class the model answered (%s; it answered %s), "
        "so no accuracy is reported: name the folders (or the CSV's labels) as the model's "
        "classes" % (", ".join(sorted(labels)[:20]), ", ".join(sorted(answered)[:20])))}


def format_text(summary, max_classes=30):
    """The summary as lines a person reads: counts, accuracy, per-class recall and the
    confusion matrix (rows: true class, columns: predicted, as numbered in the legend);
    the reason instead when labels are not classes. Past `max_classes` classes the
    matrix is left to --summary / the PNG."""
    lines = ["%d images: %d answered, %d errors" % (summary["images"], summary["predicted"],
                                                   summary["errors"])]
    if "no_accuracy" in summary:
        return lines + ["no accuracy: " + summary["no_accuracy"]]
    if "accuracy" not in summary:
        return lines + ["no accuracy: no image has a true label (a class folder or a "
                        "CSV label)"]
    lines.append("accuracy %.4f (%d of %d labelled images)" % (
        summary["accuracy"], summary["correct"], summary["labelled"]))
    names = summary["classes"]
    width = max(8, min(24, max(len(n) for n in names)))
    lines.append("per-class recall:")
    lines.append("  %-*s %8s %8s" % (width, "class", "recall", "support"))
    for name in names:
        entry = summary["per_class"][name]
        if entry["support"]:
            lines.append("  %-*s %8.4f %8d" % (width, name[:width], entry["recall"],
                                               entry["support"]))
    if len(names) > max_classes:
        return lines + ["confusion matrix: %d classes, see the summary JSON (or the PNG)"
                        % len(names)]
    matrix = summary["confusion_matrix"]
    cell = max(4, len(str(max(max(row) for row in matrix))) + 1)
    lines.append("confusion matrix (rows: true class, columns: predicted):")
    lines.append("  %*s" % (width + 4, "") + "".join("%*d" % (cell, i)
                                                    for i in range(len(names))))
    for i, (name, row) in enumerate(zip(names, matrix)):
        lines.append("  %2d %-*s " % (i, width, name[:width]) +
                     "".join("%*s" % (cell, value if value else ".") for value in row))
    return lines


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
