"""Training-step speed: the Estimator vs a bare tf.compat.v1.Session loop on the same
graph with in-memory data, and the real input_fn vs synthetic data; resnet_v1_50 at 224
and at a small size, with achieved GFLOP/s; fp32 and bf16 side by side.

These machines' speed drifts by tens of percent within minutes, so loops measured one
after the other cannot be compared to a few percent. Every loop here is built once and
kept alive (each Estimator trains in its own thread, paced by a hook); they then take
turns in rounds of a few steps, and each ratio is the median of per-round ratios.

Real input runs twice: over the 500x375 photographs as they are, and over a copy the
converter stored with --max_shorter_side near the training size, as one would prepare
data for a small model. The input_fn's own rate is measured too: on a CPU-only machine
decoding shares the cores with the step, which bounds how close real input can come to
synthetic.

    make bench-train        (python benchmarks/bench_train.py --help)
"""
import argparse
import dataclasses
import os
import queue
import threading
import time

import numpy as np

import common  # pylint: disable=wrong-import-order

from slimserve.cli import logs  # pylint: disable=wrong-import-order

logs.quiet_tensorflow()
import tensorflow as tf  # noqa: E402  pylint: disable=wrong-import-position

from slimserve.estimator import dataset  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import inputs
from slimserve.estimator import model
from slimserve.estimator import preprocessing
from slimserve.estimator import run_config
from slimserve.estimator import schema


BARE = "bare Session, in-memory batch"


def _config(size, precision):
    return model.ModelConfig(model_name="resnet_v1_50", num_classes=10,
                             optimizer="momentum", learning_rate=0.01,
                             batch_norm_decay=0.9), run_config.session_config(
                                 precision=precision)


class BareLoop:
    """model_fn's train op in a plain Session over one in-memory batch (`session_config`:
    another ConfigProto than the precision's, as bench_runtime_switches.py passes)."""

    def __init__(self, size, batch, precision, session_config=None):
        config, default_config = _config(size, precision)
        session_config = session_config or default_config
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.compat.v1.set_random_seed(0)
            rng = np.random.RandomState(0)
            images = tf.constant(rng.randn(batch, size, size, 3).astype(np.float32))
            labels = tf.constant(rng.randint(0, 10, batch).astype(np.int32))
            self.train_op = model.model_fn({"image": images}, labels,
                                           tf.estimator.ModeKeys.TRAIN,
                                           dataclasses.asdict(config)).train_op
            self.session = tf.compat.v1.Session(config=session_config)
            self.session.run(tf.compat.v1.global_variables_initializer())

    def run(self, steps):
        """Seconds for `steps` training steps."""
        started = time.perf_counter()
        for _ in range(steps):
            self.session.run(self.train_op)
        return time.perf_counter() - started

    def close(self):
        self.session.close()


class _Pacer(tf.estimator.SessionRunHook):
    """Holds the Estimator's own training loop between rounds: it runs exactly the
    steps it is given, reports their time, then waits for the next order."""

    def __init__(self):
        self.orders, self.reports = queue.Queue(), queue.Queue()
        self.left, self.started = 0, 0.0
        self.waiting = threading.Event()  # set once the graph is built and the session up

    def before_run(self, run_context):
        if self.left == 0:
            self.waiting.set()
            order = self.orders.get()
            if order is None:
                run_context.request_stop()  # this last step runs untimed
                self.left = -1
                return
            self.left, self.started = order, time.perf_counter()

    def after_run(self, run_context, run_values):
        self.left -= 1
        if self.left == 0:
            self.reports.put(time.perf_counter() - self.started)


