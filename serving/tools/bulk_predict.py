"""Bulk inference: one exported SavedModel over many images, written as JSON lines.

Inputs: an image folder (class sub-folders give the true labels), a glob, a CSV of
`path[,label]`, or the TFRecord shards of a converted split. Each image becomes one
row: path, class id and name, top-k probabilities, or an `error` for an image that
cannot be read or decoded (the job never fails for one image: a batch that fails is
split in halves until the bad image is alone). Optionally PredictionLog TFRecords as
TFX's BulkInferrer writes them; with true labels, a summary (accuracy, per-class
precision and recall, confusion matrix, optionally as a PNG).

Runs in process here (batched, files read ahead on threads, TensorFlow on every core);
serving/tools/beam_inference.py runs the same ImageClassifier on Beam's RunInference. Needs
only a SavedModel: imports nothing from estimator/ or export/.

Bounded and never stuck: at most `read_ahead` files are read ahead of the model (memory
is read_ahead x max_file_bytes at worst, whatever the input's length), only regular files
of at most `max_file_bytes` are read (a named pipe, device or oversized file gets an
error row with the reason, as the converter skips them), and the outputs are checked
before the model loads.
"""
import collections
import concurrent.futures
import csv
import glob
import io
import json
import os

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from slimserve import conventions
from slimserve import regular_files
from slimserve.serving.core import errors
from slimserve.serving.core import servable as servable_lib
from slimserve.serving.core import version_dirs


# One input to score: `key` names it in the output (a path, or `shard:index`).
ImageRef = collections.namedtuple("ImageRef", "key label path record")
ImageInput = collections.namedtuple("ImageInput", "key label data error")

# As the converter's limit: larger than any camera image, small enough that `read_ahead`
# of them fit in memory.
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
DEFAULT_READ_AHEAD = 64


class BulkPredictError(ValueError):
    """Bad flags or inputs; the message names the flag or file at fault."""


def model_path(base_path, version=None):
    """(version, path) of `--model_version`, or of the newest complete version."""
    found = version_dirs.list_version_dirs(base_path)
    if not found:
        raise BulkPredictError("--model_base_path %s holds no version directory with a "
                               "saved_model.pb" % base_path)
    if version is None:
        version = max(found)
    if version not in found:
        raise BulkPredictError("--model_version %d not found under %s (has %s)"
                               % (version, base_path, sorted(found)))
    return version, found[version]


def list_inputs(spec):
    """[ImageRef] for an image folder, a glob, a CSV of paths, or TFRecord shards; listed
    through tf.io.gfile, so gs:// (and other file systems TensorFlow reads) work too."""
    if tf.io.gfile.isdir(spec):
        return _folder(spec)
    if spec.endswith((".csv", ".tsv")):
        return _csv(spec)
    paths = sorted(tf.io.gfile.glob(spec)) if glob.has_magic(spec) else (
        [spec] if tf.io.gfile.exists(spec) else [])
    if not paths:
        raise BulkPredictError("--input %s matches no file" % spec)
    return [ImageRef(path, None, path, None) for path in paths]  # shards expand in read()


def is_tfrecord_shard(ref):
    return ref.record is None and conventions.SHARD_NAME.match(ref.path) is not None


def check_output(path, flag):
    """BulkPredictError naming the flag unless `path` can be a new file: not a directory,
    and (locally) in a folder that exists. Called before any model is loaded."""
    if not path:
        return
    if tf.io.gfile.isdir(path):
        raise BulkPredictError("%s %s is a directory; give the path of a file to write"
                               % (flag, path))
    if "://" not in path:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise BulkPredictError("%s %s: folder %s does not exist" % (flag, path, folder))


def _folder(root):
    refs = []
    root = root.rstrip("/")
    for dirpath, _, filenames in sorted(tf.io.gfile.walk(root)):
        relative = dirpath[len(root):].strip("/")
        if any(part.startswith(".") for part in relative.split("/")):
            continue
        label = relative.split("/")[0] if relative else None
        for name in sorted(filenames):
            if not name.startswith("."):
                path = dirpath.rstrip("/") + "/" + name
                refs.append(ImageRef(path, label, path, None))
    if not refs:
        raise BulkPredictError("--input folder %s holds no files" % root)
    return refs


