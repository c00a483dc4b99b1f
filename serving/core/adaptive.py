"""What the batch scheduler learns about each kind of request, and the adaptive policy that
uses it (core/batching/; --enable_batching without a parameters file).

TF Serving's batching runs a batch when it is full or its oldest request has waited
batch_timeout_micros, so the right settings depend on the model and on the load: with a
timeout of 0 and one batch thread, 8 closed-loop clients split into small alternating
batches; with a long timeout, fewer clients than the batch size wait it out every time.
The adaptive policy needs no such settings. It learns, from the runs it makes:

- the cost T(b) of a run of b rows (`CostModel`): the median of its recent runs per batch
  size (one run slowed by a stall does not move it), kept
  apart for runs made alone and runs made while another run was in progress (two runs
  share the cores), with a least-squares line a + s*b over the measured sizes for sizes
  not run yet. Decisions use the measured points, so a cost that is not monotonic in b
  is taken as it is;
- the load (`LoadEstimate`): how many requests are in the system (queued + running; in a
  closed loop, the number of clients) as the peak seen over the last few batches, and the
  arrival rate.

When a batch thread is free and n rows are queued it runs them at once or holds them for
more, choosing by the cost model (`AdaptivePolicy.decide`):

- with c requests in the system it plans batches near c: one run of c rows at a time
  (p=1), or two runs of c/2 taking turns (p=2: one fills while the other runs) when the
  cost model says they serve SWITCH_MARGIN more rows per second (c/(T1(c)+gap) against
  c/(T2(c/2)+gap2), where gap is the clients' turnaround between runs made one at a time
  and gap2 the time a run's slot stands idle while the other runs: its own half of the
  clients turning around; two runs split the clients into two cohorts, which costs more
  than the model sees, so within the margin one run is kept); the plan it does not use
  is measured again after
  EXPLORE_EVERY batches run at that concurrency, then after twice as many each time the
  plan in use stays the better one (up to EXPLORE_MAX; back to EXPLORE_EVERY when the
  plan changes): each
  re-measurement costs a few slower batches and the batches that merge the clients into
  one cohort again. The plan changes only on such a re-measurement, whose runs restart
  their size's median: the plan in use's costs are always fresh, the other's as old as
  its last re-measurement, so when the machine slows the plan in use looks slower than
  a plan measured on a faster machine. When the model prefers the plan not in use, that
  plan is measured again first (after CONFIRM_EVERY batches at that concurrency, then
  twice as many each time a re-measurement kept the plan in use, up to CONFIRM_MAX: at
  32x32 a run of 32 moves 45-67 ms with the machine, and such requests came every ~170
  batches) and the plan changes if the fresh costs still prefer it;
- it runs at once when the queue holds the planned batch, or when every request in the
  system is already queued or running (nothing more can come: a lone request never
  waits);
- else it holds the rows at most as long as merging them with the missing rows saves:
  T(n) + T(target - n) - T(target), and at least FILL_MARGIN times the FILL_QUANTILE of
  how long the missing requests of recent holds took to come (a cost that grows with the
  rows makes the saving a run's fixed cost, shorter than the clients' turnaround: a hold
  that runs out before they come splits them into cohorts), never longer than the
  configured bound (the parameters' batch_timeout_micros in this mode). A hold that
  runs out lowers the estimate of the requests in the system, so a client that left
  costs one hold.
  Arrivals into a hold wake no batch thread until one can end it (`Decision.wake`: the
  queue reaching the target, or the system the concurrency); a run's end and the hold's
  deadline still do. Waking one per arrival made 23 decisions per batch at 32x32 with 32
  clients over gRPC, each on the lock and the GIL the request handlers need.

Every batch's decision is recorded (`Decision`: rows, why it ran, how long it was held and
for how long it could have been), so tests read what the scheduler did from its own
records and the status page and metrics show it.
"""
import collections
import math

