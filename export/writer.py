"""Writes one SavedModel version: graph, signatures, variables, assets, warmup requests.

The version is claimed as `<export_base>/.tmp-<version>` (export/versions.py: exclusive,
so concurrent exporters never share or delete each other's directory), written and
verified there, and only then renamed to `<export_base>/<version>`, so a server polling
the base path never sees a partial version.
"""
import dataclasses
import logging
import os
import shutil
import tempfile

import tensorflow as tf

from slimserve.estimator import model
from slimserve.estimator import schema
from slimserve.export import receivers
from slimserve.export import signatures
from slimserve.export import versions
from slimserve.export import warmup
from slimserve.serving.core import servable as servable_lib

# Version bookkeeping lives in export/versions.py (no TensorFlow import for local
# paths); these names stay here for callers of the writer.
TEMP_PREFIX = versions.TEMP_PREFIX
list_versions = versions.list_versions
next_version = versions.next_version
claim_version = versions.claim_version
publish = versions.publish
check_exports_to_keep = versions.check_exports_to_keep
prune_versions = versions.prune_versions
copy_version = versions.copy_version
remove_stale_temp_dirs = versions.remove_stale_temp_dirs


def _signature_defs(inputs, predictions, class_names):
    utils = tf.compat.v1.saved_model.signature_def_utils
    outputs = {signatures.CLASSES: predictions["classes"],
               signatures.PROBABILITIES: predictions["probabilities"],
               signatures.CLASS_NAMES: predictions["class_names"]}
    batch = tf.shape(predictions["probabilities"])[0]
    names = tf.tile(tf.constant([list(class_names)]), tf.stack([batch, 1]))
    return {
        signatures.DEFAULT: utils.predict_signature_def(
            {signatures.IMAGE_BYTES: inputs.image_bytes}, outputs),
        signatures.PREDICT_IMAGES: utils.predict_signature_def(
            {signatures.IMAGES: inputs.images}, outputs),
        signatures.CLASSIFY: utils.classification_signature_def(
            inputs.examples, names, predictions["probabilities"]),
        # The penultimate features of the same images: what drift detection compares
        # with the export's reference (export/reference.py).
        signatures.EMBEDDINGS_SIGNATURE: utils.predict_signature_def(
            {signatures.IMAGE_BYTES: inputs.image_bytes},
            {signatures.EMBEDDINGS: predictions["embeddings"]}),
    }


def write_saved_model(export_base, checkpoint_path, model_config, preprocess,
                      sample_jpegs=None, before_publish=None, warmup_records=None):
    """Exports `checkpoint_path`; returns the final version directory.

    model_config: estimator.model.ModelConfig; preprocess: estimator.preprocessing.Spec
    (the run's InputConfig.preprocess). `before_publish(temp_dir)` may
    verify or add files, and raise to abort; the temporary directory is then removed and nothing is published.
    `warmup_records` (PredictionLog, e.g. from `warmup.traffic_warmup`) replace the
    warmup requests built from `sample_jpegs`.
    """
    version, temp_dir = claim_version(export_base)
    class_names = list(model_config.class_names) or [str(i) for i in range(
        model_config.num_classes)]
    params = dataclasses.asdict(model_config)
    params["checkpoint_path"] = None  # exports restore the checkpoint, never warm-start
    scratch = tempfile.mkdtemp(prefix="slimserve-labels-")
    try:
        labels_path = os.path.join(scratch, signatures.LABELS_ASSET)
        schema.write_labels(labels_path, class_names)
        graph = tf.Graph()
        with graph.as_default():
            inputs = receivers.build_serving_inputs(preprocess)
            spec = model.model_fn(inputs.features, None, tf.estimator.ModeKeys.PREDICT, params)
            signature_map = _signature_defs(inputs, spec.predictions, class_names)
            asset = tf.constant(labels_path, name="labels_file")
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.ASSET_FILEPATHS, asset)
            saver = spec.scaffold.saver or tf.compat.v1.train.Saver(sharded=True)
            with tf.compat.v1.Session(graph=graph) as session:
                saver.restore(session, checkpoint_path)
                builder = tf.compat.v1.saved_model.Builder(temp_dir)
                builder.add_meta_graph_and_variables(
                    session, [signatures.SERVE_TAG], signature_def_map=signature_map,
                    assets_collection=tf.compat.v1.get_collection(
                        tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
                    saver=saver, clear_devices=True, strip_default_attrs=True)
                builder.save()
        extra = os.path.join(temp_dir, signatures.EXTRA_DIR)
        tf.io.gfile.makedirs(extra)
        if not warmup_records:
            images = sample_jpegs or warmup.sample_images(
                image_size=preprocess.image_size)
            warmup_records = warmup.build_requests(images, preprocess.image_size)
        warmup.write_warmup(os.path.join(temp_dir, servable_lib.WARMUP_PATH), warmup_records)
        if before_publish is not None:
            before_publish(temp_dir)
        final_dir = publish(export_base, version, temp_dir)
    except BaseException:
        versions.discard(temp_dir)  # only this writer's own claim
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    logging.info("exported %s -> %s", checkpoint_path, final_dir)
    return final_dir
