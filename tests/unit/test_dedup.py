"""RemoteDedup: known files' chunks, global-dedup queries for eligible chunks only, keyed
matches of the chunks that follow, and a server that fails being no dedup at all."""

from __future__ import annotations

import random

from gitxet.data.dedup import RemoteDedup
from gitxet.errors import RemoteError
from gitxet.formats import shard as shardfmt
from gitxet.hashing import chunk_hash, last_word

KEY = b"\x05" * 32


def chunks(seed: int, n: int) -> list[bytes]:
    rnd = random.Random(seed)
    return [rnd.randbytes(100) for _ in range(n)]


def xorb_info(data: list[bytes]) -> shardfmt.XorbInfo:
    hashes = [chunk_hash(c) for c in data]
    return shardfmt.XorbInfo.from_chunks(b"\x01" * 32, hashes, [len(c) for c in data])


class Server:
    def __init__(self, data: list[bytes], fail: bool = False) -> None:
        self.info = xorb_info(data)
        self.hashes = [chunk_hash(c) for c in data]
        self.fail = fail
        self.queries: list[bytes] = []

    def file_shard(self, file_hash: bytes) -> shardfmt.Shard | None:
        if self.fail:
            raise RemoteError("down")
        return shardfmt.Shard([], [self.info]) if file_hash == b"\x02" * 32 else None

    def query_chunk(self, h: bytes) -> shardfmt.Shard | None:
        self.queries.append(h)
        if self.fail:
            raise RemoteError("429")
        if h not in self.hashes:
            return None
        raw = shardfmt.dedup_response_shard([self.info], KEY, 1, 2**40)
        return shardfmt.parse_shard(raw)


def test_known_file_chunks_match_without_queries() -> None:
    data = chunks(1, 50)
    server = Server(data)
    d = RemoteDedup(server)
    d.add_file(b"\x02" * 32)
    hashes = [chunk_hash(c) for c in data] + [chunk_hash(b"new")]
    found = d.lookup(hashes, first_in_file=True)
    assert found == {h: (b"\x01" * 32, i) for i, h in enumerate(hashes[:50])}
    assert server.queries == []  # all known but the new one, which is not eligible
    d.lookup([chunk_hash(b"new")], first_in_file=True)
    assert server.queries == [chunk_hash(b"new")]  # a file's first chunk is


def test_global_dedup_answer_matches_the_chunks_that_follow() -> None:
    data = chunks(2, 40)
    server = Server(data)
    d = RemoteDedup(server, now=lambda: 100.0)
    hashes = [chunk_hash(c) for c in data]
    found = d.lookup(hashes, first_in_file=True)
    assert found == {h: (b"\x01" * 32, i) for i, h in enumerate(hashes)}
    assert server.queries == [hashes[0]]  # one query, then keyed matches
    # not a file's first chunk and not eligible: never asked
    other = [h for h in (chunk_hash(bytes([i])) for i in range(200)) if last_word(h) % 1024]
    assert d.lookup(other[:5]) == {} and len(server.queries) == 1


def test_expired_answers_and_a_failing_server_are_no_dedup() -> None:
    data = chunks(3, 10)
    hashes = [chunk_hash(c) for c in data]
    d = RemoteDedup(Server(data), now=lambda: 2.0**41)  # past the answer's expiry
    assert set(d.lookup(hashes, first_in_file=True)) == {hashes[0]}  # only the asked chunk
    down = RemoteDedup(Server(data, fail=True))
    down.add_file(b"\x02" * 32)
    assert down.lookup(hashes, first_in_file=True) == {}


class CountingServer(Server):
    def __init__(self, data: list[bytes]) -> None:
        super().__init__(data)
        self.shards: list[bytes] = []

    def file_shard(self, file_hash: bytes) -> shardfmt.Shard | None:
        self.shards.append(file_hash)
        return super().file_shard(file_hash)


def test_versions_are_asked_for_at_the_first_lookup_not_before() -> None:
    """A path's versions cost no request until an edit looks up a chunk (a re-clean of the
    same content asks nothing); then each is asked for once, and only the current file's."""
    data = chunks(4, 20)
    server = CountingServer(data)
    d = RemoteDedup(server)
    d.versions([b"\x07" * 32])  # a file before, never looked up: never asked for
    d.versions([b"\x02" * 32, b"\x02" * 32])
    assert server.shards == []
    assert d.holds(b"\x02" * 32) and d.holds(b"\x07" * 32) and not d.holds(b"\x03" * 32)
    hashes = [chunk_hash(c) for c in data]
    assert set(d.lookup(hashes[5:])) == set(hashes[5:])
    assert server.shards == [b"\x02" * 32]
    d.versions([b"\x02" * 32])
    d.lookup(hashes[:5])
    assert server.shards == [b"\x02" * 32]  # once per file
