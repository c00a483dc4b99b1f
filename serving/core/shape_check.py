"""Keeps a fed shape the graph was never built for from reaching a kernel that aborts.

TF Serving feeds a request's tensors to Session::Run whatever their shape, and so does
this server: half_plus_two's `x` is [-1, 1], yet [3] runs. Most kernels refuse a shape
they cannot take with INVALID_ARGUMENT, but some CHECK-fail and abort the process (a
scalar fed to an image model's NHWC ops: `tensor_format.h Check failed: index >= 0 &&
index < num_total_dims`), which takes tensorflow_model_server down too. Here a fed shape
incompatible with the fed tensor's static shape (the only shapes the graph's ops were
checked for when it was built) first goes through TensorFlow's own shape inference: the
signature's subgraph is imported with the fed tensors replaced by placeholders of the fed
shapes. If the ops' shape functions refuse it, the request is INVALID_ARGUMENT with their
message; if they accept it, it runs, as in TF Serving.

Compatible shapes (every request a graph was exported for) cost one comparison. The
verdict for an incompatible shape is kept (least recently used dropped past MAX_VERDICTS
per version), and checks run one at a time, so a client inventing shapes costs at most
one core.
"""
import collections
import threading
import weakref

import tensorflow as tf

from slimserve.serving.core import errors

MAX_VERDICTS = 256  # kept per loaded version
_LOCK = threading.Lock()  # one shape inference at a time, whatever the version
_STATE = weakref.WeakKeyDictionary()  # Servable -> _VersionState


class _VersionState:
    def __init__(self):
        self.graph_def = None
        self.subgraphs = {}  # output node names -> GraphDef
        self.verdicts = collections.OrderedDict()  # key -> error message or None


def _planned_shape(static, fed):
    """The shape to infer with: the fed dimensions where the static shape fixes one (or
    has another rank), unknown where the graph takes any size."""
    if static.rank is not None and static.rank == len(fed):
        return tuple(None if s is None else f for s, f in zip(static.as_list(), fed))
    return tuple(fed)


def check(servable, signature_def, feeds, output_keys):
    """Raises INVALID_ARGUMENT when TensorFlow's shape inference refuses the fed shapes
    for the fetched outputs; returns at once when every shape fits the graph (and for a
    version without a TensorFlow graph: TFLite resizes its inputs itself)."""
    graph = getattr(servable, "graph", None)
    if graph is None:
        return
    plan, compatible = [], True
    for key in sorted(feeds):
        name = signature_def.inputs[key].name
        try:
            tensor = graph.get_tensor_by_name(name)
        except (KeyError, ValueError):
            return  # the run itself reports a signature naming no tensor
        fed = feeds[key].shape
        if tensor.shape.is_compatible_with(fed):
            plan.append((name, tensor.dtype, None if tensor.shape.rank is None else
                         tuple(tensor.shape.as_list())))
        else:
            compatible = False
            plan.append((name, tensor.dtype, _planned_shape(tensor.shape, fed)))
    if compatible:
        return
    outputs = tuple(sorted(signature_def.outputs[k].name for k in output_keys))
    verdict_key = (tuple(plan), outputs)
    with _LOCK:
        state = _STATE.get(servable)
        if state is None:
            state = _STATE[servable] = _VersionState()
        if verdict_key in state.verdicts:
            state.verdicts.move_to_end(verdict_key)
            message = state.verdicts[verdict_key]
        else:
            message = _infer(graph, state, plan, outputs)
            state.verdicts[verdict_key] = message
            while len(state.verdicts) > MAX_VERDICTS:
                state.verdicts.popitem(last=False)
    if message:
        raise errors.invalid("%s", message)


def _infer(graph, state, plan, outputs):
    """-> the shape functions' refusal, or None when they accept the fed shapes."""
    nodes = tuple(sorted({name.split(":")[0] for name in outputs}))
    subgraph = state.subgraphs.get(nodes)
    if subgraph is None:
        if state.graph_def is None:
            state.graph_def = graph.as_graph_def()
        subgraph = tf.compat.v1.graph_util.extract_sub_graph(state.graph_def, list(nodes))
        state.subgraphs[nodes] = subgraph
    present = {node.name for node in subgraph.node}
    with tf.Graph().as_default():
        input_map = {name: tf.compat.v1.placeholder(dtype, shape=shape)
                     for name, dtype, shape in plan if name.split(":")[0] in present}
        try:
            tf.graph_util.import_graph_def(subgraph, input_map=input_map,
                                           return_elements=list(outputs), name="")
        except (ValueError, tf.errors.OpError) as error:
            text = getattr(error, "message", None) or str(error)
            return " ".join(line.strip() for line in text.strip().splitlines()[:2])
    return None
