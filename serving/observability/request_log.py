"""TF Serving's request logging with a collector that actually writes.

TF Serving parses `logging_config { log_collector_config { type filename_prefix }
sampling_config { sampling_rate } }` in a model's config but ships no collector. This
one writes sampled `PredictionLog` records (request, response and `log_metadata`) as
TFRecord files under `filename_prefix`:

- a request thread only samples and enqueues (`put_nowait` on a bounded queue): logging
  never blocks or fails a request; when the queue is full the record is dropped and
  counted (`dropped`, exported as a metric);
- one background thread serialises and writes; files rotate by size and by age;
- each file is written as a hidden temporary (`.<name>.tmp` beside the final name) and
  renamed when closed, so a reader globbing `<filename_prefix>*` never sees half a file;
- `close()` (called on SIGTERM) drains the queue and closes the current file.

The files are what `slimserve-export --warmup_from` and `slimserve-compare --logs` read.
"""
import itertools
import logging
import os
import queue
import random
import threading
import time

import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

# PredictionLog's oneof field for each API (classify_log, regress_log, ...).
LOG_FIELDS = {"predict": "predict_log", "classify": "classify_log", "regress": "regress_log",
              "multi_inference": "multi_inference_log"}
SUFFIX = ".tfrecord"
_STOP = object()


class RequestLogger:
    """Samples, queues and writes the requests of one model."""

    def __init__(self, filename_prefix, sampling_rate, max_file_bytes=64 << 20,
                 max_file_seconds=300.0, queue_size=1024, seed=None):
        if not filename_prefix:
            raise ValueError("logging_config: log_collector_config.filename_prefix is empty")
        if not 0.0 <= sampling_rate <= 1.0:
            raise ValueError("logging_config: sampling_rate must be in [0, 1], got %r"
                             % sampling_rate)
        if max_file_bytes < 1 or max_file_seconds <= 0 or queue_size < 1:
            raise ValueError("request logging: max_file_bytes, max_file_seconds and "
                             "queue_size must be positive")
        self.filename_prefix = filename_prefix
        self.sampling_rate = sampling_rate
        self.max_file_bytes = max_file_bytes
        self.max_file_seconds = max_file_seconds
        self._random = random.Random(seed)
        self._queue = queue.Queue(maxsize=queue_size)
        self.dropped = 0  # read by the metrics endpoint
        self.written = 0
        self.files = []  # final paths of the files closed so far
        self._writer = None
        self._temp_path = self._final_path = None
        self._opened_at = 0.0
        self._bytes = 0
        self._sequence = 0
        self._closed = threading.Event()
        directory = os.path.dirname(filename_prefix)
        if directory:
            tf.io.gfile.makedirs(directory)
        self._thread = threading.Thread(target=self._run, name="request-log", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, logging_config, **kwargs):
        """From TF Serving's LoggingConfig proto; None when it names no collector."""
        collector = logging_config.log_collector_config
        if not collector.filename_prefix and not collector.type:
            return None
        return cls(collector.filename_prefix, logging_config.sampling_config.sampling_rate,
                   **kwargs)

    def sample(self):
        """Whether to log the next request (cheap: callers build records only then)."""
        return not self._closed.is_set() and self._random.random() < self.sampling_rate

    def maybe_log(self, api, request, response, model_spec):
        """Called after a successful request; returns True when the record was queued.

        `model_spec` is the response's ModelSpec (the version that answered). Cheap when
        the record is not sampled; never raises."""
        return self.sample() and self.enqueue(api, request, response, model_spec)

    def enqueue(self, api, request, response, model_spec):
        """Queues a sampled record without blocking; False (and counted) when full."""
        try:
            self._queue.put_nowait((api, request, response, model_spec, time.time()))
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def _record(self, api, request, response, model_spec, timestamp):
        log = prediction_log_pb2.PredictionLog()
        log.log_metadata.model_spec.CopyFrom(model_spec)
        log.log_metadata.sampling_config.sampling_rate = self.sampling_rate
        log.log_metadata.timestamp_secs = int(timestamp)
        entry = getattr(log, LOG_FIELDS[api])
        entry.request.CopyFrom(request)
        entry.response.CopyFrom(response)
        return log.SerializeToString()

    def _open(self):
        self._sequence += 1
        name = "%s-%s-%d-%05d%s" % (os.path.basename(self.filename_prefix),
                                    time.strftime("%Y%m%dT%H%M%S", time.gmtime()),
                                    os.getpid(), self._sequence, SUFFIX)
        directory = os.path.dirname(self.filename_prefix)
        self._final_path = os.path.join(directory, name)
        self._temp_path = os.path.join(directory, "." + name + ".tmp")
        self._writer = tf.io.TFRecordWriter(self._temp_path)
        self._opened_at = time.monotonic()
        self._bytes = 0

    def _close_file(self):
        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        tf.io.gfile.rename(self._temp_path, self._final_path, overwrite=False)
        self.files.append(self._final_path)

    def _run(self):
        while True:
            wait = None
            if self._writer is not None:
                wait = max(0.0, self._opened_at + self.max_file_seconds - time.monotonic())
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:  # the open file reached its age
                self._close_file()
                continue
            if item is _STOP:
                self._close_file()
                return
            try:
                record = self._record(*item)
                if self._writer is None:
                    self._open()
                self._writer.write(record)
                self._bytes += len(record)
                self.written += 1
                if self._bytes >= self.max_file_bytes:
                    self._close_file()
            except Exception:  # pylint: disable=broad-except
                # A full disk or a bad record loses records, never the server.
                self.dropped += 1
                logging.exception("request log %s: record not written", self.filename_prefix)

    def close(self, timeout=10.0):
        """Writes what is queued, closes (renames) the current file, stops the thread."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._queue.put(_STOP, timeout=timeout)  # behind every queued record
        except queue.Full:
            logging.warning("request log %s: queue still full after %.0f s; closing anyway",
                            self.filename_prefix, timeout)
        self._thread.join(timeout)


def iter_logs(pattern):
    """PredictionLog records from the files matching a glob (published files only), one
    at a time: days of logs never have to fit in memory."""
    files = sorted(f for f in tf.io.gfile.glob(pattern) if not os.path.basename(f).startswith("."))
    if not files:
        raise ValueError("no request log files match %s" % pattern)
    for path in files:
        try:
            for record in tf.compat.v1.io.tf_record_iterator(path):
                yield prediction_log_pb2.PredictionLog.FromString(record)
        except (tf.errors.DataLossError, ValueError) as error:
            raise ValueError("%s is not a complete TFRecord file of PredictionLog: %s"
                             % (path, error)) from None


def read_logs(pattern, limit=None):
    """The first `limit` (all when None) records of `iter_logs`, as a list."""
    return list(itertools.islice(iter_logs(pattern), limit))
