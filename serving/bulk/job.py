"""slimserve-predict's run: the local job (serving/bulk/predict.py) or, with Beam pipeline
options, the same job on Beam (serving/bulk/beam.py); then the summary beside the
predictions (serving/bulk/report.py).

`run` is the command's one call; `config` is its PredictConfig (slimserve/cli/predict.py),
whose `beam.pipeline()` gives the PipelineOptions or None for a local run. Every output
path is checked before any model loads; a bad one is a UserError naming its flag.
"""
from slimserve.serving.bulk import beam as beam_inference
from slimserve.serving.bulk import predict as bulk_predict
from slimserve.serving.bulk import report as bulk_report


def summary_path(config):
    """--summary, or <output>.summary.json."""
    return config.summary or config.output + ".summary.json"


def run(config):
    """Scores config.input with the model, writes the rows, the summary (and the confusion
    matrix PNG when asked); returns the summary (bulk_report.summarize)."""
    bulk_predict.check_output(summary_path(config), "--summary")
    bulk_predict.check_output(config.confusion_matrix, "--confusion_matrix")
    options = config.beam.pipeline()
    if options:
        summary = beam_inference.predict_beam(
            config.model_base_path, config.input, config.output, options,
            config.model_version, config.batch_size, config.top_k, config.prediction_log,
            config.signature_name, max_file_bytes=config.max_file_bytes,
            runtime=config.runtime, openvino_precision=config.openvino_precision)
    else:
        summary = bulk_predict.predict_local(
            config.model_base_path, config.input, config.output, config.model_version,
            config.batch_size, config.top_k, config.prediction_log, config.progress,
            config.read_threads, config.signature_name, config.read_ahead,
            config.max_file_bytes, config.runtime, config.openvino_precision)
    bulk_report.write_summary(summary, summary_path(config), config.confusion_matrix)
    return summary
