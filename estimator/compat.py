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
  Python over tensors; the graph is op for op the same): 4.6-7 s.
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
