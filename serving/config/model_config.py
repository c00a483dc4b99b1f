"""The models a server serves: name, base path, version policy and version labels, from
TF Serving's text-format ModelServerConfig (--model_config_file, ReloadConfigRequest),
and the one writer of a model's version labels into such a file (`set_version_labels`:
slimserve-retrain's canary and stable, which a server polling the file picks up).

The writer is a compare-and-swap: given the Snapshot a run read at its start
(`read_snapshot`), it refuses, naming what changed, when the file no longer holds those
bytes (an operator moved a label or edited the file meanwhile), checks again just before
its rename, and refuses a file the operator made read-only; `prepare_version_labels`
does every check and writes the new text beside the file before anything else of a
publish becomes visible (export/versions.py `publish_announced`)."""
import dataclasses
import hashlib
import logging
import os
import re
import secrets
import stat

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from slimserve import errors
from slimserve.serving.config import bounds
from slimserve.serving.config import files
from slimserve.serving.core.version_policy import VersionPolicy

# model_platform values served: TF Serving's "tensorflow" (or none), and "openvino" (slimserve
# only): a model whose network runs on OpenVINO (core/openvino_servable.py). TF Serving
# refuses a platform it has no adapter for, so a config meant for both servers leaves it
# out and this server is started with --prefer_openvino_model instead.
TENSORFLOW = "tensorflow"  # TF Serving's kTensorFlowModelPlatform; empty means it too
OPENVINO = "openvino"
PLATFORMS = (TENSORFLOW, OPENVINO)
_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9.]*://")


class ServedModel:
    """One entry of a model_config_list: what to serve under a name."""

    def __init__(self, name, base_path, policy=None, labels=None, logging_config=None,
                 platform=TENSORFLOW):
        """logging_config: TF Serving's LoggingConfig proto (request logging), or None.
        platform: the entry's platform: "tensorflow" (the server's flags decide the
        runtime), or "openvino" (this model's network runs on OpenVINO)."""
        self.name = name
        self.platform = platform
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
    model); files.ConfigError (a UserError) naming `where`, the source, for an entry that
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
        if platform not in PLATFORMS:
            raise files.ConfigError("%s: Model %s requests unsupported platform %s; this "
                                    "server serves %s" % (where, entry.name, platform,
                                                          " or ".join(PLATFORMS)))
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


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A --model_config_file as a run read it: its bytes and the config parsed from
    exactly those bytes."""
    path: str
    raw: bytes
    config: object  # ModelServerConfig

    @property
    def digest(self):
        return hashlib.sha256(self.raw).hexdigest()


class ConfigChanged(errors.UserError):
    """The model config file is not what the run read: someone else changed it."""


def _where(path):
    return "--model_config_file %s" % path


def _read_raw(path):
    try:
        with open(path, "rb") as handle:
            raw = handle.read(files.MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise files.ConfigError("%s: %s" % (_where(path), error.strerror or error)) from None
    if len(raw) > files.MAX_CONFIG_BYTES:
        raise files.ConfigError("%s: larger than %d bytes; not a TF Serving config file"
                                % (_where(path), files.MAX_CONFIG_BYTES))
    return raw


def _parse(path, raw):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise files.ConfigError("%s: not UTF-8 text (%s)" % (_where(path), error)) from None
    return files.parse_text(text, model_server_config_pb2.ModelServerConfig, _where(path))


def read_snapshot(path):
    """The Snapshot of the model config file at `path` (what a later write compares)."""
    raw = _read_raw(path)
    return Snapshot(path, raw, _parse(path, raw))


def _entries(config):
    return {e.name: e for e in config.model_config_list.config}


def _policy(entry):
    policy = entry.model_version_policy
    kind = policy.WhichOneof("policy_choice")
    if kind == "specific":
        return "specific %s" % list(policy.specific.versions)
    if kind == "all":
        return "all"
    return "latest %d" % (policy.latest.num_versions or 1)


def describe_change(before, raw):
    """What differs between the config a run read (`before`) and the file's bytes now
    (`raw`): each model added or removed, each label moved, each policy or base path
    changed; else that only its text changed."""
    try:
        after = _parse("", raw)
    except errors.UserError:
        return "it no longer parses"
    old, new = _entries(before), _entries(after)
    changes = ["model %s added" % name for name in sorted(set(new) - set(old))]
    changes += ["model %s removed" % name for name in sorted(set(old) - set(new))]
    for name in sorted(set(old) & set(new)):
        was, now = old[name], new[name]
        for label in sorted(set(was.version_labels) | set(now.version_labels)):
            a, b = was.version_labels.get(label), now.version_labels.get(label)
            if a != b:
                changes.append("model %s: label %s %s -> %s" % (
                    name, label, "(none)" if a is None else a, "(none)" if b is None else b))
        if _policy(was) != _policy(now):
            changes.append("model %s: version policy %s -> %s" % (name, _policy(was),
                                                                   _policy(now)))
        if was.base_path != now.base_path:
            changes.append("model %s: base_path %s -> %s" % (name, was.base_path,
                                                             now.base_path))
        was_rest, now_rest = type(was)(), type(now)()
        was_rest.CopyFrom(was)
        now_rest.CopyFrom(now)
        for message in (was_rest, now_rest):
            for field in ("version_labels", "model_version_policy", "base_path"):
                message.ClearField(field)
        if was_rest != now_rest:
            changes.append("model %s: other fields" % name)
    return "; ".join(changes) or "its text only (comments or layout)"


def check_unchanged(snapshot):
    """ConfigChanged, naming what changed, unless the file holds the snapshot's bytes."""
    raw = _read_raw(snapshot.path)
    if raw != snapshot.raw:
        raise ConfigChanged(
            "%s changed since this run read it (%s); nothing was published: run again to "
            "publish on top of the new config" % (_where(snapshot.path),
                                                   describe_change(snapshot.config, raw)))


