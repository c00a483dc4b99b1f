"""What the serving benchmark's sections share (benchmarks/bench_serve.py runs them): the
exported models they serve, the in-process reference call, serialized requests, the
server child and the closed-loop load.

Servers start as `slimserve-server` children through serving/server_process.py (the
project's one launcher: free ports from the ready line, a memory cap, gone with this
process); another checkout's server (the baseline rows) is the same launcher running
benchmarks/checkout.py, which imports that checkout's libraries instead of this install's.
Load comes from serving/clients/loadtest.py `run_level`, the generator slimserve-loadtest
and slimserve-tune use, with a raw-bytes gRPC `send` (benchmarks/request_rate.py) where
the client's own cost must stay out of the figure.
"""
import dataclasses
import os
import sys

import numpy as np

import common  # pylint: disable=wrong-import-order
import request_rate  # pylint: disable=wrong-import-order

from slimserve.cli import logs  # pylint: disable=wrong-import-order

logs.quiet_tensorflow()
import tensorflow as tf  # noqa: E402  pylint: disable=wrong-import-position

from slimserve.estimator import model  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.estimator import nets  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.export import signatures  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.export import verify  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.export import writer  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.serving import server_process  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.serving.clients import loadtest  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.testing import servers  # noqa: E402  pylint: disable=wrong-import-position

PREDICT = "/tensorflow.serving.PredictionService/Predict"


def make_export(base, size):
    """A randomly initialised resnet_v1_50 exported like a trained one."""
    if writer.list_versions(base):
        return os.path.join(base, str(writer.list_versions(base)[-1]))
    config = model.ModelConfig(model_name="resnet_v1_50", num_classes=10,
                               class_names=[str(i) for i in range(10)])
    graph = tf.Graph()
    with graph.as_default():
        images = tf.compat.v1.placeholder(tf.float32, [None, size, size, 3])
        model.model_fn({"image": images}, tf.zeros([1], tf.int32), tf.estimator.ModeKeys.TRAIN,
                       dataclasses.asdict(config))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            checkpoint = tf.compat.v1.train.Saver().save(
                session, os.path.join(common.work_dir("serve_ckpt"), "model.ckpt"))
    serving = nets.preprocessing_spec("resnet_v1_50", size)
    return writer.write_saved_model(base, checkpoint, config, serving)


def tiny_model(base):
    """slimserve/testing/tiny_models.py's SavedModel (inference costs ~nothing) under `base`."""
    from slimserve.testing import tiny_models  # pylint: disable=import-outside-toplevel
    if not writer.list_versions(base):
        tiny_models.write_tiny_model(base)
    return base


def tiny_request():
    """(base path of tiny_model, a serialized one-row PredictRequest for it): the request
    whose serving costs ~nothing, for the rows that measure the server itself."""
    from tensorflow_serving.apis import predict_pb2  # pylint: disable=import-outside-toplevel
    base = tiny_model(os.path.join(common.WORK, "tiny_models", "tiny"))
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([[1.0, 2.0]], tf.float32))
    return base, request.SerializeToString()


def load_session(export_dir):
    session = tf.compat.v1.Session(graph=tf.Graph())
    meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
    return session, meta


def run_in_process(session, meta, images, index, batch):
    """The in-process call the server is measured against: same images, same order
    as the load test's request `index`."""
    feed = {signatures.IMAGE_BYTES: np.array(
        [images[(index * batch + i) % len(images)] for i in range(batch)], dtype=object)}
    verify.run_signature(session, meta, signatures.DEFAULT, feed)


def predict_requests(images, model_name="resnet"):
    """One serialized PredictRequest per image, made before any timing: neither the
    served nor the bare-grpcio side pays client-side conversion in the measurement."""
    from tensorflow_serving.apis import predict_pb2  # pylint: disable=import-outside-toplevel
    out = []
    for image in images:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.inputs[signatures.IMAGE_BYTES].CopyFrom(tf.make_tensor_proto([image]))
        out.append(request.SerializeToString())
    return out


def start_server(base, batching=False, batch_file=None, logging_rate=None,
                 model_name="resnet", root=None, extra_args=()):
    """A slimserve-server child serving `base` -> its ServerProcess (.address, .rest_port,
    .batch_totals(), .stop()). With `logging_rate`, the model is served from a model
    config whose logging_config samples that share of requests to TFRecords (the
    request-logging cost rows). `root`: run another checkout's server (the baseline
    rows), else this one's. Capped at the suite's MODEL_MEMORY_CAP of address space
    (slimserve/testing/servers.py: a served ResNet), so a regression that allocates
    without bound fails that server, not the machine."""
    if logging_rate is None:
        models = ["--model_name=%s" % model_name, "--model_base_path=%s" % base]
    else:
        config = os.path.join(common.work_dir("serve_logging"), "models-%g.config" % logging_rate)
        with open(config, "w") as handle:
            handle.write(
                'model_config_list { config { name: "%s" base_path: "%s" '
                'model_platform: "tensorflow" logging_config { log_collector_config { '
                'type: "file" filename_prefix: "%s" } sampling_config { sampling_rate: %g '
                '} } } }\n' % (model_name, base, os.path.join(
                    common.work_dir("serve_logging"), "log-%g" % logging_rate), logging_rate))
        models = ["--model_config_file=%s" % config]
    flags = models + ["--file_system_poll_wait_seconds=0", "--monitoring_config_file=%s"
                      % os.path.join(common.ROOT, "serving", "tfserving", "monitoring.config")]
    if batching:
        flags += ["--enable_batching", "--batching_parameters_file=%s" % batch_file]
    flags += list(extra_args)
    label = "%s%s%s" % (model_name, " batching" if batching else "",
                        " (%s)" % root if root else "")
    command = None  # this checkout's server
    if root:  # that checkout's libraries, not the ones this install maps (checkout.py)
        command = [sys.executable, os.path.join(common.ROOT, "benchmarks", "checkout.py"),
                   root, server_process.SERVER_MODULE]
    return server_process.ServerProcess(
        flags, label, memory_cap=servers.MODEL_MEMORY_CAP, cwd=root or common.ROOT,
        command=command, env=dict(os.environ, PYTHONPATH=root or common.ROOT))


def closed_loop(target, requests, concurrency, seconds, warmup=1.0):
    """`concurrency` clients each sending one serialized PredictRequest (cycling through
    `requests`) and the next as soon as it is answered, for `seconds` after `warmup`:
    loadtest.run_level with a raw-bytes gRPC send, so the client's own conversions stay
    out of the figure. -> {"images_per_s", "p50_ms", "p99_ms", "errors", "latencies_ms"}."""
    with request_rate.GrpcSender(target, PREDICT, requests, timeout=120) as send:
        result = loadtest.run_level(None, None, concurrency, None, warmup + seconds,
                                    send=send, warmup_seconds=warmup)
    return {"images_per_s": result["requests_per_s"],
            "errors": sum(result["errors"].values()), "p50_ms": result["p50_ms"],
            "p99_ms": result["p99_ms"], "latencies_ms": result["latencies_ms"]}
