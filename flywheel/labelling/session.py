"""One labelling session (slimserve-label): the logged images most worth labelling, read
from the request logs (or a --candidates file such as slimserve-drift's), offered on a
local page until it is stopped.

    outcome = session.run(LabelConfig(
        source=candidates.CandidatesConfig(logs="/logs/resnet*"), output_dir="new_labels/",
        model_base_path="/models/resnet"))

`prepare` builds everything but the socket (the page, the store, the lines saying what is
offered and from where): the tests drive its page as a WSGI app. `run` serves it with
waitress on --host:--port (loopback by default: the page has no login) until Ctrl-C, and
returns the decisions' counts. Labels go to --output_dir as `<class>/<request id>.<ext>`
(the logged image byte for byte) with provenance.jsonl (store.py); the same folder again
resumes, and several pages or browsers may label it at once.
"""
import dataclasses
import getpass
import logging
import os
import sys

from slimserve import conventions
from slimserve import errors
from slimserve import fields
from slimserve.estimator import dataset
from slimserve.flywheel import candidates as candidates_lib
from slimserve.flywheel.labelling import items as items_lib
from slimserve.flywheel.labelling import page as page_lib
from slimserve.flywheel.labelling import store as store_lib
from slimserve.serving.core import version_dirs
from slimserve.serving.clients import image_classifier
from slimserve.serving.observability import log_reader

DEFAULT_PORT = 8502


@dataclasses.dataclass
class LabelConfig:
    """slimserve-label's flags."""
    # --logs, --candidates, --model_name, --max_candidates: what candidates.run reads
    source: candidates_lib.CandidatesConfig = fields.section(candidates_lib.CandidatesConfig)
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
    examples_dir: str = fields.option(
        None, "Class-folder tree (e.g. the training images) to show class examples from "
        "when the model version has no reference examples.")
    examples_per_class: int = fields.option(
        3, "Example images shown per class.", bound=fields.Bound(0, 20))
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


def newest_version(base_path):
    """The newest integer version directory of a model base path; UserError if none."""
    versions = version_dirs.list_version_dirs(base_path)
    if not versions:
        raise errors.UserError("--model_base_path %s has no integer version holding "
                               "saved_model.pb" % base_path)
    return versions[max(versions)]


def check_classes(classes, origin):
    """The converter's rules (estimator/dataset.py) and the output tree's: every class
    name must come back from its folder as the same class."""
    if len(set(classes)) != len(classes):
        raise errors.UserError("class names from %s repeat a name" % origin)
    for name in classes:
        try:
            dataset.check_class_name(name, origin)
        except dataset.DatasetError as error:
            raise errors.UserError(str(error)) from None
        try:
            store_lib.check_folder_name(name)
        except errors.UserError as error:
            raise errors.UserError("%s (from %s)" % (error, origin)) from None


def _bar(config, description, total=None):
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    return tqdm(total=total, desc=description, unit="record" if total is None else "image",
                disable=not config.progress, file=sys.stderr, leave=False)


def prepare(config):
    """(LabelPage, Store, summary lines) from the config: everything but the socket."""
    candidates_lib.check_source(config.source)
    labeller = config.labeller or _os_user()
    version_dir = newest_version(config.model_base_path) if config.model_base_path else None
    classes, origin = None, None
    if config.classes:
        classes, origin = list(config.classes), "--classes"
    elif version_dir:
        classes = image_classifier.read_model_labels(version_dir) or None
        origin = os.path.join(version_dir, "assets", conventions.LABELS_ASSET)
    decided = store_lib.read_decisions(config.output_dir)
    if config.source.candidates:
        proposal = candidates_lib.run(config.source, exclude=decided)
    else:
        log_reader.log_files(config.source.logs)  # none match: one line before any progress
        with _bar(config, "reading request logs") as bar:
            proposal = candidates_lib.run(config.source, exclude=decided,
                                          progress=bar.update)
    candidates, scan, source = proposal.candidates, proposal.scan, proposal.source
    with _bar(config, "decoding candidates", len(candidates)) as bar:
        items = items_lib.load_items(candidates, scan, config.thumbnail_size,
                                     config.max_image_pixels, config.max_image_bytes,
                                     progress=bar.update)
    if classes is None:
        classes, origin = scan.logged_classes(), "the class names of the logged responses"
        if not classes:
            raise errors.UserError("no class names: give --model_base_path (its labels.txt) "
                                   "or --classes; the logged responses name no classes 0..N-1")
    check_classes(classes, origin)
    store = store_lib.Store(config.output_dir, classes)
    removed = store.clean_orphans({item.request_id for item in items})
    if removed:
        logging.warning("removed %d uncommitted file(s) an interrupted run left in %s",
                        removed, config.output_dir)
    examples, example_source, example_skips = items_lib.load_examples(
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
            len(decided), os.path.join(config.output_dir, store_lib.PROVENANCE_FILE)))
    page = page_lib.LabelPage(items, classes, store, examples, labeller,
                              grid_size=config.grid_size, claim_seconds=config.claim_seconds,
                              view=config.view, notes=notes)
    return page, store, notes


def _os_user():
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


@dataclasses.dataclass
class Outcome:
    """What a session did: `notes` (what was offered, from where, what was not), the
    number of images `offered`, and the decisions in the output folder when it stopped
    ({label, none, skip: count}; None when nothing was offered, so no page was served)."""
    notes: list
    offered: int
    counts: dict = None


def run(config, ready=None):
    """Prepares the page and serves it until Ctrl-C (a KeyboardInterrupt: the command turns
    SIGTERM into one); nothing is served when nothing is left to label. ready(url,
    offered): called once the page listens, before it serves. A port that cannot be
    bound is a UserError naming the address."""
    page, store, notes = prepare(config)
    for note in notes:
        logging.info("%s", note)
    if not page.items:
        return Outcome(notes, 0)
    server = _listen(page, config)
    try:
        port = int(server.effective_port)
        page.allowed_hosts = page_lib.allowed_hosts(config.host, port)
        if page.allowed_hosts is None:
            logging.warning("the labelling page listens on %s: anyone who reaches it can "
                            "label (it has no login)", config.host)
        host = "[%s]" % config.host if ":" in config.host else config.host
        if ready:
            ready("http://%s:%d/" % (host, port), len(page.items))
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return Outcome(notes, len(page.items), store.counts())


def _listen(page, config):
    """The waitress server of the page, bound (bounded bodies, headers, connections)."""
    import waitress  # pylint: disable=import-outside-toplevel
    try:
        return waitress.create_server(
            page, host=config.host, port=config.port, threads=config.threads,
            max_request_body_size=64 * 1024, max_request_header_size=64 * 1024,
            connection_limit=64, channel_timeout=60, ident="slimserve-label",
            clear_untrusted_proxy_headers=True)
    except OSError as error:
        raise errors.UserError("cannot listen on %s:%d: %s" % (
            config.host, config.port, error.strerror or error)) from None
