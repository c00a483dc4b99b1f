"""Served digits traffic for drift and flywheel tests, the benchmark and the demo: the
digits tree split into disjoint parts, the same digits written in another style (a
shift), a cheap real digits model with its export's reference, and request logs written
by a real server.

    parts = split(digits_dir, {"fit": 0.45, "reference": 0.2, "traffic": 0.35})
    shifted = shift(open(path, "rb").read(), "invert")       # PNG bytes
    base = digits_model(tmp, parts["fit"], parts["reference"])  # <base>/1 with reference
    pattern = log_traffic(base, "digits", prefix, images)     # PredictionLog files

Shifts (`SHIFTS`): "invert" (light digits on a dark ground), "thick" (strokes twice as
wide), "rotate" (turned 35 degrees), "blur". Every one keeps the digit a person reads.
"""
import io
import os
import random
import shutil

import numpy as np
from PIL import Image
from PIL import ImageFilter
from PIL import ImageOps

SHIFTS = ("invert", "thick", "rotate", "blur")


def digits_files(digits_dir):
    """[(path, class name)] of a class-folder tree, sorted."""
    found = []
    for name in sorted(os.listdir(digits_dir)):
        folder = os.path.join(digits_dir, name)
        if os.path.isdir(folder):
            found += [(os.path.join(folder, f), name) for f in sorted(os.listdir(folder))]
    return found


def split(digits_dir, fractions, seed=0):
    """{part: [(path, class)]}: the files shuffled (seeded) and cut by `fractions`
    ({part: share}, in order; shares summing to at most 1), so parts never share a file."""
    files = digits_files(digits_dir)
    random.Random(seed).shuffle(files)
    parts, start = {}, 0
    for name, share in fractions.items():
        count = int(round(share * len(files)))
        parts[name] = files[start:start + count]
        start += count
    return parts


def shift(data, kind):
    """The image `data` (encoded) written in another style, as PNG bytes."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    if kind == "invert":
        image = ImageOps.invert(image)
    elif kind == "thick":  # dark strokes on a light ground: a minimum filter widens them
        image = image.filter(ImageFilter.MinFilter(3))
    elif kind == "rotate":
        image = image.rotate(35, resample=Image.BICUBIC, fillcolor=(255, 255, 255))
    elif kind == "blur":
        image = image.filter(ImageFilter.GaussianBlur(1.5))
    else:
        raise ValueError("unknown shift %r (have %s)" % (kind, ", ".join(SHIFTS)))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def write_tree(files, folder, transform=None):
    """Copies [(path, class)] into a class-folder tree (transform: bytes -> bytes, the
    file then written as PNG); returns the folder."""
    for path, name in files:
        os.makedirs(os.path.join(folder, name), exist_ok=True)
        target = os.path.join(folder, name, os.path.basename(path))
        if transform is None:
            shutil.copyfile(path, target)
        else:
            with open(os.path.splitext(target)[0] + ".png", "wb") as handle:
                handle.write(transform(open(path, "rb").read()))
    return folder


def digits_model(work_dir, fit_files, reference_files, version=1, base=None,
                 reference_images=512):
    """A cheap real digits classifier (slimserve/testing/image_classifiers.py: logistic
    regression on 8x8 grey features, with an embeddings signature) fitted on
    `fit_files`, exported as `<base>/<version>` with its reference recorded from
    `reference_files` exactly as an export records it (export/reference.py, from a data
    set slimserve-convert's builder writes). Returns the base path."""
    from sklearn.linear_model import LogisticRegression  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import dataset  # pylint: disable=import-outside-toplevel
    from slimserve.export import reference  # pylint: disable=import-outside-toplevel
    from slimserve.testing import image_classifiers  # pylint: disable=import-outside-toplevel
    features = image_classifiers.digits_features([open(p, "rb").read() for p, _ in fit_files])
    classes = sorted({c for _, c in fit_files})
    model = LogisticRegression(C=0.1, max_iter=3000).fit(features, [c for _, c in fit_files])
    base = base or os.path.join(work_dir, "model")
    version_dir = image_classifiers.write_image_classifier(
        base, version, model.coef_.T, model.intercept_, [str(c) for c in model.classes_])
    assert list(model.classes_) == classes
    data = os.path.join(work_dir, "data-%d" % version)
    if not os.path.exists(os.path.join(data, "dataset_info.json")):
        train = write_tree(fit_files, os.path.join(work_dir, "fit-%d" % version))
        held = write_tree(reference_files, os.path.join(work_dir, "reference-%d" % version))
        dataset.build_dataset(train, data, validation_input=held, train_shards=2,
                              validation_shards=1, show_progress=False, num_workers=1)
    reference.write_reference(version_dir, data, max_images=reference_images)
    return base


def logging_config(prefix, rate=1.0):
    """TF Serving's LoggingConfig writing every request under `prefix`."""
    from google.protobuf import text_format  # pylint: disable=import-outside-toplevel
    from tensorflow_serving.config import logging_config_pb2  # pylint: disable=import-outside-toplevel
    return text_format.Parse(
        'log_collector_config { type: "file" filename_prefix: "%s" } '
        'sampling_config { sampling_rate: %g }' % (prefix, rate),
        logging_config_pb2.LoggingConfig())


def log_traffic(base, model_name, prefix, images, batch=1):
    """Serves `base` in process with request logging under `prefix`, sends `images`
    (encoded bytes, in order) over gRPC `batch` at a time, stops the server (publishing
    the logs) and returns the logs' glob."""
    from slimserve.serving.config import model_config  # pylint: disable=import-outside-toplevel
    from slimserve.serving.clients import client as client_lib  # pylint: disable=import-outside-toplevel
    from slimserve.testing.servers import serve_in_process  # pylint: disable=import-outside-toplevel
    server = serve_in_process([model_config.ServedModel(model_name, base,
                                                        logging_config=logging_config(prefix))],
                              enable_model_warmup=False)
    try:
        client = client_lib.Client("127.0.0.1:%d" % server.port, model_name=model_name,
                                   retries=0)
        for start in range(0, len(images), batch):
            client.predict_images(images[start:start + batch])
        client.close()
    finally:
        server.stop()
    return prefix + "*"


def accuracy_of(probabilities, labels, class_names):
    """Share of rows whose top class is named `labels` (class names)."""
    predicted = np.asarray(probabilities).argmax(axis=1)
    return float(np.mean([class_names[p] == label for p, label in zip(predicted, labels)]))
