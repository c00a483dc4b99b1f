"""input_fn: parallel-interleaved TFRecord shards -> preprocessed, batched images.

list_files -> interleave(TFRecordDataset) -> [cache] -> shuffle -> repeat -> parse +
decode + preprocess -> skip undecodable images -> batch -> prefetch. Sharded per
worker through the Estimator's input context, batched per replica.
"""
import dataclasses
import os
import struct
from typing import Optional, Tuple

import tensorflow as tf

from slimserve import conventions
from slimserve.estimator import compat
from slimserve.estimator import dataset
from slimserve.estimator import preprocessing
from slimserve.estimator import schema
from slimserve.estimator import splits

AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass
class InputConfig:
    """Every knob of the input pipeline; slimserve-train exposes each one as a flag.
    `preprocess` is the evaluation/serving preprocessing (size, style, crop, pixel limit),
    the one object export takes too."""
    preprocess: preprocessing.Spec = preprocessing.Spec(224, preprocessing.VGG)
    batch_size: int = 32
    shuffle_buffer: int = 2048
    cycle_length: int = 8
    num_parallel_calls: int = AUTOTUNE
    prefetch: int = AUTOTUNE
    cache: str = ""  # "" off, "memory", or a file path prefix
    area_range: Tuple[float, float] = (0.25, 1.0)
    aspect_ratio_range: Tuple[float, float] = (3 / 4, 4 / 3)
    random_flip: bool = True
    seed: Optional[int] = None
    # Training order fixed by the seed (parallel stages keep their input order; slower).
    # Off by default: evaluation is always ordered, training only needs to be random.
    deterministic: bool = False
    verify_shards: bool = True



def check_tfrecord_file(path):
    """Walks record headers (no payload reads); returns the record count.

    A truncated shard otherwise surfaces as a DataLossError deep inside training;
    here it is an error naming the file before the first step.
    """
    count, position = 0, 0
    with tf.io.gfile.GFile(path, "rb") as handle:
        size = handle.size()
        while position < size:
            if size - position < 12:
                raise dataset.DatasetError("%s: truncated record header at byte %d"
                                           % (path, position))
            handle.seek(position)
            (length,) = struct.unpack("<Q", handle.read(8))
            position += 8 + 4 + length + 4
            if position > size:
                raise dataset.DatasetError(
                    "%s: truncated record %d (needs %d bytes, file has %d)"
                    % (path, count, position, size))
            count += 1
    return count


# How deep check_data_dir looks for images and how many entries it reads at most: enough
# for <dir>/<class>/<image>, bounded for a --data_dir that points at a huge tree.
_SCAN_DEPTH = 2
_SCAN_LIMIT = 2000


def _first_image(folder):
    """An image file in `folder` or its sub-folders (depth _SCAN_DEPTH), else None."""
    seen = 0
    pending = [(folder, 0)]
    while pending:
        current, depth = pending.pop(0)
        try:
            entries = sorted(os.listdir(current))
        except OSError:
            continue
        for name in entries:
            seen += 1
            if seen > _SCAN_LIMIT:
                return None
            path = os.path.join(current, name)
            if name.lower().endswith(conventions.SERVABLE_IMAGE_SUFFIXES) and os.path.isfile(
                    path):
                return path
            if depth < _SCAN_DEPTH and os.path.isdir(path):
                pending.append((path, depth + 1))
    return None


def check_data_dir(data_dir, split="train"):
    """Raises DatasetError saying "run slimserve-convert" when --data_dir is not a data set
    slimserve-convert wrote: missing, holding images, or holding neither.

    Without it a folder of images failed with "--labels_file <dir>/labels.txt does not
    exist", naming a flag the user never passed."""
    convert = "slimserve-convert --input=<your image folder> --output_dir=%s" % data_dir
    if not tf.io.gfile.exists(data_dir):
        raise dataset.DatasetError(
            "--data_dir %s does not exist. It must be TFRecords made by slimserve-convert "
            "from your images (one sub-folder per class): run %s" % (data_dir, convert))
    if tf.io.gfile.glob(schema.shard_pattern(data_dir, split)) or tf.io.gfile.exists(
            os.path.join(data_dir, schema.INFO_FILE)):
        return
    local = "://" not in data_dir
    image = _first_image(data_dir) if local else None
    if image:
        target = data_dir.rstrip("/\\") + "_tfrecords"
        raise dataset.DatasetError(
            "--data_dir %s holds images (e.g. %s), not the TFRecords slimserve-train reads: "
            "run slimserve-convert --input=%s --output_dir=%s, then pass --data_dir=%s"
            % (data_dir, image, data_dir, target, target))
    raise dataset.DatasetError(
        "--data_dir %s holds no data set (no %s-* shards, no %s): run %s"
        % (data_dir, split, schema.INFO_FILE, convert))


