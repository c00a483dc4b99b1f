"""What bulk inference reads: the inputs `--input` names, listed, and their bytes, read
ahead of the model boundedly.

An image folder (class sub-folders give the true labels) or a CSV/TSV of `path[,label]`
is listed by slimserve/image_listing.py, the lister every tool shares (gs:// and the other
file systems TensorFlow reads through tf.io.gfile); a glob names files or the TFRecord
shards of a converted split, whose records are read one at a time. A listed file that is
not a regular file of at most `max_file_bytes` (a named pipe, a device, a folder), and a
folder link the lister does not follow, become one input with the reason: an error row,
as the converter skips them. Hidden files are left out, as everywhere.
"""
import collections
import concurrent.futures
import glob
import os

import tensorflow as tf

from slimserve import conventions
from slimserve import errors
from slimserve import image_listing
from slimserve import regular_files

# One input to score: `key` names it in the output (a path, or `shard:index`); `error`:
# why it cannot be read, known when it was listed (None: read it).
ImageRef = collections.namedtuple("ImageRef", "key label path record error",
                                  defaults=(None,))
ImageInput = collections.namedtuple("ImageInput", "key label data error")

# As the converter's limit: larger than any camera image, small enough that `read_ahead`
# of them fit in memory.
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
DEFAULT_READ_AHEAD = 64


class BulkPredictError(errors.UserError):
    """Bad flags or inputs of bulk inference; the message names the flag or file."""


class _GFiles(image_listing.LocalFiles):
    """image_listing's file-system interface over tf.io.gfile (gs://, hdfs://, ...):
    object stores hold no symlinks."""

    @staticmethod
    def walk(top, onerror=None):
        return tf.io.gfile.walk(top, onerror=onerror)

    @staticmethod
    def isdir(path):
        return tf.io.gfile.isdir(path)

    @staticmethod
    def islink(path):
        return False

    @staticmethod
    def listdir(path):
        return tf.io.gfile.listdir(path)

    @staticmethod
    def join(folder, name):
        return folder.rstrip("/") + "/" + name


def _files(path):
    return _GFiles() if "://" in path else image_listing.LOCAL


def list_inputs(spec):
    """[ImageRef] for an image folder, a CSV/TSV of paths, a glob, or TFRecord shards."""
    files = _files(spec)
    if files.isdir(spec):
        return _folder(spec.rstrip("/") or spec, files)
    if image_listing.is_csv(spec):
        return _csv(spec)
    paths = sorted(tf.io.gfile.glob(spec)) if glob.has_magic(spec) else (
        [spec] if tf.io.gfile.exists(spec) else [])
    if not paths:
        raise BulkPredictError("--input %s matches no file" % spec)
    return [ImageRef(path, None, path, None) for path in paths]  # shards expand in read()


def _folder(root, files):
    listing = image_listing.list_folder(root, labels="optional", files=files)
    if not listing.entries:
        raise BulkPredictError("--input folder %s holds no files" % root)
    return [ImageRef(entry.path, entry.label, entry.path, None) for entry in listing.entries] + [
        ImageRef(skip["path"], None, skip["path"], None, skip["reason"])
        for skip in listing.skipped if skip["reason"] not in (
            image_listing.HIDDEN_FILE, image_listing.HIDDEN_FOLDER)]


def _csv(path):
    if "://" in path:
        if not tf.io.gfile.exists(path):
            raise BulkPredictError("--input CSV does not exist: %s" % path)
        base = path.rsplit("/", 1)[0]
        with tf.io.gfile.GFile(path, "rb") as raw:
            rows = image_listing.csv_entries(
                image_listing.text_reader(raw), path,
                lambda p: p if "://" in p or p.startswith("/") else base + "/" + p)
        entries = [entry for _, entry in rows]
    else:
        if not os.path.lexists(path):
            raise BulkPredictError("--input CSV does not exist: %s" % path)
        entries = image_listing.read_csv(path).entries
    if not entries:
        raise BulkPredictError("--input %s lists no path" % path)
    return [ImageRef(entry.path, entry.label, entry.path, None) for entry in entries]


def is_tfrecord_shard(ref):
    return (ref.record is None and ref.error is None
            and conventions.SHARD_NAME.match(ref.path) is not None)


def read(ref, max_file_bytes=DEFAULT_MAX_FILE_BYTES):
    """The ImageInputs of one reference: one per file, one per record of a shard (read
    one at a time: use read_inputs to bound what is held). A file that is not a regular
    file of at most `max_file_bytes` (0: no limit) is one input with the reason."""
    if ref.error is not None:
        return [ImageInput(ref.key, ref.label, None, ref.error)]
    if is_tfrecord_shard(ref):
        return _read_shard(ref.path)
    try:
        return [ImageInput(ref.key, ref.label, read_bytes(ref.path, max_file_bytes), None)]
    except regular_files.NotReadable as reason:
        return [ImageInput(ref.key, ref.label, None, str(reason))]


def read_bytes(path, max_file_bytes=DEFAULT_MAX_FILE_BYTES):
    """A file's bytes, bounded: local paths as every tool reads a listed file
    (image_listing.read: regular files only), others (gs://...) by size first;
    NotReadable with the reason."""
    if "://" not in path:
        return image_listing.read(path, max_file_bytes)
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
