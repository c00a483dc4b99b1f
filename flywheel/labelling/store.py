"""Where labels go: a class-folder tree `slimserve-convert` reads, and a provenance file
that is also the state a resumed or a second labeller continues from.

    <output_dir>/<class>/<request id>.<ext>     the logged image, byte for byte
    <output_dir>/provenance.jsonl               one JSON line per decision (label, none
                                                of these, skip): who, when, which log
                                                record, the model's top-3
    <output_dir>/.label-claims.jsonl            which labeller holds which image, until when

Several labellers (threads of one page, or page processes on one folder) never lose or
double a label:
- every change happens under an exclusive lock (flock on provenance.jsonl; per open file,
  so threads of one process exclude each other too), after reading what the others
  appended since (`refresh`);
- the first decision on an image wins; a later one gets AlreadyDecided with the winner's
  record (the page says "already labelled by ... as ...");
- an image offered to one labeller is claimed for a while (`claim`), so the others are
  offered other images; the claims of a page process that is gone (this host, its pid
  dead: a restart after Ctrl-C or kill -9) are void at once.

Nothing is half-written: an image is written to a hidden temporary, fsynced and renamed
into its class folder, then the provenance line is appended and fsynced; that line is the
commit. A failure (a full disk) removes the image again and cuts the line back; after a
kill -9, a torn last line is cut off by the next writer and an image without its line
(`clean_orphans`) is removed, so the tree and the provenance file always agree.
Class folder names are checked as single, visible path components inside output_dir, and
request ids are made safe by log_reader.request_id: no name can leave the folder.
"""
import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import socket
import threading
import time
import unicodedata

from slimserve import errors

PROVENANCE_FILE = "provenance.jsonl"
CLAIMS_FILE = ".label-claims.jsonl"
LABEL, NONE, SKIP = "label", "none", "skip"
DECISIONS = (LABEL, NONE, SKIP)
IMAGE_EXTENSIONS = ("jpg", "png", "gif", "bmp")
# The converter's rule (estimator/dataset.py check_class_name): line breaks and controls
# cannot be a labels.txt line.
_FORBIDDEN_CATEGORIES = ("Cc", "Zl", "Zp")
_SAFE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$")
_TEMP = re.compile(r"^\..+\.tmp-(\d+)-[0-9a-f]+$")


class AlreadyDecided(Exception):
    """Another labeller decided this image first; `record` is their provenance line."""

    def __init__(self, record):
        super().__init__("already decided")
        self.record = record


def check_folder_name(name):
    """A UserError unless `name` can be a class folder directly inside the output folder
    that slimserve-convert reads back as the same class name."""
    if not isinstance(name, str) or not name.strip():
        raise errors.UserError("class name %r is blank" % (name,))
    bad = sorted({c for c in name if unicodedata.category(c) in _FORBIDDEN_CATEGORIES})
    if bad:
        raise errors.UserError("class name %r contains control character(s) %s"
                               % (name, ", ".join("U+%04X" % ord(c) for c in bad)))
    if "/" in name or "\\" in name or name in (".", ".."):
        raise errors.UserError("class name %r cannot be a folder name (path separator "
                               "or dot folder)" % name)
    if name.startswith("."):
        raise errors.UserError("class name %r starts with a dot: slimserve-convert skips "
                               "hidden folders" % name)
    if len(name.encode("utf-8", "surrogatepass")) > 255:
        raise errors.UserError("class name %r is longer than a file name may be" % name)


def check_request_id(request_id):
    if not isinstance(request_id, str) or not _SAFE_ID.match(request_id):
        raise ValueError("unsafe request id %r" % (request_id,))


def _fsync_directory(path):
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _JsonLines:
    """Reads what was appended to a JSON-lines file since the last read: complete lines
    only (a line still being written, or torn by a crash, waits or is cut later)."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.malformed = 0

    def read_new(self):
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        records = []
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line.decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                self.malformed += 1
                continue
            if isinstance(record, dict) and isinstance(record.get("request_id"), str):
                records.append(record)
            else:
                self.malformed += 1
        self.offset += end
        return records


def _append(fd, data):
    """Appends `data` (whole lines) to the file open at `fd` and fsyncs; a torn last line
    left by a crash is cut off first; on failure the file is cut back to where it was."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        size = _last_line_end(fd, size)
        os.ftruncate(fd, size)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.ftruncate(fd, size)
        raise


