"""The one type for errors a user can fix: a flag, a file, a path they gave.

Every command catches `UserError` only (slimserve/cli/logs.py `run`) and prints its message
as one line, `slimserve-<command>: <message>`, exiting 1; anything else is a bug and keeps
its traceback. Libraries raise a UserError (or a subclass: DatasetError, ConfigError, ...)
whose message names what is wrong (the flag, the file and field, the path), and turn an
OSError on a path the user gave into one with `path_error` or `writing`:

    with errors.writing(export_base, "--export_base"):
        publish(...)          # disk full -> "--export_base models/x: No space left on device"

UserError is its own type, not a ValueError: a ValueError (raised inside TensorFlow, numpy
or our own code) is a bug and keeps its traceback, and the server answers it INTERNAL / 500,
never INVALID_ARGUMENT / 400 as it answers a UserError met while validating a request.
"""
import contextlib
import errno
import os

# OSError numbers that describe the place, not a bug: the user can free space, fix a
# permission or pick another path.
PATH_ERRNOS = frozenset(getattr(errno, name) for name in (
    "ENOSPC", "EDQUOT", "EACCES", "EPERM", "EROFS", "ENOENT", "ENOTDIR", "EISDIR", "EEXIST",
    "ENAMETOOLONG", "ELOOP", "EMFILE", "ENFILE", "EFBIG", "EIO", "EXDEV", "ENOTEMPTY",
    "EBUSY") if hasattr(errno, name))


class UserError(Exception):
    """An error the user can fix; its message names the flag, file, field or path."""


def path_error(path, error, what=None):
    """A UserError for an OSError met on `path` (what: the flag or role that named it):
    one line with the path and the system's reason, never a traceback."""
    reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
    where = "%s %s" % (what, path) if what else str(path)
    failed = getattr(error, "filename", None)
    if failed and os.fspath(failed) != os.fspath(path):
        return UserError("%s: %s: %s" % (where, failed, reason))
    return UserError("%s: %s" % (where, reason))


def is_path_error(error):
    """True for an OSError that is about the place (disk full, permissions, ...)."""
    return isinstance(error, OSError) and getattr(error, "errno", None) in PATH_ERRNOS


@contextlib.contextmanager
def writing(path, what=None):
    """Turns an OSError about the place (is_path_error) raised inside into a UserError
    naming `path` (and `what`, the flag that named it). The caller keeps its own clean-up
    (a staging directory removed, nothing published): this only changes how it reads.
    TensorFlow's file errors (tf.errors.ResourceExhaustedError for a full disk,
    PermissionDeniedError) are turned as well."""
    try:
        yield
    except OSError as error:
        if not is_path_error(error):
            raise
        raise path_error(path, error, what) from None
    except Exception as error:  # pylint: disable=broad-except
        reason = _tensorflow_file_error(error)
        if reason is None:
            raise
        where = "%s %s" % (what, path) if what else str(path)
        raise UserError("%s: %s" % (where, reason)) from None


# The system's words for an OSError about the place, as TensorFlow's file errors quote them
# (after the file's path, on whichever line of the message names the failed write).
_PLACE_REASONS = ("No space left on device", "Disk quota exceeded", "Read-only file system",
                  "Permission denied", "No such file or directory", "Not a directory")


def _tensorflow_file_error(error):
    """A line saying why a TensorFlow file-system error is about the place (disk full,
    permission, missing or read-only path), or None. Matched by class name, so this
    module does not import TensorFlow; an out-of-memory ResourceExhaustedError is not
    about a path and is left alone. A graph op's error (a SaveV2 that ran out of space)
    starts "Graph execution error:" and names the reason on a later line: the reason is
    looked for in the whole message."""
    if not type(error).__module__.startswith("tensorflow"):
        return None
    message = str(getattr(error, "message", "") or error).strip()
    lines = message.splitlines()
    first = lines[0] if lines else type(error).__name__
    reason = next((r for r in _PLACE_REASONS if r in message), None)
    name = type(error).__name__
    if name == "ResourceExhaustedError":
        return reason if reason in _PLACE_REASONS[:2] else None
    if name == "PermissionDeniedError":
        return first if reason and reason in first else (reason or first)
    if name in ("NotFoundError", "FailedPreconditionError", "UnknownError",
                "InternalError") and reason:
        return first if reason in first else reason
    return None
