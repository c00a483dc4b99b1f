"""OpenVINO against TensorFlow on this CPU, side by side in one run (issue 49, part 5).

    make bench-openvino        (python benchmarks/bench_openvino.py --help)

For each image size (224: resnet_v1_50 with random weights, exported like a trained one;
32: the digits export, trained here for a few steps on scikit-learn's bundled digits, no
download):

- in process, the server's own servables (serving/core): TensorFlow fp32 and OpenVINO
  fp32 / bf16 (skipped with a line on a CPU without AVX512_BF16 or AMX) / int8 (NNCF,
  calibrated on real images), each at batch 1, 8 and 32 on `serving_default` (encoded
  JPEGs in, what a client sends) and on `predict_images` (decoded pixels: the network
  alone); the best batch is each one's in-process limit;
- served: a slimserve-server child (the one launcher, under the suite's memory cap) with
  --prefer_openvino_model at the fastest OpenVINO precision and the server's adaptive
  batching, driven by the project's load generator at 1, 8 and 32 closed-loop clients, in
  --served_rounds rounds each beside a fresh in-process measurement of that precision;
- the ratios (OpenVINO / TensorFlow, served / in-process on the same signature) and the
  top-1 agreement of every OpenVINO precision with TensorFlow fp32 on the digits
  validation split (and its accuracy on their labels).

Rates are images per second; each cell runs for --seconds after one warm-up call, so a
shared machine's drift hits every row alike within minutes, not across runs.
"""
import argparse
import json
import logging
import os
import shutil
import subprocess
import sys

import common  # pylint: disable=wrong-import-order

from slimserve.cli import logs  # pylint: disable=wrong-import-order

logs.quiet_tensorflow()
logging.getLogger("nncf").setLevel(logging.WARNING)
import numpy as np  # noqa: E402  pylint: disable=wrong-import-position

import make_digits  # noqa: E402  pylint: disable=wrong-import-position,wrong-import-order
import serve_harness  # noqa: E402  pylint: disable=wrong-import-position,wrong-import-order
from slimserve import cpu  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import dataset  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import preprocessing  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import run_files  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import schema  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import splits  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.export import openvino as ov_export  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.export import signatures  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.export import writer  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.serving.core import openvino_model  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.serving.core import openvino_servable  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.serving.core import servable as servable_lib  # noqa: E402  pylint: disable=wrong-import-position

TF = "tensorflow fp32"
BATCHING = ("max_batch_size { value: 32 }\nbatch_timeout_micros { value: %d }\n"
            "num_batch_threads { value: 1 }\nmax_enqueued_batches { value: 1000 }\n")


def digits_export(work, steps):
    """(version dir, preprocessing Spec, data dir) of a short digits run at 32x32,
    built once under `work` (training goes through slimserve-train, as a user's would)."""
    images, data = os.path.join(work, "images"), os.path.join(work, "data")
    model_dir = os.path.join(work, "run")
    if not os.path.exists(os.path.join(data, "labels.txt")):
        shutil.rmtree(images, ignore_errors=True)
        make_digits.write_digits(images, size=32)
        dataset.build_dataset(images, data, validation_fraction=0.2, train_shards=2,
                              validation_shards=1, seed=0, show_progress=False)
    base = os.path.join(model_dir, "export", "final")
    if not (os.path.isdir(base) and writer.list_versions(base)):
        shutil.rmtree(model_dir, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "slimserve.cli.train", "--data_dir", data,
                        "--model_dir", model_dir, "--image_size", "32", "--max_steps",
                        str(steps), "--batch_size", "32", "--save_checkpoints_steps",
                        str(steps), "--batch_norm_decay", "0.9", "--optimizer", "adam",
                        "--learning_rate", "0.001", "--opt_epsilon", "1e-8",
                        "--min_crop_area", "0.85", "--norandom_flip",
                        "--eval_central_fraction", "1.0", "--log_step_count_steps", "50",
                        "--moving_average_decay", "0.99"], check=True, cwd=common.ROOT)
    version = os.path.join(base, str(writer.list_versions(base)[-1]))
    spec = preprocessing.Spec.from_dict(run_files.read(model_dir)["serving"])
    return version, spec, data


def random_export(work, size):
    """(version dir, Spec) of resnet_v1_50 at `size` with random weights."""
    from slimserve.estimator import nets  # pylint: disable=import-outside-toplevel
    return serve_harness.make_export(os.path.join(work, "export"), size), \
        nets.preprocessing_spec("resnet_v1_50", size)