# Sizes up to this are learned one by one; above it by powers of two (the line covers
# the sizes in between).
EXACT_SIZES = 64
ALPHA = 0.25  # weight of a new run in a size's moving average of rows (sizes > EXACT_SIZES)
COST_SAMPLES = 9  # recent runs per size whose median is its cost
PEAK_EPOCHS = 4  # batches over which the peak number of requests in the system is kept
RECORDS = 256  # decisions kept per kind of request
DELAYS = 1024  # request queue delays kept per kind, for the status page's percentiles
EXPLORE_EVERY = 128  # batches before the first re-measurement of the plan not in use
EXPLORE_MAX = 2048  # ... and at most between two, once each has confirmed the plan in use
EXPLORE_BATCHES = 4  # batches each re-measurement runs
# Batches at a concurrency between two re-measurements asked for by the cost model
# preferring the plan not in use on costs older than the plan in use's; twice as many
# each time a re-measurement kept the plan in use, up to CONFIRM_MAX (back to
# CONFIRM_EVERY when the plan changes).
CONFIRM_EVERY = 32
CONFIRM_MAX = 256
SWITCH_MARGIN = 1.10  # two runs at a time must look this much faster than one
GAP_SAMPLES = 31  # idle times between runs whose median is the turnaround estimate
MAX_PARALLEL = 2  # runs of one kind at a time a plan may use
RATE_WINDOW = 1.0  # seconds over which arrivals are counted for the arrival rate
HOLD_FLOOR = 0.05  # a hold for missing rows may last this share of the target's run
# A hold for missing rows may last FILL_MARGIN times the FILL_QUANTILE of how long the
# last FILL_SAMPLES holds took to see them come (once FILL_MIN_SAMPLES were seen).
FILL_SAMPLES = 31
FILL_QUANTILE = 90
FILL_MARGIN = 2.0
FILL_MIN_SAMPLES = 8
UNKNOWN_HOLD = 0.01  # seconds a hold may last while the cost model knows nothing


