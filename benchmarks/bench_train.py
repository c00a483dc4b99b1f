"""Training-step speed: the Estimator vs a bare tf.compat.v1.Session loop on the same
graph with in-memory data, and the real input_fn vs synthetic data; resnet_v1_50 at 224
and at a small size, with achieved GFLOP/s; fp32 and bf16 side by side. The input_fn's
own rate is measured too: on a CPU-only machine decoding shares the cores with the step,
which bounds how close real input can come to synthetic.

    make bench-train        (python benchmarks/bench_train.py --help)
"""
import argparse
import dataclasses
import os
import time

import numpy as np

import common  # pylint: disable=wrong-import-order

import slimserve_quiet  # pylint: disable=wrong-import-order

slimserve_quiet.quiet_tensorflow()
import tensorflow as tf  # noqa: E402  pylint: disable=wrong-import-position

from estimator import dataset, inputs, model, run_config, schema  # noqa: E402  pylint: disable=wrong-import-position


class _StepTimer(tf.estimator.SessionRunHook):
    """Records step-to-step times after `skip` warm-up steps, inside the Estimator's loop."""

    def __init__(self, skip):
        self.skip, self.count, self.last, self.durations = skip, 0, None, []

    def after_run(self, run_context, run_values):
        self.count += 1
        now = time.perf_counter()
        if self.count > self.skip:
            self.durations.append(now - self.last)
        self.last = now


def _rate(batch, durations):
    """Images/s from the median step time: robust to the bursts of other load that
    these shared machines have, which a mean over a few steps is not."""
    return batch / float(np.median(durations))


def _config(size, precision):
    return model.ModelConfig(model_name="resnet_v1_50", num_classes=10, image_size=size,
                             optimizer="momentum", learning_rate=0.01,
                             batch_norm_decay=0.9), run_config.session_config(
                                 precision=precision)


