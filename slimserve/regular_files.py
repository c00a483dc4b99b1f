"""Reading a file a user named, safely: regular files only, never more than a bound.

A FIFO would block a reader forever and `/dev/zero` would fill its memory, so every file
a user names as an image (the converter, bulk inference, the load test and the client:
slimserve/image_listing.py lists them) is read through `read_regular`, and the others
are skipped with its reason, in the same words whichever tool met them.
Plain Python (no TensorFlow), so converter worker processes stay light.
"""
import errno
import os
import stat


class NotReadable(Exception):
    """A file that was not read; the message is the reason, as a skip row shows it."""


def read_regular(path, max_bytes, limit_name="max_file_bytes"):
    """The bytes of `path` if it is a regular file of at most `max_bytes` bytes (0: no
    limit); NotReadable with the reason otherwise (`limit_name`: what the reason calls
    the bound, the caller's flag).

    Checked with stat before opening (so a device is never opened) and again with fstat
    on the descriptor opened non-blocking (so a FIFO swapped in meanwhile cannot block);
    the read is bounded even if the file grows.
    """
    try:
        status = os.stat(path)
    except OSError as error:
        if error.errno == errno.ENOENT and os.path.islink(path):
            raise NotReadable("dangling symlink (target %r does not exist)"
                              % os.readlink(path)) from None
        if error.errno == errno.ELOOP:
            raise NotReadable("symlink loop") from None
        raise NotReadable("unreadable: %s" % (error.strerror or error)) from None
    check_regular(status, max_bytes, limit_name)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise NotReadable("unreadable: %s" % (error.strerror or error)) from None
    with os.fdopen(descriptor, "rb", buffering=0) as handle:
        status = os.fstat(handle.fileno())
        check_regular(status, max_bytes, limit_name)
        try:
            return _read_bounded(handle, status.st_size, max_bytes, limit_name)
        except OSError as error:
            raise NotReadable("unreadable: %s" % (error.strerror or error)) from None


def _read_bounded(handle, size, max_bytes, limit_name):
    """Reads the stated size plus whatever the file grew by, never past the cap
    (one allocation of the stated size, not of the cap)."""
    chunks = [handle.read(size + 1)]
    total = len(chunks[0])
    while total > size:  # the file grew while being read: continue in bounded steps
        if max_bytes and total > max_bytes:
            raise NotReadable("file grew past %s=%d while being read" % (limit_name, max_bytes))
        chunk = handle.read(1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks) if len(chunks) > 1 else chunks[0]


def check_regular(status, max_bytes, limit_name="max_file_bytes"):
    """NotReadable unless an os.stat result is a regular file of at most max_bytes."""
    mode = status.st_mode
    if not stat.S_ISREG(mode):
        kind = ("a directory" if stat.S_ISDIR(mode) else
                "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else
                "a character device" if stat.S_ISCHR(mode) else
                "a block device" if stat.S_ISBLK(mode) else
                "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise NotReadable("not a regular file: %s" % kind)
    if max_bytes and status.st_size > max_bytes:
        raise NotReadable("file too large: %d bytes > %s=%d"
                          % (status.st_size, limit_name, max_bytes))
