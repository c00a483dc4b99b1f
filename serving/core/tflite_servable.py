"""A version served from its `model.tflite` (--prefer_tflite_model) with TensorFlow's
own `tf.lite.Interpreter`, as TF Serving 2.15.1's TfLiteSession serves it
(servables/tensorflow/tflite_session.cc, tflite_interpreter_pool.cc).

    servable = TfLiteServable("half_plus_two", 123, "/models/half_plus_two/123")
    name, signature_def = servable.signature("serving_default")
    outputs = servable.run(signature_def, {"x": np.array([[2.0]], np.float32)}, ["y"])

What TF Serving does, and so this does:
- Signatures are the TensorFlow SignatureDefs in the model's metadata (tflite_model.py);
  a model without them gets one `serving_default` (method predict) whose keys are its
  input and output tensor names without a `:N` suffix. A signature's tensor names
  resolve to interpreter tensors by exact name, else without the `:N` suffix.
- `--num_tflite_pools` interpreters, each on one thread; a request takes a free one
  (waiting for one if all are busy), resizes its inputs to the request's shapes when they
  differ (the model's graph decides what runs), invokes and returns it.
- `--num_tflite_interpreters_per_pool` > 1 puts TF Serving's batch scheduler in front,
  the server's one scheduler (core/batching/, as TF Serving's TfLiteSession reuses its
  BasicBatchScheduler): a request's rows are split into pieces of at most 500 / n rows
  (or the model's fixed batch size), pieces of concurrent requests with the same inputs
  are merged up to that size, and one batch thread per interpreter runs them in parallel,
  each batch on a free interpreter of the pool.
- Resize, allocation and invocation failures are INTERNAL with TF Serving's messages.
Differences, each because of the Python runtime: a model with custom ops (Select TF
"Flex" ops, which TF Serving cannot run, or TF Serving's ParseExample, which the Python
interpreter has no kernel for) fails to load with a message naming them; a request whose
dtype differs from the tensor's is INVALID_ARGUMENT (TF Serving copies its bytes as is).
"""
import dataclasses
import logging
import queue
import threading

import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_shape_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from slimserve import fields
from slimserve.serving import limits
from slimserve.serving.core import batching
from slimserve.serving.core import errors
from slimserve.serving.core import health as health_lib
from slimserve.serving.core import tflite_model
from slimserve.serving.core.servable import DEFAULT_SIGNATURE, Servable

PREDICT_METHOD = tf.saved_model.PREDICT_METHOD_NAME
# TF Serving's internal::kInitialBatchSize: the scheduler's largest batch.
INITIAL_BATCH_SIZE = 500
MAX_POOLS = 1024  # bounds --num_tflite_pools (each interpreter holds its own arenas)
# TfLiteTypeToTfType: the interpreter types a signature may carry.
_TF_TYPES = {np.dtype(np.float32): tf.float32, np.dtype(np.int32): tf.int32,
             np.dtype(np.uint8): tf.uint8, np.dtype(np.int64): tf.int64,
             np.dtype(np.bytes_): tf.string, np.dtype(np.bool_): tf.bool,
             np.dtype(np.int16): tf.int16, np.dtype(np.complex64): tf.complex64,
             np.dtype(np.int8): tf.int8}


@dataclasses.dataclass
class TfLiteOptions:
    """--num_tflite_pools and --num_tflite_interpreters_per_pool (TF Serving's meaning)."""
    num_pools: int = fields.option(
        limits.CPUS, "TFLite interpreters per model.tflite, each on one thread (default: "
        "the CPUs, as TF Serving; 0 means 1).", bound=fields.Bound(0, MAX_POOLS),
        flag="num_tflite_pools")
    num_interpreters_per_pool: int = fields.option(
        1, "Above 1, TF Serving's TFLite batch scheduler: a request is split into pieces "
        "of at most 500/N rows and concurrent small requests are merged, run in parallel "
        "over the --num_tflite_pools interpreters.",
        bound=fields.Bound(0, INITIAL_BATCH_SIZE), flag="num_tflite_interpreters_per_pool")

    def check(self):
        """Returns self; a UserError naming the flag out of bounds."""
        return fields.check(self)


def _internal(message, *args):
    return errors.ServingError(grpc.StatusCode.INTERNAL, message % args if args else message)


def _legacy_name(name):
    """TfToTfLiteLegacyTensorName: early converters dropped TF's `:0` suffix."""
    return name.split(":", 1)[0]


def _resolve(names, name):
    """FixTfLiteTensorName: the interpreter tensor `name` means, exactly or legacy."""
    if name in names:
        return name
    if _legacy_name(name) in names:
        return _legacy_name(name)
    raise _internal("Unknown tensor '%s'.", name)


