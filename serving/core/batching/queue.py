"""One queue of the batcher: the batches of one kind of request (servable, signature,
outputs, input dtypes and shapes past the batch dimension), how a request is cut into
pieces that fit them, and when a free batch thread runs the first one (TF Serving's rule
or the adaptive policy of core/adaptive.py). No thread of its own: batcher.py calls it
with its lock held."""
import collections
import threading
import time

from slimserve.serving.core import adaptive
from slimserve.serving.core import errors


class Request:
    """One caller's request; split into Pieces when it spans batches."""
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


class Piece:
    """Rows [start, start + rows) of a request, as one entry of one batch of `queue`;
    `running` once its batch is taken, `answered` once its rows (or error) are in."""
    __slots__ = ("request", "index", "feeds", "rows", "queue", "running", "answered")

    def __init__(self, request, index, feeds, rows, queue):
        self.request, self.index, self.feeds, self.rows = request, index, feeds, rows
        self.queue = queue
        self.running = self.answered = False


class Batch:
    __slots__ = ("pieces", "rows", "started")

    def __init__(self):
        self.pieces, self.rows, self.started = [], 0, None


class Queue:
    """One kind of request (see the module docstring): a deque of batches, the last one
    open, run through `run(feeds, deadline) -> {output key: ndarray}`, and the Learner of
    its kind (core/adaptive.py). All methods are called with the Batcher's lock held."""

    def __init__(self, params, run, learner):
        self.params = params
        self.run = run
        self.learner = learner
        learner.adaptive = params.adaptive
        self.batches = collections.deque([Batch()])
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
            sizes = split_sizes(request.rows, limit - tail, limit)
        else:
            if tail + request.rows > params.max_batch_size and \
                    len(self.batches) >= params.max_enqueued_batches:
                raise errors.unavailable(
                    "The batch scheduling queue to which this task was submitted is full; "
                    "currently %d batches enqueued and max_enqueued_batches is %d",
                    len(self.batches), params.max_enqueued_batches)
            sizes = [request.rows]
        if len(sizes) == 1:
            pieces = [Piece(request, 0, request.feeds, request.rows, self)]
        else:
            request.parts, request.pending = [None] * len(sizes), len(sizes)
            pieces, start = [], 0
            for index, rows in enumerate(sizes):
                pieces.append(Piece(request, index, {k: v[start:start + rows] for k, v in
                                                      request.feeds.items()}, rows, self))
                start += rows
        for piece in pieces:
            batch = self.batches[-1]
            if batch.rows + piece.rows > limit:
                batch = Batch()
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
                self.batches.append(Batch())
        else:
            batch = Batch()
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


def split_sizes(rows, first, limit):
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
