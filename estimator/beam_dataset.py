"""The dataset conversion of dataset.py as an Apache Beam pipeline (DirectRunner locally,
Dataflow / Flink / Spark beyond one machine).

Only the per-image work runs on Beam; everything else is dataset.py's own code, so the
two converters cannot drift apart. The launcher makes the plan with `dataset.plan`
(listing, class-name checks, split, shuffle, shard ranges), so every file lands in the
same split, shard and position as with the local converter. Workers convert images
with image_files.py and write whole shards with `dataset.write_shard` into
`<output_dir>/.partial/`, each with a JSON summary beside it. The launcher then builds
dataset_info.json with `dataset.assemble_info` and finishes with `dataset.finish`
(classes without a usable training image left out and the shards renumbered, labels.txt
read back, dataset_info.json written last, published as dataset.py does), so a
half-finished run never looks like a data set.

Remote inputs (gs://, s3://, hdfs:// where the matching Beam extra is installed) are
listed and read through Beam's FileSystems: bytes bounded by `max_file_bytes` go
straight to `image_files.convert_bytes`. Object stores hold no empty folders, so a
remote class folder counts as empty only through a folder placeholder object
(`cls/`, as the Cloud Console creates). Local paths are read exactly as dataset.py
reads them (regular files only). Outputs go through tf.io.gfile (local or gs://).
"""
import collections
import io
import json

from slimserve import errors
from slimserve.estimator import dataset
from slimserve.estimator import image_files
from slimserve.estimator import schema

_SUMMARIES = "_shard_summaries"

PlannedFile = collections.namedtuple("PlannedFile", "path label split shard position")


def planned_files(the_plan):
    """Every file of a dataset.Plan with its split, shard and position in the split."""
    for split in schema.SPLITS:
        items = the_plan.items[split]
        for shard, (start, end) in enumerate(the_plan.bounds[split]):
            for position in range(start, end):
                yield PlannedFile(items[position].path, items[position].label, split, shard,
                                  position)


def _has_scheme(path):
    return "://" in path


def read_input(path):
    """dataset.read_input for local paths; a FileSystems listing for remote ones.
    Returns (items, skipped, empty class folders) as dataset.read_input does."""
    if not _has_scheme(path):
        return dataset.read_input(path)
    from apache_beam.io.filesystem import CompressionTypes  # pylint: disable=g-import-not-at-top
    from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
    if path.endswith((".csv", ".tsv")):
        if not FileSystems.exists(path):
            raise dataset.DatasetError("input CSV does not exist: %s" % path)
        base = path.rsplit("/", 1)[0]
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
            handle = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
            return dataset.csv_items(handle, path, lambda file_path: file_path if (
                _has_scheme(file_path) or file_path.startswith("/")) else
                                     base + "/" + file_path)
    return _scan_remote_folder(path.rstrip("/"), FileSystems)


def _scan_remote_folder(root, file_systems):
    """dataset.scan_folder over an object store's listing (sorted by path)."""
    items, skipped, classes, found = [], [], set(), collections.Counter()
    matched = file_systems.match([root + "/**"])[0].metadata_list
    for metadata in sorted(matched, key=lambda m: m.path):
        relative = metadata.path[len(root) + 1:].split("/")
        if len(relative) < 2:
            skipped.append({"path": metadata.path, "reason": "not inside a class folder"})
            continue
        if relative[0].startswith("."):
            skipped.append({"path": metadata.path, "reason": "hidden folder"})
            continue
        if relative[0] not in classes:
            dataset.check_class_name(relative[0], "folder %r" % (root + "/" + relative[0]))
            classes.add(relative[0])
        if not relative[-1]:  # a folder placeholder object, `cls/` or `cls/sub/`
            continue
        if relative[-1].startswith("."):
            skipped.append({"path": metadata.path, "reason": "hidden file"})
            continue
        items.append(dataset.Item(metadata.path, relative[0]))
        found[relative[0]] += 1
    if not items:
        raise dataset.DatasetError("no files found in class sub-folders of %s" % root)
    empty = {name: "class folder %s holds no image files" % (root + "/" + name)
             for name in sorted(classes) if not found[name]}
    return items, skipped, empty


