"""Server-side request batching like TF Serving's --enable_batching.

Requests for the same servable, signature, input shapes (past the batch
dimension) and outputs are concatenated along dimension 0, run once, and split
back. A batch runs when it reaches max_batch_size rows or its oldest request has
waited batch_timeout_micros. The queue is bounded: past max_enqueued_batches full
batches a request is answered UNAVAILABLE instead of growing memory.
"""
import collections
import dataclasses
import logging
import threading
import time

import grpc
import numpy as np

from slimserve.serving.config import files
from slimserve.serving.core import errors


@dataclasses.dataclass
class BatchingParameters:
    max_batch_size: int = 32
    batch_timeout_micros: int = 1000
    max_enqueued_batches: int = 100
    num_batch_threads: int = 2

    @classmethod
    def from_file(cls, path, flag="batching_parameters_file"):
        """TF Serving's text-format BatchingParameters file (read by config/files.py)."""
        return cls.from_proto(files.read_batching_parameters(path, flag),
                              "--%s %s" % (flag, path))

    @classmethod
    def from_proto(cls, proto, where="--batching_parameters_file"):
        """From TF Serving's BatchingParameters message (config/files.py reads the file).

        Fields the message leaves out keep our defaults; fields TF Serving has but this
        batcher does not implement are accepted and logged as having no effect."""
        params = cls()
        for field in dataclasses.fields(cls):
            if proto.HasField(field.name):
                setattr(params, field.name, getattr(proto, field.name).value)
        ignored = sorted(f.name for f, _ in proto.ListFields()
                         if f.name not in {d.name for d in dataclasses.fields(cls)})
        if ignored:
            logging.warning("%s: %s have no effect here", where, ", ".join(ignored))
        params.check(where)
        return params

    def check(self, where="batching parameters"):
        if self.max_batch_size < 1 or self.num_batch_threads < 1:
            raise ValueError("%s: max_batch_size and num_batch_threads must be >= 1" % where)
        if self.batch_timeout_micros < 0 or self.max_enqueued_batches < 1:
            raise ValueError("%s: batch_timeout_micros must be >= 0 and max_enqueued_batches "
                             ">= 1" % where)


class _Task:
    __slots__ = ("feeds", "rows", "enqueued", "done", "result", "error")

    def __init__(self, feeds, rows):
        self.feeds, self.rows = feeds, rows
        self.enqueued = time.monotonic()
        self.done = threading.Event()
        self.result = None
        self.error = None


class Batcher:
    """Shared by all models; `run` blocks until the request's rows are computed."""

    def __init__(self, params: BatchingParameters, on_batch=None, on_queue_wait=None):
        """on_batch(rows) is called for every batch run, on_queue_wait(seconds) for every
        request as its batch starts (metrics)."""
        self.params = params
        self._on_batch = on_batch
        self._on_queue_wait = on_queue_wait
        self._cond = threading.Condition()
        self._queues = collections.OrderedDict()  # key -> (servable, sig, outputs, [tasks])
        self._queued_rows = 0
        self._stopped = False
        self.batches_run = 0  # for tests and metrics: how much batching happened
        self.rows_run = 0
        self._threads = [threading.Thread(target=self._work, name="batch-%d" % i, daemon=True)
                         for i in range(params.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    def run(self, servable, signature_name, signature_def, feeds, output_keys):
        rows = next(iter(feeds.values())).shape[0]
        if any(v.shape[0] != rows for v in feeds.values()):
            raise errors.invalid("inputs have different batch sizes: %s",
                                 {k: v.shape[0] for k, v in feeds.items()})
        if rows > self.params.max_batch_size:
            return servable.run(signature_def, feeds, output_keys)
        key = (id(servable), signature_name, tuple(output_keys), tuple(sorted(
            (k, v.dtype.str, v.shape[1:]) for k, v in feeds.items())))
        task = _Task(feeds, rows)
        limit = self.params.max_enqueued_batches * self.params.max_batch_size
        with self._cond:
            if self._stopped:
                raise errors.unavailable("server is shutting down")
            if self._queued_rows + rows > limit:
                raise errors.unavailable("The batch scheduling queue to which this task was "
                                         "submitted is full (%d rows queued)", self._queued_rows)
            entry = self._queues.setdefault(key, (servable, signature_def, output_keys, []))
            entry[3].append(task)
            self._queued_rows += rows
            self._cond.notify()
        task.done.wait()
        if task.error is not None:
            raise task.error
        return task.result

    def _take_batch(self):
        """Waits for a full or timed-out batch; returns (servable, sig, outputs, tasks)."""
        timeout = self.params.batch_timeout_micros / 1e6
        with self._cond:
            while True:
                if self._stopped and not self._queues:
                    return None
                now = time.monotonic()
                ready, wait = None, None
                for key, (_, _, _, tasks) in self._queues.items():
                    rows = sum(t.rows for t in tasks)
                    due = tasks[0].enqueued + timeout
                    if rows >= self.params.max_batch_size or due <= now or self._stopped:
                        ready = key
                        break
                    wait = due - now if wait is None else min(wait, due - now)
                if ready is not None:
                    servable, sig, outputs, tasks = self._queues[ready]
                    taken, rows = [], 0
                    while tasks and rows + tasks[0].rows <= self.params.max_batch_size:
                        rows += tasks[0].rows
                        taken.append(tasks.pop(0))
                    if not tasks:
                        del self._queues[ready]
                    self._queued_rows -= rows
                    return servable, sig, outputs, taken
                self._cond.wait(wait)

    def _work(self):
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            servable, sig, outputs, tasks = batch
            rows = sum(t.rows for t in tasks)
            with self._cond:
                self.batches_run += 1
                self.rows_run += rows
            if self._on_batch is not None:
                self._on_batch(rows)
            if self._on_queue_wait is not None:
                now = time.monotonic()
                for task in tasks:
                    self._on_queue_wait(now - task.enqueued)
            self._execute(servable, sig, outputs, tasks)

    @staticmethod
    def _execute(servable, sig, outputs, tasks):
        try:
            if len(tasks) == 1:
                tasks[0].result = servable.run(sig, tasks[0].feeds, outputs)
            else:
                feeds = {k: np.concatenate([t.feeds[k] for t in tasks])
                         for k in tasks[0].feeds}
                merged = servable.run(sig, feeds, outputs)
                start = 0
                for task in tasks:
                    task.result = {k: v[start:start + task.rows] for k, v in merged.items()}
                    start += task.rows
        except errors.ServingError as error:
            if len(tasks) == 1:
                tasks[0].error = error
            else:  # one bad request must not fail its batch-mates: rerun one by one
                for task in tasks:
                    try:
                        task.result = servable.run(sig, task.feeds, outputs)
                    except errors.ServingError as single:
                        task.error = single
        except Exception as error:  # pylint: disable=broad-except
            for task in tasks:
                task.error = errors.ServingError(grpc.StatusCode.INTERNAL, str(error))
        for task in tasks:
            task.done.set()

    def stop(self):
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)
