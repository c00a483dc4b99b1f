"""The retrain's fine-tune: from the serving version, on the merged data, to one candidate
export.

    tuned = fine_tune.run(config, train, serving_dir, merged, warmup_from=logs)
    tuned.candidate    # a version directory, or None when nothing was exported

The serving version's variables/variables is a checkpoint with slim's names, its head
included (the classes are the same), so training.run warm-starts from it and exports
with export/exporters.py (Final and Best, each with its reference). With --soup_seeds
N > 1, N fine-tunes that differ only in their seed (--seed, --seed + 1, ...; each under
<model_dir>/soup/) are averaged into one (a model soup: when the runs stay in one basin
it varies less from seed to seed than one run; measured on the flywheel demo it did
worse, so it is off by default); with --serving_weight the fine-tuned weights are also
averaged with the serving version's (WiSE-FT, estimator/weight_averaging.py). An average
is exported after the runs, under <model_dir>/export/averaged (never evaluated: the
canary check judges it).
"""
import dataclasses
import logging
import os

from slimserve import errors
from slimserve import fields
from slimserve.estimator import training
from slimserve.estimator import weight_averaging
from slimserve.export import exporters
from slimserve.export import run_export


@dataclasses.dataclass
class FineTuneConfig:
    """How the candidate is made from the fine-tune(s)."""
    serving_weight: float = fields.option(
        0.0, "Share of the serving version's weights averaged into the fine-tuned ones "
        "before the check (WiSE-FT: keeps more of the original task at some cost on the "
        "new one); 0: the fine-tuned weights as they are.",
        fields.Bound(0.0, 1.0, upper_open=True))
    soup_seeds: int = fields.option(
        1, "Fine-tunes averaged into the candidate (a model soup): each from the serving "
        "version on the same data, seeds --seed, --seed + 1, ...; their weights and "
        "BatchNorm statistics averaged. N costs N fine-tunes; it helps only when the runs "
        "stay close enough to average (the flywheel demo's do not: docs/benchmarks.md).",
        fields.Bound(1, 16))

    @property
    def averages(self):
        """Whether the candidate is an average made after the run(s), not a run's export."""
        return bool(self.serving_weight) or self.soup_seeds > 1


@dataclasses.dataclass
class Tuned:
    """The fine-tune(s) [(model_dir, TrainResult)], the first being --model_dir's, and the
    candidate version directory (None: nothing was exported)."""
    runs: list
    candidate: str = None


def _checkpoint(serving_dir):
    return os.path.join(serving_dir, "variables", "variables")


def train_config(config, train, serving_dir, merged, warmup_from=None):
    """The fine-tune's TrainConfig: the merged data, warm-started from the serving version
    (its head too: the classes are the same), exporting with warmup from the logged
    traffic (unless the export is of an average, made after the run)."""
    if train.model.checkpoint_exclude_scopes:
        logging.info("--checkpoint_exclude_scopes=%s ignored: the serving version's head "
                     "fits the same classes", ",".join(train.model.checkpoint_exclude_scopes))
    return dataclasses.replace(
        train,
        data=dataclasses.replace(train.data, data_dir=merged, labels_file=None),
        model=dataclasses.replace(train.model, checkpoint_path=_checkpoint(serving_dir),
                                  checkpoint_exclude_scopes=()),
        run=dataclasses.replace(train.run, mode="train_and_eval"),
        export=dataclasses.replace(train.export, export=not config.averages,
                                   warmup_from=train.export.warmup_from or warmup_from))


def run(config, train, serving_dir, merged, warmup_from=None):
    """The fine-tune(s) and the candidate: one run in --model_dir, or with --soup_seeds N,
    N runs under <model_dir>/soup/ with seeds --seed, --seed + 1, ...; with an average
    (soup or --serving_weight), its export. -> Tuned."""
    tuned = train_config(config, train, serving_dir, merged, warmup_from)
    model_dir = tuned.run.model_dir
    if config.soup_seeds == 1:
        runs = [(model_dir, training.run(tuned, exporters.for_training))]
    else:
        runs = []
        for member in range(config.soup_seeds):
            seed = tuned.run.seed + member
            member_dir = os.path.join(model_dir, "soup", "seed%d" % seed)
            logging.info("soup: fine-tune %d of %d (--seed %d) in %s", member + 1,
                         config.soup_seeds, seed, member_dir)
            member_config = dataclasses.replace(
                tuned, run=dataclasses.replace(tuned.run, model_dir=member_dir, seed=seed))
            runs.append((member_dir, training.run(member_config, exporters.for_training)))
    if config.averages:
        with errors.writing(os.path.join(model_dir, "retrain"), "--model_dir"):
            candidate = _export_average(config, train, serving_dir, [d for d, _ in runs],
                                        model_dir, warmup_from)
    else:
        candidate = _candidate(runs[0][1], model_dir)
    return Tuned(runs, candidate)


def _export_average(config, train, serving_dir, run_dirs, model_dir, warmup_from):
    """--soup_seeds / --serving_weight: the runs' last checkpoints averaged (with the serving
    version's weights), exported under <model_dir>/export/averaged; the averaged checkpoint
    is written under <model_dir>/retrain/averaged."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tuned = [tf.train.latest_checkpoint(run_dir) for run_dir in run_dirs]
    if None in tuned:
        return None
    work = os.path.join(model_dir, "retrain")
    averaged, _ = weight_averaging.average_checkpoints(
        tuned, _checkpoint(serving_dir), config.serving_weight,
        os.path.join(work, "averaged", os.path.basename(tuned[0])))
    export = train.export
    return run_export.export_run(run_export.ExportConfig(
        model_dir=run_dirs[0], checkpoint_path=averaged,
        export_base=os.path.join(model_dir, "export", "averaged"), verify=export.verify_export,
        warmup_from=export.warmup_from or warmup_from, export_min_metric="none")).path


def _candidate(result, model_dir):
    """The newest version export/final wrote in this run (else export/best's)."""
    for name in ("final", "best"):
        found = [p for p in result.exported
                 if os.path.dirname(os.path.abspath(p)) ==
                 os.path.join(os.path.abspath(model_dir), "export", name)]
        if found:
            return found[-1]
    return None
