"""Which logged images are worth a person's minute: candidates for the labelling page.

A candidate is one image of one logged Predict request (TF Serving's `PredictionLog`, as
serving/observability/request_log.py writes it): the log file, the record's index in it,
the image's position in the request's batch, and why it was chosen, as a `score` (higher:
more worth labelling) and `reasons` (short sentences a person reads). `propose` reads the
logs once, in bounded memory (a heap of `limit` candidates), scoring every image with
each of its `scorers`: `low_confidence` (1 - the top-1 probability of the logged
response), `Atypical` (the image's penultimate-layer embedding far from the export's
reference embeddings: the images least like anything the model saw in training) and
`Disagreement` (two versions' predictions on the same image differ). Each scores in
[0, 1], so the highest of them ranks an image. Candidates files merge with `merge`;
slimserve-drift writes its own (the images of the traffic it evaluated, scored by all
three) with `write_candidates`, and slimserve-label reads them back with
`read_candidates`:

    {"log": "logs/resnet-...tfrecord", "index": 12, "item": 0,
     "request_id": "resnet-...-12-0", "score": 0.71, "reasons": ["..."]}

Every logged byte is untrusted: tensors are decoded by serving/core/tensors.py with its
bounds, a record that is not an image prediction or is malformed is skipped and counted
(`Scan.skipped`), never fatal; a damaged log file, or one of another program's records
(not PredictionLog), is counted and named (`Scan.skipped_files`) and the next one read.
`iter_indexed` is the one reader of request logs for slimserve-label, -drift and
-compare (and slimserve-retrain's check).
"""
import collections
import dataclasses
import fcntl
import glob
import hashlib
import heapq
import json
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
from slimserve.serving.tools import outputs

TOP_K = 3
# A logged response's tensors are decoded under these bounds (elements per tensor, and
# elements filled from fewer values): a record of a few bytes can never claim gigabytes.
MAX_TENSOR_ELEMENTS = 1 << 22
MAX_BROADCAST_ELEMENTS = 1 << 12
MAX_BATCH = 4096  # images in one logged request
MAX_CLASS_NAME_CHARS = 200  # longer logged names are cut (they are only ever shown)
MAX_CLASS_ID = 100000
# A candidates file is JSON lines written by another command: each line and each of its
# texts is bounded before use.
MAX_LINE_BYTES = 64 * 1024
MAX_REASONS = 8
MAX_REASON_CHARS = 300
MAX_REQUEST_ID_CHARS = 120
MAX_NAMED_FILES = 100  # skipped log files named in a Scan (all are counted)
DAMAGED = "damaged log file(s)"
FOREIGN = "file(s) not of PredictionLog records"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclasses.dataclass
class Candidate:
    """One logged image worth labelling, and why."""
    log: str                 # the log file it was read from
    index: int               # the record's index in that file (0-based)
    item: int = 0            # the image's position in the request's batch
    request_id: str = ""     # request_id(log, index, item): file names and state use it
    score: float = 0.0       # higher is more worth a person's minute
    reasons: list = dataclasses.field(default_factory=list)
    model_name: str = ""     # the logged ModelSpec that answered
    model_version: int = None
    logged_at: int = 0       # the record's timestamp_secs
    top: list = dataclasses.field(default_factory=list)  # [(class index, probability)] top-3

    def to_json(self):
        return {"log": self.log, "index": self.index, "item": self.item,
                "request_id": self.request_id, "score": self.score,
                "reasons": list(self.reasons), "model_name": self.model_name,
                "model_version": self.model_version, "logged_at": self.logged_at,
                "top": [[int(c), float(p)] for c, p in self.top]}


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
    """What propose (or a fetch) read: counts, and the class names the responses gave."""
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


def published_name(path):
    """The name a request log file has once published: an abandoned temporary
    `.<name>.tmp` (a writer that died) is published later as `<name>`."""
    directory, name = os.path.split(path)
    if name.startswith(".") and name.endswith(request_log.TEMP_SUFFIX):
        return os.path.join(directory, name[1:-len(request_log.TEMP_SUFFIX)])
    return path


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


def _text(value):
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value)[:MAX_CLASS_NAME_CHARS]


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
                        _text(names[i]) if names is not None else None)
            for i in range(len(images))]


