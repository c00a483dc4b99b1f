"""The one drift pipeline: a window of logged images -> statistics against the export's
reference -> a result, in bounded memory. The server's monitor (drift_monitor.py) runs it
on its own logs; the flywheel's drift report (flywheel/drift.py) runs the same, with an
`observer` that scores candidates for labelling on the way.

    selection = drift_pipeline.select(pattern, max_images=limit)     # pass 1: counts only
    outcome = drift_pipeline.run(selection, reference, options,
                                 VersionModel(version_dir), max_images=limit)
    outcome.verdict()      # True, False, or None: a statistic was not computed

Request logs are TF Serving's PredictionLog files (request_log.py), read in file-name
order (each file's name starts with its opening time) through log_reader.py: malformed
records, other APIs and signatures are skipped and counted, a damaged file is counted and
the next one read. Only the images one model version answered are compared with that
version's reference: its confidence and classes are in the logged responses; its
embeddings are computed by running the version's own `embeddings` signature on the
logged bytes (VersionModel), in batches.

Work and memory are bounded whatever the logs' size: pass 1 counts images per model and
version in the newest files only, until the version has `limit` images; pass 2 reads
those files and skips all but the newest `limit` images of the version, keeps the
features of one window (`window_size` images, their bytes dropped once embedded) and a
summary of at most `max_windows` windows.

Both passes count the images a record actually holds, decoded under the server's bounds
(log_reader.logged_images), never the batch size its tensor shape claims: one hostile
record claiming 2^40 images would otherwise fill the window alone, keep every real file
unread, and then be skipped as malformed. Pass 1 decodes every record of the files it
reads, so its Scan (Selection.scan) counts every skipped record and names every damaged
or foreign file read, including files pass 2 does not read again.
"""
import collections
import dataclasses
import logging
import os

import numpy as np

from slimserve import conventions
from slimserve.serving.core import errors
from slimserve.serving.core import servable as servable_lib
from slimserve.serving.observability import drift
from slimserve.serving.observability import image_stats
from slimserve.serving.observability import log_reader

BATCH = 32


@dataclasses.dataclass
class Served:
    """One served image of a logged request."""
    log: str
    index: int
    item: int
    timestamp: int
    probabilities: np.ndarray
    image: bytes
    model_name: str = None
    model_version: int = None


@dataclasses.dataclass
class Selection:
    """Pass 1: the model version to test and the log files that hold its newest images
    (oldest first), how many, and what else the files read held."""
    model: str = None
    version: int = None
    files: list = dataclasses.field(default_factory=list)  # [(path, read pattern)]
    images: int = 0
    seen: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    scan: log_reader.Scan = dataclasses.field(default_factory=log_reader.Scan)

    def versions_of(self, model):
        return sorted(v for m, v in self.seen if m == model)


def select(pattern, model_name=None, version=None, max_images=None, progress=None):
    """The Selection of the logs `pattern` matches (a UserError when none do): files are
    counted newest first (their names start with their opening time) until the version
    to test has `max_images` images (None: all files). That version is `version` of
    `model_name`, each by default the newest record's."""
    selection = Selection()
    files = sorted(log_reader.log_files(pattern),
                   key=lambda f: os.path.basename(log_reader.published_name(f[0])))
    for path, read_pattern in reversed(files):
        per_key = collections.Counter()
        newest = None
        for _, _, log in log_reader.iter_indexed(read_pattern, selection.scan, progress):
            count = len(selection.scan.images_of(log))  # decoded, not claimed
            selection.scan.images += count
            key = log_reader.model_key(log)
            if key is None or not count or (model_name is not None and key[0] != model_name):
                continue
            per_key[key] += count
            if version is None or key[1] == version:
                newest = key  # records of a file are in time order: the last is newest
        selection.seen.update(per_key)
        if selection.model is None and newest is not None:
            selection.model, selection.version = newest
        target = (selection.model, selection.version)
        if selection.model is not None and per_key[target]:
            selection.files.insert(0, (path, read_pattern))
            selection.images += per_key[target]
            if max_images is not None and selection.images >= max_images:
                break
    return selection


