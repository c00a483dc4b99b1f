"""One server per port, and clear refusals, before gRPC or REST binds a port or Unix socket.

gRPC's own failures are one opaque RuntimeError ("Failed to bind to address ...") or, worse,
none at all: with SO_REUSEPORT (gRPC's default) a second server shares a TCP port with the
first and takes part of its connections. ModelServer binds gRPC with `grpc.so_reuseport` 0
and checks here first; every error names the flag and the address.

A Unix socket path a running server listens on is the exception: gRPC unlinks it and binds
anew, so the new server takes the path over (the old one keeps its open connections and
gets no new ones). That is TF Serving's behaviour, which its own integration suite relies
on (every server it starts binds /tmp/tf-serving.sock, and it keeps them all running), so
it is not refused: `check_unix_socket_path` says so, and the server logs it. When the old
server stops, gRPC removes the path (whoever owns it by then), as in TF Serving.
"""
import errno
import os
import socket
import stat

from slimserve import errors

# sockaddr_un.sun_path holds 108 bytes on Linux, the terminating NUL included.
MAX_UNIX_PATH_BYTES = 107


def _kind(mode):
    return ("a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a socket")


def check_unix_socket_path(path, flag="--grpc_socket_path"):
    """(absolute path, True when a running server listens on it) once `path` is one a new
    server may bind: its folder exists, it fits a sockaddr_un, and it is nothing or a
    socket (a stale one, or a served one the new server takes over, as gRPC does).
    A UserError naming the flag otherwise."""
    absolute = os.path.abspath(path)
    if len(os.fsencode(absolute)) > MAX_UNIX_PATH_BYTES:
        raise errors.UserError("%s %s: %d bytes, longer than the %d a Unix socket path may "
                               "have; use a shorter path" % (
                                   flag, absolute, len(os.fsencode(absolute)),
                                   MAX_UNIX_PATH_BYTES))
    folder = os.path.dirname(absolute)
    if not os.path.isdir(folder):
        raise errors.UserError("%s %s: folder %s does not exist" % (flag, absolute, folder))
    try:
        mode = os.lstat(absolute).st_mode
    except FileNotFoundError:
        return absolute, False
    if not stat.S_ISSOCK(mode):
        raise errors.UserError("%s %s exists and is %s; refusing to replace it with a socket"
                               % (flag, absolute, _kind(mode)))
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(absolute)
    except (ConnectionRefusedError, FileNotFoundError):
        return absolute, False  # stale: left by a server that is gone
    except OSError as error:
        raise errors.UserError("%s %s: cannot use it: %s"
                               % (flag, absolute, error.strerror or error)) from None
    finally:
        probe.close()
    return absolute, True


def tcp_bind_error(host, port):
    """Why binding `host:port` fails, as a plain socket sees it (SO_REUSEADDR on, as gRPC
    and waitress set it, so only a live listener makes a port "in use"); None if it binds."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        return "address %s does not resolve: %s" % (host, error.strerror or error)
    family, kind, proto, _, address = infos[0]
    probe = socket.socket(family, kind, proto)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            return "port %d is already in use on %s (another slimserve-server or " \
                   "tensorflow_model_server?)" % (port, host)
        if error.errno == errno.EACCES:
            return "permission denied (ports below 1024 need privileges)"
        if error.errno == errno.EADDRNOTAVAIL:
            return "%s is not an address of this host" % host
        return error.strerror or str(error)
    finally:
        probe.close()
    return None
