"""tensorflow.ProfilerService on the server's gRPC port (--enable_profiler, on by default
as in TF Serving 2.15, which registers TensorFlow's profiler service there).

TensorBoard's "Capture profile", `tf.profiler.experimental.client.trace(
'grpc://host:port', logdir, ms)` and TF's `profiler_client.trace` send a `Profile`
request; like TF's ProfilerServiceImpl (tsl/profiler/rpc/profiler_service_impl.cc) the
server runs TensorFlow's profiler in process for the requested duration. `Terminate`
ends a session early; `Monitor` is UNIMPLEMENTED, as there.

Where the trace goes is the operator's choice, never a client's:
- without --profiler_log_dir nothing is written: the trace comes back in the response
  (`ProfileResponse.tool_data`, one `<host>.xplane.pb` entry, a field of TF's own
  ProfileResponse); TF's clients then succeed and write nothing;
- with --profiler_log_dir, TF Serving's behaviour inside that directory: the server
  writes `<repository_root>/<session_id>/<host_name>.xplane.pb` (the client asks for
  `<logdir>/plugins/profile`, which TensorBoard's profile plugin reads), where
  repository_root must resolve (symlinks followed) inside the directory: a relative one is
  taken under it; `..` anywhere, or an absolute path or symlink leading out, is
  PERMISSION_DENIED. The file is written to a temporary name and renamed, so a symlink
  planted at its name is replaced, not followed, and a reader never sees half a trace.

The wheel ships no Python messages for profiler_service.proto, so they are built here
from its field list by config/descriptors.py (as config/messages.py builds TF Serving's
config messages), in a private descriptor pool; `ProfileOptions` is the wheel's own
profiler_options.proto.

Bounds this server adds: a duration or start delay above --profiler_max_duration_ms is
INVALID_ARGUMENT; the trace directory must end in `plugins/profile` and the session id
and host name be single path components (every TF client asks for exactly that).
"""
import logging
import os
import shutil
import socket
import tempfile
import threading
import time

import grpc
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import profiler_options_pb2
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from slimserve.serving.config import descriptors

SERVICE = "tensorflow.ProfilerService"
PLUGIN_DIR = ("plugins", "profile")  # tsl GetTensorBoardProfilePluginDir(logdir)
XPLANE_SUFFIX = ".xplane.pb"
_F = descriptors.F
_OPT, _REP = descriptors.OPTIONAL, descriptors.REPEATED

# tsl/profiler/protobuf/profiler_service.proto (TF 2.15): name -> [(field, number, type,
# label, message type)]. MonitorResponse's monitor_result (10) is left out: Monitor is
# unimplemented.
_MESSAGES = {
    "ToolRequestOptions": [("output_formats", 2, _F.TYPE_STRING, _OPT, None),
                           ("save_to_repo", 3, _F.TYPE_BOOL, _OPT, None)],
    "ProfileRequest": [("duration_ms", 1, _F.TYPE_UINT64, _OPT, None),
                       ("max_events", 2, _F.TYPE_UINT64, _OPT, None),
                       ("tools", 3, _F.TYPE_STRING, _REP, None),
                       ("tool_options", 8, descriptors.MAP,
                        ("string", ".tensorflow.ToolRequestOptions"), None),
                       ("opts", 4, _F.TYPE_MESSAGE, _OPT, ".tensorflow.ProfileOptions"),
                       ("repository_root", 5, _F.TYPE_STRING, _OPT, None),
                       ("session_id", 6, _F.TYPE_STRING, _OPT, None),
                       ("host_name", 7, _F.TYPE_STRING, _OPT, None)],
    "ProfileToolData": [("name", 1, _F.TYPE_STRING, _OPT, None),
                        ("data", 2, _F.TYPE_BYTES, _OPT, None)],
    "ProfileResponse": [("tool_data", 6, _F.TYPE_MESSAGE, _REP, ".tensorflow.ProfileToolData"),
                        ("empty_trace", 7, _F.TYPE_BOOL, _OPT, None)],
    "TerminateRequest": [("session_id", 1, _F.TYPE_STRING, _OPT, None)],
    "TerminateResponse": [],
    "MonitorRequest": [("duration_ms", 1, _F.TYPE_UINT64, _OPT, None),
                       ("monitoring_level", 2, _F.TYPE_INT32, _OPT, None),
                       ("timestamp", 3, _F.TYPE_BOOL, _OPT, None)],
    "MonitorResponse": [("data", 1, _F.TYPE_STRING, _OPT, None)],
}


