"""Integer version directories under an export base: listing, claiming, publishing,
pruning, and removing what dead exports left behind, safe with concurrent writers.

A writer claims a version by creating `<export_base>/.tmp-<version>` exclusively (os.mkdir:
only one caller can create a name), writes into it, then renames it to
`<export_base>/<version>`. TF Serving ignores names that are not integers, so a server
polling the base path never sees a partial version; two writers never share a version;
cleanup removes only temporary directories untouched for an hour, never a live one.

Local paths use os (no TensorFlow import: a writer process starts in milliseconds);
other paths (gs://, ram://, ...) go through tf.io.gfile. Object stores have no exclusive
create, so there the claim is check-then-create: one writer per base path.
"""
import os
import socket
import shutil
import time

from slimserve import errors

TEMP_PREFIX = ".tmp-"
# A temporary directory untouched for this long belongs to an export that died.
STALE_TEMP_SECONDS = 3600


def _is_local(path):
    return "://" not in str(path)


def _gfile():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (only for URL paths)
    return tf.io.gfile


def _exists(path):
    return os.path.exists(path) if _is_local(path) else _gfile().exists(path)


def _rmtree(path):
    """Removes a version or temporary directory; a symlink in its place is removed as a
    link, never followed (what it points to is not this export base's to delete)."""
    if _is_local(path):
        if os.path.islink(path):
            os.unlink(path)
        else:
            shutil.rmtree(path)
    else:
        _gfile().rmtree(path)


def _entries(export_base):
    """Names in `export_base`, without the trailing "/" GCS listings add to directories;
    every reader below uses this one listing."""
    if not _exists(export_base):
        return []
    names = os.listdir(export_base) if _is_local(export_base) else \
        _gfile().listdir(export_base)
    return [name.rstrip("/") for name in names]


def _temp_version(name):
    """`.tmp-<version>` -> version, else None."""
    suffix = name[len(TEMP_PREFIX):] if name.startswith(TEMP_PREFIX) else ""
    return int(suffix) if suffix.isdigit() else None


def list_versions(export_base):
    """Published versions, ascending."""
    return sorted(int(name) for name in _entries(export_base) if name.isdigit())


def next_version(export_base):
    """Seconds since the epoch, like Estimator exports, but above every version that is
    published or claimed (a `.tmp-<version>` of an export in progress)."""
    names = _entries(export_base)
    taken = [int(name) for name in names if name.isdigit()]
    taken += [v for v in map(_temp_version, names) if v is not None]
    return max([int(time.time())] + [v + 1 for v in taken])


def _mkdir_exclusive(path):
    """Creates `path`; FileExistsError if it exists. (tf.io.gfile.mkdir succeeds on an
    existing directory, so it cannot claim anything.)"""
    if _is_local(path):
        os.mkdir(path)
        return
    if _gfile().exists(path):
        raise FileExistsError(path)
    _gfile().mkdir(path)


def claim_version(export_base, attempts=1000):
    """Claims the next free version: returns (version, temp_dir), where this caller alone
    created `temp_dir` = `<export_base>/.tmp-<version>`. A collision moves on to the next
    number."""
    if _is_local(export_base):
        os.makedirs(export_base, exist_ok=True)
    else:
        _gfile().makedirs(export_base)
    version = next_version(export_base)
    for _ in range(attempts):
        temp_dir = os.path.join(export_base, "%s%d" % (TEMP_PREFIX, version))
        try:
            _mkdir_exclusive(temp_dir)
        except FileExistsError:
            version += 1
            continue
        # Ours now; if the number is published, an earlier claimant finished with it.
        if not _exists(os.path.join(export_base, str(version))):
            _write_owner(temp_dir)
            return version, temp_dir
        _rmtree(temp_dir)
        version = max(version + 1, next_version(export_base))
    raise RuntimeError("could not claim a version under %s after %d attempts"
                       % (export_base, attempts))


OWNER_SUFFIX = ".owner"
_OWNER_PART = ".part"  # the owner file while it is written (renamed into place whole)


