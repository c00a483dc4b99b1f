"""How a TensorFlow session computes: oneDNN's bfloat16 rewrite and XLA:CPU clustering.

Built here and only here, at the top of the package, so training (estimator/
run_config.py's --precision and --xla), export verification and the server
(--mixed_precision, --xla_cpu_compilation_enabled) set the same ConfigProto fields in the
same way without importing each other.
"""
import logging
import os

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.client import pywrap_tf_session

from slimserve import cpu

BFLOAT16 = "bfloat16"  # the one --mixed_precision value TF Serving accepts
FLOAT32 = "float32"  # what a session without the rewrite computes in

# XLA may compile CPU clusters of sessions whose config asks for a JIT level
# (enable_xla_cpu_jit). This is TensorFlow's process-wide switch behind
# TF_XLA_FLAGS=--tf_xla_cpu_global_jit; TensorFlow fixes the CPU's clustering policy the
# first time a session runs a graph, so it is set when this module is imported, before
# any session of a server or a training run. Sessions without a JIT level (the default)
# are not affected.
pywrap_tf_session.TF_SetTfXlaCpuGlobalJit(True)


def onednn_enabled():
    """Whether this process's TensorFlow runs its oneDNN kernels (slimserve/cpu.py turns
    them on for every x86 CPU; TF_ENABLE_ONEDNN_OPTS=0 keeps them off)."""
    from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-import-not-at-top
    return bool(_pywrap_util_port.IsMklEnabled())


def bfloat16_unavailable():
    """Why oneDNN's bfloat16 rewrite cannot run in this process (one line), or None. The
    rewrite is a oneDNN pass: with oneDNN off TensorFlow skips it silently, and a
    "bfloat16" run would compute in float32 while saying otherwise."""
    if onednn_enabled() or tf.config.list_physical_devices("GPU"):
        return None
    return ("TensorFlow's oneDNN kernels are off here (%s=%s), and its bfloat16 rewrite "
            "needs them" % (cpu.ONEDNN_VARIABLE, os.environ.get(cpu.ONEDNN_VARIABLE, "unset")))


def enable_bfloat16(config, where="--mixed_precision=bfloat16"):
    """Turns on oneDNN's auto-mixed-precision rewrite in `config` (a ConfigProto): the
    graph's convolutions and matmuls run in bfloat16, variables stay float32. Warns when
    the CPU has no native bf16 (oneDNN then only emulates it, slower than float32). Where
    the rewrite cannot run (bfloat16_unavailable) it says so in one line and leaves
    `config` computing in float32, which precision() then reports."""
    reason = bfloat16_unavailable()
    if reason:
        logging.warning("%s: %s; computing in float32", where, reason)
        return config
    if cpu.cpu_supports_bf16() is False and not tf.config.list_physical_devices("GPU"):
        logging.warning("%s: this CPU has neither AVX512_BF16 nor AMX, so oneDNN only "
                        "emulates bfloat16; expect it to be slower than float32", where)
    config.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 = (
        rewriter_config_pb2.RewriterConfig.ON)
    return config


def enable_xla_cpu_jit(config):
    """XLA auto-clustering for `config`'s sessions, CPU ops included (global_jit_level;
    the CPU switch is set at import, above). Grappler's remapper is
    turned off: it fuses convolutions and matmuls into oneDNN ops (_MklNativeFusedConv2D)
    before clustering, which XLA cannot compile, so it would find almost nothing left
    (a resnet_v1_50 export: 0 clusters with it, its convolutions compiled without it)."""
    config.graph_options.optimizer_options.global_jit_level = (
        tf.compat.v1.OptimizerOptions.ON_1)
    config.graph_options.rewrite_options.remapping = rewriter_config_pb2.RewriterConfig.OFF
    return config


def precision(config):
    """What a session with `config` computes in: BFLOAT16 or FLOAT32."""
    rewrite = config.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16
    return BFLOAT16 if rewrite == rewriter_config_pb2.RewriterConfig.ON else FLOAT32


def xla_jit(config):
    """True when sessions with `config` compile clusters with XLA."""
    return config.graph_options.optimizer_options.global_jit_level > 0
