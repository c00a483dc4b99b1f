"""Images (a folder of class sub-folders, or a CSV/TSV of path,label) -> sharded TFRecords.

Writes `train-%05d-of-%05d` / `validation-...` shards, `labels.txt` (`id:name`) and
`dataset_info.json` (counts per split and class, shards, skipped files with reasons).
With a group pattern (--group_regex) whole groups go to one split, so validation measures
groups the training never saw (stratified per class and seeded, as the per-image split).

Class names come from folder names or CSV labels; a name that `labels.txt` cannot
hold (control characters, line breaks, blank, not UTF-8) is refused up front, naming
where it came from. A class left without a usable training image (empty folder, all
files bad or missing) is left out of `labels.txt` and reported in `dropped_classes`,
never kept as a class the model cannot learn.

Everything is written into `<output_dir>/.partial/` first and moved into place only
when complete; `dataset_info.json` is moved last and marks a finished data set. An
interrupted run therefore never leaves a shard that looks finished, and a failed
`--overwrite` keeps the previous data set intact.
One conversion at a time per output folder: `<output_dir>/.convert.lock`
(estimator/run_lock.py, as training locks its model_dir) is held from before the
staging folder is touched until publication, so a second run into the same folder
fails naming the holder instead of publishing a mix of both.

Every converter runs the same steps, defined here once: `plan` (list, check names,
split, shuffle, shard ranges), `write_shard` (per-shard records and summary),
`assemble_info` (dataset_info from the summaries) and `finish` (drop and renumber
classes, labels.txt, dataset_info.json, publish). build_dataset converts images in a
process pool; estimator/beam_dataset.py runs the same plan on Apache Beam. Output
steps go through tf.io.gfile, so they work on local and gs:// paths alike.
"""
import collections
import contextlib
import dataclasses
import json
import logging
import multiprocessing
import os
import random
import re
import unicodedata

from slimserve import errors
from slimserve import fields
from slimserve import image_listing
from slimserve.estimator import image_files
from slimserve.estimator import run_lock
from slimserve.estimator import schema

PARTIAL_DIR = ".partial"
_OUTPUT_RE = re.compile(r"^(train|validation)-\d{5}-of-\d{5}$")


class DatasetError(errors.UserError):
    """Bad input to the builder; the message names the file or flag at fault."""


Item = collections.namedtuple("Item", "path label")

# Line breaks and other controls would split or garble a `labels.txt` line; Python's
# str.splitlines also breaks at the Unicode line and paragraph separators.
_FORBIDDEN_CATEGORIES = ("Cc", "Zl", "Zp")


def check_class_name(name, origin):
    """Refuses a class name that labels.txt (`id:name` per line) cannot round-trip."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise DatasetError("class name %r from %s is not valid UTF-8; rename it"
                           % (name, origin)) from None
    bad = sorted({char for char in name if unicodedata.category(char) in _FORBIDDEN_CATEGORIES})
    if bad:
        raise DatasetError("class name %r from %s contains control character(s) %s that "
                           "labels.txt cannot hold; rename it"
                           % (name, origin, ", ".join("U+%04X" % ord(c) for c in bad)))
    if not name.strip():
        raise DatasetError("class name %r from %s is blank" % (name, origin))


def scan_folder(root):
    """Lists (items, skipped, empty) of a folder whose sub-folders are the class names;
    `empty` maps each class folder without any file to a reason. The listing rules
    (hidden files, folder links, files outside a class folder) are
    slimserve/image_listing.py's, shared with the other tools."""
    if not os.path.isdir(root):
        raise DatasetError("input folder does not exist: %s" % root)
    try:
        listing = image_listing.list_folder(root, labels="required")
    except image_listing.ListingError as error:
        raise DatasetError(str(error)) from None
    for name, folder in listing.classes.items():
        check_class_name(name, "folder %r" % folder)
    items = [Item(entry.path, entry.label) for entry in listing.entries]
    found = collections.Counter(item.label for item in items)
    empty = {name: "class folder %s holds no image files" % folder
             for name, folder in listing.classes.items() if not found[name]}
    if not items:
        raise DatasetError("no files found in class sub-folders of %s" % root)
    return items, listing.skipped, empty


