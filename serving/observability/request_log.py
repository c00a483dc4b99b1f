"""TF Serving's request logging with a collector that actually writes, and never loses what
it counted as written.

TF Serving parses `logging_config { log_collector_config { type filename_prefix }
sampling_config { sampling_rate } }` in a model's config but ships no collector. This
one writes sampled `PredictionLog` records (request, response and `log_metadata`) as
TFRecord files under `filename_prefix` (a local path):

- a request thread only samples and enqueues: logging never blocks or fails a request.
  The queue is bounded in records and in bytes (a record's size is its request's and
  response's); past either bound the record is dropped and counted (`drops`, exported
  as request_log_count{status_code="RESOURCE_EXHAUSTED"});
- one background thread serialises and writes; files rotate by size and by age, and on
  `flush()` (SIGUSR1 to slimserve-server);
- each file is first a hidden temporary, `.<final name>.tmp`, created exclusively
  (O_EXCL: two loggers or two servers with one prefix never share a file) and locked
  (flock) while its writer lives; closed, it is published under its final name by a
  no-clobber link, so a reader globbing `<filename_prefix>*` never sees half a file;
- every record is flushed to the file before it counts as `written`. A write error (a
  full disk) truncates the file back to its last complete record and publishes it; the
  failed record is counted as lost and the next one starts a new file;
- after a crash (kill -9) the dead writer's temporary is published by the next logger
  on that directory (its torn last record cut off), and until then the readers below
  read its complete records: nothing counted as written stays hidden.

The files are read back, one at a time and with the damage above handled, by `iter_logs`
(what `slimserve-export --warmup_from` and the tuner read); log_reader.py builds the
indexed, image-decoding reader every other reader of the logs uses on it.
"""
import collections
import dataclasses
import errno
import fcntl
import glob
import itertools
import logging
import os
import random
import threading
import time

import grpc
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from slimserve import errors
from slimserve import fields
from slimserve.serving import limits
from slimserve.serving.core import health as health_lib

# PredictionLog's oneof field for each API (classify_log, regress_log, ...).
LOG_FIELDS = {"predict": "predict_log", "classify": "classify_log", "regress": "regress_log",
              "multi_inference": "multi_inference_log"}
SUFFIX = ".tfrecord"
TEMP_SUFFIX = ".tmp"
_FRAMING = 16  # a TFRecord's length (8), its CRC (4) and the data's CRC (4)
# A temporary this young and empty may be a writer between its create and its lock.
_FRESH_SECONDS = 60.0
_STOP = object()


class _Flush:
    """Queued behind the records to publish: the writer closes its file, then sets done."""

    def __init__(self):
        self.done = threading.Event()


def check_prefix(filename_prefix):
    """Raises a UserError unless `filename_prefix` can name local log files."""
    if not filename_prefix:
        raise errors.UserError("logging_config: log_collector_config.filename_prefix is empty")
    if "://" in filename_prefix:
        raise errors.UserError("logging_config: filename_prefix %r is a URL; request logs are "
                         "written to local files" % filename_prefix)
    if "\0" in filename_prefix:
        raise errors.UserError("logging_config: filename_prefix contains a NUL byte")


def check_sampling_rate(sampling_rate):
    if not 0.0 <= sampling_rate <= 1.0:
        raise errors.UserError("logging_config: sampling_rate must be in [0, 1], got %r"
                         % sampling_rate)


def resolve_prefix(filename_prefix, log_dir=None):
    """The absolute prefix (directories resolved, symlinks included) that a configured
    `filename_prefix` writes to. With `log_dir` (--request_log_dir, itself resolved) it
    must lie inside it: a relative prefix is joined to it; an absolute one outside it, or
    one that escapes it with `..` or a symlink, is a UserError."""
    check_prefix(filename_prefix)
    directory, base = os.path.split(filename_prefix)
    if base in (".", ".."):
        raise errors.UserError("logging_config: filename_prefix %r ends in %r, not in a file name "
                         "prefix" % (filename_prefix, base))
    if log_dir is None:
        return os.path.join(os.path.realpath(directory or "."), base)
    resolved = os.path.realpath(os.path.join(log_dir, directory))
    if os.path.commonpath([resolved, log_dir]) != log_dir:
        raise errors.UserError("logging_config: filename_prefix %r is outside --request_log_dir "
                         "(give a path relative to it)" % filename_prefix)
    return os.path.join(resolved, base)


