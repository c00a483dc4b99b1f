"""TensorFlow's runtime switches on this CPU, side by side: oneDNN on/off, intra-op and
inter-op threads, XLA on CPU, grappler's layout optimizer and remapper, oneDNN's frozen
weights; resnet_v1_50 training steps and inference (docs/performance.md).

Each switch is process-wide (set before TensorFlow loads, or fixed by the first session),
so each variant is a child process of its own. Every child builds the same workloads once
(same graphs, same seed, so the same weights) and then waits for orders on stdin; the
parent runs rounds in which every child in turn runs a few steps of one workload
(common.take_turns, the order rotating), and each ratio is the median of the per-round
ratios against the `default` variant: these machines' speed drifts by tens of percent
within minutes, so variants measured one after the other could not be compared.

Workloads: a bare training step (model_fn's train op in a Session over one in-memory
batch, bench_train.py's BareLoop) at each --train_sizes, and inference of the export's
forward (normalize -> resnet_v1_50 -> softmax, as predict_images) at --infer_size.
Each child's inference logits on one fixed batch are compared with the default
variant's (same weights, same images): max |difference| / max |logit|. The weights are
random, so the probabilities are saturated and say nothing here; the trained export's
probabilities with oneDNN on and off are compared by tests/test_cpu.py.

    make bench-runtime      (python benchmarks/bench_runtime_switches.py --help)
"""
import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

import numpy as np

import common  # pylint: disable=wrong-import-order

MARK = "@@runtime-switches "  # the child's answers on stdout; other lines are its logs
DEFAULT = "default"


@dataclasses.dataclass(frozen=True)
class Variant:
    """One process-wide setting: environment before TensorFlow loads, ConfigProto fields."""
    meaning: str
    env: dict = dataclasses.field(default_factory=dict)
    intra_op_threads: int = 0  # ConfigProto intra_op_parallelism_threads (0: TF's choice)
    inter_op_threads: int = 0
    xla: bool = False  # compute.enable_xla_cpu_jit: global_jit_level ON_1, remapper off
    rewrites_off: tuple = ()  # grappler RewriterConfig fields set to OFF
    only: tuple = ()  # workload kinds it is valid for ("train", "infer"); () = all


VARIANTS = {
    DEFAULT: Variant("as slimserve runs TensorFlow: oneDNN on (TF_ENABLE_ONEDNN_OPTS=1 "
                     "unless the user set it), threads = cores, grappler's defaults"),
    "onednn-off": Variant("TF_ENABLE_ONEDNN_OPTS=0: TensorFlow's Eigen kernels (TF 2.15's "
                          "default on CPUs without AVX512_VNNI/BF16/AMX)",
                          env={"TF_ENABLE_ONEDNN_OPTS": "0"}),
    "intra-1": Variant("intra_op_parallelism_threads=1 (TF_NUM_INTRAOP_THREADS): one core "
                       "per op instead of all", intra_op_threads=1),
    "inter-1": Variant("inter_op_parallelism_threads=1 (TF_NUM_INTEROP_THREADS): "
                       "independent ops one at a time", inter_op_threads=1),
    "xla": Variant("XLA on CPU: global_jit_level ON_1 (compute.enable_xla_cpu_jit, as "
                   "--xla / --xla_cpu_compilation_enabled; it also turns the remapper off)",
                   xla=True),
    "remapper-off": Variant("grappler's remapper off: no fused oneDNN conv+bias+relu "
                            "(what the xla row loses besides compiling)",
                            rewrites_off=("remapping",)),
    "layout-off": Variant("grappler's layout_optimizer off (it converts NCHW/NHWC around "
                          "ops; the network is NHWC already)",
                          rewrites_off=("layout_optimizer",)),
    "frozen-weights": Variant("TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1: oneDNN reorders each "
                              "filter to its blocked layout once and caches it (inference "
                              "only: a training step's filters change)",
                              env={"TF_ONEDNN_ASSUME_FROZEN_WEIGHTS": "1"}, only=("infer",)),
    "system-allocator": Variant("TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1: oneDNN's scratch memory "
                                "from malloc instead of TensorFlow's BFC allocator",
                                env={"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1"}),
}
DEFAULT_VARIANTS = ("default,onednn-off,intra-1,inter-1,xla,remapper-off,layout-off,"
                    "frozen-weights")


# ---------------------------------------------------------------- the child (one variant)

def _answer(payload):
    print(MARK + json.dumps(payload), flush=True)