def _parser(teacher_classes):
    """record -> (encoded image, label, {"teacher": probabilities} or {})."""
    spec = schema.feature_spec(with_label=True, teacher_classes=teacher_classes)

    def parse(serialized):
        parsed = tf.io.parse_single_example(serialized, spec)
        extra = {"teacher": parsed[schema.TEACHER]} if teacher_classes else {}
        return parsed[schema.ENCODED], tf.cast(parsed[schema.LABEL], tf.int32), extra
    return parse


def make_input_fn(data_dir, split, is_training, config: InputConfig, num_epochs=None,
                  teacher_classes=0):
    """Returns an Estimator input_fn over `<data_dir>/<split>-*-of-*`.

    Files are listed and checked when this is called, so a missing or truncated
    shard fails at once with its name. Training repeats forever unless
    `num_epochs` is given; evaluation makes one ordered pass. With `teacher_classes`
    (distillation, model.py), the features also hold "teacher": each record's
    schema.TEACHER probabilities, zeros where it has none.
    """
    if not tf.io.gfile.exists(os.path.join(data_dir, schema.INFO_FILE)):
        raise dataset.DatasetError(
            "%s has no %s, so it is not a finished data set (an interrupted or still running "
            "slimserve-convert?); run slimserve-convert to completion first"
            % (data_dir, schema.INFO_FILE))
    files = splits.split_files(data_dir, split)
    ordered = not is_training or config.deterministic
    if config.verify_shards:
        for path in files:
            check_tfrecord_file(path)
    spec = config.preprocess

    @compat.plain_graph_building
    def preprocess(encoded, label, extra):
        if is_training:
            image = preprocessing.train_image(
                encoded, spec.image_size, spec.style, config.area_range,
                config.aspect_ratio_range, config.random_flip, config.seed,
                spec.max_image_pixels)
        else:
            image = preprocessing.eval_image(encoded, spec.image_size, spec.style,
                                             spec.central_fraction, spec.max_image_pixels)
        return dict(extra, image=image), label

    def input_fn(params=None, input_context=None):
        del params
        batch_size = config.batch_size
        files_ds = tf.data.Dataset.list_files(files, shuffle=is_training, seed=config.seed)
        records_sharded = False
        if input_context is not None and input_context.num_input_pipelines > 1:
            if len(files) >= input_context.num_input_pipelines:
                files_ds = files_ds.shard(input_context.num_input_pipelines,
                                          input_context.input_pipeline_id)
            else:
                records_sharded = True
            batch_size = input_context.get_per_replica_batch_size(config.batch_size)
        ds = files_ds.interleave(
            tf.data.TFRecordDataset,
            cycle_length=min(config.cycle_length, len(files)),
            num_parallel_calls=config.num_parallel_calls,
            deterministic=ordered)
        if records_sharded:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        if config.cache == "memory":
            ds = ds.cache()
        elif config.cache:
            ds = ds.cache(config.cache + "-" + split)
        if is_training:
            ds = ds.shuffle(config.shuffle_buffer, seed=config.seed,
                            reshuffle_each_iteration=True)
        if is_training or num_epochs:
            ds = ds.repeat(num_epochs if num_epochs else None)
        ds = ds.map(compat.plain_graph_building(_parser(teacher_classes)),
                    num_parallel_calls=config.num_parallel_calls,
                    deterministic=ordered)
        ds = ds.map(preprocess, num_parallel_calls=config.num_parallel_calls,
                    deterministic=ordered)
        # Shards were structurally checked above, so what is skipped here is an
        # undecodable image or one whose header claims more than max_image_pixels
        # (checked before decoding); TF logs one warning per skipped record with its reason.
        ds = ds.apply(tf.data.experimental.ignore_errors(log_warning=True))
        ds = ds.batch(batch_size, drop_remainder=is_training)
        return ds.prefetch(config.prefetch)

    return input_fn

