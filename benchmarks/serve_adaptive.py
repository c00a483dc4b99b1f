"""bench-serve's `adaptive` section (not in the default set): the adaptive batch scheduler
(`--enable_batching` without a parameters file) against TF Serving's defaults
(benchmarks/batching_defaults.config: 32 rows, 0 us, one thread) and the tuner's choice
(benchmarks/tuned_<size>.config), in float32 and bfloat16, at 1, 2, 4, 8, 16 and 32
closed-loop clients, with an unbatched server at 1 client; every row of a size takes its
turn in every round (serve_limit.py's table: each row against the in-process rate at the
best batch no larger than its concurrency), then one summary line per precision and
concurrency:

    python benchmarks/bench_serve.py --sections adaptive --limit_sizes 32 --rounds 1 \
        --adaptive_concurrency 1,8 --adaptive_precisions fp32

Acceptance (issue 31): at 224 adaptive >= 0.9 of the in-process rate at batch <= c at
every concurrency, p50 at 1 client within 5% of unbatched serving, >= 0.95 of the tuner's
choice at 32 clients; at 32 no worse than the best of defaults and tuned at every
concurrency.
"""
import os

import numpy as np

import common  # pylint: disable=wrong-import-order
import serve_limit  # pylint: disable=wrong-import-order

DEFAULTS_FILE = "benchmarks/batching_defaults.config"
TUNED_FILE = "benchmarks/tuned_%d.config"


def variants(size, precisions, levels):
    """The --variant texts of one size: adaptive, defaults and tuned per precision at
    every level, and unbatched at 1 client."""
    texts = []
    for precision in precisions:
        flags = " ".join(serve_limit.PRECISION_FLAGS[precision])
        batching = "--enable_batching --batching_parameters_file=%s" % os.path.join(
            common.ROOT, "%s")
        texts += ["%s adaptive=--enable_batching %s" % (precision, flags),
                  "%s defaults=%s %s" % (precision, batching % DEFAULTS_FILE, flags),
                  "%s tuned=%s %s" % (precision, batching % (TUNED_FILE % size), flags)]
        if 1 in levels:
            texts.append("%s unbatched@1=%s" % (precision, flags))
    return texts


def adaptive_section(args, photos):
    levels = [int(c) for c in args.adaptive_concurrency.split(",")]
    precisions = [p for p in args.adaptive_precisions.split(",") if p]
    for size in [int(x) for x in args.limit_sizes.split(",") if x]:
        results = serve_limit.limit_section(args, photos, variants(size, precisions, levels),
                                            [size], levels, warm_levels=levels)
        summary(size, precisions, levels, *results[size])


def summary(size, precisions, levels, rows, seen, by_batch):
    """Per precision and concurrency: adaptive against the in-process rate at batch <= c,
    against the best of defaults and tuned (per round, median), and its p50 against
    unbatched at 1 client."""
    def row(name, precision, level):
        return next((r for r in rows if r[0] == "%s %s" % (precision, name) and
                     r[2] == level), None)

    def rates(key):
        return np.array([m["images_per_s"] for m in seen[key]])

    def p50(key):
        latencies = [x for m in seen[key] for x in m["latencies_ms"]]
        return np.percentile(latencies, 50) if latencies else float("nan")

    table = []
    for precision in precisions:
        for level in levels:
            adaptive = row("adaptive", precision, level)
            others = [r for r in (row("defaults", precision, level),
                                  row("tuned", precision, level)) if r is not None]
            # as the table's "vs batch <= c": against each round's in-process best-batch
            # rate, scaled by what the batch search found reachable at batch <= c
            fraction = max(r for b, r in by_batch[precision].items() if b <= level) / max(
                by_batch[precision].values())
            limit = rates(("limit", precision, None, None))
            best = np.max([rates(r) for r in others], axis=0)
            unbatched = row("unbatched", precision, level)
            table.append([
                precision, level, "%.1f" % np.median(rates(adaptive)),
                "%.1f" % (np.median(limit) * fraction),
                "**%.2f**" % (np.median(rates(adaptive) / limit) / fraction),
                "%.2f" % np.median(rates(adaptive) / best),
                "%.2f" % np.median(rates(adaptive) / rates(row("tuned", precision, level))),
                "%.1f" % p50(adaptive),
                "%.2f" % (p50(adaptive) / p50(unbatched)) if unbatched else ""])
    common.table(
        "%dx%d adaptive batching: against the in-process rate at the best batch <= c, the "
        "best of TF Serving's defaults and the tuned file (per round), and unbatched p50"
        % (size, size),
        ["precision", "concurrency", "adaptive img/s", "in-process batch <= c img/s",
         "vs batch <= c", "vs best of defaults/tuned", "vs tuned", "p50 ms",
         "p50 vs unbatched"], table)
