"""slimserve-predict: score many images with an exported SavedModel, as JSON lines.

    slimserve-predict --model_base_path=export/final --input=images/ --output=preds.jsonl
    slimserve-predict --model_base_path=gs://b/export --input='gs://b/data/validation-*' \\
        --output=gs://b/preds.jsonl --runner=DataflowRunner \\
        --beam_options="--project=P --region=R --temp_location=gs://b/tmp"
    slimserve-predict --model_base_path=export/final --input=images/ --output=preds.jsonl \
        --runtime=openvino --openvino_precision=int8

The run (local or on Beam, then the summary) is serving/bulk/job.py's.
"""
import dataclasses
import json
import sys

from slimserve import fields
from slimserve.cli import logs
from slimserve.cli.beam import BeamOptions
from slimserve.serving.bulk import inputs as bulk_inputs
from slimserve.serving.bulk import job
from slimserve.serving.clients import image_classifier
from slimserve.serving.core import openvino_model


@dataclasses.dataclass
class PredictConfig:
    """slimserve-predict's flags; --runner / --beam_options are the Beam commands' shared
    section (slimserve/cli/beam.py)."""
    model_base_path: str = fields.option(
        None, "Export base path holding <version>/saved_model.pb directories.", required=True)
    model_version: int = fields.option(None, "Version to use (default: the newest).",
                                       fields.Bound(0, fields.INT64_MAX), kind=int)
    input: str = fields.option(
        None, "An image folder (class sub-folders give true labels), a glob, a CSV of "
        "path[,label], or TFRecord shards of a converted split (e.g. "
        "'data/validation-*-of-*').", required=True)
    output: str = fields.option(None, "JSON lines file: one row per image.", required=True)
    prediction_log: str = fields.option(
        None, "Also write PredictionLog TFRecords (as TFX's BulkInferrer) here.")
    summary: str = fields.option(
        None, "Summary JSON (counts; with labels accuracy, per-class precision/recall, "
        "confusion matrix). Default: <output>.summary.json.")
    confusion_matrix: str = fields.option(
        None, "Write the confusion matrix as a PNG here (needs matplotlib).")
    batch_size: int = fields.option(32, "Images per model call (max batch on Beam).",
                                    fields.Bound(1, 65536))
    read_ahead: int = fields.option(
        bulk_inputs.DEFAULT_READ_AHEAD, "Files read ahead of the model at most (local runs): "
        "memory stays about read_ahead x --max_file_bytes at worst, however long --input "
        "is.", fields.Bound(1, 65536))
    read_threads: int = fields.option(4, "Threads reading files ahead (local runs).",
                                      fields.Bound(1, 256))
    max_file_bytes: int = fields.option(
        bulk_inputs.DEFAULT_MAX_FILE_BYTES, "Larger input files get an error row instead of "
        "being read (0: no limit). Named pipes, devices and folders always do.",
        fields.Bound(0, fields.INT64_MAX))
    top_k: int = fields.option(5, "Probabilities kept per image.", fields.Bound(1, 65536))
    signature_name: str = fields.option("serving_default",
                                        "Signature with one input of encoded images.")
    runtime: str = fields.option(
        image_classifier.TENSORFLOW, "What runs the network: tensorflow, or openvino (the "
        "version's openvino/model.xml, converted at load when it has none, as "
        "slimserve-server --prefer_openvino_model; TensorFlow with one log line where "
        "OpenVINO cannot).", choices=image_classifier.RUNTIMES)
    openvino_precision: str = fields.option(
        openvino_model.FP32, "With --runtime=openvino: fp32; bf16 where the CPU has "
        "AVX512_BF16 or AMX; int8 from the version's openvino/model_int8.xml (else fp32, "
        "said in the log).", choices=openvino_model.PRECISIONS)
    beam: BeamOptions = fields.section(BeamOptions)
    progress: bool = fields.option(True, "Show a progress bar (local runs).")


CONFIG = PredictConfig


def main(config, args):
    del args
    summary = job.run(config)
    brief = {k: summary[k] for k in ("images", "predicted", "errors", "accuracy")
             if k in summary}
    print("wrote %s: %s" % (config.output, json.dumps(brief)))
    if "no_accuracy" in summary:  # the predictions are written; only the score is not
        print("slimserve-predict: no accuracy: " + summary["no_accuracy"], file=sys.stderr)


def run():
    logs.run(main, config=CONFIG)


if __name__ == "__main__":
    run()
