"""slimserve-client's subcommands (predict, classify, metadata, status, accuracy) over one
Client: each prints its answers as text or JSON (stdout; errors on stderr) as they arrive.

`run` is the command's one call: a file that cannot be sent or is refused is one error
line naming it and the others are still answered; then, and on any gRPC failure or a
labelled set whose labels are not the model's classes, one UserError says why (the
command exits 1 on it). `config` is the command's ClientConfig (slimserve/cli/client.py).
"""
import json
import sys

import grpc
from google.protobuf import json_format

from slimserve import conventions
from slimserve import errors
from slimserve import outputs
from slimserve.serving.bulk import report as bulk_report
from slimserve.serving.clients import client as client_lib
from slimserve.serving.clients import served_accuracy


def top(pairs, k):
    """The `k` (class, score) pairs of highest score, highest first."""
    return sorted(pairs, key=lambda p: -p[1])[:k]


def predict(config, client, files):
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


def classify(config, client, files):
    """Sends every readable file in one Classify request and prints the top classes;
    returns how many files could not be sent."""
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
                                     for c, s in top(pairs, config.top_k)]}
            for path, pairs in zip(sent, classes)]
    if config.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print("%s: %s" % (row["file"], ", ".join("%s %.3f" % (e["class"], e["score"])
                                                    for e in row["top_k"])))
    return failed


def accuracy(config, client, spec):
    """Scores the labelled folder or CSV `spec` through the server and prints the report;
    UserError when its labels are not the model's classes (no accuracy then)."""
    outputs.check_output(config.summary, "--summary")  # before any image is sent
    outputs.check_output(config.confusion_matrix, "--confusion_matrix")
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


def metadata(client):
    print(json.dumps({name: json_format.MessageToDict(sig)
                      for name, sig in client.metadata().items()}, indent=2))


def status(config, client):
    result = [{"version": v, "state": s, "error": e} for v, s, e in client.status()]
    if config.json:
        print(json.dumps(result, indent=2))
    for row in [] if config.json else result:
        print("version %d: %s %s" % (row["version"], row["state"], row["error"]))


def run(config, command, files):
    """Runs `command` (predict, classify, metadata, status or accuracy) against config.server with `files` (the image
    files of predict and classify; the one labelled folder or CSV of accuracy)."""
    client = client_lib.Client(config.server, config.model_name, config.model_version,
                               config.version_label, config.timeout, config.max_message_bytes,
                               config.retries, image_key=config.image_key)
    failed = 0
    try:
        if command == "predict":
            failed = predict(config, client, files)
        elif command == "classify":
            failed = classify(config, client, files)
        elif command == "accuracy":
            accuracy(config, client, files[0])
        elif command == "metadata":
            metadata(client)
        elif command == "status":
            status(config, client)
        else:
            raise ValueError("no such slimserve-client command: %r" % command)
    except grpc.RpcError as error:
        raise errors.UserError("%s: %s" % (error.code().name, error.details())) from None
    finally:
        client.close()
    if failed:
        raise errors.UserError("%d of %d files got no answer (see the error lines above)"
                               % (failed, len(files)))
