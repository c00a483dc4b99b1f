"""The hostile soak (issue 21's acceptance): `make soak`, not part of `make test`.

    python benchmarks/soak.py [--minutes 10] [--log_disk_mb 64] [--address_space_gb 4]

A real slimserve-server (started by serving/server_process.py, the one launcher,
under an address-space cap), with request logging at sampling 1.0 onto a
small tmpfs of its own (the script re-runs itself under `unshare -m`, or `unshare -rm`
when not root, so the mount is private), serves for --minutes while:

- valid clients send gRPC Predict / Classify / Regress / GetModelStatus and REST predict /
  classify, checking every answer, and now and then a valid 4 MiB Predict;
- hostile clients send unknown and 1 MiB model names, unknown and over-long signatures and
  labels, tensor bombs, wrong dtypes, malformed REST bodies and paths, and
  ReloadConfigRequests that must fail (log prefixes outside --request_log_dir or
  escaping it, a model with no versions);
- the model config file is edited every --edit_seconds (a second model comes and goes, the
  served model's log prefix switches), and a new version of the served model appears
  every --churn_seconds (old ones are deleted);
- the log disk is filled at a third of the run for --full_seconds, then freed;
- SIGUSR1 asks for a flush every 30 s, /metrics and the status page are scraped every 2 s,
  and a shipper reads the published log files (request_log.iter_logs) and deletes them
  every 5 s, as a log collector would.

At the end the server gets SIGTERM; the "closed; N record(s) written" lines of its request
loggers are summed and compared with the records read. It passes with 0 failed valid
requests, RSS growth under 100 MB after the first minute, and every record counted as
written read back; the figures go to stdout and <work_dir>/soak.json.
"""
import argparse
import collections
import concurrent.futures
import glob
import http.client
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import common  # pylint: disable=wrong-import-order

_NAMESPACE_ENV = "SLIMSERVE_SOAK_NAMESPACE"


def _private_namespace():
    """Re-runs this script in a private mount namespace, once."""
    if os.environ.get(_NAMESPACE_ENV) == "1":
        return
    unshare = shutil.which("unshare")
    if unshare is None:
        sys.exit("soak: needs util-linux's unshare (a private mount namespace for the tmpfs)")
    command = [unshare, "-m" if os.geteuid() == 0 else "-rm", sys.executable] + sys.argv
    os.execve(unshare, command, dict(os.environ, **{_NAMESPACE_ENV: "1"}))


def _parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--work_dir", default=os.path.join(common.WORK, "soak"))
    parser.add_argument("--log_disk_mb", type=int, default=64, help="tmpfs for the logs")
    parser.add_argument("--address_space_gb", type=float, default=4.0,
                        help="address-space cap (RLIMIT_AS) of the server")
    parser.add_argument("--edit_seconds", type=float, default=3.0)
    parser.add_argument("--churn_seconds", type=float, default=5.0)
    parser.add_argument("--full_seconds", type=float, default=30.0)
    parser.add_argument("--valid_clients", type=int, default=4)
    parser.add_argument("--hostile_clients", type=int, default=3)
    return parser.parse_args()


ARGS = None
if __name__ == "__main__":
    ARGS = _parse_args()
    _private_namespace()

from slimserve.cli import logs  # noqa: E402

logs.quiet_tensorflow()
logging.getLogger().setLevel(logging.WARNING)  # the shipper's per-file lines
# pylint: disable=wrong-import-position  (after quiet_tensorflow and the namespace switch)
import grpc  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from google.protobuf import text_format  # noqa: E402
from tensorflow_serving.apis import classification_pb2  # noqa: E402
from tensorflow_serving.apis import get_model_status_pb2  # noqa: E402
from tensorflow_serving.apis import model_management_pb2  # noqa: E402
from tensorflow_serving.apis import model_service_pb2_grpc  # noqa: E402
from tensorflow_serving.apis import predict_pb2  # noqa: E402
from tensorflow_serving.apis import prediction_service_pb2_grpc  # noqa: E402
from tensorflow_serving.apis import regression_pb2  # noqa: E402

from slimserve.serving import server_process  # noqa: E402
from slimserve.serving.observability import metrics as metrics_lib  # noqa: E402
from slimserve.serving.observability import request_log  # noqa: E402
from slimserve.testing import tiny_models  # noqa: E402