def _write_owner(temp_dir):
    """`<temp_dir>.owner` says which host and process is writing `temp_dir` (beside it:
    the SavedModel builder wants the directory itself empty), so a later export can
    remove the directory of a writer that died without waiting for it to go stale. It is
    written beside and renamed into place: a writer killed between creating it and
    writing it left an empty owner file, which names nobody, so its directory waited an
    hour (a run under three workers hit that)."""
    if _is_local(temp_dir):
        part = temp_dir + OWNER_SUFFIX + _OWNER_PART
        with open(part, "w") as handle:
            handle.write("%s %d\n" % (socket.gethostname(), os.getpid()))
        os.replace(part, temp_dir + OWNER_SUFFIX)


def _owner_is_dead(temp_dir):
    """True when the owner file names a process of this host that no longer runs."""
    try:
        with open(temp_dir + OWNER_SUFFIX) as handle:
            host, pid = handle.read().split()
        pid = int(pid)
    except (OSError, ValueError):
        return False
    if host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _remove_owner(temp_dir):
    if _is_local(temp_dir):
        for path in (temp_dir + OWNER_SUFFIX, temp_dir + OWNER_SUFFIX + _OWNER_PART):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass


def publish(export_base, version, temp_dir):
    """Renames the finished `temp_dir` to `<export_base>/<version>` (atomic on POSIX)."""
    final_dir = os.path.join(export_base, str(version))
    if _is_local(export_base):
        os.rename(temp_dir, final_dir)
    else:
        _gfile().rename(temp_dir, final_dir)
    _remove_owner(temp_dir)
    return final_dir


def _copy_tree(source_dir, temp_dir):
    """Copies the version `source_dir` into this writer's claimed `temp_dir`."""
    if _is_local(source_dir) and _is_local(temp_dir):
        shutil.copytree(source_dir, temp_dir, dirs_exist_ok=True)
        return
    gfile = _gfile()
    for root, _, files in gfile.walk(source_dir):
        target = os.path.join(temp_dir, os.path.relpath(root, source_dir))
        gfile.makedirs(target)
        for name in files:
            gfile.copy(os.path.join(root, name), os.path.join(target, name), True)


def copy_version(source_dir, export_base):
    """Publishes a copy of the published version `source_dir` as a new version of
    `export_base` (claimed and published as every export is); returns its directory. The
    final exporter uses it when the best exporter already wrote the same checkpoint."""
    version, temp_dir = claim_version(export_base)
    try:
        _copy_tree(source_dir, temp_dir)
        return publish(export_base, version, temp_dir)
    except BaseException:
        discard(temp_dir)
        raise


class VersionsChanged(errors.UserError):
    """The base path's versions are not those the run read: someone added or removed one."""


def check_versions_unchanged(export_base, expected, flag="--model_base_path"):
    """VersionsChanged, naming the versions added and removed, unless `export_base`
    publishes exactly the versions `expected` (what the caller listed at its start)."""
    now, before = set(list_versions(export_base)), set(expected)
    if now == before:
        return
    changes = []
    if now - before:
        changes.append("added %s" % ", ".join(map(str, sorted(now - before))))
    if before - now:
        changes.append("removed %s" % ", ".join(map(str, sorted(before - now))))
    raise VersionsChanged("%s %s: its versions changed since this run read them (%s); "
                          "nothing was published: run again to publish on top of them"
                          % (flag, export_base, "; ".join(changes)))


