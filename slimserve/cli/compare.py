"""slimserve-compare: a canary check of a candidate SavedModel against the baseline on
requests the server logged.

    slimserve-compare --logs='/logs/resnet*' --baseline=/models/resnet/1 \
        --candidate=/models/resnet/2 --min_agreement=0.98 --json_output=report.json

Exits 1 when the candidate refuses more of the replayed requests than
--max_candidate_error_rate (default 0: any refusal) or when the class agreement is below
--min_agreement (a request the candidate refuses counts as a disagreement), so a
deployment script can refuse the candidate.
"""
import json
import sys

from absl import flags
from tqdm import tqdm

from slimserve.serving.tools import compare
from slimserve.serving.observability import request_log
from slimserve.cli import logs

FLAGS = flags.FLAGS
flags.DEFINE_string("logs", None, "Glob of request log files (TFRecords of PredictionLog, "
                    "as the server's logging_config writes them).")
flags.DEFINE_string("baseline", None,
                    "SavedModel directory, or a base path (its newest version is used).")
flags.DEFINE_string("candidate", None,
                    "SavedModel directory, or a base path (its newest version is used).")
flags.DEFINE_float("min_agreement", None, "Exit 1 when class agreement is below this "
                   "(0..1); without it the report is informational.", lower_bound=0.0,
                   upper_bound=1.0)
flags.DEFINE_float("max_candidate_error_rate", 0.0,
                   "Exit 1 when the candidate refuses (errors on) more than this fraction of "
                   "the replayed requests (0..1; default 0: any refusal fails the canary).",
                   lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_integer("max_requests", 10000, "Logged requests replayed at most.", lower_bound=1)
flags.DEFINE_string("json_output", None, "Also write the report as JSON to this file.")
flags.DEFINE_bool("progress", True, "Show a progress bar.")
flags.mark_flags_as_required(["logs", "baseline", "candidate"])


def main(argv):
    del argv
    try:
        requests = request_log.read_logs(FLAGS.logs, FLAGS.max_requests)
        with tqdm(total=len(requests), disable=not FLAGS.progress, unit="req") as bar:
            report = compare.compare(requests, FLAGS.baseline, FLAGS.candidate,
                                     progress=bar.update)
    except (ValueError, OSError) as error:
        sys.exit("slimserve-compare: %s" % error)
    report["min_agreement"] = FLAGS.min_agreement
    report["max_candidate_error_rate"] = FLAGS.max_candidate_error_rate
    reasons = compare.verdict(report, FLAGS.min_agreement, FLAGS.max_candidate_error_rate)
    report["passed"] = not reasons
    report["refused_because"] = reasons
    if FLAGS.json_output:
        try:
            with open(FLAGS.json_output, "w") as handle:
                json.dump(report, handle, indent=2)
        except OSError as error:
            sys.exit("slimserve-compare: --json_output: %s" % error)
    print(compare.format_report(report, FLAGS.min_agreement, FLAGS.max_candidate_error_rate))
    if reasons:
        print("slimserve-compare: candidate REFUSED: %s" % "; ".join(reasons),
              file=sys.stderr)
        sys.exit(1)


def run():
    logs.run(main)


if __name__ == "__main__":
    run()
