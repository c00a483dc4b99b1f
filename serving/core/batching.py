"""Server-side request batching like TF Serving's --enable_batching (its BatchingSession
over a SharedBatchScheduler, batching_session.cc and shared_batch_scheduler.h), plus an
adaptive mode that needs no parameters (core/adaptive.py).

Every (servable, signature, outputs, input dtypes and shapes past the batch dimension)
has its own queue of batches; the last batch of a queue is open and takes new requests
until it holds max_batch_size rows (max_execution_batch_size with
enable_large_batch_splitting). num_batch_threads threads, shared by every queue, take
schedulable batches round-robin, concatenate the requests along dimension 0 (padded up to
the next allowed_batch_sizes entry with copies of a real row, and, with
pad_variable_length_inputs, every dimension past the first padded to the batch's largest),
run them once and hand each request its rows. When a batch is schedulable:

- TF Serving's rule (a parameters file): when it is full, closed, or its oldest request
  has waited batch_timeout_micros (0: at once, when a thread is free);
- adaptive (--enable_batching without a file, or thread_pool_name "slimserve_adaptive"
  in a file): when the policy of core/adaptive.py says so, from the cost of each batch size
  and the load it has measured; batch_timeout_micros is then the longest a free thread
  ever holds rows back (the bound), and a batch may take part of the queued rows.

A queue holds at most max_enqueued_batches batches: past that a request is answered
UNAVAILABLE instead of growing memory. A request's deadline (core/deadlines.py) bounds its
wait: past it the request is answered DEADLINE_EXCEEDED and dropped from its batch, and a
batch runs with the latest deadline of its requests as RunOptions.timeout_in_ms.

It is the server's one scheduler: a TFLite model's interpreter pool batches through it too
(Batcher.submit with core/tflite_servable.py's scheduling_parameters), as TF Serving's
TfLiteSession reuses its BasicBatchScheduler.

No batch thread dies silently: an exception in one (outside the model run, whose errors
answer its requests) is logged naming the thread and the model, the requests of its batch
are answered INTERNAL, and the thread carries on; a thread that fails
MAX_THREAD_FAILURES times in a row stops, and once none is left the batcher reports the
failure (`problem()`: the health service and the status page show it) and answers every
request INTERNAL instead of letting it wait.

Differences from TF Serving, on purpose: requests of different shapes never share a batch
without padding (TF Serving fails such a batch as a whole); when a batch fails with an
error that is not a deadline, its requests are re-run one by one, so one bad request does
not fail its batch-mates; every field has an upper bound (BatchingParameters.check).
"""
import bisect
import collections
import dataclasses
import logging
import threading
import time

import grpc
import numpy as np

from slimserve import errors as user_errors
from slimserve import fields
from slimserve.serving import limits
from slimserve.serving.config import files
from slimserve.serving.core import adaptive
from slimserve.serving.core import deadlines
from slimserve.serving.core import errors

# A version's own parameters, read with --enable_per_model_batching_parameters (TF
# Serving's kBatchingParamsFilename, under the version's assets.extra).
PER_MODEL_FILE = "assets.extra/batching_params.pbtxt"
# servable.batching_parameters for a version that is not batched (per-model parameters
# are on and the version has no file, as TF Serving then serves it unbatched).
UNBATCHED = "unbatched"
# The thread_pool_name that asks for the adaptive scheduler in a parameters file (a
# slimserve extension TF Serving's parser accepts: to it, it only names the pool).
ADAPTIVE_POOL = "slimserve_adaptive"
# The adaptive mode's bound on holding rows back (its batch_timeout_micros when a file
# does not set one), as long as the timeouts slimserve-tune picks for image models: one
# run at a time is only planned for batches that take less than it.
ADAPTIVE_BOUND_MICROS = 500 * 1000
# The largest batch (and allowed size, and queue length in batches): far above what one
# host batches, low enough that padding to it or counting it cannot run away.
MAX_BATCH_SIZE = 2 ** 20
MAX_ENQUEUED_BATCHES = 2 ** 20
# A batch thread that fails this often in a row (outside model runs) stops.
MAX_THREAD_FAILURES = 8
# Kinds of request whose learning is kept (least recently used dropped first).
MAX_LEARNERS = 256


def _field(default, help_text, bound=None):
    return fields.option(default, help_text, bound)


