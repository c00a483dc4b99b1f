"""One loaded SavedModel version: its session, its signatures, warmup, and the in-flight
accounting that lets a version be retired without dropping the requests it is serving.

This is the public way to load a SavedModel exactly as the server does (export
verification uses it too):

    servable = Servable.load("/models/resnet/3")
    name, signature_def = servable.signature("serving_default")
    outputs = servable.run(signature_def, {"image_bytes": images}, ["classes"])
    outputs = servable.run(signature_def, feeds, keys, deadlines.Deadline(2.0, "why"))
    replayed = servable.warm_up()
    servable.retire()
"""
import collections
import os
import threading

import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.client import pywrap_tf_session
from tensorflow_serving.apis import prediction_log_pb2

from slimserve import conventions
from slimserve.serving.config import session as session_lib
from slimserve.serving.core import errors
from slimserve.serving.core import tensors

WARMUP_PATH = conventions.WARMUP_PATH  # where TF Serving looks for warmup records
DEFAULT_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
# Run plans (callables) kept per servable: one per (input tensors, output tensors) seen,
# the least recently used dropped past this many (output filters could otherwise make
# 2^outputs).
MAX_CALLABLES = 64


# What TF Serving 2.15.1 answers, per API, for a signature name the model lacks
# (predict_util.cc, classifier.cc, regressor.cc, multi_inference.cc).
MISSING_SIGNATURE = {
    "predict": (grpc.StatusCode.FAILED_PRECONDITION, "Serving signature key \"%s\" not found."),
    # REST :predict looks the signature up while reading the JSON (GetInfoMap).
    "rest_predict": (grpc.StatusCode.INVALID_ARGUMENT,
                     "Serving signature name: \"%s\" not found in signature def"),
    "classify": (grpc.StatusCode.INVALID_ARGUMENT, "No signature was found with the name: %s"),
    "regress": (grpc.StatusCode.INVALID_ARGUMENT, "No signature was found with the name: %s"),
    "multi_inference": (grpc.StatusCode.INVALID_ARGUMENT,
                        "Requested signature not found in model graph: %s"),
}


class WarmupError(Exception):
    """A warmup record failed to replay: the version must not be served."""


