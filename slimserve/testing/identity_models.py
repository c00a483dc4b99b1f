"""Models that hand their requests back, to see over the wire exactly what a server fed
them (the tensors it read from JSON or TensorProtos, the serialized tf.Examples it built),
TF Serving's counter model (signatures with only outputs, or only one input), and a
classifier / regressor whose answers come from the examples.

    write_identity_model(base) -> <base>/1/
        <dtype> (predict)        x <dtype>, any shape -> y = x, for every dtype in DTYPES
        string_bytes (predict)   x string -> y_bytes = x (REST writes it base64)
        named (predict)          int_tensor int32, str_tensor string, float_tensor float,
                                 dbl_tensor double -> the same names, each its input
        columnar (predict)       int_tensor int32, str_tensor string, bin_tensor string ->
                                 the same names
        complex_out, scalar_out, two_batches, zero_batch, zero_batches, zero_and_one
                                 (predict) x float -> outputs of those kinds: complex64;
                                 rank 0; a [B] and b [1]; [0]; [0, 3, 4] float and
                                 [0, 1, 2] string; [0, 2] int32 and [1, 2] string
        echo_classify (classify) inputs (serialized tf.Examples) -> classes
                                 [B, 1] = base64 of each one fed, scores [B, 1] = its length
        echo_regress (regress)   inputs -> outputs [B] = each one's length in bytes
    write_counter_model(base) -> <base>/1/
        get_counter, incr_counter, reset_counter (no input) and incr_counter_by (delta
        float) -> output float, the counter after the call (TF Serving's
        saved_model_counter, built here from scratch)
    write_scoring_model(base) -> <base>/1/
        classify and regress signatures that read their answers out of the examples, one
        per output shape TF Serving checks (see the function)
"""
import os

import tensorflow as tf

from slimserve.testing import saved_models

# Every dtype TF Serving's JSON codec (util/json_tensor.cc) reads or writes, plus ones it
# refuses (float16, bfloat16, uint16, complex): name -> tf.DType.
DTYPES = {
    "float": tf.float32, "double": tf.float64, "int32": tf.int32, "int16": tf.int16,
    "int8": tf.int8, "uint8": tf.uint8, "uint16": tf.uint16, "int64": tf.int64,
    "uint32": tf.uint32, "uint64": tf.uint64, "bool": tf.bool, "string": tf.string,
    "half": tf.float16, "bfloat16": tf.bfloat16, "complex64": tf.complex64,
    "complex128": tf.complex128,
}


def _identities(specs):
    """A predict signature feeding each {alias: dtype} placeholder (any shape) straight to
    an output of the same alias."""
    inputs = {alias: tf.compat.v1.placeholder(dtype, None, name="%s_in" % alias)
              for alias, dtype in specs.items()}
    return saved_models.signature(inputs, {alias: tf.identity(tensor)
                                           for alias, tensor in inputs.items()})


def write_identity_model(base_path, version=1):
    """Writes `<base_path>/<version>/` (see the module docstring); returns it."""

    def build():
        signatures = {}
        for name, dtype in DTYPES.items():
            with tf.compat.v1.name_scope(name):
                signatures[name] = _identities({"x": dtype})
        with tf.compat.v1.name_scope("string_bytes"):
            x = tf.compat.v1.placeholder(tf.string, None, name="x_in")
            signatures["string_bytes"] = saved_models.signature({"x": x},
                                                                {"y_bytes": tf.identity(x)})
        with tf.compat.v1.name_scope("named"):
            signatures["named"] = _identities({"int_tensor": tf.int32, "str_tensor": tf.string,
                                               "float_tensor": tf.float32,
                                               "dbl_tensor": tf.float64})
        with tf.compat.v1.name_scope("columnar"):
            signatures["columnar"] = _identities({"int_tensor": tf.int32,
                                                  "str_tensor": tf.string,
                                                  "bin_tensor": tf.string})
        with tf.compat.v1.name_scope("outputs"):
            x = tf.compat.v1.placeholder(tf.float32, None, name="x")
            one = saved_models.signature
            signatures["complex_out"] = one({"x": x}, {"y": tf.complex(x, x)})
            signatures["scalar_out"] = one({"x": x}, {"y": tf.reduce_sum(x)})
            signatures["two_batches"] = one({"x": x}, {"a": tf.identity(x), "b": x[:1]})
            signatures["zero_batch"] = one({"x": x}, {"y": x[:0]})
            signatures["zero_batches"] = one({"x": x}, {
                "float_tensor": tf.zeros([0, 3, 4]), "str_tensor": tf.fill([0, 1, 2], "")})
            signatures["zero_and_one"] = one({"x": x}, {
                "int_tensor": tf.zeros([0, 2], tf.int32), "str_tensor": tf.fill([1, 2], "a")})
        with tf.compat.v1.name_scope("echo"):
            examples = tf.compat.v1.placeholder(tf.string, [None], name="examples")
            lengths = tf.cast(tf.strings.length(examples), tf.float32)
            signatures["echo_classify"] = saved_models.signature(
                {"inputs": examples},
                {"classes": tf.reshape(tf.io.encode_base64(examples), [-1, 1]),
                 "scores": tf.reshape(lengths, [-1, 1])}, saved_models.CLASSIFY_METHOD)
            signatures["echo_regress"] = saved_models.signature(
                {"inputs": examples}, {"outputs": tf.identity(lengths)},
                saved_models.REGRESS_METHOD)
        return signatures

    return saved_models.write_saved_model(os.path.join(base_path, str(version)), build)