@dataclasses.dataclass
class BatchingParameters:
    """TF Serving's BatchingParameters (session_bundle_config.proto), field for field,
    each with a bound (`check`).

    The defaults are TF Serving's scheduler with the values docs/serving.md gives; a
    file's fields replace them one by one. `adaptive_defaults()` is what --enable_batching
    uses without --batching_parameters_file (core/adaptive.py). `source` names the flag
    and file the parameters came from, for errors."""
    max_batch_size: int = _field(32, "Largest batch, in rows; a larger request is "
                                 "INVALID_ARGUMENT.", fields.Bound(1, MAX_BATCH_SIZE))
    batch_timeout_micros: int = _field(
        0, "Longest wait of a batch's first request for the batch to fill (adaptive: the "
        "longest hold).", fields.Bound(0, limits.DAY_MICROS))
    max_enqueued_batches: int = _field(100, "Batches one queue holds; past it UNAVAILABLE.",
                                       fields.Bound(1, MAX_ENQUEUED_BATCHES))
    num_batch_threads: int = _field(1, "Threads running batches, shared by every model.",
                                    limits.THREADS)
    thread_pool_name: str = _field("model_server_batch_threads", "The pool's name; "
                                   "%s asks for the adaptive scheduler." % ADAPTIVE_POOL)
    allowed_batch_sizes: tuple = _field((), "Sizes a batch is padded up to.",
                                        fields.Bound(1, MAX_BATCH_SIZE))
    pad_variable_length_inputs: bool = _field(False, "Pad dimensions past the first.")
    enable_large_batch_splitting: bool = _field(False, "Split a request across batches.")
    max_execution_batch_size: int = _field(
        0, "Largest batch run with splitting (0: max_batch_size).",
        fields.Bound(0, MAX_BATCH_SIZE))
    source: str = dataclasses.field(default="batching parameters", compare=False)

    @classmethod
    def adaptive_defaults(cls, **changes):
        """The adaptive scheduler's parameters: batches of up to 32 rows, rows held at
        most ADAPTIVE_BOUND_MICROS, two batch threads (one batch fills while another
        runs), 100 batches per queue."""
        return cls(**dict(dict(batch_timeout_micros=ADAPTIVE_BOUND_MICROS,
                               num_batch_threads=2, thread_pool_name=ADAPTIVE_POOL),
                          **changes))

    @property
    def adaptive(self):
        return self.thread_pool_name == ADAPTIVE_POOL

    @classmethod
    def from_file(cls, path, flag="batching_parameters_file"):
        """TF Serving's text-format BatchingParameters file (read by config/files.py)."""
        return cls.from_proto(files.read_batching_parameters(path, flag),
                              "--%s %s" % (flag, path))

    @classmethod
    def from_proto(cls, proto, where="--batching_parameters_file"):
        """From TF Serving's BatchingParameters message: the fields it sets replace our
        defaults (the adaptive ones when it names the adaptive pool); `where` names the
        flag and file in errors."""
        asks_adaptive = proto.HasField("thread_pool_name") and \
            proto.thread_pool_name.value == ADAPTIVE_POOL
        params = cls.adaptive_defaults() if asks_adaptive else cls()
        params.source = where
        for field in dataclasses.fields(cls):
            if field.name == "source":
                continue
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

    def check(self, where=None):
        """Refuses what TF Serving refuses when it builds the batching session, with its
        wording, then any field outside its bound (the table in docs/reliability.md),
        behind `where` (the flag and file at fault; default: `source`), as a
        files.ConfigError (a UserError); returns self."""
        where = where or self.source

        def fail(message):
            raise files.ConfigError("%s: %s" % (where, message))
        if self.max_batch_size < 1:
            fail("max_batch_size must be positive; was %d" % self.max_batch_size)
        if self.num_batch_threads < 1:
            fail("num_batch_threads must be positive; was %d" % self.num_batch_threads)
        if self.batch_timeout_micros < 0:
            fail("batch_timeout_micros must be non-negative; was %d"
                 % self.batch_timeout_micros)
        if self.max_enqueued_batches < 1:
            fail("max_enqueued_batches must be positive; was %d" % self.max_enqueued_batches)
        if self.max_execution_batch_size < 0:
            fail("max_execution_batch_size must be positive; was %d"
                 % self.max_execution_batch_size)
        try:
            fields.check(self, where)
        except user_errors.UserError as error:
            raise files.ConfigError(str(error)) from None
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
                     "increasing; got %s" % _shorten(sizes))
            if sizes[-1] != self.max_batch_size:
                fail("Last entry in allowed_batch_sizes must match max_batch_size; last "
                     "entry was %d; expected %d" % (sizes[-1], self.max_batch_size))
        return self

    def padded_size(self, rows):
        """The lowest allowed batch size >= rows (rows when none is, or none are given),
        as batching_util.cc's RoundToLowestAllowedBatchSize."""
        index = bisect.bisect_left(self.allowed_batch_sizes, rows)
        return self.allowed_batch_sizes[index] if index < len(self.allowed_batch_sizes) \
            else rows


