"""slimserve-compare: a canary check of a candidate SavedModel against the baseline on
requests the server logged.

    slimserve-compare --logs='/logs/resnet*' --baseline=/models/resnet/1 \
        --candidate=/models/resnet/2 --min_agreement=0.98 --json_output=report.json

Exits 1 when the candidate refuses more of the replayed requests than
--max_candidate_error_rate (default 0: any refusal) or when the class agreement is below
--min_agreement (a request the candidate refuses counts as a disagreement), so a
deployment script can refuse the candidate.
"""
import dataclasses
import json
import sys

from tqdm import tqdm

from slimserve import fields
from slimserve import outputs
from slimserve.cli import logs
from slimserve.serving.tools import compare
from slimserve.serving.observability import log_reader as label_candidates


@dataclasses.dataclass
class CompareConfig:
    """slimserve-compare's flags."""
    logs: str = fields.option(None, "Glob of request log files (TFRecords of PredictionLog, "
                              "as the server's logging_config writes them).", required=True)
    baseline: str = fields.option(
        None, "SavedModel directory, or a base path (its newest version is used).",
        required=True)
    candidate: str = fields.option(
        None, "SavedModel directory, or a base path (its newest version is used).",
        required=True)
    min_agreement: float = fields.option(
        None, "Exit 1 when class agreement is below this (0..1); without it the report is "
        "informational.", fields.PROBABILITY, kind=float)
    max_candidate_error_rate: float = fields.option(
        0.0, "Exit 1 when the candidate refuses (errors on) more than this fraction of the "
        "replayed requests (0..1; default 0: any refusal fails the canary).",
        fields.PROBABILITY)
    max_requests: int = fields.option(10000, "Logged requests replayed at most.",
                                      fields.Bound(1, 10_000_000))
    json_output: str = fields.option(None, "Also write the report as JSON to this file.")
    progress: bool = fields.option(True, "Show a progress bar.")


CONFIG = CompareConfig


def main(config, args):
    del args
    outputs.check_output(config.json_output, "--json_output")
    scan = label_candidates.Scan()
    requests = compare.read_requests(config.logs, config.max_requests, scan)
    with tqdm(total=len(requests), disable=not config.progress, unit="req") as bar:
        report = compare.compare(requests, config.baseline, config.candidate,
                                 progress=bar.update)
    report["skipped_logs"] = compare.skipped_json(scan)
    report["min_agreement"] = config.min_agreement
    report["max_candidate_error_rate"] = config.max_candidate_error_rate
    reasons = compare.verdict(report, config.min_agreement, config.max_candidate_error_rate)
    report["passed"] = not reasons
    report["refused_because"] = reasons
    if config.json_output:
        with outputs.write_atomically(config.json_output, "--json_output") as handle:
            json.dump(report, handle, indent=2)
    print(compare.format_report(report, config.min_agreement,
                                config.max_candidate_error_rate))
    if scan.skipped:
        print("not replayed: %s" % "; ".join(
            ["%d %s" % (n, why) for why, n in sorted(scan.skipped.items())] +
            ["%s (%s)" % (path, why) for path, (_, why) in scan.skipped_files.items()]))
    if reasons:
        print("slimserve-compare: candidate REFUSED: %s" % "; ".join(reasons),
              file=sys.stderr)
        sys.exit(1)


def run():
    logs.run(main, config=CONFIG)


if __name__ == "__main__":
    run()