class CostModel:
    """T(b) in seconds: the median of the last COST_SAMPLES runs per size (exact up to
    EXACT_SIZES, then per power of two), for runs alone and runs overlapped by another; a
    line a + s*b per class for sizes not measured yet. The first run of a size pays one-off
    costs (kernels picked, memory first touched, XLA compiling the shape), so a size counts
    from its second. A median, not a moving average: one run stalled by other work (a
    pause, another process) would move an average by a share of the stall and could flip
    the plan (at 32x32, one run at three times its cost moved a 0.25-weight average by half
    and made two runs of 16 look faster than one of 32), while a lasting change moves the
    median within COST_SAMPLES / 2 runs."""

    def __init__(self):
        # [overlapped] {size key: [runs, median seconds, mean rows, recent seconds]}
        self._points = ({}, {})
        self._lines = [None, None]
        self._refresh = set()  # (overlapped, size key) whose next run restarts the median

    @staticmethod
    def _key(rows):
        return rows if rows <= EXACT_SIZES else 1 << (rows.bit_length() - 1)

    def observe(self, rows, seconds, overlapped):
        """One run of `rows` rows took `seconds`."""
        if rows < 1 or not seconds >= 0:
            return
        points = self._points[bool(overlapped)]
        point = points.get(self._key(rows))
        restart = (bool(overlapped), self._key(rows)) in self._refresh
        self._refresh.discard((bool(overlapped), self._key(rows)))
        if point is None:
            points[self._key(rows)] = [1, seconds, float(rows), None]
        elif point[0] == 1:  # the first run is replaced by the second, unless faster
            first = min(seconds, point[1])
            point[:] = [2, first, float(rows), collections.deque([first], COST_SAMPLES)]
        else:
            point[0] += 1
            if restart:
                point[3].clear()
            point[3].append(seconds)
            point[1] = _median(point[3])
            point[2] += ALPHA * (rows - point[2])
        self._lines[bool(overlapped)] = None

    def refresh(self, rows, overlapped):
        """The next run of `rows` starts the median afresh (its earlier runs may be from
        a faster or slower machine than the runs it is compared with)."""
        self._refresh.add((bool(overlapped), self._key(rows)))

    def measured(self, rows, overlapped=False):
        """The median cost at exactly `rows` (None: not run twice at that size)."""
        point = self._points[bool(overlapped)].get(rows) if rows <= EXACT_SIZES else None
        return point[1] if point is not None and point[0] >= 2 else None

    def known(self, rows, overlapped=False):
        """Whether estimate(rows) stands on more than one point: measured at `rows`, or
        a line through two sizes or more."""
        if self.measured(rows, overlapped) is not None:
            return True
        return sum(p[0] >= 2 for p in self._points[bool(overlapped)].values()) >= 2

    def estimate(self, rows, overlapped=False):
        """T(rows): the measured point, else the line; None while no size of that class
        has run twice."""
        seconds = self.measured(rows, overlapped)
        if seconds is not None:
            return seconds
        line = self.line(overlapped)
        if line is None:
            return None
        return line[0] + line[1] * rows

    def line(self, overlapped=False):
        """(a, s) of the least-squares line through the measured points (weighted by how
        often each size ran, up to 8), a and s >= 0; through the origin when one size has
        run or the fit says a or s < 0; None while nothing has run twice."""
        cached = self._lines[bool(overlapped)]
        if cached is not None:
            return cached
        points = [p for p in self._points[bool(overlapped)].values() if p[0] >= 2]
        if not points:
            return None
        weight = [min(p[0], 8) for p in points]
        total = float(sum(weight))
        mean_b = sum(w * p[2] for w, p in zip(weight, points)) / total
        mean_t = sum(w * p[1] for w, p in zip(weight, points)) / total
        spread = sum(w * (p[2] - mean_b) ** 2 for w, p in zip(weight, points))
        slope = intercept = -1.0
        if spread > 0:
            slope = sum(w * (p[2] - mean_b) * (p[1] - mean_t)
                        for w, p in zip(weight, points)) / spread
            intercept = mean_t - slope * mean_b
        if slope < 0 or intercept < 0:  # refit through the origin
            intercept = 0.0
            slope = sum(w * p[1] * p[2] for w, p in zip(weight, points)) / max(
                1e-12, sum(w * p[2] ** 2 for w, p in zip(weight, points)))
        self._lines[bool(overlapped)] = (intercept, slope)
        return self._lines[bool(overlapped)]

    def points(self):
        """[(size, seconds alone or None, seconds overlapped or None, runs)] by size (the
        sizes run twice or more)."""
        alone = {k: p for k, p in self._points[0].items() if p[0] >= 2}
        shared = {k: p for k, p in self._points[1].items() if p[0] >= 2}
        return [(size, alone[size][1] if size in alone else None,
                 shared[size][1] if size in shared else None,
                 (alone[size][0] if size in alone else 0) +
                 (shared[size][0] if size in shared else 0))
                for size in sorted(set(alone) | set(shared))]


class LoadEstimate:
    """How many requests are in the system (the peak over the last PEAK_EPOCHS batches)
    and how fast they arrive."""

    def __init__(self):
        self._peaks = collections.deque(maxlen=PEAK_EPOCHS)
        self._peak = 0  # this epoch's (since the last batch started)
        self._window = None  # start of the current rate window
        self._count = 0  # arrivals in it
        self._rate = 0.0

    def arrival(self, now, in_system):
        self._peak = max(self._peak, in_system)
        if self._window is None:
            self._window = now
        self._count += 1
        elapsed = now - self._window
        if elapsed >= RATE_WINDOW:
            rate = self._count / elapsed
            self._rate = rate if not self._rate else self._rate + 0.5 * (rate - self._rate)
            self._window, self._count = now, 0

    def batch_started(self, in_system):
        self._peaks.append(self._peak)
        self._peak = in_system

    def shrink(self, in_system):
        """A hold ran out: fewer requests are in the system than the peaks said."""
        self._peaks.clear()
        self._peak = in_system

    @property
    def concurrency(self):
        return max(max(self._peaks, default=0), self._peak)

    @property
    def arrival_rate(self):
        """Requests per second over the last RATE_WINDOW-second windows (0 before one
        has passed)."""
        return self._rate