def make_directory(filename_prefix):
    """Creates the directory of `filename_prefix`; a UserError saying why it cannot."""
    directory = os.path.dirname(filename_prefix)
    if not directory:
        return
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        why = error.strerror or str(error)
        if isinstance(error, FileExistsError):
            why = "a file of that name exists"
        raise errors.UserError("cannot create the request log directory %s: %s"
                         % (directory, why)) from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise errors.UserError("the request log directory %s is not writable" % directory)


def _status_name(error):
    """The canonical code a write error stands for (request_log_count's status_code)."""
    code = getattr(error, "error_code", None)  # TF's codes are gRPC's
    for status in grpc.StatusCode:
        if code is not None and status.value[0] == code:
            return status.name
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return grpc.StatusCode.RESOURCE_EXHAUSTED.name
    if isinstance(error, OSError) and error.errno in (errno.EACCES, errno.EPERM,
                                                      errno.EROFS):
        return grpc.StatusCode.PERMISSION_DENIED.name
    return grpc.StatusCode.INTERNAL.name


def _why(error, path):
    """`<path>: <reason>` of a write error (an OSError names its own file)."""
    if isinstance(error, OSError):
        return "%s: %s" % (error.filename or path, error.strerror or error)
    message = getattr(error, "message", None) or str(error)
    if path and message.startswith(path + "; "):  # TF's "<file>; <reason>"
        return "%s: %s" % (path, message[len(path) + 2:])
    return message if path and path in message else "%s: %s" % (path, message)


@dataclasses.dataclass
class RequestLogOptions:
    """How every request logger queues and rotates (the server builds it from its flags;
    fields without a flag keep their defaults there), checked once per logger."""
    queue_bytes: int = fields.option(
        64 << 20, "Bytes of sampled records waiting to be written; past it records are "
        "dropped and counted.", bound=limits.BYTES, flag="request_log_queue_bytes")
    queue_records: int = fields.option(
        1024, "Records waiting to be written; past it records are dropped and counted.",
        bound=fields.Bound(1, 2 ** 20))
    max_file_bytes: int = fields.option(
        64 << 20, "A file is published and the next one opened past this size.",
        bound=limits.BYTES)
    max_file_seconds: float = fields.option(
        300.0, "... or this long after it was opened.",
        bound=fields.Bound(0, limits.DAY_SECONDS, lower_open=True))


