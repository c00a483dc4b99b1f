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
"""
import dataclasses
import getpass
import logging
import os
import signal
import sys

from slimserve import conventions
from slimserve import errors
from slimserve import fields
from slimserve.cli import logs

DEFAULT_PORT = 8502


@dataclasses.dataclass
class LabelConfig:
    """slimserve-label's flags."""
    logs: str = fields.option(
        None, "Glob of request log files (TFRecords of PredictionLog, as the server's "
        "logging_config writes them). Without --candidates, the images the model was least "
        "sure of are proposed from them.")
    candidates: str = fields.option(
        None, "JSON-lines file naming the images to label ({\"log\", \"index\", \"item\", "
        "\"score\", \"reasons\"} per line, e.g. written by slimserve-drift); the highest "
        "scores are offered first. Without it, the lowest-confidence logged predictions.")
    output_dir: str = fields.option(
        None, "Folder the labels go to: <class>/<request id>.<ext> (ready for "
        "slimserve-convert --input) and provenance.jsonl. The same folder again resumes "
        "where labelling stopped.", required=True)
    labeller: str = fields.option(
        None, "Name recorded with each decision (default: the OS user); each browser can "
        "change its own on the page.")
    model_base_path: str = fields.option(
        None, "The model's base path: class names from its newest version's "
        "assets/labels.txt, class examples from its assets.extra/reference/examples/. "
        "Without it (or --classes), the class names the logged responses carry.")
    classes: tuple = fields.option(
        None, "Class names in class-id order, instead of the model's labels.txt.", kind=list)
    model_name: str = fields.option(
        None, "Only requests logged for this model name (default: every logged request).")
    examples_dir: str = fields.option(
        None, "Class-folder tree (e.g. the training images) to show class examples from "
        "when the model version has no reference examples.")
    examples_per_class: int = fields.option(
        3, "Example images shown per class.", bound=fields.Bound(0, 20))
    max_candidates: int = fields.option(
        200, "Images offered at most in this run (the highest scores).",
        bound=fields.Bound(1, 100000))
    host: str = fields.option(
        "127.0.0.1", "Address the page listens on. The default, loopback, keeps it to this "
        "machine; the page has no login, so bind elsewhere only on a trusted network.")
    port: int = fields.option(
        DEFAULT_PORT, "Port of the page (0: a free one; the address is printed).",
        bound=fields.Bound(0, 65535))
    view: str = fields.option(
        "single", "How the page opens: one image at a time, or a grid.",
        choices=("single", "grid"))
    grid_size: int = fields.option(
        6, "Images each labeller holds at once: the grid's size; one at a time shows them "
        "in turn (arrow keys).", bound=fields.Bound(1, 60))
    claim_seconds: float = fields.option(
        600.0, "How long images shown to one labeller are kept from the others.",
        bound=fields.Bound(1.0, 86400.0))
    max_image_pixels: int = fields.option(
        50_000_000, "Logged or example images whose header claims more pixels are not "
        "decoded (decompression bombs).", bound=fields.Bound(1, fields.INT64_MAX))
    max_image_bytes: int = fields.option(
        32 * 1024 * 1024, "Logged or example images larger than this many bytes are not "
        "shown.", bound=fields.Bound(1, fields.INT64_MAX))
    thumbnail_size: int = fields.option(
        256, "Longest side, in pixels, of the images the page shows.",
        bound=fields.Bound(16, 2048))
    threads: int = fields.option(4, "Threads answering the page.", bound=fields.Bound(1, 64))
    progress: bool = fields.option(True, "Show progress bars while reading the logs.")


CONFIG = LabelConfig


def newest_version(base_path):
    """The newest integer version directory of a model base path; UserError if none."""
    from slimserve.serving.core import version_dirs  # pylint: disable=import-outside-toplevel
    versions = version_dirs.list_version_dirs(base_path)
    if not versions:
        raise errors.UserError("--model_base_path %s has no integer version holding "
                               "saved_model.pb" % base_path)
    return versions[max(versions)]


