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


def test_cold_pages_raise_inside_and_are_read_outside(tmp_path: Path) -> None:
    path = tmp_path / "f"
    data = os.urandom(1 << 20)
    path.write_bytes(data)
    _evict(path)
    fd = os.open(path, os.O_RDONLY)
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