def publish_announced(export_base, source_dir, expected_versions, announce,
                      flag="--model_base_path"):
    """Publishes a copy of the version `source_dir` as a new version of `export_base`
    that is announced (labelled in the model config) before any server can load it,
    or refuses and leaves nothing servable. Returns (version, its directory).

    announce(version) prepares the announcement and returns it: an object whose checks
    are all done (the model config is what the caller read, and writable) and whose new
    text is already written beside the config, with commit(), discard() and revert()
    (serving/config/model_config.py PendingLabels). In order:
    1. the copy is written under `.tmp-<version>` (claim_version): servers ignore it;
    2. announce(version): a refusal leaves nothing (the temporary is removed);
    3. the versions of `export_base` must still be `expected_versions` (what the caller
       listed at its start): one added or removed meanwhile refuses (VersionsChanged);
    4. commit(): the config, checked once more, renamed over the old one;
    5. `.tmp-<version>` renamed to `<version>`: only now can a server load it, and the
       config it reads already names it. If this rename fails, 4 is reverted (unless
       the config changed again since).
    A crash before 4 leaves a `.tmp-` (removed by the next writer: its owner is dead);
    between 4 and 5, a config naming a version not there yet: servers keep serving what
    they served (TF Serving and slimserve refuse a label of a version that is not
    available, and the specific policy keeps the old versions). At no point is there a
    version on disk without its label. A server that has not read the new config when
    the version appears (its config poll slower than its file-system poll) still runs
    its old policy: under `latest` it loads the version unlabelled until it reads the
    config; a model published this way should be served with a `specific` policy (the
    first publish writes one)."""
    version, temp_dir = claim_version(export_base)
    try:
        _copy_tree(source_dir, temp_dir)
        pending = announce(version)
        try:
            check_versions_unchanged(export_base, expected_versions, flag)
            pending.commit()
        except BaseException:
            pending.discard()
            raise
        try:
            final = publish(export_base, version, temp_dir)
        except BaseException:
            pending.revert()
            raise
        return version, final
    except BaseException:
        discard(temp_dir)
        raise


def discard(temp_dir):
    """Removes this writer's own unpublished `temp_dir` (after a failure)."""
    if _exists(temp_dir):
        _rmtree(temp_dir)
    _remove_owner(temp_dir)


def check_exports_to_keep(exports_to_keep):
    """`exports_to_keep` < 1 would keep everything (`[:-0]` is empty), so refuse it."""
    if isinstance(exports_to_keep, bool) or not isinstance(exports_to_keep, int) or \
            exports_to_keep < 1:
        raise errors.UserError("exports_to_keep (--exports_to_keep) must be an integer >= 1, "
                               "got %r" % (exports_to_keep,))


def prune_versions(export_base, exports_to_keep):
    """Removes all but the newest `exports_to_keep` published versions; returns them."""
    check_exports_to_keep(exports_to_keep)
    removed = list_versions(export_base)[:-exports_to_keep]
    for version in removed:
        _rmtree(os.path.join(export_base, str(version)))
    return removed


def _not_found_errors(path):
    if _is_local(path):
        return (FileNotFoundError,)
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return (tf.errors.NotFoundError,)


def _newest_mtime(path):
    """Latest modification time in the tree at `path`: an export in progress keeps
    writing somewhere inside it."""
    if not _is_local(path):
        gfile = _gfile()
        newest = gfile.stat(path).mtime_nsec / 1e9
        for root, dirs, files in gfile.walk(path):
            for name in dirs + files:
                newest = max(newest, gfile.stat(os.path.join(root, name)).mtime_nsec / 1e9)
        return newest
    newest = os.stat(path).st_mtime
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                newest = max(newest, os.stat(os.path.join(root, name)).st_mtime)
            except FileNotFoundError:
                pass  # removed while we looked
    return newest


def remove_stale_temp_dirs(export_base, max_age_seconds=STALE_TEMP_SECONDS, now=None):
    """Removes `.tmp-*` left by exports that died (servers never load them): those whose
    owner file names a process of this host that is gone, and any untouched for
    `max_age_seconds`; a concurrent export's directory survives."""
    now = time.time() if now is None else now
    removed = []
    for name in _entries(export_base):
        if not name.startswith(TEMP_PREFIX) or name.endswith(OWNER_SUFFIX) or \
                name.endswith(OWNER_SUFFIX + _OWNER_PART):
            continue
        path = os.path.join(export_base, name)
        try:
            if not _owner_is_dead(path) and now - _newest_mtime(path) < max_age_seconds:
                continue
            _rmtree(path)
        except _not_found_errors(path):
            continue  # published or removed by its writer meanwhile
        _remove_owner(path)
        removed.append(name)
    return removed
