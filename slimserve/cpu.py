"""What this machine's CPU can do, for the commands that choose a precision.

Plain Python (no TensorFlow), at the top of the package so that estimator/ (training
precision) and serving/ (the server's --mixed_precision, the tuner's sweep) ask the same
question in the same way without importing each other.
"""


def cpu_supports_bf16(cpuinfo="/proc/cpuinfo"):
    """True when the CPU has native bf16 math (AVX512_BF16 or AMX); None when unknown
    (no /proc/cpuinfo). Without it oneDNN's bf16 rewrite emulates and gains nothing."""
    try:
        with open(cpuinfo) as handle:
            flags = set(handle.read().split())
    except OSError:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16"})
