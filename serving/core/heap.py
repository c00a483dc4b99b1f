"""Keeps Python's full garbage collections off the request path of a server.

A loaded SavedModel leaves ~300,000 tracked objects (the graph's ops, tensors and
functions) in the oldest generation, and a full collection walks every one of them with
the GIL held: under 32 closed-loop clients at 32x32 it stopped every request handler and
batch thread for 150-175 ms about every 17 s (docs/benchmarks.md). Those objects live as
long as their version is served, so after a load the manager freezes what is tracked
(`gc.freeze`: ignored by every later collection), and after an unload it thaws, collects
the retired version's cycles (a graph is full of them) and freezes the rest again. A
stopped manager thaws everything (`thaw`): nothing it froze outlives it, in a process
that goes on. Collections then only walk what requests allocate.

Only a server that owns its process does this (`ManagerOptions.freeze_loaded_objects`,
the server's --freeze_loaded_objects): a library must not freeze its host's heap.
"""
import gc
import threading

_lock = threading.Lock()  # one thaw-collect-freeze at a time (loads and unloads overlap)


def settle():
    """After a version loads: collect what is garbage now (nothing garbage is frozen),
    then freeze everything still tracked. -> objects frozen."""
    with _lock:
        gc.collect()
        gc.freeze()
        return gc.get_freeze_count()


def release():
    """After a version unloads (or fails to load): thaw, collect (the retired version's
    cycles go now, not never), freeze again. -> objects frozen."""
    with _lock:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        return gc.get_freeze_count()


def thaw():
    """After the manager stops: thaw everything and collect (the process goes on with
    Python's default collection)."""
    with _lock:
        gc.unfreeze()
        gc.collect()
