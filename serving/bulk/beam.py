"""Bulk inference on Apache Beam: the same ImageClassifier as the local run
(serving/clients/image_classifier.py, on TensorFlow or OpenVINO), behind Beam's
RunInference (BatchElements batches, one model per worker process).

    refs -> Reshuffle -> read (files, or every record of a TFRecord shard)
         -> RunInference(SavedModelImageHandler) -> JSON lines [+ PredictionLog TFRecords]

The launcher then reads the JSON lines back for the summary, as the local path does.
"""
import json

from slimserve.serving.bulk import inputs as bulk_inputs
from slimserve.serving.bulk import predict as bulk_predict
from slimserve.serving.bulk import report as bulk_report
from slimserve.serving.clients import image_classifier


def make_model_handler(path, version, signature_name="serving_default", top_k=5,
                       prediction_log=False, min_batch_size=1, max_batch_size=32,
                       runtime=image_classifier.TENSORFLOW, openvino_precision="fp32"):
    """A RunInference ModelHandler: ImageInput elements in, output rows (dicts) out; the
    network on `runtime` (tensorflow, or openvino at `openvino_precision`)."""
    from apache_beam.ml.inference import base  # pylint: disable=g-import-not-at-top

    class SavedModelImageHandler(base.ModelHandler):
        """Loads the SavedModel once per worker process (RunInference shares it)."""

        def load_model(self):
            return image_classifier.ImageClassifier(
                path, version, signature_name=signature_name, top_k=top_k,
                prediction_log=prediction_log, runtime=runtime,
                openvino_precision=openvino_precision)

        def run_inference(self, batch, model, inference_args=None):
            del inference_args
            return model.predict(list(batch))

        def batch_elements_kwargs(self):
            return {"min_batch_size": min_batch_size, "max_batch_size": max_batch_size}

        def get_metrics_namespace(self):
            return "slimserve_bulk_predict"

    return SavedModelImageHandler()


def _json_line(row):
    row = dict(row)
    row.pop("_prediction_log", None)
    return json.dumps(row, sort_keys=True)


def predict_beam(model_base_path, input_spec, output, options,
                 model_version=None, batch_size=32, top_k=5, prediction_log=None,
                 signature_name="serving_default",
                 max_file_bytes=bulk_inputs.DEFAULT_MAX_FILE_BYTES,
                 runtime=image_classifier.TENSORFLOW, openvino_precision="fp32"):
    """Scores every input on Beam with these PipelineOptions (slimserve/cli/beam.py makes
    them from the flags); returns the summary of the written JSON lines. Files are read
    as bulk_predict reads them (regular files of at most `max_file_bytes`, else an error
    row); Beam bounds what each worker holds."""
    import apache_beam as beam  # pylint: disable=g-import-not-at-top
    from apache_beam.ml.inference.base import RunInference  # pylint: disable=g-import-not-at-top
    bulk_predict.check_settings(output, prediction_log, batch_size,
                                max_file_bytes=max_file_bytes)
    refs = bulk_inputs.list_inputs(input_spec)
    version, path = bulk_predict.model_path(model_base_path, model_version)
    handler = make_model_handler(path, version, signature_name, top_k, bool(prediction_log),
                                 max_batch_size=batch_size, runtime=runtime,
                                 openvino_precision=openvino_precision)
    with beam.Pipeline(options=options) as pipeline:
        rows = (pipeline
                | "Inputs" >> beam.Create(refs)
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.FlatMap(bulk_inputs.read, max_file_bytes)
                | "Predict" >> RunInference(handler))
        _ = (rows
             | "ToJson" >> beam.Map(_json_line)
             | "WriteJsonLines" >> beam.io.WriteToText(output, shard_name_template=""))
        if prediction_log:
            _ = (rows
                 | "Logs" >> beam.FlatMap(lambda row: [row["_prediction_log"]]
                                          if "_prediction_log" in row else [])
                 | "WriteLogs" >> beam.io.WriteToTFRecord(prediction_log,
                                                          shard_name_template=""))
    return bulk_report.summarize_file(output, image_classifier.read_model_labels(path))
