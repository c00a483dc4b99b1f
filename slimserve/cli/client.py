"""slimserve-client: query TF Serving or the embedded server over gRPC.

    slimserve-client predict  --server=localhost:8500 photo1.jpg photo2.png --top_k=3
    slimserve-client predict  --server=localhost:8500 photos/*.jpg --batch_size=32 --json
    slimserve-client classify --server=localhost:8500 photo1.jpg --json
    slimserve-client metadata --server=localhost:8500
    slimserve-client status   --server=localhost:8500
    slimserve-client accuracy --server=localhost:8500 held_out/ --confusion_matrix=cm.png

accuracy scores a labelled folder (class sub-folders) or CSV of path,label through the
server: accuracy, per-class recall and the confusion matrix; files that cannot be sent or
are refused are named and skipped; labels that are not classes of the model get no
accuracy, saying which (serving/clients/served_accuracy.py).
predict prints each file's top classes by name; a file that cannot be read, is no image,
or is refused by the server gets an error line naming it (the others are still answered)
and the command then exits 1. With no server at --server it says so in one line within
--connect_timeout, before TensorFlow is even imported.
"""
import dataclasses
import json
import sys

from absl import flags

from slimserve import conventions
from slimserve import errors
from slimserve import fields
from slimserve.cli import logs
from slimserve.serving.clients import channel


@dataclasses.dataclass
class ClientConfig:
    """slimserve-client's flags (plain Python: read before TensorFlow loads)."""
    server: str = fields.option("localhost:8500", "host:port (or unix:path) of the gRPC API.")
    model_name: str = fields.option("resnet", "Model name.")
    model_version: int = fields.option(None, "Specific version (default: latest).",
                                       fields.Bound(0, fields.INT64_MAX), kind=int)
    version_label: str = fields.option(None, "Version label (e.g. stable).")
    signature_name: str = fields.option(
        None, "Signature (default: serving_default for predict, classify for classify).")
    timeout: float = fields.option(
        30.0, "Per-call deadline in seconds; also how long a port that accepted the "
        "connection may take to answer gRPC (a server loading models).", fields.POSITIVE)
    connect_timeout: float = fields.option(
        1.0, "Seconds to wait for something to listen at --server before saying nothing "
        "does (raise it to wait for a server that is starting).", fields.NON_NEGATIVE)
    max_message_bytes: int = fields.option(
        channel.DEFAULT_MESSAGE_BYTES, "Max gRPC send/receive message size; also the largest "
        "image file sent.", fields.Bound(1, fields.INT32_MAX))
    retries: int = fields.option(3, "Retries on UNAVAILABLE (exponential backoff).",
                                 fields.Bound(0, 30))
    batch_size: int = fields.option(8, "Images per request.", fields.Bound(1, 65536))
    concurrency: int = fields.option(1, "Requests in flight.", fields.Bound(1, 1024))
    top_k: int = fields.option(3, "Classes printed per image.", fields.Bound(1, 65536))
    json: bool = fields.option(False, "Print JSON instead of text.")
    image_key: str = fields.option(conventions.ENCODED,
                                   "tf.Example key of the image for classify.")
    summary: str = fields.option(
        None, "accuracy: also write the summary (counts, accuracy, per-class precision and "
        "recall, confusion matrix) as JSON here.")
    confusion_matrix: str = fields.option(
        None, "accuracy: also draw the confusion matrix as a PNG here (needs matplotlib).")
    progress: bool = fields.option(True, "accuracy: show a progress bar.")


CONFIG = ClientConfig
COMMANDS = ("predict", "classify", "metadata", "status", "accuracy")


def _top(pairs, k):
    return sorted(pairs, key=lambda p: -p[1])[:k]


def _predict(config, client, files):
    """Prints each file's answer as it arrives; returns how many files failed."""
    failed, rows = 0, []
    for result in client.predict_files(files, config.batch_size, config.concurrency,
                                       config.signature_name or conventions.DEFAULT_SIGNATURE,
                                       config.top_k):
        if result.error:
            failed += 1
            row = {"file": result.path, "error": result.error}
        else:
            row = {"file": result.path, "class_id": result.class_id,
                   "class": result.class_name,
                   "top_k": [{"id": i, "name": name, "probability": p}
                             for i, name, p in result.top_k]}
        if config.json:
            rows.append(row)
        elif result.error:
            print("%s: error: %s" % (result.path, result.error), file=sys.stderr, flush=True)
        else:
            print("%s: %s" % (result.path, ", ".join(
                "%s %.3f" % (name if name is not None else i, p)
                for i, name, p in result.top_k)), flush=True)
    if config.json:
        print(json.dumps(rows, indent=2))
    return failed


