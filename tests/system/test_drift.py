"""Drift detection: the statistics on real digits embeddings (known shifts detected, no
shift flagged at most at the stated rate), the streaming reader over real request logs,
slimserve-drift's command-line contract (one line per statistic, `drift: yes|no` last,
exit 0 either way and 1 on an error, report.json's keys), its candidates for the
labelling page, and its files whole or absent on a full disk or a kill -9."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from slimserve.flywheel import candidates as candidates_lib
from slimserve.flywheel import drift as flywheel_drift
from slimserve.serving.config import model_config
from slimserve.serving.core import manager as manager_lib
from slimserve.serving.observability import drift
from slimserve.serving.observability import drift_monitor
from slimserve.serving.observability import drift_pipeline
from slimserve.serving.observability import image_stats
from slimserve.serving.observability import log_reader
from slimserve.serving.observability import reference as reference_lib
from slimserve.serving.observability import request_logs as request_logs_lib
from slimserve.serving.observability import status_page
from slimserve.testing import digits_traffic
from slimserve.testing.commands import run_command
from tests.drift_fixtures import (MODEL, SHIFTED, UNSHIFTED, drift_logs,  # noqa: F401
                                  drift_model, drift_parts, traffic_images,
                                  write_claiming_record, write_damaged_file,
                                  write_foreign_records)
from tests.helpers import ROOT

WINDOW = 60


@pytest.fixture(scope="module")
def measured(drift_model, traffic_images):
    """(Prepared reference, VersionModel, features of the traffic images and of the same
    images inverted, thickened and rotated: {kind: Window of every image})."""
    version_dir = os.path.join(drift_model, "1")
    reference = reference_lib.read(version_dir)
    model = drift_pipeline.VersionModel(version_dir)

    def window(images):
        return drift.Window(model.probabilities(images),
                            np.stack([image_stats.statistics(i) for i in images]),
                            model.embeddings(images))

    plain = [data for data, _ in traffic_images]
    windows = {"none": window(plain)}
    for kind in ("invert", "thick", "rotate"):
        windows[kind] = window([digits_traffic.shift(data, kind) for data in plain[:WINDOW]])
    model.close()
    return reference, windows


def _rows(window, rows):
    return drift.Window(window.probabilities[rows], window.image_stats[rows],
                        window.embeddings[rows])


def test_known_shifts_are_detected_by_the_statistics_that_see_them(measured):
    reference, windows = measured
    prepared = drift.Prepared(reference, drift.DriftOptions(window_size=WINDOW))
    for kind in ("invert", "thick", "rotate"):
        result = prepared.evaluate(windows[kind])
        assert result.drift, kind
        assert result.statistics["embeddings"].drift, kind
        assert result.statistics["embeddings"].p_value <= result.statistics["embeddings"].level
    inverted = prepared.evaluate(windows["invert"]).statistics["image_stats"]
    assert inverted.drift and inverted.detail.startswith("brightness")
    # Traffic of two classes only: the predicted classes' shares move.
    plain = windows["none"]
    few = np.flatnonzero(plain.probabilities.argmax(axis=1) < 2)[:WINDOW]
    prior = prepared.evaluate(_rows(plain, few)).statistics["class_prior"]
    assert prior.drift and prior.value > 0.5


def test_no_shift_is_flagged_at_most_at_the_stated_rate(measured):
    """Windows of held-out digits (never fitted, never in the reference): alpha is 5% per
    window; 40 seeded windows may exceed it by chance only a little."""
    reference, windows = measured
    plain = windows["none"]
    options = drift.DriftOptions(window_size=WINDOW, alpha=0.05, permutations=200)
    prepared = drift.Prepared(reference, options)
    rng = np.random.RandomState(1)
    flagged, p_values = 0, []
    for _ in range(40):
        result = prepared.evaluate(_rows(plain, rng.choice(plain.size, WINDOW, replace=False)))
        flagged += result.drift
        p_values += [s.p_value for s in result.statistics.values()]
    assert flagged <= 4, "%d of 40 windows flagged" % flagged
    assert set(drift.STATISTICS) == set(result.statistics)
    assert 0.3 < np.median(p_values) < 0.7  # p-values of a true null spread over (0, 1]


def test_thresholds_hold_their_level_on_a_null_of_known_distribution():
    """Reference and windows from one distribution: each statistic flags about its level."""
    rng = np.random.RandomState(0)
    size = 200
    probabilities = rng.dirichlet(np.ones(4), size)
    reference = reference_lib.Reference(["a", "b", "c", "d"], probabilities,
                                        rng.normal(size=(size, 5)), None,
                                        rng.normal(size=(size, 8)))
    options = drift.DriftOptions(window_size=40, alpha=0.2, permutations=99)
    prepared = drift.Prepared(reference, options)
    counts = dict.fromkeys(drift.STATISTICS, 0)
    trials = 60
    for _ in range(trials):
        window = drift.Window(rng.dirichlet(np.ones(4), 40), rng.normal(size=(40, 5)),
                              rng.normal(size=(40, 8)))
        for name, stat in prepared.evaluate(window).statistics.items():
            counts[name] += stat.drift
            assert stat.drift == (stat.value > stat.threshold) == (stat.p_value <= stat.level)
    for name, count in counts.items():  # level 0.05 each: 3 expected of 60
        assert count <= 9, (name, count)


def test_too_few_permutations_for_the_level_are_refused():
    with pytest.raises(Exception, match="--permutations=20 cannot reach"):
        drift.DriftOptions(alpha=0.05, permutations=20).validate()


def test_the_reader_streams_windows_of_logged_traffic(drift_model, drift_logs):
    """serving's drift pipeline (what the server's monitor runs) over real logs, with the
    flywheel's candidate scorer observing the images on the way."""
    selection = drift_pipeline.select(drift_logs["shifted"])
    assert (selection.model, selection.version) == (MODEL, 1)
    assert selection.images == UNSHIFTED + SHIFTED and len(selection.files) == 1
    version_dir = os.path.join(drift_model, "1")
    reference = reference_lib.read(version_dir)
    model = drift_pipeline.VersionModel(version_dir)
    options = drift.DriftOptions(window_size=WINDOW)
    prepared = drift.Prepared(reference, options)
    scorer = flywheel_drift.CandidateScorer(prepared.embeddings, reference.class_names,
                                            max_candidates=20, max_thumbnails=5)
    outcome = drift_pipeline.run(selection, prepared, options, model,
                                 max_images=selection.images - 40, max_windows=4,
                                 observer=scorer)
    model.close()
    found, atypical = scorer.found()
    read = UNSHIFTED + SHIFTED - 40
    assert outcome.images == read and outcome.evaluated == read // WINDOW
    assert len(outcome.windows) == 4  # only the newest kept
    assert outcome.windows[-1].last == read - 1
    assert outcome.drift and not outcome.windows[0].result.drift
    first, earlier = outcome.since()  # the first window holding shifted images
    assert first.first == (UNSHIFTED - 40) // WINDOW * WINDOW and not earlier
    assert outcome.verdict() is True and outcome.not_computed() == []
    assert len(found) == 20 and len(atypical) == 5
    # The most atypical are the inverted ones (logged after the first UNSHIFTED).
    assert all(c.index >= UNSHIFTED for c, _ in atypical)
    assert all(png.startswith(b"\x89PNG") for _, png in atypical)