class RequestLogger:
    """Samples, queues and writes the requests of one model."""

    def __init__(self, filename_prefix, sampling_rate, options=None, seed=None,
                 model=None, health=None):
        """options: a RequestLogOptions (default: its defaults); seed: the sampler's.
        model, health: the model logged and the core.health.Health the writer thread
        reports to (a failure of the writer itself is logged naming the model, the record
        it held counted as lost with INTERNAL, and the thread carries on)."""
        check_prefix(filename_prefix)
        self.model = model
        self.component = "request log writer of %s" % (
            "model %s" % model if model else filename_prefix)
        self.health = health if health is not None else health_lib.standalone()
        check_sampling_rate(sampling_rate)
        self.options = fields.check(options if options is not None else RequestLogOptions())
        make_directory(filename_prefix)
        self.filename_prefix = filename_prefix
        self.sampling_rate = sampling_rate
        self._random = random.Random(seed)
        self._cond = threading.Condition()
        self._queue = collections.deque()  # records, _Flush markers and _STOP
        self._queued_records = self._queued_bytes = 0
        self.written = 0  # records flushed into a file (published, or recovered by readers)
        self.drops = collections.Counter()  # status code -> records not written
        self.files = collections.deque(maxlen=64)  # the last files published
        self._directory = os.path.dirname(filename_prefix) or "."
        self._base = os.path.basename(filename_prefix)
        self._writer = self._fd = None
        self._temp_path = self._final_path = None
        self._opened_at = 0.0
        self._bytes = 0  # of complete records in the open file
        self._sequence = 0
        self._failing = 0  # records lost since the last write error began
        self._unpublished = False  # a file could not be published (its directory refuses)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="request-log", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, logging_config, filename_prefix=None, options=None):
        """From TF Serving's LoggingConfig proto (`filename_prefix` overrides its prefix,
        e.g. resolved under --request_log_dir); None when it names no collector."""
        collector = logging_config.log_collector_config
        if not collector.filename_prefix and not collector.type:
            return None
        return cls(filename_prefix or collector.filename_prefix,
                   logging_config.sampling_config.sampling_rate, options)

    @property
    def dropped(self):
        """Records sampled but not written, for any reason."""
        return sum(self.drops.values())

    def sample(self):
        """Whether to log the next request (cheap: callers build records only then)."""
        return not self._closed.is_set() and self._random.random() < self.sampling_rate

    def maybe_log(self, api, request, response, model_spec):
        """Called after a successful request; returns True when the record was queued.

        `model_spec` is the response's ModelSpec (the version that answered). Cheap when
        the record is not sampled; never raises."""
        return self.sample() and self.enqueue(api, request, response, model_spec)

    def enqueue(self, api, request, response, model_spec):
        """Queues a sampled record without blocking; False (and counted) past the queue's
        record or byte bound, or once closed."""
        size = request.ByteSize() + response.ByteSize()
        with self._cond:
            if self._closed.is_set() or \
                    self._queued_records >= self.options.queue_records or \
                    self._queued_bytes + size > self.options.queue_bytes:
                self.drops[grpc.StatusCode.RESOURCE_EXHAUSTED.name] += 1
                return False
            self._queue.append((api, request, response, model_spec, time.time(), size))
            self._queued_records += 1
            self._queued_bytes += size
            self._cond.notify()
        return True

    def flush(self, timeout=None):
        """Publishes the open file with every record queued before this call. Returns
        at once when `timeout` is None (a signal handler), else waits up to `timeout`
        seconds and says whether the file was published."""
        marker = _Flush()
        with self._cond:
            if self._closed.is_set():
                return True
            self._queue.append(marker)  # control items are outside the bounds
            self._cond.notify()
        return None if timeout is None else marker.done.wait(timeout)

    def close(self, timeout=10.0):
        """Writes what is queued, publishes the current file, stops the thread."""
        with self._cond:
            if self._closed.is_set():
                return
            self._closed.set()
            self._queue.append(_STOP)  # behind every queued record
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            logging.warning("request log %s: still writing after %.0f s; closing anyway",
                            self.filename_prefix, timeout)
        logging.info("request log %s: closed; %d record(s) written, %d not written%s",
                     self.filename_prefix, self.written, self.dropped,
                     " (%s)" % ", ".join("%s %d" % item for item in sorted(self.drops.items()))
                     if self.drops else "")

    # --- the writer thread -------------------------------------------------------------

    def _next(self):
        """The next queued item, or None when the open file has reached its age."""
        with self._cond:
            while not self._queue:
                wait = None
                if self._writer is not None:
                    wait = self._opened_at + self.options.max_file_seconds - \
                        time.monotonic()
                    if wait <= 0:
                        return None
                self._cond.wait(wait)
            item = self._queue.popleft()
            if isinstance(item, tuple):
                self._queued_records -= 1
                self._queued_bytes -= item[-1]
            return item

    def _run(self):
        self._recover()
        while True:
            item = self._next()
            try:
                if item is None:  # the open file reached its age
                    self._close_file()
                elif item is _STOP:
                    self._close_file()
                elif isinstance(item, _Flush):
                    try:
                        self._close_file()
                    finally:
                        item.done.set()
                else:
                    self._write(*item[:5])
            except Exception as error:  # pylint: disable=broad-except  (the writer itself)
                self._writer_failed(item, error)
            else:
                if isinstance(item, tuple):
                    self.health.ok(self.component)
            if item is _STOP:
                return

    def _writer_failed(self, item, error):
        """The writer failed otherwise than a write error (those are _lost's): the record
        it held is counted lost (INTERNAL), the file it had open published with its
        complete records, and the thread goes on with the next item."""
        if isinstance(item, tuple):
            self._count_drop(grpc.StatusCode.INTERNAL.name)
        self.health.failed(self.component, error, self.model)
        try:
            self._close_file(failed=True)
        except Exception:  # pylint: disable=broad-except  (left for recovery)
            self._writer = self._fd = None

    def _recover(self):
        try:
            for path in recover_abandoned(self._directory, self._base):
                logging.info("request log: published %s, left unpublished by a writer that "
                             "died or a directory that refused it", path)
        except Exception:  # pylint: disable=broad-except  (never the writer thread)
            logging.exception("request log %s: recovering abandoned files failed",
                              self.filename_prefix)

    def _record(self, api, request, response, model_spec, timestamp):
        log = prediction_log_pb2.PredictionLog()
        log.log_metadata.model_spec.CopyFrom(model_spec)
        log.log_metadata.sampling_config.sampling_rate = self.sampling_rate
        log.log_metadata.timestamp_secs = int(timestamp)
        entry = getattr(log, LOG_FIELDS[api])
        entry.request.CopyFrom(request)
        entry.response.CopyFrom(response)
        return log.SerializeToString()

    def _write(self, api, request, response, model_spec, timestamp):
        try:
            record = self._record(api, request, response, model_spec, timestamp)
        except Exception:  # pylint: disable=broad-except  (a bad record, never the thread)
            logging.exception("request log %s: record not built", self.filename_prefix)
            self._count_drop(grpc.StatusCode.INTERNAL.name)
            return
        del request, response  # the queue's references: memory goes as records are written
        try:
            if self._writer is None:
                self._open()
            self._writer.write(record)
            self._writer.flush()  # on disk (the page cache) before it counts as written
        except (tf.errors.OpError, OSError) as error:
            self._lost(error)
            return
        self._bytes += len(record) + _FRAMING
        self.written += 1
        if self._failing:
            logging.warning("request log %s: writing again after %d record(s) lost",
                            self.filename_prefix, self._failing)
            self._failing = 0
        if self._bytes >= self.options.max_file_bytes:
            self._close_file()

    def _count_drop(self, code):
        with self._cond:  # request threads count queue drops under it
            self.drops[code] += 1

    def _lost(self, error):
        """A write error (a full disk, a directory that refuses): the record is counted as
        lost; the open file keeps its complete records and is published; the next record
        starts a new file. One log line per spell of errors (the first, naming the path
        and why), one when writing works again."""
        code = _status_name(error)
        self._count_drop(code)
        if not self._failing and not self._unpublished:
            logging.warning("request log %s: cannot write %s; sampled records are dropped "
                            "(request_log_count{status_code=\"%s\"}) until it can, and "
                            "no file is left half written", self.filename_prefix,
                            _why(error, self._temp_path or self._directory), code)
        self._failing += 1
        self._close_file(failed=True)

    def _open(self):
        """Claims a fresh temporary (exclusive create) whose final name is also free."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        while True:
            self._sequence += 1
            name = "%s-%s-%d-%05d%s" % (self._base, stamp, os.getpid(), self._sequence, SUFFIX)
            final = os.path.join(self._directory, name)
            temp = os.path.join(self._directory, "." + name + TEMP_SUFFIX)
            try:
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                continue  # another logger with this prefix holds that name
            if os.path.lexists(final):  # published earlier by a process with our pid
                os.close(fd)
                os.unlink(temp)
                continue
            break
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held while this writer lives (see _recover)
            self._writer = tf.io.TFRecordWriter(temp)
        except BaseException:
            os.close(fd)
            os.unlink(temp)
            raise
        self._fd, self._temp_path, self._final_path = fd, temp, final
        self._opened_at = time.monotonic()
        self._bytes = 0

    def _close_file(self, failed=False):
        """Publishes the open file: its complete records only, under its final name."""
        if self._writer is None:
            return
        writer, self._writer = self._writer, None
        try:
            writer.close()
        except (tf.errors.OpError, OSError):
            failed = True  # buffered bytes may be half written: cut back below
        fd, self._fd = self._fd, None
        published = True
        try:
            if failed:
                os.ftruncate(fd, self._bytes)
            if self._bytes:
                _publish(self._temp_path, self._final_path)
                self.files.append(self._final_path)
            else:
                os.unlink(self._temp_path)
        except OSError as error:
            # Left as an abandoned temporary: readers read its complete records, and the
            # next successful rotation (or the next start) publishes it.
            published = False
            if not self._unpublished and not self._failing:
                logging.warning("request log %s: cannot publish %s; its complete records "
                                "stay readable and it is published once the directory "
                                "accepts it", self.filename_prefix,
                                _why(error, self._temp_path))
            self._unpublished = True
        finally:
            os.close(fd)  # releases the lock
        if published and self._bytes and self._unpublished:
            self._unpublished = False
            logging.warning("request log %s: publishing again", self.filename_prefix)
        if published and not failed:
            self._recover()  # also retries anything a full disk left unpublished


def _publish(temp, final):
    """temp -> final without ever replacing a file: link (fails if final exists), unlink."""
    try:
        os.link(temp, final)
    except FileExistsError:
        if not os.path.samefile(temp, final):
            raise
    os.unlink(temp)


def published_name(path):
    """The name a request log file has once published: a temporary `.<name>.tmp` (its
    writer alive, or dead and published later) becomes `<name>`; any other path is its
    own."""
    directory, name = os.path.split(path)
    if name.startswith(".") and name.endswith(TEMP_SUFFIX):
        return os.path.join(directory, name[1:-len(TEMP_SUFFIX)])
    return path


def _try_lock(fd, shared):
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _abandoned(path):
    """An open descriptor of `path` locked exclusively when its writer is gone, else None."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None  # published or removed meanwhile
    try:
        stat = os.fstat(fd)
        if stat.st_nlink == 0 or not _try_lock(fd, shared=False):
            raise OSError("in use")
        if stat.st_size == 0 and time.time() - stat.st_mtime < _FRESH_SECONDS:
            raise OSError("maybe between create and lock")
    except OSError:
        os.close(fd)
        return None
    return fd


