"""Makes slim-format "pretrained" checkpoints the way an official one looks: slim's own
net with a 1000-class head and slim variable names, random weights and non-trivial
BatchNorm moving statistics (so that restoring them is observable)."""
import os

import numpy as np
import tensorflow as tf

from slimserve.estimator import model


def make_imagenet_style_checkpoint(directory, model_name="resnet_v1_50", num_classes=1000,
                                   drop_scopes=(), seed=0):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        config = model.ModelConfig(model_name=model_name, num_classes=num_classes)
        images = tf.compat.v1.placeholder(tf.float32, [None, 32, 32, 3])
        model.build_logits(config, images, is_training=False)
        variables = [v for v in tf.compat.v1.global_variables()
                     if not any(v.op.name.startswith(s) for s in drop_scopes)]
        rng = np.random.RandomState(seed)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for var in variables:
                if var.op.name.endswith(("moving_mean", "moving_variance")):
                    var.load(rng.uniform(0.5, 1.5, var.shape.as_list()).astype(np.float32),
                             session)
            saver = tf.compat.v1.train.Saver(variables)
            path = saver.save(session, os.path.join(directory, model_name + ".ckpt"),
                              write_meta_graph=False)
    return path