def write_counter_model(base_path, version=1):
    """Writes `<base_path>/<version>/` with the counter signatures; returns it."""

    def build():
        counter = tf.compat.v1.Variable(0.0, name="counter", use_resource=False)
        delta = tf.compat.v1.placeholder(tf.float32, [], name="delta")
        return {
            "get_counter": saved_models.signature({}, {"output": tf.identity(counter)}),
            "incr_counter": saved_models.signature({}, {"output": counter.assign_add(1.0)}),
            "reset_counter": saved_models.signature({}, {"output": counter.assign(0.0)}),
            "incr_counter_by": saved_models.signature(
                {"delta": delta}, {"output": counter.assign_add(delta)}),
        }

    return saved_models.write_saved_model(os.path.join(base_path, str(version)), build)


def write_scoring_model(base_path, version=1):
    """Writes `<base_path>/<version>/`, a classifier and regressor that read their answers
    out of the examples (as the fake sessions of TF Serving's classifier_test.cc and
    regressor_test.cc do), with one signature per shape of output TF Serving checks:

        serving_default   classes = each example's "class" bytes, scores = its "score"
                          floats (every example as many as the widest)
        classes_only, scores_only, output_plus_one (scores + 1)
        improperly_sized_scores  scores flattened to [B * C]
        empty             classify method, no input and no output
        run_fails         fails in the run: "Run totally failed"
        classes_batch_1, scores_batch_1  the first row only
        classes_float     classes as the float scores;  scores_double  scores as doubles
        mismatched        classes' first column only
        regress           outputs = each example's "value" float [B]
        regress_plus_one, regress_two_columns ([B, 2]), regress_batch_1, regress_double,
        regress_as_classify  (regress outputs under the classify method name)
        odd_method        predict x float -> y = x, method "not/supported/method"
    """

    def build():
        examples = tf.compat.v1.placeholder(tf.string, [None], name="examples")
        parsed = tf.io.parse_example(examples, {
            "class": tf.io.VarLenFeature(tf.string), "score": tf.io.VarLenFeature(tf.float32),
            "value": tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0])})
        classes = tf.sparse.to_dense(parsed["class"], default_value="")
        scores = tf.sparse.to_dense(parsed["score"])
        value = tf.reshape(parsed["value"], [-1])
        classify, regress = saved_models.CLASSIFY_METHOD, saved_models.REGRESS_METHOD

        def sig(outputs, method=classify):
            return saved_models.signature({"inputs": examples}, outputs, method)

        failing = tf.debugging.Assert(tf.reduce_all(scores < -1e30), ["Run totally failed"])
        with tf.control_dependencies([failing]):
            failed_scores = tf.identity(scores)
        x = tf.compat.v1.placeholder(tf.float32, None, name="x")
        return {
            "serving_default": sig({"classes": classes, "scores": scores}),
            "classes_only": sig({"classes": classes}),
            "scores_only": sig({"scores": scores}),
            "output_plus_one": sig({"classes": classes, "scores": scores + 1.0}),
            "improperly_sized_scores": sig({"classes": classes,
                                            "scores": tf.reshape(scores, [-1])}),
            "empty": saved_models.signature({}, {}, classify),
            "run_fails": sig({"scores": failed_scores}),
            "classes_batch_1": sig({"classes": classes[:1], "scores": scores}),
            "scores_batch_1": sig({"classes": classes, "scores": scores[:1]}),
            "classes_float": sig({"classes": scores, "scores": scores}),
            "scores_double": sig({"classes": classes, "scores": tf.cast(scores, tf.float64)}),
            "mismatched": sig({"classes": classes[:, :1], "scores": scores}),
            "regress": sig({"outputs": value}, regress),
            "regress_plus_one": sig({"outputs": value + 1.0}, regress),
            "regress_two_columns": sig({"outputs": tf.stack([value, value], 1)}, regress),
            "regress_batch_1": sig({"outputs": value[:1]}, regress),
            "regress_double": sig({"outputs": tf.cast(value, tf.float64)}, regress),
            "regress_as_classify": sig({"outputs": value}, classify),
            "odd_method": saved_models.signature({"x": x}, {"y": tf.identity(x)},
                                                 "not/supported/method"),
        }

    return saved_models.write_saved_model(os.path.join(base_path, str(version)), build)
