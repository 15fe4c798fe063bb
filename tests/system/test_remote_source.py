"""RemoteChunkSource against a real CAS server: both fetch paths count the same bytes."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitxet.data.remote_source import DiskChunkCache, RemoteChunkSource
from gitxet.remote.client import CASClient
from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig
from tests.helpers.server_env import Upload, build_upload


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Upload]]:
    """A real server on loopback holding one uploaded file: (url, read token, upload)."""
    root = tmp_path_factory.mktemp("srv")
    write, _ = TokenStore(str(root)).create("write")
    read, _ = TokenStore(str(root)).create("read")
    # compressible data: the bytes on the wire differ from the decoded bytes
    up = build_upload(
        b"".join(random.Random(5).choice([b"abcd", b"wxyz"]) * 64 for _ in range(20_000))
    )
    with BackgroundServer(ServerConfig(root=str(root), port=0)) as srv:
        with CASClient(srv.url, write) as c:
            c.upload_xorb(up.xorb.hash, up.xorb.body)
            c.upload_shard(up.shard)
        yield srv.url, read, up


@pytest.mark.parametrize("path", ["xorb locations", "reconstruction entries"])
def test_fetched_bytes_are_the_decoded_bytes_on_either_path(
    served: tuple[str, str, Upload], tmp_path: Path, path: str
) -> None:
    url, token, up = served
    assert len(up.xorb.body) < len(up.data)  # compressed on the wire
    with CASClient(url, token) as client:
        src = RemoteChunkSource(client, DiskChunkCache(str(tmp_path / "cache")))
        src._no_locations = path == "reconstruction entries"
        assert src.warm([up.file_hash]) == len(up.data)
        assert src.cache.fetched_bytes == len(up.data)
        assert src.warm([up.file_hash]) == 0  # all cached now


def test_counters_are_exact_under_concurrency(tmp_path: Path) -> None:
    cache = DiskChunkCache(str(tmp_path / "cache"))
    chunk = [b"x" * 1000]
    start = threading.Barrier(8)

    def count() -> None:
        start.wait()
        for _ in range(2000):
            cache.note_fetched(chunk)

    threads = [threading.Thread(target=count) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert cache.fetched_bytes == 8 * 2000 * 1000
