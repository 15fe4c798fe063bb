"""A process forked while another of its threads is inside SQLite (a DataLoader worker forked
while the parent reads through xet://) can use SQLite in the child: SQLite's process-wide
allocator mutex, held by that thread at the fork, stayed locked in the child for good."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from gitxet.store.cas import LocalCAS
from gitxet.store.nodecache import NodeCache

pytestmark = pytest.mark.timeout(120)

FORKS = 40
CHILD_SECONDS = 10  # a child that has not finished by then hangs (SIGALRM kills it)


def _child(root: Path) -> None:  # pragma: no cover - runs in the forked child
    code = 1
    try:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # kills a child stuck in C
        signal.alarm(CHILD_SECONDS)
        cas = LocalCAS(str(root / "store"))
        cas.file_info(b"\1" * 32)
        cache = NodeCache(str(root / "cache"), 1 << 20)
        cache.close()
        code = 0
    finally:
        os._exit(code)


def test_a_fork_while_threads_query_sqlite_leaves_the_child_a_working_sqlite(
    tmp_path: Path,
) -> None:
    cas = LocalCAS(str(tmp_path / "store"))
    cache = NodeCache(str(tmp_path / "cache"), 1 << 20)
    fake = [i.to_bytes(32, "big") for i in range(500)]
    stop = threading.Event()

    def query_cas() -> None:  # a reader describing a directory of files, over and over
        while not stop.is_set():
            cas.describe(fake)

    def query_cache() -> None:
        while not stop.is_set():
            cache.stats()

    threads = [threading.Thread(target=f, daemon=True) for f in (query_cas, query_cache)]
    for t in threads:
        t.start()
    codes = []
    try:
        for _ in range(FORKS):
            pid = os.fork()
            if pid == 0:  # pragma: no cover
                _child(tmp_path)
            _, status = os.waitpid(pid, 0)  # bounded: the child's alarm ends it
            codes.append(os.waitstatus_to_exitcode(status))
            if codes[-1] != 0:
                break  # one hung child says it
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        cache.close()
    assert codes == [0] * FORKS, f"child {len(codes)} of {FORKS} failed or hung in SQLite: {codes}"
