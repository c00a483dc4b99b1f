"""--runner and --beam_options for the commands that run on Apache Beam
(slimserve-convert, slimserve-predict): the flag values become PipelineOptions here, once,
and the libraries (estimator/beam_dataset.py, serving/tools/beam_inference.py) take those."""
import logging
import shlex

RUNNERS = ("DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner", "PortableRunner")
BEAM_EXTRA_HINT = ("Apache Beam is not installed; --runner needs the `beam` extra: "
                   "pip install 'slimserve[beam]'")


def pipeline_options(runner, beam_options=""):
    """PipelineOptions for --runner plus the pass-through --beam_options string; a
    ValueError names the flag at fault or the extra to install."""
    if runner not in RUNNERS:
        raise ValueError("--runner must be one of %s, got %r" % (", ".join(RUNNERS), runner))
    try:
        from apache_beam.options import pipeline_options as options  # pylint: disable=g-import-not-at-top
    except ImportError:
        raise ValueError(BEAM_EXTRA_HINT) from None
    try:
        flags = shlex.split(beam_options or "")
    except ValueError as error:
        raise ValueError("--beam_options: %s" % error) from None
    return options.PipelineOptions(["--runner=%s" % runner] + flags)


def options_from_flags(runner, beam_options):
    """PipelineOptions when --runner is given, None for a local run; --beam_options
    without --runner is a ValueError. Beam's per-worker INFO lines are silenced."""
    if not runner:
        if beam_options:
            raise ValueError("--beam_options needs --runner")
        return None
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    return pipeline_options(runner, beam_options)
