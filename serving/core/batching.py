"""Server-side request batching like TF Serving's --enable_batching (its BatchingSession
over a SharedBatchScheduler, batching_session.cc and shared_batch_scheduler.h).

Every (servable, signature, outputs, input dtypes and shapes past the batch dimension)
has its own queue of batches; the last batch of a queue is open and takes new requests
until it holds max_batch_size rows (max_execution_batch_size with
enable_large_batch_splitting). A batch becomes schedulable when it is full, closed, or its
oldest request has waited batch_timeout_micros (0: at once, when a thread is free).
num_batch_threads threads, shared by every queue, take schedulable batches round-robin,
concatenate the requests along dimension 0 (padded up to the next allowed_batch_sizes
entry with copies of a real row, and, with pad_variable_length_inputs, every dimension past
the first padded to the batch's largest), run them once and hand each request its rows.
A queue holds at most max_enqueued_batches batches: past that a request is answered
UNAVAILABLE instead of growing memory. A request's deadline (core/deadlines.py) bounds its
wait: past it the request is answered DEADLINE_EXCEEDED and dropped from its batch, and a
batch runs with the latest deadline of its requests as RunOptions.timeout_in_ms.

It is the server's one scheduler: a TFLite model's interpreter pool batches through it too
(Batcher.submit with core/tflite_servable.py's scheduling_parameters), as TF Serving's
TfLiteSession reuses its BasicBatchScheduler.

Differences from TF Serving, on purpose: requests of different shapes never share a batch
without padding (TF Serving fails such a batch as a whole); when a batch fails with an
error that is not a deadline, its requests are re-run one by one, so one bad request does
not fail its batch-mates.
"""
import collections
import dataclasses
import logging
import threading
import time

import grpc
import numpy as np

from slimserve.serving import limits
from slimserve.serving.config import files
from slimserve.serving.core import deadlines
from slimserve.serving.core import errors

# A version's own parameters, read with --enable_per_model_batching_parameters (TF
# Serving's kBatchingParamsFilename, under the version's assets.extra).
PER_MODEL_FILE = "assets.extra/batching_params.pbtxt"
# servable.batching_parameters for a version that is not batched (per-model parameters
# are on and the version has no file, as TF Serving then serves it unbatched).
UNBATCHED = "unbatched"