def _last_line_end(fd, size):
    position = size
    while position > 0:
        start = max(0, position - 65536)
        chunk = os.pread(fd, position - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        position = start
    return 0


def read_decisions(output_dir):
    """{request id: first provenance record} of an output folder (empty when it has
    none yet): what a resumed run must not propose again."""
    decided = {}
    for record in _JsonLines(os.path.join(output_dir, PROVENANCE_FILE)).read_new():
        if record.get("decision") in DECISIONS:
            decided.setdefault(record["request_id"], record)
    return decided


class Store:
    """The output folder of one or more labellers."""

    def __init__(self, output_dir, classes):
        self.output_dir = os.path.abspath(output_dir)
        for name in classes:
            check_folder_name(name)
        self.classes = list(classes)
        with errors.writing(self.output_dir, "--output_dir"):
            os.makedirs(self.output_dir, exist_ok=True)
            if not os.access(self.output_dir, os.W_OK | os.X_OK):
                raise errors.UserError("--output_dir %s is not writable" % self.output_dir)
        self._real_dir = os.path.realpath(self.output_dir)
        self.provenance_path = os.path.join(self.output_dir, PROVENANCE_FILE)
        self.claims_path = os.path.join(self.output_dir, CLAIMS_FILE)
        self._provenance = _JsonLines(self.provenance_path)
        self._claims = _JsonLines(self.claims_path)
        self.decided = {}  # request id -> its first provenance record
        self.claims = {}   # request id -> (owner, until, host, pid)
        self._host = socket.gethostname()
        self._mutex = threading.Lock()
        with self._locked():
            self._refresh()

    # --- locking and state ---------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self):
        """This process's threads, then every process: the flock on provenance.jsonl."""
        with self._mutex:
            with errors.writing(self.provenance_path, "--output_dir"):
                fd = os.open(self.provenance_path,
                             os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield fd
            finally:
                os.close(fd)  # releases the lock

    def _refresh(self):
        for record in self._provenance.read_new():
            if record.get("decision") in DECISIONS:
                self.decided.setdefault(record["request_id"], record)  # first one wins
        for record in self._claims.read_new():
            owner, until = record.get("owner"), record.get("until")
            if isinstance(owner, str) and isinstance(until, (int, float)):
                self.claims[record["request_id"]] = (owner, float(until), record.get("host"),
                                                     record.get("pid"))

    def _live_holder(self, request_id, now):
        """The owner of a claim on the image that still counts, or None."""
        owner, until, host, pid = self.claims.get(request_id, (None, 0.0, None, None))
        if until <= now:
            return None
        if host == self._host and isinstance(pid, int) and pid != os.getpid() and \
                not _alive(pid):
            return None  # its page process is gone
        return owner

    def refresh(self):
        """Reads what other labellers appended (without waiting for their lock)."""
        with self._mutex:
            self._refresh()

    def counts(self):
        with self._mutex:
            counts = {decision: 0 for decision in DECISIONS}
            for record in self.decided.values():
                counts[record["decision"]] += 1
            return counts

    def decision(self, request_id):
        with self._mutex:
            return self.decided.get(request_id)

    # --- claims --------------------------------------------------------------------

    def claim(self, owner, order, count, seconds, now=None):
        """Up to `count` request ids of `order` (best first) for `owner`: those it holds
        already and those undecided and not held by another owner, each claimed (or the
        claim renewed when half gone) for `seconds`. Returns them in `order`'s order."""
        with self._locked():
            self._refresh()
            now = time.time() if now is None else now
            chosen, lines = [], []
            for rid in order:
                if len(chosen) >= count:
                    break
                if rid in self.decided:
                    continue
                holder = self._live_holder(rid, now)
                if holder not in (None, owner):
                    continue
                chosen.append(rid)
                if holder != owner or self.claims[rid][1] - now < seconds / 2.0:
                    self.claims[rid] = (owner, now + seconds, self._host, os.getpid())
                    lines.append(json.dumps({"request_id": rid, "owner": owner,
                                             "until": round(now + seconds, 3),
                                             "host": self._host, "pid": os.getpid()}) + "\n")
            if lines:
                with errors.writing(self.claims_path, "--output_dir"):
                    fd = os.open(self.claims_path,
                                 os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
                    try:
                        _append(fd, "".join(lines).encode("utf-8"))
                    finally:
                        os.close(fd)
            return chosen

    def holder(self, request_id, now=None):
        """The owner holding a live claim on the image, or None."""
        with self._mutex:
            return self._live_holder(request_id, time.time() if now is None else now)

    # --- decisions -----------------------------------------------------------------

    def class_dir(self, label):
        """The folder of class index `label`, created, and checked to be a real folder
        directly inside the output folder (never a symlink out of it)."""
        name = self.classes[label]
        path = os.path.join(self.output_dir, name)
        try:
            os.mkdir(path, 0o755)
            _fsync_directory(self.output_dir)
        except FileExistsError:
            pass
        if os.path.islink(path) or not os.path.isdir(path) or \
                os.path.dirname(os.path.realpath(path)) != self._real_dir:
            raise errors.UserError("class folder %s is not a folder inside --output_dir "
                                   "(a symlink?); refusing to write there" % path)
        return path

    def decide(self, record, image=None, extension=None):
        """Commits one decision: `record` (a dict with request_id, decision and, for a
        label, `label` the class index) becomes a provenance line, and for a label the
        image is written to its class folder first. Returns the record as written;
        AlreadyDecided when another labeller was first; a UserError (naming the path)
        when the disk refuses, with nothing left behind."""
        rid = record["request_id"]
        check_request_id(rid)
        if record["decision"] not in DECISIONS:
            raise ValueError("decision must be one of %s" % ", ".join(DECISIONS))
        record = dict(record)
        with self._locked() as fd:
            self._refresh()
            if rid in self.decided:
                raise AlreadyDecided(self.decided[rid])
            written = None
            if record["decision"] == LABEL:
                if not isinstance(record.get("label"), int) or \
                        not 0 <= record["label"] < len(self.classes):
                    raise ValueError("label must be a class index")
                if extension not in IMAGE_EXTENSIONS or not image:
                    raise ValueError("a label needs the image and its extension")
                folder = self.class_dir(record["label"])
                self._remove_images(rid)  # of an earlier attempt a crash left uncommitted
                written = os.path.join(folder, "%s.%s" % (rid, extension))
                with errors.writing(written, "--output_dir"):
                    self._write_atomic(written, image)
                record["file"] = os.path.relpath(written, self.output_dir)
                record["class"] = self.classes[record["label"]]
            else:
                record["file"] = None
            line = (json.dumps(record, ensure_ascii=True, sort_keys=True) + "\n").encode()
            try:
                with errors.writing(self.provenance_path, "--output_dir"):
                    _append(fd, line)
            except BaseException:
                if written is not None:
                    self._remove(written)
                raise
            self.decided[rid] = record
            return record

    def _write_atomic(self, path, data):
        folder, name = os.path.split(path)
        temp = os.path.join(folder, ".%s.tmp-%d-%s" % (name, os.getpid(), secrets.token_hex(4)))
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, path)
            _fsync_directory(folder)
        except BaseException:
            self._remove(temp)
            raise

    @staticmethod
    def _remove(path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _remove_images(self, rid):
        for name in self.classes:
            for extension in IMAGE_EXTENSIONS:
                path = os.path.join(self.output_dir, name, "%s.%s" % (rid, extension))
                if os.path.lexists(path):
                    self._remove(path)

    def clean_orphans(self, request_ids):
        """Removes what a killed labeller left: images of `request_ids` without a
        provenance line (written, never committed) and temporaries of processes that are
        gone. Returns how many files went."""
        removed = 0
        with self._locked():
            self._refresh()
            for name in self.classes:
                folder = os.path.join(self.output_dir, name)
                if not os.path.isdir(folder) or os.path.islink(folder):
                    continue
                for entry in os.listdir(folder):
                    temp = _TEMP.match(entry)
                    stem = entry.rsplit(".", 1)[0]
                    if temp and not _alive(int(temp.group(1))) or (
                            not temp and stem in request_ids and stem not in self.decided):
                        self._remove(os.path.join(folder, entry))
                        removed += 1
        return removed


def _alive(pid):
    if pid == os.getpid():
        return False  # ours are never left behind by a live write (we hold the lock)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError as error:
        return error.errno == errno.EPERM
    return True
