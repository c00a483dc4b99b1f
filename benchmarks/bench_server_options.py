"""Server option variants side by side: the maximum gRPC and REST request rate on the
tiny SavedModel at one concurrency, each variant a server of its own, all up at once and
measured in turns (order rotating every round), so the ratios hold on a noisy machine.

    python benchmarks/bench_server_options.py --variant "" --variant "--grpc_max_threads 8"

A variant "@DIR ARGS" runs the server of another checkout DIR (e.g. the previous commit,
`git archive HEAD~1 | tar -x -C DIR`).
"""
import argparse
import json
import os

import numpy as np

import common  # pylint: disable=wrong-import-order
import request_rate  # pylint: disable=wrong-import-order
import serve_harness  # pylint: disable=wrong-import-order

from slimserve.serving.clients import loadtest  # pylint: disable=wrong-import-order


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", default=[],
                        help="Extra server flags (repeat; '' is the default server).")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rest", action="store_true", help="Also measure REST (tiny only).")
    parser.add_argument("--image_size", type=int, default=0,
                        help="Serve bench_serve.py's resnet_v1_50 at this size (one real "
                             "JPEG per request) instead of the tiny model.")
    args = parser.parse_args()
    if args.image_size:
        import make_photos  # pylint: disable=import-outside-toplevel
        photos = common.work_dir("photos")
        if not os.listdir(photos):
            make_photos.write_photos(photos, 400)
        model_name = "resnet"
        base = os.path.join(common.WORK, "serve_models_%d" % args.image_size)
        serve_harness.make_export(base, args.image_size)
        request = serve_harness.predict_requests(loadtest.load_images(photos)[:1])[0]
    else:
        model_name = "tiny"
        base, request = serve_harness.tiny_request()
    body = json.dumps({"instances": [[1.0, 2.0]]}).encode()
    variants = args.variant or [""]
    servers = {}
    try:
        for variant in variants:
            root, flags = None, variant.split()
            if flags and flags[0].startswith("@"):
                root, flags = flags[0][1:], flags[1:]
            servers[variant] = serve_harness.start_server(base, model_name=model_name,
                                                          root=root, extra_args=flags)
        runs = {}
        for variant, server in servers.items():
            runs[("grpc", variant)] = (lambda target=server.address: request_rate.grpc_rate(
                target, serve_harness.PREDICT, request, args.concurrency, args.seconds))
            if args.rest and not args.image_size:
                port = server.rest_port
                runs[("rest", variant)] = (lambda port=port: request_rate.http_rate(
                    port, "/v1/models/tiny:predict", body, args.concurrency, args.seconds))
        rates = {key: [] for key in runs}
        order = list(runs)
        for round_index in range(args.rounds):
            turn = round_index % len(order)
            for key in order[turn:] + order[:turn]:
                rates[key].append(runs[key]()[0])
    finally:
        for server in servers.values():
            server.stop()
    first = {api: np.array(rates[(api, variants[0])]) for api in ("grpc", "rest")
             if (api, variants[0]) in rates}
    rows = [[api, variant or "(default)", "%.0f" % np.median(values),
             "%.2f" % np.median(np.array(values) / first[api])]
            for (api, variant), values in rates.items()]
    common.table("maximum request rate, %s, %d in flight, %d rounds of %.0f s"
                 % ("resnet_v1_50 at %d" % args.image_size if args.image_size else "tiny model",
                    args.concurrency, args.rounds, args.seconds),
                 ["api", "server variant", "requests/s", "vs first variant"], rows)


if __name__ == "__main__":
    main()
