"""The slim nets factory: name -> network builder, arg scope, image size, preprocessing
style and scopes. Variable names stay exactly slim's, so official checkpoints load.

ResNets are assembled from slim's own blocks so that each residual unit can run its
BatchNorm in inference mode when the unit is frozen (see `build_fn`'s `bn_frozen`).
"""
import dataclasses
from typing import Callable, Tuple

import tensorflow as tf

from slimserve import errors
from slimserve.estimator import compat
from slimserve.estimator import preprocessing

slim = compat.import_tf_slim()
from tf_slim.nets import resnet_v1, resnet_v2, vgg  # pylint: disable=g-bad-import-order,wrong-import-position


@dataclasses.dataclass(frozen=True)
class NetSpec:
    """What the rest of slimserve needs to know about one net."""
    name: str
    build: Callable  # (images, num_classes, is_training, bn_frozen) -> (logits, end_points)
    arg_scope: Callable  # (batch_norm_decay, batch_norm_epsilon) -> slim arg scope
    default_image_size: int
    style: str
    head_scopes: Tuple[str, ...]
    scopes: Tuple[str, ...]  # the top-level scopes a user may name in flags
    has_batch_norm: bool = True


def _bn_mode_unit(unit_fn, is_training, bn_frozen):
    """Wraps a residual unit so its BatchNorms train only if the unit is not frozen."""

    def unit(*args, **kwargs):
        scope = tf.compat.v1.get_variable_scope().name
        training = is_training and not bn_frozen(scope)
        with slim.arg_scope([slim.batch_norm], is_training=training):
            return unit_fn(*args, **kwargs)

    return unit


_RESNET_UNITS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3), 200: (3, 24, 36, 3)}


def _resnet(version, depth):
    module = resnet_v1 if version == 1 else resnet_v2
    name = "resnet_v%d_%d" % (version, depth)
    make_block = module.resnet_v1_block if version == 1 else module.resnet_v2_block
    network = module.resnet_v1 if version == 1 else module.resnet_v2
    # The one BatchNorm outside the units: conv1's in v1, the final postnorm in v2.
    outer_bn_scope = name + ("/conv1" if version == 1 else "/postnorm")

    def build(images, num_classes, is_training, bn_frozen=lambda scope: False):
        units = _RESNET_UNITS[depth]
        blocks = [
            make_block("block1", base_depth=64, num_units=units[0], stride=2),
            make_block("block2", base_depth=128, num_units=units[1], stride=2),
            make_block("block3", base_depth=256, num_units=units[2], stride=2),
            make_block("block4", base_depth=512, num_units=units[3], stride=1),
        ]
        blocks = [block._replace(unit_fn=_bn_mode_unit(block.unit_fn, is_training, bn_frozen))
                  for block in blocks]
        logits, end_points = network(
            images, blocks, num_classes,
            is_training=is_training and not bn_frozen(outer_bn_scope),
            global_pool=True, include_root_block=True, scope=name)
        return logits, end_points

    def arg_scope(batch_norm_decay=0.997, batch_norm_epsilon=1e-5):
        # Weight decay is applied by model.py to the trained variables only.
        return module.resnet_arg_scope(weight_decay=0.0, batch_norm_decay=batch_norm_decay,
                                       batch_norm_epsilon=batch_norm_epsilon)

    scopes = tuple("%s/%s" % (name, s) for s in ("conv1", "block1", "block2", "block3",
                                                 "block4", "logits"))
    if version == 2:
        scopes = scopes[:-1] + (name + "/postnorm", name + "/logits")
    style = preprocessing.VGG if version == 1 else preprocessing.INCEPTION
    # slim's published resnet_v2 checkpoints were trained and evaluated at 299 with
    # inception preprocessing (research/slim README: "--preprocessing_name inception
    # --eval_image_size 299"); tf_slim's resnet_v2.default_image_size (224) is not theirs.
    image_size = 224 if version == 1 else 299
    return NetSpec(name, build, arg_scope, image_size, style, (name + "/logits",), scopes)


def _vgg16():
    def build(images, num_classes, is_training, bn_frozen=lambda scope: False):
        del bn_frozen  # no BatchNorm in VGG
        return vgg.vgg_16(images, num_classes, is_training=is_training, spatial_squeeze=True)

    def arg_scope(batch_norm_decay=0.997, batch_norm_epsilon=1e-5):
        del batch_norm_decay, batch_norm_epsilon
        return vgg.vgg_arg_scope(weight_decay=0.0)

    scopes = tuple("vgg_16/" + s for s in ("conv1", "conv2", "conv3", "conv4", "conv5",
                                           "fc6", "fc7", "fc8"))
    return NetSpec("vgg_16", build, arg_scope, 224, preprocessing.VGG, ("vgg_16/fc8",),
                   scopes, has_batch_norm=False)


NETS = {spec.name: spec for spec in (
    [_resnet(1, d) for d in (50, 101, 152, 200)] + [_resnet(2, d) for d in (50, 101, 152, 200)]
    + [_vgg16()])}


# Ops between the logits layer's matmul/convolution and the logits a net returns.
_LOGITS_PASS_THROUGH = ("Squeeze", "BiasAdd", "Identity", "Reshape", "Cast", "Add", "AddV2")


def logits_input(logits):
    """The tensor the logits layer reads: the penultimate features (slim's ResNets: the
    global average pool before `logits`, [B, 1, 1, D]; vgg_16: fc7's output), found by
    walking back from the logits through the layer's bias add to its convolution (or
    matmul). Works for every net here without naming scopes, so replica and name scopes
    do not matter."""
    op = logits.op
    for _ in range(8):
        if op.type in ("Conv2D", "MatMul"):
            return op.inputs[0]
        if op.type not in _LOGITS_PASS_THROUGH:
            break
        op = op.inputs[0].op
    raise ValueError("cannot find the layer under the logits %s (reached a %s op)"
                     % (logits.name, op.type))


def get_net(name):
    try:
        return NETS[name]
    except KeyError:
        raise errors.UserError("unknown --model_name %r; choose one of %s"
                               % (name, ", ".join(sorted(NETS)))) from None


def in_scopes(name, scopes):
    """True when variable or scope `name` is one of `scopes` or inside one (slim's scope
    flags: --checkpoint_exclude_scopes, --trainable_scopes, --freeze_scopes)."""
    return any(name == s or name.startswith(s.rstrip("/") + "/") for s in scopes)


def preprocessing_spec(name, image_size=None, central_fraction=0.875,
                       max_image_pixels=preprocessing.DEFAULT_MAX_IMAGE_PIXELS):
    """The evaluation/serving preprocessing of net `name`: its style, and its own input
    size unless `image_size` says otherwise."""
    spec = get_net(name)
    return preprocessing.Spec(spec.default_image_size if image_size is None else image_size,
                              spec.style, central_fraction, max_image_pixels)
