"""gRPC PredictionService (Predict, Classify, Regress, MultiInference, GetModelMetadata)
and ModelService (GetModelStatus, HandleReloadConfigRequest) with TF Serving's
request/response protos and status codes."""
import logging

import grpc
from tensorflow_serving.apis import classification_pb2
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import inference_pb2
from tensorflow_serving.apis import model_management_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tensorflow_serving.apis import regression_pb2

from slimserve import errors as user_errors
from slimserve.serving.core import deadlines
from slimserve.serving.core import errors
from slimserve.serving.api import protos
from slimserve.serving.core import inference as service_lib
from slimserve.serving.core import tensors

_STATES = {"LOADING": get_model_status_pb2.ModelVersionStatus.LOADING,
           "AVAILABLE": get_model_status_pb2.ModelVersionStatus.AVAILABLE,
           "UNLOADING": get_model_status_pb2.ModelVersionStatus.UNLOADING,
           "END": get_model_status_pb2.ModelVersionStatus.END}


def model_spec_args(spec):
    """ModelSpec -> (name, version or None, label or None)."""
    which = spec.WhichOneof("version_choice")
    version = spec.version.value if which == "version" else None
    label = spec.version_label if which == "version_label" else None
    return spec.name, version, label


def _abort(context, error):
    context.abort(error.code, error.message)


def _internal_errors(method):
    """What escapes a method that is not a ServingError: a UserError (something in the
    request a user can fix, raised by code that validates it) answers INVALID_ARGUMENT with
    its message; anything else is a bug of the server, not the client's fault: INTERNAL,
    logged with its traceback on one line naming the request (method and model), instead of
    gRPC's UNKNOWN "Exception calling application"."""
    import functools  # pylint: disable=import-outside-toplevel

    @functools.wraps(method)
    def wrapped(self, request, context):
        try:
            return method(self, request, context)
        except user_errors.UserError as error:
            if _aborted(context):
                raise
            return _abort(context, errors.invalid("%s", error))
        except Exception as error:  # pylint: disable=broad-except
            if _aborted(context):
                raise  # context.abort's own way out
            logging.exception("gRPC %s of model %r failed", method.__name__,
                              _model_name(request))
            context.abort(grpc.StatusCode.INTERNAL, errors.scrub_paths(
                "%s: %s" % (type(error).__name__, error)))
    return wrapped


def _model_name(request):
    """The model a request names (its ModelSpec's, or its first task's), for the log."""
    spec = getattr(request, "model_spec", None)
    if spec is None and getattr(request, "tasks", None):
        spec = request.tasks[0].model_spec
    return spec.name if spec is not None else ""


def _admitted(api):
    """Admits the request through the server's bytes-in-flight budget (by its wire size,
    before anything of it is decoded) for as long as the method runs; a refusal answers
    RESOURCE_EXHAUSTED (core/admission.py)."""
    import functools  # pylint: disable=import-outside-toplevel

    def decorate(method):
        @functools.wraps(method)
        def wrapped(self, request, context):
            spec = getattr(request, "model_spec", None)
            if spec is None and getattr(request, "tasks", None):
                spec = request.tasks[0].model_spec
            try:
                with self._service.admitted(request.ByteSize(), spec.name if spec else "",
                                            api):
                    return method(self, request, context)
            except errors.ServingError as error:
                return _abort(context, error)
        return wrapped
    return decorate


def _aborted(context):
    """Whether context.abort already ended the call (grpc's context marks its state; the
    in-process stand-in keeps the code it was given)."""
    state = getattr(context, "_state", None)
    if state is not None:
        return bool(getattr(state, "aborted", False))
    code = getattr(context, "code", None)
    return code is not None and not callable(code)