C = grpc.StatusCode
BIG_EVERY_SECONDS = 10.0  # per valid client: a 4 MiB Predict (a 10 MiB log record)
_CLOSED = re.compile(r"request log (\S+): closed; (\d+) record\(s\) written, (\d+) not written")


class Tally:
    """Thread-safe counters by (kind, outcome)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counts = collections.Counter()
        self.failures = collections.Counter()  # valid requests not answered right, by why

    def add(self, key, n=1):
        with self._lock:
            self.counts[key] += n

    def fail(self, why):
        with self._lock:
            self.failures[why[:200]] += 1


# --- the server's files --------------------------------------------------------------

def _entry(name, base, prefix=None, rate=1.0):
    logging_config = ""
    if prefix:
        logging_config = ('logging_config { log_collector_config { type: "file" '
                          'filename_prefix: "%s" } sampling_config { sampling_rate: %g } }'
                          % (prefix, rate))
    return 'config { name: "%s" base_path: "%s" model_platform: "tensorflow" %s }' % (
        name, base, logging_config)


def _config_text(*entries):
    return "model_config_list { %s }\n" % " ".join(entries)


def _write_atomically(path, text):
    temp = path + ".tmp"
    with open(temp, "w") as handle:
        handle.write(text)
    os.replace(temp, path)


class Versions:
    """A new version of `base` every call of churn(), copied from a template and published
    by rename; versions two behind the newest are deleted."""

    def __init__(self, base, template):
        self.base, self.template = base, template
        self.newest = 1
        shutil.copytree(template, os.path.join(base, "1"))

    def churn(self):
        self.newest += 1
        temp = os.path.join(self.base, ".incoming-%d" % self.newest)
        shutil.copytree(self.template, temp)
        os.rename(temp, os.path.join(self.base, str(self.newest)))
        for name in os.listdir(self.base):
            if name.isdigit() and int(name) <= self.newest - 3:
                shutil.rmtree(os.path.join(self.base, name), ignore_errors=True)


# --- valid traffic ---------------------------------------------------------------------

def _predict_request(rows, name="tiny"):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(rows))
    return request


def _expected(rows):
    return rows @ np.array([[1.0], [2.0]], np.float32) + 0.5


def _examples(request_input, rows):
    for x0, x1 in rows:
        request_input.example_list.examples.add().CopyFrom(
            tiny_models.tiny_example(float(x0), float(x1)))


def valid_client(stubs, rest_port, stop, tally, seed):
    rng = random.Random(seed)
    predict, model = stubs
    next_big = time.monotonic() + rng.uniform(0, BIG_EVERY_SECONDS)
    while not stop.is_set():
        kind = rng.choice(["predict", "predict", "classify", "regress", "status",
                           "rest_predict", "rest_predict", "rest_classify"])
        if time.monotonic() >= next_big:
            kind, next_big = "big", time.monotonic() + BIG_EVERY_SECONDS
        rows = np.round(np.array([[rng.uniform(-3, 3), rng.uniform(-3, 3)]
                                  for _ in range(rng.randint(1, 8))], np.float32), 3)
        try:
            if kind in ("predict", "big"):
                if kind == "big":  # 4 MiB of input, logged at sampling 1.0 too
                    rows = np.full([512 * 1024, 2], 0.25, np.float32)
                response = predict.Predict(_predict_request(rows), timeout=120)
                y = tf.make_ndarray(response.outputs["y"])
                ok = np.allclose(y, _expected(rows), atol=1e-4)
            elif kind == "classify":
                request = classification_pb2.ClassificationRequest()
                request.model_spec.name, request.model_spec.signature_name = "tiny", "classify"
                _examples(request.input, rows)
                response = predict.Classify(request, timeout=60)
                ok = len(response.result.classifications) == len(rows)
            elif kind == "regress":
                request = regression_pb2.RegressionRequest()
                request.model_spec.name, request.model_spec.signature_name = "tiny", "regress"
                _examples(request.input, rows)
                response = predict.Regress(request, timeout=60)
                values = [r.value for r in response.result.regressions]
                ok = np.allclose(values, _expected(rows)[:, 0], atol=1e-3)
            elif kind == "status":
                request = get_model_status_pb2.GetModelStatusRequest()
                request.model_spec.name = "tiny"
                response = model.GetModelStatus(request, timeout=60)
                ok = any(s.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
                         for s in response.model_version_status)
            elif kind == "rest_predict":
                status, body = _http(rest_port, "POST", "/v1/models/tiny:predict",
                                     json.dumps({"instances": rows.tolist()}))
                ok = status == 200 and np.allclose(
                    [p["y"] if isinstance(p, dict) else p for p in
                     json.loads(body)["predictions"]], _expected(rows), atol=1e-4)
            else:
                status, body = _http(rest_port, "POST", "/v1/models/tiny:classify", json.dumps(
                    {"signature_name": "classify",
                     "examples": [{"x": [float(a), float(b)]} for a, b in rows]}))
                ok = status == 200 and len(json.loads(body)["results"]) == len(rows)
            if not ok:
                tally.fail("%s: wrong answer" % kind)
            tally.add(("valid", kind, "OK" if ok else "WRONG"))
        except grpc.RpcError as error:
            tally.fail("%s: %s %s" % (kind, error.code().name, error.details()))
            tally.add(("valid", kind, error.code().name))
        except (OSError, ValueError, KeyError, http.client.HTTPException) as error:
            tally.fail("%s: %r" % (kind, error))
            tally.add(("valid", kind, type(error).__name__))


def _http(port, method, path, body=None, timeout=60):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


# --- hostile traffic -------------------------------------------------------------------

def _bomb():
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    request.inputs["x"].dtype = tf.float32.as_datatype_enum
    for size in (10 ** 9, 2):
        request.inputs["x"].tensor_shape.dim.add().size = size
    return request


def _reload_request(*entries):
    request = model_management_pb2.ReloadConfigRequest()
    text_format.Parse(_config_text(*entries), request.config)
    return request


def hostile_client(stubs, rest_port, stop, tally, seed, base, work_dir):
    rng = random.Random(seed)
    predict, model = stubs
    outside = os.path.join(work_dir, "attacker")
    reloads = [
        _reload_request(_entry("tiny", base, os.path.join(outside, "x"))),
        _reload_request(_entry("tiny", base, "../../attacker/x")),
        _reload_request(_entry("tiny", base, "gs://bucket/x")),
        _reload_request(_entry("tiny", base), _entry("ghost", os.path.join(work_dir, "none"))),
    ]
    expected = {
        "unknown_model": {C.NOT_FOUND}, "huge_name": {C.INVALID_ARGUMENT},
        "unknown_signature": {C.FAILED_PRECONDITION, C.INVALID_ARGUMENT},
        "long_signature": {C.INVALID_ARGUMENT}, "unknown_label": {C.INVALID_ARGUMENT},
        "bomb": {C.INVALID_ARGUMENT}, "dtype": {C.INVALID_ARGUMENT},
        "status_unknown": {C.NOT_FOUND}, "reload": {C.INVALID_ARGUMENT, C.UNKNOWN},
        "rest_json": {400}, "rest_unknown": {404}, "rest_path": {400, 404},
        "rest_nesting": {400},
    }
    while not stop.is_set():
        kind = rng.choice(sorted(expected))
        try:
            if kind.startswith("rest_"):
                if kind == "rest_json":
                    status, _ = _http(rest_port, "POST", "/v1/models/tiny:predict",
                                      b"{\"instances\": [1, 2" + os.urandom(64))
                elif kind == "rest_unknown":
                    status, _ = _http(rest_port, "POST", "/v1/models/m%d:predict"
                                      % rng.getrandbits(64), b'{"instances": [[1, 2]]}')
                elif kind == "rest_path":
                    status, _ = _http(rest_port, "GET", "/v1/models/tiny/versions/x%d/zz"
                                      % rng.getrandbits(32))
                else:
                    status, _ = _http(rest_port, "POST", "/v1/models/tiny:predict",
                                      b'{"instances": ' + b"[" * 5000 + b"]" * 5000 + b"}")
                outcome = status
            else:
                if kind == "unknown_model":
                    predict.Predict(_predict_request(np.ones([1, 2], np.float32),
                                                     "m%d" % rng.getrandbits(64)), timeout=60)
                elif kind == "huge_name":
                    predict.Predict(_predict_request(np.ones([1, 2], np.float32),
                                                     "n" * (1 << 20)), timeout=60)
                elif kind in ("unknown_signature", "long_signature", "unknown_label"):
                    request = _predict_request(np.ones([1, 2], np.float32))
                    if kind == "unknown_label":
                        request.model_spec.version_label = "l%d" % rng.getrandbits(64)
                    else:
                        request.model_spec.signature_name = (
                            "s%d" % rng.getrandbits(64) if kind == "unknown_signature"
                            else "s" * 4096)
                    predict.Predict(request, timeout=60)
                elif kind == "bomb":
                    predict.Predict(_bomb(), timeout=60)
                elif kind == "dtype":
                    predict.Predict(_predict_request(np.ones([1, 2], np.int64)), timeout=60)
                elif kind == "status_unknown":
                    request = get_model_status_pb2.GetModelStatusRequest()
                    request.model_spec.name = "m%d" % rng.getrandbits(64)
                    model.GetModelStatus(request, timeout=60)
                else:
                    model.HandleReloadConfigRequest(rng.choice(reloads), timeout=120)
                outcome = C.OK
        except grpc.RpcError as error:
            outcome = error.code()
        except (OSError, http.client.HTTPException) as error:
            outcome = type(error).__name__
        name = outcome.name if isinstance(outcome, C) else outcome
        tally.add(("hostile", kind, name))
        if outcome not in expected[kind]:
            tally.add(("hostile_unexpected", kind, name))
        time.sleep(0.005)


# --- the operator's side ---------------------------------------------------------------

def _rss_mb(pid):
    try:
        with open("/proc/%d/status" % pid) as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


class Shipper:
    """Reads published log files with iter_logs and deletes them, as a log collector."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.records = 0
        self.files = 0
        self.torn = 0

    def ship(self):
        for path in sorted(glob.glob(os.path.join(self.log_dir, "**", "*.tfrecord"),
                                     recursive=True)):
            report = []
            self.records += sum(1 for _ in request_log.iter_logs(glob.escape(path), report))
            self.torn += sum(r.torn_bytes > 0 for r in report)
            self.files += 1
            os.unlink(path)


