r"""slimserve-drift: is the served traffic still like what the model saw in training?

    slimserve-drift --logs='/logs/resnet*' --model_base_path=/models/resnet \
        --output_dir=drift/
    # then: slimserve-label --candidates=drift/candidates.jsonl ...

Reads the request logs (TF Serving's PredictionLog files the server writes) and the
model version that answered them (default: the one that answered last), and tests
windows of its traffic against the reference the version's export recorded
(assets.extra/reference/): class-prior, confidence, image-statistics and embedding shift,
each with a threshold calibrated by permutation. Prints one line per statistic of the
newest window and, last, `drift: yes` or `drift: no`, and exits 0 either way; when a
statistic could not be computed and none of the others drifts, `drift: unknown` and exit
status 1 (a statistic not computed is no evidence of no drift), as on an error. With
--output_dir: report.json ("drift": true|false and each statistic with its threshold),
report.html (which statistic moved, since when, the most atypical served images) and
candidates.jsonl (the images most worth labelling, for slimserve-label).

The flags are flywheel/drift.py's DriftConfig; the run is its `run`.
"""
from slimserve import errors
from slimserve.cli import logs
from slimserve.flywheel import drift

CONFIG = drift.DriftConfig


def main(config, args):
    if args:
        raise errors.UserError("unexpected arguments: %s" % " ".join(args))
    result = drift.run(config)
    for line in result.lines():
        print(line, flush=True)
    if result.verdict is None:
        raise errors.UserError(result.unknown_reason())
    return 0


def run():
    logs.run(main, config=CONFIG, concise=True)


if __name__ == "__main__":
    run()
