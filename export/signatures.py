"""Signature names, input and output keys of every slimserve SavedModel (DESIGN.md).

Clients outside this project rely on these; serving/ has no copy of them because
it reads signatures from the SavedModel itself.
"""
SERVE_TAG = "serve"
DEFAULT = "serving_default"
PREDICT_IMAGES = "predict_images"
CLASSIFY = "classify"

IMAGE_BYTES = "image_bytes"
IMAGES = "images"
EXAMPLES = "inputs"

CLASSES = "classes"
PROBABILITIES = "probabilities"
CLASS_NAMES = "class_names"
SCORES = "scores"

PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"

EXPECTED = {
    DEFAULT: (PREDICT_METHOD, {IMAGE_BYTES}, {CLASSES, PROBABILITIES, CLASS_NAMES}),
    PREDICT_IMAGES: (PREDICT_METHOD, {IMAGES}, {CLASSES, PROBABILITIES, CLASS_NAMES}),
    CLASSIFY: (CLASSIFY_METHOD, {EXAMPLES}, {CLASSES, SCORES}),
}

WARMUP_FILE = "tf_serving_warmup_requests"
LABELS_ASSET = "labels.txt"
EXTRA_DIR = "assets.extra"