def _fill(directory):
    """Fills the file system of `directory` to its last byte; returns the filler's path."""
    path = os.path.join(directory, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for size in (1 << 20, 4096, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError:
                    break
    finally:
        os.close(fd)
    return path


def main(args):
    work = os.path.abspath(args.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    log_dir = os.path.join(work, "logs")
    for path in (work, log_dir):
        os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm" % args.log_disk_mb, "tmpfs",
                    log_dir], check=True)
    template_root = os.path.join(work, "template")
    tiny_models.write_tiny_model(template_root, 1)
    template = os.path.join(template_root, "1")
    base, extra = os.path.join(work, "models", "tiny"), os.path.join(work, "models", "extra")
    os.makedirs(base)
    os.makedirs(extra)
    versions = Versions(base, template)
    shutil.copytree(template, os.path.join(extra, "1"))
    variants = [_config_text(_entry("tiny", base, "tiny/a")),
                _config_text(_entry("tiny", base, "tiny/b"),
                             _entry("extra", extra, "extra/x", rate=0.5))]
    config_file = os.path.join(work, "models.config")
    _write_atomically(config_file, variants[0])
    monitoring = os.path.join(work, "monitoring.config")
    _write_atomically(monitoring, "prometheus_config { enable: true }\n")
    server_log = os.path.join(work, "server.log")
    flags = ["--model_config_file=%s" % config_file,
             "--model_config_file_poll_wait_seconds=1", "--file_system_poll_wait_seconds=1",
             "--request_log_dir=%s" % log_dir, "--monitoring_config_file=%s" % monitoring,
             "--enable_batching", "--enable_model_warmup=false", "--status_page"]
    try:
        server = server_process.ServerProcess(
            flags, "soak", log_path=server_log,
            memory_cap=int(args.address_space_gb * 1024 ** 3))
    except server_process.ServerNotStarted as error:
        raise SystemExit("soak: %s (see %s)" % (error, server_log)) from None
    process, grpc_port, rest_port = server.process, server.port, server.rest_port
    print("soak: server pid %d, gRPC %d, REST %d, %.0f minutes; log in %s"
          % (process.pid, grpc_port, rest_port, args.minutes, server_log), flush=True)

    tally, stop = Tally(), threading.Event()
    channel = grpc.insecure_channel("127.0.0.1:%d" % grpc_port, options=[
        ("grpc.max_send_message_length", 64 << 20),
        ("grpc.max_receive_message_length", 64 << 20)])
    stubs = (prediction_service_pb2_grpc.PredictionServiceStub(channel),
             model_service_pb2_grpc.ModelServiceStub(channel))
    pool = concurrent.futures.ThreadPoolExecutor(args.valid_clients + args.hostile_clients)
    clients = [pool.submit(valid_client, stubs, rest_port, stop, tally, seed)
               for seed in range(args.valid_clients)]
    clients += [pool.submit(hostile_client, stubs, rest_port, stop, tally, 100 + seed, base,
                            work) for seed in range(args.hostile_clients)]

    shipper = Shipper(log_dir)
    started = time.monotonic()
    duration = args.minutes * 60.0
    rss = []  # (seconds, MB)
    scrapes = collections.Counter()
    events = collections.Counter()
    last = collections.defaultdict(float)
    fill_at, filler, freed_at = duration / 3.0, None, None
    log_counts = {}
    try:
        while True:
            now = time.monotonic() - started
            if now >= duration or process.poll() is not None:
                break
            if now - last["rss"] >= 5:
                last["rss"] = now
                rss.append((round(now, 1), _rss_mb(process.pid)))
            if now - last["edit"] >= args.edit_seconds:
                last["edit"] = now
                events["config edits"] += 1
                _write_atomically(config_file, variants[events["config edits"] % 2])
            if now - last["churn"] >= args.churn_seconds:
                last["churn"] = now
                versions.churn()
                events["versions published"] += 1
            if now - last["flush"] >= 30:
                last["flush"] = now
                process.send_signal(signal.SIGUSR1)
                events["SIGUSR1 flushes"] += 1
            if now - last["scrape"] >= 2:
                last["scrape"] = now
                for path in (metrics_lib.PATH, "/"):
                    try:
                        status, body = _http(rest_port, "GET", path)
                    except (OSError, http.client.HTTPException) as error:
                        status, body = type(error).__name__, b""
                    scrapes[(path, status)] += 1
                    if path == "/" and status == 200:
                        scrapes["max page bytes"] = max(scrapes["max page bytes"], len(body))
                    if path == metrics_lib.PATH and status == 200:
                        scrapes["max metrics bytes"] = max(scrapes["max metrics bytes"],
                                                           len(body))
                        if now < 60 or not scrapes["metrics bytes at 1 min"]:
                            scrapes["metrics bytes at 1 min"] = len(body)
                        scrapes["metrics bytes at the end"] = len(body)
                        with open(os.path.join(work, "metrics-last.txt"), "wb") as handle:
                            handle.write(body)
                        family = metrics_lib.families_from_text(body.decode()).get(
                            metrics_lib.REQUEST_LOG_COUNT)
                        log_counts = {(s.labels["model_name"], s.labels["status_code"]): s.value
                                      for s in family.samples} if family else log_counts
            if filler is None and now >= fill_at:
                filler = _fill(log_dir)
                events["disk filled at s"] = round(now)
            if filler and freed_at is None and now >= fill_at + args.full_seconds:
                os.unlink(filler)
                freed_at = now
                events["disk freed at s"] = round(now)
            if now - last["ship"] >= 5 and (filler is None or freed_at is not None):
                last["ship"] = now
                shipper.ship()
            time.sleep(0.2)
    finally:
        stop.set()
        for client in clients:
            try:
                client.result(timeout=180)
            except Exception as error:  # pylint: disable=broad-except
                tally.fail("client thread: %r" % error)
        pool.shutdown()
        channel.close()
        died = process.poll()
        server.stop(grace_seconds=120)  # SIGTERM: the loggers close; SIGKILL after 120 s
    shipper.ship()  # what the final SIGTERM published
    leftovers = sorted(os.path.relpath(p, log_dir) for p in glob.glob(
        os.path.join(log_dir, "**", ".*"), recursive=True))
    written = not_written = 0
    with open(server_log) as handle:
        for line in handle:
            match = _CLOSED.search(line)
            if match:
                written += int(match.group(2))
                not_written += int(match.group(3))
    subprocess.run(["umount", "-l", log_dir], check=False)

    valid = sum(n for key, n in tally.counts.items() if key[0] == "valid")
    valid_ok = sum(n for key, n in tally.counts.items() if key[0] == "valid" and key[2] == "OK")
    hostile = sum(n for key, n in tally.counts.items() if key[0] == "hostile")
    after_first_minute = [mb for t, mb in rss if t >= 60 and mb is not None]
    second_minute = [mb for t, mb in rss if 60 <= t < 120 and mb is not None]
    last_minute = [mb for t, mb in rss if t >= duration - 60 and mb is not None]
    # Growth is a trend, not a spike of a few large requests in flight: the median of the
    # last minute against the median of the second.
    growth = (float(np.median(last_minute)) - float(np.median(second_minute))
              if second_minute and last_minute else None)
    report = {
        "minutes": args.minutes, "server_exit_code": process.returncode,
        "server_died_during_run": died is not None,
        "valid_requests": valid, "valid_ok": valid_ok, "valid_failed": valid - valid_ok,
        "valid_failures": dict(tally.failures.most_common(20)),
        "hostile_requests": hostile,
        "hostile_outcomes": {"%s %s" % k[1:]: n for k, n in sorted(tally.counts.items())
                             if k[0] == "hostile"},
        "hostile_unexpected": {"%s %s" % k[1:]: n for k, n in sorted(tally.counts.items())
                               if k[0] == "hostile_unexpected"},
        "rss_mb": rss, "rss_growth_after_first_minute_mb": growth,
        "log_records_written": written, "log_records_not_written": not_written,
        "log_records_read": shipper.records, "log_files_read": shipper.files,
        "log_files_with_torn_tail": shipper.torn, "log_leftover_hidden_files": leftovers,
        "request_log_count_last_scrape": {"%s %s" % k: v for k, v in sorted(log_counts.items())},
        "scrapes": {"%s %s" % k if isinstance(k, tuple) else k: v for k, v in scrapes.items()},
        "events": dict(events),
    }
    checks = {
        "0 failed valid requests": valid > 0 and valid == valid_ok,
        "server alive until SIGTERM": died is None and process.returncode == 0,
        "RSS growth < 100 MB after the first minute": growth is not None and growth < 100,
        "every record counted as written was read": written > 0 and
                                                    shipper.records == written,
        "records were lost while the disk was full (and counted)": not_written > 0,
        "every scrape answered 200": all(k[1] == 200 for k in scrapes if isinstance(k, tuple)),
    }
    report["checks"] = checks
    with open(os.path.join(work, "soak.json"), "w") as handle:
        json.dump(report, handle, indent=1, default=str)
    common.table("soak: %.0f minutes" % args.minutes, ["figure", "value"], [
        ["valid requests (ok / failed)", "%d / %d" % (valid_ok, valid - valid_ok)],
        ["hostile requests (unexpected answers)",
         "%d (%d)" % (hostile, sum(report["hostile_unexpected"].values()))],
        ["server RSS, median of minute 2 / of the last minute / peak after minute 1 (MB)",
         "%.0f / %.0f / %.0f" % (np.median(second_minute), np.median(last_minute),
                                 max(after_first_minute)) if growth is not None else "-"],
        ["log records written / read / not written", "%d / %d / %d" % (
            written, shipper.records, not_written)],
        ["log files read (torn tails)", "%d (%d)" % (shipper.files, shipper.torn)],
        ["config edits / versions / flushes", "%d / %d / %d" % (
            events["config edits"], events["versions published"], events["SIGUSR1 flushes"])],
        ["/metrics bytes at 1 min / at the end / largest", "%d / %d / %d" % (
            scrapes["metrics bytes at 1 min"], scrapes["metrics bytes at the end"],
            scrapes["max metrics bytes"])],
        ["status page bytes, largest", scrapes["max page bytes"]],
    ])
    for name, ok in checks.items():
        print("%s %s" % ("PASS" if ok else "FAIL", name))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main(ARGS))
