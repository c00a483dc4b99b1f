"""Accuracy of a model as it is served: every image of a labelled folder (class
sub-folders) or CSV (`path,label`) is sent through a TF Serving-compatible gRPC server
(TensorFlow Serving's own or slimserve-server) and its answer compared with the label.

The inputs are listed by slimserve/image_listing.py, the lister every tool shares, and
sent by serving/clients/client.py `predict_files` (each file checked before it is sent; a
file the server refuses costs one error, never its neighbours' answers). A file that
cannot be read or is refused is named and skipped: it counts as an error, not as a wrong
answer. The report is serving/bulk/report.py's, as slimserve-predict's: accuracy,
per-class recall and the confusion matrix; labels that are not classes of the served
model get no accuracy, saying which.
"""
import dataclasses
from typing import Callable, List

from slimserve import conventions
from slimserve import errors
from slimserve import image_listing
from slimserve.serving.bulk import report as bulk_report


@dataclasses.dataclass
class Scored:
    """A scoring run: the summary (bulk_report.summarize), and the files that got no
    answer as (path, why)."""
    summary: dict
    failed: List[tuple]


def list_labelled(spec):
    """[Entry(path, label)] of a folder of class sub-folders or a CSV/TSV of
    path[,label] (image_listing's rules), plus what the listing skipped for a reason the
    user should see (a folder link, an unreadable folder) as (path, why)."""
    listing = image_listing.list_input(spec, labels="optional")
    if not listing.entries:
        raise errors.UserError("%s lists no image" % spec)
    skipped = [(entry["path"], entry["reason"]) for entry in listing.skipped
               if entry["reason"] not in (image_listing.HIDDEN_FILE,
                                          image_listing.HIDDEN_FOLDER)]
    return listing.entries, skipped


def score(client, spec, batch_size=8, concurrency=1,
          signature_name=conventions.DEFAULT_SIGNATURE, show_progress=True,
          on_error: Callable = None):
    """Sends every image `spec` lists to `client`'s model and compares each answer with
    its label; returns Scored. `on_error(path, why)` is called for each file that got no
    answer, as it happens (the command prints it)."""
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    entries, skipped = list_labelled(spec)
    labels = {entry.path: entry.label for entry in entries}
    rows, failed = [], []

    def fail(path, why):
        failed.append((path, why))
        rows.append({"path": path, "error": why, "label": labels.get(path)})
        if on_error is not None:
            on_error(path, why)

    for path, why in skipped:
        fail(path, why)
    with tqdm(total=len(entries), unit="img", desc="scoring", disable=not show_progress,
              leave=False) as progress:
        # top_k=2: the client then learns every class name from the model's classify
        # signature, which tells labels that are not classes from wrong answers.
        for result in client.predict_files([entry.path for entry in entries], batch_size,
                                           concurrency, signature_name, top_k=2):
            progress.update(1)
            if result.error:
                fail(result.path, result.error)
                continue
            name = result.class_name if result.class_name is not None else str(
                result.class_id)
            rows.append({"path": result.path, "label": labels[result.path],
                         "class_name": name})
    return Scored(bulk_report.summarize(rows, client.known_class_names()), failed)
