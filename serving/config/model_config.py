"""The models a server serves: name, base path, version policy and version labels, from
TF Serving's text-format ModelServerConfig (--model_config_file, ReloadConfigRequest)."""
import logging

from slimserve.serving.config import bounds
from slimserve.serving.config import files
from slimserve.serving.core.version_policy import VersionPolicy


class ServedModel:
    """One entry of a model_config_list: what to serve under a name."""

    def __init__(self, name, base_path, policy=None, labels=None, logging_config=None):
        """logging_config: TF Serving's LoggingConfig proto (request logging), or None."""
        self.name = name
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
        if entry.model_platform and entry.model_platform != "tensorflow":
            raise files.ConfigError("%s: model %s has platform %r; only 'tensorflow' is served"
                             % (where, entry.name, entry.model_platform))
        models.append(ServedModel(entry.name, entry.base_path,
                                  VersionPolicy.from_proto(entry.model_version_policy),
                                  dict(entry.version_labels),
                                  entry.logging_config if entry.HasField("logging_config")
                                  else None))
    if not models:
        raise files.ConfigError("%s lists no model" % where)
    return models


def parse_model_config_file(path):
    """TF Serving's text-format ModelServerConfig file -> [ServedModel]."""
    return served_models_from_proto(files.read_model_server_config(path),
                                    "--model_config_file %s" % path)
