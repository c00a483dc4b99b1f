"""slimserve-label in process: choosing the images (flywheel/candidates.py),
thumbnails of hostile bytes, the output tree and its provenance (labelling/store.py), and the
page as a WSGI app called without a socket (labelling/page.py): labelling, none of these,
skipping, resuming, two labellers at once, path escapes, escaping, bounded bodies. The
logs are written by the server's own RequestLogger (tests/label_logs.py). The page in a
real browser: tests/test_label_browser.py."""
import concurrent.futures
import hashlib
import html as html_lib
import io
import json
import os
import re
import subprocess
import sys
import threading
import urllib.parse

import numpy as np
import pytest
from PIL import Image

from slimserve import errors
from slimserve import fields
from slimserve.estimator import dataset
from slimserve.flywheel import candidates as candidates_lib
from slimserve.flywheel.labelling import items as label_items
from slimserve.flywheel.labelling import page as label_page
from slimserve.flywheel.labelling import session as label_session
from slimserve.flywheel.labelling import store as label_store
from slimserve.serving.clients import image_classifier
from slimserve.serving.observability import log_reader
from slimserve.serving.observability import request_log
from slimserve.serving.observability import thumbnails
from slimserve.testing import image_bombs
from slimserve.testing.commands import help_text, run_command
from tests.helpers import ROOT
from tests.label_logs import (HOSTILE_CLASS, HOSTILE_MODEL, digits_model,  # noqa: F401
                              served_logs, write_hostile_logs)

CLASSES = [str(d) for d in range(10)]


class Browser:
    """A WSGI client with one cookie jar: a browser session, without a socket."""

    def __init__(self, app, host="127.0.0.1:8502"):
        self.app, self.host, self.cookie = app, host, None

    def call(self, method, path, body=b"", content_type=None, length=None, host=None):
        path, _, query = path.partition("?")
        environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
                   "HTTP_HOST": host or self.host, "wsgi.input": io.BytesIO(body),
                   "CONTENT_LENGTH": str(len(body) if length is None else length)}
        if content_type:
            environ["CONTENT_TYPE"] = content_type
        if self.cookie:
            environ["HTTP_COOKIE"] = self.cookie
        answer = {}

        def start_response(status, headers):
            answer["status"], answer["headers"] = int(status.split()[0]), dict(headers)
        body = b"".join(self.app(environ, start_response))
        cookie = answer["headers"].get("Set-Cookie")
        if cookie:
            self.cookie = cookie.split(";")[0]
        return answer["status"], answer["headers"], body

    def page(self, path="/"):
        status, headers, body = self.call("GET", path)
        if status == 303:  # a new browser: the page sets its session cookie first
            status, headers, body = self.call("GET", headers["Location"])
        assert status == 200, body
        return body.decode()

    def post(self, path, **form):
        return self.call("POST", path, urllib.parse.urlencode(form).encode(),
                         "application/x-www-form-urlencoded")


def cards(html):
    """[request id] of the cards on a page, in order."""
    return re.findall(r'<article class="card[^"]*" id="card-\d+" data-request-id="([^"]+)"',
                      html)


def token(html):
    return re.search(r'name="token" value="([^"]+)"', html).group(1)


def decide(browser, html, rid, choice):
    return browser.post("/decide", token=token(html), request_id=rid, choice=choice,
                        view="single", focus=0)


def config(**values):
    """A LabelConfig: --logs/--candidates/--model_name/--max_candidates go to its section."""
    values.setdefault("progress", False)
    source = {name: values.pop(name) for name in ("logs", "candidates", "model_name",
                                                   "max_candidates") if name in values}
    return fields.check(label_session.LabelConfig(
        source=candidates_lib.CandidatesConfig(**source), **values))


def provenance(output_dir):
    with open(os.path.join(output_dir, label_store.PROVENANCE_FILE)) as handle:
        return [json.loads(line) for line in handle]