def bare_session(size, batch, steps, skip, precision):
    config, session_config = _config(size, precision)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        rng = np.random.RandomState(0)
        images = tf.constant(rng.randn(batch, size, size, 3).astype(np.float32))
        labels = tf.constant(rng.randint(0, 10, batch).astype(np.int32))
        spec = model.model_fn({"image": images}, labels, tf.estimator.ModeKeys.TRAIN,
                              dataclasses.asdict(config))
        with tf.compat.v1.Session(config=session_config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(skip):
                session.run(spec.train_op)
            durations = []
            for _ in range(steps):
                started = time.perf_counter()
                session.run(spec.train_op)
                durations.append(time.perf_counter() - started)
            return _rate(batch, durations)


def estimator_rate(size, batch, steps, skip, precision, input_fn, model_dir):
    config, session_config = _config(size, precision)
    estimator = tf.estimator.Estimator(
        model.model_fn, model_dir=model_dir, params=dataclasses.asdict(config),
        config=tf.estimator.RunConfig(session_config=session_config, tf_random_seed=0,
                                      save_checkpoints_steps=10 ** 6, save_summary_steps=10 ** 6,
                                      log_step_count_steps=10 ** 6))
    timer = _StepTimer(skip)
    estimator.train(input_fn, steps=skip + steps, hooks=[timer])
    return _rate(batch, timer.durations)


def input_only_rate(input_fn, batch, batches, skip):
    """Images/s of the real input_fn alone (decode, crop, batch) on this machine's cores:
    its CPU cost, which a CPU-only step has to share."""
    graph = tf.Graph()
    with graph.as_default():
        next_batch = tf.compat.v1.data.make_one_shot_iterator(input_fn()).get_next()
        with tf.compat.v1.Session() as session:
            for _ in range(skip):
                session.run(next_batch)
            started = time.perf_counter()
            for _ in range(batches):
                session.run(next_batch)
            return batches * batch / (time.perf_counter() - started)


def synthetic_input_fn(size, batch):
    def input_fn():
        rng = np.random.RandomState(0)
        features = {"image": tf.constant(rng.randn(batch, size, size, 3).astype(np.float32))}
        labels = tf.constant(rng.randint(0, 10, batch).astype(np.int32))
        return tf.data.Dataset.from_tensors((features, labels)).repeat()
    return input_fn


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="224,32", help="Image sides to measure.")
    parser.add_argument("--batch_sizes", default="16,32", help="Batch size per image side.")
    parser.add_argument("--steps", default="10,60",
                        help="Timed steps per image side (rates use the median step).")
    parser.add_argument("--skip", type=int, default=3, help="Warm-up steps not timed.")
    parser.add_argument("--precisions",
                        default="fp32,bf16" if run_config.cpu_supports_bf16() else "fp32",
                        help="Comma-separated, measured side by side: fp32, bf16 (oneDNN "
                             "auto mixed precision on CPUs with AVX512_BF16), fp16 (GPU).")
    args = parser.parse_args()
    import make_photos  # pylint: disable=import-outside-toplevel
    photos = common.work_dir("photos")
    data_dir = os.path.join(common.WORK, "photos_tfrecords")
    if not os.listdir(photos):
        make_photos.write_photos(photos, 400)
    if not os.path.exists(os.path.join(data_dir, schema.INFO_FILE)):
        dataset.build_dataset(photos, data_dir, 0.0, train_shards=8, validation_shards=1,
                              show_progress=False)
    precisions = args.precisions.split(",")
    for precision in precisions:
        if precision not in run_config.PRECISIONS:
            parser.error("--precisions: %r is not one of %s" % (precision,
                                                                 run_config.PRECISIONS))
    rows, notes = [], []
    for size, batch, steps in zip(*(map(int, v.split(",")) for v in (
            args.sizes, args.batch_sizes, args.steps))):
        flops = 3 * model.count_flops(_config(size, "fp32")[0], size)  # fwd + bwd ~ 3x fwd
        real = inputs.make_input_fn(data_dir, schema.TRAIN, True, inputs.InputConfig(
            image_size=size, batch_size=batch, seed=0, shuffle_buffer=256))
        run_dir = common.work_dir("train_%d" % size)
        input_rate = input_only_rate(real, batch, max(20, 4 * steps), args.skip)
        first_bare = None
        for precision in precisions:
            bare = bare_session(size, batch, steps, args.skip, precision)
            first_bare = first_bare or bare
            synthetic = estimator_rate(size, batch, steps, args.skip, precision,
                                       synthetic_input_fn(size, batch),
                                       os.path.join(run_dir, "s_" + precision))
            real_rate = estimator_rate(size, batch, steps, args.skip, precision, real,
                                       os.path.join(run_dir, "r_" + precision))
            for name, rate in (("bare Session, in-memory batch", bare),
                               ("Estimator, synthetic input", synthetic),
                               ("Estimator, real input_fn", real_rate)):
                rows.append([size, batch, precision, name, "%.1f" % rate,
                             "%.2f" % (rate / bare), "%.2f" % (rate / synthetic),
                             "%.1f" % (rate * flops / 1e9)])
            rows[-3].append("%.2f" % (bare / first_bare))
            rows[-2].append("")
            rows[-1].append("")
            # if input and step only shared the cores (no stalls), real input would run at
            shared = 1.0 / (1.0 / synthetic + 1.0 / input_rate)
            notes.append("%d px %s: input_fn alone %.0f img/s; sharing the cores with it, "
                         "the step could at best run %.1f img/s (%.2f of synthetic); real "
                         "input ran %.2f of that bound" % (
                             size, precision, input_rate, shared, shared / synthetic,
                             real_rate / shared))
    common.table("resnet_v1_50 training step (%d cores)" % os.cpu_count(),
                 ["size", "batch", "precision", "loop", "images/s", "vs bare",
                  "vs synthetic", "GFLOP/s", "bare vs %s" % precisions[0]], rows)
    print("\n".join([""] + notes))


if __name__ == "__main__":
    main()
