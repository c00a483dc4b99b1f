"""Servers for tests and benchmarks: in process (ModelServer on free ports) or as a child
`slimserve-server` through the one launcher (serving/server_process.py), under the
suite's memory cap, and the waits around them.

    server = serve_in_process([ServedModel("tiny", base)])      # .port, .rest_api_port
    child = start_server(["--model_base_path=" + base])          # a ServerProcess
    shared = shared_server(["--model_base_path=" + base])        # one per argument list

A child that a test attacks runs under MEMORY_CAP, so a regression that allocates without
bound fails that test instead of exhausting the machine; MODEL_MEMORY_CAP is for children
serving a ResNet export or TF Text (TensorFlow's own address space is large).
"""
import atexit
import threading
import time

from slimserve.serving import server as server_lib
from slimserve.serving import server_process

GIB = 1024 ** 3
MEMORY_CAP = 4 * GIB  # a server child on a tiny model
MODEL_MEMORY_CAP = 6 * GIB  # a server child on a ResNet export, TF Text or many versions

_SHARED = {}
_SHARED_LOCK = threading.Lock()


def wait_until(condition, timeout=30.0, interval=0.02, message="condition"):
    """Polls condition() until it returns something truthy, which is returned; raises
    AssertionError with `message` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, message))
        time.sleep(interval)


def serve_in_process(served_models, **options):
    """A started in-process ModelServer for [ServedModel]: gRPC and REST on free ports
    (rest_api_port=0 for none), file-system polling off unless given, and the loaded
    objects not frozen unless asked (it shares the process with the tests: core/heap.py).
    `options` are ServerOptions fields (the server's flag names)."""
    options.setdefault("port", server_lib.PICK_FREE_PORT)
    options.setdefault("freeze_loaded_objects", False)
    options.setdefault("rest_api_port", server_lib.PICK_FREE_PORT)
    options.setdefault("file_system_poll_wait_seconds", 0)
    return server_lib.ModelServer(model_server_config=served_models, **options).start()


def start_server(flags, memory_cap=MEMORY_CAP, **kwargs):
    """A `slimserve-server` child serving `flags` (ServerProcess; see its keywords),
    under `memory_cap` bytes of address space. The caller stops it."""
    return server_process.ServerProcess(flags, memory_cap=memory_cap, **kwargs)


def shared_server(flags, memory_cap=MEMORY_CAP, **kwargs):
    """One child per (flags, cap) for the whole run, as TF Serving's own test base caches
    its servers by their arguments: for tests that only send requests and change nothing a
    later test could see. Stopped when the interpreter exits; a child that died is
    started again."""
    key = (tuple(str(f) for f in flags), memory_cap)
    with _SHARED_LOCK:
        server = _SHARED.get(key)
        if server is None or not server.alive():
            server = _SHARED[key] = start_server(flags, memory_cap, **kwargs)
        return server


@atexit.register
def stop_shared():
    with _SHARED_LOCK:
        servers = list(_SHARED.values())
        _SHARED.clear()
    for server in servers:
        server.stop(grace_seconds=10)
