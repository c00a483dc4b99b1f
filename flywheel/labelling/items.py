"""What the labelling page shows, read from untrusted files: each candidate's thumbnail
(and where to read its original bytes again) and a few example images per class.

`load_items` reads only the log records the candidates name (one pass per file, with
each record's byte offset), decodes each image to a PNG thumbnail under a pixel bound
(serving/observability/thumbnails.py) and keeps the thumbnail, not the logged bytes: memory stays a few
KB per candidate. Images that do not decode (not an image, a decompression bomb, a
truncated file) are not offered, and counted. When a person labels an image,
`original_image` reads its record again at the remembered offset and checks it is the
same record (length and SHA-256) before its bytes are written to the class folder: the
labelled file is the image the model was served, byte for byte.

Class examples come from the model version's `assets.extra/reference/examples/` (files
`<class index>_<k>.png`, as the export's reference writes them) or, without those, from a
class-folder tree such as the training images; a bounded number per class, each read
as a regular file within a size bound and thumbnailed like the candidates.
"""
import collections
import dataclasses
import hashlib
import os
import re
import struct

import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from slimserve import conventions
from slimserve import regular_files
from slimserve.flywheel import candidates as candidates_lib
from slimserve.serving.observability import log_reader as label_candidates
from slimserve.serving.observability import thumbnails as label_thumbnails

REFERENCE_EXAMPLES = os.path.join(conventions.EXTRA_DIR, "reference", "examples")
_REFERENCE_NAME = re.compile(r"^(\d{1,6})_(\d{1,6})\.png$")
_EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "GIF": "gif", "BMP": "bmp"}
MAX_EXAMPLE_FILES_TRIED = 50  # per class: a folder of non-images is never read whole
_FRAMING = 16  # a TFRecord's length (8) and its CRC (4) before the data, the data's CRC after


class ItemGone(Exception):
    """The logged record behind an item can no longer be read as it was."""


@dataclasses.dataclass
class Item:
    """A candidate ready to show, and where its original bytes are."""
    candidate: candidates_lib.Candidate
    thumbnail: bytes        # PNG
    size: tuple             # (width, height) of the logged image
    image_format: str       # JPEG, PNG, GIF or BMP
    path: str               # the log file read (published_name(path) once published)
    offset: int             # of the record's framing in that file
    length: int             # of the record's data
    record_sha256: bytes
    image_sha256: str

    @property
    def request_id(self):
        return self.candidate.request_id

    @property
    def extension(self):
        return _EXTENSIONS[self.image_format]


def _raw_records(path):
    """(offset, serialized record) of each complete record of a TFRecord file."""
    offset = 0
    try:
        for raw in tf.compat.v1.io.tf_record_iterator(path):
            yield offset, raw
            offset += len(raw) + _FRAMING
    except tf.errors.DataLossError:
        return  # a torn last record (a writer killed mid-record): not a candidate


def _readable(path):
    """`path`, or its published name when a dead writer's temporary was published since."""
    for option in (path, label_candidates.published_name(path)):
        if tf.io.gfile.exists(option):
            return option
    return None


def load_items(candidates, scan, thumbnail_size=label_thumbnails.DEFAULT_SIZE,
               max_pixels=label_thumbnails.DEFAULT_MAX_PIXELS,
               max_image_bytes=label_thumbnails.DEFAULT_MAX_BYTES, progress=None):
    """[Item] of the candidates whose image decodes, in the candidates' order; the rest
    are counted in `scan.skipped` by reason. Candidates read from a file get their model,
    time and top-3 from the record."""
    wanted = collections.defaultdict(lambda: collections.defaultdict(list))
    for candidate in candidates:
        wanted[candidate.log][candidate.index].append(candidate)
    found = {}
    for log, by_index in wanted.items():
        path = _readable(log)
        if path is None:
            scan.skipped["log file gone"] += sum(len(c) for c in by_index.values())
            continue
        last = max(by_index)
        try:
            for index, (offset, raw) in enumerate(_raw_records(path)):
                if index > last:
                    break
                for candidate in by_index.pop(index, ()):
                    item = _item(candidate, path, offset, raw, scan, thumbnail_size,
                                 max_pixels, max_image_bytes)
                    if item is not None:
                        found[candidate.request_id] = item
                    if progress is not None:
                        progress(1)
        except (tf.errors.OpError, OSError) as error:
            scan.skipped["damaged log file"] += 1
            del error
        for missing in by_index.values():
            scan.skipped["record not in its log file"] += len(missing)
    return [found[c.request_id] for c in candidates if c.request_id in found]


