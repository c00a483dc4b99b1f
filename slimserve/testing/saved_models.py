"""Writing a SavedModel from a TF1 graph, once, for every test and benchmark model.

    def build():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        return {"serving_default": signature({"x": x}, {"y": 2.0 * x})}

    path = write_saved_model(os.path.join(base, "1"), build)

`build` runs inside a fresh graph and returns {signature key: SignatureDef}; variables
are initialised (or `init` is run) and the graph is saved under the serve tag.
"""
import tensorflow as tf

PREDICT_METHOD = tf.saved_model.PREDICT_METHOD_NAME
CLASSIFY_METHOD = tf.saved_model.CLASSIFY_METHOD_NAME
REGRESS_METHOD = tf.saved_model.REGRESS_METHOD_NAME


def signature(inputs, outputs, method_name=PREDICT_METHOD):
    """A SignatureDef from {key: tensor} maps."""
    info = tf.compat.v1.saved_model.utils.build_tensor_info
    return tf.compat.v1.saved_model.signature_def_utils.build_signature_def(
        {key: info(t) for key, t in inputs.items()},
        {key: info(t) for key, t in outputs.items()}, method_name)


def write_saved_model(path, build, init=None, tags=(tf.saved_model.SERVING,)):
    """Builds `build()`'s graph and saves it at `path` (which must not exist); returns
    `path`. init: a callable returning the op that initialises the variables (default:
    global_variables_initializer)."""
    graph = tf.Graph()
    with graph.as_default():
        signatures = build()
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(init() if init is not None
                        else tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(session, list(tags),
                                                 signature_def_map=signatures)
            builder.save()
    return path