def logged_confidences(pattern):
    """{request id: top-1 probability} of every logged image, read independently."""
    found = {}
    for path, _ in log_reader.log_files(pattern):
        for index, log in enumerate(request_log.iter_logs(path)):
            probabilities = np.array(log.predict_log.response.outputs["probabilities"].float_val)
            rows = probabilities.reshape(-1, 10)
            for item, row in enumerate(rows):
                found[log_reader.request_id(path, index, item)] = row.max()
    return found


# --- choosing ----------------------------------------------------------------------

def test_propose_offers_the_least_confident_logged_images_first(served_logs):
    confidences = logged_confidences(served_logs)
    assert len(confidences) == 30  # 24 single requests and 3 batches of two
    candidates, scan = candidates_lib.propose(served_logs, 8)
    assert scan.records == 27 and scan.images == 30 and scan.files == 1
    assert [c.request_id for c in candidates] == sorted(confidences,
                                                         key=confidences.get)[:8]
    assert [c.score for c in candidates] == sorted((c.score for c in candidates), reverse=True)
    for candidate in candidates:
        assert candidate.score == pytest.approx(1 - confidences[candidate.request_id], abs=1e-6)
        assert len(candidate.top) == 3 and candidate.top[0][1] == pytest.approx(
            confidences[candidate.request_id], abs=1e-6)
        assert candidate.model_name == "digits" and candidate.model_version == 1
        assert candidate.reasons[0].startswith("low confidence")
    assert scan.logged_classes() == CLASSES
    # A resumed run proposes the next ones, not those already decided.
    later, _ = candidates_lib.propose(served_logs, 8,
                                        exclude={c.request_id for c in candidates[:3]})
    assert [c.request_id for c in later[:5]] == [c.request_id for c in candidates[3:]]
    # Another score slots in as a scorer; merged proposals keep every reason.
    atypical, _ = candidates_lib.propose(served_logs, 2, scorers=[
        lambda logged: (float(len(logged.image)), "large file")])
    merged = candidates_lib.merge(candidates, atypical)
    assert merged[0].request_id == atypical[0].request_id and "large file" in merged[0].reasons
    assert len(merged) == len({c.request_id for c in candidates + atypical})
    both = {c.request_id for c in candidates} & {c.request_id for c in atypical}
    for candidate in merged:
        assert len(candidate.reasons) == (2 if candidate.request_id in both else 1)


