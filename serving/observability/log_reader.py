"""The one reader of request logs for everything that reads them back: the server's drift
monitor, and the flywheel's drift report, candidates, labelling page and canary replay.

    scan = log_reader.Scan()
    for path, index, log in log_reader.iter_indexed("/logs/resnet*", scan):
        for item, logged in enumerate(scan.images_of(log)):   # [LoggedImage]
            log_reader.request_id(path, index, item)           # a stable, file-safe id

Files are TF Serving's `PredictionLog` TFRecords as request_log.py writes them, read one at
a time through request_log.iter_logs (published files in name order, then the complete
records of temporaries whose writer died). Every logged byte is untrusted: tensors are
decoded by serving/core/tensors.py under the bounds below, a record that is not an image
prediction or is malformed is skipped and counted (`Scan.skipped`), never fatal; a damaged
log file, or one of another program's records (not PredictionLog), is counted and named
(`Scan.skipped_files`) and the next one read.
"""
import collections
import dataclasses
import glob
import hashlib
import logging
import os
import re

import numpy as np
import tensorflow as tf
from google.protobuf import message as protobuf_message

from slimserve import conventions
from slimserve import errors
from slimserve.serving.core import tensors
from slimserve.serving.observability import request_log

TOP_K = 3
# A logged response's tensors are decoded under these bounds (elements per tensor, and
# elements filled from fewer values): a record of a few bytes can never claim gigabytes.
MAX_TENSOR_ELEMENTS = 1 << 22
MAX_BROADCAST_ELEMENTS = 1 << 12
MAX_BATCH = 4096  # images in one logged request
MAX_CLASS_NAME_CHARS = 200  # longer logged names are cut (they are only ever shown)
MAX_CLASS_ID = 100000
MAX_REQUEST_ID_CHARS = 120
MAX_NAMED_FILES = 100  # skipped log files named in a Scan (all are counted)
DAMAGED = "damaged log file(s)"
FOREIGN = "file(s) not of PredictionLog records"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclasses.dataclass
class LoggedImage:
    """One image of a logged Predict request with the response's view of it."""
    image: bytes
    probabilities: np.ndarray  # float [C]
    class_id: int = None       # the response's `classes` for this image
    class_name: str = None     # the response's `class_names` for this image

    def top(self, k=TOP_K):
        order = np.argsort(-self.probabilities, kind="stable")[:k]
        return [(int(c), float(self.probabilities[c])) for c in order]


class Malformed(Exception):
    """A logged record that cannot be read as an image prediction; the message says why."""


@dataclasses.dataclass
class Scan:
    """What a reading of the logs saw: counts, and the class names the responses gave."""
    records: int = 0
    images: int = 0
    files: int = 0
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    class_names: dict = dataclasses.field(default_factory=dict)  # id -> Counter(name)
    skipped_files: dict = dataclasses.field(default_factory=dict)  # path -> (kind, why)

    def skip_file(self, path, kind, why):
        """A log file (or its rest) not read: counted under `kind` once per file, named
        with `why` (the first MAX_NAMED_FILES; all are counted)."""
        if path in self.skipped_files:
            return
        self.skipped[kind] += 1
        if len(self.skipped_files) < MAX_NAMED_FILES:
            self.skipped_files[path] = (kind, why)
        logging.warning("request log %s: %s", path, why)

    def add_files(self, other):
        """Counts and names `other`'s skipped files that this scan has not (a second pass
        over the same files counts each once)."""
        for path, (kind, why) in other.skipped_files.items():
            self.skip_file(path, kind, why)

    def files_json(self):
        """[{"log", "kind", "reason"}] of the named skipped files, for a JSON report."""
        return [{"log": path, "kind": kind, "reason": why}
                for path, (kind, why) in self.skipped_files.items()]

    def note_class(self, logged):
        if logged.class_id is None or not logged.class_name or not \
                0 <= logged.class_id <= MAX_CLASS_ID:
            return
        names = self.class_names.setdefault(logged.class_id, collections.Counter())
        if logged.class_name in names or len(names) < 8:  # bounded per id
            names[logged.class_name] += 1

    def images_of(self, log):
        """logged_images(log), or () for a record that holds no image prediction, counted
        as skipped with the reason: every reader of the logs skips the same records."""
        try:
            images = logged_images(log)
        except Malformed as why:
            self.skipped["malformed record (%s)" % why] += 1
            return ()
        if images is None:
            self.skipped["not an image prediction"] += 1
            return ()
        return images

    def logged_classes(self):
        """Class names indexed by id as the responses named them (the most frequent name
        per id), or [] when the ids seen are not 0..N-1."""
        if not self.class_names or sorted(self.class_names) != list(
                range(len(self.class_names))):
            return []
        return [self.class_names[i].most_common(1)[0][0] for i in range(len(self.class_names))]

    def describe(self):
        parts = ["%d record(s) in %d file(s), %d image(s)" % (self.records, self.files,
                                                              self.images)]
        parts += ["%d %s" % (count, why) for why, count in sorted(self.skipped.items())]
        parts += ["%s: %s" % (path, why) for path, (_, why) in
                  list(self.skipped_files.items())[:3]]
        return "; ".join(parts)


# The reader names files by their published name (request_log.py defines it with the
# temporaries it writes).
published_name = request_log.published_name


