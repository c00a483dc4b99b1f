"""What Predict, Classify, Regress, MultiInference, GetModelMetadata and GetModelStatus do,
independent of transport: gRPC (grpc_service.py) and REST (rest_api.py) both call these.

Status codes and messages follow TF Serving 2.15.1 (servables/tensorflow/predict_util.cc,
classifier.cc, regressor.cc, multi_inference.cc, model_servers/server_core.cc), so a client
that branches on them behaves the same against either server.
"""
import contextlib
import logging
import time

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from slimserve import errors as user_errors
from slimserve.serving.core import empty_batch
from slimserve.serving.core import errors
from slimserve.serving.core import shape_check
from slimserve.serving.observability import request_window
from slimserve.serving.core import tensors

DEFAULT_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
PREDICT_METHOD = tf.saved_model.PREDICT_METHOD_NAME
CLASSIFY_METHOD = tf.saved_model.CLASSIFY_METHOD_NAME
REGRESS_METHOD = tf.saved_model.REGRESS_METHOD_NAME
INPUTS, CLASSES, SCORES, OUTPUTS = "inputs", "classes", "scores", "outputs"
# Longest model, signature or version-label name a request may carry: far above any real
# one, and checked before a name reaches an error message, a metric or a log.
MAX_NAME_LENGTH = 1024


def check_names(**names):
    """INVALID_ARGUMENT for a request name longer than MAX_NAME_LENGTH (keyword: what the
    name is, e.g. model=..., signature=...)."""
    for kind, name in names.items():
        if name and len(name) > MAX_NAME_LENGTH:
            raise errors.invalid("%s name of %d characters is longer than this server's "
                                 "limit of %d", kind.replace("_", " "), len(name),
                                 MAX_NAME_LENGTH)


def _error(code, message, *args):
    return errors.ServingError(code, message % args if args else message)


def _describe(signature_name, sig):
    """The SignatureDef as TF Serving prints it in its messages (DebugString: protobuf's
    text format, which Python's text_format writes alike)."""
    del signature_name
    return text_format.MessageToString(sig)


def _shape_string(shape):
    """TensorShape::DebugString: `[2,3]`."""
    return "[%s]" % ",".join(str(d) for d in shape)


def _datatype_name(array):
    """DataType_Name of an output's dtype: `DT_INT32`, `DT_STRING`."""
    return types_pb2.DataType.Name(tensors.array_dtype(array).as_datatype_enum)


def _check_one_input(signature_name, sig, method_name_check, kind, method, outputs,
                     outputs_error):
    """The checks classifier.cc and regressor.cc both make first, in their order: the
    method name (when checked), one input, `outputs` (the allowed output counts; else
    outputs_error(count)), then the `inputs` key; `kind` names the signature."""
    if method_name_check and sig.method_name != method:
        raise errors.invalid("Expected %s signature method_name to be %s. Was: %s",
                             kind, method, sig.method_name)
    if len(sig.inputs) != 1:
        raise errors.invalid("Expected one input Tensor.")
    if len(sig.outputs) not in outputs:
        raise errors.invalid(outputs_error(len(sig.outputs)))
    if INPUTS not in sig.inputs:
        raise errors.invalid("No %s inputs found in SignatureDef: %s", kind,
                             _describe(signature_name, sig))


def check_classification_signature(signature_name, sig, method_name_check):
    """-> output keys to fetch; raises as classifier.cc's PreProcessClassification."""
    _check_one_input(signature_name, sig, method_name_check, "classification",
                     CLASSIFY_METHOD, (1, 2),
                     lambda count: "Expected one or two output Tensors, found %d" % count)
    keys = [k for k in (CLASSES, SCORES) if k in sig.outputs]
    if not keys:
        raise errors.invalid("Expected classification signature outputs to contain at least "
                             "one of \"classes\" or \"scores\". Signature was: %s",
                             _describe(signature_name, sig))
    return keys


def check_regression_signature(signature_name, sig, method_name_check):
    """-> output keys to fetch; raises as regressor.cc's PreProcessRegression."""
    _check_one_input(signature_name, sig, method_name_check, "regression", REGRESS_METHOD,
                     (1,), lambda count: "Expected one output Tensor.")
    if OUTPUTS not in sig.outputs:
        raise errors.invalid("No regression outputs found in SignatureDef: %s",
                             _describe(signature_name, sig))
    return [OUTPUTS]


