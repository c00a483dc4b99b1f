"""The contract every slimserve package shares, defined once: tf.Example keys, split and
shard names, the labels.txt format, image file suffixes, SavedModel signature names with
their input and output keys, and where warmup records live.

Plain Python (no TensorFlow import), so the server, the converter, the exporter and the
tools all read the same names: serving/ may not import estimator/ or export/, but all
three import this module.
"""
import os
import re

from slimserve import errors

# --- tf.Example feature keys (slim / TF models convention) -----------------------------
ENCODED = "image/encoded"
FORMAT = "image/format"
LABEL = "image/class/label"  # int64, 0-based
TEXT = "image/class/text"
HEIGHT = "image/height"
WIDTH = "image/width"
CHANNELS = "image/channels"
FILENAME = "image/filename"
# float list, one per class: the serving version's probabilities for an original training
# image, written by slimserve-retrain's merge when it distils (--distill_weight)
TEACHER = "image/class/teacher"

# --- a converted data set ----------------------------------------------------------------
TRAIN = "train"
VALIDATION = "validation"
SPLITS = (TRAIN, VALIDATION)
LABELS_FILE = "labels.txt"
INFO_FILE = "dataset_info.json"
SHARD_NAME = re.compile(r"^(?:.*/)?[A-Za-z0-9_]+-\d{5}-of-\d{5}$")


def shard_name(split, index, num_shards):
    """`train-00003-of-00010`: the names every TF input pipeline expects."""
    return "%s-%05d-of-%05d" % (split, index, num_shards)


def shard_pattern(data_dir, split):
    return "%s/%s-*-of-*" % (data_dir.rstrip("/"), split)


# --- image files -------------------------------------------------------------------------
# What TensorFlow's decode_image, and so every serving signature, decodes. (The converter
# looks at every file and lets Pillow decide, so it needs no list.)
SERVABLE_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
# The same formats by their first bytes, which is how decode_image tells them apart.
IMAGE_MAGIC = (("JPEG", b"\xff\xd8\xff"), ("PNG", b"\x89PNG\r\n\x1a\n"), ("GIF", b"GIF8"),
               ("BMP", b"BM"))


def image_format(data):
    """"JPEG", "PNG", "GIF" or "BMP" when `data` starts like one (what every serving
    signature decodes), else None."""
    return next((name for name, magic in IMAGE_MAGIC if data[:len(magic)] == magic), None)


# --- labels.txt: one `id:name` line per class, ids 0..N-1 -------------------------------
def parse_labels(lines, source):
    """Class names indexed by id from `id:name` lines; errors name `source` and the line."""
    names = {}
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        key, sep, name = line.partition(":")
        if not sep or not key.strip().isdigit():
            raise errors.UserError("%s:%d: expected 'id:name', got %r"
                                   % (source, number, line))
        names[int(key)] = name
    if sorted(names) != list(range(len(names))):
        raise errors.UserError("%s: label ids must be 0..N-1 without gaps, got %s"
                               % (source, sorted(names)))
    return [names[i] for i in range(len(names))]


def format_labels(names):
    return "".join("%d:%s\n" % (index, name) for index, name in enumerate(names))


# --- SavedModel signatures ---------------------------------------------------------------
DEFAULT_SIGNATURE = "serving_default"   # input IMAGE_BYTES
PREDICT_IMAGES = "predict_images"       # input IMAGES (decoded, cropped, resized pixels)
CLASSIFY = "classify"                   # input EXAMPLES (serialized tf.Example)
EMBEDDINGS_SIGNATURE = "embeddings"     # input IMAGE_BYTES, output EMBEDDINGS
IMAGE_BYTES = "image_bytes"
IMAGES = "images"
EXAMPLES = "inputs"
CLASSES = "classes"
PROBABILITIES = "probabilities"
CLASS_NAMES = "class_names"
SCORES = "scores"
EMBEDDINGS = "embeddings"               # float [None, D]: the features the logits read
LABELS_ASSET = LABELS_FILE              # assets/labels.txt of every export
EXTRA_DIR = "assets.extra"
# Where TF Serving looks for warmup records, relative to a version directory.
WARMUP_PATH = os.path.join(EXTRA_DIR, "tf_serving_warmup_requests")
# What the model saw in training, written by every export (export/reference.py) and read
# by drift detection and the labelling page (serving/observability/reference.py).
REFERENCE_DIR = os.path.join(EXTRA_DIR, "reference")
# The OpenVINO IR of the network (decoded images -> the numeric tensors the signatures'
# outputs are computed from), beside the SavedModel as model.tflite is; `.bin` beside
# each `.xml`. The int8 one exists only when it passed the export's accuracy guard.
OPENVINO_MODEL = os.path.join("openvino", "model.xml")
OPENVINO_INT8_MODEL = os.path.join("openvino", "model_int8.xml")


# --- the export gate: --export_min_metric of slimserve-train and slimserve-export --------
# Its syntax, help and the auto rule's constants, here because the training config
# (estimator/, which never imports export/) states and checks the flag; export/blessing.py
# applies the rule.
GATE_AUTO = "auto"
GATE_NONE = "none"
GATE_AUTO_METRIC = "mean_per_class_accuracy"
GATE_AUTO_MARGIN = 0.3
GATE_AUTO_BEST_FRACTION = 0.9
GATE_HELP = (
    "Export only an evaluation that clears this bar: 'auto' = mean_per_class_accuracy "
    "above chance 1/C by %d%% of the way to 1 (0.37 for 10 classes) and at least %d%% of "
    "the best this run has evaluated; a number = accuracy (slimserve-train: --best_metric) "
    ">= it; <metric>:<number>; "
    "'none' = always export." % (100 * GATE_AUTO_MARGIN, 100 * GATE_AUTO_BEST_FRACTION))


def parse_min_metric(spec, best_metric="accuracy"):
    """--export_min_metric -> (metric or GATE_AUTO, threshold or None), (None, None) for
    no gate; a UserError naming the flag for anything else."""
    text = str(spec).strip().lower() if spec is not None else GATE_NONE
    if text in (GATE_NONE, "", "off"):
        return None, None
    if text == GATE_AUTO:
        return GATE_AUTO, None
    metric, _, value = str(spec).strip().rpartition(":")
    try:
        threshold = float(value)
    except ValueError:
        raise errors.UserError("--export_min_metric must be 'auto', 'none', a number or "
                               "<metric>:<number>, got %r" % spec) from None
    return metric or best_metric, threshold