def read_csv(path):
    """Reads `path,label` rows (TSV when the file ends in .tsv); relative paths are
    relative to the CSV. A header row `path,label` is allowed. The file is UTF-8; a
    byte-order mark (as spreadsheet programs write) is dropped."""
    if not os.path.exists(path):
        raise DatasetError("input CSV does not exist: %s" % path)
    if not os.path.isfile(path):  # a FIFO or device would block or never end
        raise DatasetError("input is neither a folder nor a regular file: %s" % path)
    base = os.path.dirname(os.path.abspath(path))
    with open(path, newline="", encoding="utf-8-sig") as handle:
        return csv_items(handle, path, lambda file_path: os.path.join(base, file_path))


def csv_items(handle, path, resolve):
    """(items, [], {}) from the rows of an open text `handle` of the CSV/TSV at `path`
    (read_csv's parsing, shared with readers of remote CSVs); `resolve` turns a row's
    file path into the path to read. Rows are parsed by slimserve/image_listing.py
    (bounded lines, one set of CSV rules for every tool); class names are checked here."""
    try:
        rows = image_listing.csv_entries(handle, path, resolve, labels="required")
    except image_listing.ListingError as error:
        raise DatasetError(str(error)) from None
    items = []
    for number, entry in rows:
        check_class_name(entry.label, "%s:%d" % (path, number))
        items.append(Item(entry.path, entry.label))
    if not items:
        raise DatasetError("no rows in %s" % path)
    return items, [], {}


def read_input(path):
    """A folder of class sub-folders, or a CSV/TSV of path,label."""
    if not os.path.exists(path):
        raise DatasetError("input %s does not exist (expected a folder of class "
                           "sub-folders or a CSV/TSV of path,label)" % path)
    if os.path.isdir(path):
        return scan_folder(path)
    return read_csv(path)


def relative_path(path, input_path):
    """`path` relative to the folder `input_path` (or to the folder of the CSV it is),
    `/`-separated: what --group_regex reads."""
    base = input_path if not image_listing.is_csv(input_path) else (
        input_path.rsplit("/", 1)[0] if "://" in input_path else
        os.path.dirname(os.path.abspath(input_path)))
    if "://" in path or "://" in base:
        prefix = base.rstrip("/") + "/"
        return path[len(prefix):] if path.startswith(prefix) else path
    return os.path.relpath(path, base).replace(os.sep, "/")


def item_groups(items, input_path, group_regex):
    """The group of each item: --group_regex's first capture group (or whole match)
    searched in the item's path relative to `input_path`; a path it does not match is a
    DatasetError naming it (left alone it would land in either split and leak)."""
    try:
        pattern = re.compile(group_regex)
    except re.error as error:
        raise DatasetError("--group_regex %r is not a regular expression: %s"
                           % (group_regex, error)) from None
    groups, unmatched = [], []
    for item in items:
        relative = relative_path(item.path, input_path)
        match = pattern.search(relative)
        group = (match.group(1) if pattern.groups else match.group(0)) if match else None
        if not group:
            unmatched.append(relative)
        groups.append(group)
    if unmatched:
        raise DatasetError(
            "--group_regex %r finds no group in %d of %d paths (first: %s); every image "
            "needs one, e.g. '^[^/]+/([^/]+)/' for <class>/<group>/<image>"
            % (group_regex, len(unmatched), len(items), unmatched[0]))
    return groups


