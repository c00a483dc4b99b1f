"""What a model saw in training, as every export records it beside the model, so any copy
of a version carries it: `<version>/assets.extra/reference/` (conventions.REFERENCE_DIR).

    reference.json                 format, class names, training-split class counts, how
                                   many sample images, the image statistics' names, the
                                   embedding size, where the sample came from
    samples.npz                    arrays over one bounded sample of validation images,
                                   row i = image i: probabilities [N, C] float32 (the
                                   export's own answers), labels [N] int64, image_stats
                                   [N, 5] float64 (image_stats.NAMES), embeddings [N, D]
                                   float32 (the `embeddings` signature's penultimate
                                   features)
    examples/<class index>_<k>.png  a few validation images per class, small PNGs (what
                                   the labelling page shows beside each candidate)

export/reference.py computes and writes it inside the export's temporary version
directory (published with the version or not at all); drift detection
(serving/observability/drift.py, slimserve-drift, the server's status page) and the
labelling page read it. A version without one (an export made before references) still
serves; `read` returns None and drift says so.

A reference is a file someone may have edited or damaged: `read` bounds every file
before it is loaded (the JSON, the archive and each array in it), loads arrays without
pickle, and checks their shapes agree, else BadReference naming the file.
"""
import dataclasses
import io
import json
import os
import time
import zipfile
from typing import Optional

import numpy as np
import tensorflow as tf

from slimserve import conventions
from slimserve import errors
from slimserve.serving.observability import image_stats

FORMAT = 1
INFO_FILE = "reference.json"
SAMPLES_FILE = "samples.npz"
EXAMPLES_DIR = "examples"
MAX_INFO_BYTES = 4 << 20
MAX_SAMPLES_BYTES = 512 << 20
MAX_IMAGES = 100_000
MAX_DIM = 65_536
MAX_CLASSES = 100_000
ARRAYS = ("probabilities", "labels", "image_stats", "embeddings")


class BadReference(errors.UserError):
    """A reference that cannot be read; the message names the file and why."""


@dataclasses.dataclass
class Reference:
    """One version's reference (see the module docstring)."""
    class_names: list
    probabilities: np.ndarray               # float32 [N, C]
    image_stats: np.ndarray                 # float64 [N, 5]
    labels: Optional[np.ndarray] = None     # int64 [N], the sample's true classes
    embeddings: Optional[np.ndarray] = None  # float32 [N, D]
    train_counts: Optional[np.ndarray] = None  # int64 [C], training split per class
    info: dict = dataclasses.field(default_factory=dict)

    @property
    def size(self):
        return int(self.probabilities.shape[0])

    @property
    def confidences(self):
        """The top-1 probability of each sample image."""
        return self.probabilities.max(axis=1)

    @property
    def predicted(self):
        return self.probabilities.argmax(axis=1)

    @property
    def train_priors(self):
        """Class shares of the training split, or None when not recorded."""
        if self.train_counts is None or not self.train_counts.sum():
            return None
        return self.train_counts / float(self.train_counts.sum())


def directory(version_dir):
    return os.path.join(version_dir, conventions.REFERENCE_DIR)


def write(version_dir, reference, examples=None):
    """Writes `reference` (and examples: {class index: [PNG bytes]}) under the version's
    assets.extra/reference/. Meant for a version not yet published (the export's
    temporary directory): the version's publication makes it appear whole."""
    folder = directory(version_dir)
    tf.io.gfile.makedirs(os.path.join(folder, EXAMPLES_DIR))
    arrays = {"probabilities": np.asarray(reference.probabilities, np.float32),
              "image_stats": np.asarray(reference.image_stats, np.float64)}
    if reference.labels is not None:
        arrays["labels"] = np.asarray(reference.labels, np.int64)
    if reference.embeddings is not None:
        arrays["embeddings"] = np.asarray(reference.embeddings, np.float32)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with tf.io.gfile.GFile(os.path.join(folder, SAMPLES_FILE), "wb") as handle:
        handle.write(buffer.getvalue())
    for index, images in sorted((examples or {}).items()):
        for k, png in enumerate(images):
            with tf.io.gfile.GFile(os.path.join(folder, EXAMPLES_DIR, "%d_%d.png"
                                                % (index, k)), "wb") as handle:
                handle.write(png)
    info = dict(reference.info)
    info.update({
        "format": FORMAT, "class_names": list(reference.class_names),
        "images": reference.size, "image_stats": list(image_stats.NAMES),
        "embedding_size": None if reference.embeddings is None
        else int(reference.embeddings.shape[1]),
        "train_class_counts": None if reference.train_counts is None
        else [int(c) for c in reference.train_counts],
        "examples_per_class": {str(k): len(v) for k, v in sorted((examples or {}).items())},
    })
    info.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    with tf.io.gfile.GFile(os.path.join(folder, INFO_FILE), "w") as handle:
        json.dump(info, handle, indent=1, sort_keys=True)
    return folder