def _csv(path):
    if not tf.io.gfile.exists(path):
        raise BulkPredictError("--input CSV does not exist: %s" % path)
    base = path.rsplit("/", 1)[0] if "://" in path else os.path.dirname(os.path.abspath(path))
    refs = []
    delimiter = "\t" if path.endswith(".tsv") else ","
    with tf.io.gfile.GFile(path, "rb") as handle:
        text = handle.read().decode("utf-8-sig")
    for number, row in enumerate(csv.reader(io.StringIO(text, newline=""),
                                            delimiter=delimiter), 1):
        if not row or not "".join(row).strip():
            continue
        if len(row) > 2:
            raise BulkPredictError("%s:%d: expected path[,label], got %d columns"
                                   % (path, number, len(row)))
        if number == 1 and row[0].strip().lower() == "path":
            continue
        file_path = row[0].strip()
        if "://" not in file_path and not os.path.isabs(file_path):
            file_path = base + "/" + file_path
        refs.append(ImageRef(file_path, row[1].strip() if len(row) == 2 else None,
                             file_path, None))
    if not refs:
        raise BulkPredictError("--input %s lists no path" % path)
    return refs


def read(ref, max_file_bytes=DEFAULT_MAX_FILE_BYTES):
    """The ImageInputs of one reference: one per file, one per record of a shard (read
    one at a time: use read_inputs to bound what is held). A file that is not a regular
    file of at most `max_file_bytes` (0: no limit) is one input with the reason."""
    if is_tfrecord_shard(ref):
        return _read_shard(ref.path)
    try:
        return [ImageInput(ref.key, ref.label, read_bytes(ref.path, max_file_bytes), None)]
    except regular_files.NotReadable as reason:
        return [ImageInput(ref.key, ref.label, None, str(reason))]


def read_bytes(path, max_file_bytes=DEFAULT_MAX_FILE_BYTES):
    """A file's bytes, bounded: local paths through regular_files.read_regular (regular
    files only), others (gs://...) by size first; NotReadable with the reason."""
    if "://" not in path:
        return regular_files.read_regular(path, max_file_bytes)
    try:
        size = tf.io.gfile.stat(path).length
        if max_file_bytes and size > max_file_bytes:
            raise regular_files.NotReadable("file too large: %d bytes > max_file_bytes=%d"
                                            % (size, max_file_bytes))
        with tf.io.gfile.GFile(path, "rb") as handle:
            data = handle.read(max_file_bytes + 1 if max_file_bytes else -1)
    except (tf.errors.OpError, OSError) as error:
        raise regular_files.NotReadable("unreadable: %s" % getattr(error, "message", error)
                                        ) from None
    if max_file_bytes and len(data) > max_file_bytes:
        raise regular_files.NotReadable("file grew past max_file_bytes=%d while being read"
                                        % max_file_bytes)
    return data


def read_inputs(refs, read_threads=4, read_ahead=DEFAULT_READ_AHEAD,
                max_file_bytes=DEFAULT_MAX_FILE_BYTES):
    """Every ImageInput of `refs` in order, files read on `read_threads` threads while at
    most `read_ahead` of them wait to be consumed (submitting every file at once held a
    40,000-row CSV's images in memory together); shard records one at a time."""
    pending = collections.deque()
    remaining = iter(refs)
    with concurrent.futures.ThreadPoolExecutor(read_threads) as pool:
        try:
            while True:
                while len(pending) < read_ahead:
                    ref = next(remaining, None)
                    if ref is None:
                        break
                    pending.append(ref if is_tfrecord_shard(ref) else
                                   pool.submit(read, ref, max_file_bytes))
                if not pending:
                    return
                head = pending.popleft()
                if isinstance(head, ImageRef):
                    yield from _read_shard(head.path)
                else:
                    yield from head.result()
        finally:
            for future in pending:
                if not isinstance(future, ImageRef):
                    future.cancel()


def _read_shard(path):
    if "://" not in path:
        try:
            regular_files.check_regular(os.stat(path), 0)
        except (OSError, regular_files.NotReadable) as error:
            yield ImageInput(path, None, None, str(error) if isinstance(
                error, regular_files.NotReadable) else "unreadable: %s" % error.strerror)
            return
    for index, record in enumerate(tf.compat.v1.io.tf_record_iterator(path)):
        key = "%s:%d" % (path, index)
        try:
            feature = tf.train.Example.FromString(record).features.feature
            label = (feature[conventions.TEXT].bytes_list.value[0].decode("utf-8")
                     if feature[conventions.TEXT].bytes_list.value else None)
            yield ImageInput(key, label, feature[conventions.ENCODED].bytes_list.value[0], None)
        except Exception as error:  # pylint: disable=broad-except
            yield ImageInput(key, None, None, "not a slimserve tf.Example: %s" % error)


