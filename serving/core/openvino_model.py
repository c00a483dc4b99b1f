"""The OpenVINO IR of a slimserve SavedModel: where the network is cut out of the graph,
how it is converted, written and read back.

Every signature of a slimserve export runs through one decoded-images tensor (the
`predict_images` input, export/receivers.py): JPEG decoding and tf.Example parsing sit
above it, the network below it, and string work (class names) after the network's
numeric outputs. The cut is found in the loaded graph, not assumed:

    images   the `predict_images` signature's input (float [None, H, W, 3], 0..255)
    outputs  walking back from every signature's outputs, the first tensors that are
             numeric and computed from `images` (classes, probabilities, embeddings,
             a shape the classify signature tiles its class names by)

The IR maps `images` to `outputs` (preprocessing included) and names its input and
outputs by those graph tensors, so a servable can feed the rest of the graph with them.
A graph that has no `predict_images` signature, or whose outputs do not all pass through
such tensors, raises NotConvertible. Import of openvino happens here only.
"""
import os

import numpy as np
import tensorflow as tf

from slimserve import conventions

MODEL_FILE = conventions.OPENVINO_MODEL
INT8_MODEL_FILE = conventions.OPENVINO_INT8_MODEL
FP32, BF16, INT8 = "fp32", "bf16", "int8"
PRECISIONS = (FP32, BF16, INT8)
OUTPUT_NODE = "slimserve_network_output_%d"  # the Identity behind each Cut output
_RUNTIME = []  # the openvino module once imported (lazily: a TF-only server never pays)


class NotConvertible(Exception):
    """This model or this machine cannot run the network on OpenVINO."""


def runtime():
    """The openvino module; NotConvertible saying why when this Python has none."""
    if not _RUNTIME:
        try:
            import openvino  # pylint: disable=import-outside-toplevel,import-error
        except ImportError as error:  # Python 3.9, or an install without it
            raise NotConvertible(
                "openvino is not installed (%s); its wheels need Python >= 3.10: pip "
                "install 'openvino>=2025,<2027'" % error) from None
        _RUNTIME.append(openvino)
    return _RUNTIME[0]


class Cut:
    """Where the network starts and ends in a loaded graph: `images` (tensor name) and
    `outputs` (tensor names, sorted)."""

    def __init__(self, images, outputs):
        self.images = images
        self.outputs = tuple(outputs)

    def __eq__(self, other):
        return (self.images, self.outputs) == (other.images, other.outputs)

    def __repr__(self):
        return "Cut(%r, %r)" % (self.images, self.outputs)


def find_cut(graph, signature_defs):
    """The Cut of a loaded SavedModel graph (see the module docstring)."""
    images_sig = signature_defs.get(conventions.PREDICT_IMAGES)
    if images_sig is None or conventions.IMAGES not in images_sig.inputs:
        raise NotConvertible("no %r signature with input %r: the network's input is not "
                             "known" % (conventions.PREDICT_IMAGES, conventions.IMAGES))
    images = graph.get_tensor_by_name(images_sig.inputs[conventions.IMAGES].name)
    below = computed_from(images)
    outputs = set()
    for signature_def in signature_defs.values():
        for info in signature_def.outputs.values():
            _walk_back(graph.get_tensor_by_name(info.name), below, outputs)
    outputs.discard(images)
    if not outputs:
        raise NotConvertible("no signature output is computed from %s" % images.name)
    return Cut(images.name, sorted(t.name for t in outputs))


def computed_from(tensor):
    """Every tensor whose value depends (through data edges) on `tensor`."""
    seen, todo = {tensor}, [tensor]
    while todo:
        for consumer in todo.pop().consumers():
            for out in consumer.outputs:
                if out not in seen:
                    seen.add(out)
                    todo.append(out)
    return seen


def _walk_back(tensor, below, found):
    """Adds to `found` the first numeric tensors computed from the images on every path
    back from `tensor`; string tensors are walked through (TensorFlow computes them)."""
    stack, seen = [tensor], set()
    while stack:
        current = stack.pop()
        if current in seen or current not in below:
            continue  # not computed from the images: TensorFlow has it without them
        seen.add(current)
        if current.dtype != tf.string and current.dtype.base_dtype != tf.resource:
            found.add(current)
            continue
        stack.extend(current.op.inputs)


def frozen_network(session, cut):
    """The GraphDef from `cut.images` (now a Placeholder) to `cut.outputs`, each output
    behind an Identity named OUTPUT_NODE % its index (the graph's only sinks, which is
    what the converter makes outputs of), variables as constants: what OpenVINO
    converts."""
    graph_def = session.graph.as_graph_def()
    images_op = cut.images.split(":")[0]
    images = session.graph.get_tensor_by_name(cut.images)
    for index, name in enumerate(cut.outputs):
        node = graph_def.node.add(name=OUTPUT_NODE % index, op="Identity")
        op_name, _, port = name.rpartition(":")
        node.input.append(op_name if port == "0" else name)
        node.attr["T"].type = session.graph.get_tensor_by_name(name).dtype.as_datatype_enum
    sinks = [OUTPUT_NODE % index for index in range(len(cut.outputs))]
    for node in graph_def.node:
        if node.name == images_op:
            node.op = "Placeholder"
            del node.input[:]
            for key in list(node.attr):
                if key not in ("dtype", "shape"):
                    del node.attr[key]
            node.attr["dtype"].type = images.dtype.as_datatype_enum
            node.attr["shape"].shape.CopyFrom(images.shape.as_proto())
    graph_def = tf.compat.v1.graph_util.extract_sub_graph(graph_def, sinks)
    # The variables' values are read from `session`, by name (the pruned graph keeps them).
    return tf.compat.v1.graph_util.convert_variables_to_constants(session, graph_def, sinks)


