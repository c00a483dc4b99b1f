"""Which image files a folder, a CSV/TSV or a single path names: the one lister every
package uses (the converter, bulk inference, the load test and the client), so a file is
listed or skipped for the same reason whichever tool meets it.

Plain Python (no TensorFlow): converter workers and `slimserve-client` import it before
TensorFlow loads. The rules, once:

- A folder is walked depth first, names sorted, a folder's files before its sub-folders.
- Hidden files and folders (a name starting with ".") are skipped: `hidden file`,
  `hidden folder`.
- A symlink to a folder is followed only at the first level (a class folder may be a
  link); deeper ones are skipped (`symlink to a folder (not followed)`), so a link loop
  cannot make a walk endless.
- `labels`: None lists files without labels; "optional" labels a file with the name of
  the first-level folder it is in (None directly in the root); "required" makes every
  first-level folder a class and skips files directly in the root (`not inside a class
  folder`). `Listing.classes` holds every first-level folder, empty ones too.
- `suffixes`: only names ending so (any case) are listed, others skipped (`not a ...
  file`); None lists every file (the converter lets Pillow decide, bulk inference lets
  the model).
- A CSV/TSV (TSV when the name ends in .tsv) lists `path[,label]` rows: UTF-8 (a
  byte-order mark, as spreadsheets write, is dropped), an optional first row `path,label`
  (or `path`), relative paths relative to the CSV. Errors name the file and line.
- Bounded: at most `max_entries` listed and skipped entries (ListingError beyond), CSV
  lines of at most `max_line_chars` characters, read in bounded steps, so a hostile CSV (a
  single line of gigabytes) or tree cannot fill memory.
- Listing never opens an image. Reading one is `read` / `read_image`: regular files only,
  within a byte bound (slimserve/regular_files.py); a FIFO, a device, a dangling symlink, a
  symlink loop or an oversized file is NotReadable with its reason, in the same words for
  every tool.
"""
import collections
import csv
import io
import os

from slimserve import conventions
from slimserve import errors
from slimserve import regular_files

# Far above any real data set (ImageNet lists 1.3 million files), far below what would
# exhaust memory: a listed entry costs a few hundred bytes.
MAX_ENTRIES = 10_000_000
# A path,label line is a few hundred characters; PATH_MAX is 4096.
MAX_LINE_CHARS = 65536

HIDDEN_FILE = "hidden file"
HIDDEN_FOLDER = "hidden folder"
FOLDER_LINK = "symlink to a folder (not followed)"
OUTSIDE_CLASS = "not inside a class folder"

NotReadable = regular_files.NotReadable

Entry = collections.namedtuple("Entry", "path label")
Entry.__doc__ = """A listed file: its path and its label (None when it has none)."""

Listing = collections.namedtuple("Listing", "entries skipped classes")
Listing.__doc__ = """`entries` ([Entry], in listing order), `skipped` ([{"path", "reason"}],
JSON-ready as dataset_info.json records them) and `classes` ({first-level folder name: its
path} of a folder listed with labels, else {})."""


class ListingError(errors.UserError):
    """A folder or CSV that cannot be listed; the message names it (and the line)."""


class LocalFiles:
    """The file system a folder is walked on; bulk inference passes one over
    tf.io.gfile for gs:// paths (same interface)."""

    @staticmethod
    def walk(top, onerror=None):
        return os.walk(top, onerror=onerror)

    @staticmethod
    def isdir(path):
        return os.path.isdir(path)

    @staticmethod
    def islink(path):
        return os.path.islink(path)

    @staticmethod
    def listdir(path):
        return os.listdir(path)

    @staticmethod
    def join(folder, name):
        return os.path.join(folder, name)


LOCAL = LocalFiles()


class _Collector:
    """Entries and skips, counted against the bound."""

    def __init__(self, source, max_entries):
        self.source, self.max_entries = source, max_entries
        self.entries, self.skipped = [], []

    def _count(self):
        if len(self.entries) + len(self.skipped) >= self.max_entries:
            raise ListingError("%s lists more than %d files; split it into several inputs"
                               % (self.source, self.max_entries))

    def add(self, path, label):
        self._count()
        self.entries.append(Entry(path, label))

    def skip(self, path, reason):
        self._count()
        self.skipped.append({"path": path, "reason": reason})

    def add_file(self, path, name, label, suffixes):
        """Adds a file named `name`, or skips it when hidden or of another suffix: one rule
        for the root's files and those of every folder below."""
        if name.startswith("."):
            self.skip(path, HIDDEN_FILE)
        elif suffixes and not name.lower().endswith(suffixes):
            self.skip(path, _suffix_reason(suffixes))
        else:
            self.add(path, label)


