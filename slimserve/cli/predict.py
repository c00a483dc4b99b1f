"""slimserve-predict: score many images with an exported SavedModel, as JSON lines.

    slimserve-predict --model_base_path=export/final --input=images/ --output=preds.jsonl
    slimserve-predict --model_base_path=gs://b/export --input='gs://b/data/validation-*' \\
        --output=gs://b/preds.jsonl --runner=DataflowRunner \\
        --beam_options="--project=P --region=R --temp_location=gs://b/tmp"
"""
import json
import sys

from absl import flags

from slimserve.serving.tools import beam_inference
from slimserve.serving.tools import bulk_predict
from slimserve.cli import beam
from slimserve.cli import logs

FLAGS = flags.FLAGS
flags.DEFINE_string("model_base_path", None,
                    "Export base path holding <version>/saved_model.pb directories.")
flags.DEFINE_integer("model_version", None, "Version to use (default: the newest).")
flags.DEFINE_string("input", None,
                    "An image folder (class sub-folders give true labels), a glob, a CSV of "
                    "path[,label], or TFRecord shards of a converted split "
                    "(e.g. 'data/validation-*-of-*').")
flags.DEFINE_string("output", None, "JSON lines file: one row per image.")
flags.DEFINE_string("prediction_log", None,
                    "Also write PredictionLog TFRecords (as TFX's BulkInferrer) here.")
flags.DEFINE_string("summary", None,
                    "Summary JSON (counts; with labels accuracy, per-class precision/recall, "
                    "confusion matrix). Default: <output>.summary.json.")
flags.DEFINE_string("confusion_matrix", None,
                    "Write the confusion matrix as a PNG here (needs matplotlib).")
flags.DEFINE_integer("batch_size", 32, "Images per model call (max batch on Beam).",
                     lower_bound=1)
flags.DEFINE_integer("read_ahead", bulk_predict.DEFAULT_READ_AHEAD,
                     "Files read ahead of the model at most (local runs): memory stays "
                     "about read_ahead x --max_file_bytes at worst, however long --input "
                     "is.", lower_bound=1)
flags.DEFINE_integer("read_threads", 4, "Threads reading files ahead (local runs).",
                     lower_bound=1)
flags.DEFINE_integer("max_file_bytes", bulk_predict.DEFAULT_MAX_FILE_BYTES,
                     "Larger input files get an error row instead of being read (0: no "
                     "limit). Named pipes, devices and folders always do.", lower_bound=0)
flags.DEFINE_integer("top_k", 5, "Probabilities kept per image.")
flags.DEFINE_string("signature_name", "serving_default",
                    "Signature with one input of encoded images.")
flags.DEFINE_enum("runner", None, beam.RUNNERS,
                  "Run on Apache Beam's RunInference with this runner (needs the `beam` "
                  "extra); unset: in this process.")
flags.DEFINE_string("beam_options", "",
                    "Beam pipeline options passed through with --runner, e.g. "
                    "\"--direct_num_workers=2 --direct_running_mode=multi_processing\".")
flags.DEFINE_bool("progress", True, "Show a progress bar (local runs).")
flags.mark_flags_as_required(["model_base_path", "input", "output"])


def main(argv):
    del argv
    summary_path = FLAGS.summary or FLAGS.output + ".summary.json"
    try:
        bulk_predict.check_output(summary_path, "--summary")
        bulk_predict.check_output(FLAGS.confusion_matrix, "--confusion_matrix")
        options = beam.options_from_flags(FLAGS.runner, FLAGS.beam_options)
        if options:
            summary = beam_inference.predict_beam(
                FLAGS.model_base_path, FLAGS.input, FLAGS.output, options,
                FLAGS.model_version, FLAGS.batch_size, FLAGS.top_k, FLAGS.prediction_log,
                FLAGS.signature_name, max_file_bytes=FLAGS.max_file_bytes)
        else:
            summary = bulk_predict.predict_local(
                FLAGS.model_base_path, FLAGS.input, FLAGS.output, FLAGS.model_version,
                FLAGS.batch_size, FLAGS.top_k, FLAGS.prediction_log, FLAGS.progress,
                FLAGS.read_threads, FLAGS.signature_name, FLAGS.read_ahead,
                FLAGS.max_file_bytes)
        bulk_predict.write_summary(summary, summary_path, FLAGS.confusion_matrix)
    except (bulk_predict.BulkPredictError, ValueError, OSError) as error:
        sys.exit("slimserve-predict: %s" % error)
    brief = {k: summary[k] for k in ("images", "predicted", "errors", "accuracy")
             if k in summary}
    print("wrote %s: %s" % (FLAGS.output, json.dumps(brief)))


def run():
    logs.run(main)


if __name__ == "__main__":
    run()