@dataclasses.dataclass
class BatchingParameters:
    """TF Serving's BatchingParameters (session_bundle_config.proto), field for field.

    The defaults are what --enable_batching uses without --batching_parameters_file;
    a file's fields replace them one by one (docs/serving.md says how they were chosen
    and where they differ from TF Serving's)."""
    max_batch_size: int = 32
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 100
    num_batch_threads: int = 1
    thread_pool_name: str = "model_server_batch_threads"
    allowed_batch_sizes: tuple = ()
    pad_variable_length_inputs: bool = False
    enable_large_batch_splitting: bool = False
    max_execution_batch_size: int = 0  # 0: max_batch_size (TF Serving's when unset)

    @classmethod
    def from_file(cls, path, flag="batching_parameters_file"):
        """TF Serving's text-format BatchingParameters file (read by config/files.py)."""
        return cls.from_proto(files.read_batching_parameters(path, flag),
                              "--%s %s" % (flag, path))

    @classmethod
    def from_proto(cls, proto, where="--batching_parameters_file"):
        """From TF Serving's BatchingParameters message: the fields it sets replace our
        defaults; `where` names the flag and file in errors."""
        params = cls()
        for field in dataclasses.fields(cls):
            if field.name == "allowed_batch_sizes":
                params.allowed_batch_sizes = tuple(int(s) for s in proto.allowed_batch_sizes)
            elif field.name == "pad_variable_length_inputs":
                params.pad_variable_length_inputs = proto.pad_variable_length_inputs
            elif proto.HasField(field.name):
                setattr(params, field.name, getattr(proto, field.name).value)
        if params.max_enqueued_batches == 0 and not params.enable_large_batch_splitting:
            params.max_enqueued_batches = 1  # as TF Serving rewrites it (AddQueue)
        params.check(where)
        return params

    @property
    def execution_batch_size(self):
        """The largest batch run: max_execution_batch_size with splitting, else
        max_batch_size (shared_batch_scheduler.h's GetMaxExecutionBatchSize)."""
        if self.enable_large_batch_splitting and self.max_execution_batch_size:
            return self.max_execution_batch_size
        return self.max_batch_size

    def check(self, where="batching parameters"):
        """Refuses what TF Serving refuses when it builds the batching session, with its
        wording, behind `where` (the flag and file at fault), as a files.ConfigError (a
        UserError), plus a thread count and a timeout beyond reason; returns self."""
        def fail(message):
            raise files.ConfigError("%s: %s" % (where, message))
        if self.max_batch_size < 1:
            fail("max_batch_size must be positive; was %d" % self.max_batch_size)
        if self.num_batch_threads < 1:
            fail("num_batch_threads must be positive; was %d" % self.num_batch_threads)
        if self.num_batch_threads > limits.MAX_THREADS:  # each one is a thread, started now
            fail("num_batch_threads must be at most %d; was %d"
                 % (limits.MAX_THREADS, self.num_batch_threads))
        if self.batch_timeout_micros < 0:
            fail("batch_timeout_micros must be non-negative; was %d"
                 % self.batch_timeout_micros)
        if self.batch_timeout_micros > limits.DAY_MICROS:
            fail("batch_timeout_micros must be at most a day (%d); was %d"
                 % (limits.DAY_MICROS, self.batch_timeout_micros))
        if self.max_enqueued_batches < 1:
            fail("max_enqueued_batches must be positive; was %d" % self.max_enqueued_batches)
        if self.max_execution_batch_size < 0:
            fail("max_execution_batch_size must be positive; was %d"
                 % self.max_execution_batch_size)
        if self.enable_large_batch_splitting and \
                self.execution_batch_size > self.max_batch_size:
            fail("When enable_large_batch_splitting is true, input_batch_size_limit must be "
                 "greater than or equal to max_execution_batch_size (max_batch_size %d, "
                 "max_execution_batch_size %d)" % (self.max_batch_size,
                                                   self.execution_batch_size))
        sizes = self.allowed_batch_sizes
        if sizes:
            if any(s < 1 for s in sizes) or any(b <= a for a, b in zip(sizes, sizes[1:])):
                fail("allowed_batch_sizes entries must be positive and monotonically "
                     "increasing; got %s" % list(sizes))
            if sizes[-1] != self.max_batch_size:
                fail("Last entry in allowed_batch_sizes must match max_batch_size; last "
                     "entry was %d; expected %d" % (sizes[-1], self.max_batch_size))
        return self

    def padded_size(self, rows):
        """The lowest allowed batch size >= rows (rows when none is, or none are given),
        as batching_util.cc's RoundToLowestAllowedBatchSize."""
        for size in self.allowed_batch_sizes:
            if size >= rows:
                return size
        return rows


def parameters_for_version(version_dir, common, per_model):
    """The BatchingParameters a version is batched with: `common` (the server's; None:
    batching off), or with --enable_per_model_batching_parameters the version's own
    assets.extra/batching_params.pbtxt, whose fields replace the defaults (only
    num_batch_threads stays the server's: the batch threads are shared); UNBATCHED when
    that file is missing, as TF Serving then does not batch the version."""
    if common is None:
        return None
    if not per_model:
        return common
    import os  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    path = os.path.join(version_dir, PER_MODEL_FILE)
    if not tf.io.gfile.exists(path):
        return UNBATCHED
    params = BatchingParameters.from_file(path, "enable_per_model_batching_parameters")
    params.num_batch_threads = common.num_batch_threads
    return params


class _Request:
    """One caller's request; split into _Pieces when it spans batches."""
    __slots__ = ("feeds", "rows", "deadline", "enqueued", "done", "result", "error",
                 "abandoned", "parts", "pending")

    def __init__(self, feeds, rows, deadline):
        self.feeds, self.rows, self.deadline = feeds, rows, deadline
        self.enqueued = time.monotonic()
        self.done = threading.Event()
        self.result = self.error = None
        self.abandoned = False  # its caller stopped waiting (deadline): do not run it
        self.parts = None  # outputs per piece, when split
        self.pending = 1


class _Piece:
    """Rows [start, start + rows) of a request, as one entry of one batch."""
    __slots__ = ("request", "index", "feeds", "rows")

    def __init__(self, request, index, feeds, rows):
        self.request, self.index, self.feeds, self.rows = request, index, feeds, rows


class _Batch:
    __slots__ = ("pieces", "rows", "started")

    def __init__(self):
        self.pieces, self.rows, self.started = [], 0, None


