"""gRPC client for TF Serving and the embedded server: Predict, Classify,
GetModelMetadata and GetModelStatus, plus a CLI.

    slimserve-client predict  --server=localhost:8500 photo1.jpg photo2.png --top_k=3
    slimserve-client classify --server=localhost:8500 photo1.jpg --json
    slimserve-client metadata --server=localhost:8500
    slimserve-client status   --server=localhost:8500

Retries (with exponential backoff) only on UNAVAILABLE, the status a server gives
while it starts, swaps versions or sheds load; anything else is final.
"""
import concurrent.futures
import json
import sys
import time

from absl import flags

import slimserve_quiet

DEFAULT_MESSAGE_BYTES = 256 * 1024 * 1024  # gRPC's 4 MB default trips image batches


class Client:
    """One channel to one server; thread-safe, so share it between threads."""

    def __init__(self, target="localhost:8500", model_name="resnet", version=None,
                 version_label=None, timeout=30.0, max_message_bytes=DEFAULT_MESSAGE_BYTES,
                 retries=3, backoff_seconds=0.2, image_key="image/encoded"):
        import grpc  # pylint: disable=g-import-not-at-top
        from tensorflow_serving.apis import model_service_pb2_grpc  # pylint: disable=g-import-not-at-top
        from tensorflow_serving.apis import prediction_service_pb2_grpc  # pylint: disable=g-import-not-at-top
        if version is not None and version_label:
            raise ValueError("give a version or a version label, not both")
        self._grpc = grpc
        self.channel = grpc.insecure_channel(target, options=[
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)])
        self._predict = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self._model = model_service_pb2_grpc.ModelServiceStub(self.channel)
        self.model_name, self.version, self.version_label = model_name, version, version_label
        self.timeout, self.retries, self.backoff = timeout, retries, backoff_seconds
        self.image_key = image_key

    def close(self):
        self.channel.close()

    def _spec(self, spec, signature_name=None):
        spec.name = self.model_name
        if self.version is not None:
            spec.version.value = int(self.version)
        elif self.version_label:
            spec.version_label = self.version_label
        if signature_name:
            spec.signature_name = signature_name

    def _call(self, method, request):
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                return method(request, timeout=self.timeout)
            except self._grpc.RpcError as error:
                if error.code() != self._grpc.StatusCode.UNAVAILABLE or attempt == self.retries:
                    raise
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def predict(self, inputs, signature_name="serving_default", output_filter=()):
        """inputs: {key: array-like}; returns {output key: ndarray}."""
        import tensorflow as tf  # pylint: disable=g-import-not-at-top
        from tensorflow_serving.apis import predict_pb2  # pylint: disable=g-import-not-at-top
        request = predict_pb2.PredictRequest()
        self._spec(request.model_spec, signature_name)
        for key, value in inputs.items():
            request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
        request.output_filter.extend(output_filter)
        response = self._call(self._predict.Predict, request)
        return {key: tf.make_ndarray(proto) for key, proto in response.outputs.items()}

    def predict_images(self, encoded_images, signature_name="serving_default"):
        """Encoded JPEG/PNG bytes -> {classes, probabilities, class_names} for the batch."""
        return self.predict({"image_bytes": list(encoded_images)}, signature_name)

    def classify(self, examples, signature_name="classify"):
        """tf.train.Examples (or images as bytes) -> [[(label, score), ...] per example]."""
        from tensorflow_serving.apis import classification_pb2  # pylint: disable=g-import-not-at-top
        request = classification_pb2.ClassificationRequest()
        self._spec(request.model_spec, signature_name)
        for example in examples:
            target = request.input.example_list.examples.add()
            if isinstance(example, bytes):
                target.features.feature[self.image_key].bytes_list.value.append(example)
            else:
                target.CopyFrom(example)
        response = self._call(self._predict.Classify, request)
        return [[(c.label, c.score) for c in result.classes]
                for result in response.result.classifications]

    def metadata(self):
        """{signature name: SignatureDef} of the model (version) this client targets."""
        from tensorflow_serving.apis import get_model_metadata_pb2  # pylint: disable=g-import-not-at-top
        request = get_model_metadata_pb2.GetModelMetadataRequest()
        self._spec(request.model_spec)
        request.metadata_field.append("signature_def")
        response = self._call(self._predict.GetModelMetadata, request)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_map)
        return dict(signature_map.signature_def)

    def status(self):
        """[(version, state name, error message)], newest first."""
        from tensorflow_serving.apis import get_model_status_pb2  # pylint: disable=g-import-not-at-top
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = self.model_name
        if self.version is not None:
            request.model_spec.version.value = int(self.version)
        response = self._call(self._model.GetModelStatus, request)
        states = get_model_status_pb2.ModelVersionStatus.State
        return [(s.version, states.Name(s.state), s.status.error_message)
                for s in response.model_version_status]

    def predict_files(self, paths, batch_size=1, concurrency=1):
        """Reads and predicts many files: `batch_size` per request, `concurrency`
        requests in flight. Returns one (path, class name, probabilities) per file."""
        batches = [paths[i:i + batch_size] for i in range(0, len(paths), batch_size)]

        def one(batch):
            images = []
            for path in batch:
                with open(path, "rb") as handle:
                    images.append(handle.read())
            out = self.predict_images(images)
            return [(path, out["class_names"][i].decode(), out["probabilities"][i])
                    for i, path in enumerate(batch)]

        with concurrent.futures.ThreadPoolExecutor(max(1, concurrency)) as pool:
            return [row for rows in pool.map(one, batches) for row in rows]