class ImageClassifier:
    """A SavedModel's image-bytes signature as a function of a batch of ImageInputs."""

    def __init__(self, path, version=0, model_name="resnet",
                 signature_name="serving_default", top_k=5, prediction_log=False,
                 session_config=None):
        self.servable = servable_lib.Servable(model_name, version, path, session_config)
        try:
            self.signature_name, self.signature = self.servable.signature(signature_name)
        except errors.ServingError:
            self.servable.retire()
            raise BulkPredictError("--signature_name %s: %s has no such signature (has %s)" % (
                signature_name, path, ", ".join(sorted(self.servable.signatures)))) from None
        if len(self.signature.inputs) != 1:
            raise BulkPredictError("signature %s of %s takes %s; bulk inference needs one "
                                   "input of encoded images" % (
                                       signature_name, path, sorted(self.signature.inputs)))
        self.input_key = next(iter(self.signature.inputs))
        for key in (conventions.PROBABILITIES,):
            if key not in self.signature.outputs:
                raise BulkPredictError("signature %s of %s has no %r output (has %s)" % (
                    signature_name, path, key, sorted(self.signature.outputs)))
        self.output_keys = sorted(self.signature.outputs)
        self.class_names = read_model_labels(path)
        self.top_k = top_k
        self.prediction_log = prediction_log

    def close(self):
        self.servable.retire()

    def predict(self, inputs):
        """One row (a dict) per ImageInput, in order; errors become rows."""
        rows = [None] * len(inputs)
        good = [i for i, item in enumerate(inputs) if item.error is None]
        for i, item in enumerate(inputs):
            if item.error is not None:
                rows[i] = _error_row(item, item.error)
        for index, outputs in self._run_isolating([inputs[i] for i in good], good):
            item = inputs[index]
            rows[index] = (_error_row(item, outputs) if isinstance(outputs, str)
                           else self._row(item, outputs))
        return rows

    def _run_isolating(self, items, indices):
        """Runs the batch; on a failure, halves it until the bad images are alone."""
        if not items:
            return []
        try:
            out = self.servable.run(self.signature, {
                self.input_key: np.array([item.data for item in items], dtype=object)},
                self.output_keys)
        except errors.ServingError as error:
            if len(items) == 1:
                return [(indices[0], "cannot be decoded: %s" % error.message.splitlines()[0])]
            half = len(items) // 2
            return (self._run_isolating(items[:half], indices[:half]) +
                    self._run_isolating(items[half:], indices[half:]))
        return [(index, {key: value[position] for key, value in out.items()})
                for position, index in enumerate(indices)]

    def _row(self, item, outputs):
        probabilities = np.asarray(outputs[conventions.PROBABILITIES], dtype=np.float64)
        order = np.argsort(-probabilities, kind="stable")[:self.top_k]
        class_id = int(order[0])
        row = {"path": item.key, "class_id": class_id,
               "class_name": self._name(class_id, outputs),
               "top_k": [{"class_id": int(c), "class_name": self._name(int(c)),
                          "probability": float(probabilities[c])} for c in order]}
        if item.label is not None:
            row["label"] = item.label
        if self.prediction_log:
            row["_prediction_log"] = self._log(item, outputs)
        return row

    def _name(self, class_id, outputs=None):
        if outputs is not None and conventions.CLASS_NAMES in outputs:
            value = outputs[conventions.CLASS_NAMES]
            return value.decode("utf-8") if isinstance(value, bytes) else str(value)
        if class_id < len(self.class_names):
            return self.class_names[class_id]
        return str(class_id)

    def _log(self, item, outputs):
        """A PredictionLog as TFX's BulkInferrer writes (request and response)."""
        log = prediction_log_pb2.PredictionLog()
        request = log.predict_log.request
        request.model_spec.name = self.servable.name
        request.model_spec.version.value = self.servable.version
        request.model_spec.signature_name = self.signature_name
        request.inputs[self.input_key].CopyFrom(tf.make_tensor_proto([item.data]))
        response = log.predict_log.response
        response.model_spec.CopyFrom(request.model_spec)
        for key, value in outputs.items():
            response.outputs[key].CopyFrom(tf.make_tensor_proto(np.asarray(value)[None]))
        return log.SerializeToString()


