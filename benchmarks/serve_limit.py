"""bench-serve's `limit` section (not in the default set): served throughput per
precision (float32, --mixed_precision=bfloat16, --xla_cpu_compilation_enabled) against
the machine's limit, in-process session.run at its best batch size in the same precision,
with each precision's agreement with float32 on the validation images of a trained digits
model. Each --variant is a server of its own; every row is measured in every round, the
order rotating.

    python benchmarks/bench_serve.py --sections=limit --limit_sizes=32 \
        --variant "fp32 tuned@32=--enable_batching --batching_parameters_file=benchmarks/tuned_32.config"
"""
import os
import subprocess
import sys
import time

import numpy as np

import common  # pylint: disable=wrong-import-order
import serve_harness as harness  # pylint: disable=wrong-import-order

import tensorflow as tf  # noqa: E402  (quieted by serve_harness)  pylint: disable=wrong-import-order

from slimserve.export import signatures  # pylint: disable=wrong-import-order
from slimserve.export import writer  # pylint: disable=wrong-import-order
from slimserve.serving.clients import client as client_lib  # pylint: disable=wrong-import-order

DIGITS_STEPS = 300  # the trained model of the `limit` section (~97% accurate on digits)
PRECISION_FLAGS = {"fp32": [], "bf16": ["--mixed_precision=bfloat16"],
                   "xla": ["--xla_cpu_compilation_enabled"]}


def digits_model(steps=DIGITS_STEPS):
    """(data dir, model dir) of resnet_v1_50 trained on the digits at 32x32 with the
    test suite's flags (tests/conftest.py) for `steps` steps; made once under bench_out."""
    import make_digits  # pylint: disable=import-outside-toplevel
    root = common.work_dir("digits_%d" % steps)
    data, run = os.path.join(root, "data"), os.path.join(root, "run")
    if os.path.exists(os.path.join(root, "done")):
        return data, run
    images = os.path.join(root, "images")
    make_digits.write_digits(images, size=32)
    for argv in (["slimserve.cli.convert", "--input", images, "--output_dir", data,
                  "--overwrite", "--noprogress"],
                 ["slimserve.cli.train", "--data_dir", data, "--model_dir", run,
                  "--image_size", "32", "--max_steps", str(steps), "--batch_size", "32",
                  "--save_checkpoints_steps", str(steps), "--batch_norm_decay", "0.9",
                  "--optimizer", "adam", "--learning_rate", "0.001", "--opt_epsilon", "1e-8",
                  "--min_crop_area", "0.85", "--norandom_flip", "--eval_central_fraction",
                  "1.0", "--moving_average_decay", "0.99"]):
        subprocess.run([sys.executable, "-m"] + argv, check=True, cwd=common.ROOT)
    open(os.path.join(root, "done"), "w").close()
    return data, run


def trained_export(model_dir, size):
    """The trained digits checkpoint exported for `size`x`size` inputs (its own export at
    32; at 224 the same weights, the digits upscaled by the graph): -> base path."""
    import dataclasses as dc  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import preprocessing  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import run_files  # pylint: disable=import-outside-toplevel
    base = common.work_dir("%s_export_%d" % (os.path.basename(os.path.dirname(model_dir)),
                                             size))
    if not writer.list_versions(base):
        run = run_files.read(model_dir)
        spec = dc.replace(preprocessing.Spec.from_dict(run["serving"]), image_size=size)
        writer.write_saved_model(base, tf.train.latest_checkpoint(model_dir),
                                 run_files.model_config(run), spec)
    return base


class InProcessLimit:
    """The machine's limit for one precision: the export run in this process by
    serving's own Servable (cached session callables, the session config the server's
    flags make), one caller feeding batches of `batch` images back to back."""

    def __init__(self, export_dir, precision, images):
        from slimserve.serving import options as options_lib  # pylint: disable=import-outside-toplevel
        from slimserve.serving.config import session as session_lib  # pylint: disable=import-outside-toplevel
        from slimserve.serving.core import servable as servable_lib  # pylint: disable=import-outside-toplevel
        options = options_lib.ServerOptions(
            mixed_precision="bfloat16" if precision == "bf16" else "",
            xla_cpu_compilation_enabled=precision == "xla")
        self.servable = servable_lib.Servable("limit", 0, export_dir,
                                              session_lib.session_config(options))
        _, self.signature = self.servable.signature(signatures.DEFAULT)
        self.outputs = sorted(self.signature.outputs)
        self.images = images
        self.batch = None

    def rate(self, batch, seconds):
        feeds = {signatures.IMAGE_BYTES: np.array(
            [self.images[i % len(self.images)] for i in range(batch)], dtype=object)}
        self.servable.run(self.signature, feeds, self.outputs)  # (XLA compiles per shape)
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            self.servable.run(self.signature, feeds, self.outputs)
            done += batch
        return done / (time.perf_counter() - started)

    def probabilities(self, images):
        return np.concatenate([self.servable.run(self.signature, {
            signatures.IMAGE_BYTES: np.array(images[i:i + 32], dtype=object)},
            [signatures.PROBABILITIES])[signatures.PROBABILITIES]
            for i in range(0, len(images), 32)])

    def close(self):
        self.servable.retire()


