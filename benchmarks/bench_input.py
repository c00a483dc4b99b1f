"""Input pipelines side by side on the same ImageNet-like photos, feeding the same
small graph: (1) the seeds' feed_dict loader, (2) Python threads filling a FIFOQueue,
(3) our input_fn over TFRecords; plus the bound (single-thread rate of the same
per-image work x cores) and peak RSS at 1x and 10x the data set.

    make bench-input        (python benchmarks/bench_input.py --help)
"""
import argparse
import os
import queue as queue_lib
import subprocess
import sys
import threading

import numpy as np
from PIL import Image

import common  # pylint: disable=wrong-import-order

from slimserve.cli import logs  # pylint: disable=wrong-import-order

logs.quiet_tensorflow()
import tensorflow as tf  # noqa: E402  pylint: disable=wrong-import-position

from slimserve import image_listing  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import dataset  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import inputs
from slimserve.estimator import preprocessing
from slimserve.estimator import schema
from slimserve.estimator import splits  # noqa: E402  pylint: disable=wrong-import-position

SIZE = 224


def _files(folder):
    """The images of a folder tree, listed as every tool lists them (image_listing)."""
    return sorted(entry.path for entry in image_listing.list_folder(folder).entries)


def _pil_preprocess(path, rng):
    """The seeds' per-image work in Python: decode, random crop, resize, flip."""
    image = Image.open(path).convert("RGB")
    width, height = image.size
    area = rng.uniform(0.25, 1.0) * width * height
    ratio = rng.uniform(3 / 4, 4 / 3)
    w = int(min(width, round(np.sqrt(area * ratio))))
    h = int(min(height, round(np.sqrt(area / ratio))))
    left, top = rng.randint(0, width - w + 1), rng.randint(0, height - h + 1)
    image = image.crop((left, top, left + w, top + h)).resize((SIZE, SIZE), Image.BILINEAR)
    array = np.asarray(image, np.float32)
    if rng.rand() < 0.5:
        array = array[:, ::-1]
    return array - np.array([123.68, 116.78, 103.94], np.float32)


def _consumer(images):
    """The same small graph for every pipeline: one conv and a mean."""
    kernel = tf.constant(np.random.RandomState(0).randn(3, 3, 3, 8).astype(np.float32) * 0.01)
    return tf.reduce_mean(tf.nn.conv2d(images, kernel, 2, "SAME"))


def bench_feed_dict(files, batch, seconds):
    graph = tf.Graph()
    with graph.as_default():
        placeholder = tf.compat.v1.placeholder(tf.float32, [None, SIZE, SIZE, 3])
        out = _consumer(placeholder)
        session = tf.compat.v1.Session()
    rng = np.random.RandomState(0)
    position = [0]

    def step():
        chunk = [files[(position[0] + i) % len(files)] for i in range(batch)]
        position[0] += batch
        session.run(out, {placeholder: np.stack([_pil_preprocess(p, rng) for p in chunk])})
        return batch

    return common.timed(step, seconds)


