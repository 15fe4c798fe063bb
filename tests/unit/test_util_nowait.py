"""``gitxet.util.nowait``: reads that never wait on a disk, per thread."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gitxet.errors import WouldBlockError
from gitxet.util import nowait


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _cold_file(tmp_path: Path) -> tuple[bytes, int]:
    """1 MiB of random bytes in a file out of the page cache: (its bytes, an open fd)."""
    path = tmp_path / "f"
    data = os.urandom(1 << 20)
    path.write_bytes(data)
    _evict(path)
    return data, os.open(path, os.O_RDONLY)


def test_cold_pages_raise_inside_and_are_read_outside(tmp_path: Path) -> None:
    data, fd = _cold_file(tmp_path)
    try:
        with nowait.nowait():
            assert nowait.active()
            with pytest.raises(WouldBlockError):
                nowait.pread(fd, 4096, 512 << 10)
        assert not nowait.active()
        assert nowait.pread(fd, 4096, 512 << 10) == data[512 << 10 : (512 << 10) + 4096]
        with nowait.nowait():  # now cached
            assert nowait.pread(fd, 4096, 512 << 10) == data[512 << 10 : (512 << 10) + 4096]
            with pytest.raises(WouldBlockError):  # short: past the end is not "cached"
                nowait.pread(fd, 4096, len(data) - 100)
        assert len(nowait.pread(fd, 4096, len(data) - 100)) == 100
    finally:
        os.close(fd)


def test_the_mode_is_per_thread_and_nests(tmp_path: Path) -> None:
    seen: list[bool] = []
    with nowait.nowait():
        with nowait.nowait():
            assert nowait.active()
        assert nowait.active()  # the inner block restores, not clears
        t = threading.Thread(target=lambda: seen.append(nowait.active()))
        t.start()
        t.join()
    assert seen == [False]
    assert not nowait.active()


def test_a_view_read_reuses_its_threads_buffer_and_waits_likewise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pread_view``: the same bytes as ``pread``, in a buffer the thread reuses (the
    next call overwrites it), a fresh one past ``SCRATCH_MAX``; cold pages raise inside
    ``nowait`` and are read outside; a short read is short outside, raises inside."""
    monkeypatch.setattr(nowait, "SCRATCH_MAX", 256 << 10)
    data, fd = _cold_file(tmp_path)
    try:
        with nowait.nowait(), pytest.raises(WouldBlockError):
            nowait.pread_view(fd, 4096, 512 << 10)
        first = nowait.pread_view(fd, 4096, 512 << 10)
        assert first == data[512 << 10 : (512 << 10) + 4096]
        second = nowait.pread_view(fd, 100, 0)
        assert second == data[:100]
        assert first.obj is second.obj  # one buffer: the first view now shows other bytes
        assert first[:100] == data[:100]
        big = nowait.pread_view(fd, 300 << 10, 1 << 10)  # past SCRATCH_MAX: its own buffer
        assert big == data[1 << 10 : (1 << 10) + (300 << 10)] and big.obj is not second.obj
        with nowait.nowait():  # cached now
            assert nowait.pread_view(fd, 4096, 512 << 10) == data[512 << 10 : (512 << 10) + 4096]
            with pytest.raises(WouldBlockError):
                nowait.pread_view(fd, 4096, len(data) - 100)
        assert nowait.pread_view(fd, 4096, len(data) - 100) == data[-100:]
        seen: list[bool] = []
        t = threading.Thread(
            target=lambda: seen.append(nowait.pread_view(fd, 8, 0).obj is second.obj)
        )
        t.start()
        t.join()
        assert seen == [False]  # a buffer per thread
    finally:
        os.close(fd)