def served_probabilities(target, images):
    client = client_lib.Client(target, retries=0)
    try:
        return np.concatenate([client.predict({signatures.IMAGE_BYTES: images[i:i + 8]})[
            signatures.PROBABILITIES] for i in range(0, len(images), 8)])
    finally:
        client.close()


def parse_variants(texts):
    """["NAME[@LEVELS]=FLAGS", ...] -> [(name, precision, [flags], levels or None)]; the
    precision (fp32, bf16, xla) is read off the flags; LEVELS (e.g. @8 or @8,16) limits
    the variant's rows to those concurrencies (a config tuned for one); FLAGS may start
    with @DIR: that checkout's server."""
    variants = []
    for text in texts:
        name, _, flags = text.partition("=")
        name, _, levels = name.partition("@")
        flags = flags.split()
        precision = ("bf16" if "--mixed_precision=bfloat16" in flags else
                     "xla" if any(f.startswith("--xla_cpu_compilation_enabled") and
                                  not f.endswith("false") for f in flags) else "fp32")
        levels = [int(x) for x in levels.split(",")] if levels else None
        for other in variants:  # one row per name and concurrency, or the table is ambiguous
            if other[0] == name.strip() and (levels is None or other[3] is None or
                                             set(levels) & set(other[3])):
                raise SystemExit("--variant %r: another variant named %r has rows at the "
                                 "same concurrency; give it other @LEVELS or another name"
                                 % (text, other[0]))
        variants.append((name.strip(), precision, flags, levels))
    return variants


def limit_section(args, photos, texts=None, sizes=None, levels=None, warm_levels=None):
    """Served throughput against the in-process best-batch limit per precision, with the
    agreement column, at every --limit_sizes; one table per size (--variant: the served
    rows). texts / sizes / levels replace --variant / --limit_sizes /
    --limit_concurrency (another section's rows); warm_levels: warm every server at each
    of these concurrencies (default: the largest level only). -> {size: what
    limit_table returns}."""
    data_dir, model_dir = digits_model(args.digits_steps)
    from slimserve.estimator import schema  # pylint: disable=import-outside-toplevel
    from slimserve.estimator import splits  # pylint: disable=import-outside-toplevel
    digits = splits.read_images(data_dir, schema.VALIDATION)[0]
    variants = parse_variants(texts if texts is not None else args.variant)
    results = {}
    for size in sizes or [int(x) for x in args.limit_sizes.split(",") if x]:
        base = trained_export(model_dir, size)
        export_dir = os.path.join(base, str(writer.list_versions(base)[-1]))
        images = (photos if size >= 96 else digits)[:64]  # what the load sends
        precisions = sorted({v[1] for v in variants} | {"fp32"},
                            key=list(PRECISION_FLAGS).index)
        limits = {p: InProcessLimit(export_dir, p, images) for p in precisions}
        servers = {}
        try:
            for index, (_, _, flags, _) in enumerate(variants):
                root = flags[0][1:] if flags and flags[0].startswith("@") else None
                servers[index] = harness.start_server(
                    base, root=root, extra_args=flags[1:] if root else flags)
            results[size] = limit_table(args, size, variants, limits, servers, images,
                                        digits, levels, warm_levels)
        finally:
            for server in servers.values():
                server.stop(grace_seconds=60)
            for limit in limits.values():
                limit.close()
    return results


