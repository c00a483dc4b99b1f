"""A model's base path as TF Serving's file-system source sees it (aspirable_versions:
every int64-named child is a version), the complete versions tools read
(list_version_dirs: those holding a SavedModel or, with --prefer_tflite_model, a
model.tflite), and a fingerprint that tells when a version's files changed (a failed load
is retried when they do, with --retry_failed_versions_on_change)."""
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


_INT64 = (-2 ** 63, 2 ** 63 - 1)


def parse_version(name):
    """A child's name as a version number the way TF Serving's source reads it
    (strings::safe_strto64: surrounding spaces and a sign allowed, within int64), else
    None. `.tmp-3` (an export in progress, export/versions.py) is no version."""
    text = name.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    number = int(text)
    return number if _INT64[0] <= number <= _INT64[1] else None


class BasePathError(Exception):
    """The base path cannot be read now (gone, unmounted, not listable): a poll changes
    nothing, as TF Serving's file-system source fails its poll."""


def aspirable_versions(base_path):
    """{version: path} of every child of `base_path` whose name parses as an int64, as TF
    Serving's FileSystemStoragePathSource sees a base path: complete or not (one that
    cannot load fails its load). Raises BasePathError when the base path does not exist
    or cannot be listed."""
    try:
        if not tf.io.gfile.exists(base_path):
            raise BasePathError("Could not find base path %s" % base_path)
        names = tf.io.gfile.listdir(base_path)
    except tf.errors.OpError as error:
        raise BasePathError("%s cannot be listed: %s" % (
            base_path, error.message.splitlines()[0] if error.message else error)) from None
    found = {}
    for name in sorted(n.split("/", 1)[0] for n in names):
        number = parse_version(name)
        if number is not None:
            found[number] = os.path.join(base_path, name)
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


# Files that make a folder a version (a SavedModel, or a TF Lite model TF Serving can serve).
_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt", "model.tflite")
_MAX_SUBFOLDERS_CHECKED = 50  # a base path with no version is small; never walk a huge tree
_MAX_NAMED = 3


def _holds_model(path):
    return any(tf.io.gfile.exists(os.path.join(path, name)) for name in _MODEL_FILES)


def _model_file(path):
    return next(name for name in _MODEL_FILES if tf.io.gfile.exists(os.path.join(path, name)))


def diagnose_base_path(base_path):
    """Why `base_path` has no version to serve, as one sentence that says what to do, or ""
    when it has one. Tells apart a path that does not exist, a file, a version folder given
    as the base path (models/flowers/3 holding saved_model.pb itself), a base path one
    level too high (export/ instead of export/final), numbered folders still without a
    model, and an empty folder. What the server logs at start and while polling, and
    appends to GetModelStatus's NOT_FOUND."""
    where = "base path %s" % base_path
    shape = "<base>/1/saved_model.pb"
    try:
        if not tf.io.gfile.exists(base_path):
            return ("%s does not exist: give --model_base_path (or base_path in "
                    "--model_config_file) the folder that holds numbered version folders "
                    "(%s), e.g. a training run's export/final" % (where, shape))
        if not tf.io.gfile.isdir(base_path):
            return ("%s is a file, not a folder: give the folder that holds numbered version "
                    "folders (%s)" % (where, shape))
        if list_version_dirs(base_path):
            return ""
        if _holds_model(base_path):
            parent, name = os.path.split(base_path.rstrip("/"))
            found = "%s holds %s itself: it is one version, not a base path" % (
                where, _model_file(base_path))
            if name.isdigit() and parent:
                return "%s; give its parent %s as the base path" % (found, parent)
            return ("%s; move its contents into a numbered folder under it (%s/1/) or under "
                    "a new base path" % (found, base_path.rstrip("/")))
        children = sorted(name.rstrip("/") for name in tf.io.gfile.listdir(base_path))
        numbered = [name for name in children if name.isdigit()]
        if numbered:
            return ("%s has version folders (%s) but none holds saved_model.pb (a copy still "
                    "running, or an export that failed): the server tries each once it is "
                    "the version its policy wants, and one that fails stays failed until it "
                    "is renamed or removed; publish a version whole (written beside, then "
                    "renamed into place)" % (where, _names(numbered)))
        nested_bases, nested_versions = [], []
        for name in children[:_MAX_SUBFOLDERS_CHECKED]:
            path = os.path.join(base_path, name)
            if not tf.io.gfile.isdir(path):
                continue
            if _holds_model(path):
                nested_versions.append(name)
            elif list_version_dirs(path):
                nested_bases.append(name)
        if nested_bases:
            best = "final" if "final" in nested_bases else nested_bases[0]
            return ("%s holds no numbered version folder, but its sub-folder%s %s hold%s "
                    "versions: did you mean %s?" % (
                        where, "s" if len(nested_bases) > 1 else "", _names(nested_bases),
                        "" if len(nested_bases) > 1 else "s", os.path.join(base_path, best)))
        if nested_versions:
            return ("%s holds no numbered version folder; %s holds a model: name each version "
                    "folder by its version number (e.g. rename %s to %s)" % (
                        where, _names(nested_versions),
                        os.path.join(base_path, nested_versions[0]),
                        os.path.join(base_path, "1")))
        return ("%s %s: export a model into it (slimserve-export --export_base=%s, or "
                "slimserve-train --export) so that it holds %s" % (
                    where, "is empty" if not children else "holds no numbered version folder",
                    base_path, shape))
    except tf.errors.OpError as error:  # permission denied, a flaky remote file system
        return "%s cannot be listed: %s" % (where, error.message.splitlines()[0])


def _names(names):
    shown = ", ".join(names[:_MAX_NAMED])
    return shown + (" and %d more" % (len(names) - _MAX_NAMED) if len(names) > _MAX_NAMED
                    else "")
