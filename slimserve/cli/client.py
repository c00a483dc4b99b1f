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
--connect_timeout, before TensorFlow is even imported. The subcommands are
serving/clients/queries.py's.
"""
import dataclasses
import sys

from absl import flags

from slimserve import conventions
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
    # TensorFlow comes with the client library: imported only once a server answered.
    from slimserve.serving.clients import queries  # pylint: disable=import-outside-toplevel
    queries.run(config, command, files)


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
