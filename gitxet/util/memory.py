"""Memory for streaming reads: freed buffers kept for reuse, and ``bytes`` filled in place.

A streaming reader allocates and frees buffers of megabytes all the time (an ``xet://``
read returns a new 8 MiB ``bytes``; a range read from the node cache is a new ``bytes``).
glibc's ``malloc`` serves blocks above its mmap threshold (128 KiB at first, raised up to
32 MiB as such blocks are freed) with a fresh ``mmap`` each, and hands the top of its heap
back to the kernel once more than its trim threshold (twice the mmap threshold) is free.
Either way the next buffer lands on fresh pages, and a fresh page is a page fault plus a
zeroed page: on a VM that reports free memory to its host (virtio-balloon), a host fault
too. Measured on the 2-core development VM, a cold 1 GiB ``xet://`` read through a loopback
server spent 2.4-2.5 s of CPU in the reader with glibc's defaults and 1.6-1.8 s with the
settings below, which keep up to :data:`TRIM_THRESHOLD` of freed heap for the next buffer.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable

#: blocks at least this large still get an ``mmap`` of their own (glibc's dynamic maximum)
MMAP_THRESHOLD = 32 << 20
#: freed memory at the top of the heap kept for reuse instead of handed back
TRIM_THRESHOLD = 64 << 20
# mallopt(3) parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_done: bool | None = None


def keep_freed_memory() -> bool:
    """Make ``malloc`` keep freed buffers of up to :data:`MMAP_THRESHOLD` for reuse
    (:data:`TRIM_THRESHOLD` at most), once per process; returns whether the allocator took
    the settings (glibc only: elsewhere, and on any failure, nothing changes)."""
    global _done
    with _lock:
        if _done is not None:
            return _done
        _done = False
        if not sys.platform.startswith("linux"):
            return False
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):
            return False
        mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        mallopt.restype = ctypes.c_int
        _done = bool(
            mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        )
        return _done


def _bytes_maker() -> tuple[Callable[[int], bytes], Callable[[bytes], int]] | None:
    """CPython's ``PyBytes_FromStringAndSize(NULL, n)`` (a new, unfilled ``bytes``) and
    ``PyBytes_AsString`` (its data's address), or None elsewhere."""
    if sys.implementation.name != "cpython":
        return None
    try:
        api = ctypes.pythonapi
        new = api.PyBytes_FromStringAndSize
        new.restype = ctypes.py_object
        new.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
        addr = api.PyBytes_AsString
        addr.restype = ctypes.c_void_p
        addr.argtypes = (ctypes.py_object,)
    except AttributeError:  # pragma: no cover - every CPython has both
        return None
    return (lambda n: new(None, n)), addr


_MAKER = _bytes_maker()


def filled_bytes(size: int, fill: Callable[[memoryview], bool]) -> bytes | None:
    """A new ``bytes`` of ``size`` whose content ``fill`` writes into the writable view it is
    given (returning whether it wrote all of it), or None when it did not.

    A read assembled from several pieces (ranges of the node cache, say) is written straight
    into the object returned, instead of read into pieces that ``b"".join`` copies again:
    on CPython the object is created unfilled and written before anyone else can see it
    (as CPython's own readers do); elsewhere the bytes are filled in a ``bytearray`` and
    copied once. An object ``fill`` did not complete is never returned.
    """
    if _MAKER is None or size < 2:  # (CPython shares its 0- and 1-byte objects)
        buf = bytearray(size)
        with memoryview(buf) as view:
            done = fill(view)
        return bytes(buf) if done else None
    new, address = _MAKER
    out = new(size)
    with memoryview((ctypes.c_char * size).from_address(address(out))).cast("B") as view:
        done = fill(view)
    return out if done else None
