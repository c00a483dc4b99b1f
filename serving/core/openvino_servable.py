"""A version whose network runs on OpenVINO (--prefer_openvino_model, or model_platform
"openvino" in the model config), behind the same signatures as its SavedModel.

    servable = OpenVinoServable("resnet", 3, "/models/resnet/3", options=OpenVinoOptions())
    outputs = servable.run(signature_def, {"image_bytes": images}, ["classes"])

The SavedModel is loaded as for TensorFlow (its signatures, its decoding and parsing
ops, its string lookups); the network between the decoded images and its numeric outputs
(core/openvino_model.py's Cut) runs on OpenVINO. A run of any signature is at most three
steps, each once per (batched) request:

    TensorFlow  the signature's inputs -> decoded images (JPEG decoding, tf.Example
                parsing; skipped when the images are the input: predict_images)
    OpenVINO    images -> the Cut's outputs
    TensorFlow  those outputs (fed) -> the signature's outputs (class names, ...); skipped
                when every output asked for is one of them

A run holds one of the version's InferRequests (one per OpenVINO stream) through all three
steps, so runs on a stream never put TensorFlow's threads on the cores it computes on.

The IR is `<version>/openvino/model.xml` (slimserve-export writes it); a version without
one is converted at load. Whatever keeps OpenVINO from serving the version (no openvino
in this Python, an IR that does not read or match the graph, a CPU plugin that does not
compile it) is one warning line, and TensorFlow serves the version: `runtime` says which.
"""
import dataclasses
import logging
import queue
import time

import grpc
import numpy as np
from tensorflow.core.protobuf import meta_graph_pb2

from slimserve import cpu
from slimserve import fields
from slimserve.serving.core import errors
from slimserve.serving.core import openvino_model
from slimserve.serving.core import tensors
from slimserve.serving.core.servable import Servable

FP32, BF16, INT8 = openvino_model.FP32, openvino_model.BF16, openvino_model.INT8
TENSORFLOW, OPENVINO = "tensorflow", "openvino"
MAX_STREAMS = 1024  # bounds --openvino_num_streams (each stream holds its own buffers)
_NETWORK_KEY = "__openvino_%d"  # aliases of the fed Cut outputs in the last TF step


@dataclasses.dataclass
class OpenVinoOptions:
    """How an OpenVINO version computes: --openvino_precision, --openvino_num_streams."""
    precision: str = fields.option(
        FP32, "What the OpenVINO runtime computes in: fp32; bf16 where the CPU has "
        "AVX512_BF16 or AMX (else fp32, said once per version); int8 from the version's "
        "openvino/model_int8.xml, which slimserve-export --openvino_int8 writes when it "
        "passes its accuracy guard (else fp32, said once per version).",
        choices=openvino_model.PRECISIONS, flag="openvino_precision")
    num_streams: int = fields.option(
        0, "OpenVINO CPU streams per version (requests it runs at once, the cores split "
        "among them); 0: its latency hint (one stream over every core).",
        bound=fields.Bound(0, MAX_STREAMS), flag="openvino_num_streams")

    def check(self):
        """Returns self; a UserError naming the flag out of bounds."""
        return fields.check(self)