def _spec_of(request):
    """The request's ModelSpec as (name, version, label); INVALID_ARGUMENT "Missing
    ModelSpec" when the request has none, as TF Serving's predict_impl.cc,
    classification_service.cc, regression_service.cc and get_model_metadata_impl.cc."""
    if not request.HasField("model_spec"):
        raise errors.invalid("Missing ModelSpec")
    return model_spec_args(request.model_spec)


def serialized_examples(input_proto):
    """tensorflow.serving.Input -> [serialized tf.Example] (the context's bytes before
    each example's, as util.cc)."""
    kind = input_proto.WhichOneof("kind")
    if kind == "example_list":
        return [e.SerializeToString() for e in input_proto.example_list.examples]
    if kind == "example_list_with_context":
        # The context's bytes, then the example's: what TF Serving feeds
        # (InputToSerializedExampleTensor); parsed, the example's features win.
        context = input_proto.example_list_with_context.context.SerializeToString()
        return [context + example.SerializeToString()
                for example in input_proto.example_list_with_context.examples]
    return []


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, service):
        self._service = service

    def _log(self, name, api, request, response, model_spec):
        """Request logging (the model's logging_config), after the answer is built."""
        self._service.log_request(name, api, lambda: (request, response, model_spec))

    @_internal_errors
    @_admitted("predict")
    def Predict(self, request, context):  # noqa: N802  (gRPC method name)
        name, version, label = model_spec_args(request.model_spec)
        try:
            with self._service.observe(name, "predict") as call:
                _spec_of(request)
                service = self._service

                def decode(sig):
                    """The aliases first, then each TensorProto parsed as TF does and
                    bounded by its payload before any array is allocated."""
                    service_lib.check_input_keys(sig, request.inputs.keys())
                    return tensors.decode_inputs(request.inputs, None,
                                                 service.max_request_elements,
                                                 service.max_broadcast_elements)

                version, sig_name, outputs = service.predict(
                    name, version, label, request.model_spec.signature_name, decode,
                    list(request.output_filter),
                    deadline=deadlines.Deadline.from_grpc(context))
                call.version, call.signature = version, sig_name
        except errors.ServingError as error:
            return _abort(context, error)
        response = predict_pb2.PredictResponse()
        protos.fill_spec(response.model_spec, name, version, sig_name)
        for key, value in outputs.items():
            tensors.fill_proto(response.outputs[key], value)
        self._log(name, "predict", request, response, response.model_spec)
        return response

    def _on_examples(self, api, request, context):
        """Runs a Classify or Regress request (`api`: "classify" or "regress"), observed
        -> (model name, version, signature name, [the results])."""
        name, version, label = model_spec_args(request.model_spec)
        with self._service.observe(name, api) as call:
            _spec_of(request)
            version, sig_name, *results = getattr(self._service, api)(
                name, version, label, request.model_spec.signature_name,
                serialized_examples(request.input), deadlines.Deadline.from_grpc(context))
            call.version, call.signature = version, sig_name
        return name, version, sig_name, results

    @_internal_errors
    @_admitted("classify")
    def Classify(self, request, context):  # noqa: N802
        try:
            name, version, sig_name, (classes, scores) = self._on_examples(
                "classify", request, context)
        except errors.ServingError as error:
            return _abort(context, error)
        response = classification_pb2.ClassificationResponse()
        protos.fill_spec(response.model_spec, name, version, sig_name)
        protos.fill_classifications(response.result, classes, scores)
        self._log(name, "classify", request, response, response.model_spec)
        return response

    @_internal_errors
    @_admitted("regress")
    def Regress(self, request, context):  # noqa: N802
        try:
            name, version, sig_name, (outputs,) = self._on_examples("regress", request, context)
        except errors.ServingError as error:
            return _abort(context, error)
        response = regression_pb2.RegressionResponse()
        protos.fill_spec(response.model_spec, name, version, sig_name)
        for value in outputs:
            response.result.regressions.add().value = float(value)
        self._log(name, "regress", request, response, response.model_spec)
        return response

    @_internal_errors
    @_admitted("multi_inference")
    def MultiInference(self, request, context):  # noqa: N802
        first = request.tasks[0].model_spec if request.tasks else None
        name, version, label = model_spec_args(first) if first else ("", None, None)
        try:
            with self._service.observe(name, "multi_inference") as call:
                tasks = [(t.model_spec.name, t.model_spec.signature_name, t.method_name)
                         for t in request.tasks]
                name, version, results = self._service.multi_inference(
                    tasks, serialized_examples(request.input), version, label,
                    deadlines.Deadline.from_grpc(context))
                call.version = version
        except errors.ServingError as error:
            return _abort(context, error)
        response = inference_pb2.MultiInferenceResponse()
        for method, sig_name, result in results:
            entry = response.results.add()
            protos.fill_spec(entry.model_spec, name, version, sig_name)
            if method == service_lib.CLASSIFY_METHOD:
                protos.fill_classifications(entry.classification_result, *result)
            else:
                for value in result:
                    entry.regression_result.regressions.add().value = float(value)
        if response.results:
            self._log(name, "multi_inference", request, response,
                      response.results[0].model_spec)
        return response

    @_internal_errors
    def GetModelMetadata(self, request, context):  # noqa: N802
        name, version, label = model_spec_args(request.model_spec)
        try:
            with self._service.observe(name, "metadata"):
                _spec_of(request)
                fields = list(request.metadata_field)
                if not fields:
                    raise errors.invalid("GetModelMetadataRequest must specify at least one "
                                         "metadata_field")
                unsupported = [f for f in fields if f != "signature_def"]
                if unsupported:
                    raise errors.invalid("Metadata field %s is not supported", unsupported[0])
                version, signature_defs = self._service.metadata(name, version, label)
        except errors.ServingError as error:
            return _abort(context, error)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        protos.fill_spec(response.model_spec, name, version)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        for key, value in signature_defs.items():
            signature_map.signature_def[key].CopyFrom(value)
        response.metadata["signature_def"].Pack(signature_map)
        return response


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    """reload_config(ModelServerConfig proto) replaces the served models (loading new
    ones before unloading old ones); None answers UNIMPLEMENTED."""

    def __init__(self, service, reload_config=None):
        self._service = service
        self._reload_config = reload_config

    @_internal_errors
    def GetModelStatus(self, request, context):  # noqa: N802
        if not request.HasField("model_spec"):
            return _abort(context, errors.invalid("Missing ModelSpec"))
        name, version, _ = model_spec_args(request.model_spec)  # a label lists all versions
        try:
            statuses = self._service.status(name, version)
        except errors.ServingError as error:
            return _abort(context, error)
        response = get_model_status_pb2.GetModelStatusResponse()
        for number, state, message, code in statuses:
            entry = response.model_version_status.add()
            entry.version = number
            entry.state = _STATES[state]
            entry.status.SetInParent()  # always present, OK when nothing failed
            if message or code:
                entry.status.error_code = code  # the load error's own code
                entry.status.error_message = message
        return response

    @_internal_errors
    def HandleReloadConfigRequest(self, request, context):  # noqa: N802
        response = model_management_pb2.ReloadConfigResponse()
        try:
            if self._reload_config is None:
                raise errors.ServingError(grpc.StatusCode.UNIMPLEMENTED,
                                          "this server does not take ReloadConfigRequest")
            if request.config.WhichOneof("config") != "model_config_list":
                raise errors.invalid("ServerModelConfig type not supported by "
                                     "HandleReloadConfigRequest. Only ModelConfigList is "
                                     "currently supported")
            self._reload_config(request.config)
        except errors.ServingError as error:
            response.status.error_code = error.code.value[0]
            response.status.error_message = error.message
            context.set_code(error.code)
            context.set_details(error.message)
        return response


def add_to_server(server, service, reload_config=None):
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionServicer(service), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(
        ModelServicer(service, reload_config), server)