def test_a_dead_writers_temporary_is_read_and_found_again_once_published(served_logs,
                                                                         tmp_path):
    import fcntl  # pylint: disable=import-outside-toplevel
    import shutil  # pylint: disable=import-outside-toplevel
    source = log_reader.log_files(served_logs)[0][0]
    final = str(tmp_path / "digits-dead-1.tfrecord")
    temp = str(tmp_path / ".digits-dead-1.tfrecord.tmp")  # as a killed writer leaves it
    shutil.copy(source, temp)
    live = str(tmp_path / ".digits-live-2.tfrecord.tmp")  # a writer still writing
    shutil.copy(source, live)
    holder = os.open(live, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        pattern = str(tmp_path / "digits*")
        assert [p for p, _ in log_reader.log_files(pattern)] == [temp]
        candidates, scan = candidates_lib.propose(pattern, 3)
    finally:
        os.close(holder)
        os.unlink(live)
    assert scan.records == 27 and candidates[0].log == temp
    assert candidates[0].request_id.startswith("digits-dead-1-")
    items = label_items.load_items(candidates, log_reader.Scan())
    os.rename(temp, final)  # published meanwhile by the next logger
    data = label_items.original_image(items[0])
    assert hashlib.sha256(data).hexdigest() == items[0].image_sha256
    # Only other models' requests: nothing to offer, every record counted.
    none, scan = candidates_lib.propose(str(tmp_path / "digits*"), 3, model_name="other")
    assert none == [] and scan.skipped["other model"] == 27


def test_candidates_file_round_trip_bounds_and_ids(served_logs, tmp_path):
    candidates, _ = candidates_lib.propose(served_logs, 5)
    path = str(tmp_path / "candidates.jsonl")
    candidates_lib.write_candidates(path, candidates)
    with open(path, "a") as handle:
        handle.write("not json\n")
        handle.write(json.dumps({"log": "x.tfrecord", "index": -1}) + "\n")
        handle.write("x" * (candidates_lib.MAX_LINE_BYTES + 10) + "\n")
        # An id from the file is never used as a name: it is ours, from log and index.
        handle.write(json.dumps({"log": candidates[0].log, "index": 0, "score": 9.0,
                                 "request_id": "../../../etc/passwd",
                                 "reasons": ["<b>atypical</b>"] * 50}) + "\n")
    read, skipped = candidates_lib.read_candidates(path, 4)
    assert len(read) == 4 and read[0].score == 9.0
    assert read[0].request_id == log_reader.request_id(candidates[0].log, 0, 0)
    assert len(read[0].reasons) == candidates_lib.MAX_REASONS
    assert [c.request_id for c in read[1:]] == [c.request_id for c in candidates[:3]]
    assert sum(skipped.values()) == 3, skipped
    assert not os.path.exists(path + ".tmp-%d" % os.getpid())


def test_candidates_run_proposes_from_logs_or_a_file_by_its_config(served_logs, tmp_path):
    """flywheel/candidates.py's run(): the least confident of --logs, or the best of a
    --candidates file, each checked once; neither is one line naming both flags."""
    config = candidates_lib.CandidatesConfig(logs=served_logs, max_candidates=4)
    proposal = candidates_lib.run(config)
    expected, _ = candidates_lib.propose(served_logs, 4)
    assert [c.request_id for c in proposal.candidates] == [c.request_id for c in expected]
    assert proposal.scan.images == 30 and proposal.source.startswith("the 4 least confident")
    path = str(tmp_path / "candidates.jsonl")
    candidates_lib.write_candidates(path, expected)
    from_file = candidates_lib.run(candidates_lib.CandidatesConfig(
        candidates=path, max_candidates=2), exclude={expected[0].request_id})
    assert [c.request_id for c in from_file.candidates] == [
        c.request_id for c in expected[1:3]]
    assert from_file.scan.skipped == {"candidates file: decided before": 1}
    with pytest.raises(errors.UserError, match="give --logs .* or --candidates"):
        candidates_lib.run(candidates_lib.CandidatesConfig())
    for bad in (0, -1, 2 ** 31, 2 ** 63 - 1):
        with pytest.raises(errors.UserError, match="max_candidates"):
            candidates_lib.run(candidates_lib.CandidatesConfig(logs=served_logs,
                                                               max_candidates=bad))


def test_a_candidates_file_drives_the_page(served_logs, digits_model, tmp_path):
    base, _ = digits_model
    candidates, _ = candidates_lib.propose(served_logs, 30)
    chosen = candidates[-4:]  # the four most confident: another scorer's choice
    path = str(tmp_path / "candidates.jsonl")
    candidates_lib.write_candidates(path, chosen + [
        candidates_lib.Candidate(str(tmp_path / "gone.tfrecord"), 0, score=2.0),
        candidates_lib.Candidate(chosen[0].log, 999, score=3.0)])
    page, _, notes = label_session.prepare(config(candidates=path, model_base_path=base,
                                              output_dir=str(tmp_path / "out")))
    assert list(page.items) == [c.request_id for c in chosen]
    for candidate in chosen:  # model, time and top-3 come from the logged record
        shown = page.items[candidate.request_id].candidate
        assert [c for c, _ in shown.top] == [c for c, _ in candidate.top]
        assert [p for _, p in shown.top] == pytest.approx([p for _, p in candidate.top])
        assert shown.model_name == "digits" and shown.model_version == 1
    assert "1 log file gone" in notes[-1] and "1 record not in its log file" in notes[-1]


@pytest.mark.parametrize("name", ["../evil", "a/b", ".hidden", "  ", "x\ny", ".."])
def test_class_names_that_could_leave_the_output_folder_are_refused(name, tmp_path):
    with pytest.raises(errors.UserError):
        label_session.check_classes(["ok", name], "--classes")
    with pytest.raises(errors.UserError):
        label_store.Store(str(tmp_path / "out"), ["ok", name])


def test_the_models_classes_come_from_its_one_labels_reader(tmp_path, monkeypatch):
    """The page names classes by image_classifier.read_model_labels, as bulk inference and
    the canary do: a labels.txt that is not UTF-8, or too large to be one, is refused in
    one line naming it, before anything is offered."""
    version = tmp_path / "models" / "1"
    (version / "assets").mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"")
    labels = version / "assets" / "labels.txt"
    labels.write_text("0:cat\n1:dog\n")
    assert image_classifier.read_model_labels(str(version)) == ["cat", "dog"]
    labels.write_bytes(b"0:cat\n1:\xff\n")
    with pytest.raises(errors.UserError, match="%s is not UTF-8" % labels):
        label_session.prepare(config(candidates=str(tmp_path / "none.jsonl"),
                                     model_base_path=str(tmp_path / "models"),
                                     output_dir=str(tmp_path / "out")))
    monkeypatch.setattr(image_classifier, "MAX_LABELS_BYTES", 8)
    labels.write_text("0:cat\n1:dog\n")
    with pytest.raises(errors.UserError, match="%s is over 8 bytes" % labels):
        image_classifier.read_model_labels(str(version))
    assert not (tmp_path / "out").exists()