def _tensor_info(detail):
    """TfLiteTensorToTensorInfo: dtype, name and the model's dims (not the -1 signature)."""
    dtype = _TF_TYPES.get(np.dtype(detail["dtype"]))
    if dtype is None:
        raise _internal("Unknown TfLite type: %s", np.dtype(detail["dtype"]).name)
    info = meta_graph_pb2.TensorInfo(name=detail["name"], dtype=dtype.as_datatype_enum)
    info.tensor_shape.CopyFrom(tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=int(d)) for d in detail["shape"]]))
    return info


def _tensor_map(details, kind):
    """GetTensorInfoMap: {tensor name: (TensorInfo, index)} of the model's inputs/outputs."""
    found = {}
    for detail in details:
        if not detail["name"]:
            raise _internal("%s name missing for tensor index: %d", kind, detail["index"])
        if detail["name"] in found:
            raise errors.ServingError(grpc.StatusCode.ALREADY_EXISTS, "%s tensor name: %s has "
                                      "multiple indices" % (kind, detail["name"]))
        found[detail["name"]] = (_tensor_info(detail), detail["index"])
    return found


def _signatures(data, inputs, outputs):
    """TfLiteSession::Create's signatures: the metadata's, names checked, or one made up."""
    try:
        found = tflite_model.read_signature_defs(data)
    except ValueError as error:
        raise errors.invalid("Invalid SignatureDefs found in TfLite model: %s", error) from None
    for key, signature_def in found.items():
        for kind, infos, known in (("input", signature_def.inputs, inputs),
                                   ("output", signature_def.outputs, outputs)):
            for alias, info in infos.items():
                try:
                    info.name = _resolve(known, info.name)
                except errors.ServingError as error:
                    raise _internal("%s\n\tSignature %s %s references an unknown tensor",
                                    error.full_message, kind, alias) from None
    if found:
        return found
    logging.warning("No signature def found in TFLite model. Generating one.")
    made = meta_graph_pb2.SignatureDef(method_name=PREDICT_METHOD)
    for infos, tensors in ((made.inputs, inputs), (made.outputs, outputs)):
        for name in sorted(tensors):  # std::map order: a later `a:1` replaces `a:0`
            infos[_legacy_name(name)].CopyFrom(tensors[name][0])
    return {DEFAULT_SIGNATURE: made}


class _Interpreter:
    """One interpreter and the input shapes it is allocated for (TfLiteInterpreterWrapper)."""

    def __init__(self, data):
        # One thread per interpreter, as TF Serving: parallelism comes from the pool.
        try:
            self.interpreter = tf.lite.Interpreter(model_content=data, num_threads=1)
        except (ValueError, RuntimeError) as error:
            raise _internal("Cannot build Interpreter from buffer: %s",
                            _first_line(error)) from None
        try:
            self.interpreter.allocate_tensors()
        except (ValueError, RuntimeError, MemoryError) as error:
            raise _internal("Failed to allocate tensors: %s", _first_line(error)) from None
        self.shapes = {d["index"]: tuple(d["shape"]) for d in self.interpreter.get_input_details()}

    def run(self, feeds, output_indices):
        """feeds: [(tensor index, name, ndarray)] -> [ndarray per output index]; one event
        in a profile (--enable_profiler): TFLite's kernels are not TensorFlow ops."""
        with tf.profiler.experimental.Trace("TfLiteSession::Run"):
            return self._run(feeds, output_indices)

    def _run(self, feeds, output_indices):
        interpreter = self.interpreter
        resized = False
        for index, name, value in feeds:
            if value.shape != self.shapes.get(index):
                try:
                    interpreter.resize_tensor_input(index, list(value.shape), strict=False)
                except (ValueError, RuntimeError, OverflowError) as error:
                    self.shapes.clear()  # resize again next time, whatever it was
                    raise _internal("Failed to resize input tensor: %s to %s: %s", name,
                                    list(value.shape), _first_line(error)) from None
                resized = True
        if resized:
            try:
                interpreter.allocate_tensors()
            except (ValueError, RuntimeError, MemoryError) as error:
                self.shapes.clear()
                raise _internal("Failed to allocate tensors: %s", _first_line(error)) from None
            for index, _, value in feeds:
                self.shapes[index] = value.shape
        try:
            for index, _, value in feeds:
                interpreter.set_tensor(index, value)
            interpreter.invoke()
        except (ValueError, RuntimeError) as error:
            raise _internal("Failed to invoke TfLite interpreter: %s",
                            _first_line(error)) from None
        return [interpreter.get_tensor(index) for index in output_indices]


