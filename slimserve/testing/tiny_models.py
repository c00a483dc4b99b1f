"""A tiny SavedModel with predict, classify and regress signatures, written by the tests.

The served chain's own exports only carry predict and classify; TF Serving's Regress,
MultiInference and request-rate tests need a model whose inference costs ~nothing and
whose answers are easy to check by hand:

    serving_default (predict):  x float [-1, 2]            -> y = x @ [[1], [2]] + 0.5  [-1, 1]
                                                              doubled = 2x             [-1, 2]
    classify (classify):        tf.Example {"x": float[2]} -> classes ["a", "b"],
                                                              scores softmax(x * scale)
    regress (regress):          tf.Example {"x": float[2]} -> outputs x0 + 2 x1 + 0.5  [-1]
"""
import os

import tensorflow as tf

PREDICT_METHOD = tf.saved_model.PREDICT_METHOD_NAME
CLASSIFY_METHOD = tf.saved_model.CLASSIFY_METHOD_NAME
REGRESS_METHOD = tf.saved_model.REGRESS_METHOD_NAME
WEIGHTS = (1.0, 2.0)
BIAS = 0.5


def expected_y(rows):
    """What serving_default's `y` (and regress's `outputs`) answer for these rows."""
    return [row[0] * WEIGHTS[0] + row[1] * WEIGHTS[1] + BIAS for row in rows]


def write_tiny_model(base_path, version=1, weights=WEIGHTS, bias=BIAS, scale=(1.0, 1.0)):
    """Writes `<base_path>/<version>/` and returns that path. Another classify `scale`
    makes a model that disagrees with the default one on some inputs (canary tests)."""
    path = os.path.join(base_path, str(version))
    graph = tf.Graph()
    with graph.as_default():
        weights = tf.compat.v1.get_variable(
            "weights", initializer=tf.constant([[float(weights[0])], [float(weights[1])]]))
        bias = tf.compat.v1.get_variable("bias", initializer=tf.constant(float(bias)))
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        y = tf.matmul(x, weights) + bias
        doubled = 2.0 * x

        examples = tf.compat.v1.placeholder(tf.string, [None], name="examples")
        parsed = tf.io.parse_example(
            examples, {"x": tf.io.FixedLenFeature([2], tf.float32)})["x"]
        scores = tf.nn.softmax(parsed * tf.constant([scale], tf.float32))
        classes = tf.tile(tf.constant([["a", "b"]]), [tf.shape(parsed)[0], 1])
        regression = tf.reshape(tf.matmul(parsed, weights) + bias, [-1])

        info = tf.compat.v1.saved_model.utils.build_tensor_info
        signatures = {
            "serving_default": tf.compat.v1.saved_model.signature_def_utils.build_signature_def(
                {"x": info(x)}, {"y": info(y), "doubled": info(doubled)}, PREDICT_METHOD),
            "classify": tf.compat.v1.saved_model.signature_def_utils.build_signature_def(
                {tf.saved_model.CLASSIFY_INPUTS: info(examples)},
                {tf.saved_model.CLASSIFY_OUTPUT_CLASSES: info(classes),
                 tf.saved_model.CLASSIFY_OUTPUT_SCORES: info(scores)}, CLASSIFY_METHOD),
            "regress": tf.compat.v1.saved_model.signature_def_utils.build_signature_def(
                {tf.saved_model.REGRESS_INPUTS: info(examples)},
                {tf.saved_model.REGRESS_OUTPUTS: info(regression)}, REGRESS_METHOD),
        }
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(
                session, [tf.saved_model.SERVING], signature_def_map=signatures)
            builder.save()
    return path


def write_tiny_versions(base_path, *versions):
    """Writes the tiny model's `versions` under `base_path` and returns `base_path`."""
    for version in versions:
        write_tiny_model(base_path, version)
    return base_path


def predict_version(channel, name, version=None):
    """The version of model `name` that answered a gRPC Predict of one row of `x`, or the
    gRPC code it failed with."""
    import grpc  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    from tensorflow_serving.apis import predict_pb2  # pylint: disable=import-outside-toplevel
    from tensorflow_serving.apis import prediction_service_pb2_grpc  # pylint: disable=import-outside-toplevel
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones([1, 2], np.float32)))
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    try:
        return stub.Predict(request, timeout=30).model_spec.version.value
    except grpc.RpcError as error:
        return error.code()


def tiny_example(x0, x1):
    """A serialized tf.Example the classify/regress signatures accept."""
    return tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[x0, x1]))}))


