"""A model's base path as TF Serving's file-system source sees it: integer-named version
directories, each a SavedModel (or, with --prefer_tflite_model, a model.tflite); and a
fingerprint that tells when a version's files changed
(a failed load is retried at once when they do)."""
import os

import tensorflow as tf

TFLITE_MODEL = "model.tflite"  # what --prefer_tflite_model serves (core/tflite_model.py)


def list_version_dirs(base_path, accept_tflite=False):
    """{version: path} of integer-named sub-directories holding a saved_model.pb (or a
    model.tflite when `accept_tflite`: --prefer_tflite_model)."""
    if not tf.io.gfile.isdir(base_path):
        return {}
    found = {}
    for name in tf.io.gfile.listdir(base_path):
        name = name.rstrip("/")
        if name.isdigit():
            path = os.path.join(base_path, name)
            if tf.io.gfile.exists(os.path.join(path, "saved_model.pb")) or (
                    accept_tflite and tf.io.gfile.exists(os.path.join(path, TFLITE_MODEL))):
                found[int(name)] = path
    return found


def version_fingerprint(path):
    """(relative name, size, mtime) of every file under a version directory: what tells
    that a version which failed to load has changed since (e.g. a copy completed)."""
    entries = []
    for root, dirs, files in tf.io.gfile.walk(path):
        for name in list(dirs) + list(files):
            full = os.path.join(root, name)
            relative = os.path.relpath(full, path)
            try:
                stat = tf.io.gfile.stat(full)
                entries.append((relative, stat.length, stat.mtime_nsec))
            except tf.errors.NotFoundError:  # removed while we walked: still a change
                entries.append((relative, -1, -1))
    return tuple(sorted(entries))
