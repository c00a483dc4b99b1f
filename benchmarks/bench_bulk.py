"""Beyond one process: dataset conversion local vs Beam's DirectRunner (2 workers), and
bulk inference (slimserve-predict in process, on Beam's RunInference) against plain
session.run of the same SavedModel at the same batch size, and against the gRPC server
with server-side batching, all in the same run.

    make bench-bulk        (python benchmarks/bench_bulk.py --help)

Rates include everything a user waits for: conversion counts pipeline start-up, and
bulk inference reads files and writes JSON lines; session.run is given the encoded
bytes already in memory (the ceiling). In-process and bulk runs alternate in rounds so
the noise of a shared machine hits both; the best round of each is reported.
"""
import argparse
import logging
import os
import shutil
import time

import common  # pylint: disable=wrong-import-order

from slimserve.cli import logs  # pylint: disable=wrong-import-order

logs.quiet_tensorflow()
logging.getLogger("apache_beam").setLevel(logging.WARNING)
import numpy as np  # noqa: E402  pylint: disable=wrong-import-position

import serve_harness  # noqa: E402  pylint: disable=wrong-import-position,wrong-import-order
import make_digits  # noqa: E402  pylint: disable=wrong-import-position,wrong-import-order
from slimserve import image_listing  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.cli import beam as beam_cli  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import beam_dataset  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import dataset
from slimserve.serving import server as server_lib
from slimserve.serving.bulk import beam as beam_inference
from slimserve.serving.bulk import inputs as bulk_inputs
from slimserve.serving.bulk import predict as bulk_predict
from slimserve.serving.clients import client as client_lib  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.serving.clients import image_classifier
from slimserve.serving.clients import loadtest
from slimserve.serving.core import batching  # noqa: E402  pylint: disable=wrong-import-position

MULTI = "--direct_num_workers=2 --direct_running_mode=multi_processing"


def bench_conversion(images, count):
    out = common.work_dir("bulk_convert")
    rows = []
    for name, build in (
            ("local (process pool, 2 workers)", lambda o: dataset.build_dataset(
                images, o, train_shards=4, validation_shards=2, num_workers=2, overwrite=True,
                show_progress=False)),
            ("Beam DirectRunner, 2 workers", lambda o: beam_dataset.build_dataset(
                images, o, beam_cli.pipeline_options("DirectRunner", MULTI), train_shards=4,
                validation_shards=2,
                overwrite=True))):
        started = time.perf_counter()
        build(os.path.join(out, "out"))
        rows.append((name, count, "%.0f" % (count / (time.perf_counter() - started))))
    common.table("Conversion of %d digit images (start-up included)" % count,
                 ("converter", "images", "images/s"), rows)


def bench_inference(images, base, batch_size, rounds, concurrency):
    refs = bulk_inputs.list_inputs(images)
    encoded = [item.data for ref in refs for item in bulk_inputs.read(ref)]
    version, path = bulk_predict.model_path(base)
    classifier = image_classifier.ImageClassifier(path, version)
    session, signature = classifier.servable.session, classifier.signature
    feed = signature.inputs[classifier.input_key].name
    fetches = [signature.outputs[k].name for k in classifier.output_keys]

    def session_run():
        for start in range(0, len(encoded), batch_size):
            session.run(fetches, {feed: np.array(encoded[start:start + batch_size], object)})
        return len(encoded)

    out = common.work_dir("bulk_predict")

    def bulk_local():  # the model stays loaded, as in one long slimserve-predict run
        bulk_predict.score(classifier, refs, os.path.join(out, "local.jsonl"), batch_size)
        return len(encoded)

    rates, paired = {"session": 0.0, "local": 0.0}, []
    session_run()  # warm-up: first-run graph optimisation
    for _ in range(rounds):
        this_round = {}
        for name, fn in (("session", session_run), ("local", bulk_local)):
            started = time.perf_counter()
            count = fn()
            this_round[name] = count / (time.perf_counter() - started)
            rates[name] = max(rates[name], this_round[name])
        paired.append(this_round["local"] / this_round["session"])
    classifier.close()

    started = time.perf_counter()
    beam_inference.predict_beam(base, images, os.path.join(out, "beam.jsonl"),
                                beam_cli.pipeline_options("DirectRunner", MULTI),
                                batch_size=batch_size)
    beam_rate = len(encoded) / (time.perf_counter() - started)

    server = server_lib.ModelServer(
        model_base_path=base, port=server_lib.PICK_FREE_PORT, rest_api_port=0,
        file_system_poll_wait_seconds=0,
        batching_parameters=batching.BatchingParameters(max_batch_size=batch_size,
                                                        batch_timeout_micros=2000)).start()
    client = client_lib.Client("127.0.0.1:%d" % server.port)
    try:
        client.predict_images(encoded[:1])
        # every image once, batch-1, `concurrency` closed-loop clients: the one load generator
        grpc_rate = loadtest.run_level(client, encoded, concurrency,
                                       len(encoded))["images_per_s"]
    finally:
        client.close()
        server.stop()

    ratio = float(np.median(paired))
    common.table(
        "Bulk inference, %d images, batch %d (in-process rows: best of %d alternating rounds)"
        % (len(encoded), batch_size, rounds), ("path", "images/s", "vs session.run"), [
            ("session.run, bytes in memory", "%.0f" % rates["session"], "1.00"),
            ("slimserve-predict (local; ratio: median of paired rounds)",
             "%.0f" % rates["local"], "%.2f" % ratio),
            ("slimserve-predict --runner=DirectRunner (2 workers, start-up incl.)",
             "%.0f" % beam_rate, "%.2f" % (beam_rate / rates["session"])),
            ("gRPC server, batching %d, %d clients x batch-1 requests"
             % (batch_size, concurrency), "%.0f" % grpc_rate,
             "%.2f" % (grpc_rate / rates["session"]))])
    print("target: local >= 0.9 x session.run: %s" % ("met" if ratio >= 0.9 else "NOT met"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=64, help="image side and model input")
    parser.add_argument("--images", type=int, default=600, help="digit images used")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    source = common.work_dir("bulk_images_%d" % args.size)
    if not os.listdir(source):
        make_digits.write_digits(source, size=args.size)
    images = os.path.join(common.WORK, "bulk_subset_%d_%d" % (args.size, args.images))
    if not os.path.isdir(images):  # the first N images, classes kept
        all_files = sorted((label, name) for label in os.listdir(source)
                           for name in os.listdir(os.path.join(source, label)))
        for label, name in all_files[::max(1, len(all_files) // args.images)][:args.images]:
            os.makedirs(os.path.join(images, label), exist_ok=True)
            shutil.copy(os.path.join(source, label, name), os.path.join(images, label, name))
    count = len(image_listing.list_folder(images, labels="required").entries)
    bench_conversion(images, count)
    base = os.path.join(common.work_dir("bulk_export_%d" % args.size), "resnet")
    serve_harness.make_export(base, args.size)
    bench_inference(images, base, args.batch_size, args.rounds, args.concurrency)


if __name__ == "__main__":
    main()
