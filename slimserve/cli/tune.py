"""slimserve-tune: find the fastest serving configuration of a model on this machine
that still answers like the fp32 model: runtime (TensorFlow; OpenVINO fp32, bf16 where
the CPU has it, int8 where the export has it, at each of --openvino_streams), TensorFlow's
precision and XLA, and the batching grid, each measured in a fresh slimserve-server process.

    slimserve-tune --model_base_path=/models/resnet --data_dir=data/ \
        --latency_budget_ms=100 --output_flags=server.flags \
        --output_config=batching.config --output_png=tuning.png
    slimserve-server --flagfile=server.flags

Every setting answers the same comparison inputs (the validation split of --data_dir,
else --logs, else --images) and is rejected when it picks the fp32 baseline's class on
fewer than --min_agreement of them, or (labels known: --data_dir) whose accuracy is more
than --max_accuracy_drop below the baseline's. Writes the chosen server flags (a flagfile that
tensorflow_model_server's flags can be read from too), the batching file, the table and
the plot. Bounded by --max_minutes; SIGTERM / SIGINT stop the server children.
"""
import dataclasses

from slimserve import fields
from slimserve.cli import tuning
from slimserve.cli.tuning import TuningOptions
from slimserve.serving.core import openvino_servable
from slimserve.serving.tuning import run as tuner_run
from slimserve.serving.tuning import tuner as tuner_lib

TOOL = "slimserve-tune"


@dataclasses.dataclass
class TuneConfig:
    """slimserve-tune's flags: the tuners' shared section and its own."""
    tuning: TuningOptions = fields.section(TuningOptions)
    images: str = fields.option(None, "Load images: an image file or a folder of them (up to "
                                "256 used). Default: the comparison inputs.")
    data_dir: str = fields.option(None, "A converted data set: predictions are compared on "
                                  "its validation split (validation-*-of-* TFRecords).")
    logs: str = fields.option(None, "Request-log files (a glob): predictions are compared on "
                              "the logged inputs to --signature_name (when --data_dir is not "
                              "given).")
    compare_images: int = fields.option(
        500, "At most this many comparison inputs (each setting answers all of them before "
        "its load).", fields.Bound(1, 100000))
    max_input_mb: int = fields.option(
        256, "Upper bound on the bytes of comparison inputs read (checked before each record "
        "is read).", fields.Bound(1, 16384))
    min_agreement: float = fields.option(
        0.995, "Reject a setting that picks the fp32 baseline's class on fewer than this "
        "fraction of the comparison inputs (0: no guard).", fields.PROBABILITY)
    max_accuracy_drop: float = fields.option(
        tuner_lib.DEFAULT_MAX_ACCURACY_DROP, "Reject a setting whose accuracy on the "
        "comparison inputs' labels (--data_dir's validation split) is more than this below "
        "the fp32 baseline's (with --min_agreement > 0).", fields.PROBABILITY)
    runtimes: tuple = fields.option(
        (tuner_lib.TENSORFLOW, tuner_lib.OPENVINO), "Runtimes tried: tensorflow, openvino "
        "(the server's --prefer_openvino_model; a version without openvino/model.xml is "
        "converted at load; left out with a line where openvino is not installed).")
    openvino_precisions: tuple = fields.option(
        ("auto",), "OpenVINO precisions tried (the server's --openvino_precision): fp32, "
        "bf16, int8. auto: fp32, bf16 where the CPU has AVX512_BF16 or AMX, int8 where the "
        "newest version has openvino/model_int8.xml.")
    openvino_streams: tuple = fields.option(
        tuple(sorted({0, tuner_run.CORES})), "OpenVINO streams tried (the server's "
        "--openvino_num_streams; 0: its latency hint, one stream over every core). Default: "
        "0 and the number of cores.", fields.Bound(0, openvino_servable.MAX_STREAMS), item=int)
    precisions: tuple = fields.option(
        ("auto",), "Precisions tried: fp32, bf16 (the server's --mixed_precision=bfloat16). "
        "auto: fp32, and bf16 when the CPU has native bf16 (AVX512_BF16 or AMX). TensorFlow's "
        "only; OpenVINO's are --openvino_precisions.")
    xla: tuple = fields.option(("false", "true"), "XLA settings tried (the server's "
                               "--xla_cpu_compilation_enabled).")
    search: str = fields.option(
        "staged", "staged: every runtime candidate (TensorFlow precision x XLA, OpenVINO "
        "precision x streams) at the grid's largest batch and longest timeout, then the "
        "batching grid under the fastest accepted one; full: the whole product.",
        choices=tuner_lib.SEARCHES)
    server_flag: tuple = fields.option(
        (), "A slimserve-server flag given to every setting, e.g. "
        "--server_flag=--tensorflow_intra_op_parallelism=2 (repeatable; also written to "
        "--output_flags).", kind=list, repeat=True)
    output_flags: str = fields.option(
        "server.flags", "Where the chosen server flags go: a flagfile for slimserve-server "
        "--flagfile=..., one flag a line, which tensorflow_model_server takes too (comments "
        "say how).")
    output_model_config: str = fields.option(
        "", "Also write the chosen runtime as a model config file (ModelServerConfig: the "
        "model's name, base path and model_platform \"openvino\" or \"tensorflow\"); the "
        "flagfile then names it with --model_config_file. Empty: not written.")


CONFIG = TuneConfig

main, run = tuning.command(CONFIG, tuner_run.tune, TOOL, __name__)


if __name__ == "__main__":
    run()