def _item(candidate, path, offset, raw, scan, thumbnail_size, max_pixels, max_image_bytes):
    try:
        log = prediction_log_pb2.PredictionLog.FromString(raw)
        images = label_candidates.logged_images(log)
    except label_candidates.Malformed as why:
        scan.skipped["malformed record (%s)" % why] += 1
        return None
    except Exception:  # pylint: disable=broad-except  (a protobuf DecodeError, ...)
        scan.skipped["unparseable record"] += 1
        return None
    if images is None or candidate.item >= len(images):
        scan.skipped["not an image prediction"] += 1
        return None
    logged = images[candidate.item]
    scan.note_class(logged)
    try:
        png, size, image_format = label_thumbnails.thumbnail(
            logged.image, thumbnail_size, max_pixels, max_image_bytes)
    except label_thumbnails.NotAnImage as why:
        scan.skipped["image not shown (%s)" % _reason_kind(str(why))] += 1
        return None
    spec = log.log_metadata.model_spec
    if not candidate.top:
        candidate.top = logged.top()
        candidate.model_name = label_candidates.text(spec.name)
        candidate.model_version = spec.version.value if spec.HasField("version") else None
        candidate.logged_at = int(log.log_metadata.timestamp_secs)
    return Item(candidate, png, size, image_format, path, offset, len(raw),
                hashlib.sha256(raw).digest(), hashlib.sha256(logged.image).hexdigest())


def _reason_kind(reason):
    """A reason without its numbers, so counts group ("header claims ...")."""
    return re.sub(r"[0-9]+(x[0-9]+)?", "N", reason)[:80]


def original_image(item):
    """The logged bytes of `item`'s image, read again and checked to be the same; ItemGone
    when its log file was removed or changed."""
    for path in dict.fromkeys((item.path, label_candidates.published_name(item.path))):
        try:
            with tf.io.gfile.GFile(path, "rb") as handle:
                handle.seek(item.offset)
                header = handle.read(12)
                if len(header) != 12 or struct.unpack("<Q", header[:8])[0] != item.length:
                    continue
                raw = handle.read(item.length)
        except (tf.errors.OpError, OSError):
            continue
        if hashlib.sha256(raw).digest() != item.record_sha256:
            continue
        images = label_candidates.logged_images(
            prediction_log_pb2.PredictionLog.FromString(raw))
        data = images[item.candidate.item].image
        if hashlib.sha256(data).hexdigest() == item.image_sha256:
            return data
    raise ItemGone("the logged record of %s can no longer be read from %s (moved, "
                   "rotated away or changed)" % (item.request_id, item.path))


# --- class examples ------------------------------------------------------------------

def _read(path, max_bytes):
    if "://" in path:
        if tf.io.gfile.stat(path).length > max_bytes:
            raise regular_files.NotReadable("file too large")
        with tf.io.gfile.GFile(path, "rb") as handle:
            return handle.read()
    return regular_files.read_regular(path, max_bytes)


def _first_thumbnails(paths, count, size, max_pixels, max_bytes, skipped):
    shown = []
    for path in paths[:MAX_EXAMPLE_FILES_TRIED]:
        if len(shown) >= count:
            break
        try:
            shown.append(label_thumbnails.thumbnail(_read(path, max_bytes), size, max_pixels,
                                                    max_bytes)[0])
        except (regular_files.NotReadable, label_thumbnails.NotAnImage,
                tf.errors.OpError, OSError):
            skipped["example not shown"] += 1
    return shown


def load_examples(classes, version_dir=None, examples_dir=None, per_class=3,
                  size=label_thumbnails.DEFAULT_SIZE // 2,
                  max_pixels=label_thumbnails.DEFAULT_MAX_PIXELS,
                  max_bytes=label_thumbnails.DEFAULT_MAX_BYTES):
    """({class index: [PNG]}, where they came from or None, Counter of skipped files)."""
    skipped = collections.Counter()
    examples = {}
    if per_class <= 0:
        return examples, None, skipped
    reference = os.path.join(version_dir, REFERENCE_EXAMPLES) if version_dir else None
    if reference and tf.io.gfile.isdir(reference):
        by_class = collections.defaultdict(list)
        for name in tf.io.gfile.listdir(reference):
            match = _REFERENCE_NAME.match(name)
            if match and int(match.group(1)) < len(classes):
                by_class[int(match.group(1))].append((int(match.group(2)),
                                                      os.path.join(reference, name)))
        for index, files in by_class.items():
            examples[index] = _first_thumbnails([p for _, p in sorted(files)], per_class,
                                                size, max_pixels, max_bytes, skipped)
        return examples, reference, skipped
    if examples_dir:
        for index, name in enumerate(classes):
            folder = os.path.join(examples_dir, name)
            if not tf.io.gfile.isdir(folder):
                continue
            files = sorted(f for f in tf.io.gfile.listdir(folder)
                           if not f.startswith(".") and not f.endswith("/"))
            examples[index] = _first_thumbnails(
                [os.path.join(folder, f) for f in files], per_class, size, max_pixels,
                max_bytes, skipped)
        return examples, examples_dir, skipped
    return examples, None, skipped