def _first_line(error):
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def scheduling_parameters(num_interpreters, num_interpreters_per_pool, model_batch_size):
    """TF Serving's TfLiteSession scheduler (tflite_session.cc) as BatchingParameters: a
    request is split into pieces of at most 500 / num_interpreters_per_pool rows (or the
    model's fixed batch size, when above 1), concurrent pieces with the same inputs merged
    up to that size, batch timeout 0, one batch thread per interpreter, at most 100
    batches queued per interpreter (UNAVAILABLE beyond). TF Serving also refuses a request
    above 500 rows; this server splits it like any other (up to batching.MAX_BATCH_SIZE
    rows, far above what a request's element bound lets through)."""
    piece = model_batch_size if model_batch_size > 1 else \
        -(-INITIAL_BATCH_SIZE // num_interpreters_per_pool)
    return batching.BatchingParameters(
        max_batch_size=batching.MAX_BATCH_SIZE, batch_timeout_micros=0,
        max_enqueued_batches=100 * num_interpreters, num_batch_threads=num_interpreters,
        thread_pool_name="tflite", enable_large_batch_splitting=True,
        max_execution_batch_size=piece).check("TFLite scheduling parameters")


class TfLiteSession:
    """One TFLite model: its signatures and a pool of interpreters (TfLiteSession); with
    num_interpreters_per_pool > 1, a Batcher (core/batching/) in front of the pool.

    An interpreter that fails otherwise than TF Serving's checks (anything but a
    ServingError: the runtime itself) fails its request with INTERNAL and is replaced by
    a new one, logged naming `component` and reported to `health`; when no replacement
    can be built and the pool is empty, `failure` says why and every request is INTERNAL
    at once (the manager then reloads the version)."""

    def __init__(self, data, options=None, component="TFLite interpreter pool", model=None,
                 health=None):
        options = fields.check(options if options is not None else TfLiteOptions())
        self.component, self.model = component, model
        self.health = health if health is not None else health_lib.standalone()
        self.failure = None  # why the pool has no interpreter left, or None
        self._data = data
        unsupported = tflite_model.custom_ops(data)
        if unsupported:
            raise _internal("Cannot build Interpreter from buffer: custom op(s) %s have no "
                            "kernel here (TF Serving runs the builtin ops and ParseExample, "
                            "this server's TFLite runtime the builtin ops only)",
                            ", ".join(unsupported))
        first = _Interpreter(data)
        self.inputs = _tensor_map(first.interpreter.get_input_details(), "Input")
        self.outputs = _tensor_map(first.interpreter.get_output_details(), "Output")
        self.signatures = _signatures(data, self.inputs, self.outputs)
        interpreters = [first] + [_Interpreter(data)
                                  for _ in range(max(1, options.num_pools) - 1)]
        self._pool = queue.LifoQueue()  # TF Serving's pool hands out the last returned
        for interpreter in interpreters:
            self._pool.put(interpreter)
        self._size = len(interpreters)
        self._size_lock = threading.Lock()
        self.batcher = None
        if options.num_interpreters_per_pool > 1:
            details = first.interpreter.get_input_details()
            model_batch = int(details[0]["shape"][0]) if len(details) == 1 and len(
                details[0]["shape"]) else -1
            self.batcher = batching.Batcher(
                scheduling_parameters(len(interpreters), options.num_interpreters_per_pool,
                                      model_batch), name="tflite")

    def run(self, feeds, output_names, deadline=None):
        """feeds: [(tensor name, ndarray)]; -> [ndarray per output name]. deadline: how
        long a request may wait for the scheduler (an interpreter run itself cannot be
        cancelled)."""
        resolved = []
        for name, value in feeds:
            try:
                info, index = self.inputs[_resolve(self.inputs, name)]
            except errors.ServingError as error:
                raise _internal("%s\n\tMissing input TFLite tensor: %s", error.full_message,
                                name) from None
            value = np.asarray(value)
            if info.dtype == tf.string.as_datatype_enum:
                if value.dtype.kind not in "OS":
                    raise errors.invalid("Expects arg[%s] to be string but %s is provided",
                                         name, value.dtype.name)
            elif value.dtype != tf.as_dtype(info.dtype).as_numpy_dtype:
                raise errors.invalid("Expects arg[%s] to be %s but %s is provided", name,
                                     tf.as_dtype(info.dtype).name, value.dtype.name)
            else:
                value = np.ascontiguousarray(value)
            resolved.append((index, name, value))
        resolved.sort(key=lambda feed: feed[0])  # TF Serving feeds in tensor-index order
        output_indices = []
        for name in output_names:
            try:
                output_indices.append(self.outputs[_resolve(self.outputs, name)][1])
            except errors.ServingError as error:
                raise _internal("Missing output TFLite tensor: %s: %s", name,
                                error.full_message) from None
        rows = {value.shape[0] if value.ndim else -1 for _, _, value in resolved}
        if self.batcher is None or len(rows) != 1 or min(rows) <= 0:
            # no scheduler; or scalars, empty or ragged batches: run alone, never merged
            return self._invoke(resolved, output_indices)
        names = {index: name for index, name, _ in resolved}
        outputs = self.batcher.submit(
            tuple(output_indices),
            lambda batch, _: self._invoke_batch(names, batch, output_indices),
            {index: value for index, _, value in resolved}, deadline)
        return [outputs[index] for index in output_indices]

    def _invoke(self, feeds, output_indices):
        """One run on a free interpreter of the pool (waiting while every one is busy)."""
        interpreter = self._take()
        try:
            values = interpreter.run(feeds, output_indices)
        except errors.ServingError:
            self._pool.put(interpreter)
            raise
        except Exception as error:  # pylint: disable=broad-except  (the runtime failed)
            self._replace(error)
            raise _internal("%s: the interpreter failed (%s); it was replaced",
                            self.component, _first_line(error)) from None
        self._pool.put(interpreter)
        self.health.ok(self.component)
        return values

    def _take(self):
        while True:
            if self.failure:
                raise _internal("%s: %s", self.component, self.failure)
            try:
                return self._pool.get(timeout=0.5)
            except queue.Empty:
                continue

    def _replace(self, error):
        """A new interpreter in place of one that failed; the pool shrinks when none can
        be built, and `failure` is set once it is empty."""
        self.health.failed(self.component, error, self.model)
        try:
            self._pool.put(_Interpreter(self._data))
        except Exception as rebuild:  # pylint: disable=broad-except
            with self._size_lock:
                self._size -= 1
                left = self._size
            logging.error("%s: no interpreter could replace the one that failed (%s); %d "
                          "left", self.component, _first_line(rebuild), left)
            if left <= 0:
                self.failure = "every interpreter failed (the last: %s)" % _first_line(error)
                self.health.fail(self.component, self.failure, self.model)

    def _invoke_batch(self, names, feeds, output_indices):
        """A batch of the scheduler: {tensor index: ndarray} -> {output index: ndarray},
        each output's first dimension that of the batch (else INTERNAL, as TF Serving's
        split of the outputs fails)."""
        rows = next(iter(feeds.values())).shape[0]
        values = self._invoke([(index, names[index], feeds[index]) for index in sorted(feeds)],
                              output_indices)
        if any(value.ndim == 0 or value.shape[0] != rows for value in values):
            raise _internal("Tensor split operation failed: an output's first dimension is "
                            "not the batch of %d rows", rows)
        return dict(zip(output_indices, values))

    def close(self):
        """Drops the interpreters (the servable calls this once no request is in flight)."""
        if self.batcher is not None:
            self.batcher.stop()
        while not self._pool.empty():
            self._pool.get_nowait()


class TfLiteServable(Servable):
    """A version served from `<path>/model.tflite`; a Servable (acquire, release, retire,
    signature, run, warm_up) whose session is a TfLiteSession (what TF Serving puts in the
    bundle's session), so the inference service and the batcher treat both alike.
    `TfLiteServable.load(path, options)` reads name and version off the path as
    Servable.load does."""
    # What the model_runtime gauge reports: the interpreter runs the file's own types,
    # and XLA does not apply to it.
    precision = "tflite"
    xla_jit = False
    runtime = "tflite"

    def __init__(self, name, version, path, options=None, health=None):
        """options: a TfLiteOptions (--num_tflite_pools, --num_tflite_interpreters_per_pool;
        default: its defaults). health: the core.health.Health its pool reports to."""
        self.options = options
        self.health = health
        super().__init__(name, version, path)

    @property
    def component(self):
        return "TFLite interpreter pool of model %s version %d" % (self.name, self.version)

    @property
    def failure(self):
        """Why this version can serve no request any more, or None."""
        return self.session.failure

    def _open(self, session_config, tags):
        del session_config, tags  # a TFLite model has neither
        session = TfLiteSession(tflite_model.read_model(self.path), self.options,
                                self.component, self.name, self.health)
        return session, session.signatures

    def run(self, signature_def, feeds, output_keys, deadline=None):
        """feeds: {input key: ndarray}; returns {output key: ndarray}. An interpreter run
        cannot be cancelled, so a deadline bounds only the wait before it starts."""
        if deadline is not None and deadline.remaining() <= 0:
            raise deadline.exceeded()
        values = self.session.run(
            [(signature_def.inputs[key].name, value) for key, value in feeds.items()],
            [signature_def.outputs[key].name for key in output_keys], deadline)
        return dict(zip(output_keys, values))
