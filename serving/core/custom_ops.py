"""Op libraries TF Serving links into tensorflow_model_server, registered here before any
model loads, so a SavedModel using them loads as it does there.

TF Serving 2.15 builds TF Text's ops into its binary (its suite's test_tf_text serves a
model made of them). The tensorflow-text wheel ships them as shared libraries beside its
Python code; registering those (tf.load_op_library) gives the kernels without importing
tensorflow_text's Python API (and its Keras and TF Hub dependencies).
"""
import glob
import importlib.util
import logging
import os
import threading

import tensorflow as tf

_LOCK = threading.Lock()
_LOADED = None  # the libraries registered, once tried


def tf_text_libraries():
    """The op libraries of the installed tensorflow-text wheel ([] when it is absent)."""
    spec = importlib.util.find_spec("tensorflow_text")
    if spec is None or not spec.origin:
        return []
    return sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "python", "ops",
                                         "_*.so")))


def load_tf_text_ops():
    """Registers TF Text's ops and kernels in this process (once); -> the libraries."""
    global _LOADED  # pylint: disable=global-statement
    with _LOCK:
        if _LOADED is not None:
            return _LOADED
        loaded = []
        for path in tf_text_libraries():
            try:
                tf.load_op_library(path)
                loaded.append(path)
            except (tf.errors.OpError, OSError) as error:  # a mismatched wheel
                logging.warning("TF Text op library %s not loaded: %s", path, error)
        if not loaded:
            logging.info("tensorflow-text is not installed: models using TF Text ops will "
                         "not load")
        _LOADED = loaded
        return loaded