def log_files(pattern):
    """[(path to read, pattern that reads it with iter_logs)] of the request log files
    `pattern` matches: published files, then temporaries whose writer died (read by
    iter_logs under their published name's pattern). A UserError when none match."""
    files = [(f, glob.escape(f)) for f in sorted(tf.io.gfile.glob(pattern))
             if not os.path.basename(f).startswith(".")]
    if "://" not in pattern:
        directory, name = os.path.split(pattern)
        for temp in sorted(glob.glob(os.path.join(directory, "." + name +
                                                  request_log.TEMP_SUFFIX))):
            final = published_name(temp)
            if _abandoned(temp) and not any(final == f for f, _ in files):
                files.append((temp, glob.escape(final)))
    if not files:
        raise errors.UserError("--logs %s: no request log files match" % pattern)
    return files


def _abandoned(temp):
    """Whether a request log temporary's writer is gone (it holds an exclusive flock while
    it lives; request_log.py): a live writer's file is read once it is published."""
    try:
        fd = os.open(temp, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


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


def low_confidence(logged):
    """1 - top-1 probability: the images the model was least sure of."""
    confidence = float(np.max(logged.probabilities))
    return 1.0 - confidence, "low confidence: top-1 probability %.3f" % confidence


def _unit(embeddings):
    embeddings = np.asarray(embeddings, np.float64)
    return embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)


class Atypical:
    """How unlike the reference an image is: the mean distance from its embedding to its
    `k` nearest reference embeddings, d, against the same measure of each reference
    image to the others (leave one out), whose median is m: score d / (d + m), 0.5 for
    an image as typical as the reference's own, towards 1 for one far from all of them.
    Embeddings are compared at unit length (a ResNet's pooled features of some confident
    images are many times longer than the rest: direction, not length, says what the
    image looks like to the model).

    embed: encoded images -> [n, D] embeddings (the version's `embeddings` signature),
    needed only when called on a LoggedImage; `score_embeddings` takes them computed."""

    def __init__(self, reference_embeddings, embed=None, k=5):
        reference = _unit(reference_embeddings)
        if reference.ndim != 2 or len(reference) < 2:
            raise ValueError("the reference needs at least 2 embeddings")
        self.reference = reference
        self.k = max(1, min(int(k), len(reference) - 1))
        self.embed = embed
        own = self._distances(reference)
        np.fill_diagonal(own, np.inf)
        self.typical = float(np.median(self._knn(own))) or 1e-12

    def _distances(self, embeddings):
        a2 = np.sum(embeddings * embeddings, axis=1)[:, None]
        b2 = np.sum(self.reference * self.reference, axis=1)[None, :]
        return np.sqrt(np.maximum(a2 + b2 - 2.0 * embeddings @ self.reference.T, 0.0))

    def _knn(self, distances):
        return np.mean(np.sort(distances, axis=1)[:, :self.k], axis=1)

    def distances(self, embeddings):
        """[n] mean distance of each embedding to its k nearest reference embeddings."""
        return self._knn(self._distances(_unit(embeddings)))

    def score_embeddings(self, embeddings):
        """[(score, reason)] of each embedding row."""
        out = []
        for distance in self.distances(embeddings):
            ratio = distance / self.typical
            out.append((float(ratio / (ratio + 1.0)),
                        "atypical: %.1fx the reference's typical distance to its %d "
                        "nearest neighbours" % (ratio, self.k)))
        return out

    def __call__(self, logged):
        if self.embed is None:
            return None
        return self.score_embeddings(self.embed([logged.image]))[0]


