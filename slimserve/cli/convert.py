"""slimserve-convert: convert an image folder (or CSV of path,label) to sharded TFRecords.

    slimserve-convert --input=images/ --output_dir=data/ --validation_fraction=0.2
    slimserve-convert --input=images/ --output_dir=data/ --group_regex='^[^/]+/([^/]+)/'
    slimserve-convert --input=gs://b/images --output_dir=gs://b/data --runner=DataflowRunner \
        --beam_options="--project=P --region=R --temp_location=gs://b/tmp"

The flags are the fields of estimator/dataset.py's ConvertOptions plus the Beam section
(slimserve/cli/beam.py); without --runner the local process-pool converter runs, with it
the same plan on Apache Beam (estimator/beam_dataset.py): same split, shards and records.
"""
import dataclasses

from slimserve import fields
from slimserve.cli import beam as beam_cli
from slimserve.cli import logs
from slimserve.estimator import beam_dataset
from slimserve.estimator import dataset


@dataclasses.dataclass
class ConvertConfig:
    """The converter's options and the Beam flags."""
    convert: dataset.ConvertOptions = fields.section(dataset.ConvertOptions)
    beam: beam_cli.BeamOptions = fields.section(beam_cli.BeamOptions)


CONFIG = ConvertConfig


def main(config, args):
    del args
    options, pipeline = config.convert, config.beam.pipeline()
    if pipeline:
        info = beam_dataset.build_dataset(
            options.input, options.output_dir, pipeline, options.validation_fraction,
            options.validation_input, options.train_shards, options.validation_shards,
            options.seed, options.jpeg_quality, options.overwrite, options.max_shorter_side,
            max_file_bytes=options.max_file_bytes, force_unlock=options.force_unlock,
            group_regex=options.group_regex)
    else:
        info = dataset.build_dataset(
            options.input, options.output_dir, options.validation_fraction,
            options.validation_input, options.train_shards, options.validation_shards,
            options.seed, options.num_workers, options.jpeg_quality, options.overwrite,
            options.progress, options.max_shorter_side, max_file_bytes=options.max_file_bytes,
            force_unlock=options.force_unlock, group_regex=options.group_regex)
    for line in dataset.format_summary(info, options.output_dir):
        print(line)


def run():
    logs.run(main, config=CONFIG)


if __name__ == "__main__":
    run()