def _read_bytes(path, limit):
    try:
        size = tf.io.gfile.stat(path).length
    except tf.errors.OpError as error:
        raise BadReference("%s: cannot read it: %s" % (path, error.message)) from None
    if size > limit:
        raise BadReference("%s: %d bytes, more than a reference file may hold (%d)"
                             % (path, size, limit))
    with tf.io.gfile.GFile(path, "rb") as handle:
        return handle.read(limit + 1)


def _load_arrays(path):
    data = _read_bytes(path, MAX_SAMPLES_BYTES)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            if sum(member.file_size for member in archive.infolist()) > MAX_SAMPLES_BYTES:
                raise BadReference("%s: its arrays unpack to more than %d bytes"
                                     % (path, MAX_SAMPLES_BYTES))
        with np.load(io.BytesIO(data), allow_pickle=False) as loaded:
            return {name: loaded[name] for name in loaded.files if name in ARRAYS}
    except BadReference:
        raise
    except Exception as error:  # pylint: disable=broad-except  (any damage: one message)
        raise BadReference("%s: not a reference's arrays (%s: %s)"
                             % (path, type(error).__name__, str(error)[:200])) from None


def read(version_dir):
    """The version's Reference, or None when it has none (an older export); a
    BadReference naming the file when one is there but cannot be used."""
    folder = directory(version_dir)
    info_path = os.path.join(folder, INFO_FILE)
    if not tf.io.gfile.exists(info_path):
        return None
    try:
        info = json.loads(_read_bytes(info_path, MAX_INFO_BYTES).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise BadReference("%s: not JSON: %s" % (info_path, error)) from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise BadReference("%s: not a reference of format %d" % (info_path, FORMAT))
    names = info.get("class_names")
    if not isinstance(names, list) or not 1 <= len(names) <= MAX_CLASSES or \
            not all(isinstance(n, str) for n in names):
        raise BadReference("%s: class_names must be a list of names" % info_path)
    samples_path = os.path.join(folder, SAMPLES_FILE)
    arrays = _load_arrays(samples_path)
    probabilities = arrays.get("probabilities")
    stats = arrays.get("image_stats")

    def bad(why):
        return BadReference("%s: %s" % (samples_path, why))

    if probabilities is None or probabilities.ndim != 2 or \
            probabilities.shape[1] != len(names) or \
            not 1 <= probabilities.shape[0] <= MAX_IMAGES or \
            probabilities.dtype.kind != "f" or not np.all(np.isfinite(probabilities)):
        raise bad("probabilities must be finite numbers [N, %d classes]" % len(names))
    count = probabilities.shape[0]
    if stats is None or stats.shape != (count, len(image_stats.NAMES)) or \
            stats.dtype.kind != "f" or not np.all(np.isfinite(stats)):
        raise bad("image_stats must be finite numbers [%d, %d]"
                  % (count, len(image_stats.NAMES)))
    labels = arrays.get("labels")
    if labels is not None and (labels.shape != (count,) or labels.dtype.kind not in "iu"):
        raise bad("labels must be %d integers" % count)
    embeddings = arrays.get("embeddings")
    if embeddings is not None and (
            embeddings.ndim != 2 or embeddings.shape[0] != count or
            not 1 <= embeddings.shape[1] <= MAX_DIM or embeddings.dtype.kind != "f" or
            not np.all(np.isfinite(embeddings))):
        raise bad("embeddings must be finite numbers [%d, D]" % count)
    counts = info.get("train_class_counts")
    train_counts = None
    if counts is not None:
        if not isinstance(counts, list) or len(counts) != len(names) or not all(
                isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            raise BadReference("%s: train_class_counts must be %d counts"
                                 % (info_path, len(names)))
        train_counts = np.array(counts, np.int64)
    return Reference(list(names), probabilities.astype(np.float32),
                     stats.astype(np.float64),
                     None if labels is None else labels.astype(np.int64),
                     None if embeddings is None else embeddings.astype(np.float32),
                     train_counts, info)