def _drift(*args):
    return run_command("slimserve.cli.drift", "--noprogress", "--window_size", WINDOW, *args)


def test_cli_says_drift_yes_on_shifted_traffic_with_report_and_candidates(
        drift_model, drift_logs, tmp_path):
    result = _drift("--logs", drift_logs["shifted"], "--model_base_path", drift_model,
                    "--output_dir", tmp_path / "out", "--max_candidates", 50)
    assert result.code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == list(drift.STATISTICS) + ["drift"]
    assert lines[-1] == "drift: yes"
    assert "embeddings: " in lines[3] and "DRIFT" in lines[3] and "threshold" in lines[3]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["drift"] is True
    assert set(report["statistics"]) == set(drift.STATISTICS)
    for stat in report["statistics"].values():
        assert {"value", "threshold", "p_value", "level", "drift"} <= set(stat)
    assert report["model_name"] == MODEL and report["model_version"] == 1
    assert report["since"]["first_image"] >= UNSHIFTED - WINDOW
    assert report["windows_evaluated"] == (UNSHIFTED + SHIFTED) // WINDOW
    html = (tmp_path / "out" / "report.html").read_text()
    assert "drift: yes" in html and "data:image/png;base64," in html and "<script" not in html
    candidates, skipped = candidates_lib.read_candidates(
        str(tmp_path / "out" / "candidates.jsonl"), 100)
    assert len(candidates) == 50 and not skipped
    assert sum(c.index >= UNSHIFTED for c in candidates) >= 45  # the shifted ones first
    assert any("atypical" in reason for reason in candidates[0].reasons)