def served_images(selection, skip=0, scan=None, progress=None):
    """Served of every image of the selected version in the selected files, in order,
    after the first `skip` of them; what is skipped is counted in `scan`."""
    scan = scan if scan is not None else log_reader.Scan()
    target = (selection.model, selection.version)
    seen = 0
    for _, read_pattern in selection.files:
        for path, index, log in log_reader.iter_indexed(read_pattern, scan):
            if log_reader.model_key(log) != target:
                scan.skipped["other model or version"] += 1
                continue
            images = scan.images_of(log)  # as pass 1 counted them: decoded
            if seen + len(images) <= skip:
                seen += len(images)
                continue
            for item, logged in enumerate(images):
                seen += 1
                if seen <= skip:
                    continue
                scan.images += 1
                scan.note_class(logged)
                if progress is not None:
                    progress(1)
                yield Served(path, index, item, int(log.log_metadata.timestamp_secs),
                             logged.probabilities, logged.image, *target)


class VersionModel:
    """A version loaded from disk (serving's Servable, as a server loads it), or one a
    server has loaded (`servable`: the caller holds it), to run its `embeddings` and
    `serving_default` signatures on logged images."""

    def __init__(self, version_dir=None, session_config=None, servable=None):
        self._owned = servable is None
        self.servable = servable if servable is not None else \
            servable_lib.Servable.load(version_dir, session_config)
        self.has_embeddings = conventions.EMBEDDINGS_SIGNATURE in self.servable.signatures

    def _run(self, signature, output, images):
        """[n, ...] outputs; an image the batch cannot run gets a NaN row."""
        signature_def = self.servable.signatures[signature]
        rows = []
        for start in range(0, len(images), BATCH):
            batch = images[start:start + BATCH]
            try:
                rows.append(self.servable.run(signature_def, {
                    conventions.IMAGE_BYTES: np.array(batch, dtype=object)}, [output])[output])
                continue
            except errors.ServingError:
                pass
            for image in batch:  # find the one image at fault
                try:
                    rows.append(self.servable.run(signature_def, {
                        conventions.IMAGE_BYTES: np.array([image], dtype=object)},
                        [output])[output])
                except errors.ServingError as error:
                    logging.debug("drift: an image does not run: %s", error.message)
                    rows.append(None)
        width = next((r.shape[1] for r in rows if r is not None), 1)
        return np.concatenate([r if r is not None else np.full((1, width), np.nan)
                               for r in rows]).astype(np.float64)

    def embeddings(self, images):
        return self._run(conventions.EMBEDDINGS_SIGNATURE, conventions.EMBEDDINGS, images)

    def probabilities(self, images):
        return self._run(conventions.DEFAULT_SIGNATURE, conventions.PROBABILITIES, images)

    def close(self):
        if self._owned:
            self.servable.retire()


@dataclasses.dataclass
class WindowRecord:
    """One evaluated window: which images (by their position in the traffic read), when,
    and its WindowResult."""
    number: int
    first: int
    last: int
    start_time: int
    end_time: int
    result: drift.WindowResult
    classes: list = dataclasses.field(default_factory=list)  # predictions per class

    def to_json(self):
        return {"window": self.number, "first_image": self.first, "last_image": self.last,
                "start_time": self.start_time, "end_time": self.end_time,
                "images": self.result.images, "drift": self.result.drift,
                "predicted_classes": [int(c) for c in self.classes],
                "moved": self.result.moved(),
                "statistics": {name: s.to_json()
                               for name, s in self.result.statistics.items()}}


@dataclasses.dataclass
class DriftOutcome:
    """What a run found: the kept windows (oldest first), how many were evaluated in
    all and how many images read; the drift verdict of the newest one and since when
    it holds."""
    windows: list
    evaluated: int
    images: int

    @property
    def latest(self):
        return self.windows[-1] if self.windows else None

    @property
    def drift(self):
        return bool(self.latest and self.latest.result.drift)

    def not_computed(self, statistics=None):
        """The statistics (default: all of drift.STATISTICS) the newest window lacks."""
        computed = self.latest.result.statistics if self.latest else {}
        wanted = drift.STATISTICS if statistics is None else statistics
        return [name for name in wanted if name not in computed]

    def verdict(self, statistics=None):
        """True when a statistic of the newest window drifts; False only when every one
        of `statistics` (default: all of drift.STATISTICS) was computed and none drifts;
        None when nothing drifts but some statistic could not be computed (no window, no
        embeddings, no decodable image): a statistic not computed is no evidence."""
        if self.drift:
            return True
        return None if self.not_computed(statistics) else False

    def since(self):
        """The first window of the newest run of flagged windows (None without drift):
        its WindowRecord, and whether the run may have begun before the kept history."""
        if not self.drift:
            return None, False
        first = len(self.windows) - 1
        while first > 0 and self.windows[first - 1].result.drift:
            first -= 1
        return self.windows[first], first == 0 and self.evaluated > len(self.windows)