def classification_result(rows, classes, scores):
    """Validates classify outputs as PostProcessClassificationResult does."""
    for name, array, kind in ((CLASSES, classes, "DT_STRING"), (SCORES, scores, "DT_FLOAT")):
        if array is None:
            continue
        if array.ndim != 2:
            raise errors.invalid("Expected Tensor shape: [batch_size num_classes] but got %s",
                                 _shape_string(array.shape))
        if _datatype_name(array) != kind:
            raise errors.invalid("Expected %s Tensor of %s. Got: %s", name, kind,
                                 _datatype_name(array))
        if array.shape[0] != rows:
            raise errors.invalid("Expected %s output batch size of %d. Got: %d", name, rows,
                                 array.shape[0])
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise errors.invalid("Tensors class and score should match in dim_size(1). Got %d vs. %d",
                             classes.shape[1], scores.shape[1])
    return classes, scores


def regression_result(rows, outputs):
    """Validates a regress output as PostProcessRegressionResult does; -> float32 [B]."""
    if not (outputs.ndim == 1 or (outputs.ndim == 2 and outputs.shape[1] == 1)):
        raise errors.invalid("Expected output Tensor shape to be either [batch_size] or "
                             "[batch_size, 1] but got %s", _shape_string(outputs.shape))
    if outputs.shape[0] != rows:
        raise errors.invalid("Input batch size did not match output batch size: %d vs. %d",
                             rows, outputs.shape[0])
    if _datatype_name(outputs) != "DT_FLOAT":
        raise errors.invalid("Expected output Tensor of DT_FLOAT.  Got: %s",
                             _datatype_name(outputs))
    return outputs.reshape([rows])


def check_input_keys(sig, given):
    """The request's input aliases against the signature, with TF Serving's statuses
    (predict_util.cc VerifyRequestInputsSize, then saved_model::GetInputValues)."""
    expected, given = set(sig.inputs), set(given)
    if len(given) > len(expected) or (len(given) < len(expected) and not sig.defaults):
        raise errors.invalid(
            "input size does not match signature: %d!=%d len({%s}) != len({%s}). "
            "Sent extra: {%s}. Missing but required: {%s}.", len(given), len(expected),
            ",".join(sorted(given)), ",".join(sorted(expected)),
            ",".join(sorted(given - expected)), ",".join(sorted(expected - given)))
    for alias in sorted(expected - given):
        if alias not in sig.defaults:
            raise errors.invalid(
                "Signature input alias: %s(feed name: %s) not found in request and no "
                "default value provided. Inputs expected to be in the request {%s}, or "
                "default input alias set: %s", alias, sig.inputs[alias].name,
                ",".join(sorted(given)), ",".join(sorted(sig.defaults)))
    if given - expected:
        raise errors.invalid("Inputs contains invalid name. Used request inputs: %s, request "
                             "input: %s", ",".join(sorted(given & expected)),
                             ",".join(sorted(given)))


def check_feed_dtypes(servable, sig, feeds):
    """Session::Run's check (FunctionCallFrame::SetArgs): each fed value has the dtype of
    the tensor it feeds, else "Expects arg[i] to be float but int32 is provided". The
    fed tensor's dtype is read from the graph, as TF does (a SignatureDef may misstate it).
    A TFLite version (no graph) checks its own inputs, as TF Serving's TfLiteSession."""
    graph = getattr(servable, "graph", None)
    if graph is None:
        return
    for index, key in enumerate(sorted(feeds)):
        info = sig.inputs[key]
        try:
            expected = graph.get_tensor_by_name(info.name).dtype.base_dtype
        except (KeyError, ValueError):
            expected = tensors.signature_dtype(info)
        given = tensors.array_dtype(feeds[key])
        if given != expected:
            raise errors.invalid("Expects arg[%d] to be %s but %s is provided", index,
                                 tensors.type_string(expected), tensors.type_string(given))


class _Call:
    """What `observe` learns about one request while it runs."""
    __slots__ = ("version", "signature")

    def __init__(self):
        self.version = None
        self.signature = ""