def _shorten(values, most=8):
    values = list(values)
    return str(values) if len(values) <= most else "[%s, ... (%d entries)]" % (
        ", ".join(str(v) for v in values[:most]), len(values))


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
    """Rows [start, start + rows) of a request, as one entry of one batch of `queue`;
    `running` once its batch is taken, `answered` once its rows (or error) are in."""
    __slots__ = ("request", "index", "feeds", "rows", "queue", "running", "answered")

    def __init__(self, request, index, feeds, rows, queue):
        self.request, self.index, self.feeds, self.rows = request, index, feeds, rows
        self.queue = queue
        self.running = self.answered = False


class _Batch:
    __slots__ = ("pieces", "rows", "started")

    def __init__(self):
        self.pieces, self.rows, self.started = [], 0, None


class _Queue:
    """One kind of request (see the module docstring): a deque of batches, the last one
    open, run through `run(feeds, deadline) -> {output key: ndarray}`, and the Learner of
    its kind (core/adaptive.py). All methods are called with the Batcher's lock held."""

    def __init__(self, params, run, learner):
        self.params = params
        self.run = run
        self.learner = learner
        learner.adaptive = params.adaptive
        self.batches = collections.deque([_Batch()])
        self.running = 0  # batches of this queue being run
        self.queued_rows = 0
        self.running_rows = 0
        self.hold_start = None  # when a free run first held the queued rows for more
        self.hold_planned = 0.0  # the latest start allowed them, after the oldest's arrival
        self.wake = None  # the pending hold's (queued rows, rows in system) to wake at

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
            pieces = [_Piece(request, 0, request.feeds, request.rows, self)]
        else:
            request.parts, request.pending = [None] * len(sizes), len(sizes)
            pieces, start = [], 0
            for index, rows in enumerate(sizes):
                pieces.append(_Piece(request, index, {k: v[start:start + rows] for k, v in
                                                      request.feeds.items()}, rows, self))
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
        self.queued_rows += request.rows

    def decide(self, now, closing, threads):
        """What a free batch thread does with this queue now -> adaptive.Decision (reason
        "hold" with `wait` seconds, or why to run `rows` rows now; rows None: the first
        batch), or None when nothing is queued."""
        first = self.batches[0]
        if not first.pieces:
            return None
        if closing:
            return adaptive.Decision("closing")
        if self.params.adaptive:
            decision = adaptive.decide(
                self.learner, self.queued_rows, self.running_rows, self.running,
                self.params.execution_batch_size, threads,
                self.params.batch_timeout_micros / 1e6, first.started, self.hold_start, now)
        elif len(self.batches) > 1 or first.rows >= self.params.execution_batch_size:
            decision = adaptive.Decision("full")
        else:
            timeout = self.params.batch_timeout_micros / 1e6
            if now < first.started + timeout:
                decision = adaptive.Decision("hold", wait=first.started + timeout - now,
                                             planned=timeout)
            else:
                decision = adaptive.Decision("timeout", planned=timeout)
        if decision.for_rows and self.hold_start is None:
            self.hold_start = now
        self.wake = decision.wake
        self.hold_planned = max(self.hold_planned, decision.planned)
        return decision

    def take(self, decision, now):
        """The batch `decision` runs: the first batch, or its first `decision.rows` rows
        (whole pieces, at least one); fills in the decision's record."""
        first = self.batches[0]
        count, rows = 0, 0  # the first pieces that fit in decision.rows (at least one)
        if decision.rows is not None:
            for piece in first.pieces:
                if count and rows + piece.rows > decision.rows:
                    break
                count, rows = count + 1, rows + piece.rows
        if decision.rows is None or count == len(first.pieces):
            batch = self.batches.popleft()
            if not self.batches:
                self.batches.append(_Batch())
        else:
            batch = _Batch()
            batch.pieces, first.pieces = first.pieces[:count], first.pieces[count:]
            batch.rows, first.rows = rows, first.rows - rows
            batch.started, first.started = first.started, first.pieces[0].request.enqueued
        self.queued_rows -= batch.rows
        self.running += 1
        self.running_rows += batch.rows
        for piece in batch.pieces:
            piece.running = True
        decision.held = now - batch.started
        decision.planned = max(self.hold_planned, decision.planned)
        decision.bound = self.params.batch_timeout_micros / 1e6
        decision.queued, decision.running = self.queued_rows + batch.rows, self.running - 1
        self.hold_planned = 0.0
        self.wake = None
        if not self.queued_rows:  # rows left keep the hold for more rows they are under
            self.hold_start = None
        return batch

    def wakes(self):
        """Whether the latest arrival can change what a waiting batch thread decided for
        this queue: not while it holds these rows (adaptive.Decision.wake) and neither
        threshold is reached; the thread then wakes at its deadline or when a run ends."""
        if self.wake is None:
            return True
        rows, in_system = self.wake
        return self.queued_rows >= rows or self.queued_rows + self.running_rows >= in_system

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