class Servable:
    """One loaded version: its session and signatures, with in-flight accounting.

    A subclass serving another format (core/tflite_servable.py) overrides `_open`, which
    makes the session and the signatures, and `run`; the rest is shared."""
    graph = None  # the TensorFlow graph (a SavedModel's); other formats have none
    failure = None  # why this version can serve no request any more (tflite_servable.py)
    # What this version computes in (--mixed_precision) and whether XLA compiles it
    # (--xla_cpu_compilation_enabled): reported in the server's metrics.
    precision = session_lib.FLOAT32
    xla_jit = False
    runtime = "tensorflow"  # what runs the network: tensorflow, tflite, openvino

    def __init__(self, name, version, path, session_config=None, tags=None,
                 use_callables=True):
        """Loads the meta graph tagged `tags` (default: `serve`) at `path`; raises (session
        closed) if it cannot. use_callables: run through cached `Session` callables (the
        C++ Session::MakeCallable; the default) instead of session.run with a feed dict,
        which re-resolves names and fetch structure on every call."""
        self.name = name
        self.version = version
        self.path = path
        # This version's own BatchingParameters (core/batching/parameters.py; None: the server's),
        # set by the manager after loading.
        self.batching_parameters = None
        self._in_flight = 0
        self._retired = False
        self._lock = threading.Lock()
        self.use_callables = use_callables
        self._callables = collections.OrderedDict()  # (feed names, fetch names) -> callable
        self.session, signatures = self._open(session_config, tags)
        self.signatures = dict(signatures)

    def _open(self, session_config, tags):
        """(session, {name: SignatureDef}) of the version at self.path: here a SavedModel's
        meta graph tagged `tags` in a new session (closed again if loading fails)."""
        config = session_config if session_config is not None else \
            tf.compat.v1.ConfigProto()
        self.precision = session_lib.precision(config)
        self.xla_jit = session_lib.xla_jit(config)
        self.graph = tf.Graph()
        session = tf.compat.v1.Session(graph=self.graph, config=session_config)
        try:
            meta_graph = tf.compat.v1.saved_model.loader.load(
                session, list(tags or [tf.saved_model.SERVING]), self.path)
        except Exception:
            session.close()
            raise
        return session, meta_graph.signature_def

    @classmethod
    def load(cls, path, session_config=None):
        """A servable for the SavedModel at `path`; name and version are read off the path
        (`<base>/<name>/<version>` as TF Serving lays it out, version 0 if not a number)."""
        path = path.rstrip("/")
        base, leaf = os.path.split(path)
        version = int(leaf) if leaf.isdigit() else 0
        name = os.path.basename(base) if leaf.isdigit() else leaf
        return cls(name or "model", version, path, session_config)

    def acquire(self):
        """Takes one in-flight reference; False once the version is retired."""
        with self._lock:
            if self._retired:
                return False
            self._in_flight += 1
            return True

    def release(self):
        with self._lock:
            self._in_flight -= 1
            close = self._retired and self._in_flight == 0
        if close:
            self.session.close()

    def retire(self):
        """No new requests; the session closes when the last in-flight one releases."""
        with self._lock:
            self._retired = True
            close = self._in_flight == 0
        if close:
            self.session.close()

    def signature(self, name, api="predict"):
        """(name, SignatureDef) of the signature a request names (empty: serving_default).

        The one signature lookup of every API; a name the model lacks gets the status and
        message TF Serving gives on that API (MISSING_SIGNATURE)."""
        name = name or DEFAULT_SIGNATURE
        signature_def = self.signatures.get(name)
        if signature_def is None:
            code, message = MISSING_SIGNATURE[api]
            raise errors.ServingError(code, message % name)
        return name, signature_def

    def run(self, signature_def, feeds, output_keys, deadline=None):
        """feeds: {input key: ndarray}; returns {output key: ndarray}. TF errors become
        ServingErrors with the same canonical code. deadline (core.deadlines.Deadline):
        the run gets the time left as RunOptions.timeout_in_ms, so TensorFlow cancels it
        (DEADLINE_EXCEEDED) rather than computing an answer nobody waits for."""
        timeout_ms = None
        if deadline is not None:
            timeout_ms = deadline.timeout_in_ms()
            if timeout_ms <= 0:
                raise deadline.exceeded()
        if not self.use_callables:
            feed_dict = {signature_def.inputs[k].name: v for k, v in feeds.items()}
            fetches = [signature_def.outputs[k].name for k in output_keys]
            options = (None if timeout_ms is None
                       else config_pb2.RunOptions(timeout_in_ms=timeout_ms))
            try:
                values = self.session.run(fetches, feed_dict=feed_dict, options=options)
            except tf.errors.OpError as error:
                raise _serving_error(error, deadline) from None
            except UnicodeDecodeError as error:  # TF's message quotes non-UTF-8 input
                raise errors.from_undecodable_tf_error(error) from None
            return _outputs(output_keys, values)
        keys = list(feeds)
        plan = self._plan(
            tuple(signature_def.inputs[k].name for k in keys),
            tuple(signature_def.outputs[k].name for k in output_keys))
        # Converted to the fed tensor's dtype as session.run does. Shapes are not checked
        # against the tensor's static shape: as in C++ Session::Run (TF Serving), the
        # graph decides, and a shape it cannot take fails there as INVALID_ARGUMENT.
        values = []
        for key, (dtype, _) in zip(keys, plan.specs):
            value = feeds[key]
            if dtype is not None and value.dtype != dtype:
                value = np.asarray(value, dtype)
            values.append(value)
        try:
            values = plan.run(values, timeout_ms)
        except tf.errors.OpError as error:
            raise _serving_error(error, deadline) from None
        except UnicodeDecodeError as error:  # TF's message quotes non-UTF-8 input
            raise errors.from_undecodable_tf_error(error) from None
        return _outputs(output_keys, values)

    def _plan(self, feed_names, fetch_names):
        """The _RunPlan feeding `feed_names` and fetching `fetch_names`, made on first
        use and kept (least recently used dropped past MAX_CALLABLES)."""
        key = (feed_names, fetch_names)
        with self._lock:
            plan = self._callables.get(key)
            if plan is not None:
                self._callables.move_to_end(key)
                return plan
        try:
            plan = _RunPlan(self.session, feed_names, fetch_names)
        except tf.errors.OpError as error:
            raise errors.from_tf_error(error) from None
        except (KeyError, ValueError) as error:  # a signature naming no tensor of the graph
            raise errors.ServingError(grpc.StatusCode.INTERNAL, str(error)) from None
        with self._lock:
            plan = self._callables.setdefault(key, plan)
            self._callables.move_to_end(key)
            while len(self._callables) > MAX_CALLABLES:
                self._callables.popitem(last=False)
        return plan

    def warm_up(self, iterations=1):
        """Replays assets.extra/tf_serving_warmup_requests (predict, classify and regress
        logs, as TF Serving does), each record `iterations` times in a row
        (--num_request_iterations_for_warmup); returns how many records ran. Any failure
        raises WarmupError naming the record: a version whose warmup fails is not served."""
        path = os.path.join(self.path, WARMUP_PATH)
        if not tf.io.gfile.exists(path):
            return 0
        count = 0
        for record in tf.compat.v1.io.tf_record_iterator(path):
            try:
                for _ in range(max(int(iterations), 1)):
                    self._replay(record)
            except Exception as error:  # pylint: disable=broad-except
                message = getattr(error, "message", None) or str(error)
                raise WarmupError("%s: warmup record %d failed: %s" % (
                    path, count + 1, message.strip().splitlines()[0] if message.strip()
                    else type(error).__name__)) from error
            count += 1
        return count

    def _replay(self, record):
        log = prediction_log_pb2.PredictionLog.FromString(record)
        kind = log.WhichOneof("log_type")
        if kind == "predict_log":
            request = log.predict_log.request
            _, sig = self.signature(request.model_spec.signature_name)
            feeds = tensors.decode_inputs(request.inputs, sig.inputs)  # bounded too
            self.run(sig, feeds, sorted(sig.outputs))
        elif kind in ("classify_log", "regress_log"):
            request = getattr(log, kind).request
            _, sig = self.signature(request.model_spec.signature_name, kind[:-len("_log")])
            examples = np.array([e.SerializeToString()
                                 for e in request.input.example_list.examples], object)
            self.run(sig, {next(iter(sig.inputs)): examples}, sorted(sig.outputs))
        else:
            raise ValueError("unsupported warmup log type %s" % kind)


