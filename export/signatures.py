"""The four signatures every slimserve SavedModel has, as export/ builds and verifies
them. Their names and keys are the project's conventions (slimserve/conventions.py, which
the server and the tools read too); the tag and method names are TensorFlow's constants.
"""
import tensorflow as tf

from slimserve.conventions import (  # noqa: F401  (re-exported: the export's vocabulary)
    CLASS_NAMES, CLASSES, CLASSIFY, EMBEDDINGS, EMBEDDINGS_SIGNATURE, EXAMPLES, EXTRA_DIR,
    IMAGE_BYTES, IMAGES, LABELS_ASSET, PREDICT_IMAGES, PROBABILITIES, REFERENCE_DIR, SCORES,
    WARMUP_PATH)
from slimserve.conventions import DEFAULT_SIGNATURE as DEFAULT

SERVE_TAG = tf.saved_model.SERVING

PREDICT_METHOD = tf.saved_model.PREDICT_METHOD_NAME
CLASSIFY_METHOD = tf.saved_model.CLASSIFY_METHOD_NAME

EXPECTED = {
    DEFAULT: (PREDICT_METHOD, {IMAGE_BYTES}, {CLASSES, PROBABILITIES, CLASS_NAMES}),
    PREDICT_IMAGES: (PREDICT_METHOD, {IMAGES}, {CLASSES, PROBABILITIES, CLASS_NAMES}),
    CLASSIFY: (CLASSIFY_METHOD, {EXAMPLES}, {CLASSES, SCORES}),
    EMBEDDINGS_SIGNATURE: (PREDICT_METHOD, {IMAGE_BYTES}, {EMBEDDINGS}),
}
