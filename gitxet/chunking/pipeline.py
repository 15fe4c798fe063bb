"""Chunk and hash a stream on all cores with bounded memory.

Per block: the candidate scan (split in halves) and the chunk hashing (split in halves) run
on a small thread pool, the next reads on their own thread (:data:`READ_AHEAD` blocks
ahead). The C scan and BLAKE3 both release the GIL, so on two cores this runs at roughly
twice the single-core rate. Memory is a few blocks.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

from gitxet.chunking import DEFAULT_BLOCK, Chunk, Chunker, FindCandidates
from gitxet.hashing import chunk_hash, file_hash

#: Blocks read ahead of the one being chunked (memory: this many blocks more).
READ_AHEAD = 2


def _hash_all(chunks: Sequence[Chunk]) -> list[bytes]:
    return [chunk_hash(c) for c in chunks]


def hash_chunks(chunks: Sequence[Chunk], executor: Executor | None) -> list[bytes]:
    """Chunk hashes in order, half of them on another thread when an executor is given."""
    if executor is None or len(chunks) < 4:
        return _hash_all(chunks)
    mid = len(chunks) // 2
    other = executor.submit(_hash_all, chunks[mid:])
    return _hash_all(chunks[:mid]) + other.result()


@dataclass(frozen=True, slots=True)
class HashedBlock:
    """Chunks completed by one block, with their hashes (same order)."""

    chunks: list[Chunk]
    hashes: list[bytes]


class _Sha256Worker:
    """Feeds a SHA-256 in order on its own thread (hashlib releases the GIL)."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gitxet-sha256")
        self._last: Future[None] | None = None

    def update(self, data: bytes) -> None:
        self._last = self._pool.submit(self._sha.update, data)

    def hexdigest(self) -> str:
        if self._last is not None:
            self._last.result()
        self._pool.shutdown()
        return self._sha.hexdigest()


class ChunkStream:
    """Iterate a stream's chunks and hashes block by block; then read the totals.

    Example::

        cs = ChunkStream(f, sha256=True)
        for block in cs:
            ...  # block.chunks, block.hashes
        cs.file_hash, cs.size, cs.sha256
    """

    def __init__(
        self,
        stream: BinaryIO,
        *,
        executor: Executor | None = None,
        block_size: int = DEFAULT_BLOCK,
        sha256: bool = False,
        find: FindCandidates | None = None,
    ) -> None:
        self._stream = stream
        self._own_executor = executor is None
        self._executor: Executor = executor or ThreadPoolExecutor(
            3, thread_name_prefix="gitxet-chunk"
        )
        self._block_size = block_size
        self._chunker = Chunker(find, self._executor, ways=2)
        self._sha = _Sha256Worker() if sha256 else None
        self.entries: list[tuple[bytes, int]] = []  # (chunk hash, size) for the file hash
        self.size = 0
        self._sha_hex: str | None = None
        self._file_hash: bytes | None = None
        self._done = False

    def __iter__(self) -> Iterator[HashedBlock]:
        # reads run on their own thread, READ_AHEAD blocks ahead: on the shared executor,
        # one block ahead, a read from git's filter pipe (git writes only as fast as it is
        # read) kept stalling the chunking of the block before it
        reader = ThreadPoolExecutor(1, thread_name_prefix="gitxet-read")
        try:
            ahead = collections.deque(
                reader.submit(self._stream.read, self._block_size) for _ in range(READ_AHEAD)
            )
            while True:
                block = ahead.popleft().result()
                if not block:
                    break
                ahead.append(reader.submit(self._stream.read, self._block_size))
                if self._sha is not None:
                    self._sha.update(block)
                self.size += len(block)
                chunks = self._chunker.feed(block)
                if chunks:
                    yield self._hashed(chunks)
            tail = self._chunker.finish()
            if tail:
                yield self._hashed(tail)
            if self._sha is not None:
                self._sha_hex = self._sha.hexdigest()
            self._done = True
        finally:
            reader.shutdown(wait=True, cancel_futures=True)
            if self._own_executor:
                self._executor.shutdown(wait=True)

    def _hashed(self, chunks: list[Chunk]) -> HashedBlock:
        hashes = hash_chunks(chunks, self._executor)
        self.entries.extend(zip(hashes, (len(c) for c in chunks), strict=True))
        return HashedBlock(chunks, hashes)

    def _require_done(self) -> None:
        if not self._done:
            raise RuntimeError("ChunkStream totals read before the stream was consumed")

    @property
    def file_hash(self) -> bytes:
        """The Xet file hash (valid once iteration has finished)."""
        self._require_done()
        if self._file_hash is None:
            self._file_hash = file_hash(self.entries)
        return self._file_hash

    @property
    def sha256(self) -> str:
        """Lowercase hex SHA-256 of the whole stream (when requested)."""
        self._require_done()
        if self._sha_hex is None:
            raise RuntimeError("ChunkStream was created without sha256=True")
        return self._sha_hex


@dataclass(frozen=True, slots=True)
class FileDigest:
    """What ``git xet hash`` reports for one file."""

    hash: bytes
    size: int
    chunks: int


def digest_stream(stream: BinaryIO, executor: Executor | None = None) -> FileDigest:
    """Xet file hash, size and chunk count of a stream, without storing anything."""
    cs = ChunkStream(stream, executor=executor)
    for _ in cs:
        pass
    return FileDigest(cs.file_hash, cs.size, len(cs.entries))
