"""The whole chain in one command (`make demo`): digits images -> TFRecords -> source
checkpoint -> fine-tuned resnet_v1_50 -> SavedModel -> embedded server -> every
validation image through the gRPC client -> report (JSON + PNG).

Each stage runs the documented CLI in its own process, so any stage can be re-run
alone with the command this script prints.
"""
import argparse
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stage(name, argv, timings):
    print("\n== %s\n$ %s" % (name, " ".join(shlex.quote(a) for a in argv)), flush=True)
    started = time.time()
    subprocess.run(argv, check=True, cwd=ROOT)
    timings[name] = round(time.time() - started, 1)


def python(module, *args):
    return [sys.executable, "-m", module] + [str(a) for a in args]


def served_predictions(export_base, data_dir, server_args):
    """Starts the embedded server in-process and sends every validation image."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import schema
    from slimserve.estimator import splits  # pylint: disable=import-outside-toplevel
    from slimserve.serving.clients import client as client_lib  # pylint: disable=import-outside-toplevel

    from slimserve.serving import server
    images, labels = splits.read_images(data_dir, schema.VALIDATION)
    instance = server.ModelServer(model_name="resnet", model_base_path=export_base, **server_args)
    instance.start()
    try:
        client = client_lib.Client("127.0.0.1:%d" % instance.port)
        client.predict_images(images[:1])
        latencies, predicted = [], []
        for image in images:  # one request per image: the latency a user sees
            started = time.perf_counter()
            out = client.predict_images([image])
            latencies.append((time.perf_counter() - started) * 1000.0)
            predicted.append(int(out["classes"][0]))
        client.close()
    finally:
        instance.stop()
    return np.array(labels), np.array(predicted), np.array(latencies), instance.port


def scalars(event_dir, tag):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    points = {}
    for path in sorted(glob.glob(os.path.join(event_dir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    number = value.simple_value if value.HasField("simple_value") else float(
                        tf.make_ndarray(value.tensor))
                    points[event.step] = number
    return sorted(points.items())


def plot_scalars(axis, event_dir, tag, *style, label):
    """Plots the scalar `tag` of event_dir's summaries, if it logged any."""
    points = scalars(event_dir, tag)
    if points:
        axis.plot(*zip(*points), *style, label=label)