class EstimatorLoop:
    """Estimator.train in a background thread; run(steps) lets it take that many steps."""

    def __init__(self, size, precision, input_fn, model_dir):
        config, session_config = _config(size, precision)
        self.estimator = tf.estimator.Estimator(
            model.model_fn, model_dir=model_dir, params=dataclasses.asdict(config),
            config=tf.estimator.RunConfig(
                session_config=session_config, tf_random_seed=0,
                save_checkpoints_steps=10 ** 9, save_checkpoints_secs=None,
                save_summary_steps=10 ** 9, log_step_count_steps=10 ** 9))
        self.pacer, self.errors = _Pacer(), []
        self.thread = threading.Thread(target=self._train, args=(input_fn,), daemon=True)
        self.thread.start()
        # Graphs are built one at a time: tf_slim's arg_scope stack is process-global.
        self.pacer.waiting.wait()
        if self.errors:
            raise RuntimeError("Estimator loop failed: %r" % self.errors[0])

    def _train(self, input_fn):
        try:
            self.estimator.train(input_fn, hooks=[self.pacer])
        except Exception as error:  # pylint: disable=broad-except  (re-raised in run)
            self.errors.append(error)
            self.pacer.reports.put(None)
            self.pacer.waiting.set()

    def run(self, steps):
        self.pacer.orders.put(steps)
        seconds = self.pacer.reports.get()
        if seconds is None:
            raise RuntimeError("Estimator loop failed: %r" % self.errors[0])
        return seconds

    def close(self):
        self.pacer.orders.put(None)
        self.thread.join()


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
    parser.add_argument("--steps", default="2,5",
                        help="Steps per loop per round, per image side.")
    common.add_turn_flags(parser, 20, 3, "loop",
                          "Warm-up steps per loop before the rounds, not timed. The "
                          "Estimator's first steps are slow (measured 10x with 1), so "
                          "keep >= 3.")
    parser.add_argument("--stored_sides", default="256,64",
                        help="Per image side, the converter's --max_shorter_side for the "
                             "second copy of the photographs (0: no such row).")
    parser.add_argument("--precisions",
                        default="fp32,bf16" if run_config.cpu_supports_bf16() else "fp32",
                        help="Comma-separated, measured side by side: fp32, bf16 (oneDNN "
                             "auto mixed precision on CPUs with AVX512_BF16), fp16 (GPU).")
    args = parser.parse_args()
    precisions = args.precisions.split(",")
    for precision in precisions:
        if precision not in run_config.PRECISIONS:
            parser.error("--precisions: %r is not one of %s" % (precision,
                                                                 run_config.PRECISIONS))
    if args.rounds < 1 or args.skip < 1:
        parser.error("--rounds and --skip must be >= 1")
    per_size = {}
    for flag in ("sizes", "batch_sizes", "steps", "stored_sides"):
        try:
            per_size[flag] = [int(v) for v in getattr(args, flag).split(",")]
        except ValueError:
            parser.error("--%s: expected comma-separated integers, got %r"
                         % (flag, getattr(args, flag)))
        if len(per_size[flag]) != len(per_size["sizes"]):
            parser.error("--%s has %d values for %d --sizes: give one per image side"
                         % (flag, len(per_size[flag]), len(per_size["sizes"])))
    import make_photos  # pylint: disable=import-outside-toplevel
    photos = common.work_dir("photos")
    if not os.listdir(photos):
        make_photos.write_photos(photos, 400)

    def photo_records(max_shorter_side):
        """The photographs as TFRecords, built once per --max_shorter_side."""
        path = os.path.join(common.WORK, "photos_tfrecords" + (
            "_side%d" % max_shorter_side if max_shorter_side else ""))
        if not os.path.exists(os.path.join(path, schema.INFO_FILE)):
            dataset.build_dataset(photos, path, 0.0, train_shards=8, validation_shards=1,
                                  show_progress=False, max_shorter_side=max_shorter_side)
        return path

    rows, notes = [], []
    for size, batch, steps, side in zip(*per_size.values()):
        flops = 3 * common.count_flops(_config(size, "fp32")[0], size)  # fwd + bwd ~ 3x fwd
        input_config = inputs.InputConfig(batch_size=batch, shuffle_buffer=256)
        input_spec = preprocessing.Spec(size, preprocessing.VGG)
        real_inputs = {"Estimator, real input_fn, 500x375 stored": photo_records(0)}
        if side:
            real_inputs["Estimator, real input_fn, stored at side %d" % side] = (
                photo_records(side))
        input_rates = {
            name: input_only_rate(inputs.make_input_fn(path, schema.TRAIN, True,
                                                       input_config, input_spec, seed=0),
                                  batch, max(20, 4 * steps), args.skip)
            for name, path in real_inputs.items()}
        precision_ratio = {precisions[0]: 1.0}
        if len(precisions) > 1:
            # Precisions compared in the same rounds: blocks run one after the other
            # would measure this machine's drift (1.4-1.7x within minutes), not bf16.
            print("%d px: bare loops of %s side by side, %d rounds" % (
                size, ", ".join(precisions), args.rounds), flush=True)
            bare_loops = {precision: BareLoop(size, batch, precision)
                          for precision in precisions}
            try:
                bare_seconds = common.take_turns(bare_loops, steps, args.rounds, args.skip)
            finally:
                for loop in bare_loops.values():
                    loop.close()
            for precision in precisions[1:]:
                precision_ratio[precision] = float(np.median(
                    bare_seconds[precisions[0]] / bare_seconds[precision]))
        for precision in precisions:
            run_dir = common.work_dir("train_%d_%s" % (size, precision))
            print("%d px %s: building the loops, then %d rounds of %d steps each" % (
                size, precision, args.rounds, steps), flush=True)
            loops = {BARE: BareLoop(size, batch, precision),
                     "Estimator, synthetic input": EstimatorLoop(
                         size, precision, synthetic_input_fn(size, batch),
                         os.path.join(run_dir, "synthetic"))}
            for index, (name, path) in enumerate(real_inputs.items()):
                loops[name] = EstimatorLoop(
                    size, precision, inputs.make_input_fn(path, schema.TRAIN, True,
                                                          input_config, input_spec, seed=0),
                    os.path.join(run_dir, "real%d" % index))
            try:
                seconds = common.take_turns(loops, steps, args.rounds, args.skip)
            finally:
                for loop in loops.values():
                    loop.close()
            bare, synthetic = seconds[BARE], seconds["Estimator, synthetic input"]
            for name, times in seconds.items():
                rate = steps * batch / np.median(times)
                rows.append([size, batch, precision, name, "%.1f" % rate,
                             "%.2f" % np.median(bare / times),
                             "%.2f" % np.median(synthetic / times),
                             "%.1f" % (rate * flops / 1e9),
                             "%.2f" % precision_ratio[precision] if name == BARE else ""])
                if name in input_rates:
                    # if input and step only shared the cores (no stalls), real input
                    # would run at this fraction of synthetic
                    synthetic_rate = steps * batch / np.median(synthetic)
                    shared = 1.0 / (1.0 / synthetic_rate + 1.0 / input_rates[name])
                    notes.append("%d px %s, %s: input_fn alone %.0f img/s; sharing the cores "
                                 "with it, the step could at best run %.2f of synthetic" % (
                                     size, precision, name.split(", ")[-1], input_rates[name],
                                     shared / synthetic_rate))
            spread = bare.max() / bare.min()
            notes.append("%d px %s: the bare loop's round times varied %.2fx over the run" % (
                size, precision, spread))
    common.table("resnet_v1_50 training step (%d cores; %d interleaved rounds)" % (
        os.cpu_count(), args.rounds),
                 ["size", "batch", "precision", "loop", "images/s", "vs bare",
                  "vs synthetic", "GFLOP/s",
                  "bare vs %s (same rounds)" % precisions[0]], rows)
    print("\n".join([""] + notes))


if __name__ == "__main__":
    main()
