"""A small image classifier with the served chain's `serving_default` contract, cheap
enough for any test: encoded JPEG/PNG bytes in, `classes`, `probabilities` and
`class_names` out, `assets/labels.txt` beside it, as every slimserve export has.

    serving_default:  image_bytes string [None] -> decode (3 channels) -> area-resize to
                      side x side -> grey in [0, 1] -> softmax(x @ weights + bias)
    embeddings:       the same images -> x, the side*side features the logits read (the
                      penultimate layer of this one-layer model), as every export has it

The weights are the caller's (a logistic regression fitted on scikit-learn's digits makes
a real digits model with real, varied confidence; see `digits_features`), so request logs
and tools that read responses (the labelling page, drift) see the probabilities a real
model gives, in milliseconds instead of a ResNet's minutes.
"""
import io
import os

import numpy as np
import tensorflow as tf
from PIL import Image

from slimserve import conventions
from slimserve.testing import saved_models


def digits_features(encoded_images, side=8):
    """[N, side*side] float features of encoded images, as the model computes them (area
    resize, grey mean in [0, 1]); for fitting its weights."""
    rows = []
    for data in encoded_images:
        image = Image.open(io.BytesIO(data)).convert("RGB").resize((side, side), Image.BOX)
        rows.append(np.asarray(image, np.float32).mean(axis=2).reshape(-1) / 255.0)
    return np.stack(rows)


def write_image_classifier(base_path, version, weights, bias, class_names, side=8):
    """Writes `<base_path>/<version>/` (SavedModel + assets/labels.txt); returns its path.
    weights: [side*side, C], bias: [C], class_names: C names."""
    weights = np.asarray(weights, np.float32)
    bias = np.asarray(bias, np.float32)
    if weights.shape != (side * side, len(class_names)) or bias.shape != (len(class_names),):
        raise ValueError("weights must be [%d, C] and bias [C] for C=%d class names"
                         % (side * side, len(class_names)))
    path = os.path.join(base_path, str(version))

    def build():
        images = tf.compat.v1.placeholder(tf.string, [None], name="image_bytes")

        def features(data):
            pixels = tf.io.decode_image(data, channels=3, expand_animations=False)
            pixels = tf.image.resize(tf.cast(pixels, tf.float32), [side, side], method="area")
            return tf.reshape(tf.reduce_mean(pixels, axis=2), [side * side]) / 255.0

        x = tf.map_fn(features, images, fn_output_signature=tf.float32)
        logits = tf.matmul(x, tf.constant(weights)) + tf.constant(bias)
        probabilities = tf.nn.softmax(logits)
        classes = tf.argmax(probabilities, axis=1)
        names = tf.gather(tf.constant(list(class_names)), classes)
        return {conventions.DEFAULT_SIGNATURE: saved_models.signature(
            {conventions.IMAGE_BYTES: images},
            {conventions.CLASSES: classes, conventions.PROBABILITIES: probabilities,
             conventions.CLASS_NAMES: names}),
                conventions.EMBEDDINGS_SIGNATURE: saved_models.signature(
                    {conventions.IMAGE_BYTES: images}, {conventions.EMBEDDINGS: x})}

    saved_models.write_saved_model(path, build, init=tf.compat.v1.no_op)
    os.makedirs(os.path.join(path, "assets"), exist_ok=True)
    with open(os.path.join(path, "assets", conventions.LABELS_ASSET), "w") as handle:
        handle.write(conventions.format_labels(class_names))
    return path
