"""gitxet.util.streams.write_all_at: a whole positional write."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from gitxet.util import streams
from gitxet.util.streams import write_all_at


def test_write_all_at_writes_every_view_at_its_place_without_moving_the_position(
    tmp_path: Path,
) -> None:
    views = [memoryview(bytes([i % 251]) * (i % 7 + 1)) for i in range(1500)]  # > IOV_MAX
    want = b"".join(views)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"head")
        write_all_at(fd, [*views[:3], memoryview(b""), *views[3:]], 10)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 4  # the position did not move
        assert os.pread(fd, len(want) + 20, 0) == b"head" + bytes(6) + want
    finally:
        os.close(fd)


def test_write_all_at_resumes_short_writes_in_calls_of_at_most_a_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Views reach their offsets when pwritev writes less than asked (often mid-view), with
    more views than one call may carry and views larger than a batch; no call asks for
    more than WRITE_BATCH bytes or IOV_MAX buffers (large writes took large page-cache
    folios, slow to fill on the development VM)."""
    real = os.pwritev
    calls: list[tuple[int, int]] = []

    def short(fd: int, buffers: list[memoryview], offset: int) -> int:
        total = sum(b.nbytes for b in buffers)
        calls.append((len(buffers), total))
        cut = max(1, total // 3)
        return real(fd, [memoryview(b"".join(buffers)[:cut])], offset)

    monkeypatch.setattr(streams.os, "pwritev", short)
    rng = random.Random(7)
    views = [memoryview(rng.randbytes(rng.randrange(1, 300))) for _ in range(2500)]
    views += [memoryview(b""), memoryview(rng.randbytes(streams.WRITE_BATCH * 2 + 7))]
    want = b"".join(views)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        write_all_at(fd, views, 5)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
        assert os.pread(fd, len(want) + 10, 0) == bytes(5) + want
    finally:
        os.close(fd)
    assert max(n for n, _ in calls) == streams._IOV_MAX and len(calls) > 3
    assert max(size for _, size in calls) == streams.WRITE_BATCH