def check_writable(path):
    """A UserError when the operator made the file read-only (no write permission bit,
    or no write access): the rename a write does would replace it anyway."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise files.ConfigError("%s: %s" % (_where(path), error.strerror or error)) from None
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or \
            not os.access(path, os.W_OK):
        raise errors.UserError("%s is read-only (mode %s): the version labels cannot be "
                               "written" % (_where(path), oct(stat.S_IMODE(mode))))


class PendingLabels:
    """A model config write prepared beside the file (every check done, the new text
    fsynced in a temporary): commit() checks again that the file holds what was read
    and renames the temporary over it; discard() removes the temporary; revert() puts
    the text that was read back, if the file still holds what commit() wrote."""

    def __init__(self, path, entry, text, temp, before):
        self.path, self.entry, self.text, self.temp = path, entry, text, temp
        self._before = before  # Snapshot of what was read
        self.committed = False

    def commit(self):
        with errors.writing(self.path, "--model_config_file"):
            try:
                check_unchanged(self._before)
                os.replace(self.temp, self.path)
                _fsync_directory(self.path)
            except BaseException:
                self.discard()
                raise
        self.committed = True
        return self.entry

    def discard(self):
        try:
            os.unlink(self.temp)
        except FileNotFoundError:
            pass

    def revert(self):
        """Back to the text that was read, unless someone changed the file since."""
        if not self.committed or _read_raw(self.path) != self.text.encode("utf-8"):
            return False
        _write_beside(self.path, self._before.raw, replace=True)
        self.committed = False
        return True


def _fsync_directory(path):
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_beside(path, data, replace):
    """Writes `data` to a temporary beside `path` (fsynced); renames it over `path` when
    `replace`, else returns the temporary's name."""
    folder = os.path.dirname(os.path.abspath(path))
    prefix = ".%s.tmp-" % os.path.basename(path)
    temp = os.path.join(folder, "%s%d-%s" % (prefix, os.getpid(), secrets.token_hex(4)))
    with errors.writing(path, "--model_config_file"):
        _remove_dead_temporaries(folder, prefix)
        try:
            with open(temp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            if replace:
                os.replace(temp, path)
                _fsync_directory(path)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise
    return temp


def prepare_version_labels(path, model_name, labels, versions, expected=None):
    """The PendingLabels of a write of the --model_config_file at `path` in which model
    `model_name` serves exactly `versions` (policy `specific`) under `labels` ({label:
    version}, each one of `versions`), every other entry and field unchanged.

    expected: the Snapshot the caller read at its start; the new config is built on it,
    and a file that no longer holds its bytes is refused (ConfigChanged, naming what
    changed). Without it, the file as it is now. A read-only file is refused. Nothing
    but the temporary is written; commit() replaces the file."""
    where = _where(path)
    before = expected if expected is not None else read_snapshot(path)
    config = type(before.config)()
    config.CopyFrom(before.config)
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
    check_unchanged(before)
    check_writable(path)
    temp = _write_beside(path, text.encode("utf-8"), replace=False)
    return PendingLabels(path, entry, text, temp, before)


def set_version_labels(path, model_name, labels, versions, expected=None):
    """Rewrites the --model_config_file at `path` as prepare_version_labels says. Whole
    or not at all: written beside, fsynced and renamed over the file, so a server
    polling it reads the old config or the new one, never half of one (what a writer
    killed before its rename left beside it is removed by the next). Returns the new
    entry."""
    return prepare_version_labels(path, model_name, labels, versions, expected).commit()


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
