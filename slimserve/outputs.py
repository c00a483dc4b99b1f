"""Files the tools write at paths their user gave (predict's --output, --summary and
--confusion_matrix, the tuners' --output_flags, --output_config and --output_png): checked
before any work, then written whole or not at all.

    with outputs.write_atomically(path, "--summary") as handle:
        json.dump(summary, handle)

The bytes go to a temporary file in the same folder, renamed over `path` only when
complete (a crash, a full disk or an error leaves the previous file, never half of a new
one, and removes the temporary file); an OSError about the place (disk full, permission,
read-only file system) becomes a one-line UserError naming the flag and the path
(slimserve/errors.py). Paths with a scheme (gs://...) go through tf.io.gfile, whose object
stores publish a file only when it is closed. Plain Python: TensorFlow is imported only
for such a path.
"""
import contextlib
import os
import tempfile

from slimserve import errors


def is_remote(path):
    return "://" in path


def check_output(path, flag):
    """UserError naming the flag unless `path` can be a new file: not a directory and, for
    a local path, in a folder that exists and can be written. Called before any work."""
    if not path:
        return
    if is_remote(path):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        if tf.io.gfile.isdir(path):
            raise errors.UserError("%s %s is a directory; give the path of a file to write"
                                   % (flag, path))
        return
    if os.path.isdir(path):
        raise errors.UserError("%s %s is a directory; give the path of a file to write"
                               % (flag, path))
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise errors.UserError("%s %s: folder %s does not exist" % (flag, path, folder))
    if not os.access(folder, os.W_OK):
        raise errors.UserError("%s %s: folder %s is not writable" % (flag, path, folder))


@contextlib.contextmanager
def write_atomically(path, flag, binary=False):
    """Yields a handle; on a clean exit its file replaces `path` (see the module doc)."""
    mode = "wb" if binary else "w"
    if is_remote(path):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        with errors.writing(path, flag), tf.io.gfile.GFile(path, mode) as handle:
            yield handle
        return
    with errors.writing(path, flag), _replacing(path, ".partial") as (descriptor, _):
        with os.fdopen(descriptor, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())


@contextlib.contextmanager
def _replacing(path, suffix):
    """Yields (descriptor, name) of a new hidden file beside `path`; on a clean exit it
    gets the mode `open` would have given it and is renamed over `path`, otherwise it is
    removed."""
    folder = os.path.dirname(os.path.abspath(path))
    descriptor, temporary = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".",
                                             suffix=suffix, dir=folder)
    try:
        yield descriptor, temporary
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _umask():
    """The process's umask (read by setting it, then restored): a file written through
    mkstemp (mode 0600) gets the mode `open` would have given it."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_file(path, flag, write):
    """Calls write(temporary path) for a library that writes a file by name (matplotlib's
    savefig), then renames the finished file over `path`, as write_atomically does. The
    temporary name keeps the suffix, so a library that picks a format by it still does."""
    if is_remote(path):
        with errors.writing(path, flag):
            write(path)
        return
    with errors.writing(path, flag), _replacing(
            path, os.path.splitext(path)[1] or ".partial") as (descriptor, temporary):
        os.close(descriptor)
        write(temporary)