def test_cli_says_drift_no_on_held_out_traffic(drift_model, drift_logs, tmp_path):
    result = _drift("--logs", drift_logs["unshifted"], "--model_base_path", drift_model,
                    "--output_dir", tmp_path)
    assert result.code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == "drift: no"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["drift"] is False and report["since"] is None


def test_a_version_without_reference_serves_and_drift_says_so(drift_model, drift_logs,
                                                               tmp_path):
    import shutil  # pylint: disable=import-outside-toplevel
    base = tmp_path / "old"
    shutil.copytree(drift_model, base)
    shutil.rmtree(reference_lib.directory(str(base / "1")))
    result = _drift("--logs", drift_logs["unshifted"], "--model_base_path", base,
                    "--output_dir", tmp_path / "out")
    # Nothing could be computed: no evidence of no drift, so it cannot say "no".
    assert result.code == 1, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "drift: unknown" and len(lines) == 5
    assert all("has no reference" in line for line in lines[:4])
    assert result.stderr.strip().splitlines()[-1].startswith(
        "slimserve-drift: could not tell whether the traffic drifts: class_prior not "
        "computed (version 1 has no reference")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["drift"] is None and report["reference"] is None


@pytest.mark.parametrize("args, message", [
    (["--logs", "{missing}/*"], "no request log files match"),
    (["--model_version", "7"], "--model_version 7: no image prediction"),
    (["--compare_version", "9"], "--compare_version: --model_base_path"),
    (["--permutations", "30"], "--permutations=30 cannot reach"),
])
def test_cli_errors_are_one_line_and_exit_1(drift_model, drift_logs, tmp_path, args,
                                             message):
    base = ["--logs", drift_logs["unshifted"], "--model_base_path", drift_model]
    args = [a.format(missing=tmp_path) for a in args]
    result = _drift(*(base + args))
    assert result.code == 1, result.output
    assert message in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("slimserve-drift: ")
    assert "Traceback" not in result.output


_LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
from slimserve.cli import drift
sys.argv = ["slimserve-drift"] + sys.argv[1:]
drift.run()
"""

_KILLED = """
import json, os, signal, sys
real_dump = json.dump
def dump(obj, handle, **kwargs):  # dies half way through writing report.json
    handle.write(json.dumps(obj)[:100]); handle.flush()
    os.kill(os.getpid(), signal.SIGKILL)
