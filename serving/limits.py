"""The bounds every numeric server setting is checked against (slimserve/fields.py), in
one place, so a flag and the component option it feeds read the same rule.

Each ceiling is far above any sensible value and low enough that the value cannot
exhaust the machine or overflow what uses it: a thread is a stack, a port is 16 bits, a
timeout of more than a day is a mistake, a byte count above 2^40 (1 TiB) is a typo.
"""
import os

from slimserve import fields

# The CPUs this process may run on: TF Serving's defaults of thread and pool counts
# derive from it.
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
    os.cpu_count() or 1)

MAX_THREADS = 4096  # 4 x the CPUs of a 1024-core machine; each thread holds a stack
MAX_BYTES = 2 ** 40  # 1 TiB
MAX_ELEMENTS = 2 ** 38  # 1 TiB of float32
MAX_BYTES_PER_SECOND = 2 ** 34  # 16 GiB/s, above any one network link
MAX_CONNECTIONS = 2 ** 20  # Linux's ceiling on one process's open files (fs.nr_open)
DAY_SECONDS = 24 * 3600
DAY_MS = DAY_SECONDS * 1000
DAY_MICROS = DAY_MS * 1000
MAX_RETRIES = 10 ** 6  # at the default minute apart, two years of retries
MAX_WARMUP_ITERATIONS = 10 ** 4  # each warmup record replayed; warmup delays serving
MAX_DEVICES = 1024  # devices (or channels) a session config may ask TensorFlow to make
MAX_REPLICAS = 256  # copies of a graph TensorFlow's auto_parallel rewrite may make
MAX_VERSIONS = 1024  # versions of one model a version policy may keep loaded

# -1 binds any free port (the server reports the one it got); 0: that API is off.
PORT = fields.Bound(0, 65535, also=(-1,))
THREADS = fields.Bound(1, MAX_THREADS)
THREADS_OR_ZERO = fields.Bound(0, MAX_THREADS)  # 0: the default (TF's, or "none")
BYTES = fields.Bound(1, MAX_BYTES)
BYTES_OR_ZERO = fields.Bound(0, MAX_BYTES)  # 0: derived (the option says from what)
ELEMENTS = fields.Bound(1, MAX_ELEMENTS)
ELEMENTS_OR_ZERO = fields.Bound(0, MAX_ELEMENTS)
SECONDS = fields.Bound(1, DAY_SECONDS)
SECONDS_OR_ZERO = fields.Bound(0, DAY_SECONDS)  # 0: once / off
MILLISECONDS = fields.Bound(1, DAY_MS)
