"""Reads that never wait on a disk: an event loop serves what the page cache holds.

Inside :func:`nowait` (per thread), :func:`pread` reads with ``RWF_NOWAIT`` and raises
:class:`~gitxet.errors.WouldBlockError` when any byte asked for is not in the page cache;
the caller then does the same read on a thread that may block. Outside it, :func:`pread`
is ``os.pread``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from gitxet.errors import WouldBlockError

__all__ = ["active", "nowait", "pread"]

_state = threading.local()
_FLAG = getattr(os, "RWF_NOWAIT", 0)


@contextlib.contextmanager
def nowait() -> Iterator[None]:
    """Within the block, this thread's :func:`pread` calls never wait on a disk."""
    before = getattr(_state, "on", False)
    _state.on = True
    try:
        yield
    finally:
        _state.on = before


def active() -> bool:
    """True inside :func:`nowait` on this thread."""
    return bool(getattr(_state, "on", False))


def pread(fd: int, size: int, offset: int) -> bytes:
    """``os.pread``; inside :func:`nowait`, only from the page cache (else WouldBlockError).

    A short read inside :func:`nowait` also raises (part of the range may not be cached):
    the blocking read then tells a real end of file from a cold page.
    """
    if not getattr(_state, "on", False):
        return os.pread(fd, size, offset)
    if not _FLAG:
        raise WouldBlockError("reads without waiting are not supported here")
    buf = bytearray(size)
    try:
        n = os.preadv(fd, [buf], offset, _FLAG)
    except BlockingIOError:
        raise WouldBlockError("not in the page cache") from None
    except OSError as exc:  # EOPNOTSUPP: a filesystem without RWF_NOWAIT
        raise WouldBlockError(f"cannot read without waiting: {exc}") from None
    if n != size:
        raise WouldBlockError("partly in the page cache")
    return bytes(buf)