def child(spec):
    """Builds the workloads with `spec` (the parent's JSON) and serves orders from stdin:
    "RUN <workload> <steps>" -> {"seconds": s}; "QUIT" (or end of input) -> exit."""
    from slimserve.cli import logs  # pylint: disable=import-outside-toplevel
    logs.quiet_tensorflow()
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import bench_train  # pylint: disable=import-outside-toplevel
    from slimserve import compute  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import model  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import nets  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import preprocessing  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import run_config  # pylint: disable=import-outside-toplevel

    variant = VARIANTS[spec["variant"]]

    def session_config():
        config = run_config.session_config(xla=variant.xla,
                                           intra_op_threads=variant.intra_op_threads,
                                           inter_op_threads=variant.inter_op_threads)
        rewrite = config.graph_options.rewrite_options
        for field in variant.rewrites_off:
            setattr(rewrite, field, rewrite.OFF)
        return config

    class Inference:
        """The export's forward on float images (predict_images without the decode)."""

        def __init__(self, size, batch):
            config = model.ModelConfig(model_name="resnet_v1_50", num_classes=10)
            style = nets.preprocessing_spec("resnet_v1_50", size).style
            rng = np.random.RandomState(0)
            self.images = rng.uniform(0, 255, (batch, size, size, 3)).astype(np.float32)
            self.graph = tf.Graph()
            with self.graph.as_default():
                tf.compat.v1.set_random_seed(0)
                self.feed = tf.compat.v1.placeholder(tf.float32, [None, size, size, 3])
                _, logits, _ = model.build_logits(
                    config, preprocessing.normalize(self.feed, style), is_training=False)
                self.logits = logits
                self.probabilities = model.predictions_from_logits(logits, [])[
                    "probabilities"]
                self.session = tf.compat.v1.Session(config=session_config())
                self.session.run(tf.compat.v1.global_variables_initializer())

        def logits_of_batch(self):
            return self.session.run(self.logits, {self.feed: self.images})

        def run(self, steps):
            started = time.perf_counter()
            for _ in range(steps):
                self.session.run(self.probabilities, {self.feed: self.images})
            return time.perf_counter() - started

    loops, ready = {}, {"onednn": compute.onednn_enabled()}
    for name, (kind, size, batch) in spec["workloads"].items():
        if variant.only and kind not in variant.only:
            continue
        if kind == "train":
            loops[name] = bench_train.BareLoop(size, batch, "fp32", session_config())
        else:
            loops[name] = Inference(size, batch)
            ready["logits"] = loops[name].logits_of_batch().tolist()
    ready["workloads"] = sorted(loops)
    _answer(ready)
    for line in sys.stdin:
        order = line.split()
        if not order or order[0] == "QUIT":
            break
        _answer({"seconds": loops[order[1]].run(int(order[2]))})


# ---------------------------------------------------------------- the parent

class Child:
    """One variant's process; its workloads as loops with run(steps) -> seconds."""

    def __init__(self, name, spec, log_dir):
        env = dict(os.environ)
        env.update(VARIANTS[name].env)  # over slimserve's own TF_ENABLE_ONEDNN_OPTS=1
        self.name = name  # one log per run and variant: runs may overlap
        self.log_path = os.path.join(log_dir, "%s.%d.log" % (name, os.getpid()))
        self.log = open(self.log_path, "w")  # pylint: disable=consider-using-with
        self.process = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, os.path.abspath(__file__), "--child",
             json.dumps(dict(spec, variant=name))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env=env, cwd=common.ROOT)
        self.ready = None

    def receive(self):
        for line in self.process.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        self.process.wait()
        with open(self.log_path) as handle:
            tail = handle.read()[-3000:]
        raise SystemExit("variant %s: its process exited with %s before answering; the "
                         "end of its log (%s):\n%s" % (self.name, self.process.returncode,
                                                       self.log_path, tail))

    def loop(self, workload):
        child_process = self

        class Loop:  # pylint: disable=too-few-public-methods
            def run(self, steps):
                child_process.process.stdin.write("RUN %s %d\n" % (workload, steps))
                child_process.process.stdin.flush()
                return child_process.receive()["seconds"]
        return Loop()

    def close(self):
        if self.process.poll() is None:
            try:
                self.process.stdin.write("QUIT\n")
                self.process.stdin.close()
                self.process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self.log.close()


