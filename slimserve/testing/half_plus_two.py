"""half_plus_two / half_plus_three, built the way TF Serving's own test models are
(servables/tensorflow/testdata/saved_model_half_plus_two.py, read at tag 2.15.1; written
here from scratch): TF1 graphs whose predict input `x` is not a placeholder but the
Identity of a parse_example output (signature shape [-1, 1]), so feeding it any shape
runs, as in TF Serving. Used to check behaviour against TF Serving's documented answers.

    serving_default (predict)   x float [-1, 1] -> y = 0.5 x + 2 (half_plus_three: + 3)
    regress_x_to_y (regress)    tf.Example {"x": float[1]} -> outputs y
    regress_x_to_y2 (regress)   tf.Example {"x"} -> outputs 0.5 x + 3
    regress_x2_to_y3 (regress)  x2 float [-1, 1] (no Example) -> outputs 0.5 x2 + 3
    classify_x_to_y (classify)  tf.Example {"x"} -> scores y (no classes output)
    classify_x2_to_y3 (classify) x2 float [-1, 1] (no Example) -> scores 0.5 x2 + 3
    tensorflow/serving/regress  (half_plus_three only) as regress_x_to_y

half_plus_three's signatures carry no tensor shapes, as TF Serving's own export of it.
"""
import os

import tensorflow as tf

from slimserve.testing import saved_models

VERSION = 123  # TF Serving's test models live in <base>/00000123


def write_half_plus(base_path, plus=2.0, version=VERSION):
    """Writes `<base_path>/<version>/` and returns it; plus=3.0 makes half_plus_three."""
    v1 = tf.compat.v1

    def graph():
        a = v1.Variable(0.5, name="a")
        b = v1.Variable(float(plus), name="b")
        c = v1.Variable(3.0, name="c")
        serialized = v1.placeholder(tf.string, name="tf_example", shape=[None])
        parsed = tf.io.parse_example(serialized, {
            "x": tf.io.FixedLenFeature([1], tf.float32),
            "x2": tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0])})
        x = tf.identity(parsed["x"], name="x")
        y = tf.identity(a * x + b, name="y")
        y2 = tf.identity(a * x + c, name="y2")
        x2 = tf.identity(parsed["x2"], name="x2")
        y3 = tf.identity(v1.Variable(0.5, name="a2") * x2 + v1.Variable(3.0, name="c2"),
                         name="y3")
        def info(tensor):
            """TF Serving's half_plus_three is an old export: its TensorInfos carry no
            shape (read as a scalar), yet [3] values run."""
            tensor_info = v1.saved_model.utils.build_tensor_info(tensor)
            if plus == 3.0:
                tensor_info.ClearField("tensor_shape")
            return tensor_info

        build = v1.saved_model.signature_def_utils.build_signature_def

        def regress(inputs, outputs):
            return build({"inputs": info(inputs)}, {"outputs": info(outputs)},
                         tf.saved_model.REGRESS_METHOD_NAME)

        signatures = {
            "serving_default": build({"x": info(x)}, {"y": info(y)},
                                     tf.saved_model.PREDICT_METHOD_NAME),
            "regress_x_to_y": regress(serialized, y),
            "regress_x_to_y2": regress(serialized, y2),
            "regress_x2_to_y3": regress(x2, y3),
            "classify_x_to_y": build({"inputs": info(serialized)}, {"scores": info(y)},
                                     tf.saved_model.CLASSIFY_METHOD_NAME),
            "classify_x2_to_y3": build({"inputs": info(x2)}, {"scores": info(y3)},
                                       tf.saved_model.CLASSIFY_METHOD_NAME),
        }
        if plus == 3.0:  # api_rest.md's regress example names this signature
            signatures["tensorflow/serving/regress"] = regress(serialized, y)
        return signatures

    return saved_models.write_saved_model(os.path.join(base_path, "%08d" % version), graph)
