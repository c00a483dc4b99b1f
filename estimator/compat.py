"""The one place that papers over TF 2.15 / tf_slim / tf_keras seams.

Import this module before building any slim graph. It is idempotent.

Seams handled here:
- tf_slim's ``batch_norm`` reaches ``tensorflow.python.layers.normalization``,
  which in TF 2.15 lazily imports ``tf_keras.legacy_tf_layers``; tf-keras 2.15
  keeps that package at ``tf_keras.src.legacy_tf_layers``. We alias it.
- ``MirroredStrategy`` over several devices deadlocked in Estimator training here
  with the default cross-device ops; ``mirrored_strategy`` uses
  ``ReductionToOneDevice``, which ran.
- AutoGraph converts every call of tf_keras' legacy BatchNormalization (the layer slim's
  ``batch_norm`` builds), and each of resnet_v1_50's 106 update ops then searches the
  whole graph: building the training graph took 17-35 s, and 177 s for two replicas.
  ``plain_graph_building`` builds the net without conversion (slim's nets are plain
  Python over tensors; the graph is op for op the same): 4.6-7 s. The preprocessing
  (tf.data maps, the serving receiver's map_fn) is plain too (its loops and branches are
  tf.while_loop and tf.cond): converting it cost ~1.5 s per training or export.
- tf_slim's package init imports its metric-learning losses, which import scikit-learn
  (with scipy) when it is installed, as the test extras install it: ~0.7 s in every
  process that builds a net, for a loss slimserve never builds. ``import_tf_slim``
  imports tf_slim as if scikit-learn were absent (tf_slim handles that itself).
"""
import importlib
import sys

_LEGACY = "tf_keras.legacy_tf_layers"
_LEGACY_SRC = "tf_keras.src.legacy_tf_layers"
_SUBMODULES = ("base", "core", "convolutional", "normalization", "pooling",
               "variable_scope_shim")


def _alias_legacy_tf_layers():
    if _LEGACY in sys.modules:
        return
    try:
        package = importlib.import_module(_LEGACY)
    except ImportError:
        package = importlib.import_module(_LEGACY_SRC)
        sys.modules[_LEGACY] = package
        for name in _SUBMODULES:
            try:
                sys.modules[_LEGACY + "." + name] = importlib.import_module(
                    _LEGACY_SRC + "." + name)
            except ImportError:  # pragma: no cover - depends on tf-keras build
                pass
    del package


def import_tf_slim():
    """tf_slim without scikit-learn: a None entry in sys.modules makes tf_slim's one
    `import sklearn.metrics` fail (its HAS_SKLEARN becomes False); the entry is removed
    afterwards, so the process can still import scikit-learn itself."""
    if "tf_slim" in sys.modules:
        return sys.modules["tf_slim"]
    blocked = "sklearn.metrics" not in sys.modules
    if blocked:
        sys.modules["sklearn.metrics"] = None
    try:
        return importlib.import_module("tf_slim")
    finally:
        if blocked and "sklearn.metrics" in sys.modules and \
                sys.modules["sklearn.metrics"] is None:
            del sys.modules["sklearn.metrics"]


def plain_graph_building(function):
    """Builds the net's graph without AutoGraph conversion (see the module docstring)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.autograph.experimental.do_not_convert(function)


def mirrored_strategy(devices=None):
    """MirroredStrategy with the cross-device reduction that works here for Estimator."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.distribute.MirroredStrategy(
        devices=devices, cross_device_ops=tf.distribute.ReductionToOneDevice())


_alias_legacy_tf_layers()