def recover_abandoned(directory, base=""):
    """Publishes the temporaries in `directory` (of prefixes starting with `base`) whose
    writer died: their complete records under their final name, a torn last record cut
    off, empty ones removed. Returns the paths published."""
    published = []
    pattern = os.path.join(glob.escape(directory), "." + glob.escape(base) + "*" +
                           SUFFIX + TEMP_SUFFIX)
    for temp in sorted(glob.glob(pattern)):
        fd = _abandoned(temp)
        if fd is None:
            continue
        try:
            report = FileReport(temp, recovered=True)
            for _ in _records(temp, report):
                pass
            if report.records:
                os.ftruncate(fd, report.complete_bytes)
                _publish(temp, published_name(temp))
                published.append(published_name(temp))
            else:
                os.unlink(temp)
        except (OSError, errors.UserError) as error:
            logging.warning("request log: cannot recover %s: %s", temp, error)
        finally:
            os.close(fd)
    return published


# --- readers -------------------------------------------------------------------------

@dataclasses.dataclass
class FileReport:
    """What a reader got from one file."""
    path: str
    records: int = 0
    complete_bytes: int = 0
    torn_bytes: int = 0  # a last record cut short (a crash, a copy in progress): dropped
    recovered: bool = False  # an unpublished temporary whose writer died

    def describe(self):
        notes = []
        if self.recovered:
            notes.append("unpublished temporary of a writer that died")
        if self.torn_bytes:
            notes.append("torn last record of %d bytes dropped" % self.torn_bytes)
        return "request log %s: %d record(s)%s" % (self.path, self.records,
                                                    "; " + "; ".join(notes) if notes else "")


