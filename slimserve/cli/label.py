r"""slimserve-label: a local web page to label the served images most worth labelling.

    slimserve-label --logs='/logs/resnet*' --model_base_path=/models/resnet \
        --output_dir=new_labels/
    # open http://127.0.0.1:8502/ ; then: slimserve-convert --input=new_labels/ ...

Reads the request logs (TF Serving's PredictionLog files the server writes), proposes
the --max_candidates images the model was least sure of (or those a --candidates file
names, e.g. slimserve-drift's most atypical ones), and serves a page showing each with
the model's top-3 and examples of the classes. Labels are written to --output_dir as
`<class>/<request id>.<ext>` (the logged image byte for byte) with provenance.jsonl, one
line per decision. Run it again on the same --output_dir to continue; several people may
label at once (browsers on one page, or pages on one folder).

The flags are the fields of flywheel/labelling/session.py's LabelConfig; the page is its
`run`.
"""
import signal

from slimserve import errors
from slimserve.cli import logs
from slimserve.flywheel.labelling import session

CONFIG = session.LabelConfig


def _stop(signum, frame):
    del signum, frame
    raise KeyboardInterrupt


def _ready(url, offered):
    """The page listens: say where, and let SIGTERM stop it as Ctrl-C does."""
    print("slimserve-label: %d image(s) to label at %s (Ctrl-C stops; run again to resume)"
          % (offered, url), flush=True)
    signal.signal(signal.SIGTERM, _stop)


def main(config, args):
    if args:
        raise errors.UserError("unexpected arguments: %s" % " ".join(args))
    outcome = session.run(config, ready=_ready)
    if outcome.counts is None:
        print("slimserve-label: nothing to label (%s)" % outcome.notes[0].rstrip("."),
              flush=True)
        return 0
    print("slimserve-label: %d labelled, %d none of these, %d skipped in %s" % (
        outcome.counts["label"], outcome.counts["none"], outcome.counts["skip"],
        config.output_dir), flush=True)
    return 0


def run():
    logs.run(main, config=CONFIG, concise=True)


if __name__ == "__main__":
    run()