def _save(path, graph, signatures, init=None):
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init if init is not None else tf.compat.v1.global_variables_initializer())
        builder = tf.compat.v1.saved_model.Builder(path)
        builder.add_meta_graph_and_variables(
            session, [tf.saved_model.SERVING], signature_def_map=signatures)
        builder.save()
    return path


SPIN_ITERATIONS = 10 ** 7  # ~15 us each here: minutes, unless the run is cancelled


def write_spin_model(base_path, version=1):
    """A model whose `spin` signature runs a loop of SPIN_ITERATIONS steps, each adding 1
    to a counter variable, and whose `count` signature reads that counter: a run that is
    cancelled stops counting, one that is not keeps counting.

        spin:  x float [-1, 1] -> y = x + iterations run         [-1, 1]
        count: x float [-1, 1] -> count = the counter, per row    [-1]
    """
    path = os.path.join(base_path, str(version))
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 1], name="x")
        counter = tf.compat.v1.get_variable("counter", [], tf.int64, trainable=False,
                                            initializer=tf.zeros_initializer(),
                                            use_resource=True)

        def body(i):
            with tf.control_dependencies([counter.assign_add(1)]):
                return i + 1

        steps = tf.while_loop(lambda i: i < SPIN_ITERATIONS, body,
                              [tf.constant(0, tf.int64)], parallel_iterations=1)
        y = x + tf.cast(steps, tf.float32)
        count = tf.fill([tf.shape(x)[0]], counter.read_value())
        info = tf.compat.v1.saved_model.utils.build_tensor_info
        build = tf.compat.v1.saved_model.signature_def_utils.build_signature_def
        signatures = {"spin": build({"x": info(x)}, {"y": info(y)}, PREDICT_METHOD),
                      "count": build({"x": info(x)}, {"count": info(count)}, PREDICT_METHOD)}
        return _save(path, graph, signatures)


def write_batch_probe_model(base_path, version=1):
    """A model that reports the batch it ran in, for batching tests:

        serving_default: x float [-1, -1] -> rows = the run's batch size, per row   [-1]
                                             width = the run's dimension 1, per row [-1]
                                             total = sum of each row                [-1]
                                             echo = x                            [-1, -1]
    """
    path = os.path.join(base_path, str(version))
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, None], name="x")
        shape = tf.shape(x)
        rows = tf.fill([shape[0]], shape[0])
        width = tf.fill([shape[0]], shape[1])
        total = tf.reduce_sum(x, axis=1)
        echo = tf.identity(x)
        info = tf.compat.v1.saved_model.utils.build_tensor_info
        signatures = {"serving_default": tf.compat.v1.saved_model.signature_def_utils
                      .build_signature_def({"x": info(x)}, {
                          "rows": info(rows), "width": info(width), "total": info(total),
                          "echo": info(echo)}, PREDICT_METHOD)}
        return _save(path, graph, signatures, tf.no_op())


def write_costly_model(base_path, iterations, odd_iterations=0, version=1,
                       row_iterations=0):
    """A model whose run costs a loop of `iterations` steps (~15 us each here), plus
    `odd_iterations` more when its batch has an odd number of rows, plus `row_iterations`
    per row: a slow model, one whose cost is not monotonic in the batch size, and one
    whose cost grows with its rows from a small fixed part, for the batch scheduler's
    tests. Its answer is exact whatever the batch:

        serving_default: x float [-1, 2] -> doubled = 2x [-1, 2]
                                            rows = the run's batch size, per row [-1]
    """
    path = os.path.join(base_path, str(version))
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        batch = tf.shape(x, out_type=tf.int64)[0]
        steps = iterations + odd_iterations * tf.math.floormod(batch, 2) + \
            row_iterations * batch
        done = tf.while_loop(lambda i: i < steps, lambda i: i + 1,
                             [tf.constant(0, tf.int64)], parallel_iterations=1)
        # the loop's count joins the answer as 0 * count, so it cannot be pruned
        doubled = 2.0 * x + 0.0 * tf.cast(done, tf.float32)
        rows = tf.fill([batch], batch)
        info = tf.compat.v1.saved_model.utils.build_tensor_info
        signatures = {"serving_default": tf.compat.v1.saved_model.signature_def_utils
                      .build_signature_def({"x": info(x)}, {
                          "doubled": info(doubled), "rows": info(rows)}, PREDICT_METHOD)}
        return _save(path, graph, signatures, tf.no_op())
