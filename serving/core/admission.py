"""Bounds the bytes of requests in flight, so that a burst of large requests is answered
RESOURCE_EXHAUSTED long before any allocation of the server can fail.

gRPC and the REST server each bound one message (--grpc_channel_arguments'
max_receive_message_length, --max_body_bytes), and the request logger bounds its queue,
but nothing bounded how many large requests are worked on at once: six clients of 30 MiB
logged Predicts took a server under a 4 GiB address-space cap down with SIGSEGV on a CPU
slow enough for them to pile up. A request holds several copies of its payload while it
runs (the received message, the decoded tensors, the session's input and output
tensors, the answer and its serialized form, the log record), so each is charged
FOOTPRINT times its wire size when it is admitted, before anything is decoded, and
released when its answer is built. Past the budget it is refused at once with
RESOURCE_EXHAUSTED, whatever the CPU's speed: a client retries, the server lives.

The default budget derives from the memory the process may still take when it starts
(the least of its address-space limit, its cgroup's limit and the machine's available
memory, less what it already maps), a quarter of it; --max_request_bytes_in_flight sets
it instead.
"""
import resource
import threading

import grpc

from slimserve.serving.core import errors

# Copies of a request's wire bytes it may hold at once while it runs (module docstring).
FOOTPRINT = 4
# Of the memory left when the server starts, what requests in flight may hold; the rest
# is for the graphs' own working memory, the log queue, allocator arenas and thread stacks.
SHARE = 0.25
# A budget is never smaller than this, so one ordinary request is always admitted.
MIN_BUDGET = 64 << 20


def _read_int(path, field=None):
    try:
        with open(path) as handle:
            text = handle.read(1 << 16)
    except OSError:
        return None
    if field is None:
        value = text.strip()
        return int(value) if value.isdigit() else None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) > 1 and parts[1].isdigit() else None
    return None


def memory_headroom():
    """Bytes this process may still allocate: the least of (address-space limit - mapped),
    (cgroup memory.max - its current use) and MemAvailable; None when none is known."""
    candidates = []
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    mapped = _read_int("/proc/self/status", "VmSize")
    if soft != resource.RLIM_INFINITY and mapped is not None:
        candidates.append(soft - mapped)
    limit = _read_int("/sys/fs/cgroup/memory.max")
    used = _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        candidates.append(limit - used)
    available = _read_int("/proc/meminfo", "MemAvailable")
    if available is not None:
        candidates.append(available)
    return max(0, min(candidates)) if candidates else None


def default_budget():
    headroom = memory_headroom()
    return MIN_BUDGET * 16 if headroom is None else max(MIN_BUDGET, int(headroom * SHARE))


class BytesInFlight:
    """A budget of bytes shared by every request of one server (thread-safe)."""

    def __init__(self, budget):
        self.budget = int(budget)
        self._used = 0
        self._lock = threading.Lock()
        self.refused = 0

    @property
    def used(self):
        return self._used

    def acquire(self, wire_bytes, what="request"):
        """Takes FOOTPRINT x wire_bytes of the budget -> the charge to release(); raises,
        taking nothing, RESOURCE_EXHAUSTED when they do not fit now, INVALID_ARGUMENT when
        they never could (more than the whole budget)."""
        charge = FOOTPRINT * max(0, int(wire_bytes))
        with self._lock:
            used = self._used
            if charge and used + charge > self.budget:
                self.refused += 1
            else:
                self._used += charge
                return charge
        if charge <= self.budget:
            raise errors.ServingError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "this server is working on %d MiB of requests; this %s of %d bytes would "
                "pass its budget of %d MiB (--max_request_bytes_in_flight): retry later"
                % (used >> 20, what, wire_bytes, self.budget >> 20))
        raise errors.ServingError(  # INVALID_ARGUMENT: retrying it can never succeed
            grpc.StatusCode.INVALID_ARGUMENT,
            "this %s of %d bytes needs %d MiB while it runs, more than this server's "
            "budget for requests in flight (%d MiB, --max_request_bytes_in_flight)"
            % (what, wire_bytes, charge >> 20, self.budget >> 20))

    def release(self, charge):
        with self._lock:
            self._used -= charge