class DriftRun:
    """Consumes Served images in order; tests each window as it completes."""

    def __init__(self, reference, options, model=None, max_windows=100,
                 max_pixels=image_stats.DEFAULT_MAX_PIXELS,
                 max_bytes=image_stats.DEFAULT_MAX_BYTES, batch=BATCH, observer=None):
        """reference: the version's Reference (or a drift.Prepared of it); options:
        drift.DriftOptions; model: its VersionModel (embeddings), or None. observer:
        called as observer(batch of Served, their embeddings [n, D] or None) before the
        images' bytes are dropped (the flywheel scores candidates there)."""
        self.prepared = reference if isinstance(reference, drift.Prepared) else \
            drift.Prepared(reference, options)
        self.options = options
        self.model = model if model is not None and model.has_embeddings else None
        self.max_pixels, self.max_bytes, self.batch = max_pixels, max_bytes, batch
        self.observer = observer
        self._pending = []
        self._window = collections.deque(maxlen=options.window_size)
        self.windows = collections.deque(maxlen=max_windows)
        self.evaluated = 0
        self.images = 0

    def add(self, served):
        self._pending.append(served)
        if len(self._pending) >= self.batch:
            self._flush()

    def _flush(self):
        pending, self._pending = self._pending, []
        if not pending:
            return
        images = [s.image for s in pending]
        embeddings = self.model.embeddings(images) if self.model is not None else None
        if self.observer is not None:
            self.observer(pending, embeddings)
        for row, served in enumerate(pending):
            try:
                stats = image_stats.statistics(served.image, self.max_pixels, self.max_bytes)
            except image_stats.NotAnImage:
                stats = np.full(len(image_stats.NAMES), np.nan)
            embedding = embeddings[row] if embeddings is not None else None
            served.image = None  # the bytes go; the window keeps features only
            self._window.append((served.timestamp, served.probabilities, stats, embedding))
            self.images += 1
            full = len(self._window) == self.options.window_size
            if full and (self.images - self.options.window_size) % self.options.step == 0:
                self._evaluate()

    def _evaluate(self):
        rows = list(self._window)
        embeddings = None
        if rows[0][3] is not None:
            embeddings = np.stack([r[3] for r in rows])
        window = drift.Window(np.stack([r[1] for r in rows]), np.stack([r[2] for r in rows]),
                              embeddings)
        result = self.prepared.evaluate(window)
        classes = np.bincount(window.probabilities.argmax(axis=1),
                              minlength=self.prepared.num_classes)
        self.windows.append(WindowRecord(self.evaluated, self.images - len(rows),
                                         self.images - 1, rows[0][0], rows[-1][0], result,
                                         classes.tolist()))
        self.evaluated += 1

    def finish(self, min_images=10):
        """Tests what is pending; a run that never filled a window tests the images it
        has as one (when at least `min_images`). Returns the DriftOutcome."""
        self._flush()
        if not self.evaluated and len(self._window) >= min_images:
            self._evaluate()
        return DriftOutcome(list(self.windows), self.evaluated, self.images)


def run(selection, reference, options, model, max_images=None, scan=None, progress=None,
        **run_options):
    """The pipeline: the newest `max_images` (None: all) images of the selected version
    (select()) through a DriftRun (run_options: its max_windows, max_pixels, max_bytes,
    batch, observer); what pass 2 skips is counted in `scan`. Returns the DriftOutcome."""
    drift_run = DriftRun(reference, options, model, **run_options)
    skip = 0 if max_images is None else max(0, selection.images - max_images)
    for served in served_images(selection, skip, scan, progress):
        drift_run.add(served)
    return drift_run.finish()
