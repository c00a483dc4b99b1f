"""What this machine's CPU can do, and the one runtime switch that depends on it.

Plain Python (no TensorFlow), at the top of the package so that estimator/ (training
precision), serving/ (the server's --mixed_precision, the tuner's sweep) and the
benchmarks ask the same questions in the same way without importing each other.

TensorFlow 2.15 turns its oneDNN kernels on by default only on x86 CPUs with
AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX. Elsewhere (AVX2-only EPYCs, older Xeons) it
runs its Eigen kernels: training steps measured 1.5-5.9x slower there
(docs/performance.md). `enable_onednn()` sets TF_ENABLE_ONEDNN_OPTS=1 on every x86 CPU
before TensorFlow is imported; a value the user set wins, and so does a TensorFlow
imported before slimserve (then nothing changes).

oneDNN converts every filter to its blocked layout on every run unless told the weights
never change; with small images that conversion dominates (a 32x32 resnet_v1_50 served
1.52x slower than on Eigen, 1.90x faster with the weights frozen). Processes that only
run inference (slimserve-server, slimserve-predict) call `assume_frozen_weights()`;
training never does (its filters change at every step).
"""
import os
import platform
import sys

ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
FROZEN_WEIGHTS_VARIABLE = "TF_ONEDNN_ASSUME_FROZEN_WEIGHTS"
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")
# CPU flags (as /proc/cpuinfo names them) that make TensorFlow 2.15 pick oneDNN itself.
ONEDNN_DEFAULT_FLAGS = frozenset({"avx512_vnni", "avx512_bf16", "avx_vnni", "amx_bf16",
                                  "amx_int8", "amx_tile"})
# Flags worth naming beside a figure of speed: the vector width and the bf16/int8 units.
NOTABLE_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni",
                 "amx_tile", "amx_bf16", "amx_int8")

# What enable_onednn() found when the package was imported: "set" (slimserve turned it
# on), "user" (the environment already had a value), "late" (TensorFlow was imported
# first), or "not-x86".
onednn_origin = None


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The CPU's feature flags (a frozenset), or None when unknown (no /proc/cpuinfo)."""
    try:
        with open(cpuinfo) as handle:
            text = handle.read(1 << 20)
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cpu_model_name(cpuinfo="/proc/cpuinfo"):
    """The CPU's model name (`lscpu`'s "Model name"), or platform.processor()."""
    try:
        with open(cpuinfo) as handle:
            for line in handle.read(1 << 20).splitlines():
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_supports_bf16(cpuinfo="/proc/cpuinfo"):
    """True when the CPU has native bf16 math (AVX512_BF16 or AMX); None when unknown
    (no /proc/cpuinfo). Without it oneDNN's bf16 rewrite emulates and gains nothing."""
    flags = cpu_flags(cpuinfo)
    if flags is None:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def is_x86(machine=None):
    return (machine if machine is not None else platform.machine()).lower() in _X86


def enable_onednn(environ=None, machine=None, modules=None):
    """Sets TF_ENABLE_ONEDNN_OPTS=1 in `environ` on x86 unless it is set already or
    TensorFlow is already imported. Returns why it did or did not (see onednn_origin)."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if ONEDNN_VARIABLE in environ:
        return "user"
    if not is_x86(machine):
        return "not-x86"
    if "tensorflow" in modules:
        return "late"
    environ[ONEDNN_VARIABLE] = "1"
    return "set"


def assume_frozen_weights(environ=None, modules=None):
    """Sets TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1 for a process whose weights never change
    after loading (a server, bulk inference), unless the user set it or TensorFlow is
    already imported -> "set", "user" or "late"."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if FROZEN_WEIGHTS_VARIABLE in environ:
        return "user"
    if "tensorflow" in modules:
        return "late"
    environ[FROZEN_WEIGHTS_VARIABLE] = "1"
    return "set"


def describe(cpuinfo="/proc/cpuinfo", environ=None):
    """One line naming the CPU, its notable flags and the oneDNN switch, for benchmarks'
    and the server's logs: a figure of speed means little without it."""
    environ = os.environ if environ is None else environ
    flags = cpu_flags(cpuinfo) or frozenset()
    notable = [flag for flag in NOTABLE_FLAGS if flag in flags]
    onednn = environ.get(ONEDNN_VARIABLE)
    if onednn is None:
        onednn = "TF default (%s)" % ("on" if flags & ONEDNN_DEFAULT_FLAGS else "off")
    return "CPU: %s, %d cores; flags: %s; bf16: %s; %s=%s" % (
        cpu_model_name(cpuinfo), os.cpu_count() or 0, " ".join(notable) or "none listed",
        "native" if cpu_supports_bf16(cpuinfo) else "no", ONEDNN_VARIABLE, onednn)
