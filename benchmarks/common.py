"""Helpers shared by the benchmarks: timing, tables, peak memory, work folders."""
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
WORK = os.path.join(ROOT, "bench_out")

# Every benchmark imports this module first: a figure of speed means little without the
# CPU it ran on (model, AVX-512 / bf16 / AMX flags, TensorFlow's oneDNN switch), and these
# machines vary (AMX Xeons, AVX-512 and AVX2-only EPYCs).
from slimserve import cpu  # noqa: E402  pylint: disable=wrong-import-position
print(cpu.describe(), flush=True)


def work_dir(name):
    path = os.path.join(WORK, name)
    os.makedirs(path, exist_ok=True)
    return path


def timed(fn, min_seconds=5.0, warmup=1):
    """Calls fn() (which returns the number of items it processed) until min_seconds
    pass; returns items per second, excluding `warmup` calls."""
    for _ in range(warmup):
        fn()
    items, started = 0, time.perf_counter()
    while time.perf_counter() - started < min_seconds:
        items += fn()
    return items / (time.perf_counter() - started)


def add_turn_flags(parser, rounds, skip, loop, skip_help):
    """--rounds and --skip, take_turns' two knobs, on an argparse `parser`; `loop` names
    what takes its turn (a loop, a variant)."""
    parser.add_argument("--rounds", type=int, default=rounds,
                        help="Rounds in which every %s takes its turn; ratios are the "
                             "median over rounds." % loop)
    parser.add_argument("--skip", type=int, default=skip, help=skip_help)


def take_turns(loops, steps, rounds, skip):
    """Seconds per round for each of `loops` (name -> object with run(steps) -> seconds):
    a warm-up of `skip` steps each first, then `rounds` rounds in which every loop runs
    `steps` steps, the order rotating every round. A ratio of two loops is best taken as
    the median of their per-round ratios: these machines drift by tens of percent within
    minutes, so loops measured one after the other cannot be compared to a few percent."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    for loop in loops.values():
        loop.run(skip)
    names = list(loops)
    seconds = {name: [] for name in names}
    for index in range(rounds):
        for name in names[index % len(names):] + names[:index % len(names)]:
            seconds[name].append(loops[name].run(steps))
    return {name: np.array(values) for name, values in seconds.items()}


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def table(title, header, rows):
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    print("\n" + title)
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print(line(row))


def count_flops(config, image_size):
    """Forward FLOPs of one image of `config` (estimator.model.ModelConfig), from TF's
    profiler on a fresh graph. TensorFlow is imported here: benchmarks quiet its logging
    before their own import of it."""
    import math  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import model  # pylint: disable=import-outside-toplevel
    graph = tf.Graph()
    with graph.as_default():
        images = tf.compat.v1.placeholder(tf.float32, [1, image_size, image_size, 3])
        model.build_logits(config, images, is_training=False)
        options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
        options["output"] = "none"
        flops = tf.compat.v1.profiler.profile(graph, options=options)
    return flops.total_float_ops if flops else math.nan