class Disagreement:
    """How much two versions disagree on an image: the total variation distance between
    the logged response's probabilities and another version's (0: the same, 1: no class
    in common); the reason names both top classes.

    other: encoded images -> [n, C] probabilities of the other version (its
    serving_default), needed only when called on a LoggedImage; `score` takes them."""

    def __init__(self, other=None, other_version=None, class_names=()):
        self.other = other
        self.other_version = other_version
        self.class_names = list(class_names)

    def _name(self, index):
        return self.class_names[index] if 0 <= index < len(self.class_names) else str(index)

    def score(self, probabilities, other_probabilities):
        p = np.asarray(probabilities, np.float64)
        q = np.asarray(other_probabilities, np.float64)
        if p.shape != q.shape:
            return None
        distance = 0.5 * float(np.abs(p - q).sum())
        mine, theirs = int(np.argmax(p)), int(np.argmax(q))
        other = "version %s" % self.other_version if self.other_version is not None \
            else "the other version"
        if mine == theirs:
            reason = "versions agree on %s (%.2f vs %.2f), distance %.2f" % (
                self._name(mine), p[mine], q[theirs], distance)
        else:
            reason = "versions disagree: %s (%.2f) here, %s (%.2f) by %s" % (
                self._name(mine), p[mine], self._name(theirs), q[theirs], other)
        return distance, reason

    def __call__(self, logged):
        if self.other is None:
            return None
        return self.score(logged.probabilities, self.other([logged.image])[0])


class Best:
    """The `limit` highest-scoring candidates, best first, each image (by its bytes'
    digest) at most once (its highest score kept). `payload(candidate)`, when given to
    `offer`, is computed only for a candidate that is kept, and dropped with it (the
    drift report's thumbnails): memory stays within `limit` candidates."""

    def __init__(self, limit):
        self.limit = limit
        self._heap = []  # (score, -sequence, Candidate, digest)
        self._digests = {}
        self._sequence = 0
        self.payloads = {}  # request id -> payload

    def seen(self, digest):
        return digest in self._digests

    def offer(self, candidate, digest, payload=None):
        """Keeps `candidate` if it ranks; returns whether it was kept."""
        if self.limit <= 0:
            return False
        kept = self._digests.get(digest)
        if kept is not None:
            if kept >= candidate.score:
                return False
            for entry in [e for e in self._heap if e[3] == digest]:
                self.payloads.pop(entry[2].request_id, None)
            self._heap = [e for e in self._heap if e[3] != digest]
            heapq.heapify(self._heap)
            del self._digests[digest]
        self._sequence += 1
        entry = (candidate.score, -self._sequence, candidate, digest)
        if len(self._heap) < self.limit:
            heapq.heappush(self._heap, entry)
        elif entry[:2] > self._heap[0][:2]:
            dropped = heapq.heapreplace(self._heap, entry)
            self._digests.pop(dropped[3], None)
            self.payloads.pop(dropped[2].request_id, None)
        else:
            return False
        self._digests[digest] = candidate.score
        if payload is not None:
            self.payloads[candidate.request_id] = payload(candidate)
        return True

    def best(self):
        """The kept candidates, best first."""
        return [entry[2] for entry in sorted(self._heap, reverse=True)]


def propose(pattern, limit, scorers=(low_confidence,), exclude=(), model_name=None,
            progress=None):
    """The `limit` logged images with the highest score, best first, and the Scan.

    scorers: functions LoggedImage -> (score, reason) or None; an image's score is the
    highest, its reasons every scorer's that answered. exclude: request ids already
    decided (a resumed labelling session proposes the next ones). model_name: only that
    model's requests. An image whose bytes another kept candidate already has is kept
    once. Memory: the heap of `limit` candidates, whatever the logs' size."""
    scan = Scan()
    exclude = set(exclude)
    best = Best(limit)
    for path, index, log in iter_indexed(pattern, scan, progress):
        spec = log.log_metadata.model_spec
        if model_name is not None and spec.name != model_name:
            scan.skipped["other model"] += 1
            continue
        for item, logged in enumerate(scan.images_of(log)):
            scan.images += 1
            scan.note_class(logged)
            rid = request_id(path, index, item)
            if rid in exclude:
                scan.skipped["decided before"] += 1
                continue
            if conventions.image_format(logged.image) is None:
                scan.skipped["not a JPEG, PNG, GIF or BMP"] += 1
                continue
            scores = [s for s in (scorer(logged) for scorer in scorers) if s is not None]
            if not scores:
                continue
            digest = hashlib.sha256(logged.image).digest()
            if best.seen(digest):
                scan.skipped["duplicate image"] += 1
            best.offer(candidate_of(path, index, item, log, logged, scores), digest)
    return best.best(), scan


