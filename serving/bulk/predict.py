"""Bulk inference: one exported SavedModel over many images, written as JSON lines.

Inputs: an image folder (class sub-folders give the true labels), a glob, a CSV of
`path[,label]`, or the TFRecord shards of a converted split (serving/bulk/inputs.py
lists and reads them, through the lister every tool shares). Each image becomes one row:
path, class id and name, top-k probabilities, or an `error` for an image that cannot be
read or decoded (serving/clients/image_classifier.py: the job never fails for one image).
Optionally PredictionLog TFRecords as TFX's BulkInferrer writes them; with true labels, a
summary (serving/bulk/report.py: accuracy, per-class precision and recall,
confusion matrix, optionally as a PNG).

This module runs it in process (batched, files read ahead on threads, TensorFlow on every
core, or the network on OpenVINO with runtime "openvino"); serving/bulk/beam.py runs the same ImageClassifier on Beam's
RunInference. Needs only a SavedModel: imports nothing from estimator/ or export/.

Bounded and never stuck: at most `read_ahead` files are read ahead of the model (memory
is read_ahead x max_file_bytes at worst, whatever the input's length), only regular files
of at most `max_file_bytes` are read, and the outputs are checked before the model loads
and appear whole or not at all (a full disk or a permission error names the flag and path).
"""
import contextlib
import json

import tensorflow as tf

from slimserve import errors
from slimserve import outputs
from slimserve.serving.bulk import inputs as bulk_inputs
from slimserve.serving.bulk import report as bulk_report
from slimserve.serving.bulk.inputs import BulkPredictError  # noqa: F401  (callers' name)
from slimserve.serving.clients import image_classifier
from slimserve.serving.core import version_dirs

DEFAULT_MAX_FILE_BYTES = bulk_inputs.DEFAULT_MAX_FILE_BYTES
DEFAULT_READ_AHEAD = bulk_inputs.DEFAULT_READ_AHEAD


def model_path(base_path, version=None):
    """(version, path) of `--model_version`, or of the newest complete version."""
    found = version_dirs.list_version_dirs(base_path)
    if not found:
        raise bulk_inputs.BulkPredictError("--model_base_path %s holds no version directory "
                                           "with a saved_model.pb" % base_path)
    if version is None:
        version = max(found)
    if version not in found:
        raise bulk_inputs.BulkPredictError("--model_version %d not found under %s (has %s)"
                                           % (version, base_path, sorted(found)))
    return version, found[version]


def write_rows(rows, output, log_writer=None):
    """Appends rows to an open JSONL file (and their PredictionLogs to a TFRecordWriter);
    returns how many."""
    for row in rows:
        log = row.pop("_prediction_log", None)
        if log is not None and log_writer is not None:
            log_writer.write(log)
        output.write(json.dumps(row, sort_keys=True) + "\n")
    return len(rows)


def check_output(path, flag):
    """BulkPredictError naming the flag unless `path` can be a new file: not a directory,
    and (locally) in a writable folder that exists. Called before any model is loaded."""
    try:
        outputs.check_output(path, flag)
    except errors.UserError as error:
        raise bulk_inputs.BulkPredictError(str(error)) from None


def check_settings(output, prediction_log, batch_size, read_threads=1,
                   read_ahead=DEFAULT_READ_AHEAD, max_file_bytes=0):
    """Refuses bad settings and unwritable outputs before any model loads, naming the flag."""
    check_output(output, "--output")
    check_output(prediction_log, "--prediction_log")
    for flag, value in (("--batch_size", batch_size), ("--read_threads", read_threads),
                        ("--read_ahead", read_ahead)):
        if value < 1:
            raise bulk_inputs.BulkPredictError("%s must be >= 1, got %d" % (flag, value))
    if max_file_bytes < 0:
        raise bulk_inputs.BulkPredictError(
            "--max_file_bytes must be >= 0 (0: no limit), got %d" % max_file_bytes)


def predict_local(model_base_path, input_spec, output, model_version=None, batch_size=32,
                  top_k=5, prediction_log=None, show_progress=True, read_threads=4,
                  signature_name="serving_default", read_ahead=DEFAULT_READ_AHEAD,
                  max_file_bytes=DEFAULT_MAX_FILE_BYTES, runtime=image_classifier.TENSORFLOW,
                  openvino_precision="fp32"):
    """Scores every input in this process (the network on `runtime`: tensorflow, or
    openvino at `openvino_precision`, as the server runs it); returns the summary
    (bulk_report.summarize)."""
    check_settings(output, prediction_log, batch_size, read_threads, read_ahead,
                   max_file_bytes)
    refs = bulk_inputs.list_inputs(input_spec)
    version, path = model_path(model_base_path, model_version)
    classifier = image_classifier.ImageClassifier(path, version, signature_name=signature_name,
                                                  top_k=top_k,
                                                  prediction_log=bool(prediction_log),
                                                  runtime=runtime,
                                                  openvino_precision=openvino_precision)
    try:
        score(classifier, refs, output, batch_size, prediction_log, show_progress,
              read_threads, read_ahead, max_file_bytes)
    finally:
        classifier.close()
    return bulk_report.summarize_file(output, classifier.class_names)


def score(classifier, refs, output, batch_size=32, prediction_log=None, show_progress=False,
          read_threads=4, read_ahead=DEFAULT_READ_AHEAD, max_file_bytes=DEFAULT_MAX_FILE_BYTES):
    """Reads, predicts and writes every reference with a loaded classifier; the output
    (and the PredictionLog file) appear only when complete: a failure (a full disk, a
    permission: one line naming the flag and path) leaves no partial file behind. The
    progress bar counts predictions (rows written); its total is known when no input is
    a TFRecord shard."""
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    total = None if any(bulk_inputs.is_tfrecord_shard(ref) for ref in refs) else len(refs)
    with contextlib.ExitStack() as stack:
        handle = stack.enter_context(outputs.write_atomically(output, "--output"))
        log_writer = None
        if prediction_log:
            log_writer = stack.enter_context(_log_writer(prediction_log))
        progress = stack.enter_context(tqdm(total=total, unit="img", desc="predicting",
                                            disable=not show_progress))
        batch = []
        for item in bulk_inputs.read_inputs(refs, read_threads, read_ahead, max_file_bytes):
            batch.append(item)
            if len(batch) >= batch_size:
                progress.update(write_rows(classifier.predict(batch), handle, log_writer))
                batch = []
        progress.update(write_rows(classifier.predict(batch), handle, log_writer))


@contextlib.contextmanager
def _log_writer(path):
    """A TFRecordWriter whose file replaces `path` (--prediction_log) only when the run
    completes; removed otherwise."""
    temporary = path + ".partial"
    with errors.writing(path, "--prediction_log"):
        writer = tf.io.TFRecordWriter(temporary)
        try:
            yield writer
            writer.close()
            tf.io.gfile.rename(temporary, path, overwrite=True)
        except BaseException:
            writer.close()
            if tf.io.gfile.exists(temporary):
                tf.io.gfile.remove(temporary)
            raise
