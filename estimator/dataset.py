"""Images (a folder of class sub-folders, or a CSV/TSV of path,label) -> sharded TFRecords.

Writes `train-%05d-of-%05d` / `validation-...` shards, `labels.txt` (`id:name`) and
`dataset_info.json` (counts per split and class, shards, skipped files with reasons).

Everything is written into `<output_dir>/.partial/` first and moved into place only
when complete; `dataset_info.json` is moved last and marks a finished data set. An
interrupted run therefore never leaves a shard that looks finished, and a failed
`--overwrite` keeps the previous data set intact.
"""
import collections
import csv
import glob
import json
import logging
import multiprocessing
import os
import random
import re
import shutil

from estimator import image_files
from estimator import schema

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp")
PARTIAL_DIR = ".partial"
_OUTPUT_RE = re.compile(r"^(train|validation)-\d{5}-of-\d{5}$")


class DatasetError(ValueError):
    """Bad input to the builder; the message names the file or flag at fault."""


Item = collections.namedtuple("Item", "path label")


def scan_folder(root):
    """Lists (items, skipped) of a folder whose sub-folders are the class names."""
    if not os.path.isdir(root):
        raise DatasetError("input folder does not exist: %s" % root)
    items, skipped = [], []
    for entry in sorted(os.listdir(root)):
        full = os.path.join(root, entry)
        if not os.path.isdir(full):
            skipped.append({"path": full, "reason": "not inside a class folder"})
            continue
        if entry.startswith("."):
            skipped.append({"path": full, "reason": "hidden folder"})
            continue
        for dirpath, dirnames, filenames in os.walk(full):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                if name.startswith("."):
                    skipped.append({"path": path, "reason": "hidden file"})
                else:
                    items.append(Item(path, entry))
    if not items:
        raise DatasetError("no files found in class sub-folders of %s" % root)
    return items, skipped


def read_csv(path):
    """Reads `path,label` rows (TSV when the file ends in .tsv); relative paths are
    relative to the CSV. A header row `path,label` is allowed."""
    if not os.path.isfile(path):
        raise DatasetError("input CSV does not exist: %s" % path)
    delimiter = "\t" if path.endswith(".tsv") else ","
    base = os.path.dirname(os.path.abspath(path))
    items = []
    with open(path, newline="") as handle:
        for number, row in enumerate(csv.reader(handle, delimiter=delimiter), 1):
            if not row or not "".join(row).strip():
                continue
            if len(row) != 2:
                raise DatasetError("%s:%d: expected 2 columns (path,label), got %d"
                                   % (path, number, len(row)))
            file_path, label = row[0].strip(), row[1].strip()
            if number == 1 and (file_path.lower(), label.lower()) == ("path", "label"):
                continue
            if not label:
                raise DatasetError("%s:%d: empty label" % (path, number))
            items.append(Item(os.path.join(base, file_path), label))
    if not items:
        raise DatasetError("no rows in %s" % path)
    return items, []


def read_input(path):
    if os.path.isdir(path):
        return scan_folder(path)
    return read_csv(path)


def stratified_split(items, fraction, seed):
    """Per class, a seeded shuffle puts round(n * fraction) items into validation."""
    if not 0.0 <= fraction < 1.0:
        raise DatasetError("--validation_fraction must be in [0, 1), got %s" % fraction)
    by_class = collections.defaultdict(list)
    for item in items:
        by_class[item.label].append(item)
    rng = random.Random(seed)
    train, validation = [], []
    for label in sorted(by_class):
        members = sorted(by_class[label])
        rng.shuffle(members)
        count = int(round(len(members) * fraction))
        validation.extend(members[:count])
        train.extend(members[count:])
    return train, validation


def _convert(args):
    item, jpeg_quality, max_shorter_side = args
    try:
        return item, image_files.load_image(item.path, jpeg_quality, max_shorter_side), None
    except image_files.SkippedImage as skipped:
        return item, None, str(skipped)
    except Exception as error:  # pylint: disable=broad-except  (never crash a conversion)
        return item, None, "unreadable image: %s: %s" % (type(error).__name__, error)


def _write_split(split, items, num_shards, label_ids, staging, pool, jpeg_quality,
                 max_shorter_side, progress):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    num_shards = max(1, min(num_shards, len(items))) if items else 0
    per_class = collections.Counter()
    skipped, converted, written = [], 0, 0
    shard_counts = []
    results = pool.imap(_convert, [(item, jpeg_quality, max_shorter_side) for item in items],
                        chunksize=8)
    position = 0
    for shard in range(num_shards):
        end = (shard + 1) * len(items) // num_shards
        name = schema.shard_name(split, shard, num_shards)
        count = 0
        with tf.io.TFRecordWriter(os.path.join(staging, name)) as writer:
            while position < end:
                item, loaded, reason = next(results)
                position += 1
                progress.update(1)
                if loaded is None:
                    skipped.append({"path": item.path, "split": split, "reason": reason})
                    continue
                encoded, height, width, was_converted = loaded
                converted += int(was_converted)
                example = schema.make_example(
                    encoded, "jpeg", label_ids[item.label], item.label, height, width,
                    3, os.path.basename(item.path))
                writer.write(example.SerializeToString())
                per_class[item.label] += 1
                count += 1
        shard_counts.append(count)
        written += count
    return {
        "count": written,
        "num_shards": num_shards,
        "shard_counts": shard_counts,
        "per_class": {label: per_class[label] for label in sorted(label_ids)},
        "converted_to_jpeg": converted,
    }, skipped