def prepare_ir(version, calibration, guard, labels):
    """openvino/model.xml and, guard bars off (the figures are reported instead),
    model_int8.xml in `version`; -> the int8 report."""
    if not openvino_model.has_model(version):
        ov_export.write_openvino(version)
    if not openvino_model.has_model(version, openvino_model.INT8_MODEL_FILE):
        return ov_export.quantize_int8(version, calibration, guard, labels,
                                       min_agreement=0.0, max_accuracy_drop=1.0)[1]
    with open(os.path.join(version, signatures.EXTRA_DIR, ov_export.INT8_FILE)) as handle:
        return json.load(handle)  # what the run that quantized it measured


def servable_of(version, runtime):
    if runtime == TF:
        return servable_lib.Servable("bench", 1, version)
    precision = runtime.split()[1]
    servable = openvino_servable.OpenVinoServable(
        "bench", 1, version, options=openvino_servable.OpenVinoOptions(precision))
    if servable.runtime != openvino_servable.OPENVINO or servable.precision != precision:
        servable.retire()
        raise RuntimeError("%s does not run here (see the warning above)" % runtime)
    return servable


def in_process(servable, feeds_of, batch, seconds):
    """Images per second of `servable` on batches of `batch` (signature, key, values)."""
    name, key, values = feeds_of
    signature_def = servable.signatures[name]
    count = len(values)
    state = [0]

    def call():
        start = state[0]
        rows = [values[(start + i) % count] for i in range(batch)]
        state[0] = (start + batch) % count
        feed = np.array(rows, dtype=object) if key == signatures.IMAGE_BYTES else np.stack(rows)
        servable.run(signature_def, {key: feed}, [signatures.CLASSES])
        return batch

    return common.timed(call, min_seconds=seconds)


def classes_of(servable, pixels):
    signature_def = servable.signatures[signatures.PREDICT_IMAGES]
    return np.concatenate([servable.run(signature_def, {signatures.IMAGES: pixels[i:i + 32]},
                                        [signatures.CLASSES])[signatures.CLASSES]
                           for i in range(0, len(pixels), 32)])


def served(version, precision, jpegs, clients, seconds, timeout_micros):
    """{clients: closed-loop result} of a slimserve-server child serving `version` on
    OpenVINO at `precision` with batching: the server's own adaptive batching (what
    --enable_batching does without a parameters file) when `timeout_micros` is None, else
    max batch 32 with that timeout and one batch thread."""
    batching = ["--enable_batching"]
    if timeout_micros is not None:
        batch_file = os.path.join(common.work_dir("openvino_served"), "batching.config")
        with open(batch_file, "w") as handle:
            handle.write(BATCHING % timeout_micros)
        batching.append("--batching_parameters_file=%s" % batch_file)
    server = serve_harness.start_server(
        os.path.dirname(version), extra_args=batching + [
            "--prefer_openvino_model", "--openvino_precision=%s" % precision])
    try:
        requests = serve_harness.predict_requests(jpegs)
        # the first requests compile OpenVINO's kernels for their shapes: not measured
        serve_harness.closed_loop(server.address, requests, max(clients), seconds)
        return {n: serve_harness.closed_loop(server.address, requests, n, seconds)
                for n in clients}
    finally:
        server.stop()


def served_rounds(version, chosen, best_batch, jpegs, args):
    """[(in-process rate, {clients: served result})] for --served_rounds rounds: each
    round measures the chosen precision in process (serving_default at its best batch,
    as long as each served client count) and then served, so every ratio is of two
    figures minutes apart, and the limit is one measurement, not the best of several
    noisy ones (a maximum of noisy rates is biased up)."""
    workload = (signatures.DEFAULT, signatures.IMAGE_BYTES, jpegs)
    timeout = None if args.batching == "adaptive" else args.batch_timeout_micros
    out = []
    for index in range(args.served_rounds):
        servable = servable_of(version, chosen)
        try:
            limit = in_process(servable, workload, best_batch,
                               args.served_seconds or args.seconds)
        finally:
            servable.retire()
        results = served(version, chosen.split()[1], jpegs, args.clients,
                         args.served_seconds or args.seconds, timeout)
        print("  round %d: in process %.1f img/s; served %s" % (
            index + 1, limit, ", ".join("%d clients %.1f (%.2f)" % (
                n, r["images_per_s"], r["images_per_s"] / limit)
                for n, r in sorted(results.items()))), flush=True)
        out.append((limit, results))
    return out


