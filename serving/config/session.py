"""The tf.ConfigProto every model session gets, composed from the options as
tensorflow_model_server composes it: the session config file first, then the GPU memory
fraction, then the thread counts (intra/inter, else session_parallelism for both); then
--mixed_precision (the oneDNN bfloat16 rewrite, as saved_model_bundle_factory.cc sets it)
and --xla_cpu_compilation_enabled (XLA:CPU auto-clustering of the graph).

The bfloat16 and XLA settings are built here and only here: training
(estimator/run_config.py) and export verification use the same functions.
"""
import logging

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.client import pywrap_tf_session

from slimserve.serving.config import files

BFLOAT16 = "bfloat16"  # the one --mixed_precision value TF Serving accepts
FLOAT32 = "float32"  # what a session without the rewrite computes in

# XLA may compile CPU clusters of sessions whose config asks for a JIT level
# (enable_xla_cpu_jit). This is TensorFlow's process-wide switch behind
# TF_XLA_FLAGS=--tf_xla_cpu_global_jit; TensorFlow fixes the CPU's clustering policy the
# first time a session runs a graph, so it is set when this module is imported, before
# any session of a server or a training run. Sessions without a JIT level (the default)
# are not affected.
pywrap_tf_session.TF_SetTfXlaCpuGlobalJit(True)


def cpu_supports_bf16():
    """True when the CPU has native bf16 math (AVX512_BF16 or AMX); None when unknown
    (no /proc/cpuinfo). Without it oneDNN's bf16 rewrite emulates and gains nothing."""
    try:
        with open("/proc/cpuinfo") as handle:
            flags = set(handle.read().split())
    except OSError:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def enable_bfloat16(config, where="--mixed_precision=bfloat16"):
    """Turns on oneDNN's auto-mixed-precision rewrite in `config` (a ConfigProto): the
    graph's convolutions and matmuls run in bfloat16, variables stay float32. Warns when
    the CPU has no native bf16 (oneDNN then only emulates it, slower than float32)."""
    if cpu_supports_bf16() is False and not tf.config.list_physical_devices("GPU"):
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


def apply_mixed_precision(config, mode, where="--mixed_precision"):
    """--mixed_precision as TF Serving reads it: 'bfloat16' turns the rewrite on, empty
    leaves float32, anything else is logged as unsupported (TF Serving's wording) and
    runs in float32."""
    if mode == BFLOAT16:
        logging.info("Running inference with bfloat16 auto mixed precision")
        enable_bfloat16(config, "%s=%s" % (where, mode))
    elif mode:
        logging.warning("%s auto mixed precision is not supported. Valid option: bfloat16",
                        mode)
    return config


def base_session_config(options):
    """The ConfigProto the session flags compose, before precision and XLA (what TF
    Serving puts in SessionBundleConfig.session_config); a ValueError names the flag at
    fault."""
    config = tf.compat.v1.ConfigProto()
    if options.session_config is not None:
        config.CopyFrom(options.session_config)
    elif options.tensorflow_session_config_file:
        config.CopyFrom(files.read_session_config(options.tensorflow_session_config_file))
    if not 0 <= options.per_process_gpu_memory_fraction <= 1:
        raise ValueError("--per_process_gpu_memory_fraction must be within [0, 1], got %r"
                         % options.per_process_gpu_memory_fraction)
    if options.per_process_gpu_memory_fraction:
        config.gpu_options.per_process_gpu_memory_fraction = (
            options.per_process_gpu_memory_fraction)
    intra = options.tensorflow_intra_op_parallelism
    inter = options.tensorflow_inter_op_parallelism
    both = options.tensorflow_session_parallelism
    if intra > 0 and inter > 0 and both > 0:
        raise ValueError("Either configure --tensorflow_session_parallelism or "
                         "(--tensorflow_intra_op_parallelism, "
                         "--tensorflow_inter_op_parallelism) separately. You cannot "
                         "configure all.")
    if intra > 0 or inter > 0:
        config.intra_op_parallelism_threads, config.inter_op_parallelism_threads = intra, inter
    elif both > 0:
        config.intra_op_parallelism_threads = config.inter_op_parallelism_threads = both
    return config


def session_config(options, settings=None):
    """ServerOptions -> the tf.compat.v1.ConfigProto of every model session: the session
    config of `settings` (config/platform.py's BundleSettings: a platform config file's,
    or the session flags') with its mixed precision, then
    --xla_cpu_compilation_enabled and --thread_pool_factory_config_file."""
    if settings is None:
        config, mixed_precision = base_session_config(options), options.mixed_precision
    else:
        config, mixed_precision = settings.session_config, settings.mixed_precision
    config = apply_mixed_precision(tf.compat.v1.ConfigProto.FromString(
        config.SerializeToString()), mixed_precision)
    if options.xla_cpu_compilation_enabled:
        enable_xla_cpu_jit(config)
    if options.thread_pool_factory_config_file:
        apply_thread_pool_factory(config, files.read_thread_pool_factory_config(
            options.thread_pool_factory_config_file), "--thread_pool_factory_config_file %s"
            % options.thread_pool_factory_config_file)
    return config


THREAD_POOL_TYPE = "tensorflow.ThreadPoolOptionProto"


def apply_thread_pool_factory(config, factory_config, where):
    """--thread_pool_factory_config_file where it maps onto TensorFlow's session pools.

    TF Serving hands each Session::Run the inter- and intra-op thread pools a registered
    ThreadPoolFactory makes (thread::ThreadPoolOptions, a C++-only argument); its own
    build registers no factory, so there any file fails at start-up. Here the
    thread_pool_factory_config Any may hold a tensorflow.ThreadPoolOptionProto
    (num_threads, global_name): it becomes the inter-op pool every model run uses
    (ConfigProto.session_inter_op_thread_pool, run option 0), shared by all models when
    global_name is set, as a factory's pools are. Intra-op work stays on the session's
    intra-op pool (intra_op_parallelism_threads): Python cannot pass a per-run one."""
    from tensorflow.core.protobuf import config_pb2  # pylint: disable=import-outside-toplevel
    packed = factory_config.thread_pool_factory_config
    pool = config_pb2.ThreadPoolOptionProto()
    if packed.TypeName() != THREAD_POOL_TYPE:
        raise ValueError("%s: thread_pool_factory_config holds %r; the one thread pool "
                         "factory here takes a %s (num_threads, global_name), which "
                         "becomes the inter-op pool of every model run" % (
                             where, packed.type_url or "nothing", THREAD_POOL_TYPE))
    pool.ParseFromString(packed.value)
    if pool.num_threads < 0:
        raise ValueError("%s: num_threads must be >= 0 (0: one per core), got %d"
                         % (where, pool.num_threads))
    if config.session_inter_op_thread_pool:
        raise ValueError("%s: the session config already lists session_inter_op_thread_pool;"
                         " give the pool in one place" % where)
    if config.use_per_session_threads:
        raise ValueError("%s: use_per_session_threads in the session config disables "
                         "session_inter_op_thread_pool" % where)
    config.session_inter_op_thread_pool.add().CopyFrom(pool)
    return config
