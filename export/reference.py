"""The reference an export records: what the model saw in training, measured on the
export itself (serving/observability/reference.py describes the files).

    reference.write_reference(temp_dir, data_dir, "validation")

- class priors: the training split's counts per class (the data set's dataset_info.json);
- a bounded sample (`max_images`, drawn uniformly from the whole evaluation split with a
  seeded reservoir, so a split stored class by class is not sampled from its first
  classes only) run through the version exactly as a server loads it (serving's
  Servable): its probabilities (the distribution of its confidence and of its
  predicted classes), its `embeddings` signature's penultimate features, and each
  image's statistics (size, channels, brightness, contrast: image_stats.py);
- `examples_per_class` images of each class as small PNGs, for the labelling page.

Called from export/exporters.py's `export_checkpoint` on the temporary version before it
is published, so every export (the Final and Best exporters, slimserve-export) carries
its reference, and a failure here publishes nothing.
"""
import json
import logging
import os
import random

import numpy as np
import tensorflow as tf

from slimserve import conventions
from slimserve import errors
from slimserve.estimator import schema
from slimserve.estimator import splits
from slimserve.export import signatures
from slimserve.serving.core import servable as servable_lib
from slimserve.serving.observability import image_stats
from slimserve.serving.observability import reference as reference_lib
from slimserve.serving.observability import thumbnails

DEFAULT_IMAGES = 512
MAX_IMAGES = reference_lib.MAX_IMAGES
DEFAULT_EXAMPLES_PER_CLASS = 3
EXAMPLE_SIZE = 128
BATCH = 32


def sample_split(data_dir, split, count, seed=0, examples_per_class=0):
    """(sampled [(encoded, label)], {label: [encoded]} the first examples_per_class of
    each class): one pass over the split, memory bounded by `count` records."""
    rng = random.Random(seed)
    sample, seen, examples = [], 0, {}
    for path in splits.split_files(data_dir, split):
        for record in tf.compat.v1.io.tf_record_iterator(path):
            seen += 1
            feature = tf.train.Example.FromString(record).features.feature
            encoded = feature[schema.ENCODED].bytes_list.value[0]
            label = int(feature[schema.LABEL].int64_list.value[0])
            kept = examples.setdefault(label, [])
            if len(kept) < examples_per_class:
                kept.append(encoded)
            if len(sample) < count:
                sample.append((encoded, label))
            else:
                slot = rng.randrange(seen)  # reservoir: each record kept with count/seen
                if slot < count:
                    sample[slot] = (encoded, label)
    return sample, examples


def train_counts(data_dir, class_names, split=schema.TRAIN):
    """[C] images per class of the data set's training split (dataset_info.json), or
    None when the data set does not record them."""
    path = os.path.join(data_dir, schema.INFO_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as handle:
        info = json.load(handle)
    per_class = info.get("splits", {}).get(split, {}).get("per_class")
    if not isinstance(per_class, dict):
        return None
    return np.array([int(per_class.get(name, 0)) for name in class_names], np.int64)


def _class_names(export_dir):
    path = os.path.join(export_dir, "assets", conventions.LABELS_ASSET)
    with tf.io.gfile.GFile(path) as handle:
        return conventions.parse_labels(handle.read().splitlines(), path)


def measure(export_dir, images):
    """(probabilities [N, C], embeddings [N, D]) of encoded `images`, run through the
    version's serving_default and embeddings signatures as a server runs them."""
    servable = servable_lib.Servable("reference", 0, export_dir)
    try:
        default = servable.signatures[signatures.DEFAULT]
        embedding = servable.signatures[signatures.EMBEDDINGS_SIGNATURE]
        probabilities, embeddings = [], []
        for start in range(0, len(images), BATCH):
            feed = {signatures.IMAGE_BYTES: np.array(images[start:start + BATCH], dtype=object)}
            probabilities.append(servable.run(default, feed, [signatures.PROBABILITIES])[
                signatures.PROBABILITIES])
            embeddings.append(servable.run(embedding, feed, [signatures.EMBEDDINGS])[
                signatures.EMBEDDINGS])
    finally:
        servable.retire()
    return np.concatenate(probabilities), np.concatenate(embeddings)


def write_reference(export_dir, data_dir, eval_split=schema.VALIDATION,
                    max_images=DEFAULT_IMAGES, examples_per_class=DEFAULT_EXAMPLES_PER_CLASS,
                    seed=0, train_split=schema.TRAIN):
    """Measures and writes the reference of the (unpublished) version at `export_dir`
    from the data set at `data_dir`; returns a short report for the export's log."""
    class_names = _class_names(export_dir)
    sample, examples = sample_split(data_dir, eval_split, max_images, seed,
                                    examples_per_class)
    if not sample:
        raise errors.UserError("%s has no %s images to take a reference from"
                               % (data_dir, eval_split))
    images = [encoded for encoded, _ in sample]
    stats = []
    for encoded in images:
        try:
            stats.append(image_stats.statistics(encoded))
        except image_stats.NotAnImage as why:
            raise errors.UserError("%s: a %s image does not decode (%s)"
                                   % (data_dir, eval_split, why)) from None
    probabilities, embeddings = measure(export_dir, images)
    pngs = {}
    for label, encoded_list in examples.items():
        if 0 <= label < len(class_names):
            pngs[label] = [thumbnails.thumbnail(e, EXAMPLE_SIZE)[0]
                           for e in encoded_list]
    reference = reference_lib.Reference(
        class_names, probabilities, np.stack(stats),
        np.array([label for _, label in sample], np.int64), embeddings,
        train_counts(data_dir, class_names, train_split),
        {"source": {"split": eval_split, "images_sampled": len(sample), "seed": seed}})
    reference_lib.write(export_dir, reference, pngs)
    accuracy = float(np.mean(probabilities.argmax(1) == reference.labels))
    logging.info("reference: %d %s images (accuracy %.4f), %d-dimensional embeddings, "
                 "%d class example(s)", len(sample), eval_split, accuracy,
                 embeddings.shape[1], sum(len(v) for v in pngs.values()))
    return {"reference_images": len(sample), "reference_embedding_size":
            int(embeddings.shape[1]), "reference_accuracy": accuracy}