_, _CLASSES = descriptors.build(
    "slimserve/profiler_service.proto", "tensorflow", _MESSAGES,
    imports=(profiler_options_pb2.DESCRIPTOR,))
ProfileRequest = _CLASSES["ProfileRequest"]
ProfileResponse = _CLASSES["ProfileResponse"]
TerminateRequest = _CLASSES["TerminateRequest"]
TerminateResponse = _CLASSES["TerminateResponse"]
MonitorRequest = _CLASSES["MonitorRequest"]
MonitorResponse = _CLASSES["MonitorResponse"]
ProfileOptions = profiler_options_pb2.ProfileOptions


class _Refused(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _check_request(request, max_duration_ms):
    """(duration s, delay s, host name) of a request, or _Refused naming its field."""
    duration_ms = request.opts.duration_ms or request.duration_ms  # TF reads opts'
    if duration_ms > max_duration_ms:
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "ProfileRequest.opts.duration_ms "
                       "%d is above --profiler_max_duration_ms=%d" % (duration_ms,
                                                                      max_duration_ms))
    delay_ms = 0.0
    if request.opts.start_timestamp_ns:
        delay_ms = max(0.0, (request.opts.start_timestamp_ns - time.time_ns()) / 1e6)
        if delay_ms > max_duration_ms:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "ProfileRequest.opts."
                           "start_timestamp_ns is %.0f ms away, above "
                           "--profiler_max_duration_ms=%d" % (delay_ms, max_duration_ms))
    host = request.host_name or socket.gethostname()
    for field, value in (("session_id", request.session_id), ("host_name", host)):
        if not value or value in (".", "..") or "/" in value or "\\" in value or \
                "\0" in value:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "ProfileRequest.%s %r is not "
                           "one path component" % (field, value))
    return duration_ms / 1000.0, delay_ms, host


def trace_path(log_dir, request, host):
    """Where a trace of `request` is written under the operator's `log_dir` (a local
    directory), or _Refused: `repository_root` must end in plugins/profile, hold no `..`
    and resolve (symlinks followed) inside log_dir; a relative one is taken under it."""
    root = request.repository_root
    parts = root.replace("\\", "/").rstrip("/").split("/")
    if tuple(parts[-2:]) != PLUGIN_DIR or len(parts) < 3 or "\0" in root:
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "ProfileRequest.repository_root "
                       "%r is not <logdir>/plugins/profile" % root)
    if ".." in parts:
        raise _Refused(grpc.StatusCode.PERMISSION_DENIED, "ProfileRequest.repository_root "
                       "%r holds '..'; this server writes profiles only inside the "
                       "directory its operator named (--profiler_log_dir)" % root)
    base = os.path.realpath(log_dir)
    target = os.path.realpath(os.path.join(base, root.replace("\\", "/")))
    if os.path.commonpath([base, target]) != base:
        raise _Refused(grpc.StatusCode.PERMISSION_DENIED, "ProfileRequest.repository_root "
                       "%r is outside the directory this server writes profiles to "
                       "(--profiler_log_dir)" % root)
    session = os.path.join(target, request.session_id)
    if os.path.islink(session) or os.path.commonpath(
            [base, os.path.realpath(session)]) != base:
        raise _Refused(grpc.StatusCode.PERMISSION_DENIED, "ProfileRequest.session_id %r "
                       "leads outside --profiler_log_dir" % request.session_id)
    return os.path.join(session, host + XPLANE_SUFFIX)


def _write_inside(log_dir, path, data):
    """Writes `data` at `path` (checked by trace_path) whole: directories made one by one
    refusing any that turns out to be a symlink, then a temporary file renamed over the
    name (a symlink there is replaced, not followed)."""
    base = os.path.realpath(log_dir)
    folder = os.path.dirname(path)
    relative = os.path.relpath(folder, base)
    current = base
    for part in [] if relative == "." else relative.split(os.sep):
        current = os.path.join(current, part)
        try:
            os.mkdir(current, 0o755)
        except FileExistsError:
            pass
        if os.path.islink(current) or not os.path.isdir(current):
            raise OSError("%s is not a directory of --profiler_log_dir" % current)
    handle, temporary = tempfile.mkstemp(prefix=".xplane-", dir=folder)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def _options(opts, delay_ms):
    """tf.profiler's options from the request's ProfileOptions; version 0 means TF's
    defaults, as tsl's ProfilerSession reads it."""
    if not opts.version:
        return tf.profiler.experimental.ProfilerOptions(delay_ms=delay_ms or None)
    return tf.profiler.experimental.ProfilerOptions(
        host_tracer_level=opts.host_tracer_level, python_tracer_level=opts.python_tracer_level,
        device_tracer_level=opts.device_tracer_level, delay_ms=delay_ms or None)


