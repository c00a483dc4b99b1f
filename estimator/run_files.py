"""The files a training run leaves for export: `flags.txt` (the run's TrainConfig as a
flagfile, usable as --flagfile) and `slimserve.json` (the model and preprocessing settings an export needs).

Written by slimserve-train, read by slimserve-export: one module, so neither command
imports the other.
"""
import dataclasses
import json
import os

import tensorflow as tf

from slimserve import errors

CONFIG_FILE = "slimserve.json"
FLAGS_FILE = "flags.txt"


def write(model_dir, model_config, preprocess, data_dir, eval_split, flags_text=None):
    """Writes flags.txt and slimserve.json; the JSON atomically (temp file, rename)."""
    tf.io.gfile.makedirs(model_dir)
    if flags_text is not None:
        with tf.io.gfile.GFile(os.path.join(model_dir, FLAGS_FILE), "w") as handle:
            handle.write(flags_text)
    payload = {"model": dataclasses.asdict(model_config), "serving": preprocess.to_dict(),
               "data_dir": data_dir, "eval_split": eval_split}
    temp = os.path.join(model_dir, CONFIG_FILE + ".tmp")
    with tf.io.gfile.GFile(temp, "w") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True)
    tf.io.gfile.rename(temp, os.path.join(model_dir, CONFIG_FILE), overwrite=True)


def read(model_dir):
    """{"model": ModelConfig fields, "serving": preprocessing.Spec fields, "data_dir",
    "eval_split"}; fields a newer or older slimserve wrote that this one lacks are dropped
    by model_config() and preprocessing.Spec.from_dict()."""
    path = os.path.join(model_dir, CONFIG_FILE)
    if not tf.io.gfile.exists(path):
        raise errors.UserError("%s not found: the model_dir must be a slimserve-train run"
                               % path)
    with tf.io.gfile.GFile(path) as handle:
        try:
            return json.load(handle)
        except ValueError as error:
            raise errors.UserError("%s is not valid JSON (%s); rerun slimserve-train or "
                                   "restore the file" % (path, error)) from None


def model_config(run):
    """The ModelConfig of a run read by `read` (fields this version lacks are dropped,
    e.g. image_size, which runs before the preprocessing Spec stored there)."""
    from slimserve.estimator import model  # pylint: disable=g-import-not-at-top  (heavy; export only)
    known = {f.name for f in dataclasses.fields(model.ModelConfig)}
    return model.ModelConfig(**{k: v for k, v in run["model"].items() if k in known})
