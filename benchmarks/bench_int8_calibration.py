"""NNCF's fast against full bias correction for the export's int8 IR, by calibration
images: top-1 agreement with OpenVINO fp32 and accuracy on the digits validation split
(images neither training nor calibration saw), and int8's rate at batch 32.

    python benchmarks/bench_int8_calibration.py        (--help for the flags)

Why export/openvino.py quantizes with full bias correction: the guard keeps an int8 IR
only at >= 99.5% agreement, and on 359 validation images one image is 0.28%.
The digits export is bench_openvino.py's (built once under bench_out/openvino/digits).
"""
import argparse
import contextlib
import logging
import os
import sys
import time

import common  # pylint: disable=wrong-import-order

from slimserve.cli import logs  # pylint: disable=wrong-import-order

logs.quiet_tensorflow()
logging.getLogger("nncf").setLevel(logging.WARNING)
import numpy as np  # noqa: E402  pylint: disable=wrong-import-position

import bench_openvino  # noqa: E402  pylint: disable=wrong-import-position,wrong-import-order
from slimserve import cpu  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import schema  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import splits  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.export import openvino as ov_export  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.serving.core import openvino_model  # noqa: E402  pylint: disable=wrong-import-position


def classes_and_rate(version, model, pixels, seconds):
    """(top-1 classes of `pixels`, images per second at batch 32) of an OpenVINO model of
    `version` (the export's own guard computes the classes)."""
    compiled = openvino_model.compile_model(model)
    request = compiled.create_infer_request()
    batch = np.ascontiguousarray(pixels[:32])

    def run():
        openvino_model.run_compiled(request, batch)
        return len(batch)

    return ov_export.ir_classes(version, compiled, pixels), common.timed(
        run, min_seconds=seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibration_images", default="32,64,300",
                        help="Training images NNCF calibrates on, one quantization each.")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="Seconds of int8 inference per rate.")
    parser.add_argument("--train_steps", type=int, default=300,
                        help="Training steps of the digits export, if it is built here.")
    args = parser.parse_args()
    import nncf  # pylint: disable=import-outside-toplevel,import-error
    print(cpu.describe(), flush=True)
    work = common.work_dir("openvino")
    version, spec, data = bench_openvino.digits_export(os.path.join(work, "digits"),
                                                       args.train_steps)
    if not openvino_model.has_model(version):
        ov_export.write_openvino(version)
    counts = [int(c) for c in args.calibration_images.split(",") if c]
    validation, labels = splits.read_images(data, schema.VALIDATION)
    train, _ = splits.read_images(data, schema.TRAIN, limit=max(counts))
    val_pixels, train_pixels = (ov_export.pixels_of(validation, spec),
                                ov_export.pixels_of(train, spec))
    labels = np.asarray(labels)
    model = openvino_model.read(version)
    fp32, fp32_rate = classes_and_rate(version, model, val_pixels, args.seconds)
    rows = [["fp32", "", "100.00%", "%.1f%%" % (100 * np.mean(fp32 == labels)), "",
             "%.0f" % fp32_rate]]
    for count in counts:
        dataset = nncf.Dataset([train_pixels[i:i + 1] for i in range(count)])
        for fast in (True, False):
            started = time.monotonic()
            with contextlib.redirect_stdout(sys.stderr):  # NNCF's progress bars
                quantized = nncf.quantize(model, dataset, subset_size=count,
                                          fast_bias_correction=fast)
            seconds = time.monotonic() - started
            found, rate = classes_and_rate(version, quantized, val_pixels, args.seconds)
            rows.append(["int8, %s bias correction" % ("fast" if fast else "full"), count,
                         "%.2f%% (%d differ)" % (100 * np.mean(found == fp32),
                                                 np.sum(found != fp32)),
                         "%.1f%%" % (100 * np.mean(found == labels)), "%.0f" % seconds,
                         "%.0f" % rate])
            print("  %s" % " | ".join(str(cell) for cell in rows[-1]), flush=True)
    common.table("int8 calibration on the digits export (%d validation images)" % len(labels),
                 ["IR", "calibration images", "top-1 = fp32", "accuracy",
                  "quantize s", "img/s at b32"], rows)


if __name__ == "__main__":
    main()