class Decision:
    """What a free batch thread decided for one queue: hold the rows (`reason` "hold",
    for `wait` seconds at most), or run `rows` of them now and why. Once the batch starts
    it is the batch's record (times in seconds): `held` is how long its oldest row waited
    in the queue, `planned` the latest start any decision allowed it, counted from that
    row's arrival: never above `bound` (the configured one), whatever the cost model
    says. (A row can wait longer only while every batch thread is busy.)"""
    __slots__ = ("reason", "rows", "wait", "planned", "for_rows", "time", "padded", "held",
                 "bound", "concurrency", "target", "parallel", "queued", "running", "wake")

    def __init__(self, reason, rows=None, wait=None, planned=0.0, for_rows=False):
        self.reason, self.rows, self.wait, self.planned = reason, rows, wait, planned
        self.for_rows = for_rows  # a hold for missing rows (not for a run to end)
        # A hold's (queued rows, rows in the system) at either of which an arrival can turn
        # it into a run; below both, arrivals need not wake a batch thread (None: any may).
        self.wake = None
        self.time = self.padded = self.held = self.bound = None
        self.concurrency = self.target = self.parallel = self.queued = self.running = None

    def as_dict(self):
        return {name: getattr(self, name) for name in self.__slots__}


class Learner:
    """What one kind of request (model, version, signature, outputs, input shapes) has
    taught the scheduler: its cost model, its load, the plan in use, and the records and
    counts the status page and the metrics show. Used under the Batcher's lock."""

    def __init__(self, label=None):
        self.label = label  # (model name, version, signature name), or None
        self.cost = CostModel()
        self.load = LoadEstimate()
        self.records = collections.deque(maxlen=RECORDS)
        self.delays = collections.deque(maxlen=DELAYS)  # seconds, per request
        self.batch_sizes = collections.Counter()  # padded rows -> batches run
        self.delay_counts = None  # the metrics' histogram of queue delays (Batcher's)
        self.batches = 0
        self.rows = 0
        self.adaptive = False
        self.bound = 0.0  # the configured bound (seconds) of the latest decision
        self.parallel = 1  # the plan of the latest decision
        self.target = 1
        self._plans = {}  # concurrency -> parallel runs in use
        self._explore = 0  # batches left to run with the plan not in use
        self._explored = {}  # concurrency -> batches run at its last re-measurement
        self._explore_every = {}  # concurrency -> batches until its next re-measurement
        self._measuring = {}  # concurrency -> True while its re-measurement is under way
        self._confirm_every = {}  # concurrency -> batches before a re-measurement asked for
        # Batches run per concurrency: the re-measurement intervals count only the batches
        # run at theirs (when the load alternates between 1 and 32 clients, the 1-client
        # batches must not bring the 32-client plan's re-measurement forward).
        self._batches_at = collections.Counter()
        # The idle time between runs made one at a time (the clients' turnaround), and
        # from the latest end to a run that starts while another runs (gap2): medians of
        # the recent samples, so one stalled client or a scheduler hiccup does not flip
        # the plan.
        self._gaps = collections.deque(maxlen=GAP_SAMPLES)
        self._gaps_shared = collections.deque(maxlen=GAP_SAMPLES)
        # How long after a hold for missing rows began the system held `concurrency`
        # requests again, whether the hold waited for them or ran out first: in a closed
        # loop, the spread of the clients' turnaround (`holding`, `arrival`).
        self._fills = collections.deque(maxlen=FILL_SAMPLES)
        self._fill_from = None  # the pending measurement's start, concurrency and cap
        self._fill_for = self._fill_cap = 0
        self.last_end = None

    @property
    def gap(self):
        return _median(self._gaps)

    @gap.setter
    def gap(self, seconds):
        self._gaps.clear()
        self._gaps.append(seconds)

    @property
    def gap_shared(self):
        return _median(self._gaps_shared)

    # --- the plan ------------------------------------------------------------------

    def plan(self, concurrency, limit, threads, cap):
        """(parallel runs, target rows per run) for `concurrency` requests in the system:
        one run of c rows, or two of c/2 taking turns when the cost model says they
        serve SWITCH_MARGIN more rows per second (measured points, else its lines once
        they stand on two sizes; until then the plan is tried; at 32x32 with 32 clients the
        two were within 2-10% of each other by the model, and a choice by the larger
        estimate flipped to two runs of 16 for whole rows and served 0.94 of one run of 32
        side by side: docs/benchmarks.md), running the other for EXPLORE_BATCHES batches now and
        then to measure it again (after EXPLORE_EVERY batches at this concurrency, then
        twice as many each time the plan in use stayed, up to EXPLORE_MAX; after
        CONFIRM_EVERY when the model prefers it, doubled up to CONFIRM_MAX each time a
        re-measurement kept the plan in use) and changing plans only when such a
        re-measurement has just ended (both plans' costs fresh). One run at a
        time only while it lasts less than `cap` (the bound): rows that arrive during it
        wait for it to end."""
        c = max(1, concurrency)
        one, two = min(c, limit), min(-(-c // 2), limit)
        if min(MAX_PARALLEL, threads) < 2 or c < 2:
            return 1, one
        if not self.cost.known(two, True):  # try two runs (again) to know their cost
            return 2, two
        # A run of c alone that would outlast the bound is never planned. Until it has
        # been measured, its cost is guessed from two runs of c/2 sharing the cores
        # (about the same work), not from the line: from lone requests only, the line
        # runs through the origin and says c times one row's cost, at 32x32 ten times
        # too long (a run of 32 rows costs about what a run of one does), and a run of
        # c would never be tried.
        measured = self.cost.measured(one, False)
        if (measured if measured is not None else self.cost.estimate(two, True)) > cap:
            return 2, two
        if not self.cost.known(one, False):
            return 1, one
        alone = self.cost.estimate(one, False)
        shared = self.cost.estimate(two, True)
        gap = (self.gap or 0.0) if one >= c else 0.0  # all c at once: clients turn around
        rate = {1: one / max(1e-9, alone + gap),
                2: 2 * two / max(1e-9, shared + (self.gap_shared or 0.0))}
        best = 2 if rate[2] > SWITCH_MARGIN * rate[1] else 1
        if len(self._plans) >= 4 * EXACT_SIZES:
            self._plans.clear()
            self._explored.clear()
            self._explore_every.clear()
            self._batches_at.clear()
            self._measuring.clear()
            self._confirm_every.clear()
        current = self._plans.get(c)
        # A re-measurement of the plan not in use has just ended: both plans' costs are
        # from the last few batches, so the comparison may change the plan.
        fresh = self._explore == 0 and self._measuring.pop(c, False)
        if current is None or (best != current and fresh):
            if current is not None:  # the plan changed: re-measure the other one soon
                self._explore_every[c] = EXPLORE_EVERY
                self._explored[c] = self._batches_at[c]
                self._confirm_every[c] = CONFIRM_EVERY
            current = best
        elif fresh:  # the plan in use won again: the model's preference was the noise's
            self._confirm_every[c] = min(CONFIRM_MAX, 2 * self._confirm_every.get(
                c, CONFIRM_EVERY))
        self._plans[c] = current
        choice = current
        every = self._explore_every.setdefault(c, EXPLORE_EVERY)
        since = self._batches_at[c] - self._explored.setdefault(c, self._batches_at[c])
        if self._explore > 0:
            choice = 3 - current
        elif since >= every or (best != current and
                                since >= self._confirm_every.get(c, CONFIRM_EVERY)):
            # Due, or the model prefers the other plan on costs older than the plan in
            # use's: measure it again before changing.
            if since >= every:
                self._explore_every[c] = min(EXPLORE_MAX, 2 * every)
            self._explored[c] = self._batches_at[c]
            self._explore = EXPLORE_BATCHES
            self._measuring[c] = True
            choice = 3 - current
            self.cost.refresh(one if choice == 1 else two, overlapped=choice == 2)
        return choice, (one if choice == 1 else two)

    def hold_bound(self, queued, target, parallel, cap):
        """How long holding `queued` rows for the target's missing rows is worth: what one
        run of `target` rows saves over two runs (n, target - n), from measured points
        or the line; at least HOLD_FLOOR of a run of `target` (rows in flight usually
        arrive sooner, and a run's noise must not break batches apart), and at least
        FILL_MARGIN times the FILL_QUANTILE of how long recent holds took to fill (the
        missing rows of a closed loop are clients still turning around: at 32x32 with 32
        clients over gRPC the last of them comes 15-20 ms after the first, up to 100 ms
        when the machine is busy, while the saving is about a run's fixed cost, a few ms;
        running without them splits the clients into two cohorts, and each later cycle
        pays again until they merge); UNKNOWN_HOLD while nothing of that class has run
        twice; never above `cap`."""
        overlapped = parallel > 1
        whole = self.cost.estimate(target, overlapped)
        now = self.cost.estimate(queued, overlapped)
        rest = self.cost.estimate(max(1, target - queued), overlapped)
        if whole is None or now is None or rest is None:
            return min(cap, UNKNOWN_HOLD)
        floor = HOLD_FLOOR * whole
        if len(self._fills) >= FILL_MIN_SAMPLES:
            floor = max(floor, FILL_MARGIN * _percentile(sorted(self._fills), FILL_QUANTILE))
        return max(0.0, min(cap, max(now + rest - whole, floor)))

    def holding(self, since, concurrency, cap):
        """A free run holds rows (since `since`) for the requests that bring the system to
        `concurrency`: time how long they take, unless a measurement is pending (one
        older than `cap` is given up: those requests left)."""
        if self._fill_from is None or since - self._fill_from > self._fill_cap:
            self._fill_from, self._fill_for, self._fill_cap = since, concurrency, cap

    def arrival(self, now, in_system):
        """A request arrived; `in_system` requests are queued or running with it."""
        self.load.arrival(now, in_system)
        if self._fill_from is not None and in_system >= self._fill_for:
            seconds = now - self._fill_from
            self._fill_from = None
            if seconds <= self._fill_cap:
                self._fills.append(seconds)

    @property
    def fill(self):
        """The FILL_QUANTILE of the recent times to fill (None before any)."""
        return _percentile(sorted(self._fills), FILL_QUANTILE)

    # --- what happened -------------------------------------------------------------

    def started(self, decision, now, alone):
        """A batch starts: `decision` is its record; alone: no run of this kind is in
        progress (the gap since the last one ended is the clients' turnaround). A run of
        the two-runs plan that starts while the other runs measures its slot's idle time
        since the latest end (gap2: a slot waits for its half of the clients too)."""
        if self.last_end is not None and now - self.last_end < 1.0:
            gap = max(0.0, now - self.last_end)
            if alone:
                self._gaps.append(gap)
            elif decision.parallel == 2:
                self._gaps_shared.append(gap)
        if self._explore > 0:
            self._explore -= 1
        decision.time = now
        self.records.append(decision)
        self.batches += 1
        self._batches_at[max(1, decision.concurrency or 1)] += 1
        self.rows += decision.rows
        self.batch_sizes[decision.padded] += 1

    def finished(self, rows, seconds, overlapped, now):
        self.cost.observe(rows, seconds, overlapped)
        self.last_end = now

    def state(self):
        """A snapshot (plain values) for the status page and the metrics."""
        recent = list(self.records)[-32:]
        delays = sorted(self.delays)
        return {
            "label": self.label, "adaptive": self.adaptive, "batches": self.batches,
            "rows": self.rows, "concurrency": self.load.concurrency,
            "arrival_rate": self.load.arrival_rate, "parallel": self.parallel,
            "target": self.target, "bound": self.bound,
            "recent_sizes": [d.padded for d in recent],
            "recent_reasons": dict(collections.Counter(d.reason for d in recent)),
            "held_max": max((d.held for d in recent), default=0.0),
            "delay_p50": _percentile(delays, 50), "delay_p99": _percentile(delays, 99),
            "delay_max": delays[-1] if delays else None,
            "batch_sizes": dict(self.batch_sizes), "cost": self.cost.points(),
            "line": self.cost.line(False), "line_overlapped": self.cost.line(True),
            "gap": self.gap, "gap_shared": self.gap_shared, "fill": self.fill,
        }


def _median(samples):
    """The median of `samples` (None when empty)."""
    if not samples:
        return None
    ordered = sorted(samples)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])