def grouped_split(items, groups, fraction, seed):
    """Whole groups into validation, seeded and stratified per class: groups in a seeded
    order each go to validation when that brings every class they hold closer to
    round(n * fraction) validation images, and never when it would leave a class without
    training images. Returns (train, validation, {split: number of groups})."""
    _check_option("validation_fraction", fraction)
    by_group = collections.defaultdict(list)
    for item, group in zip(items, groups):
        by_group[group].append(item)
    totals = collections.Counter(item.label for item in items)
    target = {label: round(count * fraction) for label, count in totals.items()}
    names = sorted(by_group)
    random.Random(seed).shuffle(names)
    in_validation, train_left = collections.Counter(), collections.Counter(totals)
    chosen = set()
    for name in names:
        counts = collections.Counter(item.label for item in by_group[name])
        before = sum(abs(in_validation[c] - target[c]) for c in counts)
        after = sum(abs(in_validation[c] + n - target[c]) for c, n in counts.items())
        if after < before and all(train_left[c] > n for c, n in counts.items()):
            chosen.add(name)
            in_validation.update(counts)
            train_left.subtract(counts)
    train = [item for name in sorted(by_group) if name not in chosen
             for item in sorted(by_group[name])]
    validation = [item for name in sorted(chosen) for item in sorted(by_group[name])]
    return train, validation, {schema.TRAIN: len(by_group) - len(chosen),
                               schema.VALIDATION: len(chosen)}


def stratified_split(items, fraction, seed):
    """Per class, a seeded shuffle puts round(n * fraction) items into validation."""
    _check_option("validation_fraction", fraction)
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


@dataclasses.dataclass
class ConvertOptions:
    """The converter's settings, one flag of slimserve-convert each (slimserve/fields.py:
    name, default, help and bound in one place); its command adds the Beam section."""
    input: str = fields.option(
        None, "Folder of class sub-folders, or a CSV/TSV of path,label.", required=True)
    output_dir: str = fields.option(
        None, "Where shards, labels.txt and dataset_info.json go.", required=True)
    validation_fraction: float = fields.option(
        0.2, "Fraction of each class held out for validation (stratified, seeded).",
        fields.FRACTION)
    validation_input: str = fields.option(
        None, "A separate folder/CSV for validation; overrides --validation_fraction.")
    group_regex: str = fields.option(
        None, "Keep groups whole: images that come in groups (a patient, camera, session, "
        "source, near-duplicates) go to one split together, so validation measures new "
        "groups. A regular expression searched in each image's path relative to --input "
        "('/'-separated; a CSV's paths as written): its first capture group, or the whole "
        "match, names the group; e.g. '^[^/]+/([^/]+)/' for <class>/<group>/<image>. The "
        "split is then by group, seeded and stratified per class; an image without a "
        "group is an error. With --validation_input, a group in both inputs is an error.")
    train_shards: int = fields.option(8, "Number of training shards.", fields.Bound(1))
    validation_shards: int = fields.option(2, "Number of validation shards.", fields.Bound(1))
    seed: int = fields.option(0, "Seed of the split and of the training shard order.")
    num_workers: int = fields.option(None, "Decode/convert processes (default: all cores).",
                                     fields.NON_NEGATIVE, kind=int)
    jpeg_quality: int = fields.option(
        95, "JPEG quality for images that must be re-encoded.", fields.Bound(1, 100))
    max_shorter_side: int = fields.option(
        0, "Shrink images whose shorter side is longer than this many pixels (aspect kept, "
        "never enlarged; 0 keeps the originals). Storing images near the training size "
        "(e.g. 256 for 224) cuts the JPEG decoding every training step pays.",
        fields.NON_NEGATIVE)
    max_file_bytes: int = fields.option(
        image_files.DEFAULT_MAX_FILE_BYTES, "Skip input files larger than this many bytes "
        "(0: no limit); guards against huge or hostile inputs.", fields.NON_NEGATIVE)
    overwrite: bool = fields.option(
        False, "Replace an existing finished data set in --output_dir.")
    force_unlock: bool = fields.option(
        False, "Take over --output_dir's .convert.lock held by a conversion on another host "
        "(this host cannot tell whether it still runs; a stale lock of this host is taken "
        "over without it). Only once that conversion is gone.")
    progress: bool = fields.option(True, "Show a progress bar.")


