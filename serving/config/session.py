"""The tf.ConfigProto every model session gets, composed from the options as
tensorflow_model_server composes it: the session config file first, then the GPU memory
fraction, then the thread counts (intra/inter, else session_parallelism for both); then
--mixed_precision (the oneDNN bfloat16 rewrite, as saved_model_bundle_factory.cc sets it)
and --xla_cpu_compilation_enabled (XLA:CPU auto-clustering of the graph).

The bfloat16 and XLA settings themselves live in slimserve/compute.py, shared with
training (estimator/run_config.py) and export verification.
"""
import logging

import tensorflow as tf

from slimserve import compute
from slimserve import errors
from slimserve.serving.config import bounds
from slimserve.serving.config import files

# The bfloat16 and XLA settings themselves (shared with training and export verification)
BFLOAT16, FLOAT32 = compute.BFLOAT16, compute.FLOAT32
enable_bfloat16 = compute.enable_bfloat16
precision = compute.precision
xla_jit = compute.xla_jit


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
    Serving puts in SessionBundleConfig.session_config); a UserError names the flag at
    fault (the options' bounds are checked by ServerOptions.check)."""
    config = tf.compat.v1.ConfigProto()
    if options.session_config is not None:
        config.CopyFrom(bounds.check(options.session_config, "session_config"))
    elif options.tensorflow_session_config_file:
        path = options.tensorflow_session_config_file
        config.CopyFrom(bounds.check(files.read_session_config(path),
                                     "--tensorflow_session_config_file %s" % path))
    if options.per_process_gpu_memory_fraction:
        config.gpu_options.per_process_gpu_memory_fraction = (
            options.per_process_gpu_memory_fraction)
    intra = options.tensorflow_intra_op_parallelism
    inter = options.tensorflow_inter_op_parallelism
    both = options.tensorflow_session_parallelism
    if intra > 0 and inter > 0 and both > 0:
        raise errors.UserError("Either configure --tensorflow_session_parallelism or "
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
        compute.enable_xla_cpu_jit(config)
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
        raise files.ConfigError("%s: thread_pool_factory_config holds %r; the one thread pool "
                         "factory here takes a %s (num_threads, global_name), which "
                         "becomes the inter-op pool of every model run" % (
                             where, packed.type_url or "nothing", THREAD_POOL_TYPE))
    pool.ParseFromString(packed.value)
    # each is a thread started at the first model load (100000 crashed TensorFlow there)
    bounds.check(pool, "%s: thread_pool_factory_config" % where)
    if config.session_inter_op_thread_pool:
        raise files.ConfigError("%s: the session config already lists session_inter_op_thread_pool;"
                         " give the pool in one place" % where)
    if config.use_per_session_threads:
        raise files.ConfigError("%s: use_per_session_threads in the session config disables "
                         "session_inter_op_thread_pool" % where)
    config.session_inter_op_thread_pool.add().CopyFrom(pool)
    return config