def _classify(config, client, client_lib, files):
    failed, images, sent = 0, [], []
    for path in files:
        data, error = client_lib.read_image(path, config.max_message_bytes)
        if error:
            failed += 1
            print("%s: error: %s" % (path, error), file=sys.stderr)
        else:
            images.append(data)
            sent.append(path)
    classes = client.classify(images, config.signature_name or conventions.CLASSIFY) \
        if images else []
    rows = [{"file": path, "top_k": [{"class": c, "score": s}
                                     for c, s in _top(pairs, config.top_k)]}
            for path, pairs in zip(sent, classes)]
    if config.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print("%s: %s" % (row["file"], ", ".join("%s %.3f" % (e["class"], e["score"])
                                                    for e in row["top_k"])))
    return failed


def _accuracy(config, client, spec):
    """Scores the labelled folder or CSV `spec` through the server and prints the report;
    UserError when its labels are not the model's classes (no accuracy then)."""
    from slimserve.serving.bulk import predict as bulk_predict  # pylint: disable=import-outside-toplevel
    from slimserve.serving.bulk import report as bulk_report  # pylint: disable=import-outside-toplevel
    from slimserve.serving.clients import served_accuracy  # pylint: disable=import-outside-toplevel
    bulk_predict.check_output(config.summary, "--summary")
    bulk_predict.check_output(config.confusion_matrix, "--confusion_matrix")
    scored = served_accuracy.score(
        client, spec, config.batch_size, config.concurrency,
        config.signature_name or conventions.DEFAULT_SIGNATURE, config.progress,
        on_error=lambda path, why: print("%s: error: %s (skipped)" % (path, why),
                                         file=sys.stderr, flush=True))
    summary = scored.summary
    if config.summary:
        bulk_report.write_summary(summary, config.summary, config.confusion_matrix)
    elif config.confusion_matrix and "confusion_matrix" in summary:
        bulk_report.plot_confusion(summary, config.confusion_matrix)
    if config.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    if "no_accuracy" in summary:
        if not config.json:
            print(bulk_report.format_text(summary)[0])
        raise errors.UserError("no accuracy: " + summary["no_accuracy"])
    if not config.json:
        print("\n".join(bulk_report.format_text(summary)))


def main(config, args):
    """args: the subcommand, then the image files (predict, classify) or the labelled
    folder or CSV (accuracy)."""
    if not args or args[0] not in COMMANDS:
        sys.exit("usage: slimserve-client {%s} [files...] [flags]" % "|".join(COMMANDS))
    command, files = args[0], args[1:]
    if command in ("predict", "classify") and not files:
        sys.exit("slimserve-client %s: name at least one image file" % command)
    if command == "accuracy" and len(files) != 1:
        sys.exit("slimserve-client accuracy: name one labelled folder (class sub-folders) "
                 "or CSV of path,label")
    import grpc  # pylint: disable=import-outside-toplevel
    from google.protobuf import json_format  # pylint: disable=import-outside-toplevel
    # TensorFlow comes with the client library: imported only once a server answered.
    from slimserve.serving.clients import client as client_lib  # pylint: disable=import-outside-toplevel
    client = client_lib.Client(config.server, config.model_name, config.model_version,
                               config.version_label, config.timeout, config.max_message_bytes,
                               config.retries, image_key=config.image_key)
    failed = 0
    try:
        if command == "predict":
            failed = _predict(config, client, files)
        elif command == "classify":
            failed = _classify(config, client, client_lib, files)
        elif command == "accuracy":
            _accuracy(config, client, files[0])
        elif command == "metadata":
            print(json.dumps({name: json_format.MessageToDict(sig)
                              for name, sig in client.metadata().items()}, indent=2))
        else:
            result = [{"version": v, "state": s, "error": e} for v, s, e in client.status()]
            if config.json:
                print(json.dumps(result, indent=2))
            for row in [] if config.json else result:
                print("version %d: %s %s" % (row["version"], row["state"], row["error"]))
    except grpc.RpcError as error:
        raise errors.UserError("%s: %s" % (error.code().name, error.details())) from None
    finally:
        client.close()
    if failed:
        raise errors.UserError("%d of %d files got no answer (see the error lines above)"
                               % (failed, len(files)))


def _check_server_first(argv):
    """Says "nothing is listening" in one line, before logs.run imports TensorFlow (which
    takes seconds): the command's flags are parsed here on a scratch FlagValues for
    --server and the timeouts; absl parses the real ones as usual afterwards (and reports
    bad ones)."""
    try:
        scratch = flags.FlagValues()
        fields.define_flags(CONFIG, scratch)
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
    logs.run(main, config=CONFIG)


if __name__ == "__main__":
    run()