_OPTION_FIELDS = {field.name: field for field in dataclasses.fields(ConvertOptions)}


def _check_option(name, value):
    message = fields.violation(_OPTION_FIELDS[name], value)
    if message:
        raise DatasetError(message)


def check_options(validation_fraction, train_shards, validation_shards, max_shorter_side,
                  max_file_bytes):
    """Refuses bad settings before any input is listed, by ConvertOptions' bounds; the
    message names the flag."""
    for name, value in (("validation_fraction", validation_fraction),
                        ("train_shards", train_shards), ("validation_shards", validation_shards),
                        ("max_shorter_side", max_shorter_side),
                        ("max_file_bytes", max_file_bytes)):
        _check_option(name, value)


def shard_bounds(count, num_shards):
    """[(start, end)] of each shard of a split of `count` files: contiguous ranges, at
    most one shard per file, none for an empty split."""
    num_shards = max(1, min(num_shards, count)) if count else 0
    return [(shard * count // num_shards, (shard + 1) * count // num_shards)
            for shard in range(num_shards)]


Plan = collections.namedtuple(
    "Plan", "items bounds names skipped empty seed validation_fraction max_shorter_side "
            "max_file_bytes groups", defaults=(None,))
Plan.__doc__ = """Everything decided before any image is read: `items` and `bounds`
(shard ranges into items) per split, the class `names` (sorted), listing `skipped`
entries, `empty` class folders, and the settings dataset_info.json records (`groups`:
the --group_regex and the number of groups per split, or None)."""


def plan(input_path, validation_fraction=0.2, validation_input=None, train_shards=8,
         validation_shards=2, seed=0, max_shorter_side=0,
         max_file_bytes=image_files.DEFAULT_MAX_FILE_BYTES, reader=None, group_regex=None):
    """Lists and validates the input, splits it (stratified, seeded; by whole groups with
    `group_regex`), shuffles the training list (shards mix classes; validation keeps a
    stable order) and cuts both into shards. Every converter writes exactly this plan, so
    for the same input and settings each file lands in the same split, shard and position.

    `reader` lists an input path (default read_input; Beam passes one that also lists
    remote paths)."""
    reader = reader or read_input
    check_options(0.0 if validation_input else validation_fraction, train_shards,
                  validation_shards, max_shorter_side, max_file_bytes)
    items, skipped, empty = reader(input_path)
    skipped = list(skipped)
    groups = None
    if validation_input:
        validation, val_skipped, _ = reader(validation_input)
        train = list(items)
        skipped += val_skipped
        if group_regex:
            train_groups = set(item_groups(train, input_path, group_regex))
            val_groups = set(item_groups(validation, validation_input, group_regex))
            shared = sorted(train_groups & val_groups)
            if shared:
                raise DatasetError(
                    "--group_regex: %d group(s) are in both --input and --validation_input "
                    "(first: %s); validation would not measure new groups"
                    % (len(shared), ", ".join(shared[:5])))
            groups = {schema.TRAIN: len(train_groups), schema.VALIDATION: len(val_groups)}
    elif group_regex:
        train, validation, groups = grouped_split(
            items, item_groups(items, input_path, group_regex), validation_fraction, seed)
    else:
        train, validation = stratified_split(items, validation_fraction, seed)
    names = sorted({item.label for item in train} | {item.label for item in validation})
    unknown = sorted({item.label for item in validation} - {item.label for item in train})
    if unknown:
        raise DatasetError("validation classes missing from training data: %s" % unknown)
    random.Random(seed).shuffle(train)
    split_items = {schema.TRAIN: train, schema.VALIDATION: validation}
    bounds = {schema.TRAIN: shard_bounds(len(train), train_shards),
              schema.VALIDATION: shard_bounds(len(validation), validation_shards)}
    return Plan(split_items, bounds, names, skipped, dict(empty), seed,
                None if validation_input else validation_fraction, max_shorter_side,
                max_file_bytes, dict(groups, group_regex=group_regex) if groups else None)


def label_ids(names):
    """{class name: 0-based id} in the order labels.txt lists them."""
    return {name: index for index, name in enumerate(names)}


def stored_filename(path):
    """The basename as text; bytes that are not UTF-8 are kept as \\x escapes."""
    return os.fsencode(os.path.basename(path)).decode("utf-8", "backslashreplace")


def write_shard(path, split, results, ids):
    """Writes (Item, image_files.ImageResult) pairs, in order, as one shard file;
    returns the shard's summary (JSON-safe: Beam workers store it as a file)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    per_class, skipped, notes, converted = collections.Counter(), [], [], 0
    with tf.io.TFRecordWriter(path) as writer:
        for item, result in results:
            if result.skip_reason is not None:
                skipped.append({"path": item.path, "split": split, "class": item.label,
                                "reason": result.skip_reason})
                continue
            loaded = result.image
            converted += int(loaded.converted)
            if loaded.note:
                notes.append({"path": item.path, "note": loaded.note})
            example = schema.make_example(
                loaded.encoded, "jpeg", ids[item.label], item.label, loaded.height,
                loaded.width, 3, stored_filename(item.path))
            writer.write(example.SerializeToString())
            per_class[item.label] += 1
    return {"count": sum(per_class.values()), "per_class": dict(per_class),
            "converted_to_jpeg": converted, "skipped": skipped, "notes": notes}


def assemble_info(the_plan, summaries):
    """The dataset_info dictionary (before any class is dropped) from the plan and
    `summaries[split]`, the write_shard summaries of each split in shard order."""
    info = {"num_classes": len(the_plan.names), "labels": list(the_plan.names),
            "splits": {}, "seed": the_plan.seed,
            "validation_fraction": the_plan.validation_fraction,
            "max_shorter_side": the_plan.max_shorter_side,
            "max_file_bytes": the_plan.max_file_bytes,
            # {"group_regex", "train": groups, "validation": groups}: split by whole groups
            "groups": the_plan.groups}
    skipped, notes = list(the_plan.skipped), []
    for split in schema.SPLITS:
        shards = summaries[split]
        per_class = collections.Counter()
        for summary in shards:
            per_class.update(summary["per_class"])
            skipped += summary["skipped"]
            notes += summary["notes"]
        info["splits"][split] = {
            "count": sum(s["count"] for s in shards),
            "num_shards": len(shards),
            "shard_counts": [s["count"] for s in shards],
            "per_class": {name: per_class[name] for name in the_plan.names},
            "converted_to_jpeg": sum(s["converted_to_jpeg"] for s in shards),
        }
    info["skipped"] = skipped
    info["serving_notes"] = notes
    return info


def join(base, *parts):
    """os.path.join for local paths; `/`-joined for URLs (gs://...), as tf.io.gfile wants."""
    if "://" in base:
        return "/".join([base.rstrip("/")] + list(parts))
    return os.path.join(base, *parts)


def prepare_output(output_dir, overwrite):
    """Creates `output_dir` and an empty staging folder in it; returns the staging path.
    Refuses a finished data set unless `overwrite`. Works on local and gs:// paths."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.io.gfile.makedirs(output_dir)
    if tf.io.gfile.exists(join(output_dir, schema.INFO_FILE)) and not overwrite:
        raise DatasetError("%s already holds a data set (%s); pass --overwrite to replace it"
                           % (output_dir, schema.INFO_FILE))
    staging = join(output_dir, PARTIAL_DIR)
    if tf.io.gfile.exists(staging):
        logging.warning("removing %s left by an interrupted run", staging)
        tf.io.gfile.rmtree(staging)
    tf.io.gfile.makedirs(staging)
    return staging


def _convert(args):
    item, jpeg_quality, max_shorter_side, max_file_bytes = args
    return item, image_files.convert_file(item.path, jpeg_quality, max_shorter_side,
                                          max_file_bytes)


def _write_split(split, the_plan, staging, pool, jpeg_quality, progress):
    """Converts one split in the process pool and writes its shards; returns their
    summaries in shard order."""
    items, bounds = the_plan.items[split], the_plan.bounds[split]
    ids = label_ids(the_plan.names)
    results = pool.imap(
        _convert, [(item, jpeg_quality, the_plan.max_shorter_side, the_plan.max_file_bytes)
                   for item in items], chunksize=8)

    def shard_results(start, end):
        for _ in range(start, end):
            progress.update(1)
            yield next(results)

    return [write_shard(join(staging, schema.shard_name(split, shard, len(bounds))), split,
                        shard_results(start, end), ids)
            for shard, (start, end) in enumerate(bounds)]


def drop_classes(info, dropped, staging):
    """Rewrites the staged shards without the dropped classes, renumbering the rest so
    ids stay 0..N-1 (rare: costs one more pass over the shards)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    kept = [name for name in info["labels"] if name not in dropped]
    new_ids = label_ids(kept)
    for split, split_info in info["splits"].items():
        counts = []
        for shard in range(split_info["num_shards"]):
            path = join(staging, schema.shard_name(split, shard, split_info["num_shards"]))
            count = 0
            with tf.io.TFRecordWriter(path + ".renumbered") as writer:
                for record in tf.compat.v1.io.tf_record_iterator(path):
                    example = tf.train.Example.FromString(record)
                    feature = example.features.feature
                    name = feature[schema.TEXT].bytes_list.value[0].decode("utf-8")
                    if name in dropped:
                        continue
                    feature[schema.LABEL].int64_list.value[0] = new_ids[name]
                    writer.write(example.SerializeToString())
                    count += 1
            tf.io.gfile.rename(path + ".renumbered", path, overwrite=True)
            counts.append(count)
        split_info["shard_counts"] = counts
        split_info["count"] = sum(counts)
        split_info["per_class"] = {name: split_info["per_class"][name] for name in kept}
    info["labels"] = kept
    info["num_classes"] = len(kept)


def finish(info, the_plan, staging, output_dir, input_path):
    """Leaves out classes without a usable training image (renumbering the staged
    shards), writes labels.txt (read back) and dataset_info.json into `staging` and
    publishes them; returns the final info. Shared by every converter."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    names = info["labels"]
    train_skips = collections.Counter(entry["class"] for entry in info["skipped"]
                                      if entry.get("split") == schema.TRAIN)
    unusable = {name: "no usable training image (all %d training file(s) skipped)"
                % train_skips[name]
                for name in names if not info["splits"][schema.TRAIN]["per_class"][name]}
    if len(unusable) == len(names):
        raise DatasetError("no usable training image in %s; first skips: %s" % (
            input_path, "; ".join("%s: %s" % (e["path"], e["reason"])
                                  for e in info["skipped"][:5])))
    if unusable:
        drop_classes(info, unusable, staging)
        done = {entry["path"] for entry in info["skipped"]}
        info["skipped"] += [
            {"path": item.path, "split": schema.VALIDATION, "class": item.label,
             "reason": "class %r has no usable training image" % item.label}
            for item in the_plan.items[schema.VALIDATION]
            if item.label in unusable and item.path not in done]
    info["dropped_classes"] = dict(sorted(dict(the_plan.empty, **unusable).items()))
    labels_path = join(staging, schema.LABELS_FILE)
    schema.write_labels(labels_path, info["labels"])
    if schema.read_labels(labels_path) != info["labels"]:  # never publish what training rejects
        raise DatasetError("labels.txt does not read back as the class names %s"
                           % info["labels"])
    with tf.io.gfile.GFile(join(staging, schema.INFO_FILE), "w") as handle:
        json.dump(info, handle, indent=2, sort_keys=True)
    publish(staging, output_dir)
    return info


@contextlib.contextmanager
def lock_output(output_dir, force_unlock=False):
    """Holds `output_dir`'s lock for the block: DatasetError naming the holder while
    another conversion writes there; a stale lock is taken over (run_lock.py)."""
    lock = run_lock.RunLock.for_output_dir(output_dir, force_unlock)
    try:
        lock.acquire()
    except run_lock.LockedError as error:
        raise DatasetError(str(error)) from None
    try:
        yield lock
    finally:
        lock.release()


def build_dataset(input_path, output_dir, validation_fraction=0.2, validation_input=None,
                  train_shards=8, validation_shards=2, seed=0, num_workers=None,
                  jpeg_quality=95, overwrite=False, show_progress=True, max_shorter_side=0,
                  max_file_bytes=image_files.DEFAULT_MAX_FILE_BYTES, force_unlock=False,
                  group_regex=None):
    """Converts images to TFRecords; returns the dataset_info dictionary.

    Only regular files of at most `max_file_bytes` bytes are read (0: no limit); others
    are skipped with the reason. Classes without a usable training image are left out
    and listed in `dropped_classes` with the reason. `output_dir` is locked for the run
    (lock_output; `force_unlock` takes over another host's lock); a permission error or a
    full disk there is a UserError naming it, with nothing published. `group_regex`
    keeps groups whole across the splits (plan).
    """
    the_plan = plan(input_path, validation_fraction, validation_input, train_shards,
                    validation_shards, seed, max_shorter_side, max_file_bytes,
                    group_regex=group_regex)
    with errors.writing(output_dir, "--output_dir"), lock_output(output_dir, force_unlock):
        staging = prepare_output(output_dir, overwrite)
        from tqdm import tqdm  # pylint: disable=g-import-not-at-top
        context = multiprocessing.get_context("fork")
        workers = num_workers or os.cpu_count() or 1
        summaries = {}
        with context.Pool(workers) as pool, tqdm(
                total=sum(len(items) for items in the_plan.items.values()), unit="img",
                desc="converting", disable=not show_progress) as progress:
            for split in schema.SPLITS:
                summaries[split] = _write_split(split, the_plan, staging, pool, jpeg_quality,
                                                progress)
        return finish(assemble_info(the_plan, summaries), the_plan, staging, output_dir,
                      input_path)


def format_summary(info, output_dir):
    """The lines a command prints after a build: counts, dropped classes, skips, notes."""
    counts = {split: info["splits"][split]["count"] for split in info["splits"]}
    lines = ["wrote %s to %s (%d classes, %d skipped)" % (
        json.dumps(counts), output_dir, info["num_classes"], len(info["skipped"]))]
    if info.get("groups"):
        lines.append("  split by group (--group_regex %s): %d train, %d validation groups"
                     % (info["groups"]["group_regex"], info["groups"][schema.TRAIN],
                        info["groups"][schema.VALIDATION]))
    for name, reason in info.get("dropped_classes", {}).items():
        lines.append("  class %r left out: %s" % (name, reason))
    for entry in info["skipped"]:
        lines.append("  skipped %s: %s" % (entry["path"], entry["reason"]))
    for entry in info.get("serving_notes", []):
        lines.append("  note %s: %s" % (entry["path"], entry["note"]))
    return lines


def publish(staging, output_dir):
    """Replaces old outputs by the staged ones (local or gs://). The old info file goes
    first, so the old set stops looking finished; the new info file goes last, marking
    completion."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    info_path = join(output_dir, schema.INFO_FILE)
    if tf.io.gfile.exists(info_path):
        tf.io.gfile.remove(info_path)
    for name in sorted(tf.io.gfile.listdir(output_dir)):
        name = name.rstrip("/")
        if _OUTPUT_RE.match(name) or name == schema.LABELS_FILE:
            tf.io.gfile.remove(join(output_dir, name))
    for name in sorted(tf.io.gfile.listdir(staging)):
        name = name.rstrip("/")
        if name != schema.INFO_FILE:
            tf.io.gfile.rename(join(staging, name), join(output_dir, name), overwrite=True)
    tf.io.gfile.rename(join(staging, schema.INFO_FILE), info_path, overwrite=True)
    tf.io.gfile.rmtree(staging)
