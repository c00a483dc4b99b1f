"""--runner and --beam_options for the commands that run on Apache Beam
(slimserve-convert, slimserve-predict): defined once, as the `BeamOptions` section both
commands' configs include (slimserve/fields.py); the flag values become PipelineOptions
here, once, and the libraries (estimator/beam_dataset.py, serving/bulk/beam.py)
take those."""
import dataclasses
import logging
import shlex

from slimserve import errors
from slimserve import fields

RUNNERS = ("DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner", "PortableRunner")


@dataclasses.dataclass
class BeamOptions:
    """The two Beam flags; a command's config holds them as `beam: BeamOptions =
    fields.section(BeamOptions)`, and `pipeline()` turns them into PipelineOptions."""
    runner: str = fields.option(
        None, "Run on Apache Beam with this runner (needs the `beam` extra); unset: the "
        "local run. Same results either way.", choices=RUNNERS)
    beam_options: str = fields.option(
        "", "Beam pipeline options passed through with --runner, e.g. "
        "\"--direct_num_workers=2 --direct_running_mode=multi_processing\" or "
        "\"--project=P --region=R --temp_location=gs://B/tmp\".")

    def pipeline(self):
        """PipelineOptions, or None for a local run (options_from_flags)."""
        return options_from_flags(self.runner, self.beam_options)


BEAM_EXTRA_HINT = ("Apache Beam is not installed; --runner needs the `beam` extra: "
                   "pip install 'slimserve[beam]'")


def pipeline_options(runner, beam_options=""):
    """PipelineOptions for --runner plus the pass-through --beam_options string; a
    UserError names the flag at fault or the extra to install."""
    if runner not in RUNNERS:
        raise errors.UserError("--runner must be one of %s, got %r"
                               % (", ".join(RUNNERS), runner))
    try:
        from apache_beam.options import pipeline_options as options  # pylint: disable=g-import-not-at-top
    except ImportError:
        raise errors.UserError(BEAM_EXTRA_HINT) from None
    try:
        flags = shlex.split(beam_options or "")
    except ValueError as error:
        raise errors.UserError("--beam_options: %s" % error) from None
    return options.PipelineOptions(["--runner=%s" % runner] + flags)


def options_from_flags(runner, beam_options):
    """PipelineOptions when --runner is given, None for a local run; --beam_options
    without --runner is a UserError. Beam's per-worker INFO lines are silenced."""
    if not runner:
        if beam_options:
            raise errors.UserError("--beam_options needs --runner")
        return None
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    return pipeline_options(runner, beam_options)