def limit_table(args, size, variants, limits, servers, images, digits, levels=None,
                warm_levels=None):
    """Measures and prints one size's table -> (rows, {row: [measurement per round]},
    {precision: in-process rate per batch size})."""
    batches = [int(b) for b in args.limit_batches.split(",")]
    levels = levels or [int(c) for c in args.limit_concurrency.split(",")]
    # agreement with float32 on every validation digit, served end to end
    reference = limits["fp32"].probabilities(digits)
    agreement = {}
    for index in range(len(variants)):
        got = served_probabilities(servers[index].address, digits)
        agreement[index] = (float(np.mean(got.argmax(1) == reference.argmax(1))),
                           float(np.abs(got - reference).max()))
    for precision, limit in limits.items():
        got = limit.probabilities(digits)
        agreement["limit " + precision] = (float(np.mean(got.argmax(1) ==
                                                         reference.argmax(1))),
                                           float(np.abs(got - reference).max()))
    # each precision's best batch, searched once (the rounds then re-measure that one)
    for precision, limit in limits.items():
        rates = {b: limit.rate(b, args.limit_seconds / 2) for b in batches}
        limit.batch = max(rates, key=rates.get)
        limit.by_batch = rates
        print("%dx%d %s in-process img/s by batch: %s -> best %d" % (
            size, size, precision, ", ".join("%d: %.1f" % kv for kv in rates.items()),
            limit.batch), flush=True)
    requests = harness.predict_requests(images)
    for server in servers.values():  # warm each server at every batch size it forms
        for level in warm_levels or [max(levels)]:
            harness.closed_loop(server.address, requests, level, 2.0, warmup=0.5)
    # a row: (name, precision, concurrency, variant index); a name may repeat across
    # variants tuned for different concurrencies ("fp32 tuned@8", "fp32 tuned@16"), so
    # servers and agreement are keyed by the variant's index, never by its name
    rows = [("limit", p, None, None) for p in limits] + [
        (name, precision, level, index) for level in levels
        for index, (name, precision, _, only) in enumerate(variants)
        if only is None or level in only]
    seen = {row: [] for row in rows}
    batch_rows = {}
    for round_index in range(args.rounds):
        turn = round_index % len(rows)
        for row in rows[turn:] + rows[:turn]:
            name, precision, level, index = row
            if level is None:
                limit = limits[precision]
                seen[row].append({"images_per_s": limit.rate(limit.batch, args.limit_seconds),
                                  "p50_ms": float("nan"), "p99_ms": float("nan"),
                                  "errors": 0, "latencies_ms": []})
                continue
            before = servers[index].batch_totals()
            seen[row].append(harness.closed_loop(servers[index].address, requests, level,
                                                 args.limit_seconds))
            after = servers[index].batch_totals()
            got = batch_rows.setdefault(row, [0, 0])
            got[0] += after[0] - before[0]
            got[1] += after[1] - before[1]
        print("round %d done" % (round_index + 1), flush=True)
    table = []
    for row in rows:
        name, precision, level, index = row
        rates = np.array([r["images_per_s"] for r in seen[row]])
        limit_rates = np.array([r["images_per_s"] for r in
                                seen[("limit", precision, None, None)]])
        fp32_row = ("limit", "fp32", None, None) if level is None else next(
            (r for r in rows if r[2] == level and r[1] == "fp32"
             and r[0].split()[1:] == name.split()[1:]), None)
        vs_fp32 = ("%.2f" % np.median(rates / np.array(
            [r["images_per_s"] for r in seen[fp32_row]])) if fp32_row else "")
        latencies = [x for r in seen[row] for x in r["latencies_ms"]]
        rows_batches = batch_rows.get(row)
        agree = agreement["limit " + precision if level is None else index]
        # c clients can form batches of at most c: the in-process rate at the best such
        # batch (from the search) is what serving could reach at that concurrency
        by_batch = limits[precision].by_batch
        reachable = max((r for b, r in by_batch.items() if level is None or b <= level),
                        default=float("nan")) / max(by_batch.values())
        table.append([
            "in-process, best batch %d" % limits[precision].batch if level is None else name,
            precision, level or "", "%.1f" % np.median(rates),
            "%.1f" % np.percentile(latencies, 50) if latencies else "",
            "%.1f" % np.percentile(latencies, 99) if latencies else "",
            "%.2f" % (rows_batches[0] / rows_batches[1]) if rows_batches and rows_batches[1]
            else "", sum(r["errors"] for r in seen[row]),
            "**%.2f**" % np.median(rates / limit_rates),
            "%.2f" % (np.median(rates / limit_rates) / reachable), vs_fp32,
            "%.4f" % agree[0], "%.4f" % agree[1]])
    common.table(
        "%dx%d, trained digits resnet_v1_50 (%d steps), batch-1 requests from closed-loop "
        "clients vs in-process session.run at its best batch (%d cores; %d rounds of "
        "%.0f s, order rotating)" % (size, size, args.digits_steps, os.cpu_count(),
        args.rounds, args.limit_seconds),
        ["path", "precision", "concurrency", "img/s", "p50 ms", "p99 ms", "mean batch",
         "errors", "vs limit", "vs batch <= c", "vs fp32", "agreement", "max |dp|"], table)
    print("(img/s: median over the rounds; vs limit: median of per-round img/s / the "
          "in-process best-batch img/s of the same precision; vs batch <= c: vs limit "
          "divided by what in-process reaches at the best batch no larger than the "
          "concurrency (c closed-loop clients never form a larger batch; from the batch "
          "search); vs fp32: the same against the float32 row of the same path; agreement "
          "/ max |dp|: argmax agreement and largest probability difference with in-process "
          "float32 on all %d validation digits, sent through that path)" % len(digits))
    print_paired(rows, seen)
    return rows, seen, {p: limit.by_batch for p, limit in limits.items()}


def print_paired(rows, seen):
    """Every two variants at one concurrency, per round: the rows of a level run next to
    each other in each round, so the ratio of their img/s in the same round cancels most
    of the machine's drift between rounds (the medians above do not); printed as the
    median and the quartiles of those ratios."""
    levels = sorted({row[2] for row in rows if row[2] is not None})
    for level in levels:
        at = [row for row in rows if row[2] == level]
        for i, first in enumerate(at):
            for second in at[i + 1:]:
                ratios = np.array([a["images_per_s"] / max(1e-9, b["images_per_s"])
                                   for a, b in zip(seen[first], seen[second])])
                print("%d clients, per round: %s / %s: median %.3f (quartiles %.3f-%.3f, "
                      "%d rounds; %d of them above 1)" % (
                          level, first[0], second[0], np.median(ratios),
                          np.percentile(ratios, 25), np.percentile(ratios, 75), len(ratios),
                          int(np.sum(ratios > 1))))