def _suffix_reason(suffixes):
    return "not a %s file" % "/".join(s.lstrip(".") for s in suffixes)


def _walk(folder, label, collector, suffixes, files):
    """Adds the files under `folder` (depth first, sorted), skipping by the rules."""

    def unreadable(error):
        collector.skip(getattr(error, "filename", None) or folder,
                       "unreadable folder: %s" % (getattr(error, "strerror", None) or error))

    for dirpath, dirnames, filenames in files.walk(folder, onerror=unreadable):
        kept = []
        for name in sorted(d.rstrip("/") for d in dirnames):
            path = files.join(dirpath, name)
            if name.startswith("."):
                collector.skip(path, HIDDEN_FOLDER)
            elif files.islink(path):
                collector.skip(path, FOLDER_LINK)
            else:
                kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            collector.add_file(files.join(dirpath, name), name, label, suffixes)


def list_folder(root, labels=None, suffixes=None, max_entries=MAX_ENTRIES, files=LOCAL):
    """The Listing of a folder by the module's rules (labels: None, "optional" or
    "required"; suffixes: a tuple of lower-case suffixes or None). ListingError when
    `root` is not a folder or lists more than `max_entries`."""
    if labels not in (None, "optional", "required"):
        raise ValueError("labels must be None, 'optional' or 'required', got %r" % labels)
    if not files.isdir(root):
        raise ListingError("%s is not a folder" % root)
    suffixes = tuple(s.lower() for s in suffixes) if suffixes else None
    collector = _Collector(root, max_entries)
    try:
        names = sorted(name.rstrip("/") for name in files.listdir(root))
    except OSError as error:
        raise errors.path_error(root, error) from None
    folders, classes = [], {}
    for name in names:  # the root's own files first, then its folders
        path = files.join(root, name)
        if not files.isdir(path):
            if labels == "required":
                collector.skip(path, OUTSIDE_CLASS)
            else:
                collector.add_file(path, name, None, suffixes)
        elif name.startswith("."):
            collector.skip(path, HIDDEN_FOLDER)
        else:
            folders.append((name, path))
    for name, path in folders:
        if labels is not None:
            classes[name] = path
        _walk(path, name if labels else None, collector, suffixes, files)
    return Listing(collector.entries, collector.skipped, classes)


def _bounded_lines(handle, source, max_line_chars):
    """The lines of a text handle, each read with a bound: a line longer than
    `max_line_chars` is a ListingError, never a string of gigabytes."""
    number = 0
    while True:
        line = handle.readline(max_line_chars + 1)
        if not line:
            return
        number += 1
        if len(line) > max_line_chars:
            raise ListingError("%s:%d: a line longer than %d characters (a path,label row is "
                               "far shorter); is it a CSV?" % (source, number, max_line_chars))
        yield line


def csv_rows(handle, source, max_line_chars=MAX_LINE_CHARS):
    """Yields (first line number, row) of a CSV/TSV text handle (TSV when `source` ends
    in .tsv); a quoted field may span lines. Errors name `source` and the line."""
    delimiter = "\t" if source.endswith(".tsv") else ","
    reader = csv.reader(_bounded_lines(handle, source, max_line_chars), delimiter=delimiter)
    while True:
        line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except UnicodeDecodeError as error:
            raise ListingError("%s is not UTF-8 text (%s); save it as UTF-8"
                               % (source, error.reason)) from None
        except csv.Error as error:
            raise ListingError("%s:%d: not valid CSV: %s" % (source, line, error)) from None
        yield line, row