def bench_fifo_queue(files, batch, seconds, threads):
    graph = tf.Graph()
    with graph.as_default():
        fifo = tf.queue.FIFOQueue(batch * 4, [tf.float32], shapes=[[SIZE, SIZE, 3]])
        placeholder = tf.compat.v1.placeholder(tf.float32, [SIZE, SIZE, 3])
        enqueue = fifo.enqueue([placeholder])
        out = _consumer(fifo.dequeue_many(batch))
        close = fifo.close(cancel_pending_enqueues=True)
        session = tf.compat.v1.Session()
    stop = threading.Event()
    work = queue_lib.Queue()

    def producer(seed):
        rng = np.random.RandomState(seed)
        index = seed
        while not stop.is_set():
            try:
                session.run(enqueue, {placeholder: _pil_preprocess(files[index % len(files)],
                                                                   rng)})
            except tf.errors.CancelledError:
                return
            index += threads
        work.put(seed)

    workers = [threading.Thread(target=producer, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    rate = common.timed(lambda: session.run(out) is not None and batch, seconds)
    stop.set()
    session.run(close)
    return rate


def _dataset_rate(data_dir, batch, seconds, single_thread=False):
    config = inputs.InputConfig(batch_size=batch, shuffle_buffer=256,
                                num_parallel_calls=1 if single_thread else tf.data.AUTOTUNE,
                                cycle_length=1 if single_thread else 8,
                                prefetch=1 if single_thread else tf.data.AUTOTUNE)
    graph = tf.Graph()
    with graph.as_default():
        ds = inputs.make_input_fn(data_dir, schema.TRAIN, True, config,
                                  preprocessing.Spec(SIZE, preprocessing.VGG), seed=0)()
        if single_thread:
            options = tf.data.Options()
            options.threading.private_threadpool_size = 1
            options.threading.max_intra_op_parallelism = 1
            ds = ds.with_options(options)
        features, _ = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        out = _consumer(features["image"])
        session_config = tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=1 if single_thread else 0,
            inter_op_parallelism_threads=1 if single_thread else 0)
        session = tf.compat.v1.Session(config=session_config)
    return common.timed(lambda: session.run(out) is not None and batch, seconds)


def _replicate(data_dir, target, times):
    """A data set `times` as large: the same records written `times` over."""
    os.makedirs(target, exist_ok=True)
    if os.path.exists(os.path.join(target, schema.INFO_FILE)):
        return target
    records = [r for f in splits.split_files(data_dir, schema.TRAIN)
               for r in tf.compat.v1.io.tf_record_iterator(f)]
    shards = 8 * times
    for shard in range(shards):
        path = os.path.join(target, schema.shard_name(schema.TRAIN, shard, shards))
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(times):
                for record in records[shard % 8::8]:
                    writer.write(record)
    open(os.path.join(target, schema.INFO_FILE), "w").write("{}")
    return target


def _peak_rss_subprocess(data_dir, batch, batches):
    code = ("import sys; sys.path.insert(0, %r); import bench_input as b; "
            "b._memory_run(%r, %d, %d)" % (os.path.dirname(__file__), data_dir, batch, batches))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _memory_run(data_dir, batch, batches):
    """Reads exactly `batches` batches (repeating the set as training does), so the 1x
    and 10x runs do the same work and differ only in the size of what they read from."""
    config = inputs.InputConfig(batch_size=batch, shuffle_buffer=256)
    ds = inputs.make_input_fn(data_dir, schema.TRAIN, True, config,
                              preprocessing.Spec(SIZE, preprocessing.VGG), seed=0)()
    read = sum(1 for _ in ds.take(batches))
    if read != batches:
        raise AssertionError("read %d batches, wanted %d" % (read, batches))
    print(common.peak_rss_mb())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=400, help="Photos generated.")
    parser.add_argument("--batch_size", type=int, default=32, help="Batch size.")
    parser.add_argument("--seconds", type=float, default=8.0, help="Seconds per method.")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="FIFOQueue producer threads.")
    args = parser.parse_args()
    import make_photos  # pylint: disable=import-outside-toplevel
    photos = common.work_dir("photos")
    data_dir = os.path.join(common.WORK, "photos_tfrecords")
    if not os.listdir(photos):
        make_photos.write_photos(photos, args.photos)
    if not os.path.exists(os.path.join(data_dir, schema.INFO_FILE)):
        dataset.build_dataset(photos, data_dir, 0.0, train_shards=8, validation_shards=1,
                              show_progress=False)
    files = _files(photos)
    cores = os.cpu_count()
    print("photos: %d JPEGs of %s, batch %d, %d cores, %.0f s per method" % (
        len(files), Image.open(files[0]).size, args.batch_size, cores, args.seconds))
    single = _dataset_rate(data_dir, args.batch_size, args.seconds, single_thread=True)
    ours = _dataset_rate(data_dir, args.batch_size, args.seconds)
    feed = bench_feed_dict(files, args.batch_size, args.seconds)
    fifo = bench_fifo_queue(files, args.batch_size, args.seconds, args.threads)
    bound = single * cores
    common.table("input pipelines (images/s, same photos, same consumer graph)",
                 ["pipeline", "images/s", "vs feed_dict", "vs bound"], [
                     ["feed_dict (PIL, Python loop)", "%.1f" % feed, "1.00x",
                      "%.2f" % (feed / bound)],
                     ["FIFOQueue + %d threads" % args.threads, "%.1f" % fifo,
                      "%.2fx" % (fifo / feed), "%.2f" % (fifo / bound)],
                     ["slimserve input_fn (TFRecords)", "%.1f" % ours, "%.2fx" % (ours / feed),
                      "%.2f" % (ours / bound)],
                     ["bound: 1 thread x %d cores" % cores, "%.1f" % bound,
                      "%.2fx" % (bound / feed), "1.00"],
                 ])
    ten = _replicate(data_dir, os.path.join(common.WORK, "photos_tfrecords_10x"), 10)
    batches = 60
    one_x = _peak_rss_subprocess(data_dir, args.batch_size, batches)
    ten_x = _peak_rss_subprocess(ten, args.batch_size, batches)
    common.table("peak RSS of the input pipeline (%d batches read from each)" % batches,
                 ["data set", "records", "peak RSS MB"], [
                     ["1x", len(files), "%.0f" % one_x],
                     ["10x", len(files) * 10, "%.0f" % ten_x]])


if __name__ == "__main__":
    main()
