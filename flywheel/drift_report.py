"""slimserve-drift's report: the JSON a script reads and one HTML page a person reads.

    report = drift_report.build(outcome, context)       # a dict, JSON-safe
    drift_report.write(output_dir, report, candidates, atypical)
                                                # report.html, candidates, report.json

`build` turns a DriftOutcome (serving/observability/drift_pipeline.py) into the report: `drift`
(true; false only when all four statistics were computed and none drifts; null when
none that was computed drifts but one could not be computed: the run could not tell),
each statistic of the newest window with its value, calibrated threshold,
p-value and level, since when the drift holds, and every kept window. `write` puts three
files in the output folder, each whole or not at all (written beside, renamed into place:
a full disk or a kill leaves the previous file, never half of one): `candidates.jsonl`
(the images worth labelling, for slimserve-label --candidates), `report.html` and, last,
`report.json` (so a report.json names files that are there).

The page is one self-contained HTML document (inline CSS and SVG, images as data: URIs of
PNGs re-encoded by serving/observability/thumbnails.py, no script): which statistic moved
and how much, the p-value of each statistic window by window against its level (since
when), the reference's class shares beside the traffic's, and the most atypical served
images. Every text that
comes from logs or files is HTML-escaped.
"""
import base64
import html
import json
import os
import time

import numpy as np

