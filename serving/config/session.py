"""The tf.ConfigProto every model session gets, composed from the options as
tensorflow_model_server composes it: the session config file first, then the GPU memory
fraction, then the thread counts (intra/inter, else session_parallelism for both)."""
import tensorflow as tf

from slimserve.serving.config import files


def session_config(options):
    """ServerOptions -> tf.compat.v1.ConfigProto; a ValueError names the flag at fault."""
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