def is_empty(xspace_bytes):
    """tsl IsEmpty: no plane has a line with an event."""
    space = xplane_pb2.XSpace.FromString(xspace_bytes)
    return not any(line.events for plane in space.planes for line in plane.lines)


class ProfilerService:
    """Profile / Terminate / Monitor, registered on a grpc.Server by add_to_server.
    log_dir: --profiler_log_dir (a local directory; "" or None: traces are returned in
    the response and nothing is written)."""

    def __init__(self, max_duration_ms, log_dir=None):
        self.max_duration_ms = max_duration_ms
        self.log_dir = log_dir or None
        self._lock = threading.Lock()
        self._running = {}  # session id -> threading.Event set by Terminate

    def profile(self, request, context):
        try:
            duration, delay_ms, host = _check_request(request, self.max_duration_ms)
            path = trace_path(self.log_dir, request, host) if self.log_dir else None
        except _Refused as refused:
            context.abort(refused.code, str(refused))
        scratch = tempfile.mkdtemp(prefix="slimserve-profile-")
        try:
            try:
                tf.profiler.experimental.start(scratch, _options(request.opts, delay_ms))
            except tf.errors.OpError as error:  # e.g. another profile is running
                context.abort(grpc.StatusCode.INTERNAL, error.message)
            saved = False
            terminated = threading.Event()
            with self._lock:
                self._running[request.session_id] = terminated
            try:
                deadline = time.monotonic() + delay_ms / 1000.0 + duration
                while not terminated.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
                    if not context.is_active():
                        context.abort(grpc.StatusCode.CANCELLED, "the client cancelled")
                    if time.monotonic() >= deadline:
                        break
                tf.profiler.experimental.stop(save=True)
                saved = True
            finally:
                with self._lock:
                    self._running.pop(request.session_id, None)
                if not saved:
                    tf.profiler.experimental.stop(save=False)
            written = tf.io.gfile.glob(os.path.join(scratch, *PLUGIN_DIR, "*",
                                                    "*" + XPLANE_SUFFIX))
            if not written:
                context.abort(grpc.StatusCode.INTERNAL, "the profiler wrote no trace")
            with open(written[0], "rb") as handle:
                data = handle.read()
            response = ProfileResponse(empty_trace=is_empty(data))
            if path is None:
                response.tool_data.add(name=host + XPLANE_SUFFIX, data=data)
                logging.info("profile of %.0f ms returned to the client (%d bytes)",
                             duration * 1000, len(data))
                return response
            try:
                _write_inside(self.log_dir, path, data)
            except OSError as error:
                logging.error("profile not written to %s: %s", path,
                              error.strerror or error)
                context.abort(grpc.StatusCode.INTERNAL, "cannot write the profile: %s"
                              % (error.strerror or "not a directory of --profiler_log_dir"))
            logging.info("profile of %.0f ms written to %s", duration * 1000, path)
            return response
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def terminate(self, request, context):
        """Ends the running profile of `session_id` early (no-op for any other id)."""
        del context
        with self._lock:
            terminated = self._running.get(request.session_id)
        if terminated is not None:
            terminated.set()
        return TerminateResponse()

    @staticmethod
    def monitor(request, context):
        del request
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "unimplemented.")


def add_to_server(server, max_duration_ms, log_dir=None):
    """Registers tensorflow.ProfilerService on `server`; returns the servicer."""
    servicer = ProfilerService(max_duration_ms, log_dir)
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            method, request_deserializer=request.FromString,
            response_serializer=lambda message: message.SerializeToString())
        for name, method, request in (("Profile", servicer.profile, ProfileRequest),
                                      ("Terminate", servicer.terminate, TerminateRequest),
                                      ("Monitor", servicer.monitor, MonitorRequest))}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    return servicer
