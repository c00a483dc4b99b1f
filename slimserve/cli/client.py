"""slimserve-client: query TF Serving or the embedded server over gRPC.

    slimserve-client predict  --server=localhost:8500 photo1.jpg photo2.png --top_k=3
    slimserve-client classify --server=localhost:8500 photo1.jpg --json
    slimserve-client metadata --server=localhost:8500
    slimserve-client status   --server=localhost:8500
"""
import json
import sys

from absl import flags

import grpc
from google.protobuf import json_format

from slimserve import conventions
from slimserve.serving.tools import client as client_lib
from slimserve.cli import logs

FLAGS = flags.FLAGS
flags.DEFINE_string("server", "localhost:8500", "host:port of the gRPC API.")
flags.DEFINE_string("model_name", "resnet", "Model name.")
flags.DEFINE_integer("model_version", None, "Specific version (default: latest).")
flags.DEFINE_string("version_label", None, "Version label (e.g. stable).")
flags.DEFINE_string("signature_name", None,
                    "Signature (default: serving_default; classify for classify).")
flags.DEFINE_float("timeout", 30.0, "Per-call deadline in seconds.")
flags.DEFINE_integer("max_message_bytes", client_lib.DEFAULT_MESSAGE_BYTES,
                     "Max gRPC send/receive message size.")
flags.DEFINE_integer("retries", 3, "Retries on UNAVAILABLE (exponential backoff).")
flags.DEFINE_integer("batch_size", 8, "Images per request.")
flags.DEFINE_integer("concurrency", 1, "Requests in flight.")
flags.DEFINE_integer("top_k", 3, "Classes printed per image.")
flags.DEFINE_bool("json", False, "Print JSON instead of text.")
flags.DEFINE_string("image_key", conventions.ENCODED, "tf.Example key of the image for classify.")

COMMANDS = ("predict", "classify", "metadata", "status")


def _top(pairs, k):
    return sorted(pairs, key=lambda p: -p[1])[:k]


def main(argv):
    if len(argv) < 2 or argv[1] not in COMMANDS:
        sys.exit("usage: slimserve-client {%s} [files...] [flags]" % "|".join(COMMANDS))
    command, files = argv[1], argv[2:]
    if command in ("predict", "classify") and not files:
        sys.exit("slimserve-client %s: name at least one image file" % command)
    client = client_lib.Client(FLAGS.server, FLAGS.model_name, FLAGS.model_version, FLAGS.version_label,
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
    logs.run(main)


if __name__ == "__main__":
    run()