json.dump = dump
from slimserve.cli import drift
sys.argv = ["slimserve-drift"] + sys.argv[1:]
drift.run()
"""


@pytest.mark.parametrize("script, code", [(_LIMITED, 1), (_KILLED, -signal.SIGKILL)])
def test_report_files_are_whole_or_absent_on_a_full_disk_or_a_kill(
        drift_model, drift_logs, tmp_path, script, code):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text('{"drift": false, "previous": true}\n')
    process = subprocess.run(
        [sys.executable, "-c", script, "--logs", drift_logs["shifted"], "--model_base_path",
         drift_model, "--output_dir", str(out), "--window_size", str(WINDOW),
         "--noprogress"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert process.returncode == code, process.stderr[-3000:]
    if code == 1:
        assert process.stderr.strip().splitlines()[-1].startswith("slimserve-drift: ")
        assert "File too large" in process.stderr and "Traceback" not in process.stderr
    assert json.loads((out / "report.json").read_text()) == {"drift": False, "previous": True}
    for name in os.listdir(out):  # anything else is whole: never a torn file under its name
        if name.startswith("."):
            continue
        if name.endswith(".json"):
            json.loads((out / name).read_text())
        elif name.endswith(".jsonl"):
            for line in (out / name).read_text().splitlines():
                json.loads(line)
        elif name.endswith(".html"):
            assert (out / name).read_text().rstrip().endswith("</html>")


def test_the_server_checks_its_own_logs_status_page_and_gauges(drift_model, traffic_images,
                                                              tmp_path):
    """An in-process server with request logging: on demand (the monitor's thread, as
    SIGUSR2 asks it), it tests its own logged traffic; the status page and the Prometheus
    gauges show the result per model and version."""
    import urllib.request  # pylint: disable=import-outside-toplevel
    from slimserve.serving.observability import metrics  # pylint: disable=import-outside-toplevel
    from slimserve.serving.clients import client as client_lib  # pylint: disable=import-outside-toplevel
    from slimserve.testing.servers import serve_in_process, wait_until  # pylint: disable=import-outside-toplevel
    prefix = str(tmp_path / "logs" / MODEL)
    server = serve_in_process(
        [model_config.ServedModel(MODEL, drift_model,
                                  logging_config=digits_traffic.logging_config(prefix))],
        enable_model_warmup=False, drift_check_interval_seconds=0, drift_window_size=WINDOW,
        drift_max_images=2 * WINDOW, status_page=True)
    try:
        page = lambda: urllib.request.urlopen(  # noqa: E731
            "http://127.0.0.1:%d/" % server.rest_api_port, timeout=30).read().decode()
        assert "not checked yet" in page()
        client = client_lib.Client("127.0.0.1:%d" % server.port, model_name=MODEL, retries=0)
        for data, _ in traffic_images[:2 * WINDOW]:
            client.predict_images([data])
        assert server.check_drift()[(MODEL, 1)].drift is False
        for data, _ in traffic_images[2 * WINDOW:3 * WINDOW]:
            client.predict_images([digits_traffic.shift(data, "invert")])
        client.close()
        server.check_drift(wait=False)  # what SIGUSR2 does
        result = wait_until(lambda: server.drift.results()[(MODEL, 1)].drift, 120, 0.1,
                            "the monitor's check")
        assert result is True
        latest = server.drift.results()[(MODEL, 1)]
        assert latest.images == 2 * WINDOW and latest.statistics["embeddings"].drift
        html = page()
        assert '<table id="drift">' in html and '<td class="drift">yes</td>' in html
        families = metrics.families_from_text(server.metrics.render())
        gauge = families[drift_monitor.DRIFT]
        assert [(s.labels, s.value) for s in gauge.samples] == [
            ({"model_name": MODEL, "model_version": "1"}, 1.0)]
        thresholds = families[drift_monitor.DRIFT_THRESHOLD].samples
        assert sorted(s.labels["statistic"] for s in thresholds) == sorted(drift.STATISTICS)
    finally:
        server.stop()


def test_the_monitor_says_unknown_when_a_statistic_is_not_computed(drift_model, drift_logs,
                                                                   tmp_path):
    """A version whose reference has no embeddings: the embeddings statistic cannot be
    computed, so the server's monitor may not say "no drift" (as slimserve-drift says
    `unknown` and exits 1): drift None, the note names the statistic, no drift gauge, and
    the status page says unknown beside the statistics it computed."""
    base = tmp_path / "model"
    shutil.copytree(drift_model, base)
    reference = reference_lib.read(str(base / "1"))
    reference.embeddings = None
    shutil.rmtree(reference_lib.directory(str(base / "1")))
    reference_lib.write(str(base / "1"), reference)
    logs = tmp_path / "logs"
    logs.mkdir()
    for path in glob.glob(drift_logs["unshifted"]):
        shutil.copy(path, logs)
    manager = manager_lib.ModelManager([model_config.ServedModel(MODEL, str(base))],
                                       manager_lib.ManagerOptions(warmup=False))
    manager.poll()
    loggers = request_logs_lib.RequestLogs()
    loggers.apply({MODEL: (str(logs / MODEL), 1.0)}, from_operator=True)
    monitor = drift_monitor.DriftMonitor(
        manager, loggers, drift_monitor.MonitorOptions(max_images=2 * WINDOW),
        drift.DriftOptions(window_size=WINDOW))
    try:
        result = monitor.check_now()[(MODEL, 1)]
    finally:
        loggers.close()
        manager.stop()
    assert result.images == 2 * WINDOW
    assert result.drift is None, result
    assert result.note == "unknown: embeddings not computed (the reference has no embeddings)"
    assert sorted(result.statistics) == sorted(set(drift.STATISTICS) - {"embeddings"})
    samples = {family.name: family.samples for family in monitor.families()}
    assert samples[drift_monitor.DRIFT] == []
    assert len(samples[drift_monitor.DRIFT_STATISTIC]) == 3
    page = status_page.render({}, {}, drift=monitor.results())
    assert ">unknown</td>" in page and "embeddings not computed" in page


def test_the_distances_are_the_textbook_ones():
    """KS as scipy computes it (ties included), total variation, and the biased MMD^2."""
    from scipy import stats  # pylint: disable=import-outside-toplevel
    rng = np.random.RandomState(3)
    values = np.round(rng.normal(size=90), 1)  # many ties
    masks = np.zeros((1, 90), bool)
    masks[0, 60:] = True
    assert drift._ks_many(values, masks)[0] == pytest.approx(  # pylint: disable=protected-access
        stats.ks_2samp(values[:60], values[60:]).statistic)
    classes = rng.randint(0, 4, 90)
    shares = [np.bincount(part, minlength=4) / len(part) for part in (classes[:60],
                                                                      classes[60:])]
    assert drift._tv_many(classes, 4, masks)[0] == pytest.approx(  # pylint: disable=protected-access
        0.5 * np.abs(shares[0] - shares[1]).sum())
    points = rng.normal(size=(90, 3))
    kernel = np.exp(-drift._sq_distances(points, points))  # pylint: disable=protected-access
    x, y = slice(60, 90), slice(0, 60)
    expected = kernel[x, x].mean() + kernel[y, y].mean() - 2 * kernel[x, y].mean()
    assert drift._mmd_many(kernel, masks)[0] == pytest.approx(expected)  # pylint: disable=protected-access


def test_atypical_and_disagreement_scorers_rank_the_shifted_images(drift_model, drift_logs,
                                                                   tmp_path):
    """The labelling page's scorers on logged images: the most atypical images against the
    reference, and where two versions disagree, are the shifted ones."""
    version_dir = os.path.join(drift_model, "1")
    reference = reference_lib.read(version_dir)
    model = drift_pipeline.VersionModel(version_dir)
    try:
        atypical = candidates_lib.Atypical(reference.embeddings, embed=model.embeddings)
        # typical reference images score about 0.5, the shifted ones near 1
        own = atypical.score_embeddings(reference.embeddings[:50])
        assert 0.3 < np.median([s for s, _ in own]) < 0.6
        found, scan = candidates_lib.propose(drift_logs["shifted"], 20, scorers=[atypical])
        assert scan.images == UNSHIFTED + SHIFTED
        assert all(c.index >= UNSHIFTED for c in found)
        assert found[0].score > 0.7 and found[0].reasons[0].startswith("atypical: ")
        # A second version that also reads light-on-dark digits (it turns dark images
        # over first): it agrees with version 1 on upright digits, not on inverted ones.
        other = drift_pipeline.VersionModel(version_dir)

        def robust(images):
            return other.probabilities([
                digits_traffic.shift(i, "invert") if image_stats.statistics(i)[3] < 0.5
                else i for i in images])

        disagreement = candidates_lib.Disagreement(robust, 2, reference.class_names)
        found, _ = candidates_lib.propose(drift_logs["shifted"], 20,
                                            scorers=[disagreement])
        other.close()
        assert sum(c.index >= UNSHIFTED for c in found) == 20
        assert any("versions disagree" in c.reasons[0] for c in found)
    finally:
        model.close()


def test_slimserve_label_offers_drifts_candidates_with_the_reference_examples(
        drift_model, drift_logs, tmp_path):
    from slimserve.flywheel.labelling import session  # pylint: disable=import-outside-toplevel
    from slimserve import fields  # pylint: disable=import-outside-toplevel
    result = _drift("--logs", drift_logs["shifted"], "--model_base_path", drift_model,
                    "--output_dir", tmp_path / "drift", "--max_candidates", 30)
    assert result.code == 0, result.output
    page, _, notes = session.prepare(fields.check(session.LabelConfig(
        source=candidates_lib.CandidatesConfig(
            candidates=str(tmp_path / "drift" / "candidates.jsonl")),
        output_dir=str(tmp_path / "labels"), model_base_path=drift_model, progress=False)))
    assert len(page.items) == 30
    assert any("atypical" in reason for item in page.items.values()
               for reason in item.candidate.reasons)
    assert "assets.extra/reference/examples" in notes[2]
    assert sorted(page.examples) == list(range(10))
    assert all(len(shown) == 3 for shown in page.examples.values())


def test_another_programs_tfrecords_among_the_logs_are_named_skips(drift_model, drift_logs,
                                                                    tmp_path):
    """slimserve-drift, -label and -compare read request logs through one reader: a file
    of tf.Example records and one of text records matched by --logs are each counted and
    named, never a traceback; with nothing else to read, one line names them."""
    from slimserve import fields  # pylint: disable=import-outside-toplevel
    from slimserve.flywheel.labelling import session  # pylint: disable=import-outside-toplevel
    logs = tmp_path / "logs"
    logs.mkdir()
    for path in glob.glob(drift_logs["unshifted"]):
        shutil.copy(path, logs)
    foreign = write_foreign_records(str(logs), MODEL)
    pattern = str(logs / (MODEL + "*"))
    result = _drift("--logs", pattern, "--model_base_path", drift_model, "--output_dir",
                    tmp_path / "drift")
    assert result.code == 0 and "Traceback" not in result.output, result.output
    report = json.loads((tmp_path / "drift" / "report.json").read_text())
    assert report["images"] == UNSHIFTED
    assert report["skipped"][log_reader.FOREIGN] == 2
    assert sorted(f["log"] for f in report["skipped_files"]) == sorted(foreign)
    page, _, notes = session.prepare(fields.check(session.LabelConfig(
        source=candidates_lib.CandidatesConfig(logs=pattern), output_dir=str(tmp_path / "labels"), model_base_path=drift_model,
        progress=False)))
    assert page.items and "2 %s" % log_reader.FOREIGN in " ".join(notes)
    compare = ["--baseline", drift_model, "--candidate", drift_model]
    result = run_command("slimserve.cli.compare", "--logs", pattern, *compare,
                         "--noprogress", "--json_output", tmp_path / "canary.json")
    assert result.code == 0 and "Traceback" not in result.output, result.output
    canary = json.loads((tmp_path / "canary.json").read_text())
    assert canary["requests"] == UNSHIFTED and canary["agreement"] == 1.0
    assert sorted(f["log"] for f in canary["skipped_logs"]["files"]) == sorted(foreign)
    assert "not replayed: " in result.stdout and foreign[1] in result.stdout
    for command, args in (("slimserve.cli.compare", compare),
                          ("slimserve.cli.drift", ["--model_base_path", drift_model])):
        result = run_command(command, "--logs", str(logs / (MODEL + "-zz-*")), *args,
                             "--noprogress")
        assert result.code == 1 and "Traceback" not in result.output, result.output
        last = result.stderr.strip().splitlines()[-1]
        assert all(path in last for path in foreign), last


def test_a_record_claiming_2_to_the_40_images_and_a_damaged_file_are_counted_not_trusted(
        drift_model, drift_logs, tmp_path):
    """Each in its own file, newest of all: a record whose shapes claim 2^40 images (it
    holds one) does not fill the newest --max_images window by its claim (the real
    traffic is read and tested), and a file damaged at its first record is in the
    report's own counts and names, not only on stderr."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for path in glob.glob(drift_logs["unshifted"]):
        shutil.copy(path, logs)
    claiming = write_claiming_record(str(logs), MODEL)
    damaged = write_damaged_file(str(logs), MODEL)
    result = _drift("--logs", str(logs / (MODEL + "*")), "--model_base_path", drift_model,
                    "--output_dir", tmp_path / "out", "--max_images", 2 * WINDOW)
    assert result.code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == "drift: no"
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["images"] == 2 * WINDOW and report["windows_evaluated"] == 2
    assert report["skipped"]["malformed record (unreadable image_bytes tensor "
                             "(ServingError))"] == 1  # beyond the server's bounds
    assert report["skipped"][log_reader.DAMAGED] == 1
    assert [f["log"] for f in report["skipped_files"]] == [damaged]
    assert claiming not in {f["log"] for f in report["skipped_files"]}