def bench_size(label, version, spec, jpegs, validation, calibration, args):
    """Prints the tables of one export; -> its summary lines."""
    print("\n== %s: %s" % (label, version), flush=True)
    val_jpegs, val_labels = validation
    if spec.image_size > 32:  # at 224 each image costs TensorFlow a fifth of a second
        step = max(1, len(val_jpegs) // args.agreement_images)  # the split is class by class
        val_jpegs, val_labels = val_jpegs[::step], val_labels[::step]
    val_pixels = ov_export.pixels_of(val_jpegs, spec)
    pixels = list(ov_export.pixels_of(jpegs, spec))
    int8 = prepare_ir(version, ov_export.pixels_of(calibration, spec), val_pixels, val_labels)
    runtimes = [TF, "openvino fp32", "openvino bf16", "openvino int8"]
    if not cpu.cpu_supports_bf16():
        print("openvino bf16: skipped, this CPU has no AVX512_BF16 or AMX (%s)"
              % cpu.describe())
        runtimes.remove("openvino bf16")
    workloads = ((signatures.DEFAULT, signatures.IMAGE_BYTES, jpegs),
                 (signatures.PREDICT_IMAGES, signatures.IMAGES, pixels))
    rates, classes = {}, {}
    for runtime in runtimes:
        servable = servable_of(version, runtime)
        try:
            classes[runtime] = classes_of(servable, val_pixels)
            for workload in workloads:
                for batch in args.batches:
                    rates[runtime, workload[0], batch] = in_process(
                        servable, workload, batch, args.seconds)
                    print("  %s %s batch %d: %.1f img/s" % (
                        runtime, workload[0], batch, rates[runtime, workload[0], batch]),
                        flush=True)
        finally:
            servable.retire()
    best = {(r, w[0]): max(rates[r, w[0], b] for b in args.batches)
            for r in runtimes for w in workloads}
    rows = []
    for runtime in runtimes:
        agree = float(np.mean(classes[runtime] == classes[TF]))
        accuracy = float(np.mean(classes[runtime] == np.asarray(val_labels)))
        rows.append([runtime] + ["%.1f" % rates[runtime, signatures.DEFAULT, b]
                                 for b in args.batches] +
                    ["%.1f" % best[runtime, signatures.DEFAULT],
                     "%.2fx" % (best[runtime, signatures.DEFAULT] / best[TF, signatures.DEFAULT]),
                     "%.1f" % best[runtime, signatures.PREDICT_IMAGES],
                     "%.2fx" % (best[runtime, signatures.PREDICT_IMAGES] /
                                best[TF, signatures.PREDICT_IMAGES]),
                     "%.2f%%" % (100 * agree), "%.1f%%" % (100 * accuracy)])
    common.table("%s, in process (img/s; serving_default = JPEG bytes in, predict_images = "
                 "pixels in; agreement and accuracy on %d digits validation images)"
                 % (label, len(val_labels)),
                 ["runtime"] + ["b%d" % b for b in args.batches] +
                 ["best", "vs TF", "network best", "vs TF", "top-1 = TF fp32", "accuracy"],
                 rows)
    if int8:
        refused = int8.get("int8_agreement", 0) < ov_export.DEFAULT_INT8_MIN_AGREEMENT or (
            int8.get("fp32_accuracy", 0) - int8.get("int8_accuracy", 0) >
            ov_export.DEFAULT_INT8_MAX_ACCURACY_DROP)
        print("int8 (NNCF, %d calibration images): agreement with OpenVINO fp32 %.4f, "
              "accuracy %.4f (fp32 %.4f): %s the export's guard (agreement >= %g, accuracy "
              "drop <= %g); measured here either way" % (
                  int8["int8_calibration_images"], int8["int8_agreement"],
                  int8.get("int8_accuracy", float("nan")),
                  int8.get("fp32_accuracy", float("nan")),
                  "fails" if refused else "passes", ov_export.DEFAULT_INT8_MIN_AGREEMENT,
                  ov_export.DEFAULT_INT8_MAX_ACCURACY_DROP))
    # Served: the fastest OpenVINO precision that passes the export's int8 guard against
    # TensorFlow fp32 (agreement and accuracy), as slimserve-tune would choose; fp32 always.
    tf_accuracy = float(np.mean(classes[TF] == np.asarray(val_labels)))
    ov = [r for r in runtimes if r == "openvino fp32" or r != TF and (
        np.mean(classes[r] == classes[TF]) >= ov_export.DEFAULT_INT8_MIN_AGREEMENT and
        tf_accuracy - np.mean(classes[r] == np.asarray(val_labels)) <=
        ov_export.DEFAULT_INT8_MAX_ACCURACY_DROP)]
    if args.served_precision:
        ov = ["openvino " + args.served_precision]
    chosen = max(ov, key=lambda r: best[r, signatures.DEFAULT])
    print("served: %s (the fastest OpenVINO precision within agreement >= %g and accuracy "
          "drop <= %g of TensorFlow fp32%s)" % (
              chosen, ov_export.DEFAULT_INT8_MIN_AGREEMENT,
              ov_export.DEFAULT_INT8_MAX_ACCURACY_DROP,
              "; --served_precision" if args.served_precision else ""), flush=True)
    precision = chosen.split()[1]
    best_batch = max(args.batches, key=lambda b: rates[chosen, signatures.DEFAULT, b])
    rounds = served_rounds(version, chosen, best_batch, jpegs, args)
    ratios = {n: float(np.median([r[n]["images_per_s"] / limit for limit, r in rounds]))
              for n in args.clients}
    batching = "adaptive batching" if args.batching == "adaptive" else \
        "batching max 32, timeout %d us" % args.batch_timeout_micros
    common.table("%s, served on OpenVINO %s (slimserve-server --prefer_openvino_model "
                 "--openvino_precision=%s, %s; serving_default over gRPC); %d rounds, each "
                 "beside its own in-process rate at the best batch (%d)" % (
                     label, precision, precision, batching, len(rounds), best_batch),
                 ["clients", "img/s (median)", "p50 ms", "p99 ms", "errors",
                  "served / in-process (median of rounds)", "per round",
                  "served / TF in-process"],
                 [[n, "%.1f" % np.median([r[n]["images_per_s"] for _, r in rounds]),
                   "%.1f" % np.median([r[n]["p50_ms"] for _, r in rounds]),
                   "%.1f" % np.median([r[n]["p99_ms"] for _, r in rounds]),
                   sum(r[n]["errors"] for _, r in rounds), "%.2f" % ratios[n],
                   " ".join("%.2f" % (r[n]["images_per_s"] / limit) for limit, r in rounds),
                   "%.2fx" % (np.median([r[n]["images_per_s"] for _, r in rounds]) /
                              best[TF, signatures.DEFAULT])]
                  for n in args.clients])
    limit = best[chosen, signatures.DEFAULT]
    return ["%s: OpenVINO %s in process %.2fx TF fp32 (network alone %.2fx); served at "
            "%s clients %s of in-process (median of %d rounds)" % (
                label, precision, limit / best[TF, signatures.DEFAULT],
                best[chosen, signatures.PREDICT_IMAGES] / best[TF, signatures.PREDICT_IMAGES],
                "/".join(str(n) for n in args.clients),
                "/".join("%.2f" % ratios[n] for n in args.clients), len(rounds))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="224,32",
                        help="Image sizes: 224 (random resnet_v1_50), 32 (digits export).")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="Seconds per in-process cell and per served client count.")
    parser.add_argument("--served_seconds", type=float, default=0.0,
                        help="Seconds per served client count (0: --seconds); at 224 on a "
                        "slow CPU a batch of 32 takes seconds, give it several.")
    parser.add_argument("--batches", default="1,8,32", help="In-process batch sizes.")
    parser.add_argument("--clients", default="1,8,32", help="Served closed-loop clients.")
    parser.add_argument("--train_steps", type=int, default=300,
                        help="Training steps of the digits export (built once, kept in "
                        "bench_out/openvino/digits).")
    parser.add_argument("--calibration_images", type=int, default=32,
                        help="Training images int8 is calibrated on.")
    parser.add_argument("--agreement_images", type=int, default=64,
                        help="Validation images the agreement is measured on above 32x32 "
                        "(at 32x32: the whole split).")
    parser.add_argument("--served_precision", default="", choices=("", "fp32", "bf16", "int8"),
                        help="Serve this OpenVINO precision (default: the fastest that "
                        "agrees with TensorFlow fp32 as the export's int8 guard asks).")
    parser.add_argument("--served_rounds", type=int, default=3,
                        help="Rounds of (in-process limit, served at --clients); the "
                        "served / in-process ratio is the median of the rounds'.")
    parser.add_argument("--batching", default="adaptive", choices=("adaptive", "fixed"),
                        help="The server's batching: adaptive (--enable_batching without "
                        "a parameters file: what needs no tuning) or fixed (max batch 32, "
                        "--batch_timeout_micros, one batch thread).")
    parser.add_argument("--batch_timeout_micros", type=int, default=2000,
                        help="With --batching=fixed: the served model's "
                        "batch_timeout_micros.")
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.clients = [int(c) for c in args.clients.split(",") if c]
    work = common.work_dir("openvino")
    version, spec, data = digits_export(os.path.join(work, "digits"), args.train_steps)
    validation = splits.read_images(data, schema.VALIDATION)
    train, _ = splits.read_images(data, schema.TRAIN, limit=args.calibration_images)
    jpegs = validation[0][::max(1, len(validation[0]) // 64)]  # every class
    summary = []
    for size in [int(s) for s in args.sizes.split(",") if s]:
        if size == 32:
            summary += bench_size("32x32 digits export", version, spec, jpegs, validation,
                                  train, args)
        else:
            export, random_spec = random_export(os.path.join(work, "random%d" % size), size)
            summary += bench_size("%dx%d resnet_v1_50, random weights" % (size, size), export,
                                  random_spec, jpegs, validation, train, args)
    print("\n" + "\n".join(summary))


if __name__ == "__main__":
    main()