def test_request_ids_are_safe_file_names():
    assert log_reader.request_id("/logs/resnet-1-2-00001.tfrecord", 7, 1) == \
        "resnet-1-2-00001-7-1"
    # An abandoned temporary and its published file give the same ids.
    assert log_reader.request_id("/logs/.resnet-1.tfrecord.tmp", 3) == \
        log_reader.request_id("/logs/resnet-1.tfrecord", 3)
    for hostile in ("/logs/../../<script>x.tfrecord", "/l/..", "/l/" + "é" * 300, "/l/.. .tmp"):
        rid = log_reader.request_id(hostile, 1, 2)
        label_store.check_request_id(rid)
        assert "/" not in rid and not rid.startswith(".") and len(rid) <= 120


# --- hostile bytes -----------------------------------------------------------------

@pytest.mark.parametrize("bomb", sorted(image_bombs.BOMBS))
def test_decompression_bombs_are_refused_before_decoding(bomb):
    data = image_bombs.BOMBS[bomb][0]()
    with pytest.raises(thumbnails.NotAnImage):
        thumbnails.thumbnail(data, max_pixels=1_000_000)


def test_thumbnails_are_small_pngs_and_other_bytes_are_not_images():
    for image_format in ("JPEG", "PNG", "GIF", "BMP"):
        png, size, found = thumbnails.thumbnail(
            image_bombs.encode(image_bombs.photo(500, 375), image_format), size=64)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and size == (500, 375) and found == image_format
        assert max(Image.open(io.BytesIO(png)).size) == 64
    for data in (b"", b"<svg onload=alert(1)>", b"<html><script>x</script>", b"\x89PNG\r\n\x1a\n",
                 b"GIF89a" + b"\x00" * 20):
        with pytest.raises(thumbnails.NotAnImage):
            thumbnails.thumbnail(data)


# --- the page ----------------------------------------------------------------------

@pytest.fixture
def labelling(served_logs, digits_model, tmp_path):
    """(page, output folder) of a fresh labelling run on the served logs."""
    base, _ = digits_model
    out = str(tmp_path / "labels")
    page, _, _ = label_session.prepare(config(logs=served_logs, model_base_path=base,
                                          output_dir=out, grid_size=3))
    return page, out


