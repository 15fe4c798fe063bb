"""Ingest ("clean"): stream -> chunks -> dedup -> new xorbs -> file reconstruction in a shard.

Memory stays bounded whatever the file size: the stream is read in blocks, and only the
pending xorb (≤ 64 MiB, the protocol's limit) is held until it is written. A file's chunks
are matched, in order, against chunks already produced in this session, against the
store's chunk index and, with a :class:`~gitxet.data.dedup.RemoteDedup`, against chunks a CAS
server stores (terms may then point into the server's xorbs, which this store does not
hold); runs of consecutive chunks in one xorb become one term.

Nothing is visible in the store until :meth:`Ingestor.flush` has written every new xorb
and then the shard that references them (each atomically), so a killed ingest leaves at
worst unreferenced xorbs, never a shard pointing at a missing xorb.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import BinaryIO

from gitxet.chunking import Chunk, chunk_bytes
from gitxet.chunking.params import MIN_CHUNK
from gitxet.chunking.pipeline import ChunkStream
from gitxet.data.dedup import RemoteDedup
from gitxet.formats import shard as shardfmt
from gitxet.formats import xorb as xorbfmt
from gitxet.hashing import chunk_hash, file_hash, merkle_root_of, verification_hash
from gitxet.store.cas import LocalCAS

# A term refers either to a stored xorb (its hash) or to a xorb still being built (its
# session-local number), resolved when that xorb is cut.
XorbRef = bytes | int

Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What ingesting one file produced."""

    file_hash: bytes
    size: int
    sha256: str
    chunks: int
    new_bytes: int  # bytes of chunks that were not stored before
    reused_bytes: int  # bytes deduplicated against the store or this session


@dataclass(frozen=True, slots=True)
class Hashed:
    """What ingesting a small file needs to compute from its bytes alone (see
    :func:`hash_small`): its chunks, their hashes, its file hash and its SHA-256."""

    chunks: list[bytes]
    hashes: list[bytes]
    file_hash: bytes
    sha256: str


def hash_small(data: bytes) -> Hashed:
    """Chunk and hash a small file held in memory (thread-safe: no store, no session)."""
    chunks = chunk_bytes(data)
    hashes = [chunk_hash(c) for c in chunks]
    fh = file_hash(list(zip(hashes, (len(c) for c in chunks), strict=True)))
    return Hashed(chunks, hashes, fh, hashlib.sha256(data).hexdigest())


def unchanged(dedup: RemoteDedup | None, hashed: Hashed, size: int) -> IngestResult | None:
    """What adding a file of ``size`` bytes hashing to ``hashed`` gives when its content is
    a version its path has (:meth:`RemoteDedup.holds`): nothing to store, nothing to ask.
    None for any other content."""
    if dedup is None or not dedup.holds(hashed.file_hash):
        return None
    return IngestResult(hashed.file_hash, size, hashed.sha256, len(hashed.hashes), 0, size)


@dataclass
class _Term:
    xorb: XorbRef
    start: int
    end: int
    nbytes: int


@dataclass
class _PendingXorb:
    """A xorb being built: chunks are compressed (in parallel) as blocks complete, so it
    holds compressed payloads, not raw bytes; ``raw`` are the chunks not compressed yet."""

    number: int
    parts: list[tuple[xorbfmt.Scheme, bytes]] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    nbytes: int = 0

    @property
    def count(self) -> int:
        return len(self.hashes)


@dataclass
class _FileAcc:
    """A file being added: its terms and chunk hashes so far, and its byte counts."""

    terms: list[_Term] = field(default_factory=list)
    chunk_hashes: list[bytes] = field(default_factory=list)
    new_bytes: int = 0
    reused: int = 0


@dataclass
class _PendingFile:
    file_hash: bytes
    sha256: str
    terms: list[_Term]
    chunk_hashes: list[bytes]


