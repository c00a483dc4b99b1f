"""Readable logs for slimserve's commands: TensorFlow's start-up and deprecation noise
goes, real warnings stay.

Lives in slimserve/cli/, the command layer, because every command needs it and no
library may import it. Call `quiet_tensorflow()` before anything imports tensorflow; a command
module calls `run(main)` from its `__main__` / console-script entry.
"""
import logging
import os
import sys
import tempfile
import warnings

# C++ lines TF 2.15 prints at import on every CPU machine; none is actionable here.
_STARTUP_NOISE = (
    "Unable to register cuDNN factory", "Unable to register cuFFT factory",
    "Unable to register cuBLAS factory", "Could not find TensorRT",
    "cpu_feature_guard", "To enable the following instructions",
    "oneDNN custom operations are on", "rebuild TensorFlow with the appropriate",
    "Could not find cuda drivers", "successful NUMA node read",
)
# Python log records that announce API deprecations rather than problems.
_RECORD_NOISE = (
    "is deprecated", "Instructions for updating", "deprecated and will be removed",
    "Colocations handled automatically", "Use standard file APIs", "tf.keras.layers",
    "Use keras.layers", "non-resource variables are not supported",
    "Using temporary folder as model directory", "Scale of 0 disables regularizer",
)
# Estimator housekeeping printed around every train/eval call; progress.py and the
# eval results say what matters.
_HOUSEKEEPING = (
    "Calling model_fn.", "Done calling model_fn.", "Graph was finalized.",
    "Running local_init_op.", "Done running local_init_op.", "Calling checkpoint listeners",
    "Create CheckpointSaverHook.", "Not using Distribute Coordinator.",
    "Saving 'checkpoint_path' summary", "Assets added to graph.", "No assets to write.",
    "Signatures INCLUDED in export", "Signatures EXCLUDED from export",
)


class _DropNoise(logging.Filter):
    def filter(self, record):
        message = record.getMessage()
        return not any(noise in message for noise in _RECORD_NOISE + _HOUSEKEEPING)


def _import_tensorflow_filtering_stderr():
    """Imports TF with fd 2 captured, then replays every line that is not known noise."""
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode("utf-8", "replace").splitlines():
                if line.strip() and not any(noise in line for noise in _STARTUP_NOISE):
                    sys.stderr.write(line + "\n")


def quiet_tensorflow(verbosity=logging.INFO):
    """Hides TF's C++ INFO lines, start-up noise and deprecation notices."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    for category in (DeprecationWarning, FutureWarning, PendingDeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
    warnings.filterwarnings("ignore", message=r".*`layer\.apply` is deprecated.*")
    warnings.filterwarnings("ignore", message=r".*is deprecated and will be removed.*")
    _import_tensorflow_filtering_stderr()
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tensorflow.python.util import deprecation  # pylint: disable=g-import-not-at-top
    deprecation._PRINT_DEPRECATION_WARNINGS = False  # pylint: disable=protected-access
    tf_logger = tf.get_logger()
    tf_logger.handlers = []  # absl's handler prints TF's records once, in absl's format
    tf_logger.addFilter(_DropNoise())
    tf_logger.setLevel(verbosity)
    logging.getLogger().setLevel(verbosity)
    logging.getLogger("absl").addFilter(_DropNoise())


def run(main):
    """The entry point of every slimserve command: quiet TensorFlow, then absl's app.run
    (the command module defined its flags when it was imported)."""
    from absl import app  # pylint: disable=g-import-not-at-top
    quiet_tensorflow()
    app.run(main)