def _records(path, report):
    """The complete records of one TFRecord file; a torn tail is counted in `report`, any
    other damage is a UserError naming the file."""
    size = os.path.getsize(path)
    try:
        for record in tf.compat.v1.io.tf_record_iterator(path):
            report.records += 1
            report.complete_bytes += len(record) + _FRAMING
            yield record
    except tf.errors.DataLossError as error:
        if "truncated record" not in str(error):
            raise errors.UserError("%s is not a complete TFRecord file of PredictionLog: %s"
                             % (path, getattr(error, "message", error))) from None
    report.torn_bytes = size - report.complete_bytes  # TF stops quietly in a torn header


def _abandoned_temps(pattern):
    """Temporaries of files `pattern` would match whose writer died (locked shared while
    they are read, so no recovery truncates them under the reader)."""
    directory, name = os.path.split(pattern)
    found = []
    for temp in sorted(glob.glob(os.path.join(directory, "." + name + TEMP_SUFFIX))):
        try:
            fd = os.open(temp, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        if _try_lock(fd, shared=True) and os.fstat(fd).st_nlink:
            found.append((temp, fd))
        else:
            os.close(fd)
    return found


def abandoned_temporaries(pattern):
    """The temporaries of files a local `pattern` would match whose writer died (their
    complete records are what iter_logs reads after the published files)."""
    found = _abandoned_temps(pattern)
    for _, fd in found:
        os.close(fd)
    return [temp for temp, _ in found]


def iter_logs(pattern, report=None):
    """PredictionLog records from the files matching a glob, one at a time (days of logs
    never have to fit in memory): the published files, then the complete records of
    temporaries whose writer died (kill -9) before publishing them. A torn last record is
    dropped, never the file. Each file is reported (logged, and appended as a FileReport
    to the list `report` when given)."""
    temps = _abandoned_temps(pattern) if "://" not in pattern else []
    try:
        files = sorted(f for f in tf.io.gfile.glob(pattern)
                       if not os.path.basename(f).startswith("."))
        seen = set()
        for path, fd in temps:  # a temp published between the two globs: read it once
            seen.add((os.fstat(fd).st_dev, os.fstat(fd).st_ino))
        local = "://" not in pattern
        files = [f for f in files if not local or _identity(f) not in seen]
        if not files and not temps:
            raise errors.UserError("no request log files match %s" % pattern)
        for path, recovered in [(f, False) for f in files] + [(t, True) for t, _ in temps]:
            if tf.io.gfile.isdir(path):
                raise errors.UserError("%s (matched by %s) is a directory, not a request log file"
                                 % (path, pattern))
            file_report = FileReport(path, recovered=recovered)
            if local:
                records = _records(path, file_report)
            else:
                records = _remote_records(path, file_report)
            for record in records:
                yield prediction_log_pb2.PredictionLog.FromString(record)
            (logging.warning if file_report.torn_bytes or recovered else logging.info)(
                "%s", file_report.describe())
            if report is not None:
                report.append(file_report)
    finally:
        for _, fd in temps:
            os.close(fd)


def _identity(path):
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _remote_records(path, report):
    try:
        for record in tf.compat.v1.io.tf_record_iterator(path):
            report.records += 1
            yield record
    except tf.errors.DataLossError as error:
        raise errors.UserError("%s is not a complete TFRecord file of PredictionLog: %s"
                         % (path, getattr(error, "message", error))) from None


def read_logs(pattern, limit=None, report=None):
    """The first `limit` (all when None) records of `iter_logs`, as a list."""
    return list(itertools.islice(iter_logs(pattern, report), limit))