def read_remote(path, max_file_bytes=image_files.DEFAULT_MAX_FILE_BYTES):
    """The bytes of a remote file of at most `max_file_bytes` (0: no limit) through
    Beam's FileSystems, the size checked before reading and the read bounded; raises
    image_files.SkippedImage with the same reasons as image_files.read_file."""
    from apache_beam.io.filesystem import CompressionTypes  # pylint: disable=g-import-not-at-top
    from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
    try:
        size = FileSystems.get_filesystem(path).size(path)
    except Exception as error:  # pylint: disable=broad-except  (any filesystem's error)
        raise image_files.SkippedImage("unreadable: %s" % error) from None
    if max_file_bytes and size > max_file_bytes:
        raise image_files.SkippedImage("file too large: %d bytes > max_file_bytes=%d"
                                       % (size, max_file_bytes))
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            data = handle.read(max_file_bytes + 1 if max_file_bytes else -1)
    except Exception as error:  # pylint: disable=broad-except
        raise image_files.SkippedImage("unreadable: %s" % error) from None
    if max_file_bytes and len(data) > max_file_bytes:
        raise image_files.SkippedImage("file grew past max_file_bytes=%d while being read"
                                       % max_file_bytes)
    return data


def convert(planned, jpeg_quality, max_shorter_side, max_file_bytes):
    """((split, shard), (planned, ImageResult)): local paths exactly as dataset.py
    converts them, remote ones read through FileSystems."""
    if _has_scheme(planned.path):
        result = image_files.convert_read(lambda: read_remote(planned.path, max_file_bytes),
                                          jpeg_quality, max_shorter_side)
    else:
        result = image_files.convert_file(planned.path, jpeg_quality, max_shorter_side,
                                          max_file_bytes)
    return (planned.split, planned.shard), (planned, result)


def write_shard(keyed, staging, num_shards, label_ids):
    """Writes one shard in planned order with dataset.write_shard and stores its
    summary beside it for the launcher."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    (split, shard), results = keyed
    results = sorted(results, key=lambda result: result[0].position)
    name = schema.shard_name(split, shard, num_shards[split])
    summary = dataset.write_shard(
        dataset.join(staging, name), split,
        [(dataset.Item(planned.path, planned.label), result) for planned, result in results],
        label_ids)
    with tf.io.gfile.GFile(dataset.join(staging, _SUMMARIES, name + ".json"), "w") as handle:
        json.dump(summary, handle)
    return name


def _read_summaries(staging, the_plan):
    """{split: [shard summary]} as the workers stored them; a missing one is an error."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    summaries = {}
    for split in schema.SPLITS:
        shards = len(the_plan.bounds[split])
        summaries[split] = []
        for shard in range(shards):
            name = schema.shard_name(split, shard, shards)
            path = dataset.join(staging, _SUMMARIES, name + ".json")
            if not tf.io.gfile.exists(path):
                raise dataset.DatasetError("the pipeline finished without writing shard %s"
                                           % name)
            with tf.io.gfile.GFile(path) as handle:
                summaries[split].append(json.load(handle))
    return summaries


def build_dataset(input_path, output_dir, options,
                  validation_fraction=0.2, validation_input=None, train_shards=8,
                  validation_shards=2, seed=0, jpeg_quality=95, overwrite=False,
                  max_shorter_side=0, max_file_bytes=image_files.DEFAULT_MAX_FILE_BYTES,
                  force_unlock=False, group_regex=None):
    """dataset.build_dataset on Beam, with these PipelineOptions (runner and its options:
    slimserve/cli/beam.py makes them from the flags); returns the dataset_info dictionary.
    The launcher holds the output folder's lock (dataset.lock_output) for the whole run."""
    import apache_beam as beam  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    the_plan = dataset.plan(input_path, validation_fraction, validation_input, train_shards,
                            validation_shards, seed, max_shorter_side, max_file_bytes,
                            reader=read_input, group_regex=group_regex)
    num_shards = {split: len(bounds) for split, bounds in the_plan.bounds.items()}
    with errors.writing(output_dir, "--output_dir"), dataset.lock_output(output_dir,
                                                                          force_unlock):
        staging = dataset.prepare_output(output_dir, overwrite)
        tf.io.gfile.makedirs(dataset.join(staging, _SUMMARIES))

        with beam.Pipeline(options=options) as pipeline:
            _ = (pipeline
                 | "Plan" >> beam.Create(list(planned_files(the_plan)))
                 | "Spread" >> beam.Reshuffle()
                 | "Convert" >> beam.Map(convert, jpeg_quality, max_shorter_side,
                                         max_file_bytes)
                 | "GroupByShard" >> beam.GroupByKey()
                 | "WriteShard" >> beam.Map(write_shard, staging, num_shards,
                                            dataset.label_ids(the_plan.names)))

        summaries = _read_summaries(staging, the_plan)
        tf.io.gfile.rmtree(dataset.join(staging, _SUMMARIES))
        return dataset.finish(dataset.assemble_info(the_plan, summaries), the_plan, staging,
                              output_dir, input_path)