def _existing_outputs(output_dir):
    names = []
    for name in os.listdir(output_dir):
        if _OUTPUT_RE.match(name) or name in (schema.LABELS_FILE, schema.INFO_FILE):
            names.append(name)
    return sorted(names)


def build_dataset(input_path, output_dir, validation_fraction=0.2, validation_input=None,
                  train_shards=8, validation_shards=2, seed=0, num_workers=None,
                  jpeg_quality=95, overwrite=False, show_progress=True, max_shorter_side=0):
    """Converts images to TFRecords; returns the dataset_info dictionary."""
    items, skipped = read_input(input_path)
    if validation_input:
        validation, val_skipped = read_input(validation_input)
        train = items
        skipped += val_skipped
    else:
        train, validation = stratified_split(items, validation_fraction, seed)
    names = sorted({item.label for item in train} | {item.label for item in validation})
    unknown = sorted({item.label for item in validation} - {item.label for item in train})
    if unknown:
        raise DatasetError("validation classes missing from training data: %s" % unknown)
    label_ids = {name: index for index, name in enumerate(names)}
    for flag, value in (("--train_shards", train_shards),
                        ("--validation_shards", validation_shards)):
        if value < 1:
            raise DatasetError("%s must be >= 1, got %d" % (flag, value))
    if max_shorter_side < 0:
        raise DatasetError("--max_shorter_side must be >= 0 (0 keeps the original size), "
                           "got %d" % max_shorter_side)

    os.makedirs(output_dir, exist_ok=True)
    if os.path.exists(os.path.join(output_dir, schema.INFO_FILE)) and not overwrite:
        raise DatasetError("%s already holds a data set (%s); pass --overwrite to replace it"
                           % (output_dir, schema.INFO_FILE))
    staging = os.path.join(output_dir, PARTIAL_DIR)
    if os.path.exists(staging):
        logging.warning("removing %s left by an interrupted run", staging)
        shutil.rmtree(staging)
    os.makedirs(staging)

    rng = random.Random(seed)
    rng.shuffle(train)  # shards mix classes; validation keeps a stable order
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    context = multiprocessing.get_context("fork")
    workers = num_workers or os.cpu_count() or 1
    info = {"num_classes": len(names), "labels": names, "splits": {}, "seed": seed,
            "validation_fraction": None if validation_input else validation_fraction,
            "max_shorter_side": max_shorter_side}
    all_skipped = list(skipped)
    with context.Pool(workers) as pool, tqdm(
            total=len(train) + len(validation), unit="img", desc="converting",
            disable=not show_progress) as progress:
        for split, split_items, shards in ((schema.TRAIN, train, train_shards),
                                           (schema.VALIDATION, validation, validation_shards)):
            info["splits"][split], split_skipped = _write_split(
                split, split_items, shards, label_ids, staging, pool, jpeg_quality,
                max_shorter_side, progress)
            all_skipped += split_skipped
    info["skipped"] = all_skipped
    schema.write_labels(os.path.join(staging, schema.LABELS_FILE), names)
    with open(os.path.join(staging, schema.INFO_FILE), "w") as handle:
        json.dump(info, handle, indent=2, sort_keys=True)
    _publish(staging, output_dir)
    return info


def _publish(staging, output_dir):
    """Replaces old outputs by the staged ones. The old info file goes first, so the
    old set stops looking finished; the new info file goes last, marking completion."""
    info_path = os.path.join(output_dir, schema.INFO_FILE)
    if os.path.exists(info_path):
        os.remove(info_path)
    for name in _existing_outputs(output_dir):
        os.remove(os.path.join(output_dir, name))
    for name in sorted(os.listdir(staging)):
        if name != schema.INFO_FILE:
            os.replace(os.path.join(staging, name), os.path.join(output_dir, name))
    os.replace(os.path.join(staging, schema.INFO_FILE), info_path)
    os.rmdir(staging)


def split_files(data_dir, split):
    """The complete shard list of a split; a missing shard is an error naming it."""
    files = sorted(glob.glob(schema.shard_pattern(data_dir, split)))
    if not files:
        raise DatasetError("no %s shards matching %s" % (split, schema.shard_pattern(data_dir, split)))
    expected = int(files[0].rsplit("-of-", 1)[1])
    want = [os.path.join(data_dir, schema.shard_name(split, i, expected)) for i in range(expected)]
    missing = sorted(set(want) - set(files))
    if missing:
        raise DatasetError("missing shard(s): %s" % ", ".join(missing))
    return want