def request_id(log, index, item=0):
    """A stable id for one logged image, safe as a file name: the log file's published
    name without its suffix (only letters, digits, `._-`), the record index and the
    image's position in the batch. The same image gets the same id before and after its
    file is published, on any machine the logs are copied to."""
    stem = os.path.basename(published_name(log))
    if stem.endswith(request_log.SUFFIX):
        stem = stem[:-len(request_log.SUFFIX)]
    stem = _UNSAFE.sub("_", stem).lstrip(".") or "log"
    if len(stem) > MAX_REQUEST_ID_CHARS - 40:
        digest = hashlib.sha256(stem.encode("utf-8", "replace")).hexdigest()[:12]
        stem = stem[:MAX_REQUEST_ID_CHARS - 54] + "_" + digest
    return "%s-%d-%d" % (stem, index, item)


def text(value):
    """A logged name (bytes or str) as a str of at most MAX_CLASS_NAME_CHARS."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value)[:MAX_CLASS_NAME_CHARS]


def model_key(log):
    """(model name, version) of the ModelSpec that answered `log`, None without a version."""
    spec = log.log_metadata.model_spec
    if not spec.HasField("version"):
        return None
    return text(spec.name), int(spec.version.value)


def logged_images(log):
    """[LoggedImage] of a PredictionLog of the image signature (`serving_default`, input
    `image_bytes`, output `probabilities`); None for a record of another API or signature;
    Malformed for a record that claims to be one but cannot be read."""
    if log.WhichOneof("log_type") != "predict_log":
        return None
    request, response = log.predict_log.request, log.predict_log.response
    if request.model_spec.signature_name not in ("", conventions.DEFAULT_SIGNATURE):
        return None
    if conventions.IMAGE_BYTES not in request.inputs:
        return None
    if conventions.PROBABILITIES not in response.outputs:
        raise Malformed("response without %s" % conventions.PROBABILITIES)

    def decode(key, proto):
        try:
            return tensors.from_proto(key, proto, MAX_TENSOR_ELEMENTS, MAX_BROADCAST_ELEMENTS)
        except Exception as error:  # pylint: disable=broad-except  (any damage: skipped)
            raise Malformed("unreadable %s tensor (%s)" % (key, type(error).__name__)) \
                from None

    images = decode(conventions.IMAGE_BYTES, request.inputs[conventions.IMAGE_BYTES])
    if images.dtype != object or images.ndim != 1 or not 0 < len(images) <= MAX_BATCH:
        raise Malformed("image_bytes is not a batch of 1..%d strings" % MAX_BATCH)
    probabilities = decode(conventions.PROBABILITIES,
                           response.outputs[conventions.PROBABILITIES])
    if probabilities.ndim != 2 or probabilities.shape[0] != len(images) or \
            probabilities.shape[1] < 1 or probabilities.dtype == object:
        raise Malformed("probabilities are not [batch, classes] numbers")
    probabilities = probabilities.astype(np.float64)
    if not np.all(np.isfinite(probabilities)):
        raise Malformed("probabilities are not finite")
    ids = names = None
    if conventions.CLASSES in response.outputs:
        ids = decode(conventions.CLASSES, response.outputs[conventions.CLASSES])
        if ids.shape != (len(images),) or ids.dtype.kind not in "iu":
            ids = None
    if conventions.CLASS_NAMES in response.outputs:
        names = decode(conventions.CLASS_NAMES, response.outputs[conventions.CLASS_NAMES])
        if names.shape != (len(images),) or names.dtype != object:
            names = None
    return [LoggedImage(bytes(images[i]), probabilities[i],
                        int(ids[i]) if ids is not None else None,
                        text(names[i]) if names is not None else None)
            for i in range(len(images))]


def log_files(pattern, flag="--logs"):
    """[(path to read, pattern that reads it with iter_logs)] of the request log files
    `pattern` matches: published files, then temporaries whose writer died (read by
    iter_logs under their published name's pattern). A UserError naming `flag` when none
    match."""
    files = [(f, glob.escape(f)) for f in sorted(tf.io.gfile.glob(pattern))
             if not os.path.basename(f).startswith(".")]
    if "://" not in pattern:
        for temp in request_log.abandoned_temporaries(pattern):
            final = published_name(temp)
            if not any(final == f for f, _ in files):
                files.append((temp, glob.escape(final)))
    if not files:
        raise errors.UserError("%s %s: no request log files match" % (flag, pattern))
    return files


def iter_indexed(pattern, scan, progress=None):
    """(file, record index, PredictionLog) of every readable record `pattern` matches, one
    file at a time through request_log.iter_logs. A damaged file (its complete records
    before the damage are kept) and a file of another program's records (a record that
    does not parse as a PredictionLog, or a file none of whose records holds a request)
    are counted and named in `scan` (Scan.skip_file), and the next file is read."""
    for path, file_pattern in log_files(pattern):
        scan.files += 1
        read = requests = 0
        try:
            for index, log in enumerate(request_log.iter_logs(file_pattern)):
                read += 1
                scan.records += 1
                requests += log.WhichOneof("log_type") is not None
                if progress is not None:
                    progress(1)
                yield path, index, log
        except protobuf_message.DecodeError:
            scan.skip_file(path, FOREIGN, "not a request log: record %d is not a "
                           "PredictionLog (another program's TFRecords?); the file is "
                           "skipped from there" % read)
            continue
        except (errors.UserError, ValueError, tf.errors.OpError, OSError) as error:
            scan.skip_file(path, DAMAGED, "%s; its later records are skipped"
                           % getattr(error, "message", error))
            continue
        if read and not requests:
            scan.skip_file(path, FOREIGN, "not a request log: none of its %d record(s) "
                           "holds a request (another program's TFRecords?)" % read)
