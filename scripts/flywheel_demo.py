"""The data flywheel in one command (`make flywheel-demo`): the demo's digits model serves
traffic that shifts (digits written in another style: inverted by default), slimserve-drift
flags it from the request logs, a scripted labeller labels the images the labelling page
proposes (over its HTTP API), slimserve-retrain fine-tunes from the serving version,
checks the candidate and promotes it, and a report (JSON + PNG) shows before and after.

For the point of choosing, the same labeller also labels as many logged images picked at
random, and the same retraining runs on those (--nopublish): accuracy on shifted digits
no model saw (and on the original validation split) is measured for the serving
version and both retrained ones. The acceptance figures are in report.json:
`drift.requests_to_detect` (requests after the shift began until the first flagged
window ends), `drift.unshifted_windows_flagged`, and `flywheel.*`.

Each stage runs the documented commands (convert, train, drift, label, retrain), so any
stage can be re-run alone with the command this script prints. Parts of the digits never
mix: training (and its validation split), served traffic, and a test set.
"""
import argparse
import hashlib
import http.cookiejar
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import demo  # noqa: E402  pylint: disable=wrong-import-position
import make_digits  # noqa: E402  pylint: disable=wrong-import-position

MODEL = "digits"
# The retraining's settings, compared on --shift=rotate (1e-3 and 3 repeats did best of
# three) and measured once on the default --shift=invert (docs/benchmarks.md "The data
# flywheel"), which no choice looked at.
RETRAIN_LEARNING_RATE = 1e-3
NEW_LABEL_REPEATS = 3
SERVING_WEIGHT = 0.0
DISTILL_WEIGHT = 0.0
SOUP_SEEDS = 1
# The share of the training part held out as the original validation split (the
# converter's default: 199 images, one image half a point). At 0.4 (396 images) a
# retraining's change still spread from -1.5 to +0.8 points over three seeds, as at 0.2
# (-1.0 .. +1.0): the spread is the retrained models', not the measurement's, and the first
# model trained on a quarter fewer images (docs/benchmarks.md, "The data flywheel").
VALIDATION_FRACTION = 0.2
CLASSES = [str(d) for d in range(10)]


def shifted(data, kind):
    from slimserve.testing import digits_traffic  # pylint: disable=import-outside-toplevel
    return digits_traffic.shift(data, kind)


def write_config(path, base, log_prefix):
    """The server's model config: the model, request logging of every request."""
    with open(path, "w") as handle:
        handle.write('model_config_list { config { name: "%s" base_path: "%s" '
                     'model_platform: "tensorflow" logging_config { log_collector_config '
                     '{ type: "file" filename_prefix: "%s" } sampling_config '
                     '{ sampling_rate: 1.0 } } } }\n' % (MODEL, base, log_prefix))


def send(port, images, label=None):
    """One gRPC request per image; returns the answering versions' top classes."""
    from slimserve.serving.clients import client as client_lib  # pylint: disable=import-outside-toplevel
    client = client_lib.Client("127.0.0.1:%d" % port, model_name=MODEL, version_label=label,
                               retries=0)
    try:
        return [CLASSES[int(client.predict_images([image])["classes"][0])]
                for image in images]
    finally:
        client.close()


def logged_images(pattern):
    """{request id: image bytes' sha256} of every logged image."""
    from slimserve.serving.observability import log_reader  # pylint: disable=import-outside-toplevel
    found, scan = {}, log_reader.Scan()
    for path, index, log in log_reader.iter_indexed(pattern, scan):
        for item, logged in enumerate(log_reader.logged_images(log) or []):
            found[log_reader.request_id(path, index, item)] = (
                hashlib.sha256(logged.image).hexdigest(), path, index, item)
    return found


def random_candidates(pattern, count, path, seed=0):
    """A candidates file of `count` logged images chosen at random: the baseline."""
    from slimserve.flywheel import candidates  # pylint: disable=import-outside-toplevel
    logged = sorted(logged_images(pattern).items())
    chosen = random.Random(seed).sample(logged, min(count, len(logged)))
    candidates.write_candidates(path, [
        candidates.Candidate(log, index, item, rid, 1.0, ["chosen at random"])
        for rid, (_, log, index, item) in chosen])


