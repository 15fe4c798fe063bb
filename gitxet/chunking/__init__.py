"""Xet content-defined chunking: streaming, parallel, and independent of read sizes.

The scan for boundary *candidates* (positions whose 64-byte gear window has its top 16
bits clear) is done by the C kernel ``_cdc`` when it is built, else by ``pure``. Because a
candidate depends only on its 64-byte window, a block can be scanned in pieces on several
threads; :class:`Chunker` then applies the min/max chunk-length rules in order, which gives
exactly the normative byte loop's boundaries (``pure.reference_boundaries``, the oracle).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from typing import BinaryIO

from gitxet.chunking import pure
from gitxet.chunking.params import MAX_CHUNK, MIN_CHUNK, WINDOW

FindCandidates = Callable[..., bytes]

_native_find: FindCandidates | None
try:
    from gitxet.chunking._cdc import find_candidates as _native_find

    NATIVE = True
except ImportError:  # pragma: no cover - exercised on machines without a compiler
    _native_find = None
    NATIVE = False

IMPLEMENTATION = "native (C)" if NATIVE else "pure Python"

# Blocks at least this large are split across the executor's threads.
PARALLEL_MIN = 1 << 20
DEFAULT_BLOCK = 8 << 20

Chunk = bytes | memoryview


def default_find() -> FindCandidates:
    """The fastest candidate scanner available."""
    return _native_find if _native_find is not None else pure.find_candidates


class Chunker:
    """Streaming chunker: feed blocks of any size, get whole chunks back.

    Chunks returned by :meth:`feed` are zero-copy ``memoryview`` slices of the fed block
    (except the one that straddles the previous block, which is ``bytes``); consume or copy
    them before the block is reused.
    """

    def __init__(
        self, find: FindCandidates | None = None, executor: Executor | None = None, ways: int = 2
    ) -> None:
        self._find = find or default_find()
        self._executor = executor
        self._ways = max(1, ways)
        self._tail = bytearray()  # bytes of the unfinished chunk
        self._prev = b""  # last WINDOW bytes fed, for warming the hash up

    def _candidates(self, block: memoryview) -> list[int]:
        n = len(block)
        prev = self._prev
        if self._executor is None or n < PARALLEL_MIN or self._ways == 1:
            raw = self._find(block, 0, n, prev)
        else:
            step = n // self._ways
            bounds = [
                (i * step, n if i == self._ways - 1 else (i + 1) * step) for i in range(self._ways)
            ]
            futures = [self._executor.submit(self._find, block, a, b, prev) for a, b in bounds[1:]]
            parts = [self._find(block, bounds[0][0], bounds[0][1], prev)]
            parts.extend(f.result() for f in futures)
            raw = b"".join(parts)
        return memoryview(raw).cast("Q").tolist()

    def feed(self, data: bytes | bytearray | memoryview) -> list[Chunk]:
        """Chunks completed by ``data`` (which is appended to the stream)."""
        block = memoryview(data).cast("B")
        n = len(block)
        if n == 0:
            return []
        out: list[Chunk] = []
        t = len(self._tail)
        start = -t  # chunk start, relative to block[0]; the tail sits at [-t, 0)

        def emit(end: int) -> None:
            nonlocal start
            if start < 0:
                out.append(bytes(self._tail) + block[:end].tobytes())
                self._tail.clear()
            else:
                out.append(block[start:end])
            start = end

        for c in self._candidates(block):
            length = c + 1 - start
            while length > MAX_CHUNK:
                emit(start + MAX_CHUNK)
                length = c + 1 - start
            if length >= MIN_CHUNK:
                emit(c + 1)
        while n - start >= MAX_CHUNK:
            emit(start + MAX_CHUNK)
        if start < 0:
            self._tail += block
        else:
            self._tail += block[start:]
        prev = bytes(self._prev) + block[-WINDOW:].tobytes() if n < WINDOW else block[-WINDOW:]
        self._prev = bytes(prev[-WINDOW:])
        return out

    def finish(self) -> list[Chunk]:
        """The final (possibly short) chunk, if any; the chunker can then be reused."""
        out: list[Chunk] = [bytes(self._tail)] if self._tail else []
        self._tail = bytearray()
        self._prev = b""
        return out


def chunk_bytes(
    data: bytes | bytearray | memoryview, find: FindCandidates | None = None
) -> list[bytes]:
    """All chunks of an in-memory buffer, as ``bytes``."""
    ch = Chunker(find)
    return [bytes(c) for c in ch.feed(data)] + [bytes(c) for c in ch.finish()]


def boundaries(
    data: bytes | bytearray | memoryview, find: FindCandidates | None = None
) -> list[int]:
    """Chunk end offsets (exclusive) of an in-memory buffer."""
    ends: list[int] = []
    pos = 0
    for c in chunk_bytes(data, find):
        pos += len(c)
        ends.append(pos)
    return ends


def iter_chunks(
    stream: BinaryIO,
    block_size: int = DEFAULT_BLOCK,
    executor: Executor | None = None,
    find: FindCandidates | None = None,
) -> Iterator[Chunk]:
    """Chunks of a binary stream, read ``block_size`` bytes at a time (bounded memory)."""
    ch = Chunker(find, executor, ways=os.cpu_count() or 1)
    while True:
        block = stream.read(block_size)
        if not block:
            break
        yield from ch.feed(block)
    yield from ch.finish()