class Ingestor:
    """Turns streams into stored xorbs and shards in a :class:`LocalCAS`."""

    def __init__(
        self,
        cas: LocalCAS,
        *,
        executor: Executor | None = None,
        max_xorb_bytes: int = xorbfmt.MAX_XORB_BYTES,
        max_xorb_chunks: int = xorbfmt.MAX_XORB_CHUNKS,
        dedup: RemoteDedup | None = None,
    ) -> None:
        self.cas = cas
        self.dedup = dedup
        # xorbs the server stores and this store does not, that staged files point into
        self._remote_xorbs: set[bytes] = set()
        self._own_executor = executor is None
        self._executor: Executor = executor or ThreadPoolExecutor(
            3, thread_name_prefix="gitxet-ingest"
        )
        self._max_bytes = max_xorb_bytes
        self._max_chunks = max_xorb_chunks
        self._session: dict[bytes, tuple[XorbRef, int]] = {}
        self._resolved: dict[int, bytes] = {}
        self._next_number = 0
        self._pending = self._new_pending()
        # xorb files are written on their own thread while the next xorb is built; at most
        # one write is outstanding, which bounds memory to about two xorbs
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="gitxet-xorb-writer")
        self._writing: Future[bool] | None = None
        # a xorb write that failed (a full disk): the session's chunks and files may name
        # that xorb, so nothing more is stored from it (no shard naming a missing xorb)
        self._failed: BaseException | None = None
        # shard CAS entries of the xorbs written since the last flush (not their bodies)
        self._new_xorbs: list[shardfmt.XorbInfo] = []
        self._files: list[_PendingFile] = []

    def _new_pending(self) -> _PendingXorb:
        self._next_number += 1
        return _PendingXorb(self._next_number)

    def _wait_for_write(self) -> None:
        if self._failed is not None:
            raise self._failed
        if self._writing is not None:
            fut, self._writing = self._writing, None
            try:
                fut.result()  # re-raises a failed write
            except BaseException as exc:
                self._failed = exc
                raise

    def close(self) -> None:
        try:
            if self._failed is None:  # else said already
                self._wait_for_write()
        finally:
            self._writer.shutdown(wait=True)
        if self._own_executor:
            self._executor.shutdown(wait=True)

    def __enter__(self) -> Ingestor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- chunk placement -----------------------------------------------------------------

    def _compress_pending(self) -> None:
        """Compress the pending xorb's raw chunks, half of them on another thread."""
        p = self._pending
        raw, p.raw = p.raw, []
        if not raw:
            return
        if len(raw) < 4:
            p.parts.extend(_compress_all(raw))
            return
        mid = len(raw) // 2
        other = self._executor.submit(_compress_all, raw[mid:])
        p.parts.extend(_compress_all(raw[:mid]))
        p.parts.extend(other.result())

    def _cut(self) -> None:
        p = self._pending
        if not p.count:
            return
        # the xorb's hash needs only the chunk hashes and sizes: the chunks not compressed
        # yet are compressed, framed and written on the writer thread
        xorb_hash = merkle_root_of(p.hashes, p.sizes)
        self._wait_for_write()
        self._writing = self._writer.submit(self._write_xorb, p, xorb_hash)
        self._new_xorbs.append(
            shardfmt.XorbInfo(xorb_hash, _chunk_entries(p.hashes, p.sizes), sum(p.sizes), 0)
        )
        self._resolved[p.number] = xorb_hash
        self._pending = self._new_pending()

    def _write_xorb(self, p: _PendingXorb, xorb_hash: bytes) -> bool:
        parts = [*p.parts, *_compress_all(p.raw)]
        sx = xorbfmt.frame_xorb(parts, p.sizes, p.hashes)
        if sx.hash != xorb_hash:  # cannot happen: both are the Merkle root of the same list
            raise AssertionError("xorb hash changed while framing")
        return self.cas.put_serialized(sx)

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more of new data surely fit in the xorb being built (so a file
        of that size would not be split across two xorbs)."""
        p = self._pending
        chunks = p.count + nbytes // MIN_CHUNK + 1
        bound = xorbfmt.serialized_size_bound(p.nbytes + nbytes, chunks)
        return bound <= self._max_bytes and chunks <= self._max_chunks

    def _place_new(self, data: bytes, h: bytes) -> tuple[XorbRef, int]:
        p = self._pending
        n = p.count + 1
        # the bound counts chunk headers too: an incompressible xorb must still fit
        bound = xorbfmt.serialized_size_bound(p.nbytes + len(data), n)
        if p.count and (bound > self._max_bytes or n > self._max_chunks):
            self._cut()
            p = self._pending
        p.raw.append(data)
        p.hashes.append(h)
        p.sizes.append(len(data))
        p.nbytes += len(data)
        return p.number, p.count - 1

    # ---- files ---------------------------------------------------------------------------

    def add_stream(self, stream: BinaryIO, progress: Progress | None = None) -> IngestResult:
        """Chunk, dedup and stage one file; call :meth:`flush` to make it durable."""
        cs = ChunkStream(stream, executor=self._executor, sha256=True)
        acc = _FileAcc()
        for block in cs:
            self._add_block(acc, block.chunks, block.hashes)
            if progress is not None:
                progress(sum(len(c) for c in block.chunks))
        return self._finish_file(acc, cs.file_hash, cs.size, cs.sha256)

    def add_bytes(self, data: bytes, hashed: Hashed | None = None) -> IngestResult:
        """:meth:`add_stream` for a small file already in memory: chunked and hashed on this
        thread, without the pipeline's thread hand-offs (which cost more than the work).
        ``hashed``: :func:`hash_small` of exactly these bytes, computed earlier."""
        h = hashed or hash_small(data)
        same = unchanged(self.dedup, h, len(data))
        if same is not None:
            return same
        acc = _FileAcc()
        self._add_block(acc, h.chunks, h.hashes, compress=False)
        return self._finish_file(acc, h.file_hash, len(data), h.sha256)

    def _add_block(
        self,
        acc: _FileAcc,
        chunks: Sequence[Chunk],
        hashes: list[bytes],
        *,
        compress: bool = True,
    ) -> None:
        """Place a block's chunks; ``compress``: compress the new ones now (a big file, so
        the work spreads over the executor while the next block is chunked), else when the
        xorb is cut, on the writer thread (small files: off the path of each request)."""
        unknown = [h for h in hashes if h not in self._session]
        known = self.cas.lookup_chunks(unknown) if unknown else {}
        if self.dedup is not None:
            rest = [h for h in unknown if h not in known]
            if rest:
                first = not acc.chunk_hashes and bool(hashes) and rest[0] == hashes[0]
                found = self.dedup.lookup(rest, first_in_file=first)
                for x in {x for x, _ in found.values()} - self._remote_xorbs:
                    if not self.cas.has_xorb(x):
                        self._remote_xorbs.add(x)
                known.update(found)
        terms = acc.terms
        for data, h in zip(chunks, hashes, strict=True):
            n = len(data)
            loc: tuple[XorbRef, int] | None = self._session.get(h) or known.get(h)
            if loc is None:
                loc = self._place_new(bytes(data), h)
                acc.new_bytes += n
            else:
                acc.reused += n
            self._session[h] = loc
            acc.chunk_hashes.append(h)
            ref, idx = loc
            last = terms[-1] if terms else None
            if last is not None and last.xorb == ref and last.end == idx:
                last.end += 1
                last.nbytes += n
            else:
                terms.append(_Term(ref, idx, idx + 1, n))
        if compress:
            self._compress_pending()

    def _finish_file(self, acc: _FileAcc, fh: bytes, size: int, sha256: str) -> IngestResult:
        result = IngestResult(fh, size, sha256, len(acc.chunk_hashes), acc.new_bytes, acc.reused)
        self._files.append(_PendingFile(fh, sha256, acc.terms, acc.chunk_hashes))
        return result

    def add_path(self, path: str, progress: Progress | None = None) -> IngestResult:
        with open(path, "rb") as f:
            return self.add_stream(f, progress)

    def _resolve(self, ref: XorbRef) -> bytes:
        return ref if isinstance(ref, bytes) else self._resolved[ref]

    def flush(self) -> str | None:
        """Write the pending xorb and a shard for every file staged since the last flush.

        Returns the shard's name, or None when nothing was staged.
        """
        self._cut()
        self._wait_for_write()  # every xorb is on disk before the shard that names it
        # a file some stored shard already describes needs no new description
        self._files = [f for f in self._files if self.cas.file_info(f.file_hash) is None]
        if not self._files and not self._new_xorbs:
            return None
        infos: list[shardfmt.FileInfo] = []
        for f in self._files:
            terms: list[shardfmt.FileTerm] = []
            verification: list[bytes] = []
            pos = 0
            for t in f.terms:
                terms.append(shardfmt.FileTerm(self._resolve(t.xorb), t.start, t.end, t.nbytes))
                count = t.end - t.start
                verification.append(verification_hash(f.chunk_hashes[pos : pos + count]))
                pos += count
            sha = shardfmt.sha256_to_stored(f.sha256) if f.terms else bytes(32)
            infos.append(shardfmt.FileInfo(f.file_hash, terms, verification, sha))
        data = shardfmt.upload_shard_for(infos, self._new_xorbs)
        name = self.cas.put_shards([data], remote_xorbs=self._remote_xorbs)[0]
        # Chunks of this session now live in stored, indexed xorbs: later files find them
        # through the store's chunk index, so the session forgets them (bounded memory).
        self._session.clear()
        self._resolved.clear()
        self._files.clear()
        self._new_xorbs.clear()
        self._remote_xorbs.clear()
        return name


def _compress_all(chunks: list[bytes]) -> list[tuple[xorbfmt.Scheme, bytes]]:
    return xorbfmt.compress_chunks(chunks)


def _chunk_entries(hashes: list[bytes], sizes: list[int]) -> list[shardfmt.XorbChunk]:
    out: list[shardfmt.XorbChunk] = []
    pos = 0
    for h, s in zip(hashes, sizes, strict=True):
        out.append(shardfmt.XorbChunk(h, pos, s))
        pos += s
    return out


def ingest_paths(cas: LocalCAS, paths: list[str]) -> list[IngestResult]:
    """Ingest files into ``cas`` and flush once (a convenience for tools and tests)."""
    with Ingestor(cas) as ing:
        results = [ing.add_path(os.fspath(p)) for p in paths]
        ing.flush()
    return results