class _Queue:
    """One kind of request (see the module docstring): a deque of batches, the last one
    open, run through `run(feeds, deadline) -> {output key: ndarray}`. All methods are
    called with the Batcher's lock held."""

    def __init__(self, params, run):
        self.params = params
        self.run = run
        self.batches = collections.deque([_Batch()])
        self.running = 0

    def schedule(self, request):
        params, limit = self.params, self.params.execution_batch_size
        if request.rows > params.max_batch_size:
            raise errors.invalid("Task size %d is larger than maximum input batch size %d",
                                 request.rows, params.max_batch_size)
        tail = self.batches[-1].rows
        if params.enable_large_batch_splitting:
            capacity = (params.max_enqueued_batches - len(self.batches)) * limit + \
                limit - tail
            if request.rows > capacity:
                raise errors.unavailable(
                    "The batch scheduling queue to which this task was submitted is full; "
                    "task size is %d but scheduling capacity is only %d "
                    "(num_enqueued_batches=%d, max_enqueued_batches=%d, open_batch_size=%d, "
                    "max_execution_batch_size=%d)", request.rows, capacity, len(self.batches),
                    params.max_enqueued_batches, tail, limit)
            sizes = _split_sizes(request.rows, limit - tail, limit)
        else:
            if tail + request.rows > params.max_batch_size and \
                    len(self.batches) >= params.max_enqueued_batches:
                raise errors.unavailable(
                    "The batch scheduling queue to which this task was submitted is full; "
                    "currently %d batches enqueued and max_enqueued_batches is %d",
                    len(self.batches), params.max_enqueued_batches)
            sizes = [request.rows]
        if len(sizes) == 1:
            pieces = [_Piece(request, 0, request.feeds, request.rows)]
        else:
            request.parts, request.pending = [None] * len(sizes), len(sizes)
            pieces, start = [], 0
            for index, rows in enumerate(sizes):
                pieces.append(_Piece(request, index, {k: v[start:start + rows] for k, v in
                                                      request.feeds.items()}, rows))
                start += rows
        for piece in pieces:
            batch = self.batches[-1]
            if batch.rows + piece.rows > limit:
                batch = _Batch()
                self.batches.append(batch)
            if not batch.pieces:
                batch.started = request.enqueued
            batch.pieces.append(piece)
            batch.rows += piece.rows

    def due(self, now, closing):
        """0 when a batch can be taken now, else seconds until the open one times out
        (None: nothing to take)."""
        if len(self.batches) > 1:
            return 0.0
        batch = self.batches[0]
        if not batch.pieces:
            return None
        if closing or batch.rows >= self.params.execution_batch_size:
            return 0.0
        return max(0.0, batch.started + self.params.batch_timeout_micros / 1e6 - now)

    def take(self):
        batch = self.batches.popleft()
        if not self.batches:
            self.batches.append(_Batch())
        self.running += 1
        return batch

    def idle(self):
        return not self.running and len(self.batches) == 1 and not self.batches[0].pieces


def _split_sizes(rows, first, limit):
    """Piece sizes of a request of `rows` rows: the open batch's free `first` rows, then
    whole `limit`-row batches (batching_session.cc's SplitInputTask)."""
    if rows == 0:
        return [0]  # an empty request is one (empty) piece, wherever it lands
    sizes = []
    if first > 0:
        sizes.append(min(first, rows))
        rows -= sizes[0]
    while rows > 0:
        sizes.append(min(limit, rows))
        rows -= sizes[-1]
    return sizes


def _batch_rows(feeds):
    """The rows of a batched request; INVALID_ARGUMENT as ComputeTensorBatchSize."""
    if not feeds:
        raise errors.invalid("Batching Run() must have at least one input tensor")
    rows = None
    for value in feeds.values():
        if value.ndim == 0:
            raise errors.invalid("Batching Run() input tensors must have at least one "
                                 "dimension")
        if rows is None:
            rows = value.shape[0]
        elif value.shape[0] != rows:
            raise errors.invalid("Batching Run() input tensors must have equal "
                                 "0th-dimension size")
    return rows