def convert(session, cut):
    """An openvino.Model of the network of a loaded SavedModel, its input named by
    `cut.images` and its outputs by `cut.outputs` (in that order)."""
    ov = runtime()
    graph_def = frozen_network(session, cut)
    try:
        model = ov.convert_model(graph_def)
    except Exception as error:  # pylint: disable=broad-except  (OpConversionFailure, ...)
        raise NotConvertible("openvino.convert_model failed: %s" % first_line(error)) \
            from None
    by_sink = {}
    for port in model.outputs:
        for name in port.get_names():
            if name.startswith(OUTPUT_NODE.split("%")[0]):
                by_sink[int(name.split("_")[-1].split(":")[0])] = port
    if len(model.inputs) != 1 or sorted(by_sink) != list(range(len(cut.outputs))):
        raise NotConvertible("openvino.convert_model gave %d inputs and outputs %s for 1 "
                             "input and %d outputs" % (len(model.inputs), sorted(by_sink),
                                                       len(cut.outputs)))
    model.inputs[0].get_tensor().set_names({cut.images})
    for index, name in enumerate(cut.outputs):
        by_sink[index].get_tensor().set_names({name})
    return model


def names(model):
    """(input tensor name, output tensor names in order) an IR carries (convert's)."""
    def name_of(port):
        found = sorted(n for n in port.get_names() if ":" in n)
        return found[0] if found else port.get_any_name()
    return name_of(model.inputs[0]), tuple(name_of(port) for port in model.outputs)


def ordered(model, cut):
    """`model` whose outputs carry exactly `cut`'s names (any order); NotConvertible
    naming what differs otherwise (an IR of another export, or edited)."""
    if len(model.inputs) != 1:
        raise NotConvertible("the IR has %d inputs, not 1" % len(model.inputs))
    images, outputs = names(model)
    if images != cut.images or sorted(outputs) != sorted(cut.outputs):
        raise NotConvertible("the IR maps %s -> %s, the SavedModel's network is %s -> %s"
                             % (images, ", ".join(outputs), cut.images,
                                ", ".join(cut.outputs)))
    return model


def has_model(version_dir, filename=MODEL_FILE):
    return tf.io.gfile.exists(os.path.join(version_dir, filename))


def read(version_dir, filename=MODEL_FILE):
    """The IR `<version_dir>/<filename>` (+ its .bin) as an openvino.Model."""
    ov = runtime()
    path = os.path.join(version_dir, filename)
    try:
        return ov.Core().read_model(path)
    except Exception as error:  # pylint: disable=broad-except  (RuntimeError of the reader)
        raise NotConvertible("%s does not read: %s" % (filename, first_line(error))) \
            from None


def save(model, version_dir, filename=MODEL_FILE):
    """Writes the IR (`.xml` + `.bin`, weights as they are: no fp16 compression) under
    `version_dir`; each file written beside and renamed into place."""
    path = os.path.join(version_dir, filename)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    temp = os.path.join(folder, ".tmp-%d-%s" % (os.getpid(), os.path.basename(path)))
    runtime().save_model(model, temp, compress_to_fp16=False)
    os.replace(temp[:-len(".xml")] + ".bin", path[:-len(".xml")] + ".bin")
    os.replace(temp, path)
    return path


def compile_model(model, precision=FP32, num_streams=0):
    """An openvino.CompiledModel on the CPU computing in `precision` (fp32 or bf16; an
    int8 IR computes in int8 whatever the hint). NotConvertible when it does not compile."""
    config = {"INFERENCE_PRECISION_HINT": "bf16" if precision == BF16 else "f32",
              "PERFORMANCE_HINT": "LATENCY"}
    if num_streams:
        config["NUM_STREAMS"] = str(num_streams)
    try:
        return runtime().Core().compile_model(model, "CPU", config)
    except Exception as error:  # pylint: disable=broad-except  (RuntimeError: no plugin...)
        raise NotConvertible("the CPU plugin does not compile it: %s" % first_line(error)) \
            from None


def run_compiled(request, images):
    """One synchronous inference on an InferRequest: images float32 [B,H,W,3] -> the
    outputs as numpy arrays, in the model's order (copies: the request's buffers are
    reused by its next run)."""
    request.infer({0: np.ascontiguousarray(images, np.float32)}, share_inputs=True)
    return [np.array(request.get_output_tensor(index).data)
            for index in range(len(request.model_outputs))]


def first_line(error):
    """The first line of an OpenVINO error that says something (its C++ messages start
    with lines naming the source file that threw)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    told = [line for line in lines if not line.startswith("Exception from src/")]
    return (told or lines or [type(error).__name__])[0][:300]

