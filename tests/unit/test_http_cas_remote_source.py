"""HttpCASRemote.chunk_source: one source per remote, however many threads ask at once (a
checkout's first smudges do, each on its own thread)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gitxet.data import remote_source
from gitxet.data.remote_source import HttpCASRemote
from gitxet.remote.client import CASClient
from gitxet.store.nodecache import NodeCache


def test_threads_asking_at_once_share_one_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads asking while the first source is being made get that one source: a
    batch of descriptions one thread asked for is what the other's reads find (with a
    source each, a plain `git pull` read its first files with a GET each)."""
    made: list[object] = []
    both = threading.Barrier(2, timeout=2.0)

    class Source:
        def __init__(self, *args: Any, **kw: Any) -> None:
            made.append(self)
            try:
                both.wait()  # a second thread making one too would come in here
            except threading.BrokenBarrierError:
                pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(remote_source, "RemoteChunkSource", Source)
    cache = NodeCache(str(tmp_path / "cache"), 1 << 20)
    with CASClient("http://127.0.0.1:9", None) as client:
        remote = HttpCASRemote(client, cache, str(tmp_path / "shards"))
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda _: remote.chunk_source(), range(2)))
    cache.close()
    assert len(made) == 1
    assert got[0] is got[1] is made[0]
