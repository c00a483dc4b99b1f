"""bench-serve's `table` section: closed-loop batch-1 load at each --concurrency against
the served model (batching off and on, with request logging at --logging_rates, and with
--baseline_root the previous code's server) and against in-process session.run of the
same SavedModel with the same number of threads, all up at once and measured in turns,
the order rotating every round.

    python benchmarks/bench_serve.py --sections=table
"""
import os

import numpy as np

import common  # pylint: disable=wrong-import-order
import serve_harness as harness  # pylint: disable=wrong-import-order

from slimserve.serving.clients import client as client_lib  # pylint: disable=wrong-import-order
from slimserve.serving.clients import loadtest  # pylint: disable=wrong-import-order

LOCAL = "in-process session.run"
OFF = "served, batching off"
ON = "served, batching on"
LOGGED = "served, batching off, logging %g"
BASELINE_OFF = "baseline code, batching off"
BASELINE_ON = "baseline code, batching on"


def _logging_rate(name):
    return float(name.rsplit(" ", 1)[1]) if name.startswith(LOGGED.split("%")[0]) else None


def local_concurrent(session, meta, images, concurrency, requests, first_index):
    """The in-process reference at the same concurrency: `concurrency` threads each
    calling session.run with one image, `requests` calls in all (as the load test does)."""
    return loadtest.run_level(
        None, images, concurrency, requests, first_index=first_index,
        send=lambda index: harness.run_in_process(session, meta, images, index, 1))


def table_section(args, images):
    """The concurrency rows (and, with --baseline_root, the previous code's): --image_size,
    --concurrency, --requests, --rounds, --logging_rates, the batching flags."""
    base = os.path.join(common.WORK, "serve_models_%d" % args.image_size)
    export_dir = harness.make_export(base, args.image_size)
    batch_file = os.path.join(common.WORK, "batching.config")
    with open(batch_file, "w") as handle:
        handle.write("max_batch_size { value: %d }\nbatch_timeout_micros { value: %d }\n"
                     "max_enqueued_batches { value: 1000 }\nnum_batch_threads { value: %d }\n"
                     % (args.max_batch_size, args.batch_timeout_micros, args.num_batch_threads))
    levels = [int(c) for c in args.concurrency.split(",")]
    session, meta = harness.load_session(export_dir)
    kinds = [OFF, ON] + [LOGGED % rate for rate in args.logging_rates] + (
        [BASELINE_OFF, BASELINE_ON] if args.baseline_root else [])
    servers = {}
    rows, logging_notes = [], []
    try:
        for name in kinds:
            servers[name] = harness.start_server(
                base, name in (ON, BASELINE_ON), batch_file, _logging_rate(name),
                root=args.baseline_root if name in (BASELINE_OFF, BASELINE_ON) else None)
        clients = {name: client_lib.Client(server.address, retries=0)
                   for name, server in servers.items()}
        for client in clients.values():
            loadtest.run_level(client, images, 2, 10)  # warm the channel and the model
        for level in levels:
            per_round = args.requests // args.rounds
            totals_before = {name: servers[name].batch_totals()
                             for name in (ON, BASELINE_ON) if name in servers}
            seen = {name: {"latencies": [], "rates": [], "errors": 0}
                    for name in [LOCAL] + kinds}

            def measure(name, round_index, level=level, per_round=per_round, seen=seen):
                first = round_index * args.requests
                if name == LOCAL:
                    result = local_concurrent(session, meta, images, level, per_round, first)
                else:
                    result = loadtest.run_level(clients[name], images, level, per_round,
                                                first_index=first)
                seen[name]["latencies"] += result["latencies_ms"]
                seen[name]["rates"].append(result["images_per_s"])
                seen[name]["errors"] += sum(result["errors"].values())

            order = [LOCAL] + kinds
            for round_index in range(args.rounds):
                # every kind takes its turn in every round, the order rotating, so no row
                # gains from running first or last on this drifting machine
                turn = round_index % len(order)
                for name in order[turn:] + order[:turn]:
                    measure(name, round_index)
            mean_batch = {}
            for name, before in totals_before.items():
                after = servers[name].batch_totals()
                batches = after[1] - before[1]
                mean_batch[name] = ("%.2f" % ((after[0] - before[0]) / batches)
                                    if batches else "")
            local_rates = np.array(seen[LOCAL]["rates"])
            for rate in args.logging_rates:
                logging_notes.append(
                    "request logging at sampling %g, concurrency %d: %.2f of the throughput "
                    "without logging (median of per-round ratios)" % (
                        rate, level, np.median(np.array(seen[LOGGED % rate]["rates"]) /
                                               np.array(seen[OFF]["rates"]))))
            for name in [LOCAL] + kinds:
                latencies = seen[name]["latencies"]
                rates = np.array(seen[name]["rates"])
                rows.append([
                    name, level, "%.2f" % np.percentile(latencies, 50),
                    "%.2f" % np.percentile(latencies, 90), "%.2f" % np.percentile(latencies, 99),
                    "%.1f" % np.median(rates), mean_batch.get(name, ""),
                    seen[name]["errors"], "%.2f" % np.median(rates / local_rates)])
        for client in clients.values():
            client.close()
    finally:
        for server in servers.values():
            server.stop()
    session.close()
    common.table("batch-1 requests, closed loop, %dx%d (%d cores; %d rounds, order rotating)"
                 % (args.image_size, args.image_size, os.cpu_count(), args.rounds),
                 ["path", "concurrency", "p50 ms", "p90 ms", "p99 ms", "img/s", "mean batch",
                  "errors", "vs in-process"], rows)
    print("(img/s: median over the rounds; vs in-process: median over the rounds of img/s "
          "/ the in-process img/s of the same round, %s, same concurrency)" % LOCAL)
    print("\n".join([""] + logging_notes))
