"""A Predict whose batch has no rows, answered the same on every CPU.

TF Serving feeds a request of zero rows to Session::Run, and the TensorFlow it is built
with (Eigen's kernels) answers with empty outputs. TensorFlow's oneDNN kernels, which
this server runs on every x86 CPU (slimserve/cpu.py), do not agree: a convolution and
pooling over 0 rows returns the wrong channel count (conv2d to 4 channels, then max_pool:
[0, 3] instead of [0, 4]), so an image model's next op fails with INVALID_ARGUMENT, or
worse, answers a wrong shape. The answer would depend on the CPU.

So a request whose every input has 0 rows and otherwise the declared shape, fed to a
signature that declares each of those inputs and each requested output batch-major
(leading dimension unknown, the rest known), is answered without running the graph: every requested output with 0 rows, its
other dimensions and dtype as the signature declares them — what TF Serving answers for
such a model. A signature that does not declare its shapes that far runs as before.
"""
import numpy as np
import tensorflow as tf


def _batch_major(info):
    """The declared dimensions after the batch one, or None where the TensorInfo does not
    say that its leading dimension is the (unknown) batch and the rest are known."""
    shape = info.tensor_shape
    if shape.unknown_rank or not shape.dim or shape.dim[0].size != -1:
        return None
    rest = [dim.size for dim in shape.dim[1:]]
    return rest if all(size >= 0 for size in rest) else None


def outputs_for_no_rows(sig, feeds, output_keys):
    """{output key: empty ndarray} when `feeds` (key -> ndarray) has 0 rows everywhere and
    `sig` declares every fed input and every key of `output_keys` batch-major; else None
    (the graph runs)."""
    if not feeds or any(getattr(value, "ndim", 0) < 1 or value.shape[0] != 0
                        for value in feeds.values()):
        return None
    for key, value in feeds.items():  # fed as declared past the batch, else the graph says
        if key not in sig.inputs or _batch_major(sig.inputs[key]) != list(value.shape[1:]):
            return None
    outputs = {}
    for key in output_keys:
        rest = _batch_major(sig.outputs[key])
        if rest is None:
            return None
        dtype = tf.dtypes.as_dtype(sig.outputs[key].dtype)
        numpy_dtype = object if dtype == tf.string else dtype.as_numpy_dtype
        outputs[key] = np.empty([0] + rest, dtype=numpy_dtype)
    return outputs