def test_label_none_and_skip_write_a_tree_the_converter_reads(labelling, tmp_path):
    page, out = labelling
    browser = Browser(page)
    html = browser.page()
    shown = cards(html)
    assert len(shown) == 3 and shown == list(page.items)[:3]
    # A click on class 3 of the first image.
    status, headers, _ = decide(browser, html, shown[0], "label:3")
    assert status == 303 and headers["Location"].startswith("/?")
    item = page.items[shown[0]]
    written = os.path.join(out, "3", "%s.%s" % (shown[0], item.extension))
    with open(written, "rb") as handle:
        data = handle.read()
    assert data == label_items.original_image(item)  # the logged bytes, as served
    assert hashlib.sha256(data).hexdigest() == item.image_sha256
    html = browser.page()
    assert shown[0] not in cards(html) and "1 labelled" in html
    assert decide(browser, html, shown[1], "none")[0] == 303
    assert decide(browser, browser.page(), shown[2], "skip")[0] == 303
    records = provenance(out)
    assert [(r["request_id"], r["decision"], r["label"]) for r in records] == [
        (shown[0], "label", 3), (shown[1], "none", None), (shown[2], "skip", None)]
    first = records[0]
    assert first["class"] == "3" and first["file"] == os.path.join(
        "3", os.path.basename(written))
    assert first["model"] == {"name": "digits", "version": 1}
    assert first["log"] == item.candidate.log and first["index"] == item.candidate.index
    assert first["labeller"] and first["time"].endswith("Z") and len(first["top3"]) == 3
    assert first["top3"][0]["probability"] == pytest.approx(item.candidate.top[0][1], abs=1e-5)
    html = browser.page()
    assert not set(shown) & set(cards(html))  # decided images are not offered again
    # Ready for slimserve-convert: one class folder with the labelled image.
    items, skipped, _ = dataset.scan_folder(out)
    assert [(os.path.basename(i.path), i.label) for i in items] == [
        (os.path.basename(written), "3")]
    assert sorted(os.path.basename(s["path"]) for s in skipped) == [
        label_store.CLAIMS_FILE, label_store.PROVENANCE_FILE]


def test_keys_and_escaping_on_the_page(labelling):
    page, _ = labelling
    html = Browser(page).page()
    assert '<script src="/app.js" defer></script>' in html and html.count("<script") == 1
    card = html[html.index('<article class="card'):]
    assert 'data-key="1"' in card and 'value="label:0"' in card  # class 0 is key 1
    assert 'data-key="n"' in card and 'data-key="s"' in card
    assert label_page.CLASS_KEYS[:10] == "123456789a"


def test_resume_offers_what_is_left_and_counts_what_was_done(labelling, served_logs,
                                                              digits_model):
    page, out = labelling
    browser = Browser(page)
    html = browser.page()
    first = cards(html)
    for rid, choice in zip(first, ("label:1", "skip")):
        assert decide(browser, browser.page(), rid, choice)[0] == 303
    held = cards(browser.page())  # the first session's images, still claimed
    base, _ = digits_model
    again, _, notes = label_session.prepare(config(logs=served_logs, model_base_path=base,
                                               output_dir=out, grid_size=3))
    assert not set(first[:2]) & set(again.items)
    assert len(again.items) == 28 and any("Resumed: 2 decision(s)" in n for n in notes)
    html = Browser(again).page()
    assert "1 labelled" in html and "1 skipped" in html
    # The first session (this process, alive) keeps its images a while; the claims of a
    # page process that died are void (tests/test_label_browser.py restarts one).
    assert cards(html)[0] == [rid for rid in again.items if rid not in held][0]