_CARD = re.compile(r'<article class="card[^"]*" id="card-\d+" data-request-id="([^"]+)"')
_TOKEN = re.compile(r'name="token" value="([^"]+)"')


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def label_with_page(candidates, output_dir, base, truth, logged, timings, name):
    """Runs slimserve-label on `candidates` and labels every image it offers through its
    HTTP API as a person would (GET the page, POST /decide), each with its true class
    (`truth`: image sha256 -> class). Returns how many were labelled."""
    argv = demo.python("slimserve.cli.label", "--candidates", candidates, "--output_dir",
                       output_dir, "--model_base_path", base, "--port", 0, "--view", "grid",
                       "--grid_size", 60, "--max_candidates", 100000, "--labeller",
                       "scripted", "--noprogress")
    print("\n== %s\n$ %s" % (name, " ".join(argv)), flush=True)
    started = time.time()
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        match = re.search(r"(http://[^/ ]+)/", line)
        if not match:
            raise SystemExit("flywheel demo: slimserve-label did not start: %r" % line)
        url = match.group(1)
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar),
                                             _NoRedirect)
        labelled, jar_had_cookie = 0, False
        while True:
            try:
                html = opener.open(url + "/?view=grid", timeout=60).read().decode()
            except urllib.error.HTTPError as answer:
                if answer.code != 303 or jar_had_cookie:
                    raise
                jar_had_cookie = True  # the page set its session cookie: ask again
                continue
            cards = _CARD.findall(html)
            if not cards:
                break
            for rid in cards:
                sha = logged[rid][0]
                choice = "label:%d" % CLASSES.index(truth[sha]) if sha in truth else "skip"
                form = urllib.parse.urlencode({"token": _TOKEN.search(html).group(1),
                                               "request_id": rid, "choice": choice,
                                               "view": "grid", "focus": 0}).encode()
                try:
                    opener.open(url + "/decide", form, timeout=60)
                except urllib.error.HTTPError as answer:
                    if answer.code != 303:
                        raise
                labelled += choice != "skip"
    finally:
        process.send_signal(signal.SIGTERM)
        print(process.communicate(timeout=60)[0].strip(), flush=True)
    timings[name] = round(time.time() - started, 1)
    return labelled


def accuracy(images, labels, baseline, candidate):
    from slimserve.flywheel import compare  # pylint: disable=import-outside-toplevel
    return compare.labelled(images, labels, baseline, candidate)


def split_images(data_dir, split):
    from slimserve.estimator import schema  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import splits  # pylint: disable=import-outside-toplevel
    examples = splits.read_examples(data_dir, split)
    return ([e.features.feature[schema.ENCODED].bytes_list.value[0] for e in examples],
            [e.features.feature[schema.TEXT].bytes_list.value[0].decode() for e in examples])


def seed_summary(per_seed, results):
    """{label set: {each seed's accuracies, and per group the mean, lowest and highest
    change in points from the serving version}}."""
    summary = {}
    for key, runs in per_seed.items():
        summary[key] = {"runs": runs}
        for group in ("shifted_test", "validation", "original_test"):
            changes = [100 * (run[group] - results[group]["before"]) for run in runs
                       if run[group] is not None]
            if changes:
                summary[key][group + "_change_points"] = {
                    "mean": round(sum(changes) / len(changes), 2),
                    "min": round(min(changes), 2), "max": round(max(changes), 2),
                    "runs": len(changes)}
    return summary


def detection(report, shift_start):
    """(requests from the first shifted one to the end of the first flagged window that
    holds shifted images, unshifted windows flagged, unshifted windows)."""
    unshifted = [w for w in report["windows"] if w["last_image"] < shift_start]
    after = [w for w in report["windows"] if w["last_image"] >= shift_start and w["drift"]]
    delay = after[0]["last_image"] + 1 - shift_start if after else None
    return delay, sum(w["drift"] for w in unshifted), len(unshifted)


