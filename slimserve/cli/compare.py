"""slimserve-compare: a canary check of a candidate SavedModel against the baseline on
requests the server logged.

    slimserve-compare --logs='/logs/resnet*' --baseline=/models/resnet/1 \
        --candidate=/models/resnet/2 --min_agreement=0.98 --json_output=report.json

Exits 1 when the candidate refuses more of the replayed requests than
--max_candidate_error_rate (default 0: any refusal) or when the class agreement is below
--min_agreement (a request the candidate refuses counts as a disagreement), so a
deployment script can refuse the candidate.

The flags are the fields of flywheel/compare.py's CompareConfig; the check is its `run`.
"""
import sys

from slimserve.cli import logs
from slimserve.flywheel import compare

CONFIG = compare.CompareConfig


def main(config, args):
    del args
    report = compare.run(config)
    print(compare.summary(report))
    if report["refused_because"]:
        print("slimserve-compare: candidate REFUSED: %s" % "; ".join(
            report["refused_because"]), file=sys.stderr)
        sys.exit(1)


def run():
    logs.run(main, config=CONFIG)


if __name__ == "__main__":
    run()