def _outputs(keys, values):
    """{key: ndarray} of a run's fetched values. TensorFlow hands a rank-0 string back as
    `bytes` and a rank-0 number as a numpy scalar; every caller (the REST writer, the
    TensorProto filler, batching) wants an ndarray, rank 0 included."""
    out = {}
    for key, value in zip(keys, values):
        if isinstance(value, bytes):
            array = np.empty((), dtype=object)
            array[()] = value
            value = array
        elif not isinstance(value, np.ndarray):
            value = np.asarray(value)
        out[key] = value
    return out


def _serving_error(error, deadline):
    """A TF error of a run as a ServingError; a run TensorFlow cancelled at its timeout
    says whose deadline it was."""
    served = errors.from_tf_error(error)
    if deadline is not None and served.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return deadline.exceeded(served.message)
    return served


class _RunPlan:
    """How one (feed tensors, fetch tensors) pair of a session runs.

    Without a deadline: a cached Session callable (the C++ Session::MakeCallable, made on
    first use), which skips session.run's per-call name and fetch-structure resolution.
    With one: Session::Run with RunOptions.timeout_in_ms, fed and fetched by pre-resolved
    graph outputs. A callable's RunOptions are fixed when it is made, and a callable per
    timeout would optimise the graph again for each; Session::Run caches its executors
    per feeds and fetches, so any timeout costs nothing extra there.
    """
    # pylint: disable=protected-access  (TensorFlow's session internals, used as
    # session.run itself uses them)

    def __init__(self, session, feed_names, fetch_names):
        graph = session.graph
        self._session = session
        self._feed_names, self._fetch_names = feed_names, fetch_names
        self.specs = []  # (numpy dtype or None for strings, dims or None) per feed
        feeds = []
        for name in feed_names:
            tensor = graph.get_tensor_by_name(name)
            dims = tensor.shape.as_list() if tensor.shape.rank is not None else None
            self.specs.append((None if tensor.dtype == tf.string else
                               np.dtype(tensor.dtype.as_numpy_dtype), dims))
            feeds.append(tensor._as_tf_output())
        self._feeds = feeds
        self._fetches = [graph.get_tensor_by_name(name)._as_tf_output()
                         for name in fetch_names]
        self._callable = None
        self._lock = threading.Lock()
        session._extend_graph()  # as session.run does before running

    def run(self, values, timeout_ms=None):
        """values: one ndarray per feed -> one ndarray per fetch."""
        if timeout_ms is None:
            return self._get_callable()(*values)
        options = pywrap_tf_session.TF_NewBufferFromString(
            config_pb2.RunOptions(timeout_in_ms=timeout_ms).SerializeToString())
        try:
            # What session.run calls once it has resolved its feeds and fetches.
            return pywrap_tf_session.TF_SessionRun_wrapper(
                self._session._session, options,
                dict(zip(self._feeds, values)), self._fetches, [], None)
        finally:
            pywrap_tf_session.TF_DeleteBuffer(options)

    def _get_callable(self):
        if self._callable is None:
            with self._lock:
                if self._callable is None:
                    options = config_pb2.CallableOptions(feed=list(self._feed_names),
                                                         fetch=list(self._fetch_names))
                    # TF's own wrapper of Session::MakeCallable (Keras used it); the
                    # public make_callable(fetches, feed_list) falls back to session.run
                    # with a feed dict
                    self._callable = self._session._make_callable_from_options(options)
        return self._callable
