"""gitxet.util.streams.write_all_at: a whole positional write."""

from __future__ import annotations

import os
from pathlib import Path

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
