"""slimserve: from a folder of labelled images to a fine-tuned TF-Slim ResNet served by
TensorFlow Serving.

One import name for the whole project. The three libraries live in the repository's
top-level folders and are installed under this package by setup.py:

    slimserve.estimator   images -> TFRecords -> a trained checkpoint (estimator/)
    slimserve.export      checkpoint -> a SavedModel TF Serving loads (export/)
    slimserve.serving     everything after a SavedModel exists (serving/)

`slimserve.cli` holds the commands (absl flags, logging set-up) above the libraries, and
`slimserve.conventions` the contract every package shares.

Importing the package turns TensorFlow's oneDNN kernels on for every x86 CPU before
TensorFlow loads (slimserve/cpu.py: TF 2.15 leaves them off on CPUs without
AVX512_VNNI/BF16/AMX); a TF_ENABLE_ONEDNN_OPTS the user set wins.
"""
from slimserve import cpu as _cpu

_cpu.onednn_origin = _cpu.enable_onednn()