def model_classes(version_dir):
    """Class names from a version's assets/labels.txt, or None when it has none."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    path = os.path.join(version_dir, "assets", conventions.LABELS_ASSET)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "r") as handle:
        lines = handle.read(1 << 24).splitlines()
    return conventions.parse_labels(lines, path)  # a UserError naming the file and line


def check_classes(classes, origin):
    """The converter's rules (estimator/dataset.py) and the output tree's: every class
    name must come back from its folder as the same class."""
    from slimserve.estimator import dataset  # pylint: disable=import-outside-toplevel
    from slimserve.serving.tools import label_store  # pylint: disable=import-outside-toplevel
    if len(set(classes)) != len(classes):
        raise errors.UserError("class names from %s repeat a name" % origin)
    for name in classes:
        try:
            dataset.check_class_name(name, origin)
        except dataset.DatasetError as error:
            raise errors.UserError(str(error)) from None
        try:
            label_store.check_folder_name(name)
        except errors.UserError as error:
            raise errors.UserError("%s (from %s)" % (error, origin)) from None


def _bar(config, description, total=None):
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    return tqdm(total=total, desc=description, unit="record" if total is None else "image",
                disable=not config.progress, file=sys.stderr, leave=False)


def prepare(config):
    """(LabelPage, Store, summary lines) from the config: everything but the socket."""
    from slimserve.serving.tools import label_candidates  # pylint: disable=import-outside-toplevel
    from slimserve.serving.tools import label_items  # pylint: disable=import-outside-toplevel
    from slimserve.serving.tools import label_page  # pylint: disable=import-outside-toplevel
    from slimserve.serving.tools import label_store  # pylint: disable=import-outside-toplevel
    if not config.logs and not config.candidates:
        raise errors.UserError("give --logs (images proposed from request logs) or "
                               "--candidates (a file naming them)")
    labeller = config.labeller or _os_user()
    version_dir = newest_version(config.model_base_path) if config.model_base_path else None
    classes, origin = None, None
    if config.classes:
        classes, origin = list(config.classes), "--classes"
    elif version_dir:
        classes = model_classes(version_dir)
        origin = os.path.join(version_dir, "assets", conventions.LABELS_ASSET)
    decided = label_store.read_decisions(config.output_dir)
    scan = label_candidates.Scan()
    if config.candidates:
        candidates, skipped = label_candidates.read_candidates(
            config.candidates, config.max_candidates, exclude=decided)
        scan.skipped.update({"candidates file: %s" % k: v for k, v in skipped.items()})
        source = "%d candidate(s) from %s" % (len(candidates), config.candidates)
    else:
        label_candidates.log_files(config.logs)  # none match: one line before any progress
        with _bar(config, "reading request logs") as bar:
            candidates, scan = label_candidates.propose(
                config.logs, config.max_candidates, exclude=decided,
                model_name=config.model_name, progress=bar.update)
        source = "the %d least confident of %s" % (len(candidates), scan.describe())
    with _bar(config, "decoding candidates", len(candidates)) as bar:
        items = label_items.load_items(candidates, scan, config.thumbnail_size,
                                       config.max_image_pixels, config.max_image_bytes,
                                       progress=bar.update)
    if classes is None:
        classes, origin = scan.logged_classes(), "the class names of the logged responses"
        if not classes:
            raise errors.UserError("no class names: give --model_base_path (its labels.txt) "
                                   "or --classes; the logged responses name no classes 0..N-1")
    check_classes(classes, origin)
    store = label_store.Store(config.output_dir, classes)
    removed = store.clean_orphans({item.request_id for item in items})
    if removed:
        logging.warning("removed %d uncommitted file(s) an interrupted run left in %s",
                        removed, config.output_dir)
    examples, example_source, example_skips = label_items.load_examples(
        classes, version_dir, config.examples_dir, config.examples_per_class,
        max(32, config.thumbnail_size // 4), config.max_image_pixels, config.max_image_bytes)
    notes = ["Offered: %s." % source,
             "Classes: %d, from %s." % (len(classes), origin),
             "Examples: %s." % (example_source or "none (no reference examples and no "
                                "--examples_dir)")]
    skipped = dict(scan.skipped)
    skipped.update({"examples: %s" % k: v for k, v in example_skips.items()})
    if skipped:
        notes.append("Not offered: %s." % "; ".join(
            "%d %s" % (count, why) for why, count in sorted(skipped.items())))
    if decided:
        notes.append("Resumed: %d decision(s) already in %s." % (
            len(decided), os.path.join(config.output_dir, label_store.PROVENANCE_FILE)))
    page = label_page.LabelPage(items, classes, store, examples, labeller,
                                grid_size=config.grid_size,
                                claim_seconds=config.claim_seconds, view=config.view,
                                notes=notes)
    return page, store, notes


def _os_user():
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _stop(signum, frame):
    del signum, frame
    raise KeyboardInterrupt


def main(config, args):
    if args:
        raise errors.UserError("unexpected arguments: %s" % " ".join(args))
    page, store, notes = prepare(config)
    for note in notes:
        logging.info("%s", note)
    if not page.items:
        print("slimserve-label: nothing to label (%s)" % notes[0].rstrip("."), flush=True)
        return 0
    import waitress  # pylint: disable=import-outside-toplevel
    try:
        server = waitress.create_server(
            page, host=config.host, port=config.port, threads=config.threads,
            max_request_body_size=64 * 1024, max_request_header_size=64 * 1024,
            connection_limit=64, channel_timeout=60, ident="slimserve-label",
            clear_untrusted_proxy_headers=True)
    except OSError as error:
        raise errors.UserError("cannot listen on %s:%d: %s" % (
            config.host, config.port, error.strerror or error)) from None
    port = int(server.effective_port)
    from slimserve.serving.tools import label_page  # pylint: disable=import-outside-toplevel
    page.allowed_hosts = label_page.allowed_hosts(config.host, port)
    if page.allowed_hosts is None:
        logging.warning("the labelling page listens on %s: anyone who reaches it can label "
                        "(it has no login)", config.host)
    host = "[%s]" % config.host if ":" in config.host else config.host
    print("slimserve-label: %d image(s) to label at http://%s:%d/ (Ctrl-C stops; run "
          "again to resume)" % (len(page.items), host, port), flush=True)
    signal.signal(signal.SIGTERM, _stop)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    counts = store.counts()
    print("slimserve-label: %d labelled, %d none of these, %d skipped in %s" % (
        counts["label"], counts["none"], counts["skip"], config.output_dir), flush=True)
    return 0


def run():
    logs.run(main, config=CONFIG, concise=True)


if __name__ == "__main__":
    run()