def test_two_labellers_never_lose_or_double_a_label(labelling, served_logs, digits_model):
    page, out = labelling
    base, _ = digits_model
    # A second page process on the same folder (its own Store, its own lock file handle).
    other, _, _ = label_session.prepare(config(logs=served_logs, model_base_path=base,
                                           output_dir=out, grid_size=3))
    alice, bob, carol = Browser(page), Browser(page), Browser(other)
    pages = [alice.page(), bob.page(), carol.page()]
    shown = [cards(html) for html in pages]
    assert all(len(s) == 3 for s in shown)
    assert len(set(shown[0]) | set(shown[1]) | set(shown[2])) == 9  # claims: disjoint
    # Now everyone races to decide the same images (stale pages, forged posts): threads
    # on both pages, each image decided by several labellers with different answers.
    targets = list(page.items)[:12]
    browsers = [(alice, pages[0]), (bob, pages[1]), (carol, pages[2])]
    answers = []
    lock = threading.Lock()

    def attempt(job):
        (browser, html), rid, choice = job
        status = decide(browser, html, rid, choice)[0]
        with lock:
            answers.append((rid, status))

    jobs = [(browsers[(i + k) % 3], rid, "label:%d" % ((i + k) % 10))
            for i, rid in enumerate(targets) for k in range(3)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=9) as pool:
        list(pool.map(attempt, jobs))
    records = provenance(out)
    decided = [r["request_id"] for r in records]
    assert sorted(decided) == sorted(targets)  # each image exactly once
    for rid in targets:
        statuses = sorted(s for r, s in answers if r == rid)
        assert statuses == [303, 409, 409], (rid, statuses)
    files = [os.path.join(d, f) for d in CLASSES if os.path.isdir(os.path.join(out, d))
             for f in os.listdir(os.path.join(out, d))]
    assert len(files) == 12 and not any(os.path.basename(f).startswith(".") for f in files)
    for record in records:  # the tree and the provenance agree
        assert os.path.exists(os.path.join(out, record["file"]))
    # A later decision is told who won (the winner's own repeat is a no-op).
    again = [decide(browser, html, targets[0], "none") for browser, html in browsers]
    assert sorted(status for status, _, _ in again) == [303, 409, 409]
    for status, _, body in again:
        assert status == 303 or b"already decided" in body and b" was labelled " in body
    assert len(provenance(out)) == 12