FLAGS = flags.FLAGS
def define_flags():
    """Defined on demand so that importing this module never clashes with other CLIs."""
    flags.DEFINE_string("server", "localhost:8500", "host:port of the gRPC API.")
    flags.DEFINE_string("model_name", "resnet", "Model name.")
    flags.DEFINE_integer("model_version", None, "Specific version (default: latest).")
    flags.DEFINE_string("version_label", None, "Version label (e.g. stable).")
    flags.DEFINE_string("signature_name", None,
                        "Signature (default: serving_default; classify for classify).")
    flags.DEFINE_float("timeout", 30.0, "Per-call deadline in seconds.")
    flags.DEFINE_integer("max_message_bytes", DEFAULT_MESSAGE_BYTES,
                         "Max gRPC send/receive message size.")
    flags.DEFINE_integer("retries", 3, "Retries on UNAVAILABLE (exponential backoff).")
    flags.DEFINE_integer("batch_size", 8, "Images per request.")
    flags.DEFINE_integer("concurrency", 1, "Requests in flight.")
    flags.DEFINE_integer("top_k", 3, "Classes printed per image.")
    flags.DEFINE_bool("json", False, "Print JSON instead of text.")
    flags.DEFINE_string("image_key", "image/encoded", "tf.Example key of the image for classify.")

COMMANDS = ("predict", "classify", "metadata", "status")


def _top(pairs, k):
    return sorted(pairs, key=lambda p: -p[1])[:k]


def main(argv):
    import grpc  # pylint: disable=g-import-not-at-top
    from google.protobuf import json_format  # pylint: disable=g-import-not-at-top
    if len(argv) < 2 or argv[1] not in COMMANDS:
        sys.exit("usage: slimserve-client {%s} [files...] [flags]" % "|".join(COMMANDS))
    command, files = argv[1], argv[2:]
    if command in ("predict", "classify") and not files:
        sys.exit("slimserve-client %s: name at least one image file" % command)
    client = Client(FLAGS.server, FLAGS.model_name, FLAGS.model_version, FLAGS.version_label,
                    FLAGS.timeout, FLAGS.max_message_bytes, FLAGS.retries,
                    image_key=FLAGS.image_key)
    try:
        if command == "predict":
            rows = client.predict_files(files, FLAGS.batch_size, FLAGS.concurrency)
            result = []
            for path, name, probabilities in rows:
                ranked = _top(list(enumerate(probabilities.tolist())), FLAGS.top_k)
                result.append({"file": path, "class": name,
                               "top_k": [{"id": i, "probability": p} for i, p in ranked]})
        elif command == "classify":
            images = []
            for path in files:
                with open(path, "rb") as handle:
                    images.append(handle.read())
            classes = client.classify(images, FLAGS.signature_name or "classify")
            result = [{"file": path, "top_k": [{"class": c, "score": s}
                                              for c, s in _top(pairs, FLAGS.top_k)]}
                      for path, pairs in zip(files, classes)]
        elif command == "metadata":
            result = {name: json_format.MessageToDict(sig)
                      for name, sig in client.metadata().items()}
        else:
            result = [{"version": v, "state": s, "error": e} for v, s, e in client.status()]
    except grpc.RpcError as error:
        sys.exit("slimserve-client: %s: %s" % (error.code().name, error.details()))
    except OSError as error:
        sys.exit("slimserve-client: %s" % error)
    if FLAGS.json or command == "metadata":
        print(json.dumps(result, indent=2))
    elif command in ("predict", "classify"):
        for row in result:
            ranked = ", ".join("%s %.3f" % (e.get("class", e.get("id")),
                                            e.get("probability", e.get("score")))
                               for e in row["top_k"])
            print("%s: %s" % (row["file"], ranked))
    else:
        for row in result:
            print("version %d: %s %s" % (row["version"], row["state"], row["error"]))


def run():
    slimserve_quiet.run_absl_app(main, define_flags)


if __name__ == "__main__":
    run()