class InferenceService:
    """The APIs over one ModelManager, transport-free: the gRPC servicers and the REST
    routes call it; a test can too, in process (slimserve/testing/inprocess.py)."""

    def __init__(self, manager, batcher=None, metrics=None,
                 max_request_elements=tensors.DEFAULT_MAX_REQUEST_ELEMENTS,
                 max_broadcast_elements=tensors.DEFAULT_MAX_BROADCAST_ELEMENTS,
                 method_name_check=False, request_logs=None, window=None, in_flight=None):
        """batcher: the Batcher of core/batching/ (None: every request runs alone). metrics:
        observability/metrics.py's Metrics (None: not counted).
        max_request_elements / max_broadcast_elements: per-request element limits
        (serving/core/tensors.py says why). method_name_check:
        --enable_signature_method_name_check (TF Serving's default: off, so any signature
        shaped like a classify / regress one serves Classify / Regress). request_logs:
        observability/request_logs.py's RequestLogs, whose get(model) is the model's
        request logger (None: nothing logged). window: the RequestWindow of the last
        minute the status page shows (default: a new one). in_flight: core/admission.py's
        BytesInFlight every Predict, Classify, Regress and MultiInference is admitted
        through (None: unbounded)."""
        self.manager = manager
        self.batcher = batcher
        self.metrics = metrics
        self.max_request_elements = max_request_elements
        self.max_broadcast_elements = max_broadcast_elements
        self.method_name_check = method_name_check
        self.request_logs = request_logs
        self.window = window if window is not None else request_window.RequestWindow()
        self.in_flight = in_flight
        # The server's observability/drift_monitor.py DriftMonitor, whose last results
        # the status page shows (None: none).
        self.drift = None

    @contextlib.contextmanager
    def _servable(self, name, version, label, signature_name=""):
        check_names(model=name, version_label=label, signature=signature_name)
        if not name:
            raise errors.invalid("ModelSpec has no name specified.")
        servable = self.manager.acquire(name, version, label)
        try:
            yield servable
        finally:
            servable.release()

    @contextlib.contextmanager
    def observe(self, model, api, entrypoint="GRPC"):
        """Counts and times a request under its final status. Yields a record whose
        `version` and `signature` the caller fills once it knows them (per-version and
        per-signature metrics, the status page)."""
        call = _Call()
        started = time.monotonic()
        status = "OK"
        try:
            yield call
        except errors.ServingError as error:
            status = error.code.name
            raise
        except user_errors.UserError:  # answered INVALID_ARGUMENT by the API layers
            status = "INVALID_ARGUMENT"
            raise
        except Exception:  # a bug: answered INTERNAL
            status = "INTERNAL"
            raise
        finally:
            seconds = time.monotonic() - started
            if self.metrics:
                self.metrics.observe(model or "?", api, status, seconds, call.version,
                                     call.signature, entrypoint)
            self.window.add(model or "?", call.version, api, seconds, status == "OK")

    @contextlib.contextmanager
    def admitted(self, wire_bytes, model, api, entrypoint="GRPC"):
        """Holds a request's share of the bytes-in-flight budget while the block runs (the
        request is decoded, run, answered and logged in it); a refusal is raised as
        RESOURCE_EXHAUSTED before anything is decoded, and counted like any answer."""
        if self.in_flight is None:
            yield
            return
        try:
            charge = self.in_flight.acquire(wire_bytes, "%s request" % api)
        except errors.ServingError:
            with self.observe(model, api, entrypoint):
                raise
        try:
            yield
        finally:
            self.in_flight.release(charge)

    def log_request(self, model, api, build):
        """Hands a served request to the model's request logger, if it has one and samples
        this request; `build()` -> (request, response, ModelSpec that answered) runs only
        then."""
        logger = self.request_logs.get(model) if self.request_logs is not None else None
        if logger is None or not logger.sample():
            return
        try:
            request, response, model_spec = build()
        except Exception:  # pylint: disable=broad-except  (logging never fails a request)
            logging.exception("request log for %s: record not built", model)
            return
        logger.enqueue(api, request, response, model_spec)

    def _run(self, servable, signature_name, signature_def, feeds, output_keys, deadline):
        if self.batcher is not None:
            return self.batcher.run(servable, signature_name, signature_def, feeds,
                                    output_keys, deadline)
        return servable.run(signature_def, feeds, output_keys, deadline)

    def predict(self, name, version, label, signature_name, feeds, output_filter=(),
                api="predict", deadline=None):
        """feeds: {key: ndarray}, or a function of the SignatureDef returning it (gRPC and
        REST read their tensors against the signature of the very version that runs them,
        with one servable lookup) -> (version, signature name, {key: ndarray}).

        As TF Serving's predict_util.cc: the inputs must name the signature's aliases (a
        missing one may come from the signature's defaults); shapes are not checked, the
        graph decides; a dtype other than the fed tensor's is Session::Run's error.
        api: "rest_predict" answers a missing signature as TF Serving's REST API does.
        deadline (core.deadlines.Deadline or None): the run is cancelled when it passes,
        as TF Serving's RunOptions.timeout_in_ms (also for classify, regress and
        multi_inference)."""
        with self._servable(name, version, label, signature_name) as servable:
            signature_name, sig = servable.signature(signature_name, api)
            if self.method_name_check and sig.method_name not in (
                    PREDICT_METHOD, CLASSIFY_METHOD, REGRESS_METHOD):
                raise _error(grpc.StatusCode.INTERNAL,
                             "Expected prediction signature method_name to be one of {%s, %s, "
                             "%s}. Was: %s", PREDICT_METHOD, CLASSIFY_METHOD, REGRESS_METHOD,
                             sig.method_name)
            if callable(feeds):
                feeds = feeds(sig)
            check_input_keys(sig, feeds)
            feeds = self._with_defaults(sig, feeds)
            tensors.check_request_size(feeds, self.max_request_elements)
            seen = set()
            for alias in output_filter:
                if alias not in sig.outputs:
                    raise errors.invalid("output tensor alias not found in signature: %s "
                                         "Outputs expected to be in the set {%s}.", alias,
                                         ",".join(sorted(sig.outputs)))
                if alias in seen:
                    raise errors.invalid("duplicate output tensor alias: %s", alias)
                seen.add(alias)
            check_feed_dtypes(servable, sig, feeds)
            output_keys = sorted(output_filter or sig.outputs)
            shape_check.check(servable, sig, feeds, output_keys)
            outputs = empty_batch.outputs_for_no_rows(sig, feeds, output_keys)
            if outputs is None:
                outputs = self._run(servable, signature_name, sig, feeds, output_keys,
                                    deadline)
            return servable.version, signature_name, outputs

    def _with_defaults(self, sig, feeds):
        """Adds the signature's default value of every input the request left out."""
        missing = [key for key in sig.inputs if key not in feeds]
        if not missing:
            return feeds
        feeds = dict(feeds)
        feeds.update(tensors.decode_inputs({k: sig.defaults[k] for k in missing}, None,
                                           self.max_request_elements,
                                           self.max_broadcast_elements))
        return feeds

    @staticmethod
    def _examples(serialized_examples):
        if not serialized_examples:
            raise errors.invalid("Input is empty.")
        array = np.empty([len(serialized_examples)], dtype=object)
        array[:] = list(serialized_examples)
        return array

    def classify(self, name, version, label, signature_name, serialized_examples,
                 deadline=None):
        """-> (version, signature name, classes [B,C] bytes or None, scores [B,C] or None)."""
        version, signature_name, batch, outputs = self._run_examples(
            (name, version, label, signature_name), "classify",
            check_classification_signature, serialized_examples, deadline)
        classes, scores = classification_result(batch, outputs.get(CLASSES),
                                                outputs.get(SCORES))
        return version, signature_name, classes, scores

    def regress(self, name, version, label, signature_name, serialized_examples,
                deadline=None):
        """-> (version, signature name, outputs float32 [B])."""
        version, signature_name, batch, outputs = self._run_examples(
            (name, version, label, signature_name), "regress", check_regression_signature,
            serialized_examples, deadline)
        return version, signature_name, regression_result(batch, outputs[OUTPUTS])

    def _run_examples(self, spec, method, check, serialized_examples, deadline):
        """Runs a classify or regress signature (`check`ed for `method`) of the servable
        `spec` (name, version, label, signature name) names on serialized tf.Examples ->
        (version, signature name, batch size, outputs): the same steps for both; the
        servable is held only while it runs."""
        with self._servable(*spec) as servable:
            signature_name, sig = servable.signature(spec[3], method)
            keys = check(signature_name, sig, self.method_name_check)
            examples = self._examples(serialized_examples)
            outputs = self._run(servable, signature_name, sig, {INPUTS: examples}, keys,
                                deadline)
            return servable.version, signature_name, len(examples), outputs

    def multi_inference(self, tasks, serialized_examples, version=None, label=None,
                        deadline=None):
        """Several classify / regress signatures of one model over one input, run once.

        tasks: [(model name, signature name, method name)]; version / label: the first
        task's ModelSpec, which picks the servable (multi_inference_helper.cc).
        -> (model name, version, [(method, signature name as given, result)]) where result
        is (classes, scores) for classify and outputs [B] for regress."""
        model_name = tasks[0][0] if tasks else ""
        for task_model, signature_name, _ in tasks:
            check_names(model=task_model, signature=signature_name)
        with self._servable(model_name, version, label) as servable:
            seen, plans = set(), []
            feeds_sig = meta_graph_pb2.SignatureDef()
            for index, (task_model, signature_name, method) in enumerate(tasks):
                if not task_model:
                    raise errors.invalid("Found ModelSpec with an empty model name.")
                if task_model != model_name:
                    raise errors.invalid("All ModelSpecs in a MultiInferenceRequest must access "
                                         "the same model name.")
                resolved = signature_name or DEFAULT_SIGNATURE
                if resolved in seen:
                    raise errors.invalid("Duplicate evaluation of signature: %s", resolved)
                seen.add(resolved)
                _, sig = servable.signature(resolved, "multi_inference")
                if method == CLASSIFY_METHOD:
                    keys = check_classification_signature(resolved, sig, False)
                elif method == REGRESS_METHOD:
                    keys = check_regression_signature(resolved, sig, False)
                else:
                    raise _error(grpc.StatusCode.UNIMPLEMENTED,
                                 "Unsupported signature method_name: %s", method)
                feeds_sig.inputs["%d/%s" % (index, INPUTS)].CopyFrom(sig.inputs[INPUTS])
                for key in keys:
                    feeds_sig.outputs["%d/%s" % (index, key)].CopyFrom(sig.outputs[key])
                plans.append((index, method, signature_name))
            examples = self._examples(serialized_examples)
            # One feed per distinct input tensor; one fetch per distinct output tensor.
            inputs = {}
            for key, info in sorted(feeds_sig.inputs.items()):
                inputs.setdefault(info.name, key)
            fetch_keys = {}
            for key, info in sorted(feeds_sig.outputs.items()):
                fetch_keys.setdefault(info.name, key)
            run_sig = meta_graph_pb2.SignatureDef()
            for key in inputs.values():
                run_sig.inputs[key].CopyFrom(feeds_sig.inputs[key])
            for key in fetch_keys.values():
                run_sig.outputs[key].CopyFrom(feeds_sig.outputs[key])
            fetched = servable.run(run_sig, {k: examples for k in inputs.values()},
                                   sorted(fetch_keys.values()), deadline)

            def value(index, key):
                full = "%d/%s" % (index, key)
                if full not in feeds_sig.outputs:
                    return None
                return fetched[fetch_keys[feeds_sig.outputs[full].name]]

            results = []
            for index, method, signature_name in plans:
                if method == CLASSIFY_METHOD:
                    result = classification_result(len(examples), value(index, CLASSES),
                                                   value(index, SCORES))
                else:
                    result = regression_result(len(examples), value(index, OUTPUTS))
                results.append((method, signature_name, result))
            return model_name, servable.version, results

    def metadata(self, name, version, label):
        """-> (version, {signature name: SignatureDef})."""
        with self._servable(name, version, label) as servable:
            return servable.version, dict(servable.signatures)

    def status(self, name, version=None, label=None):
        """Like get_model_status_impl.cc: a version label is ignored, every version listed.
        -> [(version, state, error message, error code)], the code the load error's own
        (grpc.StatusCode value; 0 when it loaded). A background component of the model
        that is failing (core/health.py: its request log writer, its polling) puts
        INTERNAL and what fails on its AVAILABLE versions. Messages reach clients without
        server paths."""
        del label
        check_names(model=name)
        statuses = self.manager.status(name, version, with_codes=True)
        problems = ["%s failing: %s" % (component, failure.message) for component, failure
                    in sorted(self.manager.health.failing(model=name).items())]
        if self.batcher is not None and self.batcher.problem():
            problems.append(self.batcher.problem())  # loaded, but no batch can run
        if problems:  # a component the model needs cannot do its job
            problem = "; ".join(problems)
            statuses = [(number, state, message or problem,
                         code or (grpc.StatusCode.INTERNAL.value[0]
                                  if state == "AVAILABLE" else 0))
                        for number, state, message, code in statuses]
        return [(number, state, errors.scrub_paths(message) if message else message, code)
                for number, state, message, code in statuses]
