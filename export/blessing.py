"""Export gating ("blessing" in TFX): a checkpoint is exported only when its evaluation
clears a bar, so a run that diverged, or learnt next to nothing, never reaches a model
server.

The bar, `--export_min_metric`:
- `auto` (default): mean_per_class_accuracy must be both
  1. above chance by AUTO_MARGIN (30%) of the way to perfect: > 1/C + 0.3 * (1 - 1/C),
     0.37 for 10 classes, 0.65 for 2, 0.30 for 1000. 1/C is what a model that always
     answers the majority class scores on this metric, whatever the class balance
     (its plain accuracy would be that class's share). The former bar, a tenth of the
     way (0.19 for 10 classes), let a 21% model through;
  2. at least AUTO_BEST_FRACTION (90%) of the best value this run's evaluations
     recorded so far (<model_dir>/eval* events): a final checkpoint that fell far below
     the run's best is not published over it.
- a number, e.g. `0.9`: --best_metric must be >= it.
- `<metric>:<number>`, e.g. `top_5_accuracy:0.5`: that eval metric must be >= it.
- `none`: no gate.
"""
import glob
import os

import tensorflow as tf

from slimserve import conventions
from slimserve import errors

# The bar's syntax and constants are shared with the training config (conventions.py).
AUTO = conventions.GATE_AUTO
NONE = conventions.GATE_NONE
AUTO_METRIC = conventions.GATE_AUTO_METRIC
AUTO_MARGIN = conventions.GATE_AUTO_MARGIN
AUTO_BEST_FRACTION = conventions.GATE_AUTO_BEST_FRACTION
HELP = conventions.GATE_HELP  # the flag's help text, for slimserve-train and slimserve-export
parse = conventions.parse_min_metric  # --export_min_metric -> (metric or AUTO, threshold)
NOT_GATED = "--export_min_metric=none: not gated"


class ExportRefused(errors.UserError):
    """The evaluation does not clear --export_min_metric; the message says by how much."""


def auto_metric(eval_result):
    return AUTO_METRIC if AUTO_METRIC in eval_result else "accuracy"


def chance_bar(num_classes):
    """(chance 1/C, the auto bar above it)."""
    chance = 1.0 / num_classes
    return chance, chance + AUTO_MARGIN * (1 - chance)


def _check_auto(eval_result, num_classes, best_seen, at):
    if not num_classes or num_classes < 2:
        raise ValueError("--export_min_metric=auto needs the number of classes")
    metric = auto_metric(eval_result)
    value = float(eval_result.get(metric, float("nan")))
    chance, bar = chance_bar(num_classes)
    chance_rule = ("chance 1/%d = %.4f, what always answering one class scores, plus %d%% of "
                   "the way to 1" % (num_classes, chance, 100 * AUTO_MARGIN))
    if not value > bar:  # also NaN
        raise ExportRefused(
            "export refused: eval %s %.4f%s is not above %.4f (--export_min_metric=auto: %s);"
            " the model has barely learnt: train longer (--max_steps), check the labels and"
            " the loss (too high a --learning_rate diverges), or pass "
            "--export_min_metric=none to export anyway"
            % (metric, value, at, bar, chance_rule))
    best_value, best_step = value, None
    if best_seen and best_seen[0] > value:
        best_value, best_step = best_seen
    floor = AUTO_BEST_FRACTION * best_value
    best_rule = "%d%% of this run's best, %.4f%s" % (
        100 * AUTO_BEST_FRACTION, best_value,
        " at step %d" % best_step if best_step is not None else " (this evaluation)")
    if not value >= floor:
        raise ExportRefused(
            "export refused: eval %s %.4f%s is below %.4f (--export_min_metric=auto: %s); "
            "the run got worse since (over-fitting, or too high a --learning_rate): export/"
            "best keeps its best, or pass --export_min_metric=none to export anyway"
            % (metric, value, at, floor, best_rule))
    return ("eval %s %.4f%s clears --export_min_metric=auto: > %.4f (%s) and >= %.4f (%s)"
            % (metric, value, at, bar, chance_rule, floor, best_rule))


