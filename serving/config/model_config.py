"""The models a server serves: name, base path, version policy and version labels, from
TF Serving's text-format ModelServerConfig (--model_config_file, ReloadConfigRequest),
and the one writer of a model's version labels into such a file (`set_version_labels`:
slimserve-retrain's canary and stable, which a server polling the file picks up)."""
import logging
import os
import re
import secrets

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from slimserve import errors
from slimserve.serving.config import bounds
from slimserve.serving.config import files
from slimserve.serving.core.version_policy import VersionPolicy


TENSORFLOW = "tensorflow"  # the one platform served here (TF Serving's kTensorFlowModelPlatform)
_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9.]*://")


class ServedModel:
    """One entry of a model_config_list: what to serve under a name."""

    def __init__(self, name, base_path, policy=None, labels=None, logging_config=None,
                 platform=TENSORFLOW):
        """logging_config: TF Serving's LoggingConfig proto (request logging), or None."""
        self.name = name
        self.base_path = base_path
        self.policy = policy or VersionPolicy()
        self.labels = dict(labels or {})
        self.logging_config = logging_config
        self.platform = platform

    def __repr__(self):
        return "ServedModel(%r, %r, %r, labels=%r)" % (self.name, self.base_path, self.policy,
                                                       self.labels)


def is_relative(base_path):
    """True for a base path TF Serving refuses (UriIsRelativePath): no URI scheme (gs://,
    s3://, ...) and no leading '/'. A server never resolves one against its working
    directory."""
    return not _URI_SCHEME.match(base_path) and not base_path.startswith("/")


def absolute(base_path):
    """`base_path` made absolute against the working directory when it is relative (for
    the commands that start a server; a URI stays as it is)."""
    return os.path.abspath(base_path) if is_relative(base_path) else base_path


def check_base_path(name, base_path, where):
    """files.ConfigError (INVALID_ARGUMENT when reloading), in TF Serving's words, for a
    relative base path."""
    if is_relative(base_path):
        raise files.ConfigError("%s: Expected model %s to have an absolute path or URI; got "
                                "base_path()=%s" % (where, name, base_path))


def _platform(entry, where):
    """The entry's platform as TF Serving's GetPlatform reads it: the deprecated
    model_type TENSORFLOW, or model_platform (empty: tensorflow here), never both."""
    if entry.model_type:
        if entry.model_platform:
            raise files.ConfigError(
                "%s: Illegal setting both ModelServerConfig::model_type (deprecated) and "
                "ModelServerConfig::model_platform, model name is %s" % (where, entry.name))
        if entry.model_type != model_server_config_pb2.TENSORFLOW:
            raise files.ConfigError("%s: ModelServerConfig::model_type choice %d not "
                                    "supported." % (where, entry.model_type))
        return TENSORFLOW
    return entry.model_platform or TENSORFLOW


def served_models_from_proto(config, where, served=None):
    """ModelServerConfig proto -> [ServedModel] (an empty model_config_list serves no
    model); files.ConfigError (a ValueError) naming `where`, the source, for an entry that
    cannot be served, checked in TF Serving's order: a name listed twice, a relative base
    path, both model_type and model_platform, a served model's platform changed (served:
    {name: platform} of the models served now), then a platform not served here."""
    if config.WhichOneof("config") not in (None, "model_config_list"):
        raise files.ConfigError("%s: only model_config_list is supported" % where)
    unread = []
    bounds.check(config, where, unread)  # every number within its bound, before any use
    if unread:
        logging.warning("%s: %s have no effect here", where, ", ".join(sorted(set(unread))))
    entries, names = list(config.model_config_list.config), set()
    for entry in entries:
        if not entry.name or not entry.base_path:
            raise files.ConfigError("%s: every config needs name and base_path" % where)
        if entry.name in names:
            raise files.ConfigError("%s: Illegal to list model %s multiple times in config "
                                    "list" % (where, entry.name))
        names.add(entry.name)
    for entry in entries:
        check_base_path(entry.name, entry.base_path, where)
    platforms = [_platform(entry, where) for entry in entries]
    for entry, platform in zip(entries, platforms):
        old = (served or {}).get(entry.name)
        if old is not None and old != platform:
            raise files.ConfigError(
                "%s: Illegal to change a model's platform. For model %s platform was %s and "
                "new platform requested is %s" % (where, entry.name, old, platform))
    for entry, platform in zip(entries, platforms):
        if platform != TENSORFLOW:
            raise files.ConfigError("%s: Model %s requests unsupported platform %s; only "
                                    "'tensorflow' is served here" % (where, entry.name,
                                                                     platform))
    return [ServedModel(entry.name, entry.base_path,
                        VersionPolicy.from_proto(entry.model_version_policy),
                        dict(entry.version_labels),
                        entry.logging_config if entry.HasField("logging_config") else None,
                        platform)
            for entry, platform in zip(entries, platforms)]


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
