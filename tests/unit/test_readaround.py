"""Chunk read-around: which pages are stored after a small read, and when nothing is."""

from __future__ import annotations

import threading
import time

from gitxet.mount.readaround import PAGE, READ_AROUND_MAX, ChunkReadAround
from gitxet.vfs.nodes import Attrs, NodeKind

DATA = bytes(range(256)) * 1000  # 256,000 bytes: the last page is partial


class FakeFS:
    """One file, inode 7, in chunks of 50,000 bytes (boundaries off the page grid)."""

    def __init__(self) -> None:
        self.reads: list[tuple[int, int]] = []

    def chunk_extent(self, ino: int, offset: int) -> tuple[int, int] | None:
        if ino != 7 or not 0 <= offset < len(DATA):
            return None
        start = offset // 50_000 * 50_000
        return start, min(len(DATA), start + 50_000)

    def read(self, ino: int, offset: int, size: int) -> bytes:
        self.reads.append((offset, size))
        return DATA[offset : offset + size]

    def getattr(self, ino: int) -> Attrs:
        return Attrs(
            ino=ino, kind=NodeKind.FILE, mode=0o100644, size=len(DATA), nlink=1, mtime_ns=0
        )


def run_one(fs: FakeFS, offset: int, size: int, ino: int = 7) -> list[tuple[int, int, bytes]]:
    stored: list[tuple[int, int, bytes]] = []

    def store(kino: int, off: int, data: memoryview) -> None:
        stored.append((kino, off, bytes(data)))

    ra = ChunkReadAround(fs, store)
    ra.start()
    ra.offer(1000 + ino, ino, offset, size)
    assert ra.wait_idle(5)
    assert ra.stop()
    return stored


def test_the_rest_of_the_chunk_is_stored_in_whole_pages() -> None:
    stored = run_one(FakeFS(), 60_000, 4096)  # chunk [50000, 100000), read pages 57344..65536
    assert [(k, off, len(d)) for k, off, d in stored] == [
        (1007, 53248, 57344 - 53248),  # first whole page after 50000 up to the read
        (1007, 65536, 98304 - 65536),  # after the read up to the last whole page before 100000
    ]
    for _, off, d in stored:
        assert d == DATA[off : off + len(d)]
        assert off % PAGE == 0 and len(d) % PAGE == 0


def test_the_files_last_partial_page_is_stored() -> None:
    stored = run_one(FakeFS(), 250_500, 100)  # chunk [250000, 256000): ends at EOF
    assert stored[-1][1] + len(stored[-1][2]) == len(DATA)
    assert all(d == DATA[off : off + len(d)] for _, off, d in stored)


def test_nothing_for_big_reads_plain_files_or_a_stopped_worker() -> None:
    fs = FakeFS()
    assert run_one(fs, 0, READ_AROUND_MAX + 1) == []
    assert run_one(fs, 0, 4096, ino=8) == []  # no chunk extent: not a pointer file
    stored: list[object] = []
    ra = ChunkReadAround(fs, lambda *a: stored.append(a))
    ra.offer(1, 7, 0, 4096)  # never started
    ra.start()
    assert ra.stop()
    ra.offer(1, 7, 0, 4096)  # stopped again
    assert ra.wait_idle(1)  # nothing was queued (no worker would ever take it)
    assert stored == []


def test_a_full_queue_drops_work_instead_of_blocking() -> None:
    gate = threading.Event()

    def slow_store(kino: int, off: int, data: memoryview) -> None:
        gate.wait(60)

    ra = ChunkReadAround(FakeFS(), slow_store, max_pending=2)
    ra.start()
    t = time.monotonic()
    for i in range(50):
        ra.offer(1, 7, (i % 5) * 50_000 + 1000, 4096)
    assert time.monotonic() - t < 10  # a blocking offer would wait for the gate (60 s)
    assert ra.dropped > 0
    gate.set()
    assert ra.stop()


def test_a_failing_store_is_only_a_missed_hint() -> None:
    calls = []

    def broken(kino: int, off: int, data: memoryview) -> None:
        calls.append(off)
        raise OSError(2, "no such inode in the kernel")

    ra = ChunkReadAround(FakeFS(), broken)
    ra.start()
    ra.offer(1, 7, 60_000, 10)
    ra.offer(1, 7, 160_000, 10)
    assert ra.wait_idle(5)
    assert ra.stop()
    assert len(calls) == 2  # one per job: the first piece failed, the job ended, the next ran
