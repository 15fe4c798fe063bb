"""The one state-dir lock and stale-socket probe of the long-running plugins (Docker, CSI).

A plugin owns a state directory (records of what it mounted) and listens on a unix socket.
Two plugins sharing either would each unmount what the other serves, so:

- :func:`lock_state_dir` takes an exclusive ``flock`` held for the process's lifetime (the
  kernel drops it when the process dies, however it dies: no stale lock files);
- :func:`clear_stale_socket` removes a socket file only when nobody listens on it (the
  kernel answers ``ECONNREFUSED``). Any other answer (a listener too busy to accept, a
  permission error) leaves it alone and raises: a live plugin's socket is never taken over.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat

from gitxet.errors import StateBusyError

__all__ = ["clear_stale_socket", "lock_state_dir"]

# connect() errors that prove nobody listens on the socket file
_DEAD = (errno.ECONNREFUSED, errno.ENOENT)


def lock_state_dir(state_dir: str, *, lock_name: str = "lock", owner: str = "gitxet") -> int:
    """Lock ``state_dir`` (created 0700 if missing) for this process's lifetime.

    Returns the lock file's descriptor: keep it open (close it to release the lock).
    ``owner`` names the kind of process in the error (``"CSI plugin"``).

    Raises:
        StateBusyError: another process holds the lock.
    """
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    path = os.path.join(state_dir, lock_name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateBusyError(state_dir, f"another {owner} process uses this state dir") from None
    return fd


def clear_stale_socket(path: str, *, timeout: float = 2.0) -> None:
    """Remove the socket file at ``path`` if it is a leftover of a dead process.

    Nothing there is fine. Raises :class:`StateBusyError` when something listens there,
    when that cannot be ruled out (the connect failed otherwise than "refused"), or when the
    path is not a socket.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise StateBusyError(path, "exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno not in _DEAD:
            # EAGAIN (a full accept backlog), a timeout, EACCES: maybe alive, so keep it
            raise StateBusyError(
                path, f"cannot tell whether a process still serves this socket: {exc}"
            ) from None
    else:
        raise StateBusyError(path, "another process is serving on this socket")
    finally:
        probe.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