from slimserve import outputs
from slimserve.flywheel import candidates as candidates_lib
from slimserve.serving.observability import drift

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
CANDIDATES = "candidates.jsonl"
MAX_WINDOWS_SHOWN = 100

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5rem;color:#222;
max-width:72rem}h1{font-size:1.3rem;margin:0 0 .3rem}h2{font-size:1.05rem;margin:1.5rem 0 .4rem}
.meta{color:#555;font-size:.9rem}table{border-collapse:collapse}
th,td{border-bottom:1px solid #ddd;padding:.3rem .6rem;text-align:left;font-size:.88rem}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{font-size:1.2rem;font-weight:700;padding:.4rem .8rem;display:inline-block;
border-radius:.3rem}.yes{background:#fde2e1;color:#a11}.no{background:#e3f4e6;color:#11772d}
.unknown{background:#fff3cd;color:#7a5b00}
.drift{color:#a11;font-weight:600}.ok{color:#11772d}.grid{display:flex;flex-wrap:wrap;gap:.6rem}
.card{border:1px solid #ddd;border-radius:.3rem;padding:.4rem;width:11rem;font-size:.78rem}
.card img{width:96px;height:96px;object-fit:contain;image-rendering:pixelated;display:block;
margin:0 auto .3rem;background:#fafafa}.bar{background:#4a78c2;height:.7rem;display:inline-block}
.bar.ref{background:#aaa}svg text{font-size:11px;fill:#444}
"""
_COLOURS = {"class_prior": "#4a78c2", "confidence": "#d98c1f", "image_stats": "#3a9a5b",
            "embeddings": "#b0368c"}


def _utc(seconds):
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(seconds)) if seconds else "?"


def build(outcome, context):
    """The report dict. context: model_name, model_version, version_dir, logs, options
    (DriftOptions as a dict), reference (a Reference or None), scan (a log_reader.Scan),
    notes ([str]) and anything else to record as it is."""
    reference = context.get("reference")
    latest = outcome.latest if outcome is not None else None
    report = {
        "drift": outcome.verdict() if outcome is not None else None,
        "model_name": context.get("model_name"),
        "model_version": context.get("model_version"),
        "version_dir": context.get("version_dir"),
        "logs": context.get("logs"),
        "created": _utc(time.time()),
        "reference": None,
        "statistics": {},
        "not_computed": dict(context.get("not_computed", {})),
        "since": None,
        "images": outcome.images if outcome is not None else 0,
        "windows_evaluated": outcome.evaluated if outcome is not None else 0,
        "windows": [w.to_json() for w in outcome.windows] if outcome is not None else [],
        "options": context.get("options"),
        "skipped": dict(context["scan"].skipped) if context.get("scan") else {},
        "skipped_files": context["scan"].files_json() if context.get("scan") else [],
        "notes": list(context.get("notes", [])),
    }
    if reference is not None:
        report["reference"] = {
            "images": reference.size, "classes": len(reference.class_names),
            "embedding_size": None if reference.embeddings is None
            else int(reference.embeddings.shape[1]),
            "train_priors": None if reference.train_priors is None
            else [float(p) for p in reference.train_priors],
            "created": reference.info.get("created")}
    if latest is not None:
        report["statistics"] = {name: s.to_json()
                                for name, s in latest.result.statistics.items()}
        report["latest_window"] = latest.to_json()
        for name in drift.STATISTICS:
            if name not in latest.result.statistics:
                report["not_computed"].setdefault(name, "not computed for this traffic")
        first, earlier = outcome.since()
        if first is not None:
            report["since"] = {"window": first.number, "first_image": first.first,
                               "start_time": first.start_time,
                               "start_utc": _utc(first.start_time),
                               "before_kept_history": earlier}
    return report


def lines(report):
    """What slimserve-drift prints: one line per statistic, then `drift: yes|no`."""
    out = []
    for name in drift.STATISTICS:
        stat = report["statistics"].get(name)
        if stat is None:
            out.append("%s: not computed (%s)" % (
                name, report["not_computed"].get(name, "no traffic to compare")))
            continue
        out.append("%s: %.4g (threshold %.4g, p %.3g) %s: %s" % (
            name, stat["value"], stat["threshold"], stat["p_value"],
            "DRIFT" if stat["drift"] else "ok", stat["detail"]))
    out.append("drift: %s" % VERDICTS[report["drift"]])
    return out


VERDICTS = {True: "yes", False: "no", None: "unknown"}


def _svg_pvalues(windows):
    """Each statistic's p-value per window (log scale) against its level: since when."""
    if not windows:
        return ""
    width, height, left, bottom = 680, 200, 48, 28
    floor = min([1e-3] + [s["p_value"] for w in windows for s in w["statistics"].values()])
    low = np.log10(floor)
    count = len(windows)

    def x(i):
        return left + (width - left - 10) * (i / max(1, count - 1))

    def y(p):
        return 8 + (height - bottom - 8) * (np.log10(max(p, floor)) / low)

    parts = ['<svg width="%d" height="%d" role="img" aria-label="p-value per window">'
             % (width, height)]
    for p in (1.0, 0.1, 0.01, 0.001):
        if p >= floor:
            parts.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/>'
                         '<text x="4" y="%.1f">%g</text>' % (left, width - 10, y(p), y(p),
                                                           y(p) + 4, p))
    level = next((s["level"] for w in windows for s in w["statistics"].values()), None)
    if level:
        parts.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#a11" '
                     'stroke-dasharray="4 3"/><text x="%d" y="%.1f" fill="#a11">level %.3g'
                     '</text>' % (left, width - 10, y(level), y(level), width - 110,
                                  y(level) - 4, level))
    for name in drift.STATISTICS:
        points = [(x(i), y(w["statistics"][name]["p_value"])) for i, w in enumerate(windows)
                  if name in w["statistics"]]
        if points:
            parts.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                         % (_COLOURS[name], " ".join("%.1f,%.1f" % p for p in points)))
    for i, w in enumerate(windows):
        if w["drift"]:
            parts.append('<circle cx="%.1f" cy="%d" r="3" fill="#a11"/>'
                         % (x(i), height - bottom + 8))
    parts.append('<text x="%d" y="%d">window (oldest left; a red dot: flagged)</text></svg>'
                 % (left, height - 2))
    legend = " ".join('<span style="color:%s">&#9644; %s</span>' % (_COLOURS[n], n)
                      for n in drift.STATISTICS)
    return "".join(parts) + "<div class=\"meta\">p-value (log scale): %s</div>" % legend


def render_html(report, atypical=(), class_names=(), shares=None):
    """The page (see the module docstring). atypical: [(Candidate, PNG bytes)] of the
    most atypical served images; shares: (reference shares, traffic shares) of the
    predicted classes, for the class table."""
    esc = lambda value: html.escape(str(value), quote=True)  # noqa: E731
    verdict = VERDICTS[report["drift"]]
    parts = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
             "<title>drift report: %s version %s</title><style>%s</style></head><body>" % (
                 esc(report["model_name"]), esc(report["model_version"]), _STYLE),
             "<h1>Drift of %s, version %s</h1>" % (esc(report["model_name"]),
                                                 esc(report["model_version"])),
             "<div class=\"meta\">%s &middot; %d served image(s) read, %d window(s) tested"
             "</div>" % (esc(report["created"]), report["images"],
                         report["windows_evaluated"]),
             "<p><span class=\"verdict %s\">drift: %s</span></p>" % (verdict, verdict)]
    if report["reference"] is None:
        parts.append("<p>This version has no reference (an export made before references "
                     "were recorded): nothing to compare with.</p>")
    since = report.get("since")
    if since:
        parts.append("<p class=\"drift\">Drifting since window %d (image %d of the traffic "
                     "read, logged %s)%s.</p>" % (
                         since["window"], since["first_image"], esc(since["start_utc"]),
                         ", or earlier than the kept history" if since["before_kept_history"]
                         else ""))
    parts.append("<h2>Newest window</h2><table><tr><th>statistic</th><th>value</th>"
                 "<th>threshold</th><th>p-value</th><th></th><th>what moved</th></tr>")
    for name in drift.STATISTICS:
        stat = report["statistics"].get(name)
        if stat is None:
            parts.append("<tr><td>%s</td><td colspan=\"5\" class=\"meta\">not computed: %s"
                         "</td></tr>" % (esc(name), esc(report["not_computed"].get(name, ""))))
            continue
        parts.append("<tr><td title=\"%s\">%s</td><td class=\"num\">%.4g</td>"
                     "<td class=\"num\">%.4g</td><td class=\"num\">%.3g</td>"
                     "<td class=\"%s\">%s</td><td>%s</td></tr>" % (
                         esc(stat["description"]), esc(name), stat["value"], stat["threshold"],
                         stat["p_value"], "drift" if stat["drift"] else "ok",
                         "DRIFT" if stat["drift"] else "ok", esc(stat["detail"])))
    parts.append("</table>")
    windows = report["windows"][-MAX_WINDOWS_SHOWN:]
    if windows:
        parts.append("<h2>Window by window</h2>" + _svg_pvalues(windows))
        parts.append("<table><tr><th>window</th><th>images</th><th>logged</th>"
                     "<th>flagged by</th></tr>")
        for w in reversed(windows[-20:]):
            parts.append("<tr><td class=\"num\">%d</td><td class=\"num\">%d-%d</td><td>%s"
                         " &ndash; %s</td><td class=\"%s\">%s</td></tr>" % (
                             w["window"], w["first_image"], w["last_image"],
                             esc(_utc(w["start_time"])), esc(_utc(w["end_time"])),
                             "drift" if w["drift"] else "ok",
                             esc(", ".join(w["moved"]) or "none")))
        parts.append("</table>")
    if shares is not None and class_names:
        ref, got = shares
        parts.append("<h2>Predicted classes: reference vs newest window</h2><table>"
                     "<tr><th>class</th><th>reference</th><th>traffic</th></tr>")
        for index, name in enumerate(class_names):
            parts.append("<tr><td>%s</td><td><span class=\"bar ref\" style=\"width:%.1fpx\">"
                         "</span> %.1f%%</td><td><span class=\"bar\" style=\"width:%.1fpx\">"
                         "</span> %.1f%%</td></tr>" % (
                             esc(name), 200 * ref[index], 100 * ref[index], 200 * got[index],
                             100 * got[index]))
        parts.append("</table>")
    if atypical:
        parts.append("<h2>Most atypical served images</h2><div class=\"grid\">")
        for candidate, png in atypical:
            top = candidate.top[0] if candidate.top else None
            parts.append("<div class=\"card\"><img alt=\"served image\" src=\"data:image/png;"
                         "base64,%s\"><div>%s</div><div class=\"meta\">%s</div>"
                         "<div class=\"meta\">%s</div></div>" % (
                             base64.b64encode(png).decode("ascii"),
                             esc("predicted %s (%.2f)" % (
                                 class_names[top[0]] if class_names and
                                 0 <= top[0] < len(class_names) else top[0], top[1]))
                             if top else "", esc(candidate.reasons[0] if candidate.reasons
                                                 else ""),
                             esc("%s, logged %s" % (candidate.request_id,
                                                    _utc(candidate.logged_at)))))
        parts.append("</div>")
    if report["notes"] or report["skipped"] or report.get("skipped_files"):
        parts.append("<h2>Notes</h2><ul>")
        parts += ["<li>%s</li>" % esc(note) for note in report["notes"]]
        parts += ["<li>skipped: %d %s</li>" % (count, esc(why))
                  for why, count in sorted(report["skipped"].items())]
        parts += ["<li>skipped file %s: %s</li>" % (esc(f["log"]), esc(f["reason"]))
                  for f in report.get("skipped_files", [])]
        parts.append("</ul>")
    parts.append("</body></html>\n")
    return "".join(parts)


def class_shares(reference, outcome):
    """(reference shares, newest window's shares) of the predicted classes, or None."""
    if reference is None or outcome is None or outcome.latest is None:
        return None
    num_classes = len(reference.class_names)
    ref = np.bincount(reference.predicted, minlength=num_classes)[:num_classes]
    got = np.asarray(outcome.latest.classes[:num_classes], np.float64)
    return ref / float(max(1, ref.sum())), got / max(1.0, float(got.sum()))


def write(output_dir, report, candidates=(), atypical=(), class_names=(), shares=None):
    """Writes candidates.jsonl (when there are `candidates`), report.html and report.json
    into `output_dir`, each whole or not at all; returns their paths."""
    paths = {}
    if candidates:
        paths["candidates"] = os.path.join(output_dir, CANDIDATES)
        candidates_lib.write_candidates(paths["candidates"], candidates)
        report["candidates_file"] = paths["candidates"]
    paths["html"] = os.path.join(output_dir, REPORT_HTML)
    report["report_html"] = paths["html"]
    with outputs.write_atomically(paths["html"], "--output_dir") as handle:
        handle.write(render_html(report, atypical, class_names, shares))
    paths["json"] = os.path.join(output_dir, REPORT_JSON)
    with outputs.write_atomically(paths["json"], "--output_dir") as handle:
        json.dump(report, handle, indent=1, sort_keys=True, default=_json_default)
    return paths


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError("not JSON: %r" % type(value))