def _ints(parser, flag, text):
    if not text.strip():
        return []
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        parser.error("--%s: expected comma-separated integers, got %r" % (flag, text))
    if any(v < 1 for v in values):
        parser.error("--%s: every value must be >= 1, got %r" % (flag, text))
    return values


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", maxsplit=1)[0],
        epilog="variants: " + "; ".join("%s: %s" % item for item in
                                        ((n, v.meaning) for n, v in VARIANTS.items())))
    parser.add_argument("--variants", default=DEFAULT_VARIANTS,
                        help="Comma-separated variants, each a process of its own (see "
                             "below); `default` is always measured, as the reference.")
    parser.add_argument("--train_sizes", default="32",
                        help="Image sides of the bare training steps, e.g. 32,224 (224 "
                             "costs ~10 s per step per variant here; empty: none).")
    parser.add_argument("--train_batches", default="32",
                        help="Batch size per --train_sizes value (e.g. 32,16).")
    parser.add_argument("--train_steps", default="2",
                        help="Training steps per variant per round, per --train_sizes "
                             "value (e.g. 2,1).")
    parser.add_argument("--infer_size", type=int, default=224,
                        help="Image side of the inference workload (0: none).")
    parser.add_argument("--infer_batch", type=int, default=8,
                        help="Batch of the inference workload: TF's best of 1/8/32 on the "
                             "2-core CPUs measured (docs/performance.md).")
    parser.add_argument("--infer_steps", type=int, default=2,
                        help="Inference batches per variant per round.")
    common.add_turn_flags(parser, 5, 1, "variant",
                          "Untimed warm-up steps per variant and workload before the "
                          "rounds (XLA compiles on the first).")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return args, None
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error("--variants: unknown %s; known: %s" % (", ".join(unknown),
                                                             ", ".join(VARIANTS)))
    args.variant_names = [DEFAULT] + [n for n in dict.fromkeys(names) if n != DEFAULT]
    sizes = _ints(parser, "train_sizes", args.train_sizes)
    batches = _ints(parser, "train_batches", args.train_batches)
    steps = _ints(parser, "train_steps", args.train_steps)
    if not len(sizes) == len(batches) == len(steps):
        parser.error("--train_batches and --train_steps need one value per --train_sizes "
                     "value (%d)" % len(sizes))
    for flag in ("infer_batch", "infer_steps", "rounds", "skip"):
        if getattr(args, flag) < 1:
            parser.error("--%s must be >= 1" % flag)
    if args.infer_size < 0:
        parser.error("--infer_size must be >= 0")
    if not sizes and not args.infer_size:
        parser.error("nothing to measure: --train_sizes is empty and --infer_size is 0")
    workloads = {"train%d" % s: ("train", s, b, n) for s, b, n in zip(sizes, batches, steps)}
    if args.infer_size:
        workloads["infer%d" % args.infer_size] = ("infer", args.infer_size, args.infer_batch,
                                                  args.infer_steps)
    return args, workloads


def _verdict(ratios):
    """What the per-round ratios say: a change only when the middle half of the rounds
    agrees on its side of 1."""
    low, median, high = np.percentile(ratios, [25, 50, 75])
    if low > 1.0:
        return "%.2fx faster" % median
    if high < 1.0:
        return "%.2fx slower" % (1.0 / median)
    return "no clear change"


def main(argv=None):
    args, workloads = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return
    log_dir = common.work_dir("runtime_switches")
    spec = {"workloads": {name: list(w[:3]) for name, w in workloads.items()}}
    print("starting %d variants (%s), each a process; logs in %s" % (
        len(args.variant_names), ", ".join(args.variant_names), log_dir), flush=True)
    started = time.perf_counter()
    children = {}
    try:
        for name in args.variant_names:
            children[name] = Child(name, spec, log_dir)
        for item in children.values():
            item.ready = item.receive()
        print("built in %.0f s; %d rounds" % (time.perf_counter() - started, args.rounds),
              flush=True)
        seconds = {}
        for workload, (kind, size, batch, steps) in workloads.items():
            loops = {name: item.loop(workload) for name, item in children.items()
                     if workload in item.ready["workloads"]}
            print("%s: %s px, batch %d, %d steps per turn, %d variants" % (
                workload, size, batch, steps, len(loops)), flush=True)
            seconds[workload] = common.take_turns(loops, steps, args.rounds, args.skip)
    finally:
        for item in children.values():
            item.close()
    reference = np.array(children[DEFAULT].ready.get("logits", []))
    rows = []
    for workload, (kind, size, batch, steps) in workloads.items():
        base = seconds[workload][DEFAULT]
        for name in args.variant_names:
            if name not in seconds[workload]:
                continue
            times = seconds[workload][name]
            ratios = base / times
            parity = ""
            if kind == "infer" and reference.size:
                parity = "%.1e" % (np.max(np.abs(
                    np.array(children[name].ready["logits"]) - reference)) /
                    np.max(np.abs(reference)))
            rows.append([workload, batch, name, "yes" if children[name].ready["onednn"]
                         else "no", "%.2f" % (steps * batch / np.median(times)),
                         "%.2f" % np.median(ratios),
                         "%.2f-%.2f" % tuple(np.percentile(ratios, [25, 75])),
                         "" if name == DEFAULT else _verdict(ratios), parity])
    common.table("TensorFlow runtime switches, resnet_v1_50 (%d cores; %d interleaved "
                 "rounds; ratio = median of per-round img/s ratios to `default`)" % (
                     os.cpu_count(), args.rounds),
                 ["workload", "batch", "variant", "oneDNN", "img/s", "vs default",
                  "middle half of rounds", "what it gives", "logits vs default"], rows)
    print("\nvariants:")
    for name in args.variant_names:
        print("  %-16s %s" % (name, VARIANTS[name].meaning))
    if "onednn-off" in args.variant_names:
        for workload in workloads:
            off = seconds[workload].get("onednn-off")
            if off is not None:
                print("oneDNN on vs off, %s: %.2fx (median of per-round ratios)" % (
                    workload, np.median(off / seconds[workload][DEFAULT])))
    print("logits vs default: max |difference| / max |logit| on one batch (random weights); "
          "whole run %.0f s" % (time.perf_counter() - started))


if __name__ == "__main__":
    main()
