"""Chunk read-around: after a small read, hand the rest of its chunk to the kernel page cache.

A small read of a pointer file is served from a whole chunk that was read and verified (and,
when compressed, decoded) anyway. The kernel, though, asks the FUSE daemon for every page it
misses, and each request costs far more in a Python FUSE loop than copying a page does. So
after a read of at most :data:`READ_AROUND_MAX` bytes, the chunk's other whole pages are
stored into the page cache (``FUSE_NOTIFY_STORE``); later reads near it are page-cache hits
and never reach the daemon. A commit's content never changes, so those pages stay right.

Why a thread of its own: while a read of a page waits for the daemon, the kernel keeps that
page locked, and a store touching it blocks until the read is answered. Stores therefore
never run on the thread that answers reads, and they skip the pages of the read that asked
for them. Work is dropped, never queued without bound, when the feeder falls behind: it is
only ever a hint.
"""

from __future__ import annotations

import logging
import mmap
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

from gitxet.vfs.nodes import Attrs

log = logging.getLogger(__name__)

PAGE = mmap.PAGESIZE
READ_AROUND_MAX = 32 * 1024  # larger reads come from kernel read-ahead, which does this itself
MAX_PENDING = 128


class ChunkedFS(Protocol):
    """What the feeder needs from the filesystem model."""

    def chunk_extent(self, ino: int, offset: int) -> tuple[int, int] | None: ...

    def read(self, ino: int, offset: int, size: int) -> bytes: ...

    def getattr(self, ino: int) -> Attrs: ...


#: ``store(kernel_inode, offset, data)``: puts ``data`` into the page cache (pyfuse3's
#: ``notify_store`` in a mount).
StoreFn = Callable[[int, int, memoryview], None]


class ChunkReadAround:
    """A worker thread that stores the rest of a chunk after a small read of it."""

    def __init__(self, fs: ChunkedFS, store: StoreFn, *, max_pending: int = MAX_PENDING) -> None:
        self._fs = fs
        self._store = store
        self._jobs: queue.Queue[tuple[int, int, int, int] | None] = queue.Queue(max_pending)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.stored_bytes = 0
        self.dropped = 0

    def start(self) -> None:
        """Start the worker; until then :meth:`offer` does nothing."""
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="read-around", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> bool:
        """Stop the worker; False when it is still blocked in a store after ``timeout``."""
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        self._stopping = True
        try:
            self._jobs.put_nowait(None)
        except queue.Full:
            pass  # it sees _stopping before its next store
        thread.join(timeout)
        return not thread.is_alive()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every offered read has been handled; False on timeout."""
        deadline = time.monotonic() + timeout
        while self._jobs.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def offer(self, kernel_ino: int, ino: int, offset: int, size: int) -> None:
        """Note a read just answered; cheap, never blocks, may be dropped."""
        if self._thread is None or size > READ_AROUND_MAX:
            return
        try:
            self._jobs.put_nowait((kernel_ino, ino, offset, size))
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None or self._stopping:
                    return
                self._around(*job)
            except Exception as exc:  # a hint only: the read itself was already answered
                assert job is not None
                log.debug("read-around of inode %d at %d skipped: %s", job[1], job[2], exc)
            finally:
                self._jobs.task_done()

    def _around(self, kernel_ino: int, ino: int, offset: int, size: int) -> None:
        extent = self._fs.chunk_extent(ino, offset)
        if extent is None:
            return
        file_size = self._fs.getattr(ino).size
        start, end = extent
        lo = -(-start // PAGE) * PAGE
        # a page is whole when it ends inside the chunk, or is the file's last page
        hi = file_size if end >= file_size else end // PAGE * PAGE
        skip_lo = offset // PAGE * PAGE
        skip_hi = min(file_size, -(-(offset + size) // PAGE) * PAGE)
        pieces = [(a, b) for a, b in ((lo, min(hi, skip_lo)), (max(lo, skip_hi), hi)) if a < b]
        if not pieces:
            return
        a0 = pieces[0][0]
        data = memoryview(self._fs.read(ino, a0, pieces[-1][1] - a0))
        if len(data) != pieces[-1][1] - a0:
            return
        for a, b in pieces:
            if self._stopping:
                return
            self._store(kernel_ino, a, data[a - a0 : b - a0])
            self.stored_bytes += b - a
