"""Reconstruct ("smudge"): a file hash -> its bytes, whole or by random-access ranges.

A file is a list of terms (xorb, chunk range). :class:`FileReader` maps a byte range onto
the terms and chunks it touches and asks its :class:`ChunkSource` for just those chunks, so
a 4 KiB read of a 100 GiB file decodes one chunk. Decoded chunks are kept in a small LRU
shared by all readers of a :class:`ChunkCache`, which makes sequential reads cheap.

A source may also offer ``read_verified_part`` and ``read_verified_range`` (see
:class:`PartSource`): a read of chunks it has already verified, and stored uncompressed, is
then one ``pread`` of just those bytes (chunk headers cut out), which keeps random 4 KiB
reads and re-reads of a file cheap: no decoding, no re-hashing, no chunk cache.

Integrity: a source returns only chunks verified against their hashes, and a reader checks,
before serving anything, that the chunk hashes its terms name Merkle-hash to the file hash,
so wrong bytes are never returned: corruption raises :class:`IntegrityError`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from gitxet.errors import FileNotFoundInCASError, IntegrityError
from gitxet.formats.shard import FileInfo, FileTerm
from gitxet.hashing import ZERO_HASH, file_hash, to_hex, verification_hash
from gitxet.util.lru import LRUCache


class Layout(Protocol):
    """Chunk positions of a xorb (see ``gitxet.store.cas.XorbLayout``)."""

    @property
    def chunk_hashes(self) -> tuple[bytes, ...]: ...

    @property
    def data_offsets(self) -> tuple[int, ...]: ...


class ChunkSource(Protocol):
    """Where verified chunks come from: the local store, or a cache over a remote."""

    def file_info(self, file_hash: bytes) -> FileInfo | None: ...

    def layout(self, xorb_hash: bytes) -> Layout: ...

    def read_chunks(self, xorb_hash: bytes, start: int, end: int) -> list[bytes]: ...


class PartSource(Protocol):
    """A source that can serve part of a chunk it has verified before without decoding it."""

    def read_verified_part(
        self, xorb_hash: bytes, index: int, lo: int, hi: int
    ) -> bytes | None: ...

    def read_verified_range(self, xorb_hash: bytes, lo: int, hi: int) -> bytes | None: ...


class ChunkCache:
    """A byte-bounded LRU of decoded chunks keyed by (xorb, index); thread-safe."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self._lru: LRUCache[tuple[bytes, int], bytes] = LRUCache(max(max_bytes, 1), weigher=len)
        self.hits = 0  # approximate under concurrency: statistics only
        self.misses = 0

    def get(self, key: tuple[bytes, int]) -> bytes | None:
        v = self._lru.get(key)
        if v is None:
            self.misses += 1
        else:
            self.hits += 1
        return v

    def put(self, key: tuple[bytes, int], value: bytes) -> None:
        if len(value) <= self.max_bytes:
            self._lru.put(key, value)


@dataclass(frozen=True, slots=True)
class _Span:
    term: FileTerm
    offset: int  # file offset where the term starts