def _error_row(item, message):
    row = {"path": item.key, "error": message}
    if item.label is not None:
        row["label"] = item.label
    return row


def read_model_labels(path):
    """Class names from the SavedModel's labels.txt asset (`id:name`), [] if it has none
    (compare.py names its flips with them too)."""
    labels = os.path.join(path, "assets", conventions.LABELS_ASSET)
    if not tf.io.gfile.exists(labels):
        return []
    with tf.io.gfile.GFile(labels) as handle:
        return conventions.parse_labels(handle, labels)


def write_rows(rows, output, log_writer=None):
    """Appends rows to an open JSONL file (and their PredictionLogs to a TFRecordWriter);
    returns how many."""
    for row in rows:
        log = row.pop("_prediction_log", None)
        if log is not None and log_writer is not None:
            log_writer.write(log)
        output.write(json.dumps(row, sort_keys=True) + "\n")
    return len(rows)


def check_settings(output, prediction_log, batch_size, read_threads=1,
                   read_ahead=DEFAULT_READ_AHEAD, max_file_bytes=0):
    """Refuses bad settings and unwritable outputs before any model loads, naming the flag."""
    check_output(output, "--output")
    check_output(prediction_log, "--prediction_log")
    for flag, value in (("--batch_size", batch_size), ("--read_threads", read_threads),
                        ("--read_ahead", read_ahead)):
        if value < 1:
            raise BulkPredictError("%s must be >= 1, got %d" % (flag, value))
    if max_file_bytes < 0:
        raise BulkPredictError("--max_file_bytes must be >= 0 (0: no limit), got %d"
                               % max_file_bytes)


def predict_local(model_base_path, input_spec, output, model_version=None, batch_size=32,
                  top_k=5, prediction_log=None, show_progress=True, read_threads=4,
                  signature_name="serving_default", read_ahead=DEFAULT_READ_AHEAD,
                  max_file_bytes=DEFAULT_MAX_FILE_BYTES):
    """Scores every input in this process; returns the summary (see summarize)."""
    check_settings(output, prediction_log, batch_size, read_threads, read_ahead,
                   max_file_bytes)
    refs = list_inputs(input_spec)
    version, path = model_path(model_base_path, model_version)
    classifier = ImageClassifier(path, version, signature_name=signature_name, top_k=top_k,
                                 prediction_log=bool(prediction_log))
    try:
        score(classifier, refs, output, batch_size, prediction_log, show_progress,
              read_threads, read_ahead, max_file_bytes)
    finally:
        classifier.close()
    return summarize_file(output)


def score(classifier, refs, output, batch_size=32, prediction_log=None, show_progress=False,
          read_threads=4, read_ahead=DEFAULT_READ_AHEAD, max_file_bytes=DEFAULT_MAX_FILE_BYTES):
    """Reads, predicts and writes every reference with a loaded classifier; the output
    (and the PredictionLog file) appear only when complete. The progress bar counts
    predictions (rows written); its total is known when no input is a TFRecord shard."""
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    temporary = output + ".partial"
    log_writer = tf.io.TFRecordWriter(prediction_log + ".partial") if prediction_log else None
    total = None if any(is_tfrecord_shard(ref) for ref in refs) else len(refs)
    try:
        with open(temporary, "w") as handle, \
                tqdm(total=total, unit="img", desc="predicting",
                     disable=not show_progress) as progress:
            batch = []
            for item in read_inputs(refs, read_threads, read_ahead, max_file_bytes):
                batch.append(item)
                if len(batch) >= batch_size:
                    progress.update(write_rows(classifier.predict(batch), handle, log_writer))
                    batch = []
            progress.update(write_rows(classifier.predict(batch), handle, log_writer))
    finally:
        if log_writer is not None:
            log_writer.close()
    os.replace(temporary, output)
    if prediction_log:
        os.replace(prediction_log + ".partial", prediction_log)


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
    """The summary as JSON; the confusion matrix as a PNG when asked (needs matplotlib)."""
    with tf.io.gfile.GFile(path, "w") as handle:
        json.dump(summary, handle, indent=2, sort_keys=True)
    if confusion_png and "confusion_matrix" in summary:
        plot_confusion(summary, confusion_png)


def plot_confusion(summary, path):
    try:
        import matplotlib  # pylint: disable=g-import-not-at-top
        matplotlib.use("Agg")
        from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
    except ImportError:
        raise BulkPredictError("--confusion_matrix needs matplotlib: pip install "
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
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
