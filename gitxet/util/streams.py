"""Stream helpers: read exactly up to ``n`` bytes, a head put back before a stream, and
whole writes of many buffers."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from typing import BinaryIO

#: buffers per ``pwritev`` call (Linux's IOV_MAX)
_IOV_MAX = 1024
#: bytes per :func:`write_all` call to the kernel at most. The page cache sizes its folios
#: after each write: one 64 MiB ``writev`` gets large folios, and on a VM whose free memory
#: was handed back to the host (virtio-balloon free page reporting) filling those cost
#: 1-2.5 ms of system time per MiB here, against ~0.25 ms/MiB in writes of 256 KiB.
WRITE_BATCH = 256 << 10


def _batches(parts: Sequence[bytes | memoryview]) -> Iterator[tuple[list[memoryview], int]]:
    """``parts`` as runs of views of at most :data:`WRITE_BATCH` bytes and ``_IOV_MAX``
    buffers each (a large part cut in pieces), with each run's size."""
    batch: list[memoryview] = []
    size = 0
    for part in parts:
        view = memoryview(part).cast("B")
        for off in range(0, view.nbytes, WRITE_BATCH):
            piece = view[off : off + WRITE_BATCH]
            if batch and (size + piece.nbytes > WRITE_BATCH or len(batch) == _IOV_MAX):
                yield batch, size
                batch, size = [], 0
            batch.append(piece)
            size += piece.nbytes
    if batch:
        yield batch, size


def write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """Write ``parts`` in order at ``fd``'s position, all of them (short writes resume), in
    ``writev`` calls of at most :data:`WRITE_BATCH` bytes (no join of the parts).

    Raises:
        OSError: the write failed (a full disk, a closed descriptor).
    """
    for batch, _ in _batches(parts):
        _write_batch(fd, batch, None)


def write_all_at(fd: int, views: Sequence[memoryview], offset: int) -> None:
    """Write ``views`` (in order) at ``offset`` of ``fd``, all of them (however short the
    kernel's writes are), in ``pwritev`` calls of at most :data:`WRITE_BATCH` bytes (as
    :func:`write_all`: an 8 MiB range written in one call cost a clone of 1 GiB about a
    second of system time more); the file position does not move.

    Raises:
        OSError: the write failed (a full disk, a closed descriptor).
    """
    for batch, size in _batches(views):
        _write_batch(fd, batch, offset)
        offset += size


def _write_batch(fd: int, views: list[memoryview], offset: int | None) -> None:
    """All of ``views`` at the file position (``offset`` None) or at ``offset``."""
    while views:
        wrote = os.writev(fd, views) if offset is None else os.pwritev(fd, views, offset)
        if wrote <= 0:
            raise OSError("write wrote nothing")
        if offset is not None:
            offset += wrote
        while views and wrote >= views[0].nbytes:
            wrote -= views[0].nbytes
            views.pop(0)
        if wrote:
            views[0] = views[0][wrote:]


def read_up_to(src: BinaryIO, n: int) -> bytes:
    """``n`` bytes of ``src``, fewer only at its end (however short its reads are)."""
    parts: list[bytes] = []
    left = n
    while left > 0:
        b = src.read(left)
        if not b:
            break
        parts.append(b)
        left -= len(b)
    return b"".join(parts)


class Chained(io.RawIOBase):
    """``head`` followed by the rest of ``src``, as one raw stream (wrap it in a
    ``BufferedReader``)."""

    def __init__(self, head: bytes, src: BinaryIO) -> None:
        self._head = memoryview(head)
        self._src = src

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        readinto = getattr(self._src, "readinto", None)
        if readinto is not None:
            # straight into the caller's buffer: a read() here made a new object and a copy
            # of each block (a filter's 'git add' read half as fast through this layer)
            got: int = readinto(buffer)
            return got
        data = self._src.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
