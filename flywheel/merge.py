"""Merging newly labelled images into a model's data set, for a fine-tune from the
serving version (slimserve-retrain).

    merge.merge(original, new, output_dir, class_names, repeats=3)

`original` is the data set the serving version was trained on and `new` the new labels,
both converted by slimserve-convert (estimator/dataset.py): `new`'s train split is the
part of the new labels to train on, its validation split the part held out. The merged
set is written like a converted one (shards, labels.txt, dataset_info.json; staged in
`.partial/`, published whole, dataset_info.json last) with:

- train: the original training shards, as they are, then the new training part
  `repeats` times (each copy a shard of its own: a few hundred new images weigh that
  many times more among thousands of old ones);
- validation: the original validation split, unchanged (so evaluations stay comparable
  with the serving version's), then the new held-out part;
- labels.txt: the serving model's classes, `class_names`. The new labels' class ids are
  rewritten by class name (`image/class/text`), since the converter numbered only the
  classes someone labelled; a class the model does not know is a DatasetError.

The original shards are hard-linked when they can be (same file system), else copied;
with a `teacher` (distillation, --distill_weight), the original training records are
rewritten instead, each with the serving version's probabilities for its image
(`image/class/teacher`), and dataset_info.json says `"teacher": true`. The new labels get
none: what they teach is their label. `teacher(version_dir)` makes that teacher of a
SavedModel version (the serving one), answering as the server does.
"""
import collections
import contextlib
import json
import os
import shutil

import numpy as np
import tensorflow as tf

from slimserve import conventions
from slimserve.estimator import dataset
from slimserve.estimator import schema
from slimserve.estimator import splits
from slimserve.serving.core import servable as servable_lib


def _link_or_copy(source, target):
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _rewrite(source, target, ids):
    """Copies a shard, each record's label set from its class name; returns per class."""
    per_class = collections.Counter()
    with tf.io.TFRecordWriter(target) as writer:
        for record in tf.compat.v1.io.tf_record_iterator(source):
            example = tf.train.Example.FromString(record)
            feature = example.features.feature
            name = feature[schema.TEXT].bytes_list.value[0].decode("utf-8")
            if name not in ids:
                raise dataset.DatasetError(
                    "%s: class %r is not one of the model's classes (%s); label with the "
                    "model's classes only" % (source, name, ", ".join(sorted(ids))))
            feature[schema.LABEL].int64_list.value[0] = ids[name]
            writer.write(example.SerializeToString())
            per_class[name] += 1
    return per_class


def _with_teacher(source, target, teacher, num_classes, batch=64):
    """Copies a shard, each record with teacher(encoded images) probabilities added;
    returns per class."""
    per_class = collections.Counter()

    def flush(examples):
        probabilities = teacher([e.features.feature[schema.ENCODED].bytes_list.value[0]
                                 for e in examples])
        if len(probabilities) != len(examples) or any(
                len(row) != num_classes for row in probabilities):
            raise dataset.DatasetError(
                "%s: the teacher gave %d rows of %s values for %d images; each needs %d, "
                "one per class" % (source, len(probabilities),
                                   "/".join(str(n) for n in sorted({len(row) for row in
                                                                    probabilities})),
                                   len(examples), num_classes))
        for example, row in zip(examples, probabilities):
            schema.set_teacher(example, row)
            writer.write(example.SerializeToString())
            per_class[example.features.feature[schema.TEXT].bytes_list.value[0].decode(
                "utf-8")] += 1

    with tf.io.TFRecordWriter(target) as writer:
        pending = []
        for record in tf.compat.v1.io.tf_record_iterator(source):
            pending.append(tf.train.Example.FromString(record))
            if len(pending) == batch:
                flush(pending)
                pending = []
        if pending:
            flush(pending)
    return per_class


def _counts(path):
    """Records per class of an original shard (read, not trusted from its info)."""
    per_class = collections.Counter()
    for record in tf.compat.v1.io.tf_record_iterator(path):
        feature = tf.train.Example.FromString(record).features.feature
        per_class[feature[schema.TEXT].bytes_list.value[0].decode("utf-8")] += 1
    return per_class


def merge(original, new, output_dir, class_names, repeats=1, teacher=None):
    """Writes the merged data set (module docstring) into `output_dir`, replacing what is
    there; returns its dataset_info dictionary. `teacher(encoded images)` -> one row of
    probabilities over `class_names` per image, for distillation (None: none)."""
    if repeats < 1:
        raise dataset.DatasetError("repeats must be >= 1, got %d" % repeats)
    ids = dataset.label_ids(class_names)
    original_labels = schema.read_labels(os.path.join(original, schema.LABELS_FILE))
    if list(original_labels) != list(class_names):
        raise dataset.DatasetError(
            "%s/labels.txt lists %s, the serving model %s: the original data set must be "
            "the one the model was trained on" % (original, original_labels, class_names))
    sources = {
        schema.TRAIN: [(path, False) for path in splits.split_files(original, schema.TRAIN)]
        + [(path, True) for path in splits.split_files(new, schema.TRAIN)] * repeats,
        schema.VALIDATION: [(path, False) for path in
                            splits.split_files(original, schema.VALIDATION)]
        + [(path, True) for path in _optional_split(new, schema.VALIDATION)],
    }
    with dataset.lock_output(output_dir):
        staging = dataset.prepare_output(output_dir, overwrite=True)
        info = {"num_classes": len(class_names), "labels": list(class_names), "splits": {},
                "merged_from": {"original": os.path.abspath(original),
                                "new": os.path.abspath(new), "new_train_repeats": repeats},
                "skipped": [], "serving_notes": [], "teacher": teacher is not None}
        for split, shards in sources.items():
            per_class, counts = collections.Counter(), []
            new_count = 0
            for index, (source, rewrite) in enumerate(shards):
                target = os.path.join(staging, schema.shard_name(split, index, len(shards)))
                if rewrite:
                    found = _rewrite(source, target, ids)
                    new_count += sum(found.values())
                elif teacher is not None and split == schema.TRAIN:
                    found = _with_teacher(source, target, teacher, len(class_names))
                else:
                    _link_or_copy(source, target)
                    found = _counts(source)
                per_class.update(found)
                counts.append(sum(found.values()))
            info["splits"][split] = {
                "count": sum(counts), "num_shards": len(shards), "shard_counts": counts,
                "per_class": {name: per_class[name] for name in class_names},
                "new_labels": new_count}
        schema.write_labels(os.path.join(staging, schema.LABELS_FILE), class_names)
        with tf.io.gfile.GFile(os.path.join(staging, schema.INFO_FILE), "w") as handle:
            json.dump(info, handle, indent=2, sort_keys=True)
        dataset.publish(staging, output_dir)
    return info


def _optional_split(data_dir, split):
    """A split's shards, or [] when the data set has none (all new labels trained on)."""
    try:
        return splits.split_files(data_dir, split)
    except dataset.DatasetError:
        return []


@contextlib.contextmanager
def teacher(version_dir, name="teacher", version=0):
    """encoded images -> the probabilities of the SavedModel at `version_dir` (its
    serving_default signature, run by the server's own Servable): merge()'s `teacher` for
    --distill_weight. The model is unloaded on the way out."""
    servable = servable_lib.Servable(name, version, version_dir)
    try:
        _, signature_def = servable.signature(conventions.DEFAULT_SIGNATURE)

        def probabilities(images):
            feeds = {conventions.IMAGE_BYTES: np.array(images, dtype=object)}
            return servable.run(signature_def, feeds,
                                [conventions.PROBABILITIES])[conventions.PROBABILITIES]
        yield probabilities
    finally:
        servable.retire()