def plot(report_png, run_dir, confusion, names):
    """Three panels: training loss (log axis), accuracies (0-1 axis), confusion matrix."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    import matplotlib.ticker  # pylint: disable=import-outside-toplevel
    figure, (loss_axis, accuracy_axis, right) = plt.subplots(
        1, 3, figsize=(17, 5), gridspec_kw={"width_ratios": [1, 1, 1.1]})
    plot_scalars(loss_axis, run_dir, "loss", label="training loss (with weight decay)")
    plot_scalars(loss_axis, os.path.join(run_dir, "eval"), "loss", "o-",
                 label="validation loss (with weight decay)")
    loss_axis.set_yscale("log")
    loss_axis.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    loss_axis.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    loss_axis.set_xlabel("global step")
    loss_axis.set_ylabel("loss (log scale)")
    loss_axis.set_title("loss")
    loss_axis.legend()
    plot_scalars(accuracy_axis, run_dir, "train_accuracy", label="training batch accuracy")
    plot_scalars(accuracy_axis, os.path.join(run_dir, "eval"), "accuracy", "o-",
                 label="validation accuracy")
    accuracy_axis.set_ylim(0, 1.02)
    accuracy_axis.set_xlabel("global step")
    accuracy_axis.set_ylabel("accuracy")
    accuracy_axis.set_title("accuracy")
    accuracy_axis.grid(alpha=0.3)
    accuracy_axis.legend(loc="lower right")
    figure.suptitle("fine-tuning resnet_v1_50 on digits")
    right.imshow(confusion, cmap="Blues")
    right.set_xticks(range(len(names)), names)
    right.set_yticks(range(len(names)), names)
    right.set_xlabel("served prediction")
    right.set_ylabel("true class")
    right.set_title("confusion matrix (served predictions)")
    for i in range(len(names)):
        for j in range(len(names)):
            if confusion[i, j]:
                right.text(j, i, int(confusion[i, j]), ha="center", va="center", fontsize=8,
                           color="white" if confusion[i, j] > confusion.max() / 2 else "black")
    figure.tight_layout()
    figure.savefig(report_png, dpi=100)


def add_flag_file_arguments(parser):
    """--source_flags and --finetune_flags: the training flag files both demos run."""
    parser.add_argument("--source_flags", default=os.path.join(ROOT, "configs",
                                                               "digits_source.flags"))
    parser.add_argument("--finetune_flags", default=os.path.join(ROOT, "configs",
                                                                 "digits_finetune.flags"))


def quiet_logging():
    """The in-process stages log as the train stage does: time and message, no
    "INFO:root:" prefixes and no TensorFlow INFO ("Restoring parameters ...")."""
    from slimserve.cli import logs  # pylint: disable=import-outside-toplevel
    import logging  # pylint: disable=import-outside-toplevel
    logging.basicConfig(format="%(asctime)s %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO)
    logs.quiet_tensorflow()
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tf.get_logger().setLevel(logging.WARNING)


def make_work_dir(work_dir, fresh):
    """The absolute --work_dir, emptied first with --fresh."""
    work = os.path.abspath(work_dir)
    if fresh and os.path.exists(work):
        shutil.rmtree(work)
    os.makedirs(work, exist_ok=True)
    return work


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work_dir", default=os.path.join(ROOT, "demo_out"),
                        help="Where every artefact goes (removed first with --fresh).")
    parser.add_argument("--fresh", action="store_true", help="Delete --work_dir first.")
    add_flag_file_arguments(parser)
    parser.add_argument("--source_classes", default="0,1,2,3,4",
                        help="Digits of the source task the stand-in checkpoint learns.")
    parser.add_argument("--image_size", type=int, default=32, help="Side of digit images.")
    parser.add_argument("--enable_batching", action="store_true",
                        help="Serve with server-side batching.")
    args = parser.parse_args(argv)
    quiet_logging()
    work = make_work_dir(args.work_dir, args.fresh)
    paths = {name: os.path.join(work, name) for name in (
        "images", "source_images", "data", "source_data", "source_run", "run")}
    timings = {}
    started = time.time()
    if not os.path.exists(paths["images"]):
        stage("digits images", [sys.executable, "scripts/make_digits.py", "--output_dir",
                                paths["images"], "--size", str(args.image_size)], timings)
        stage("source images", [sys.executable, "scripts/make_digits.py", "--output_dir",
                                paths["source_images"], "--size", str(args.image_size),
                                "--classes", args.source_classes], timings)
    # A progress bar on a terminal; in a log file its carriage returns make one long line.
    bar = [] if sys.stdout.isatty() else ["--noprogress"]
    stage("convert to TFRecords", python(
        "slimserve.cli.convert", "--input", paths["images"], "--output_dir", paths["data"],
        "--overwrite", *bar), timings)
    stage("convert source task", python(
        "slimserve.cli.convert", "--input", paths["source_images"], "--output_dir",
        paths["source_data"], "--overwrite", "--noprogress"), timings)
    shutil.rmtree(paths["source_run"], ignore_errors=True)
    shutil.rmtree(paths["run"], ignore_errors=True)
    stage("source checkpoint (digits %s)" % args.source_classes, python(
        "slimserve.cli.train", "--flagfile", args.source_flags, "--data_dir", paths["source_data"],
        "--model_dir", paths["source_run"]), timings)
    stage("fine-tune on all digits + export", python(
        "slimserve.cli.train", "--flagfile", args.finetune_flags, "--data_dir", paths["data"],
        "--model_dir", paths["run"], "--checkpoint_path", paths["source_run"]), timings)

    export_base = os.path.join(paths["run"], "export", "final")
    version = sorted(os.listdir(export_base))[-1]
    eval_result = json.load(open(os.path.join(export_base, version, "assets.extra",
                                              "eval_result.json")))
    print("\n== serve %s and send every validation image over gRPC" % export_base)
    serve_started = time.time()
    server_args = {"port": -1, "rest_api_port": 0, "file_system_poll_wait_seconds": 0}
    if args.enable_batching:
        from slimserve.serving.core import batching  # pylint: disable=import-outside-toplevel
        server_args["batching_parameters"] = batching.BatchingParameters()
    labels, predicted, latencies, _ = served_predictions(export_base, paths["data"],
                                                         server_args)
    timings["serve + predict validation"] = round(time.time() - serve_started, 1)

    import numpy as np  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import schema  # pylint: disable=import-outside-toplevel
    names = schema.read_labels(os.path.join(paths["data"], schema.LABELS_FILE))
    confusion = np.zeros((len(names), len(names)), np.int64)
    for truth, guess in zip(labels, predicted):
        confusion[truth, guess] += 1
    served_accuracy = float(np.mean(labels == predicted))
    report = {
        "stage_seconds": timings,
        "total_seconds": round(time.time() - started, 1),
        "validation_images": int(len(labels)),
        "eval_accuracy": round(float(eval_result["accuracy"]), 4),
        "served_accuracy": round(served_accuracy, 4),
        "accuracies_agree": abs(served_accuracy - float(eval_result["accuracy"])) < 1e-3,
        "latency_ms": {"p50": round(float(np.percentile(latencies, 50)), 2),
                       "p99": round(float(np.percentile(latencies, 99)), 2)},
        "tensorboard_logdir": paths["run"],
        "saved_model": os.path.join(export_base, version),
        "report_png": os.path.join(work, "report.png"),
    }
    plot(report["report_png"], paths["run"], confusion, names)
    with open(os.path.join(work, "report.json"), "w") as handle:
        json.dump(report, handle, indent=2)
    print("\n== report (%s)" % os.path.join(work, "report.json"))
    for name, seconds in timings.items():
        print("  %-40s %7.1f s" % (name, seconds))
    print("  validation accuracy: eval %.4f, served %.4f (%d images) -> %s" % (
        report["eval_accuracy"], served_accuracy, len(labels),
        "agree" if report["accuracies_agree"] else "DISAGREE"))
    print("  served latency: p50 %.2f ms, p99 %.2f ms" % (report["latency_ms"]["p50"],
                                                        report["latency_ms"]["p99"]))
    print("  TensorBoard:  tensorboard --logdir %s" % paths["run"])
    print("  SavedModel:   %s" % report["saved_model"])
    print("  curves + confusion matrix: %s" % report["report_png"])
    if not report["accuracies_agree"]:
        sys.exit("demo: served accuracy differs from eval accuracy")


if __name__ == "__main__":
    main()