class FileReader:
    """Random-access reads of one file from a :class:`ChunkSource`."""

    def __init__(
        self,
        source: ChunkSource,
        file_hash_: bytes,
        *,
        cache: ChunkCache | None = None,
        verify: bool = True,
    ) -> None:
        self.source = source
        self.file_hash = file_hash_
        self.cache = cache if cache is not None else ChunkCache(16 << 20)
        info = None if file_hash_ == ZERO_HASH else source.file_info(file_hash_)
        if info is None and file_hash_ != ZERO_HASH:
            raise FileNotFoundInCASError(to_hex(file_hash_))
        self.info = info
        partial = all(hasattr(source, m) for m in ("read_verified_part", "read_verified_range"))
        self._part: PartSource | None = source if partial else None  # type: ignore[assignment]
        terms = info.terms if info is not None else []
        self._spans: list[_Span] = []
        self._starts: list[int] = []
        pos = 0
        for t in terms:
            self._spans.append(_Span(t, pos))
            self._starts.append(pos)
            pos += t.unpacked_bytes
        self.size = pos
        if verify and info is not None:
            self._verify_structure(info)

    def _verify_structure(self, info: FileInfo) -> None:
        """Check the terms against xorb layouts and the file hash, before reading data."""
        entries: list[tuple[bytes, int]] = []
        for i, t in enumerate(info.terms):
            lay = self.source.layout(t.xorb_hash)
            hx = to_hex(t.xorb_hash)
            if not 0 <= t.chunk_start < t.chunk_end <= len(lay.chunk_hashes):
                raise IntegrityError("xorb", hx, f"has no chunks {t.chunk_start}..{t.chunk_end}")
            offs = lay.data_offsets
            if offs[t.chunk_end] - offs[t.chunk_start] != t.unpacked_bytes:
                raise IntegrityError("xorb", hx, "term length disagrees with the xorb")
            hashes = lay.chunk_hashes[t.chunk_start : t.chunk_end]
            if info.verification is not None and verification_hash(hashes) != info.verification[i]:
                raise IntegrityError("xorb", hx, f"term {i} fails its verification hash")
            entries.extend(
                (h, offs[k + 1] - offs[k])
                for k, h in zip(range(t.chunk_start, t.chunk_end), hashes, strict=True)
            )
        if file_hash(entries) != self.file_hash:
            raise IntegrityError(
                "file", to_hex(self.file_hash), "chunks do not hash to the file hash"
            )

    def _chunks(self, xorb: bytes, start: int, end: int) -> list[bytes]:
        """Chunks [start, end) of a xorb, from the cache where possible."""
        out: list[bytes | None] = [self.cache.get((xorb, i)) for i in range(start, end)]
        i = 0
        while i < len(out):
            if out[i] is not None:
                i += 1
                continue
            j = i
            while j < len(out) and out[j] is None:
                j += 1
            fetched = self.source.read_chunks(xorb, start + i, start + j)
            for k, c in enumerate(fetched):
                out[i + k] = c
                self.cache.put((xorb, start + i + k), c)
            i = j
        return [c for c in out if c is not None]

    def read(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (short only at end of file)."""
        if offset < 0 or size < 0:
            raise ValueError("negative offset or size")
        end = min(self.size, offset + size)
        if offset >= end:
            return b""
        k = bisect.bisect_right(self._starts, offset) - 1
        span = self._spans[k]
        t = span.term
        if end - span.offset <= t.unpacked_bytes:
            # Inside one term: a read inside one chunk (most small random reads) is served
            # from the decoded cache or as a verified part, without joining anything.
            offs = self.source.layout(t.xorb_hash).data_offsets
            lo = offs[t.chunk_start] + (offset - span.offset)
            c = bisect.bisect_right(offs, lo, t.chunk_start, t.chunk_end) - 1
            c_lo = offs[c]
            if lo + (end - offset) <= offs[c + 1]:
                a = lo - c_lo
                b = a + (end - offset)
                chunk = self.cache.get((t.xorb_hash, c))
                if chunk is not None:
                    return chunk[a:b]
                if self._part is not None:
                    data = self._part.read_verified_part(t.xorb_hash, c, a, b)
                    if data is not None:
                        return data
        parts: list[bytes] = []
        pos = offset
        while pos < end:
            span = self._spans[k]
            t = span.term
            lay = self.source.layout(t.xorb_hash)
            offs = lay.data_offsets
            base = offs[t.chunk_start]
            # positions inside the xorb's decoded data
            lo = base + (pos - span.offset)
            hi = base + min(end - span.offset, t.unpacked_bytes)
            verified = (
                self._part.read_verified_range(t.xorb_hash, lo, hi)
                if self._part is not None
                else None
            )
            if verified is not None:
                parts.append(verified)
            else:
                c0 = bisect.bisect_right(offs, lo, t.chunk_start, t.chunk_end) - 1
                c1 = bisect.bisect_left(offs, hi, t.chunk_start, t.chunk_end + 1)
                data = b"".join(self._chunks(t.xorb_hash, c0, c1))
                skip = lo - offs[c0]
                parts.append(data[skip : skip + (hi - lo)])
            pos += hi - lo
            k += 1
        return b"".join(parts)

    def chunk_extent(self, offset: int) -> tuple[int, int]:
        """The file byte range ``[start, end)`` of the chunk holding ``offset``.

        Raises:
            ValueError: ``offset`` is outside the file.
        """
        if not 0 <= offset < self.size:
            raise ValueError(f"offset {offset} outside a file of {self.size} bytes")
        k = bisect.bisect_right(self._starts, offset) - 1
        span = self._spans[k]
        t = span.term
        offs = self.source.layout(t.xorb_hash).data_offsets
        base = offs[t.chunk_start]
        c = bisect.bisect_right(offs, base + offset - span.offset, t.chunk_start, t.chunk_end) - 1
        return span.offset + offs[c] - base, span.offset + offs[c + 1] - base

    def iter_blocks(self, block_size: int = 8 << 20) -> Iterator[bytes]:
        """The whole file in blocks of about ``block_size`` bytes, in order."""
        for span in self._spans:
            t = span.term
            lay = self.source.layout(t.xorb_hash)
            offs = lay.data_offsets
            i = t.chunk_start
            while i < t.chunk_end:
                j = i + 1
                while j < t.chunk_end and offs[j + 1] - offs[i] <= block_size:
                    j += 1
                yield b"".join(self.source.read_chunks(t.xorb_hash, i, j))
                i = j

    def copy_to(self, out: BinaryIO) -> int:
        """Write the whole file to ``out``; returns the byte count."""
        n = 0
        for block in self.iter_blocks():
            out.write(block)
            n += len(block)
        return n
