"""The Batcher: one set of batch threads shared by every queue (queue.py), taking
schedulable batches round-robin, running each once (padded, concatenated) and handing each
request its rows; the server's one scheduler (TFLite pools submit to it too).

No batch thread dies silently: an exception in one (outside the model run, whose errors
answer its requests) is logged naming the thread and the model, the requests of its batch
are answered INTERNAL, and the thread carries on; a thread that fails
MAX_THREAD_FAILURES times in a row stops, and once none is left the batcher reports the
failure (`problem()`: the health service and the status page show it) and answers every
request INTERNAL instead of letting it wait."""
import collections
import logging
import threading
import time

import grpc
import numpy as np

from slimserve.serving.config import files
from slimserve.serving.core import adaptive
from slimserve.serving.core import deadlines
from slimserve.serving.core import errors
from slimserve.serving.core.batching import queue as queue_lib
from slimserve.serving.core.batching import parameters as parameters_lib

# A batch thread that fails this often in a row (outside model runs) stops.
MAX_THREAD_FAILURES = 8
# Kinds of request whose learning is kept (least recently used dropped first).
MAX_LEARNERS = 256


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

    def __init__(self, params: parameters_lib.BatchingParameters, on_batch=None,
                 on_queue_wait=None, name="batch", on_failure=None):
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
        self._queues = {}  # key -> queue_lib.Queue
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
        if params is parameters_lib.UNBATCHED:
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
        request = queue_lib.Request(feeds, rows, deadline)
        with self._cond:
            if self._stopped:
                raise errors.unavailable("server is shutting down")
            if self.failure is not None:
                raise errors.ServingError(grpc.StatusCode.INTERNAL, self.failure)
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = queue_lib.Queue(params, run, self._learner(
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
                queue.batches = collections.deque([queue_lib.Batch()])
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