def test_crash_leftovers_are_repaired_and_disk_errors_leave_nothing(labelling, tmp_path):
    page, out = labelling
    rids = list(page.items)
    # What a kill -9 can leave: an image written but never committed, a temporary, and a
    # torn last provenance line.
    os.makedirs(os.path.join(out, "4"))
    orphan = os.path.join(out, "4", rids[0] + ".png")
    open(orphan, "wb").write(b"uncommitted")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    temp = os.path.join(out, "4", ".%s.png.tmp-%d-abcd" % (rids[0], dead.pid))
    open(temp, "wb").write(b"half")
    with open(os.path.join(out, label_store.PROVENANCE_FILE), "ab") as handle:
        handle.write(b'{"request_id": "x", "decis')
    store = label_store.Store(out, CLASSES)
    assert store.clean_orphans(set(rids)) == 2 and os.listdir(os.path.join(out, "4")) == []
    assert store.decided == {}
    browser = Browser(page)
    assert decide(browser, browser.page(), rids[0], "label:5")[0] == 303
    records = provenance(out)  # the torn line was cut before the append
    assert [r["request_id"] for r in records] == [rids[0]]
    # A write the disk refuses (RLIMIT_FSIZE: a real EFBIG) leaves no file and no line.
    script = r"""
import os, resource, signal, sys
from slimserve.flywheel.labelling import store as label_store
out, limit = sys.argv[1], int(sys.argv[2])
store = label_store.Store(out, [str(d) for d in range(10)])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
record = {"request_id": "big-0-0", "decision": "label", "label": 7}
try:
    store.decide(record, b"\x89PNG" + b"x" * 100, "png")
except label_store.errors.UserError as error:
    print("refused:", error)
"""
    size = os.path.getsize(os.path.join(out, label_store.PROVENANCE_FILE))
    for limit in (50, size + 20):  # the image fails; the image fits but the line fails
        result = subprocess.run([sys.executable, "-c", script, out, str(limit)], cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        assert "refused:" in result.stdout and "File too large" in result.stdout, result
        assert not os.path.isdir(os.path.join(out, "7")) or os.listdir(
            os.path.join(out, "7")) == []
        assert os.path.getsize(os.path.join(out, label_store.PROVENANCE_FILE)) == size


def test_hostile_logs_are_escaped_counted_and_never_served_raw(served_logs, digits_model,
                                                                tmp_path):
    base, held_out = digits_model
    good = next(open(p, "rb").read() for p, _ in held_out if p.endswith(".jpg"))
    pattern = write_hostile_logs(str(tmp_path / "hostile"), good)
    page, _, notes = label_session.prepare(config(logs=pattern, model_base_path=base,
                                              output_dir=str(tmp_path / "out")))
    assert len(page.items) == 1  # the good image; the bomb and the HTML are not shown
    text = " ".join(notes)
    assert "damaged log file" in text and "malformed record" in text
    assert "image not shown (decompression bomb" in text or "image not shown (header" in text
    assert "not a JPEG, PNG, GIF or BMP" in text
    browser = Browser(page)
    browser.page()  # the session cookie
    status, headers, body = browser.call("GET", "/")
    html = body.decode()
    assert status == 200 and html.count("<script") == 1 and "<img src=x" not in html
    assert html_lib.escape(HOSTILE_MODEL) in html  # the model name, as text
    assert "&lt;img src=x onerror=&quot;window.canary=2&quot;&gt;" in html
    assert "onerror=\"" not in html
    for name, value in label_page.SECURITY_HEADERS:
        assert headers[name] == value
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    rid = cards(html)[0]
    status, headers, body = browser.call("GET", "/image/%s.png" % rid)
    assert status == 200 and headers["Content-Type"] == "image/png"
    assert headers["X-Content-Type-Options"] == "nosniff" and body[:8] == b"\x89PNG\r\n\x1a\n"
    assert body != good  # the logged JPEG re-encoded, never served as it was
    # The hostile class names of the responses are only text: classes come from labels.txt.
    assert HOSTILE_CLASS not in html and page.classes == CLASSES
    # Classes from the logged responses alone: a name that cannot be a folder is refused.
    with pytest.raises(errors.UserError, match="class name"):
        label_session.prepare(config(logs=pattern, output_dir=str(tmp_path / "out2")))
    assert decide(browser, html, rid, "label:2")[0] == 303


def test_requests_are_bounded_and_need_the_session(labelling):
    page, _ = labelling
    browser = Browser(page)
    html = browser.page()
    rid = cards(html)[0]
    form = urllib.parse.urlencode({"token": token(html), "request_id": rid,
                                   "choice": "skip"}).encode()
    assert browser.call("POST", "/decide", form, "application/x-www-form-urlencoded",
                        length=label_page.MAX_BODY_BYTES + 1)[0] == 413
    assert browser.call("POST", "/decide", form, "text/plain")[0] == 415
    assert browser.call("POST", "/decide", b"\xff\xfe=\xff", "application/x-www-form-urlencoded"
                        )[0] in (400, 403)
    assert browser.post("/decide", token="forged", request_id=rid, choice="skip")[0] == 403
    stranger = Browser(page)  # another browser without this session's cookie
    assert stranger.post("/decide", token=token(html), request_id=rid, choice="skip")[0] == 403
    page.allowed_hosts = label_page.allowed_hosts("127.0.0.1", 8502)  # as the command sets
    assert browser.call("GET", "/", host="evil.example:8502")[0] == 421  # DNS rebinding
    assert browser.call("GET", "/", host="localhost:8502")[0] == 200
    assert browser.post("/decide", token=token(html), request_id="../../x",
                        choice="label:1")[0] == 404
    assert browser.post("/decide", token=token(html), request_id=rid,
                        choice="label:99")[0] == 400
    assert browser.call("GET", "/image/../../etc/passwd.png")[0] == 404
    assert browser.call("GET", "/decide")[0] == 405
    assert browser.call("GET", "/example/0/0.png")[0] == 404  # no examples given
    assert page.store.counts() == {"label": 0, "none": 0, "skip": 0}


def test_probes_and_cookieless_gets_hold_no_image(labelling):
    """Two HEAD requests and a GET from a client that keeps no cookie (a health checker,
    a link preview) claim nothing: the first real labellers get the best images."""
    page, _ = labelling
    for _ in range(2):
        status, headers, body = Browser(page).call("HEAD", "/")
        assert status == 200 and body == b"" and "Set-Cookie" not in headers
    status, headers, _ = Browser(page).call("GET", "/?view=grid")
    assert status == 303 and headers["Set-Cookie"].startswith(label_page.COOKIE + "=")
    assert "view=grid" in headers["Location"]
    status, headers, body = Browser(page).call("GET", headers["Location"])  # no cookie kept
    assert status == 200 and cards(body.decode()) == [] and b"Start labelling" in body
    forged = Browser(page)  # a cookie this page never issued is no session either
    forged.cookie = "%s=made-up.0123" % label_page.COOKIE
    assert forged.call("GET", "/")[0] == 303
    assert not any(page.store.holder(rid) for rid in page.items)
    alice, bob = Browser(page), Browser(page)
    assert cards(alice.page()) == list(page.items)[:3]
    assert cards(bob.page()) == list(page.items)[3:6]
    assert cards(alice.page()) == list(page.items)[:3]  # the same session, the same images


def test_class_examples_from_the_reference_or_a_class_tree(digits_model, digits_dir,
                                                            tmp_path):
    base, _ = digits_model
    version = os.path.join(base, "1")
    examples, source, _ = label_items.load_examples(CLASSES, version, digits_dir, 2)
    assert source == digits_dir and all(len(examples[i]) == 2 for i in range(10))
    reference = tmp_path / "v" / label_items.REFERENCE_EXAMPLES
    reference.mkdir(parents=True)
    for name, data in (("0_0.png", image_bombs.encode(image_bombs.circle(40, 40), "PNG")),
                       ("0_1.png", image_bombs.png_bomb()), ("1_0.png", b"<script>"),
                       ("12_0.png", image_bombs.encode(image_bombs.circle(40, 40), "PNG")),
                       ("../x.png", None)):
        if data is not None:
            (reference / name).write_bytes(data)
    examples, source, skipped = label_items.load_examples(
        CLASSES, str(tmp_path / "v"), digits_dir, 3)
    assert source.endswith("examples") and len(examples[0]) == 1 and examples[1] == []
    assert 12 not in examples and skipped["example not shown"] == 2


def test_command_line_help_and_one_line_errors(served_logs, tmp_path):
    text = help_text("slimserve.cli.label")
    for flag in ("--logs", "--candidates", "--output_dir", "--labeller", "--model_base_path",
                 "--examples_dir", "--max_candidates", "--port", "--claim_seconds"):
        assert flag in text
    result = run_command("slimserve.cli.label", "--output_dir", tmp_path / "o")
    assert result.code == 1 and result.stderr.strip() == (
        "slimserve-label: give --logs (images proposed from request logs) or --candidates "
        "(a file naming them)")
    result = run_command("slimserve.cli.label", "--output_dir", tmp_path / "o",
                         "--logs", tmp_path / "nothing*")
    assert result.code == 1 and "no request log files match" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = run_command("slimserve.cli.label", "--output_dir", tmp_path / "o", "--noprogress",
                         "--logs", served_logs, "--model_base_path", tmp_path / "no-model")
    assert result.code == 1 and "--model_base_path" in result.stderr
    result = run_command("slimserve.cli.label", "--output_dir", tmp_path / "o",
                         "--noprogress", "--logs", served_logs, "--max_candidates", 0)
    assert result.code == 1 and "--max_candidates" in result.output
