"""slimserve-export: export any checkpoint of a slimserve run as a servable SavedModel.

    slimserve-export --model_dir=runs/digits --export_base=models/resnet

Reads the run's `slimserve.json` (net, classes, preprocessing), takes the latest
checkpoint unless --checkpoint_path names one, writes `<export_base>/<version>/`
atomically with warmup requests, and verifies it against estimator.predict.
Like the training exporters it exports only a checkpoint whose evaluation clears
--export_min_metric: it trusts the evaluation the run recorded for that checkpoint's step
(<model_dir>/eval/ events, written by slimserve-train) rather than evaluating again.
With --tflite the version also carries model.tflite (export/tflite.py), and the parity
of the two models is printed after the version's path; so does --openvino with
openvino/model.xml (export/openvino.py), and
--openvino_int8 with the int8 guard's verdict.

The flags are the fields of export/run_export.py's ExportConfig; the work is its
`export_run`.
"""
from slimserve.cli import logs
from slimserve.export import openvino
from slimserve.export import run_export
from slimserve.export import tflite

CONFIG = run_export.ExportConfig


def main(config, args):
    del args
    result = run_export.export_run(config)
    for stale in result.removed:
        print("removed %s left by an interrupted export" % stale)
    print(result.path)
    if config.tflite:
        print(tflite.describe(tflite.read_parity(result.path)))
    if openvino.has_parity(result.path):
        print(openvino.describe(openvino.read_parity(result.path)))
        if config.openvino_int8:
            print(openvino.describe_int8(result.path))


def run():
    logs.run(main, config=CONFIG)


if __name__ == "__main__":
    run()