def csv_entries(handle, source, resolve, labels="optional", max_entries=MAX_ENTRIES,
                max_line_chars=MAX_LINE_CHARS):
    """[(line number, Entry)] of the `path[,label]` rows of an open text handle of the
    CSV/TSV `source` (labels "required": every row `path,label`); `resolve` turns a row's
    path into the path to read. Blank rows and a first row `path[,label]` are skipped."""
    required = labels == "required"
    found = []
    for row_index, (number, row) in enumerate(csv_rows(handle, source, max_line_chars)):
        if not row or not "".join(row).strip():
            continue
        cells = [cell.strip() for cell in row]
        if row_index == 0 and [c.lower() for c in cells] in (["path", "label"], ["path"]):
            continue
        if required and len(cells) != 2:
            raise ListingError("%s:%d: expected 2 columns (path,label), got %d"
                               % (source, number, len(cells)))
        if len(cells) > 2:
            raise ListingError("%s:%d: expected path[,label], got %d columns"
                               % (source, number, len(cells)))
        if not cells[0]:
            raise ListingError("%s:%d: empty path" % (source, number))
        label = cells[1] if len(cells) == 2 else ""
        if required and not label:
            raise ListingError("%s:%d: empty label" % (source, number))
        if len(found) >= max_entries:
            raise ListingError("%s lists more than %d rows; split it into several inputs"
                               % (source, max_entries))
        found.append((number, Entry(resolve(cells[0]), label or None)))
    return found


def open_text(path):
    """A local CSV/TSV opened as UTF-8 text (byte-order mark dropped), once it is known
    to be a regular file: a FIFO given as a CSV would block the reader forever."""
    try:
        regular_files.check_regular(os.stat(path), 0)
    except OSError as error:
        raise errors.path_error(path, error) from None
    except regular_files.NotReadable as reason:
        raise ListingError("%s: %s" % (path, reason)) from None
    return open(path, newline="", encoding="utf-8-sig")


def text_reader(binary):
    """A text handle (UTF-8, byte-order mark dropped) over any object with read(n) that
    returns bytes: a tf.io.gfile.GFile or a Beam file, for csv_entries."""

    class _Raw(io.RawIOBase):
        def readable(self):
            return True

        def readinto(self, buffer):
            data = binary.read(len(buffer))
            buffer[:len(data)] = data
            return len(data)

    return io.TextIOWrapper(io.BufferedReader(_Raw()), encoding="utf-8-sig", newline="")


def read_csv(path, labels="optional", max_entries=MAX_ENTRIES, max_line_chars=MAX_LINE_CHARS):
    """The Listing of a local CSV/TSV of `path[,label]` rows, paths relative to it."""
    base = os.path.dirname(os.path.abspath(path))
    with open_text(path) as handle:
        rows = csv_entries(handle, path, lambda p: os.path.join(base, p), labels,
                           max_entries, max_line_chars)
    return Listing([entry for _, entry in rows], [], {})


def is_csv(path):
    return path.lower().endswith((".csv", ".tsv"))


def list_input(path, labels=None, suffixes=None, max_entries=MAX_ENTRIES):
    """A folder (list_folder), a CSV/TSV (read_csv) or one file (itself) -> Listing;
    ListingError for a path that does not exist. A single file or a CSV row is listed
    whatever its suffix: the user named it."""
    if os.path.isdir(path):
        return list_folder(path, labels, suffixes, max_entries)
    if is_csv(path) and os.path.isfile(path):
        return read_csv(path, "required" if labels == "required" else "optional",
                        max_entries)
    if not os.path.lexists(path):
        raise ListingError("%s does not exist" % path)
    return Listing([Entry(path, None)], [], {})


def read(path, max_bytes, limit_name="max_file_bytes"):
    """The bytes of a listed file: a regular file of at most `max_bytes` bytes (0: no
    limit); NotReadable with the reason otherwise (`limit_name` names the bound)."""
    return regular_files.read_regular(path, max_bytes, limit_name)


def read_image(path, max_bytes, limit_name="max_file_bytes"):
    """`read`, and the bytes must be an image every serving signature decodes (JPEG,
    PNG, GIF or BMP, by its first bytes); NotReadable otherwise."""
    data = read(path, max_bytes, limit_name)
    if not data:
        raise NotReadable("empty file")
    if conventions.image_format(data) is None:
        raise NotReadable("not a JPEG, PNG, GIF or BMP image (the formats the model decodes)")
    return data