def _percentile(ordered, q):
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, int(math.ceil(q / 100.0 * len(ordered))) - 1))]


def decide(learner, queued, running_rows, running, limit, threads, cap, oldest, hold_start,
           now):
    """The adaptive policy (see the module docstring): what a free batch thread does with
    the `queued` rows of one queue while `running` runs of it hold `running_rows` rows.
    cap: the configured bound (seconds): no row is held past `oldest` (the enqueue time of
    the oldest queued row) + cap; hold_start: when a free run of the plan first held these
    rows for missing ones (None: not yet). -> Decision; its `planned` is the deadline
    it set, as seconds after `oldest`."""
    in_system = queued + running_rows
    concurrency = max(learner.load.concurrency, in_system)
    parallel, target = learner.plan(concurrency, limit, threads, cap)
    learner.parallel, learner.target, learner.bound = parallel, target, cap
    until = oldest + cap
    reason = "bound (runs busy)"  # the plan's runs are all busy: wait for one to end
    if running < parallel:
        if queued >= target or not queued:  # (no rows: requests with empty inputs)
            free = parallel - running
            rows = min(queued, limit) if parallel == 1 else \
                min(queued, limit, max(target, -(-queued // free)))
            return _run("target", rows, parallel, target, concurrency)
        if concurrency <= in_system:
            return _run("all in system", min(queued, limit), parallel, target,
                        concurrency)
        started = hold_start if hold_start is not None else now
        learner.holding(started, concurrency, cap)
        worth = started + learner.hold_bound(queued, target, parallel, cap)
        reason = "bound"
        if worth < until:
            until, reason = worth, "held long enough"
    if now < until:
        decision = Decision("hold", wait=until - now, planned=until - oldest,
                            for_rows=running < parallel)
        # What can end the hold before `until`: the queue reaching the target (a free
        # run), or the system reaching `concurrency` (all in system, or a new peak that
        # may change the plan). A run's end wakes the threads anyway.
        decision.wake = (target if running < parallel else math.inf, concurrency)
        return decision
    if running < parallel and hold_start is not None:
        learner.load.shrink(in_system)  # held for missing requests that did not come
    decision = _run(reason, min(queued, limit), parallel, target, concurrency)
    decision.planned = until - oldest
    return decision


def _run(reason, rows, parallel, target, concurrency):
    decision = Decision(reason, rows)
    decision.parallel, decision.target, decision.concurrency = parallel, target, concurrency
    return decision
