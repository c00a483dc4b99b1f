"""slimserve-client: query TF Serving or the embedded server over gRPC.

    slimserve-client predict  --server=localhost:8500 photo1.jpg photo2.png --top_k=3
    slimserve-client predict  --server=localhost:8500 photos/*.jpg --batch_size=32 --json
    slimserve-client classify --server=localhost:8500 photo1.jpg --json
    slimserve-client metadata --server=localhost:8500
    slimserve-client status   --server=localhost:8500

predict prints each file's top classes by name; a file that cannot be read, is no image,
or is refused by the server gets an error line naming it (the others are still answered)
and the command then exits 1. With no server at --server it says so in one line within
--connect_timeout, before TensorFlow is even imported.
"""
import copy
import json
import sys

from absl import flags

from slimserve import conventions
from slimserve.cli import logs
from slimserve.serving.tools import channel

FLAGS = flags.FLAGS
flags.DEFINE_string("server", "localhost:8500", "host:port (or unix:path) of the gRPC API.")
flags.DEFINE_string("model_name", "resnet", "Model name.")
flags.DEFINE_integer("model_version", None, "Specific version (default: latest).")
flags.DEFINE_string("version_label", None, "Version label (e.g. stable).")
flags.DEFINE_string("signature_name", None,
                    "Signature (default: serving_default for predict, classify for classify).")
flags.DEFINE_float("timeout", 30.0, "Per-call deadline in seconds; also how long a port that "
                   "accepted the connection may take to answer gRPC (a server loading models).")
flags.DEFINE_float("connect_timeout", 1.0, "Seconds to wait for something to listen at "
                   "--server before saying nothing does (raise it to wait for a server that "
                   "is starting).", lower_bound=0.0)
flags.DEFINE_integer("max_message_bytes", channel.DEFAULT_MESSAGE_BYTES,
                     "Max gRPC send/receive message size; also the largest image file sent.")
flags.DEFINE_integer("retries", 3, "Retries on UNAVAILABLE (exponential backoff).")
flags.DEFINE_integer("batch_size", 8, "Images per request.", lower_bound=1)
flags.DEFINE_integer("concurrency", 1, "Requests in flight.", lower_bound=1)
flags.DEFINE_integer("top_k", 3, "Classes printed per image.", lower_bound=1)
flags.DEFINE_bool("json", False, "Print JSON instead of text.")
flags.DEFINE_string("image_key", conventions.ENCODED, "tf.Example key of the image for classify.")

COMMANDS = ("predict", "classify", "metadata", "status")


def _top(pairs, k):
    return sorted(pairs, key=lambda p: -p[1])[:k]


def _predict(client, files):
    """Prints each file's answer as it arrives; returns how many files failed."""
    failed, rows = 0, []
    for result in client.predict_files(files, FLAGS.batch_size, FLAGS.concurrency,
                                       FLAGS.signature_name or conventions.DEFAULT_SIGNATURE,
                                       FLAGS.top_k):
        if result.error:
            failed += 1
            row = {"file": result.path, "error": result.error}
        else:
            row = {"file": result.path, "class_id": result.class_id,
                   "class": result.class_name,
                   "top_k": [{"id": i, "name": name, "probability": p}
                             for i, name, p in result.top_k]}
        if FLAGS.json:
            rows.append(row)
        elif result.error:
            print("%s: error: %s" % (result.path, result.error), file=sys.stderr, flush=True)
        else:
            print("%s: %s" % (result.path, ", ".join(
                "%s %.3f" % (name if name is not None else i, p)
                for i, name, p in result.top_k)), flush=True)
    if FLAGS.json:
        print(json.dumps(rows, indent=2))
    return failed


def _classify(client, client_lib, files):
    failed, images, sent = 0, [], []
    for path in files:
        data, error = client_lib.read_image(path, FLAGS.max_message_bytes)
        if error:
            failed += 1
            print("%s: error: %s" % (path, error), file=sys.stderr)
        else:
            images.append(data)
            sent.append(path)
    classes = client.classify(images, FLAGS.signature_name or conventions.CLASSIFY) \
        if images else []
    rows = [{"file": path, "top_k": [{"class": c, "score": s}
                                     for c, s in _top(pairs, FLAGS.top_k)]}
            for path, pairs in zip(sent, classes)]
    if FLAGS.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print("%s: %s" % (row["file"], ", ".join("%s %.3f" % (e["class"], e["score"])
                                                    for e in row["top_k"])))
    return failed


def main(argv):
    if len(argv) < 2 or argv[1] not in COMMANDS:
        sys.exit("usage: slimserve-client {%s} [files...] [flags]" % "|".join(COMMANDS))
    command, files = argv[1], argv[2:]
    if command in ("predict", "classify") and not files:
        sys.exit("slimserve-client %s: name at least one image file" % command)
    import grpc  # pylint: disable=import-outside-toplevel
    from google.protobuf import json_format  # pylint: disable=import-outside-toplevel
    # TensorFlow comes with the client library: imported only once a server answered.
    from slimserve.serving.tools import client as client_lib  # pylint: disable=import-outside-toplevel
    client = client_lib.Client(FLAGS.server, FLAGS.model_name, FLAGS.model_version,
                               FLAGS.version_label, FLAGS.timeout, FLAGS.max_message_bytes,
                               FLAGS.retries, image_key=FLAGS.image_key)
    failed = 0
    try:
        if command == "predict":
            failed = _predict(client, files)
        elif command == "classify":
            failed = _classify(client, client_lib, files)
        elif command == "metadata":
            print(json.dumps({name: json_format.MessageToDict(sig)
                              for name, sig in client.metadata().items()}, indent=2))
        else:
            result = [{"version": v, "state": s, "error": e} for v, s, e in client.status()]
            if FLAGS.json:
                print(json.dumps(result, indent=2))
            for row in [] if FLAGS.json else result:
                print("version %d: %s %s" % (row["version"], row["state"], row["error"]))
    except grpc.RpcError as error:
        sys.exit("slimserve-client: %s: %s" % (error.code().name, error.details()))
    except (OSError, ValueError) as error:
        sys.exit("slimserve-client: %s" % error)
    if failed:
        sys.exit("slimserve-client: %d of %d files got no answer (see the error lines above)"
                 % (failed, len(files)))


def _check_server_first(argv):
    """Says "nothing is listening" in one line, before logs.run imports TensorFlow (which
    takes seconds): a copy of the flags is parsed here for --server and the timeouts;
    absl parses the real ones as usual afterwards (and reports bad ones)."""
    try:
        scratch = copy.deepcopy(FLAGS)
        rest = scratch(argv, known_only=True)
        target, connect_timeout, timeout = (scratch.server, scratch.connect_timeout,
                                            scratch.timeout)
    except flags.Error:
        return  # absl's own parse in logs.run reports it
    if len(rest) < 2 or rest[1] not in COMMANDS or any(
            arg.lstrip("-").startswith(("help", "h=")) or arg == "-h" for arg in rest):
        return
    try:
        channel.wait_for_server(target, connect_timeout, timeout)
    except channel.ServerUnreachable as error:
        sys.exit("slimserve-client: %s" % error)


def run():
    _check_server_first(sys.argv)
    logs.run(main)


if __name__ == "__main__":
    run()
