"""Which logged images are worth a person's minute: candidates for the labelling page.

    proposal = candidates.run(candidates.CandidatesConfig(logs="/logs/resnet*"))
    proposal.candidates      # [Candidate], best first; proposal.scan: what was read

A candidate is one image of one logged Predict request (read by
serving/observability/log_reader.py, the one reader of request logs): the log file, the
record's index in it, the image's position in the request's batch, and why it was chosen,
as a `score` (higher: more worth labelling) and `reasons` (short sentences a person
reads). `propose` reads the logs once, in bounded memory (a heap of `limit` candidates),
scoring every image with each of its `scorers`: `low_confidence` (1 - the top-1
probability of the logged response), `Atypical` (the image's penultimate-layer embedding
far from the export's reference embeddings: the images least like anything the model saw
in training) and `Disagreement` (two versions' predictions on the same image differ).
Each scores in [0, 1], so the highest of them ranks an image. Candidates files merge with
`merge`; the drift report writes its own (the images of the traffic it evaluated, scored
by all three) with `write_candidates`, and the labelling page reads them back with
`read_candidates`:

    {"log": "logs/resnet-...tfrecord", "index": 12, "item": 0,
     "request_id": "resnet-...-12-0", "score": 0.71, "reasons": ["..."]}
"""
import collections
import dataclasses
import hashlib
import heapq
import json
import os

import numpy as np

from slimserve import conventions
from slimserve import errors
from slimserve import fields
from slimserve import outputs
from slimserve.serving.observability import log_reader

# A candidates file is JSON lines written by another command: each line and each of its
# texts is bounded before use.
MAX_LINE_BYTES = 64 * 1024
MAX_REASONS = 8
MAX_REASON_CHARS = 300


@dataclasses.dataclass
class CandidatesConfig:
    """Where the candidates come from, and how many."""
    logs: str = fields.option(
        None, "Glob of request log files (TFRecords of PredictionLog, as the server's "
        "logging_config writes them). Without --candidates, the images the model was least "
        "sure of are proposed from them.")
    candidates: str = fields.option(
        None, "JSON-lines file naming the images to label ({\"log\", \"index\", \"item\", "
        "\"score\", \"reasons\"} per line, e.g. written by slimserve-drift); the highest "
        "scores are offered first. Without it, the lowest-confidence logged predictions.")
    model_name: str = fields.option(
        None, "Only requests logged for this model name (default: every logged request).")
    max_candidates: int = fields.option(
        200, "Images offered at most in this run (the highest scores).",
        bound=fields.Bound(1, 100000))


@dataclasses.dataclass
class Proposal:
    """What run() found: the candidates (best first), what was read (a log_reader.Scan;
    a candidates file's skipped lines are counted in it as "candidates file: ..."), and
    one phrase saying where they came from."""
    candidates: list
    scan: log_reader.Scan
    source: str


def run(config, exclude=(), progress=None):
    """The Proposal of `config`: the best `max_candidates` of its candidates file, or, without
    one, the least confident images of its logs (`model_name`'s only). exclude: request
    ids already decided. progress(n): called per record read. A UserError naming the
    flag when neither is given, no log file matches or the file cannot be read."""
    config = fields.check(config)
    check_source(config)
    if config.candidates:
        found, skipped = read_candidates(config.candidates, config.max_candidates, exclude)
        scan = log_reader.Scan()
        scan.skipped.update({"candidates file: %s" % k: v for k, v in skipped.items()})
        return Proposal(found, scan, "%d candidate(s) from %s" % (len(found),
                                                                  config.candidates))
    found, scan = propose(config.logs, config.max_candidates, exclude=exclude,
                          model_name=config.model_name, progress=progress)
    return Proposal(found, scan, "the %d least confident of %s" % (len(found),
                                                                    scan.describe()))


def check_source(config):
    """A UserError naming both flags when `config` gives neither --logs nor --candidates."""
    if not config.logs and not config.candidates:
        raise errors.UserError("give --logs (images proposed from request logs) or "
                               "--candidates (a file naming them)")


@dataclasses.dataclass
class Candidate:
    """One logged image worth labelling, and why."""
    log: str                 # the log file it was read from
    index: int               # the record's index in that file (0-based)
    item: int = 0            # the image's position in the request's batch
    request_id: str = ""     # log_reader.request_id(log, index, item): file names use it
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
    scan = log_reader.Scan()
    exclude = set(exclude)
    best = Best(limit)
    for path, index, log in log_reader.iter_indexed(pattern, scan, progress):
        spec = log.log_metadata.model_spec
        if model_name is not None and spec.name != model_name:
            scan.skipped["other model"] += 1
            continue
        for item, logged in enumerate(scan.images_of(log)):
            scan.images += 1
            scan.note_class(logged)
            rid = log_reader.request_id(path, index, item)
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
    return Candidate(path, index, item, log_reader.request_id(path, index, item),
                     max(score for score, _ in scores), [reason for _, reason in scores],
                     log_reader.text(spec.name),
                     spec.version.value if spec.HasField("version") else None,
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
    return Candidate(log, index, item, log_reader.request_id(log, index, item), float(score),
                     [log_reader.text(r)[:MAX_REASON_CHARS] for r in reasons[:MAX_REASONS]])


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
