"""Serving inputs: tf.Example, image bytes and decoded images, chained in one graph.

    inputs (serialized tf.Example) --parse--> image_bytes --check size, decode, crop,
                                              resize--> images --normalise--> features

Each entry is a `placeholder_with_default` over the step before it, so a signature
may feed any one of them and TensorFlow prunes the steps above it. All three
signatures therefore share the one evaluation preprocessing from
estimator/preprocessing.py, including its header size check: an image claiming more
than `max_image_pixels` fails the request with InvalidArgument before any decode, in
TensorFlow Serving too (the check is part of the graph).
"""
import collections

import tensorflow as tf

from slimserve.estimator import compat
from slimserve.estimator import preprocessing
from slimserve.estimator import schema
from slimserve.export import signatures

ServingInputs = collections.namedtuple("ServingInputs", "examples image_bytes images features")


def build_serving_inputs(preprocess):
    """Builds the chain in the current graph for a preprocessing.Spec (the evaluation
    preprocessing of the run); the batch dimension stays dynamic."""
    image_size, style = preprocess.image_size, preprocess.style
    examples = tf.compat.v1.placeholder_with_default(
        tf.constant([], tf.string), [None], name="input_examples")
    parsed = tf.io.parse_example(examples, schema.feature_spec(with_label=False))
    image_bytes = tf.compat.v1.placeholder_with_default(
        parsed[schema.ENCODED], [None], name="input_image_bytes")

    @compat.plain_graph_building
    def to_pixels(encoded):
        return preprocessing.decode_eval_pixels(encoded, image_size, style,
                                                preprocess.central_fraction,
                                                preprocess.max_image_pixels)

    pixels = tf.map_fn(to_pixels, image_bytes, back_prop=False, parallel_iterations=8,
                       fn_output_signature=tf.TensorSpec([image_size, image_size, 3],
                                                         tf.float32))
    images = tf.compat.v1.placeholder_with_default(
        pixels, [None, image_size, image_size, 3], name="input_images")
    features = {"image": preprocessing.normalize(images, style)}
    return ServingInputs(examples, image_bytes, images, features)


def image_bytes_receiver_fn(preprocess):
    """A plain Estimator serving_input_receiver_fn (image bytes only), for users who
    call `estimator.export_saved_model` themselves."""

    def receiver_fn():
        inputs = build_serving_inputs(preprocess)
        return tf.estimator.export.ServingInputReceiver(
            inputs.features, {signatures.IMAGE_BYTES: inputs.image_bytes})

    return receiver_fn
