"""The served model's side of a retrain: what the run reads at its start and the
compare-and-swap that publishes against that reading at its end.

    serving = publish.read_serving(config)        # the version to start from, and a snapshot
    ...                                           # fine-tune, canary check
    version, labels = publish.publish(config, serving, candidate_dir)

`read_serving` finds the served model (in the server's --model_config_file, or at
--model_base_path), the version that serves (the one labelled `stable`, else the newest),
its classes, and keeps what publishing compares against: the config file's bytes
(model_config.Snapshot) and the versions under the base path. `publish` copies the
candidate in as a new version labelled `canary` (`stable` too with --promote) through
export/versions.py's publish_announced: the config names the version before it appears,
and a config someone changed, a version added or removed, or a config that cannot be
written refuses it (a UserError naming what) with nothing servable left behind. An
operator's edit made while the retrain trained is never undone.
"""
import dataclasses
import logging
import os

from slimserve import errors
from slimserve import fields
from slimserve.export import versions as export_versions
from slimserve.serving.config import model_config
from slimserve.serving.core import version_dirs
from slimserve.serving.clients import image_classifier

STABLE, CANARY = "stable", "canary"


@dataclasses.dataclass
class PublishConfig:
    """Which model a retrain starts from and where its candidate is published."""
    model_config_file: str = fields.option(
        None, "The server's --model_config_file: the new version is published in its "
        "model's version labels (canary; stable with --promote).")
    served_model: str = fields.option(
        None, "The model's name in --model_config_file (default: its only model).")
    model_base_path: str = fields.option(
        None, "The served model's base path (default: its base_path in "
        "--model_config_file).")
    serving_version: int = fields.option(
        None, "The version to fine-tune from and compare with (default: the version "
        "labelled stable, else the newest).", fields.Bound(0, fields.INT64_MAX), kind=int)
    publish: bool = fields.option(
        True, "Publish a candidate that passes (--nopublish: check and report only).")
    promote: bool = fields.option(
        False, "Also move the stable label to a candidate that passes.")


def check_config(config):
    """The flag combinations publishing needs, refused before the run writes anything."""
    if config.publish and not config.model_config_file:
        raise errors.UserError("--model_config_file is needed to publish under the canary "
                               "label (or pass --nopublish to check only)")
    if config.promote and not config.publish:
        raise errors.UserError("--promote needs --publish")


@dataclasses.dataclass
class Serving:
    """The served model: where its versions are and which one serves (stable), and what
    publishing compares against: the model config file and the published versions as
    the run read them at its start."""
    name: str
    base_path: str
    version: int
    version_dir: str
    class_names: list
    labels: dict
    snapshot: object = None  # model_config.Snapshot of --model_config_file
    published: list = dataclasses.field(default_factory=list)  # versions under base_path


def read_serving(config):
    """The Serving a PublishConfig names; a UserError naming the flag or the path when
    the model, the version or its classes cannot be found."""
    name, base, labels, snapshot = config.served_model, config.model_base_path, {}, None
    if config.model_config_file:
        where = "--model_config_file %s" % config.model_config_file
        snapshot = model_config.read_snapshot(config.model_config_file)
        entry = model_config.model_entry(snapshot.config, name, where)
        name, labels = entry.name, dict(entry.version_labels)
        base = base or entry.base_path
    if not base:
        raise errors.UserError("give --model_config_file (the server's) or --model_base_path")
    versions = version_dirs.list_version_dirs(base)
    version = config.serving_version
    if version is None:
        version = labels.get(STABLE) or (max(versions) if versions else None)
    if version not in versions:
        raise errors.UserError("--model_base_path %s has no version %s holding "
                               "saved_model.pb" % (base, version))
    path = versions[version]
    names = image_classifier.read_model_labels(path)
    if not names:
        raise errors.UserError("%s has no assets/labels.txt: its classes are unknown" % path)
    return Serving(name or os.path.basename(base.rstrip("/")), base, version, path, names,
                   labels, snapshot, export_versions.list_versions(base))


def publish(config, serving, candidate):
    """Copies the candidate into the base path as a new version labelled canary (and
    stable with --promote) in --model_config_file; returns (version, labels). A
    compare-and-swap on what the run read at its start (serving.snapshot, the versions
    serving.published): a config someone changed, a version added or removed, or a
    config that cannot be written refuses it (a UserError naming what) with nothing
    servable left behind; the config names the version before it appears
    (export/versions.py publish_announced has the order and its crash points)."""
    labels = dict(serving.labels)

    def announce(version):
        labels.setdefault(STABLE, serving.version)
        labels[CANARY] = version
        if config.promote:
            labels[STABLE] = version
        return model_config.prepare_version_labels(
            config.model_config_file, serving.name, labels,
            set(labels.values()) | {serving.version}, expected=serving.snapshot)

    with errors.writing(serving.base_path, "--model_base_path"):
        version, final = export_versions.publish_announced(serving.base_path, candidate,
                                                           serving.published, announce)
    logging.info("published %s as %s", candidate, final)
    return version, labels
