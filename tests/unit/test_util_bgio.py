"""The C I/O thread: preads done without the interpreter lock, handed back without a copy."""

from __future__ import annotations

import errno
import os
import random
import select
from pathlib import Path

import pytest

from gitxet.util import bgio
from tests.helpers.ci import require_native


@pytest.fixture
def worker() -> bgio.Worker:
    require_native(bgio.NATIVE, "the C I/O thread (_bgio)")
    assert bgio.Worker is not None
    return bgio.Worker(limit=4)


def reap_all(w: bgio.Worker, count: int) -> dict[int, tuple[int, bytes | None]]:
    out: dict[int, tuple[int, bytes | None]] = {}
    poll = select.poll()
    poll.register(w.fileno(), select.POLLIN)
    while len(out) < count:
        assert poll.poll(30_000), "no read finished in 30 s"
        for token, n, block in w.reap():
            out[token] = (n, bytes(memoryview(block)) if block is not None else None)
    return out


def test_the_c_thread_is_built_in_ci() -> None:
    if os.environ.get("CI") or os.environ.get("GITXET_REQUIRE_NATIVE") == "1":
        assert bgio.NATIVE, "CI must build the C I/O thread"


def test_reads_ranges_short_at_the_end_and_errors(worker: bgio.Worker, tmp_path: Path) -> None:
    data = random.Random(3).randbytes(3 << 20)
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    r, w = os.pipe()
    try:
        assert worker.read(1, fd, 0, 1 << 20)
        assert worker.read(2, fd, 5, 100)
        assert worker.read(3, fd, len(data) - 10, 4096)  # past the end: short
        assert worker.read(4, r, 0, 10)  # a pipe cannot pread
        assert not worker.read(5, fd, 0, 1)  # limit 4: a read counts until reaped
        os.close(fd)  # (the thread reads through its own dup)
        fd = -1
        got = reap_all(worker, 4)
        assert got[1] == (1 << 20, data[: 1 << 20])
        assert got[2] == (100, data[5:105])
        assert got[3] == (10, data[-10:])
        assert got[4] == (-errno.ESPIPE, None)
        assert worker.read(5, r, 0, 1)  # reaped: room again
        with pytest.raises(OSError):
            worker.read(6, 987_654, 0, 1)  # not a descriptor
        with pytest.raises(ValueError):
            worker.read(7, r, 0, 0)
        assert worker.stop(5.0)
        assert worker.reap() == []
        with pytest.raises(ValueError):
            worker.read(8, r, 0, 1)  # stopped
    finally:
        for x in (fd, r, w):
            if x >= 0:
                os.close(x)


def test_a_forked_child_neither_reads_nor_hangs_on_the_parents_worker(
    worker: bgio.Worker, tmp_path: Path
) -> None:
    (tmp_path / "f").write_bytes(b"x" * 100)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        pid = os.fork()
        if pid == 0:  # the child: no thread; a read is refused, stop returns at once
            code = 0
            try:
                try:
                    worker.read(1, fd, 0, 10)
                    code = 3
                except ValueError:
                    pass
                if worker.reap() != [] or worker.stop(30.0):
                    code = 4
            except BaseException:
                code = 5
            os._exit(code)
        deadline = 60
        for _ in range(deadline * 10):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            select.select([], [], [], 0.1)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on the parent's worker")
        assert os.waitstatus_to_exitcode(status) == 0
        assert worker.read(2, fd, 0, 10)  # the parent's worker still works
        assert reap_all(worker, 1)[2] == (10, b"x" * 10)
    finally:
        os.close(fd)
