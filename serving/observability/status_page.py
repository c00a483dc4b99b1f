"""The read-only status page served at `GET /` (and `/status`) on the REST port: models,
versions and their states, request rates and latency percentiles of the last minute, and
what the batch scheduler chose and learned per model, version and signature (its plan,
the batch sizes it ran, the requests' queue delay, its cost model; core/adaptive.py), and
the last drift check of each request-logged version (observability/drift_monitor.py).

One self-contained HTML document (inline CSS, no scripts, no external assets) that
refreshes itself every few seconds, so it works in any browser and behind any proxy.
Every value from the outside (model names, error messages) is HTML-escaped.
"""
import html
import time

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5rem;color:#222}
h1{font-size:1.3rem;margin:0 0 .3rem}h2{font-size:1.05rem;margin:1.4rem 0 .4rem}
.meta{color:#666;font-size:.85rem}table{border-collapse:collapse;min-width:32rem}
th,td{border-bottom:1px solid #ddd;padding:.3rem .7rem;text-align:left;font-size:.9rem}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.AVAILABLE{color:#11772d;font-weight:600}.LOADING{color:#996b00}.END{color:#a11}
.UNLOADING{color:#666}.err{color:#a11;font-size:.8rem}.none{color:#888}
.drift{color:#a11;font-weight:600}.nodrift{color:#11772d}
"""
_STATISTICS = ("class_prior", "confidence", "image_stats", "embeddings")


def _cell(value, numeric=False):
    return '<td%s>%s</td>' % (' class="num"' if numeric else "", value)


def _ms(seconds, digits=1):
    return "" if seconds is None else "%.*f" % (digits, seconds * 1e3)


def _cost(state):
    """The cost model in a few words: measured sizes (alone / overlapped ms) and the line."""
    parts = []
    for size, alone, overlapped, _ in state["cost"][:12]:
        text = "%d: %s" % (size, _ms(alone) or "-")
        if overlapped is not None:
            text += " / %s" % _ms(overlapped)
        parts.append(text)
    if len(state["cost"]) > 12:
        parts.append("...")
    line = state["line"]
    if line is not None:
        parts.append("line %s + %s&middot;b ms" % (_ms(line[0], 2), _ms(line[1], 3)))
    return "; ".join(parts) or "nothing run twice yet"


def _batching(batching):
    """The Batching section: the scheduler's health, then one row per kind of request."""
    esc = html.escape
    parts = ["<h2>Batching</h2>"]
    problem = batching.get("problem")
    parts.append('<div class="%s" id="batching-health">%s</div>' % (
        "err" if problem else "meta", esc(problem) if problem else
        "batch threads running" + "".join(
            ' &middot; <span class="err">%s</span>' % esc(m)
            for m in batching.get("thread_failures", ()))))
    parts.append("<table id=\"batching\"><tr><th>model</th><th>version</th><th>signature</th>"
                 "<th>mode</th><th>in system</th><th>req/s in</th><th>plan</th>"
                 "<th>recent batches</th><th>queue delay p50 / p99 / max ms</th>"
                 "<th>bound ms</th><th>cost ms (alone / overlapped)</th></tr>")
    rows = [s for s in batching.get("learners", ()) if s["label"] is not None]
    if not rows:
        parts.append("<tr><td class=\"none\" colspan=\"11\">no batch run yet</td></tr>")
    for state in sorted(rows, key=lambda s: tuple(map(str, s["label"]))):
        model, version, signature = state["label"]
        sizes = state["recent_sizes"]
        recent = ("%d batches, mean %.1f, last %s (%s)" % (
            state["batches"], sum(sizes) / len(sizes), " ".join(map(str, sizes[-8:])),
            ", ".join("%s %d" % kv for kv in sorted(state["recent_reasons"].items())))
            if sizes else "none")
        plan = ("%d x %d rows" % (state["parallel"], state["target"]) if state["adaptive"]
                else "timeout rule")
        if state["adaptive"] and state.get("fill") is not None:
            plan += ", missing rows come within %s ms" % _ms(state["fill"])
        parts.append("<tr>" + _cell(esc(str(model))) + _cell(esc(str(version)))
                     + _cell(esc(str(signature or ""))) + _cell(
                         "adaptive" if state["adaptive"] else "TF Serving")
                     + _cell(state["concurrency"], True)
                     + _cell("%.1f" % state["arrival_rate"], True) + _cell(plan)
                     + _cell(esc(recent)) + _cell(" / ".join(
                         _ms(state[k]) or "-" for k in ("delay_p50", "delay_p99",
                                                         "delay_max")), True)
                     + _cell(_ms(state["bound"]), True) + _cell(_cost(state)) + "</tr>")
    parts.append("</table>")
    return "".join(parts)


def _drift_rows(drift, esc):
    parts = ["<h2>Drift</h2><table id=\"drift\"><tr><th>model</th><th>version</th>"
             "<th>checked</th><th>images</th><th>drift</th>"]
    parts += ["<th>%s</th>" % name for name in _STATISTICS]
    parts.append("<th>since</th></tr>")
    if not drift:
        parts.append("<tr><td class=\"none\" colspan=\"%d\">not checked yet: only models "
                     "with request logging are checked (--drift_check_interval_seconds, "
                     "SIGUSR2)</td></tr>" % (len(_STATISTICS) + 6))
    for (model, version) in sorted(drift, key=lambda k: (str(k[0]), k[1])):
        result = drift[(model, version)]
        row = "<tr>" + _cell(esc(str(model))) + _cell(version, True) + _cell(
            time.strftime("%H:%M:%S", time.gmtime(result.checked_at))) + _cell(
                result.images, True)
        if result.drift is None and not result.statistics:
            row += '<td class="none" colspan="%d">%s</td>' % (len(_STATISTICS) + 2,
                                                              esc(result.note))
        else:
            if result.drift is None:  # some statistic not computed: no evidence either way
                row += '<td class="none" title="%s">unknown</td>' % esc(result.note)
            else:
                row += '<td class="%s">%s</td>' % ("drift" if result.drift else "nodrift",
                                                   "yes" if result.drift else "no")
            for name in _STATISTICS:
                stat = result.statistics.get(name)
                row += _cell("-" if stat is None else '<span class="%s" title="%s">%.3g '
                             '/ %.3g</span>' % ("drift" if stat.drift else "", esc(stat.detail),
                                                stat.value, stat.threshold), True)
            row += _cell(time.strftime("%Y-%m-%d %H:%M", time.gmtime(result.since))
                         if result.since else "")
        parts.append(row + "</tr>")
    parts.append("</table><div class=\"meta\">statistic / calibrated threshold of the "
                 "newest window of logged traffic</div>")
    return parts


def render(models, traffic, refresh_seconds=5, title="slimserve", now=None, failing=None,
           batching=None, drift=None):
    """models: {name: [(version, state, error message)]}; traffic: RequestWindow.summary();
    failing: {component: message} of the background components failing
    (core/health.py), shown first; batching: {"problem": why batches cannot run or None,
    "thread_failures": [message], "learners": Batcher.learners()}, or None when batching
    is off; drift: DriftMonitor.results() (None: no drift section)."""
    esc = html.escape
    parts = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
             "<meta http-equiv=\"refresh\" content=\"%d\">" % refresh_seconds,
             "<title>%s status</title><style>%s</style></head><body>" % (esc(title), _STYLE),
             "<h1>%s model server</h1>" % esc(title),
             "<div class=\"meta\">%s UTC &middot; refreshes every %d s &middot; rates and "
             "latencies over the last minute</div>" % (
                 time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(now)), refresh_seconds)]
    if failing:
        parts.append("<h2>Failing</h2><table id=\"failing\"><tr><th>component</th>"
                     "<th>error</th></tr>")
        for component in sorted(failing):
            parts.append("<tr>" + _cell(esc(component)) + _cell(
                '<span class="err">%s</span>' % esc(failing[component])) + "</tr>")
        parts.append("</table>")
    parts.append("<h2>Models</h2><table id=\"models\"><tr><th>model</th><th>version</th>"
                 "<th>state</th><th>status</th></tr>")
    if not models:
        parts.append("<tr><td class=\"none\" colspan=\"4\">no model configured</td></tr>")
    for name in sorted(models):
        versions = models[name] or [(None, "none", "")]
        for version, state, message in versions:
            parts.append("<tr>" + _cell(esc(name)) + _cell("" if version is None else version)
                         + '<td class="%s">%s</td>' % (esc(state), esc(state))
                         + _cell('<span class="err">%s</span>' % esc(message) if message
                                 else "OK") + "</tr>")
    parts.append("</table><h2>Traffic</h2><table id=\"traffic\"><tr><th>model</th>"
                 "<th>version</th><th>API</th><th>req/s</th><th>errors</th><th>p50 ms</th>"
                 "<th>p90 ms</th><th>p99 ms</th></tr>")
    if not traffic:
        parts.append("<tr><td class=\"none\" colspan=\"8\">no request in the last minute"
                     "</td></tr>")
    for (model, version, api) in sorted(traffic, key=lambda k: tuple(map(str, k))):
        row = traffic[(model, version, api)]
        parts.append("<tr>" + _cell(esc(str(model))) + _cell(esc(str(version or "")))
                     + _cell(esc(api)) + _cell("%.2f" % row["rate"], True)
                     + _cell(row["errors"], True) + _cell("%.1f" % row["p50_ms"], True)
                     + _cell("%.1f" % row["p90_ms"], True) + _cell("%.1f" % row["p99_ms"], True)
                     + "</tr>")
    parts.append("</table>")
    if batching is not None:
        parts.append(_batching(batching))
    if drift is not None:
        parts += _drift_rows(drift, esc)
    parts.append("</body></html>\n")
    return "".join(parts)
