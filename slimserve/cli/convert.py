"""slimserve-convert: convert an image folder (or CSV of path,label) to sharded TFRecords.

    slimserve-convert --input=images/ --output_dir=data/ --validation_fraction=0.2
    slimserve-convert --input=gs://b/images --output_dir=gs://b/data --runner=DataflowRunner \
        --beam_options="--project=P --region=R --temp_location=gs://b/tmp"
"""
import sys

from absl import flags

from slimserve.estimator import beam_dataset
from slimserve.estimator import dataset
from slimserve.estimator import image_files
from slimserve.cli import beam
from slimserve.cli import logs

FLAGS = flags.FLAGS
flags.DEFINE_string("input", None, "Folder of class sub-folders, or a CSV/TSV of path,label.")
flags.DEFINE_string("output_dir", None, "Where shards, labels.txt and dataset_info.json go.")
flags.DEFINE_float("validation_fraction", 0.2,
                   "Fraction of each class held out for validation (stratified, seeded).")
flags.DEFINE_string("validation_input", None,
                    "A separate folder/CSV for validation; overrides --validation_fraction.")
flags.DEFINE_integer("train_shards", 8, "Number of training shards.")
flags.DEFINE_integer("validation_shards", 2, "Number of validation shards.")
flags.DEFINE_integer("seed", 0, "Seed of the split and of the training shard order.")
flags.DEFINE_integer("num_workers", None, "Decode/convert processes (default: all cores).")
flags.DEFINE_integer("jpeg_quality", 95, "JPEG quality for images that must be re-encoded.")
flags.DEFINE_integer("max_shorter_side", 0,
                     "Shrink images whose shorter side is longer than this many pixels "
                     "(aspect kept, never enlarged; 0 keeps the originals). Storing "
                     "images near the training size (e.g. 256 for 224) cuts the JPEG "
                     "decoding every training step pays.")
flags.DEFINE_integer("max_file_bytes", image_files.DEFAULT_MAX_FILE_BYTES,
                     "Skip input files larger than this many bytes (0: no limit); guards "
                     "against huge or hostile inputs.", lower_bound=0)
flags.DEFINE_bool("overwrite", False, "Replace an existing finished data set in --output_dir.")
flags.DEFINE_bool("force_unlock", False,
                  "Take over --output_dir's .convert.lock held by a conversion on another host "
                  "(this host cannot tell whether it still runs; a stale lock of this host is "
                  "taken over without it). Only once that conversion is gone.")
flags.DEFINE_bool("progress", True, "Show a progress bar.")
flags.DEFINE_enum("runner", None, beam.RUNNERS,
                  "Run the conversion as an Apache Beam pipeline on this runner (needs the "
                  "`beam` extra); unset: the local process-pool converter. Same split, "
                  "shards and records either way.")
flags.DEFINE_string("beam_options", "",
                    "Beam pipeline options passed through with --runner, e.g. "
                    "\"--direct_num_workers=2 --direct_running_mode=multi_processing\" or "
                    "\"--project=P --region=R --temp_location=gs://B/tmp\".")
flags.mark_flags_as_required(["input", "output_dir"])


def main(argv):
    del argv
    try:
        options = beam.options_from_flags(FLAGS.runner, FLAGS.beam_options)
        if options:
            info = beam_dataset.build_dataset(
                FLAGS.input, FLAGS.output_dir, options,
                FLAGS.validation_fraction, FLAGS.validation_input, FLAGS.train_shards,
                FLAGS.validation_shards, FLAGS.seed, FLAGS.jpeg_quality, FLAGS.overwrite,
                FLAGS.max_shorter_side, max_file_bytes=FLAGS.max_file_bytes,
                force_unlock=FLAGS.force_unlock)
        else:
            info = dataset.build_dataset(
                FLAGS.input, FLAGS.output_dir, FLAGS.validation_fraction,
                FLAGS.validation_input, FLAGS.train_shards, FLAGS.validation_shards,
                FLAGS.seed, FLAGS.num_workers, FLAGS.jpeg_quality, FLAGS.overwrite,
                FLAGS.progress, FLAGS.max_shorter_side, max_file_bytes=FLAGS.max_file_bytes,
                force_unlock=FLAGS.force_unlock)
    except (dataset.DatasetError, ValueError) as error:
        sys.exit("slimserve-convert: %s" % error)
    for line in dataset.format_summary(info, FLAGS.output_dir):
        print(line)


def run():
    logs.run(main)


if __name__ == "__main__":
    run()
