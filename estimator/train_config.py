"""TrainConfig: everything a training run takes, as one typed object (Model Garden's
config_definitions), whose fields are slimserve-train's flags.

A recipe (`recipe`, estimator/recipes/) fills what the command line left unset.
Sections: data (where the TFRecords are), input (estimator/inputs.py InputConfig: the
input pipeline, taken by make_input_fn as it is), model (ModelConfig,
estimator/model.py: net, fine-tuning, optimisation), run (model_dir, mode, steps,
checkpoints), distribution (strategy, precision, threads), export (the exporters
training attaches) and guards (divergence, the run lock). Each field carries its flag's
name, default, help and bound (slimserve/fields.py), so the command line, the checks and
`<model_dir>/flags.txt` all come from here; `validate()` adds the rules that join fields
and `derived_defaults()` the defaults that follow from others. estimator/training.py
`run(config)` trains from it; slimserve-train only builds it from its flags.
"""
import dataclasses
import functools
import os
from typing import Optional

from slimserve import conventions
from slimserve import errors
from slimserve import fields
from slimserve.estimator import inputs
from slimserve.estimator import model as model_lib
from slimserve.estimator import nets
from slimserve.estimator import recipes
from slimserve.estimator import run_config

MODES = ("train_and_eval", "train", "eval")


@dataclasses.dataclass
class DataOptions:
    """The converted data set the run reads."""
    data_dir: str = fields.option(
        None, "TFRecords written by slimserve-convert (train-*/validation-* shards, "
        "labels.txt, dataset_info.json); not the images.", required=True)
    labels_file: str = fields.option(None, "id:name file (default: <data_dir>/labels.txt).")
    train_split: str = fields.option("train", "Split name of the training shards.")
    eval_split: str = fields.option("validation", "Split name of the evaluation shards.")

    def labels_path(self):
        return self.labels_file or os.path.join(self.data_dir, conventions.LABELS_FILE)