class Batcher:
    """Shared by all models; `run` blocks until the request's rows are computed.

    `run(servable, ...)` batches a servable's requests (--enable_batching); `submit(kind,
    run, feeds)` batches requests of any kind through the callable `run(feeds, deadline)`
    (a TFLite model's interpreter pool, core/tflite_servable.py, as TF Serving's
    TfLiteSession reuses its BasicBatchScheduler)."""

    def __init__(self, params: BatchingParameters, on_batch=None, on_queue_wait=None,
                 name="batch"):
        """params: the server's parameters (a servable's own `batching_parameters`, when
        set, replace them for its requests; num_batch_threads is always these). on_batch
        (rows after padding) is called for every batch run, on_queue_wait(seconds) for
        every request as its batch starts (metrics). name: the batch threads' names are
        `<name>-<i>`."""
        self.params = params
        self._on_batch = on_batch
        self._on_queue_wait = on_queue_wait
        self._cond = threading.Condition()
        self._queues = {}  # key -> _Queue
        self._turn = 0  # round-robin position over the queues
        self._stopped = False
        self.batches_run = 0  # for tests and metrics: how much batching happened
        self.rows_run = 0
        self.batch_rows = collections.deque(maxlen=64)  # rows of the latest batches run
        self._threads = [threading.Thread(target=self._work, name="%s-%d" % (name, i),
                                          daemon=True)
                         for i in range(params.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    def run(self, servable, signature_name, signature_def, feeds, output_keys, deadline=None):
        """A servable's request, batched with others of the same signature, outputs and
        input shapes (unless the servable's own parameters say UNBATCHED)."""
        params = getattr(servable, "batching_parameters", None) or self.params
        if params is UNBATCHED:
            return servable.run(signature_def, feeds, output_keys, deadline)

        def run(batch_feeds, batch_deadline):
            return servable.run(signature_def, batch_feeds, output_keys, batch_deadline)

        return self.submit((id(servable), signature_name, tuple(output_keys)), run, feeds,
                           deadline, params)

    def submit(self, kind, run, feeds, deadline=None, params=None):
        """Schedules `feeds` ({key: ndarray}, batch-major) with the requests of the same
        `kind` (a hashable) and input dtypes and shapes past the batch dimension; blocks
        until its rows are computed -> {output key: ndarray}. run(feeds, deadline) ->
        {output key: ndarray} runs a batch; the queue of a kind keeps the `run` of its
        first request. params: this kind's BatchingParameters (default: the Batcher's)."""
        params = params or self.params
        rows = _batch_rows(feeds)
        if params.pad_variable_length_inputs:  # shapes differ: padded when batched
            shapes = tuple(sorted((k, v.dtype.str, v.ndim) for k, v in feeds.items()))
        else:
            shapes = tuple(sorted((k, v.dtype.str, v.shape[1:]) for k, v in feeds.items()))
        key = (kind, shapes)
        request = _Request(feeds, rows, deadline)
        with self._cond:
            if self._stopped:
                raise errors.unavailable("server is shutting down")
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = _Queue(params, run)
            queue.schedule(request)
            # a batch to take now, or a new open batch whose timeout a sleeping worker
            # does not know about yet
            if queue.due(request.enqueued, False) == 0.0 or \
                    queue.batches[0].pieces[0].request is request:
                self._cond.notify()
        if deadline is None:
            request.done.wait()
        elif not request.done.wait(max(0.0, deadline.remaining())):
            with self._cond:
                if not request.done.is_set():
                    request.abandoned = True
            if request.abandoned:
                raise deadline.exceeded()
        if request.error is not None:
            raise request.error
        return request.result

    def _next_batch(self):
        """Waits for a schedulable batch; returns (queue, batch), or None once stopped
        with nothing left. Queues are served round-robin."""
        with self._cond:
            while True:
                now = time.monotonic()
                keys = list(self._queues)
                wait = None
                for offset in range(len(keys)):
                    key = keys[(self._turn + offset) % len(keys)]
                    queue = self._queues[key]
                    due = queue.due(now, self._stopped)
                    if due == 0.0:
                        self._turn = (self._turn + offset + 1) % max(1, len(keys))
                        return queue, queue.take()
                    if due is not None:
                        wait = due if wait is None else min(wait, due)
                    elif queue.idle():
                        del self._queues[key]  # recreated on its next request
                if self._stopped and wait is None:
                    return None  # nothing queued, and nothing can be queued any more
                self._cond.wait(wait)

    def _work(self):
        while True:
            work = self._next_batch()
            if work is None:
                return
            queue, batch = work
            try:
                self._process(queue, batch)
            finally:
                with self._cond:
                    queue.running -= 1

    def _process(self, queue, batch):
        now = time.monotonic()
        pieces = []
        for piece in batch.pieces:
            request = piece.request
            if request.abandoned or request.error is not None:
                self._finish(piece, None, None)  # its caller has gone, or a part failed
            elif request.deadline is not None and request.deadline.remaining() <= 0:
                self._finish(piece, None, request.deadline.exceeded(deadlines.QUEUE_TIMEOUT))
            else:
                pieces.append(piece)
        if not pieces:
            return
        rows = sum(p.rows for p in pieces)
        padded = queue.params.padded_size(rows)
        with self._cond:
            self.batches_run += 1
            self.rows_run += rows
            self.batch_rows.append(rows)
        if self._on_batch is not None:
            self._on_batch(padded)
        if self._on_queue_wait is not None:
            for piece in pieces:
                self._on_queue_wait(now - piece.request.enqueued)
        try:
            merged = self._run_merged(queue, pieces, rows, padded)
        except errors.ServingError as error:
            if len(pieces) == 1 or error.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                for piece in pieces:
                    self._finish(piece, None, error)
                return
            merged = None  # one bad request must not fail its batch-mates: one by one
        except Exception as error:  # pylint: disable=broad-except
            logging.exception("batch of %d rows failed", rows)
            for piece in pieces:
                self._finish(piece, None, errors.ServingError(grpc.StatusCode.INTERNAL,
                                                              str(error)))
            return
        if merged is None:
            for piece in pieces:
                try:
                    self._finish(piece, queue.run(piece.feeds, piece.request.deadline),
                                 None)
                except errors.ServingError as single:
                    self._finish(piece, None, single)
            return
        start = 0
        for piece in pieces:
            self._finish(piece, {k: v[start:start + piece.rows] for k, v in merged.items()},
                         None)
            start += piece.rows

    @staticmethod
    def _run_merged(queue, pieces, rows, padded):
        """Concatenates the pieces' inputs (padded as the parameters say), runs them with
        the latest deadline of the batch, checks the outputs' batch dimension."""
        params = queue.params
        deadline = deadlines.latest(p.request.deadline for p in pieces)
        if len(pieces) == 1 and padded == rows:
            feeds = pieces[0].feeds
        else:
            feeds = {}
            for key in pieces[0].feeds:
                values = [p.feeds[key] for p in pieces]
                if params.pad_variable_length_inputs:
                    values = _pad_to_largest(key, values)
                if padded > rows:  # copies of the last request's first row
                    values.append(np.repeat(values[-1][:1], padded - rows, axis=0))
                feeds[key] = np.concatenate(values)
        outputs = queue.run(feeds, deadline)
        for value in outputs.values():
            if value.ndim == 0:
                raise errors.ServingError(grpc.StatusCode.FAILED_PRECONDITION,
                                          "Batched output tensor has 0 dimensions")
            if value.shape[0] != padded:
                raise errors.ServingError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "Batched output tensor's 0th dimension does not equal the sum of the "
                    "0th dimension sizes of the input tensors")
        return outputs

    def _finish(self, piece, outputs, error):
        """Records one piece's outputs (or error); the request is answered when its last
        piece is."""
        request = piece.request
        if request.parts is None:
            request.result, request.error = outputs, error
            request.done.set()
            return
        with self._cond:
            if error is not None and request.error is None:
                request.error = error
            request.parts[piece.index] = outputs
            request.pending -= 1
            last = request.pending == 0
        if last:
            if request.error is None:
                request.result = {k: np.concatenate([part[k] for part in request.parts])
                                  for k in request.parts[0]}
            request.parts = [None] * len(request.parts)
            request.done.set()

    def stop(self):
        """Refuses new requests, runs every batch already queued, then stops the threads."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)


def _pad_to_largest(key, values):
    """pad_variable_length_inputs: every dimension past the first padded at its end to
    the largest among `values`, with each value's own first element (batching_util.cc's
    AddPadding)."""
    ranks = {v.ndim for v in values}
    if len(ranks) != 1 or not 1 <= values[0].ndim <= 6:
        raise errors.invalid("input %s: only tensors with rank from 1 to 6 of equal rank "
                             "can be padded", key)
    largest = tuple(max(v.shape[d] for v in values) for d in range(1, values[0].ndim))
    padded = []
    for value in values:
        shape = (value.shape[0],) + largest
        if value.shape == shape:
            padded.append(value)
            continue
        if value.size == 0:
            raise errors.invalid("Got empty tensor in batch of non-empty tensors.")
        out = np.full(shape, value.flat[0], dtype=value.dtype)
        out[tuple(slice(0, n) for n in value.shape)] = value
        padded.append(out)
    return padded