class _Run:
    """A batch being run, for the overlap flag of its cost (another run in progress at
    any time during it: the two shared the cores)."""
    __slots__ = ("overlapped",)

    def __init__(self, overlapped):
        self.overlapped = overlapped


class Batcher:
    """Shared by all models; `run` blocks until the request's rows are computed.

    `run(servable, ...)` batches a servable's requests (--enable_batching); `submit(kind,
    run, feeds)` batches requests of any kind through the callable `run(feeds, deadline)`
    (a TFLite model's interpreter pool, core/tflite_servable.py, as TF Serving's
    TfLiteSession reuses its BasicBatchScheduler)."""

    def __init__(self, params: BatchingParameters, on_batch=None, on_queue_wait=None,
                 name="batch", on_failure=None):
        """params: the server's parameters (a servable's own `batching_parameters`, when
        set, replace them for its requests; num_batch_threads is always these). on_batch
        (rows after padding, label) is called for every batch run, on_queue_wait(seconds,
        label) for every request as its batch starts (metrics; label: (model, version,
        signature) or None). on_failure(message): once no batch thread is left. name: the
        batch threads' names are `<name>-<i>`. A thread count the process cannot start
        is a ConfigError naming the parameters' source and num_batch_threads."""
        self.params = params
        self._on_batch = on_batch
        self._on_queue_wait = on_queue_wait
        self._on_failure = on_failure
        self._cond = threading.Condition()
        self._queues = {}  # key -> _Queue
        self._learners = collections.OrderedDict()  # kind -> adaptive.Learner (LRU)
        self._turn = 0  # round-robin position over the queues
        self._stopped = False
        self._idle = 0  # batch threads waiting for work
        self._runs = []  # _Run in progress
        self.batches_run = 0  # for tests and metrics: how much batching happened
        self.rows_run = 0
        self.batch_rows = collections.deque(maxlen=64)  # rows of the latest batches run
        self.thread_failures = []  # messages of the threads that stopped, newest last
        self.failure = None  # set once no batch thread is left
        self._threads = []
        self._alive = 0  # batch threads started and not stopped
        for index in range(params.num_batch_threads):
            thread = threading.Thread(target=self._work, name="%s-%d" % (name, index),
                                      daemon=True)
            try:
                thread.start()
            except RuntimeError as error:  # can't start new thread: memory, ulimit -u
                self.stop()
                raise files.ConfigError(
                    "%s: num_batch_threads: cannot start %d batch threads (%s after %d); "
                    "give fewer" % (params.source, params.num_batch_threads, error,
                                    index)) from None
            self._threads.append(thread)
            with self._cond:
                self._alive += 1

    def run(self, servable, signature_name, signature_def, feeds, output_keys, deadline=None):
        """A servable's request, batched with others of the same signature, outputs and
        input shapes (unless the servable's own parameters say UNBATCHED)."""
        params = getattr(servable, "batching_parameters", None) or self.params
        if params is UNBATCHED:
            return servable.run(signature_def, feeds, output_keys, deadline)

        def run(batch_feeds, batch_deadline):
            return servable.run(signature_def, batch_feeds, output_keys, batch_deadline)

        return self.submit((id(servable), signature_name, tuple(output_keys)), run, feeds,
                           deadline, params,
                           label=(servable.name, servable.version, signature_name),
                           learning=(servable.name, servable.version, signature_name,
                                     tuple(output_keys)))

    def submit(self, kind, run, feeds, deadline=None, params=None, label=None,
               learning=None):
        """Schedules `feeds` ({key: ndarray}, batch-major) with the requests of the same
        `kind` (a hashable) and input dtypes and shapes past the batch dimension; blocks
        until its rows are computed -> {output key: ndarray}. run(feeds, deadline) ->
        {output key: ndarray} runs a batch; the queue of a kind keeps the `run` of its
        first request. params: this kind's BatchingParameters (default: the Batcher's).
        label: (model, version, signature) the status page and metrics show it under;
        learning: what identifies the kind across queues (default: `kind`), so what the
        scheduler learned outlives an idle queue."""
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
            if self.failure is not None:
                raise errors.ServingError(grpc.StatusCode.INTERNAL, self.failure)
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = _Queue(params, run, self._learner(
                    (learning if learning is not None else kind, shapes), label))
            queue.schedule(request)
            queue.learner.arrival(request.enqueued, queue.queued_rows + queue.running_rows)
            if self._idle and ((params.adaptive and queue.wakes()) or
                               queue.batches[0].pieces[0].request is
                               request or len(queue.batches) > 1 or
                               queue.batches[0].rows >= params.execution_batch_size):
                # a batch to take now, a new open batch whose timeout a sleeping thread
                # does not know about yet, or (adaptive) rows the policy weighs again
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

    def _learner(self, key, label):
        learner = self._learners.get(key)
        if learner is None:
            learner = self._learners[key] = adaptive.Learner(label)
            while len(self._learners) > MAX_LEARNERS:
                self._learners.popitem(last=False)
        else:
            self._learners.move_to_end(key)
        return learner

    def _next_batch(self):
        """Waits for a batch to run; returns (queue, batch, decision, run), or None once
        stopped with nothing left. Queues are served round-robin."""
        with self._cond:
            self._idle += 1
            try:
                while True:
                    now = time.monotonic()
                    keys = list(self._queues)
                    wait = None
                    for offset in range(len(keys)):
                        key = keys[(self._turn + offset) % len(keys)]
                        queue = self._queues[key]
                        decision = queue.decide(now, self._stopped, self._alive)
                        if decision is None:
                            if queue.idle():
                                del self._queues[key]  # recreated on its next request
                            continue
                        if decision.reason == "hold":
                            wait = decision.wait if wait is None else min(wait,
                                                                          decision.wait)
                            continue
                        self._turn = (self._turn + offset + 1) % max(1, len(keys))
                        try:
                            batch = queue.take(decision, now)
                        except Exception:
                            self._drop(key, queue)
                            raise
                        run = _Run(bool(self._runs))
                        for other in self._runs:
                            other.overlapped = True
                        self._runs.append(run)
                        if queue.queued_rows and self._idle > 1:
                            self._cond.notify()  # rows left: another thread weighs them
                        return queue, batch, decision, run
                    if self._stopped and wait is None:
                        return None  # nothing queued, and nothing can be queued any more
                    self._cond.wait(wait)
            finally:
                self._idle -= 1

    def _work(self):
        name = threading.current_thread().name
        failures = 0
        while True:
            work = None
            try:
                work = self._next_batch()
                if work is None:
                    return
                self._process(*work)
                failures = 0
            except Exception as error:  # pylint: disable=broad-except
                failures += 1
                where = _describe(work[0]) if work is not None else "scheduling"
                logging.exception("batching: batch thread %s failed (%s; failure %d in a "
                                  "row); its batch's requests are answered INTERNAL",
                                  name, where, failures)
                if work is not None:
                    self._fail(work[1], "batch thread %s failed: %s: %s"
                               % (name, type(error).__name__, error))
                if failures >= MAX_THREAD_FAILURES:
                    self._thread_stopped(name, where, error)
                    return
                time.sleep(min(1.0, 0.01 * 2 ** failures))  # a broken scheduler: not a spin
            finally:
                if work is not None:
                    self._ended(work[0], work[1], work[3])

    def _ended(self, queue, batch, run):
        """Accounting once a batch is over, however it ended (a piece still unanswered
        then is answered INTERNAL: no request waits for a batch that is gone)."""
        self._fail(batch, "batching: the batch ended without answering this request")
        with self._cond:
            queue.running -= 1
            if run in self._runs:
                self._runs.remove(run)
            if self._idle:
                self._cond.notify()  # a thread may hold rows until a run ends

    def _thread_stopped(self, name, where, error):
        message = "batch thread %s stopped after %d failures in a row (%s): %s: %s" % (
            name, MAX_THREAD_FAILURES, where, type(error).__name__, error)
        logging.error("batching: %s", message)
        with self._cond:
            self.thread_failures = (self.thread_failures + [message])[-16:]
            self._alive -= 1
            if self._alive > 0:
                self._cond.notify_all()  # the others take over its work (or fail too)
                return
            self.failure = "batching failed: every batch thread stopped; last: " + message
            queued = [p for q in self._queues.values() for b in q.batches for p in b.pieces]
            for queue in self._queues.values():
                queue.batches = collections.deque([_Batch()])
                queue.queued_rows = 0
        if self._on_failure is not None:  # health says so before any caller hears it
            self._on_failure(self.failure)
        for piece in queued:
            self._finish(piece, None, errors.ServingError(grpc.StatusCode.INTERNAL,
                                                          self.failure))

    def _drop(self, key, queue):
        """A queue whose state can no longer be trusted (taking a batch from it failed):
        every request in it is answered INTERNAL and the queue starts afresh. Called
        with the lock held."""
        del self._queues[key]
        message = "batching: the queue of %s failed; retry" % _describe(queue)
        for batch in queue.batches:
            for piece in batch.pieces:  # (the lock is re-entrant: _finish takes it too)
                self._finish(piece, None, errors.ServingError(grpc.StatusCode.INTERNAL,
                                                              message))

    def problem(self):
        """None while batches run; else why they cannot (every batch thread stopped)."""
        return self.failure

    def _fail(self, batch, message):
        for piece in batch.pieces:
            if not piece.answered:
                self._finish(piece, None, errors.ServingError(grpc.StatusCode.INTERNAL,
                                                              message))

    def _process(self, queue, batch, decision, run):
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
        learner = queue.learner
        decision.rows, decision.padded = rows, padded
        with self._cond:
            self.batches_run += 1
            self.rows_run += rows
            self.batch_rows.append(rows)
            learner.started(decision, now, alone=queue.running == 1)
            learner.delays.extend(now - p.request.enqueued for p in pieces)
        if self._on_batch is not None:
            self._on_batch(padded, learner.label)
        if self._on_queue_wait is not None:
            for piece in pieces:
                self._on_queue_wait(now - piece.request.enqueued, learner.label)
        started = time.perf_counter()
        try:
            merged = self._run_merged(queue, pieces, rows, padded)
        except errors.ServingError as error:
            if len(pieces) == 1 or error.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                for piece in pieces:
                    self._finish(piece, None, error)
                return
            merged = None  # one bad request must not fail its batch-mates: one by one
        except Exception as error:  # pylint: disable=broad-except
            logging.exception("batching: a batch of %d rows of %s failed", rows,
                              _describe(queue))
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
        seconds = time.perf_counter() - started
        with self._cond:
            learner.finished(padded, seconds, run.overlapped, time.monotonic())
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
        piece is. Its rows leave the queue's running count first, so a closed-loop
        client's next request never finds its previous one still counted."""
        request = piece.request
        with self._cond:
            if piece.answered:
                return
            piece.answered = True
            if piece.running:
                piece.queue.running_rows -= piece.rows
            if request.parts is None:
                request.result, request.error = outputs, error
                last = True
            else:
                if error is not None and request.error is None:
                    request.error = error
                request.parts[piece.index] = outputs
                request.pending -= 1
                last = request.pending == 0
        if last:
            if request.parts is not None:
                if request.error is None:
                    request.result = {k: np.concatenate([part[k] for part in request.parts])
                                      for k in request.parts[0]}
                request.parts = [None] * len(request.parts)
            request.done.set()

    def learners(self):
        """[Learner.state()] of every kind of request seen lately (status page, metrics)."""
        with self._cond:
            return [learner.state() for learner in self._learners.values()]

    def queued_rows(self):
        """Rows waiting in every queue (not yet in a batch that runs)."""
        with self._cond:
            return sum(queue.queued_rows for queue in self._queues.values())

    def decisions(self, label=None):
        """The recorded decisions (adaptive.Decision, oldest first) of the kinds under
        `label` (None: all), for tests and tools."""
        with self._cond:
            return [d for learner in self._learners.values()
                    if label is None or learner.label == label for d in learner.records]

    def stop(self):
        """Refuses new requests, runs every batch already queued, then stops the threads."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)


def _describe(queue):
    label = queue.learner.label
    if label is None:
        return "a %s queue" % queue.params.thread_pool_name
    return "model %s version %s signature %s" % label


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