@dataclasses.dataclass
class RunOptions:
    """Where the run lives, what it runs, and its checkpoints and logs."""
    model_dir: str = fields.option(None, "Checkpoints, summaries, exports.", required=True)
    mode: str = fields.option("train_and_eval", "What to run.", choices=MODES)
    max_steps: int = fields.option(1000, "Total training steps (global step).",
                                   fields.POSITIVE)
    eval_steps: Optional[int] = fields.option(
        None, "Eval batches (default: the whole eval split).", fields.POSITIVE, kind=int)
    evaluations: int = fields.option(
        5, "Checkpoints (each evaluated in train_and_eval, and exported to export/best "
        "only when it beats every earlier one) per run when neither "
        "--save_checkpoints_steps nor --save_checkpoints_secs is given: one every "
        "--max_steps/N steps, so a longer run costs as many evaluations as a short one. "
        "The last step is always evaluated.", fields.POSITIVE)
    save_checkpoints_steps: Optional[int] = fields.option(
        None, "Checkpoint (and evaluate) every N steps (default: --max_steps / "
        "--evaluations, rounded up).", fields.POSITIVE, kind=int)
    save_checkpoints_secs: Optional[int] = fields.option(
        None, "Or every N seconds (overrides steps): evaluations by time.", fields.POSITIVE,
        kind=int)
    keep_checkpoint_max: int = fields.option(5, "Checkpoints kept.", fields.POSITIVE)
    checkpoint_save_graph_def: bool = fields.option(
        False, "Also write graph.pbtxt and a .meta graph beside every checkpoint (RunConfig's "
        "checkpoint_save_graph_def; Estimator's default). Off: TensorBoard's graph is in the "
        "events file either way; the text graph of a ResNet-50 costs seconds of CPU and "
        "10-35 MB per run.")
    log_step_count_steps: int = fields.option(20, "Progress line every N steps.",
                                              fields.POSITIVE)
    save_summary_steps: int = fields.option(
        100, "TensorBoard summaries every N steps (0: none).", fields.NON_NEGATIVE)
    eval_throttle_secs: int = fields.option(10, "Least seconds between evaluations.",
                                            fields.NON_NEGATIVE)
    seed: int = fields.option(0, "Graph-level seed for init, shuffling and crops.")

    def checkpoint_steps(self):
        """--save_checkpoints_steps, or --max_steps / --evaluations rounded up when unset
        (None when --save_checkpoints_secs sets the cadence by time)."""
        if self.save_checkpoints_secs:
            return None
        if self.save_checkpoints_steps:
            return self.save_checkpoints_steps
        return -(-self.max_steps // self.evaluations)


@dataclasses.dataclass
class DistributionOptions:
    """Devices, strategy and the session's speed settings (estimator/run_config.py)."""
    distribution: str = fields.option(
        "auto", "auto: mirrored with >1 GPU, PS when TF_CONFIG names ps, collective for a "
        "TF_CONFIG of workers only.", choices=run_config.DISTRIBUTIONS)
    num_gpus: int = fields.option(0, "GPUs to mirror over (MirroredStrategy when > 1).",
                                  fields.NON_NEGATIVE)
    cpu_replicas: int = fields.option(
        0, "Split the CPU into N logical devices and mirror over them (tests the "
        "multi-device path without GPUs).", fields.NON_NEGATIVE)
    xla: bool = fields.option(False, "XLA JIT compilation.")
    precision: str = fields.option(
        "fp32", "bf16: oneDNN auto mixed precision on CPUs with AVX512_BF16; fp16: GPUs.",
        choices=run_config.PRECISIONS)
    intra_op_threads: int = fields.option(0, "Threads inside ops (0: TF's choice).",
                                          fields.NON_NEGATIVE)
    inter_op_threads: int = fields.option(0, "Ops run concurrently (0: TF's choice).",
                                          fields.NON_NEGATIVE)


@dataclasses.dataclass
class ExportOptions:
    """The exporters a train_and_eval run attaches (export/exporters.py builds them: the
    estimator library never imports export/, training.run takes them from a factory)."""
    export: bool = fields.option(True, "Attach the Final and Best exporters (train_and_eval).")
    exports_to_keep: int = fields.option(3, "BestExporter versions kept.", fields.POSITIVE)
    best_metric: str = fields.option("accuracy", "Eval metric the BestExporter maximises.")
    verify_export: bool = fields.option(True, "Reload each export and compare with predict().")
    warmup_from: str = fields.option(
        None, "Glob of request logs: the exporters build warmup requests from that traffic "
        "(validation images when it matches nothing).")
    export_min_metric: str = fields.option(
        conventions.GATE_AUTO, "Gates export/final and export/best. " + conventions.GATE_HELP)


@dataclasses.dataclass
class GuardOptions:
    """What stops a run that went wrong (estimator/guards.py) and guards its model_dir
    (estimator/run_lock.py)."""
    stop_on_nonfinite_loss: bool = fields.option(
        True, "Stop with an error (non-zero exit) when the training loss is NaN or Inf.")
    max_loss_factor: float = fields.option(
        100.0, "Stop with an error when the loss exceeds this many times the run's first "
        "loss (at least ln(classes)); 0: off.", fields.Bound(1.0, lower_open=True, also=(0,)))
    force_unlock: bool = fields.option(
        False, "Take <model_dir>/train.lock even if a trainer on another host holds it "
        "(only once that trainer is gone).")


@dataclasses.dataclass
class TrainConfig:
    """Everything slimserve-train takes; one flag per field, sections flattened.
    model.num_classes and model.class_names are not flags: training.run fills them
    from the data set's labels.txt. `recipe` (estimator/recipes/) fills the settings not
    given (`given`: the flags the command line named; None when built in code, where the
    values that differ from the defaults count as given)."""
    recipe: Optional[str] = fields.option(None, recipes.HELP, choices=recipes.NAMES)
    given: Optional[frozenset] = fields.given_flags()
    data: DataOptions = fields.section(DataOptions)
    input: inputs.InputConfig = fields.section(inputs.InputConfig)
    model: model_lib.ModelConfig = fields.section(model_lib.ModelConfig)
    run: RunOptions = fields.section(RunOptions)
    distribution: DistributionOptions = fields.section(DistributionOptions)
    export: ExportOptions = fields.section(ExportOptions)
    guards: GuardOptions = fields.section(GuardOptions)

    def validate(self):
        """Raises UserError naming the flag of the first value outside its bound, of a
        required flag left unset, or of the first rule that joins fields; returns self."""
        fields.check(self)
        for path, field in fields.walk(type(self)):
            if field.metadata.get("required") and functools.reduce(getattr, path, self) is None:
                raise errors.UserError("--%s is required" % fields.flag_name(field))
        self.input.check()
        conventions.parse_min_metric(self.export.export_min_metric, self.export.best_metric)
        self.model.resolved(self.run.max_steps).validate()
        return self

    def derived_defaults(self):
        """({model flag: value}, notes) for the model flags left unset whose default
        depends on other flags (ModelConfig.derived with --max_steps), and one line per
        derived value, the checkpoint cadence's included, saying the rule (logged, so a run
        says what it trained with)."""
        values, notes = self.model.derived(self.run.max_steps)
        run = self.run
        if not run.save_checkpoints_steps and not run.save_checkpoints_secs:
            notes = notes + ["--save_checkpoints_steps=%d (--max_steps=%d / --evaluations=%d"
                             ", rounded up)" % (run.checkpoint_steps(), run.max_steps,
                                                run.evaluations)]
        return values, notes

    def preprocess(self):
        """The evaluation/serving preprocessing: the net's style, --image_size (or the
        net's own), --eval_central_fraction and --max_image_pixels."""
        return nets.preprocessing_spec(self.model.model_name, self.input.image_size,
                                       self.input.eval_central_fraction,
                                       self.input.max_image_pixels)

    def flagfile_text(self):
        """The config as a flagfile (`<model_dir>/flags.txt`): --flagfile gives it back;
        values left unset stay derived."""
        return "".join(line + "\n" for line in fields.flag_lines(self))