def candidate_of(path, index, item, log, logged, scores):
    """The Candidate of image `item` of record `index` of log file `path`, scored by
    `scores` [(score, reason)] (its score the highest)."""
    spec = log.log_metadata.model_spec
    return Candidate(path, index, item, request_id(path, index, item),
                     max(score for score, _ in scores), [reason for _, reason in scores],
                     _text(spec.name), spec.version.value if spec.HasField("version") else None,
                     int(log.log_metadata.timestamp_secs), logged.top())


def merge(*candidate_lists):
    """Candidates of several proposals as one list, best first: an image proposed twice
    keeps its highest score and every reason."""
    merged = {}
    for candidate in (c for candidates in candidate_lists for c in candidates):
        kept = merged.get(candidate.request_id)
        if kept is None:
            merged[candidate.request_id] = dataclasses.replace(
                candidate, reasons=list(candidate.reasons))
            continue
        kept.reasons += [r for r in candidate.reasons if r not in kept.reasons]
        kept.score = max(kept.score, candidate.score)
    return sorted(merged.values(), key=lambda c: -c.score)


def write_candidates(path, candidates):
    """JSON lines, one candidate each, written whole or not at all (temp + rename)."""
    with outputs.write_atomically(path, "candidates file") as handle:
        for candidate in candidates:
            data = candidate.to_json()
            data["log"] = os.path.abspath(data["log"])
            handle.write(json.dumps(data) + "\n")


def _candidate_from_json(data, base_dir):
    if not isinstance(data, dict):
        raise ValueError("not an object")
    log, index, item = data.get("log"), data.get("index"), data.get("item", 0)
    if not isinstance(log, str) or not log or "\0" in log:
        raise ValueError("no log path")
    for value in (index, item):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError("index and item must be integers >= 0")
    score = data.get("score", 0.0)
    if isinstance(score, bool) or not isinstance(score, (int, float)) or \
            not np.isfinite(score):
        raise ValueError("score must be a finite number")
    reasons = data.get("reasons", [])
    if not isinstance(reasons, list):
        raise ValueError("reasons must be a list")
    if not os.path.isabs(log) and "://" not in log:
        log = os.path.join(base_dir, log)
    # The id is ours, never the file's: it names files in the output folder.
    return Candidate(log, index, item, request_id(log, index, item), float(score),
                     [_text(r)[:MAX_REASON_CHARS] for r in reasons[:MAX_REASONS]])


def read_candidates(path, limit, exclude=()):
    """The `limit` best candidates of a JSON-lines file (relative log paths are relative
    to the file's folder), best first, and a Counter of skipped lines by reason.
    Malformed lines are skipped and counted; memory stays within `limit` candidates."""
    exclude = set(exclude)
    skipped = collections.Counter()
    heap, seen = [], set()
    base_dir = os.path.dirname(os.path.abspath(path))
    try:
        handle = open(path, "rb")
    except OSError as error:
        raise errors.path_error(path, error, "--candidates") from None
    with handle:
        for number, line in enumerate(_bounded_lines(handle, skipped)):
            try:
                candidate = _candidate_from_json(json.loads(line.decode("utf-8")), base_dir)
            except (ValueError, UnicodeDecodeError) as why:
                skipped["malformed line (%s)" % str(why)[:80]] += 1
                continue
            if candidate.request_id in exclude:
                skipped["decided before"] += 1
                continue
            if candidate.request_id in seen:
                skipped["listed twice"] += 1
                continue
            seen.add(candidate.request_id)
            entry = (candidate.score, -number, candidate)
            if len(heap) < limit:
                heapq.heappush(heap, entry)
            elif entry[:2] > heap[0][:2]:
                seen.discard(heapq.heapreplace(heap, entry)[2].request_id)
    return [entry[2] for entry in sorted(heap, reverse=True)], skipped


def _bounded_lines(handle, skipped):
    """Non-blank lines of at most MAX_LINE_BYTES; longer ones are skipped, counted."""
    while True:
        line = handle.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            skipped["line longer than %d bytes" % MAX_LINE_BYTES] += 1
            while line and not line.endswith(b"\n"):
                line = handle.readline(MAX_LINE_BYTES + 1)
            continue
        if line.strip():
            yield line