def plot(path, drift_report, shift_start, results, thumbnails, shift):
    import io  # pylint: disable=import-outside-toplevel
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    from PIL import Image  # pylint: disable=import-outside-toplevel
    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(18, 5.2),
                                                 gridspec_kw={"width_ratios": [1.3, 1, 0.9]})
    windows = drift_report["windows"]
    ends = [w["last_image"] + 1 for w in windows]
    for name in ("class_prior", "confidence", "image_stats", "embeddings"):
        points = [max(w["statistics"][name]["p_value"], 1e-4) for w in windows
                  if name in w["statistics"]]
        if points:
            left.plot(ends[:len(points)], points, "o-", markersize=3, label=name)
    level = windows[0]["statistics"]["embeddings"]["level"] if windows else 0.0125
    left.axhline(level, color="#a11", linestyle="--", label="level (alpha / 4)")
    left.axvline(shift_start, color="black", linestyle=":", label="shift begins")
    left.set_yscale("log")
    left.set_xlabel("served requests (end of each window)")
    left.set_ylabel("p-value")
    left.set_title("drift per window: %s digits from request %d" % (shift, shift_start))
    left.legend(fontsize=8)
    groups = ["%s test digits" % shift, "original validation", "test digits unshifted"]
    models = ["serving version", "random 200 labels", "proposed 200 labels"]
    keys = ["before", "random", "proposed"]
    x = np.arange(len(groups))
    for i, (model, key) in enumerate(zip(models, keys)):
        values = [results[group][key] for group in ("shifted_test", "validation",
                                                     "original_test")]
        bars = middle.bar(x + (i - 1) * 0.27, values, 0.27, label=model)
        for bar, value in zip(bars, values):
            middle.text(bar.get_x() + bar.get_width() / 2, value + 0.01, "%.3f" % value,
                        ha="center", fontsize=8)
    middle.set_xticks(x, groups)
    middle.set_ylim(0, 1.08)
    middle.set_ylabel("accuracy")
    middle.set_title("before / after retraining")
    middle.legend(fontsize=8, loc="lower left")
    side = int(np.ceil(np.sqrt(max(1, len(thumbnails)))))
    grid = np.ones((side * 34, side * 34, 3))
    for index, data in enumerate(thumbnails):
        image = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((32, 32)),
                           np.float64) / 255.0
        row, column = divmod(index, side)
        grid[row * 34 + 1:row * 34 + 33, column * 34 + 1:column * 34 + 33] = image
    right.imshow(grid)
    right.set_axis_off()
    right.set_title("the first %d images the page proposed" % len(thumbnails))
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work_dir", default=os.path.join(ROOT, "demo_out", "flywheel"),
                        help="Where every artefact goes (removed first with --fresh).")
    parser.add_argument("--fresh", action="store_true", help="Delete --work_dir first.")
    parser.add_argument("--keep_first_model", action="store_true",
                        help="Reuse the first model an earlier run left in --work_dir (its "
                        "conversion and training stages are skipped).")
    parser.add_argument("--shift", default="invert", help="How the traffic shifts: invert, "
                        "thick, rotate or blur (slimserve/testing/digits_traffic.py).")
    parser.add_argument("--plain_requests", type=int, default=240,
                        help="Requests of held-out digits before the shift.")
    parser.add_argument("--validation_fraction", type=float, default=VALIDATION_FRACTION,
                        help="slimserve-convert --validation_fraction of the training part: "
                        "the original validation split the retrain check and the report "
                        "judge forgetting on (of 199 images at 0.2, one is half a point).")
    parser.add_argument("--labels", type=int, default=200,
                        help="Images labelled, proposed by the page and at random.")
    parser.add_argument("--window_size", type=int, default=100, help="Drift window.")
    parser.add_argument("--window_step", type=int, default=20, help="Drift window step.")
    parser.add_argument("--retrain_steps", type=int, default=150,
                        help="Fine-tuning steps of each retraining.")
    parser.add_argument("--retrain_learning_rate", type=float, default=RETRAIN_LEARNING_RATE,
                        help="Peak learning rate of each retraining (the first model's "
                        "is 1e-3; chosen on --shift=rotate, see docs/benchmarks.md).")
    parser.add_argument("--new_label_repeats", type=int, default=NEW_LABEL_REPEATS,
                        help="slimserve-retrain --new_label_repeats: times the new images "
                        "appear in the merged training split.")
    parser.add_argument("--serving_weight", type=float, default=SERVING_WEIGHT,
                        help="slimserve-retrain --serving_weight: share of the serving "
                        "version's weights averaged into each retrained model (WiSE-FT).")
    parser.add_argument("--distill_weight", type=float, default=DISTILL_WEIGHT,
                        help="slimserve-retrain --distill_weight: weight of the serving "
                        "version's answers on the original training images (Learning "
                        "without Forgetting); 0: off.")
    parser.add_argument("--soup_seeds", type=int, default=SOUP_SEEDS,
                        help="slimserve-retrain --soup_seeds: fine-tunes (seeds) averaged "
                        "into each retrained model (a model soup); the --retrain_seeds "
                        "repeats use disjoint seeds.")
    parser.add_argument("--retrain_seeds", type=int, default=1,
                        help="Retrain on each label set with this many seeds (0, 1, ...; "
                        "the ones after the first with --nopublish) and report each "
                        "seed's accuracies and their mean: one retraining's change on the "
                        "validation split moves by an image or two with the seed alone.")
    demo.add_flag_file_arguments(parser)
    args = parser.parse_args(argv)
    if args.retrain_seeds < 1:
        parser.error("--retrain_seeds must be at least 1")
    if args.soup_seeds < 1:
        parser.error("--soup_seeds must be at least 1")
    if not 0 < args.validation_fraction < 1:
        parser.error("--validation_fraction must be in (0, 1), got %g" % args.validation_fraction)
    demo.quiet_logging()
    from slimserve.serving import server as server_lib  # pylint: disable=import-outside-toplevel
    from slimserve.testing import digits_traffic  # pylint: disable=import-outside-toplevel

    work = demo.make_work_dir(args.work_dir, args.fresh)
    path = lambda *names: os.path.join(work, *names)  # noqa: E731
    timings, started = {}, time.time()
    bar = [] if sys.stdout.isatty() else ["--noprogress"]

    # --- the first model, as `make demo` trains it, on the training part only ----------
    if not os.path.exists(path("all_images")):
        make_digits.write_digits(path("all_images"), size=32)
    parts = digits_traffic.split(path("all_images"), {"train": 0.55, "traffic": 0.30,
                                                      "test": 0.15})
    for folder in ("train_images", "source_images"):
        shutil.rmtree(path(folder), ignore_errors=True)
    digits_traffic.write_tree(parts["train"], path("train_images"))
    digits_traffic.write_tree([(p, c) for p, c in parts["train"] if int(c) < 5],
                              path("source_images"))
    reuse = args.keep_first_model and os.path.isdir(path("run", "export", "final"))
    if reuse:
        info_path = path("data", "dataset_info.json")
        try:
            with open(info_path) as info:
                kept_fraction = float(json.load(info)["validation_fraction"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            parser.error("--keep_first_model: %s cannot say which --validation_fraction the "
                         "first model was trained with (%s); drop --keep_first_model to train "
                         "another" % (info_path, error))
        if abs(kept_fraction - args.validation_fraction) > 1e-9:
            parser.error("--keep_first_model: the first model in %s was trained with "
                         "--validation_fraction %g, not %g; drop --keep_first_model to train "
                         "another" % (work, kept_fraction, args.validation_fraction))
    for folder in ["models", "logs", "drift", "labels_proposed", "labels_random",
                   "retrain_proposed", "retrain_random"] + \
            ([] if reuse else ["source_run", "run"]) + \
            [name for name in os.listdir(work) if re.match(r"retrain_\w+_seed\d+$", name)]:
        shutil.rmtree(path(folder), ignore_errors=True)
    if not reuse:
        demo.stage("convert the training part", demo.python(
            "slimserve.cli.convert", "--input", path("train_images"), "--output_dir",
            path("data"), "--overwrite", "--validation_fraction", str(args.validation_fraction),
            *bar), timings)
        demo.stage("convert the source task (digits 0-4)", demo.python(
            "slimserve.cli.convert", "--input", path("source_images"), "--output_dir",
            path("source_data"), "--overwrite", "--noprogress"), timings)
        demo.stage("source checkpoint", demo.python(
            "slimserve.cli.train", "--flagfile", args.source_flags, "--data_dir",
            path("source_data"), "--model_dir", path("source_run")), timings)
        demo.stage("fine-tune on all digits + export (with its reference)", demo.python(
            "slimserve.cli.train", "--flagfile", args.finetune_flags, "--data_dir",
            path("data"), "--model_dir", path("run"), "--checkpoint_path",
            path("source_run")), timings)
    export_base = path("run", "export", "final")
    first = sorted(os.listdir(export_base))[-1]
    base = path("models", MODEL)
    shutil.copytree(os.path.join(export_base, first), os.path.join(base, first))
    config_file = path("models.config")
    write_config(config_file, base, path("logs", MODEL))

    # --- serve: held-out digits, then the shift ----------------------------------------
    plain = [(open(p, "rb").read(), c) for p, c in parts["traffic"][:args.plain_requests]]
    shift = [(shifted(open(p, "rb").read(), args.shift), c)
             for p, c in parts["traffic"][args.plain_requests:]]
    truth = {hashlib.sha256(data).hexdigest(): c for data, c in plain + shift}
    print("\n== serve version %s (%s) and send %d held-out digits, then %d %s ones"
          % (first, config_file, len(plain), len(shift), args.shift), flush=True)
    serve_started = time.time()
    server = server_lib.ModelServer(
        model_config_file=config_file, model_config_file_poll_wait_seconds=1,
        file_system_poll_wait_seconds=1, port=server_lib.PICK_FREE_PORT, rest_api_port=0,
        drift_check_interval_seconds=0, drift_window_size=args.window_size).start()
    report = {"shift": args.shift, "served_version": int(first),
              "retrain": {"steps": args.retrain_steps,
                          "learning_rate": args.retrain_learning_rate,
                          "new_label_repeats": args.new_label_repeats,
                          "serving_weight": args.serving_weight,
                          "distill_weight": args.distill_weight, "seeds": args.retrain_seeds,
                          "soup_seeds": args.soup_seeds}}
    try:
        send(server.port, [data for data, _ in plain + shift])
        server.flush_request_logs(timeout=60)
        checked = server.check_drift()[(MODEL, int(first))]
        report["server_drift_check"] = {"drift": checked.drift, "images": checked.images}
        timings["serve traffic"] = round(time.time() - serve_started, 1)
        logs_glob = path("logs", MODEL) + "*"

        # --- drift, and the images worth labelling ---------------------------------------
        demo.stage("slimserve-drift", demo.python(
            "slimserve.cli.drift", "--logs", logs_glob, "--model_base_path", base,
            "--output_dir", path("drift"), "--window_size", args.window_size,
            "--window_step", args.window_step, "--max_candidates", args.labels,
            *bar), timings)
        drift_report = json.load(open(path("drift", "report.json")))
        delay, false_alarms, unshifted_windows = detection(drift_report, len(plain))
        report["drift"] = {
            "drift": drift_report["drift"], "requests_to_detect": delay,
            "unshifted_windows_flagged": false_alarms, "unshifted_windows": unshifted_windows,
            "window_size": args.window_size, "window_step": args.window_step,
            "statistics": drift_report["statistics"], "report_html": path("drift",
                                                                          "report.html")}

        # --- label: the proposed images, and as many random ones --------------------------
        logged = logged_images(logs_glob)
        random_candidates(logs_glob, args.labels, path("random_candidates.jsonl"))
        counts = {}
        for key, candidates in (("proposed", path("drift", "candidates.jsonl")),
                                ("random", path("random_candidates.jsonl"))):
            counts[key] = label_with_page(candidates, path("labels_" + key), base, truth,
                                          logged, timings, "label the %s images" % key)
        chosen = {}
        for key in ("proposed", "random"):
            rows = [json.loads(line) for line in open(path("labels_" + key,
                                                           "provenance.jsonl"))]
            chosen[key] = sum(logged[r["request_id"]][0] not in
                              {hashlib.sha256(d).hexdigest() for d, _ in plain} for r in rows)

        # --- retrain on each, check, publish (the proposed ones) --------------------------
        # Every retrain fine-tunes from, and is checked against, the version that served
        # the traffic: by the time the random labels' retrain runs, the proposed labels'
        # candidate may have been promoted to `stable`, and starting from it would give the
        # random labels the proposed ones too.
        retrain_flags = ["--flagfile", args.finetune_flags, "--data_dir", path("data"),
                         "--model_config_file", config_file, "--serving_version", first,
                         "--logs", logs_glob, "--max_steps", args.retrain_steps,
                         "--decay_steps", args.retrain_steps, "--save_checkpoints_steps",
                         args.retrain_steps, "--exports_to_keep", 1,
                         "--learning_rate", args.retrain_learning_rate,
                         "--new_label_repeats", args.new_label_repeats,
                         "--serving_weight", args.serving_weight,
                         "--distill_weight", args.distill_weight,
                         "--soup_seeds", args.soup_seeds, *bar]
        codes = {}
        for key, extra in (("proposed", ["--promote"]), ("random", ["--nopublish"])):
            name = "retrain on the %s labels" % key
            argv = demo.python("slimserve.cli.retrain", "--labels_dir", path("labels_" + key),
                               "--model_dir", path("retrain_" + key), *retrain_flags, *extra)
            print("\n== %s\n$ %s" % (name, " ".join(argv)), flush=True)
            step_started = time.time()
            codes[key] = subprocess.run(argv, cwd=ROOT, check=False).returncode
            timings[name] = round(time.time() - step_started, 1)
        retrains = {key: json.load(open(path("retrain_" + key, "retrain_report.json")))
                    for key in ("proposed", "random")}
        seeded = {key: [retrains[key]["candidate"]] for key in retrains}
        for seed in range(1, args.retrain_seeds):
            for key in ("proposed", "random"):
                folder = path("retrain_%s_seed%d" % (key, seed))
                argv = demo.python("slimserve.cli.retrain", "--labels_dir",
                                   path("labels_" + key), "--model_dir", folder,
                                   *retrain_flags, "--seed", seed * args.soup_seeds,
                                   "--nopublish")
                print("\n== retrain on the %s labels, seed %d\n$ %s" % (
                    key, seed, " ".join(argv)), flush=True)
                subprocess.run(argv, cwd=ROOT, check=False)
                seeded[key].append(json.load(open(os.path.join(
                    folder, "retrain_report.json")))["candidate"])

        # --- before / after, on digits no model saw ---------------------------------------
        test = [(shifted(open(p, "rb").read(), args.shift), c) for p, c in parts["test"]]
        test_images, test_labels = [d for d, _ in test], [c for _, c in test]
        # The same test digits unshifted: a second measure of forgetting, on images of
        # the original kind that no model saw (the validation split guided the first
        # model's training through its evaluations and exports).
        original = [(open(p, "rb").read(), c) for p, c in parts["test"]]
        validation_images, validation_labels = split_images(path("data"), "validation")
        serving_dir = os.path.join(base, first)
        results = {"shifted_test": {}, "validation": {}, "original_test": {}}
        per_seed = {key: [] for key in seeded}
        for key in ("random", "proposed"):
            for seed, candidate in enumerate(seeded[key]):
                scores = {}
                for group, images, labels in (("shifted_test", test_images, test_labels),
                                              ("validation", validation_images,
                                               validation_labels),
                                              ("original_test", [d for d, _ in original],
                                               [c for _, c in original])):
                    measured = accuracy(images, labels, serving_dir, candidate) \
                        if candidate else {"baseline_accuracy": None,
                                           "candidate_accuracy": None}
                    scores[group] = measured["candidate_accuracy"]
                    if seed == 0:
                        results[group]["before"] = measured["baseline_accuracy"]
                        results[group][key] = measured["candidate_accuracy"]
                per_seed[key].append(dict(scores, seed=seed))
        promoted = retrains["proposed"].get("published", {}).get("version")
        served_after = None
        if promoted:
            from slimserve.testing.servers import wait_until  # pylint: disable=import-outside-toplevel
            wait_until(lambda: send(server.port, test_images[:1], "stable") is not None and
                       server.manager.available_versions(MODEL)[-1:] == [promoted], 120, 0.5,
                       "the promoted version")
            answers = send(server.port, test_images, "stable")
            served_after = sum(a == c for a, c in zip(answers, test_labels)) / len(test_labels)
    finally:
        server.stop()
    proposed_thumbnails = []
    for line in open(path("drift", "candidates.jsonl")).readlines()[:25]:
        rid = json.loads(line)["request_id"]
        proposed_thumbnails += [d for d, _ in plain + shift
                                if hashlib.sha256(d).hexdigest() == logged[rid][0]][:1]
    report["flywheel"] = {
        "labels": counts, "shifted_among_labelled": chosen,
        "accuracy": results,
        "gain_on_shifted_over_random": round(results["shifted_test"]["proposed"] -
                                             results["shifted_test"]["random"], 4),
        "validation_change_points": round(100 * (results["validation"]["proposed"] -
                                                 results["validation"]["before"]), 2),
        "original_test_change_points": round(100 * (results["original_test"]["proposed"] -
                                                    results["original_test"]["before"]), 2),
        "retrain_exit_status": codes,
        "retrain_checks": {key: {k: retrains[key].get(k) for k in (
            "holdout", "validation", "traffic", "passed", "refused_because", "published")}
            for key in retrains},
        "promoted_version": promoted, "served_accuracy_on_shifted_after": served_after,
        "seeds": seed_summary(per_seed, results),
        "test_images": len(test_images), "validation_images": len(validation_images)}
    report["stage_seconds"] = timings
    report["total_seconds"] = round(time.time() - started, 1)
    report["report_png"] = path("report.png")
    plot(report["report_png"], drift_report, len(plain), results, proposed_thumbnails,
         args.shift)
    with open(path("report.json"), "w") as handle:
        json.dump(report, handle, indent=2)
    flywheel = report["flywheel"]
    print("\n== report (%s)" % path("report.json"))
    for name, seconds in timings.items():
        print("  %-40s %7.1f s" % (name, seconds))
    print("  drift: %s; flagged %s requests after the %s digits began (windows of %d, "
          "step %d); unshifted windows flagged: %d of %d" % (
              "yes" if report["drift"]["drift"] else "no", delay, args.shift,
              args.window_size, args.window_step, false_alarms, unshifted_windows))
    print("  shifted images among the labelled: proposed %d of %d, random %d of %d" % (
        chosen["proposed"], counts["proposed"], chosen["random"], counts["random"]))
    print("  accuracy on %d %s test digits: before %.4f, random labels %.4f, proposed "
          "labels %.4f (%+.4f over random)" % (
              len(test_images), args.shift, results["shifted_test"]["before"],
              results["shifted_test"]["random"], results["shifted_test"]["proposed"],
              flywheel["gain_on_shifted_over_random"]))
    print("  accuracy on the original validation split (%d): before %.4f, after %.4f "
          "(%+.2f points)" % (len(validation_images), results["validation"]["before"],
                              results["validation"]["proposed"],
                              flywheel["validation_change_points"]))
    print("  accuracy on the same %d test digits unshifted (no model saw them): before "
          "%.4f, after %.4f (%+.2f points)" % (len(test_images),
                                               results["original_test"]["before"],
                                               results["original_test"]["proposed"],
                                               flywheel["original_test_change_points"]))
    if args.retrain_seeds > 1:
        for key in ("proposed", "random"):
            print("  %s labels over %d seeds, change in points (mean, lowest, highest): "
                  "%s" % (key, args.retrain_seeds, "; ".join(
                      "%s %+.2f (%+.2f .. %+.2f)" % (
                          group, found["mean"], found["min"], found["max"])
                      for group, found in ((g, flywheel["seeds"][key].get(
                          g + "_change_points")) for g in (
                              "shifted_test", "validation", "original_test"))
                      if found)))
    print("  retrain: proposed %s (exit %d), random %s (exit %d); promoted version %s, "
          "served accuracy on the shifted test through `stable`: %s" % (
              "passed" if retrains["proposed"]["passed"] else "refused", codes["proposed"],
              "passed" if retrains["random"]["passed"] else "refused", codes["random"],
              promoted, "%.4f" % served_after if served_after is not None else "-"))
    print("  drift report: %s\n  before/after: %s" % (report["drift"]["report_html"],
                                                      report["report_png"]))


if __name__ == "__main__":
    main()
