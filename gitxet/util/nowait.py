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

__all__ = ["active", "nowait", "pread", "pread_view"]

_state = threading.local()
_FLAG = getattr(os, "RWF_NOWAIT", 0)
#: the largest read :func:`pread_view` serves from its thread's reused buffer (one a thread)
SCRATCH_MAX = 4 << 20


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


def pread_view(fd: int, size: int, offset: int) -> memoryview:
    """:func:`pread`'s bytes as a view of a buffer this thread reuses (up to
    :data:`SCRATCH_MAX` bytes): valid until this thread's next call, so copy what is kept.

    For reads that are decoded at once (a run of xorb chunks): no buffer allocated,
    zeroed, faulted in and copied again per read. A short read is returned short outside
    :func:`nowait` (the caller tells a truncated file), raises inside it.
    """
    kept: bytearray | None = getattr(_state, "scratch", None)
    if size > SCRATCH_MAX:
        buf = bytearray(size)
    elif kept is None or len(kept) < size:
        buf = _state.scratch = bytearray(max(size, 1 << 20))
    else:
        buf = kept
    view = memoryview(buf)[:size]
    on = getattr(_state, "on", False)
    if on and not _FLAG:
        raise WouldBlockError("reads without waiting are not supported here")
    try:
        n = os.preadv(fd, [view], offset, _FLAG if on else 0)
    except BlockingIOError:
        raise WouldBlockError("not in the page cache") from None
    except OSError as exc:
        if not on:
            raise
        raise WouldBlockError(f"cannot read without waiting: {exc}") from None  # EOPNOTSUPP
    if n != size and on:
        raise WouldBlockError("partly in the page cache")
    return view[:n]