class OpenVinoServable(Servable):
    """A Servable (acquire, release, retire, signature, run, warm_up) whose network runs on
    OpenVINO; `runtime` is "tensorflow" when it could not (the reason logged once)."""
    runtime = OPENVINO

    def __init__(self, name, version, path, session_config=None, tags=None, options=None):
        self.options = fields.check(options if options is not None else OpenVinoOptions())
        super().__init__(name, version, path, session_config, tags)
        self.cut = None
        self._below = frozenset()  # names of the graph's tensors computed from the images
        self._requests = None  # queue of openvino InferRequests
        self._outputs = ()  # the Cut's output names in the compiled model's order
        try:
            self._prepare()
        except Exception as error:  # pylint: disable=broad-except  (TF still serves it)
            reason = str(error) if isinstance(error, openvino_model.NotConvertible) else \
                "%s: %s" % (type(error).__name__, openvino_model.first_line(error))
            logging.warning("model %s version %d: OpenVINO cannot serve it (%s); "
                            "TensorFlow serves it", name, version, reason)
            self.runtime = TENSORFLOW
            self._requests = None

    def _prepare(self):
        openvino_model.runtime()
        cut = openvino_model.find_cut(self.graph, self.signatures)
        precision, model = self.options.precision, None
        if precision == INT8:
            if openvino_model.has_model(self.path, openvino_model.INT8_MODEL_FILE):
                model = openvino_model.ordered(openvino_model.read(
                    self.path, openvino_model.INT8_MODEL_FILE), cut)
            else:
                logging.warning("model %s version %d: no %s (slimserve-export "
                                "--openvino_int8 writes it when int8 passes its accuracy "
                                "guard); OpenVINO runs it in fp32", self.name, self.version,
                                openvino_model.INT8_MODEL_FILE)
                precision = FP32
        if precision == BF16 and not cpu.cpu_supports_bf16():
            logging.warning("model %s version %d: bf16 is not available on this CPU (no "
                            "AVX512_BF16 or AMX); OpenVINO runs it in fp32", self.name,
                            self.version)
            precision = FP32
        if model is None:
            if openvino_model.has_model(self.path):
                model = openvino_model.ordered(openvino_model.read(self.path), cut)
            else:
                started = time.monotonic()
                model = openvino_model.convert(self.session, cut)
                logging.info("model %s version %d: no %s, converted at load in %.1f s",
                             self.name, self.version, openvino_model.MODEL_FILE,
                             time.monotonic() - started)
        compiled = openvino_model.compile_model(model, precision, self.options.num_streams)
        self._outputs = openvino_model.names(model)[1]
        try:
            count = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        except RuntimeError:
            count = 1
        requests = queue.LifoQueue()
        for _ in range(max(count, 1)):
            requests.put(compiled.create_infer_request())
        self.cut, self.precision, self._requests = cut, precision, requests
        images = self.graph.get_tensor_by_name(cut.images)
        self._below = frozenset(t.name for t in openvino_model.computed_from(images))

    def run(self, signature_def, feeds, output_keys, deadline=None):
        """As Servable.run; the network on OpenVINO (see the module docstring)."""
        fetches = {key: signature_def.outputs[key].name for key in output_keys}
        if self._requests is None or not any(name in self._below
                                             for name in fetches.values()):
            return super().run(signature_def, feeds, output_keys, deadline)
        # The whole run holds an InferRequest, its TensorFlow steps too: a second batch's
        # JPEG decoding on the cores OpenVINO's threads compute on slowed both (served
        # int8 at 224 on 2 cores lost about a tenth). The waiting batch keeps gathering.
        try:
            request = self._requests.get(
                timeout=None if deadline is None else max(0.0, deadline.remaining()))
        except queue.Empty:
            raise deadline.exceeded() from None
        try:
            return self._run(request, signature_def, feeds, output_keys, fetches, deadline)
        finally:
            self._requests.put(request)

    def _run(self, request, signature_def, feeds, output_keys, fetches, deadline):
        cut = self.cut
        fed_images = [key for key in feeds if signature_def.inputs[key].name == cut.images]
        if fed_images:
            images = np.asarray(feeds[fed_images[0]])
        else:  # decode / parse in TensorFlow, once for the whole batch
            front = meta_graph_pb2.SignatureDef()
            for key in feeds:
                front.inputs[key].CopyFrom(signature_def.inputs[key])
            front.outputs["images"].name = cut.images
            images = super().run(front, feeds, ["images"], deadline)["images"]
        if images.ndim != 4 or images.shape[0] == 0:  # TF's own message or empty answer
            return super().run(signature_def, feeds, output_keys, deadline)
        if deadline is not None and deadline.remaining() <= 0:
            raise deadline.exceeded()
        values = dict(zip(self._outputs, self._infer(request, images)))
        out, rest = {}, []
        for key, name in fetches.items():
            if name in values:
                out[key] = values[name].astype(tensors.signature_dtype(
                    signature_def.outputs[key]).as_numpy_dtype, copy=False)
            else:
                rest.append(key)
        if rest:  # what follows the network (class names): TensorFlow, the network fed
            back = meta_graph_pb2.SignatureDef()
            back_feeds = {}
            for key in feeds:
                if key not in fed_images:
                    back.inputs[key].CopyFrom(signature_def.inputs[key])
                    back_feeds[key] = feeds[key]
            for index, name in enumerate(self._outputs):
                alias = _NETWORK_KEY % index
                back.inputs[alias].name = name
                back_feeds[alias] = values[name]
            for key in rest:
                back.outputs[key].CopyFrom(signature_def.outputs[key])
            out.update(super().run(back, back_feeds, rest, deadline))
        return {key: out[key] for key in output_keys}

    def _infer(self, request, images):
        """The network on the run's InferRequest."""
        expected = self.graph.get_tensor_by_name(self.cut.images).shape.as_list()
        if any(want is not None and want != got
               for want, got in zip(expected, images.shape)) or len(expected) != images.ndim:
            raise errors.invalid("images of shape %s where the model takes %s",
                                 list(images.shape), ["?" if d is None else d
                                                      for d in expected])
        try:
            return openvino_model.run_compiled(request, images)
        except RuntimeError as error:
            raise errors.ServingError(grpc.StatusCode.INTERNAL, "OpenVINO: %s" % (
                str(error).strip().splitlines() or ["inference failed"])[0]) from None

