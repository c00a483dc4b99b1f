"""input_fn: parallel-interleaved TFRecord shards -> preprocessed, batched images.

list_files -> interleave(TFRecordDataset) -> [cache] -> shuffle -> repeat -> parse +
decode + preprocess -> skip undecodable images -> batch -> prefetch. Sharded per
worker through the Estimator's input context, batched per replica.
"""
import dataclasses
import os
import struct
from typing import Optional

import tensorflow as tf

from slimserve import conventions
from slimserve import errors
from slimserve import fields
from slimserve.estimator import compat
from slimserve.estimator import dataset
from slimserve.estimator import preprocessing
from slimserve.estimator import schema
from slimserve.estimator import splits

AUTOTUNE = tf.data.AUTOTUNE


# -1 is tf.data.AUTOTUNE.
AUTOTUNE_OR_POSITIVE = fields.Bound(0, lower_open=True, also=(-1,))


@dataclasses.dataclass
class InputConfig:
    """Every knob of the input pipeline and the evaluation geometry, as slimserve-train's
    flags (TrainConfig.input: one flag per field, name, default, help and bound here).
    make_input_fn takes it as it is, with the evaluation/serving preprocessing that
    image_size, eval_central_fraction and max_image_pixels give for the net
    (TrainConfig.preprocess(): the one preprocessing.Spec export takes too)."""
    image_size: Optional[int] = fields.option(
        None, "Network input side (default: the net's own: 224, 299 for resnet_v2_*).",
        fields.POSITIVE, kind=int)
    batch_size: int = fields.option(
        32, "Global training batch size (split across replicas).", fields.POSITIVE)
    eval_batch_size: int = fields.option(64, "Evaluation batch size.", fields.POSITIVE)
    shuffle_buffer: int = fields.option(2048, "Records in the training shuffle buffer.",
                                        fields.POSITIVE)
    cycle_length: int = fields.option(8, "Shards read in parallel by interleave.",
                                      fields.POSITIVE)
    num_parallel_calls: int = fields.option(-1, "Parallel map calls (-1: AUTOTUNE).",
                                            AUTOTUNE_OR_POSITIVE)
    prefetch: int = fields.option(-1, "Batches to prefetch (-1: AUTOTUNE).",
                                  AUTOTUNE_OR_POSITIVE)
    cache: str = fields.option("", "Cache records: '' off, 'memory', or a file prefix.")
    min_crop_area: float = fields.option(0.25, "Smallest random-crop area, as a fraction.",
                                         fields.SHARE)
    max_crop_area: float = fields.option(1.0, "Largest random-crop area, as a fraction.",
                                         fields.SHARE)
    min_aspect_ratio: float = fields.option(
        3 / 4, "Smallest random-crop aspect ratio (w/h).", fields.POSITIVE)
    max_aspect_ratio: float = fields.option(
        4 / 3, "Largest random-crop aspect ratio (w/h).", fields.POSITIVE)
    random_flip: bool = fields.option(True, "Random left-right flips in training.")
    eval_central_fraction: float = fields.option(
        0.875, "Eval and serving crop: vgg-style nets (resnet_v1, vgg) keep the central "
        "square of this fraction of the shorter side (slim's 224/256); inception-style "
        "(resnet_v2) this fraction of each side (1.0: no crop).", fields.SHARE)
    max_image_pixels: int = fields.option(
        preprocessing.DEFAULT_MAX_IMAGE_PIXELS,
        "Images whose header claims more pixels (width x height; all frames of a GIF) fail "
        "before decoding: skipped by the train/eval input, INVALID_ARGUMENT from the "
        "exported model.", fields.POSITIVE)
    verify_shards: bool = fields.option(True, "Check every shard's record structure first.")
    deterministic_input: bool = fields.option(
        False, "Training examples in an order fixed by --seed (parallel input stages keep "
        "their order; slower). Evaluation is always in order.")

    def check(self):
        """fields.check, then the rules that join fields; a UserError naming the flags.
        Returns self."""
        fields.check(self)
        if self.min_crop_area > self.max_crop_area:
            raise errors.UserError("--min_crop_area must be <= --max_crop_area, got %g > %g"
                                   % (self.min_crop_area, self.max_crop_area))
        if self.min_aspect_ratio > self.max_aspect_ratio:
            raise errors.UserError(
                "--min_aspect_ratio must be <= --max_aspect_ratio, got %g > %g"
                % (self.min_aspect_ratio, self.max_aspect_ratio))
        return self


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


def make_input_fn(data_dir, split, is_training, config: InputConfig,
                  preprocess: preprocessing.Spec, seed=None, num_epochs=None,
                  teacher_classes=0):
    """Returns an Estimator input_fn over `<data_dir>/<split>-*-of-*`: batches of
    config.batch_size in training, config.eval_batch_size in evaluation, images made as
    `preprocess` says (random crops and flips of `config` on top in training), shuffled
    and cropped with `seed` (--seed; None: unseeded).

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
    ordered = not is_training or config.deterministic_input
    if config.verify_shards:
        for path in files:
            check_tfrecord_file(path)
    spec = preprocess
    area_range = (config.min_crop_area, config.max_crop_area)
    aspect_ratio_range = (config.min_aspect_ratio, config.max_aspect_ratio)
    batch_size = config.batch_size if is_training else config.eval_batch_size

    @compat.plain_graph_building
    def preprocess_image(encoded, label, extra):
        if is_training:
            image = preprocessing.train_image(
                encoded, spec.image_size, spec.style, area_range, aspect_ratio_range,
                config.random_flip, seed, spec.max_image_pixels)
        else:
            image = preprocessing.eval_image(encoded, spec.image_size, spec.style,
                                             spec.central_fraction, spec.max_image_pixels)
        return dict(extra, image=image), label

    def input_fn(params=None, input_context=None):
        del params
        replica_batch_size = batch_size
        files_ds = tf.data.Dataset.list_files(files, shuffle=is_training, seed=seed)
        records_sharded = False
        if input_context is not None and input_context.num_input_pipelines > 1:
            if len(files) >= input_context.num_input_pipelines:
                files_ds = files_ds.shard(input_context.num_input_pipelines,
                                          input_context.input_pipeline_id)
            else:
                records_sharded = True
            replica_batch_size = input_context.get_per_replica_batch_size(batch_size)
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
            ds = ds.shuffle(config.shuffle_buffer, seed=seed,
                            reshuffle_each_iteration=True)
        if is_training or num_epochs:
            ds = ds.repeat(num_epochs if num_epochs else None)
        ds = ds.map(compat.plain_graph_building(_parser(teacher_classes)),
                    num_parallel_calls=config.num_parallel_calls,
                    deterministic=ordered)
        ds = ds.map(preprocess_image, num_parallel_calls=config.num_parallel_calls,
                    deterministic=ordered)
        # Shards were structurally checked above, so what is skipped here is an
        # undecodable image or one whose header claims more than max_image_pixels
        # (checked before decoding); TF logs one warning per skipped record with its reason.
        ds = ds.apply(tf.data.experimental.ignore_errors(log_warning=True))
        ds = ds.batch(replica_batch_size, drop_remainder=is_training)
        return ds.prefetch(config.prefetch)

    return input_fn

