"""Run by test_image_guard.py in a memory-capped interpreter: feeds every bomb in
slimserve/testing/image_bombs.py to an exported SavedModel's decoding signatures and to the train
and eval input pipelines, and prints one JSON line with each outcome and the peak RSS
before and after the bombs.

    python tests/guard_worker.py <export_dir> <work_dir>
"""
import json
import os
import resource
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from slimserve.estimator import inputs  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import preprocessing  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import schema  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.export import signatures  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.export import verify  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.testing import image_bombs  # noqa: E402  pylint: disable=wrong-import-position


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def write_shard(folder, images):
    os.makedirs(folder, exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(folder, schema.shard_name("validation", 0, 1))) \
            as writer:
        for encoded in images:
            writer.write(schema.make_example(encoded, "jpeg", 1, "1", 32, 32)
                         .SerializeToString())
    with open(os.path.join(folder, schema.INFO_FILE), "w") as handle:
        handle.write("{}")  # a finished data set, as far as input_fn is concerned
    return folder


def count_records(folder, training, size):
    config = inputs.InputConfig(batch_size=1, eval_batch_size=1, verify_shards=False)
    input_fn = inputs.make_input_fn(folder, "validation", training, config,
                                    preprocessing.Spec(size, preprocessing.VGG), seed=0,
                                    num_epochs=1)
    return sum(1 for _ in input_fn())


def run_signature(session, meta, name, encoded):
    if name == signatures.CLASSIFY:
        example = schema.make_example(encoded, "jpeg", 0, "0", 1, 1).SerializeToString()
        feed = {signatures.EXAMPLES: np.array([example], dtype=object)}
    else:
        feed = {signatures.IMAGE_BYTES: np.array([encoded], dtype=object)}
    try:
        verify.run_signature(session, meta, name, feed)
        return "decoded"
    except tf.errors.InvalidArgumentError as error:
        return "InvalidArgument: " + error.message[:400]
    except tf.errors.OpError as error:  # e.g. ResourceExhausted: the guard did not hold
        return type(error).__name__ + ": " + error.message[:400]


def main(export_dir, work_dir):
    valid = image_bombs.encode(np.full((32, 32, 3), 200, np.uint8), "JPEG")
    bombs = {name: make() for name, (make, _) in image_bombs.BOMBS.items()}
    result = {"bytes": {name: len(data) for name, data in bombs.items()}}
    clean = write_shard(os.path.join(work_dir, "clean"), [valid] * 3)
    warm = [count_records(clean, training, 32) for training in (False, True)]
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        warm += [run_signature(session, meta, name, valid)
                 for name in (signatures.DEFAULT, signatures.CLASSIFY)]
        result["warm"] = warm
        result["rss_before_mb"] = peak_rss_mb()
        for name, data in bombs.items():
            result[name] = {sig: run_signature(session, meta, sig, data)
                            for sig in (signatures.DEFAULT, signatures.CLASSIFY)}
    mixed = write_shard(os.path.join(work_dir, "mixed"), [valid] + list(bombs.values()) + [valid])
    result["eval_records"] = count_records(mixed, False, 32)
    result["train_records"] = count_records(mixed, True, 32)
    result["rss_after_mb"] = peak_rss_mb()
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:3])
