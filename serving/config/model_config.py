"""The models a server serves: name, base path, version policy and version labels, from
TF Serving's text-format ModelServerConfig (--model_config_file, ReloadConfigRequest),
and the one writer of a model's version labels into such a file (`set_version_labels`:
slimserve-retrain's canary and stable, which a server polling the file picks up)."""
import logging
import os
import secrets

from google.protobuf import text_format

from slimserve import errors
from slimserve.serving.config import bounds
from slimserve.serving.config import files
from slimserve.serving.core.version_policy import VersionPolicy

# model_platform values served: TF Serving's "tensorflow" (or none), and "openvino" (slimserve
# only): a model whose network runs on OpenVINO (core/openvino_servable.py). TF Serving
# refuses a platform it has no adapter for, so a config meant for both servers leaves it
# out and this server is started with --prefer_openvino_model instead.
PLATFORMS = ("", "tensorflow", "openvino")


class ServedModel:
    """One entry of a model_config_list: what to serve under a name."""

    def __init__(self, name, base_path, policy=None, labels=None, logging_config=None,
                 platform=""):
        """logging_config: TF Serving's LoggingConfig proto (request logging), or None.
        platform: the entry's model_platform: "" or "tensorflow" (the server's flags
        decide the runtime), or "openvino" (this model's network runs on OpenVINO)."""
        self.name = name
        self.platform = platform
        self.base_path = base_path
        self.policy = policy or VersionPolicy()
        self.labels = dict(labels or {})
        self.logging_config = logging_config

    def __repr__(self):
        return "ServedModel(%r, %r, %r, labels=%r)" % (self.name, self.base_path, self.policy,
                                                       self.labels)


def served_models_from_proto(config, where):
    """ModelServerConfig proto -> [ServedModel]; files.ConfigError (a ValueError) naming
    `where`, the source, for an entry that cannot be served."""
    if config.WhichOneof("config") not in (None, "model_config_list"):
        raise files.ConfigError("%s: only model_config_list is supported" % where)
    unread = []
    bounds.check(config, where, unread)  # every number within its bound, before any use
    if unread:
        logging.warning("%s: %s have no effect here", where, ", ".join(sorted(set(unread))))
    models, names = [], set()
    for entry in config.model_config_list.config:
        if not entry.name or not entry.base_path:
            raise files.ConfigError("%s: every config needs name and base_path" % where)
        if entry.name in names:
            raise files.ConfigError("%s: model %s is listed twice" % (where, entry.name))
        names.add(entry.name)
        if entry.model_platform not in PLATFORMS:
            raise files.ConfigError("%s: model %s has model_platform %r; this server serves "
                                    "%s" % (where, entry.name, entry.model_platform,
                                            " or ".join(repr(p) for p in PLATFORMS if p)))
        models.append(ServedModel(entry.name, entry.base_path,
                                  VersionPolicy.from_proto(entry.model_version_policy),
                                  dict(entry.version_labels),
                                  entry.logging_config if entry.HasField("logging_config")
                                  else None, entry.model_platform))
    if not models:
        raise files.ConfigError("%s lists no model" % where)
    return models


def parse_model_config_file(path):
    """TF Serving's text-format ModelServerConfig file -> [ServedModel]."""
    return served_models_from_proto(files.read_model_server_config(path),
                                    "--model_config_file %s" % path)


def model_entry(config, model_name, where):
    """The ModelConfig of `model_name` in a ModelServerConfig proto: the only model when
    `model_name` is None; a UserError naming `where` otherwise."""
    entries = list(config.model_config_list.config)
    if model_name is None:
        if len(entries) != 1:
            raise errors.UserError("%s lists %d models; name one (--model_name)"
                                   % (where, len(entries)))
        return entries[0]
    for entry in entries:
        if entry.name == model_name:
            return entry
    raise errors.UserError("%s has no model %s (it lists %s)" % (
        where, model_name, ", ".join(e.name for e in entries) or "none"))


def set_version_labels(path, model_name, labels, versions):
    """Rewrites the --model_config_file at `path` so that model `model_name` serves
    exactly `versions` (policy `specific`) under `labels` ({label: version}, each one of
    `versions`), every other entry and field unchanged. Whole or not at all: written
    beside, fsynced and renamed over the file, so a server polling it reads the old
    config or the new one, never half of one (what a writer killed before its rename
    left beside it is removed by the next). Returns the new entry."""
    where = "--model_config_file %s" % path
    config = files.read_model_server_config(path)
    entry = model_entry(config, model_name, where)
    missing = sorted(set(labels.values()) - set(versions))
    if missing:
        raise ValueError("labels name versions %s that are not served" % missing)
    entry.model_version_policy.Clear()
    entry.model_version_policy.specific.versions.extend(sorted(set(versions)))
    entry.version_labels.clear()
    for label, version in sorted(labels.items()):
        entry.version_labels[label] = version
    text = text_format.MessageToString(config)
    served_models_from_proto(config, where)  # what the server will accept
    folder = os.path.dirname(os.path.abspath(path))
    prefix = ".%s.tmp-" % os.path.basename(path)
    temp = os.path.join(folder, "%s%d-%s" % (prefix, os.getpid(), secrets.token_hex(4)))
    with errors.writing(path, "--model_config_file"):
        _remove_dead_temporaries(folder, prefix)
        try:
            with open(temp, "w") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise
    return entry


def _remove_dead_temporaries(folder, prefix):
    """Removes `<prefix><pid>-*` files of writers that are gone (a kill -9 between the
    write and the rename leaves one; the config file itself was never touched)."""
    for name in os.listdir(folder):
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(folder, name))
            except FileNotFoundError:
                pass
        except PermissionError:
            pass
