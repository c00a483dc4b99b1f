"""Session, distribution and precision settings for the Estimator's RunConfig.

Kept apart from train.py so export and benchmarks build sessions the same way.
"""
import json
import logging
import os

import tensorflow as tf

from slimserve import compute
from slimserve import errors
from slimserve.cpu import cpu_supports_bf16  # noqa: F401  (one check for training and serving)
from slimserve.estimator import compat

PRECISIONS = ("fp32", "bf16", "fp16")
DISTRIBUTIONS = ("auto", "none", "mirrored", "collective")


def session_config(xla=False, precision="fp32", intra_op_threads=0, inter_op_threads=0):
    """ConfigProto with XLA and graph-rewrite mixed precision when asked for.

    bf16 uses oneDNN's auto-mixed-precision rewrite (CPUs with AVX512_BF16/AMX), built by
    the same function as the server's --mixed_precision=bfloat16; fp16 uses the CUDA
    auto-mixed-precision rewrite (GPUs). Variables stay fp32, so checkpoints and exports
    are the same as an fp32 run's. xla: XLA:CPU auto-clustering, as the server's
    --xla_cpu_compilation_enabled.
    """
    if precision not in PRECISIONS:
        raise errors.UserError("--precision must be one of %s, got %r"
                               % (PRECISIONS, precision))
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True,
                                      intra_op_parallelism_threads=intra_op_threads,
                                      inter_op_parallelism_threads=inter_op_threads)
    config.gpu_options.allow_growth = True
    rewrite = config.graph_options.rewrite_options
    if precision == "bf16":
        compute.enable_bfloat16(config, "--precision=bf16")
    elif precision == "fp16":
        rewrite.auto_mixed_precision = rewrite.ON if hasattr(rewrite, "ON") else 1
    if xla:
        compute.enable_xla_cpu_jit(config)
    return config


def split_cpu(replicas):
    """Splits the host CPU into N logical devices (to exercise multi-device paths
    without GPUs). Must run before TensorFlow initialises its devices."""
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)])
    return ["/cpu:%d" % i for i in range(replicas)]


def tf_config_cluster():
    """The cluster spec from TF_CONFIG, or {} when training on one machine."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return {}
    try:
        return json.loads(raw).get("cluster", {})
    except ValueError as error:
        raise errors.UserError("TF_CONFIG is not valid JSON: %s" % error) from None


def is_chief():
    """True on the task that writes run files and exports: the chief (or master), worker 0
    of a cluster without a chief, or a single machine without TF_CONFIG."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return True
    try:
        config = json.loads(raw)
    except ValueError as error:
        raise errors.UserError("TF_CONFIG is not valid JSON: %s" % error) from None
    task = config.get("task", {})
    kind = task.get("type", "chief")
    if kind in ("chief", "master"):
        return True
    return kind == "worker" and task.get("index") == 0 and "chief" not in config.get(
        "cluster", {})


def strategy(distribution="auto", num_gpus=0, cpu_replicas=0):
    """None (plain Estimator; between-graph PS training when TF_CONFIG names ps), a
    MirroredStrategy over GPUs or logical CPUs, or multi-worker collective all-reduce."""
    if distribution not in DISTRIBUTIONS:
        raise errors.UserError("--distribution must be one of %s, got %r"
                         % (DISTRIBUTIONS, distribution))
    cluster = tf_config_cluster()
    if distribution == "auto":
        if num_gpus > 1 or cpu_replicas > 1:
            distribution = "mirrored"
        elif cluster and "ps" not in cluster and len(cluster.get("worker", [])) > 0:
            distribution = "collective"
        else:
            distribution = "none"
    if distribution == "none":
        return None
    if distribution == "collective":
        return tf.distribute.experimental.MultiWorkerMirroredStrategy()
    if cpu_replicas > 1:
        devices = split_cpu(cpu_replicas)
    elif num_gpus > 0:
        devices = ["/gpu:%d" % i for i in range(num_gpus)]
    else:
        devices = None
    logging.info("mirroring over %s", devices or "all local devices")
    return compat.mirrored_strategy(devices)