def check(eval_result, spec, best_metric="accuracy", num_classes=None, best_seen=None):
    """Returns a line saying why the evaluation passes (rule and numbers); raises
    ExportRefused otherwise. best_seen: (value, step) of the auto metric's best
    evaluation in this run (best_recorded), for the auto rule."""
    metric, threshold = parse(spec, best_metric)
    if metric is None:
        return NOT_GATED
    step = eval_result.get("global_step")
    at = " at step %d" % int(step) if step is not None else ""
    if metric == AUTO:
        return _check_auto(eval_result, num_classes, best_seen, at)
    if metric not in eval_result:
        raise errors.UserError("--export_min_metric names %r, which is not an eval metric "
                               "(have %s)" % (metric, sorted(eval_result)))
    value = float(eval_result[metric])
    if not value >= threshold:
        raise ExportRefused(
            "export refused: eval %s %.4f%s is below --export_min_metric %g; train longer or "
            "better, or lower the bar" % (metric, value, at, threshold))
    return "eval %s %.4f%s >= --export_min_metric %g" % (metric, value, at, threshold)


def recorded_evals(model_dir):
    """{global step: {metric: value}} of every evaluation the run wrote (the event files
    under <model_dir>/eval*)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "eval*", "events.out.tfevents.*"))):
        try:
            for event in tf.compat.v1.train.summary_iterator(path):
                if not event.HasField("summary"):
                    continue
                for value in event.summary.value:
                    if value.HasField("simple_value"):
                        found.setdefault(event.step, {})[value.tag] = value.simple_value
        except tf.errors.DataLossError:
            continue  # an event file cut short by a killed evaluator: use what was read
    return found


def best_recorded(model_dir, metric=AUTO_METRIC):
    """(best value, its step) of `metric` over the run's recorded evaluations, or None."""
    points = [(values[metric], step) for step, values in recorded_evals(model_dir).items()
              if metric in values]
    return max(points) if points else None


def recorded_eval(model_dir, step):
    """The metrics the run's evaluation wrote for global step `step`, or None when that
    checkpoint was never evaluated."""
    found = recorded_evals(model_dir).get(step)
    if not found:
        return None
    return dict(found, global_step=step)


def judge(model_dir, eval_result, spec, best_metric="accuracy", num_classes=None):
    """The export gate, written once for the training exporters and slimserve-export: a
    line saying why `eval_result` clears `spec` (--export_min_metric); ExportRefused, or
    a UserError naming a metric the evaluation lacks, otherwise. The auto rule also
    compares with the best evaluation the run in `model_dir` recorded."""
    best_seen = None
    if parse(spec, best_metric)[0] == AUTO:
        best_seen = best_recorded(model_dir, auto_metric(eval_result))
    return check(eval_result, spec, best_metric, num_classes, best_seen)


def judge_checkpoint(model_dir, checkpoint, spec, num_classes, best_metric="accuracy"):
    """judge() on the evaluation the run recorded for `checkpoint`'s global step
    (slimserve-export trusts it rather than evaluating again); ExportRefused when that
    step was never evaluated. Not gated: the checkpoint is not even read."""
    if parse(spec, best_metric)[0] is None:
        return NOT_GATED
    step = int(tf.train.load_checkpoint(checkpoint).get_tensor("global_step"))
    result = recorded_eval(model_dir, step)
    if result is None:
        raise ExportRefused(
            "export refused: %s (step %d) was never evaluated; run slimserve-train "
            "--mode=eval with the run's flags (--flagfile=%s/flags.txt) first, or pass "
            "--export_min_metric=none" % (checkpoint, step, model_dir))
    return judge(model_dir, result, spec, best_metric, num_classes)
