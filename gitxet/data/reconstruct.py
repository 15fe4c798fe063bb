"""Reconstruct ("smudge"): a file hash -> its bytes, whole or by random-access ranges.

A file is a list of terms (xorb, chunk range). :class:`FileReader` maps a byte range onto
the terms and chunks it touches and asks its :class:`ChunkSource` for just those chunks, so
a 4 KiB read of a 100 GiB file decodes one chunk. Decoded chunks are kept in a small LRU
shared by all readers of a :class:`ChunkCache`, which makes sequential reads cheap.

A source may also offer ``read_verified_part`` and ``read_verified_range`` (see
:class:`PartSource`): a read of chunks it has already verified, and stored uncompressed, is
then one ``pread`` of just those bytes (chunk headers cut out), which keeps random 4 KiB
reads and re-reads of a file cheap: no decoding, no re-hashing, no chunk cache.

A source behind a network also offers the :class:`FetchSource` calls. The reader then
serves reads from the source's cache where it can (one ``pread``), fetches what is missing,
and watches its access pattern: a sequential reader gets the next *window* of the file
fetched ahead, in parallel, the window growing while reads stay sequential; a random reader
gets no read-ahead and fetches just the chunks it touches. :meth:`FileReader.copy_to` (the
path of checkout and clone) keeps a window of ranges in flight and writes each one out as
it arrives. Mounts, ``xet://`` files, smudge, checkout and clone all read this way.

Integrity: a source returns only chunks verified against their hashes, and a reader checks,
before serving anything, that the chunk hashes its terms name Merkle-hash to the file hash,
so wrong bytes are never returned: corruption raises :class:`IntegrityError`.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import operator
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Protocol

from gitxet.errors import FileNotFoundInCASError, GitxetError, IntegrityError
from gitxet.formats.shard import FileInfo, FileTerm
from gitxet.hashing import ZERO_HASH, file_hash_of, to_hex, verification_hash
from gitxet.util.lru import LRUCache

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer


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


class Segment:
    """Verified decoded bytes of a xorb, in memory: buffers with their xorb data offsets."""

    __slots__ = ("_parts", "_starts", "hi", "lo")

    def __init__(self, lo: int, parts: Sequence[memoryview | bytes]) -> None:
        self.lo = lo
        self._parts = list(parts)
        self._starts: list[int] = []
        pos = lo
        for b in self._parts:
            self._starts.append(pos)
            pos += len(b)
        self.hi = pos

    def views(self, lo: int, hi: int) -> list[memoryview]:
        """Views of decoded bytes ``[lo, hi)`` (inside this segment), in order."""
        if not self.lo <= lo <= hi <= self.hi:
            raise IndexError(f"[{lo}, {hi}) outside a segment [{self.lo}, {self.hi})")
        out: list[memoryview] = []
        i = bisect.bisect_right(self._starts, lo) - 1
        pos = lo
        while pos < hi:
            start = self._starts[i]
            part = memoryview(self._parts[i])
            a = pos - start
            b = min(len(part), hi - start)
            out.append(part[a:b])
            pos = start + b
            i += 1
        return out

    def read(self, lo: int, hi: int) -> bytes:
        """Decoded bytes ``[lo, hi)`` as one object."""
        views = self.views(lo, hi)
        return bytes(views[0]) if len(views) == 1 else b"".join(views)


class FetchSource(Protocol):
    """A source behind a network: fetches on demand, ahead of the reader, or for a copy."""

    @property
    def initial_window(self) -> int: ...

    @property
    def max_window(self) -> int: ...

    def fetch_range(self, xorb_hash: bytes, lo: int, hi: int, *, sequential: bool) -> bytes: ...

    def prefetch(self, xorb_hash: bytes, lo: int, hi: int) -> None: ...

    def split_range(self, xorb_hash: bytes, lo: int, hi: int) -> list[tuple[int, int]]: ...

    def stream_range(self, xorb_hash: bytes, lo: int, hi: int) -> Future[Segment]: ...


class PositionalOut(Protocol):
    """An output :meth:`FileReader.copy_to` may write at offsets from any thread: each
    fetched range is then written by the thread that fetched it (the page-cache copies of
    a large file run in parallel instead of one after the other on the caller's thread)."""

    def write_at(self, offset: int, views: Sequence[memoryview]) -> None:
        """Write ``views`` (in order) at ``offset`` bytes from where the copy starts."""
        ...


#: how far a read may land behind or past the end of a sequential stream and continue it
#: (the kernel's read-ahead and parallel FUSE reads arrive a little out of order)
STREAM_BACK = 2 << 20
STREAM_SKIP = 16 << 20
#: interleaved sequential streams tracked per file
MAX_STREAMS = 4
#: bytes :meth:`FileReader.copy_to` keeps in flight
COPY_WINDOW = 64 << 20
#: a copied file smaller than this has its terms checked before its copy starts, not on a
#: thread alongside it: a thread costs ~0.1 ms, a file of 1 MiB is about one fetch, and a
#: clone of 100,000 small files would start 100,000 threads
CHECK_ALONGSIDE_MIN = 1 << 20


class _Stream:
    __slots__ = ("ahead", "next", "start")

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.next = end
        self.ahead = end


class ReadPattern:
    """Sequential-access detection for one file: which reads continue a stream, and how far
    ahead of each stream to fetch (the window doubles the bytes read so far, between
    ``initial`` and ``maximum``; zero for a read that continues nothing)."""

    def __init__(self, initial: int, maximum: int, size: int) -> None:
        self.initial = min(initial, maximum)
        self.maximum = maximum
        self.size = size
        self._streams: list[_Stream] = []
        self._lock = threading.Lock()

    def note(self, offset: int, end: int) -> tuple[bool, tuple[int, int] | None]:
        """Record a read of ``[offset, end)``: (whether it is sequential, the file range to
        fetch ahead now or None)."""
        if self.maximum <= 0:
            return False, None
        with self._lock:
            for s in self._streams:
                if s.next - STREAM_BACK <= offset <= s.next + STREAM_SKIP:
                    break
            else:
                s = _Stream(offset, end)
                self._streams.insert(0, s)
                del self._streams[MAX_STREAMS:]
                if offset != 0:
                    return False, None  # a random read (until the next one continues it)
            s.next = max(s.next, end)
            window = min(self.maximum, max(self.initial, 2 * (s.next - s.start)))
            a, b = max(s.ahead, s.next), min(self.size, s.next + window)
            # ask again only once a good part of the window was consumed
            if b - a < min(window // 4, self.size - a) or a >= b:
                return True, None
            s.ahead = b
            return True, (a, b)


#: The default cap of a :class:`ChunkCache` (decoded chunks in memory), for every reader.
DEFAULT_CHUNK_CACHE_BYTES = 64 << 20


class ChunkCache:
    """A byte-bounded LRU of decoded chunks keyed by (xorb, index); thread-safe."""

    def __init__(self, max_bytes: int = DEFAULT_CHUNK_CACHE_BYTES) -> None:
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


def check_terms(source: ChunkSource, file_hash_: bytes, info: FileInfo) -> None:
    """Check a file's terms against its xorbs' layouts, their verification hashes and its
    file hash (raises :class:`IntegrityError`): what a reader checks before serving a byte."""
    hashes: list[bytes] = []  # of every chunk of the file, and their sizes
    sizes: list[int] = []
    for i, t in enumerate(info.terms):
        lay = source.layout(t.xorb_hash)
        if not 0 <= t.chunk_start < t.chunk_end <= len(lay.chunk_hashes):
            raise IntegrityError(
                "xorb", to_hex(t.xorb_hash), f"has no chunks {t.chunk_start}..{t.chunk_end}"
            )
        offs = lay.data_offsets
        if offs[t.chunk_end] - offs[t.chunk_start] != t.unpacked_bytes:
            raise IntegrityError("xorb", to_hex(t.xorb_hash), "term length disagrees with the xorb")
        term_hashes = lay.chunk_hashes[t.chunk_start : t.chunk_end]
        if info.verification is not None and verification_hash(term_hashes) != info.verification[i]:
            raise IntegrityError(
                "xorb", to_hex(t.xorb_hash), f"term {i} fails its verification hash"
            )
        hashes.extend(term_hashes)
        sizes.extend(
            map(
                operator.sub,
                offs[t.chunk_start + 1 : t.chunk_end + 1],
                offs[t.chunk_start : t.chunk_end],
            )
        )
    if file_hash_of(hashes, sizes) != file_hash_:
        raise IntegrityError("file", to_hex(file_hash_), "chunks do not hash to the file hash")


class FileReader:
    """Random-access reads of one file from a :class:`ChunkSource`."""

    def __init__(
        self,
        source: ChunkSource,
        file_hash_: bytes,
        *,
        cache: ChunkCache | None = None,
        verify: bool = True,
        opening: tuple[int, int] | None = None,
        copy: bool = False,
    ) -> None:
        """``opening``: the read (offset, size) the reader is made for. From a
        :class:`FetchSource`, when it starts a sequential read (offset 0), its bytes and the
        window after them are fetched while the terms are checked: verified chunk by chunk
        into the source's cache, and served only once the whole file checks out.

        ``copy``: the reader is made for one :meth:`copy_to`. From a :class:`FetchSource`
        the terms are then checked by that copy, while its first ranges are fetched (the
        xorb layouts the check needs take a round trip of their own): nothing is written
        before the whole file checks out, and no other read is served before."""
        self.source = source
        self.file_hash = file_hash_
        self.cache = cache if cache is not None else ChunkCache(16 << 20)
        info = None if file_hash_ == ZERO_HASH else source.file_info(file_hash_)
        if info is None and file_hash_ != ZERO_HASH:
            raise FileNotFoundInCASError(to_hex(file_hash_))
        self.info = info
        partial = all(hasattr(source, m) for m in ("read_verified_part", "read_verified_range"))
        self._part: PartSource | None = source if partial else None  # type: ignore[assignment]
        fetching = all(hasattr(source, m) for m in ("fetch_range", "prefetch", "stream_range"))
        # a source that can fetch, and is behind a network somewhere (a window to read ahead)
        fetching = fetching and getattr(source, "max_window", 0) > 0
        self._fetch: FetchSource | None = source if fetching else None  # type: ignore[assignment]
        terms = info.terms if info is not None else []
        self._spans: list[_Span] = []
        self._starts: list[int] = []
        pos = 0
        for t in terms:
            self._spans.append(_Span(t, pos))
            self._starts.append(pos)
            pos += t.unpacked_bytes
        self.size = pos
        self._pattern: ReadPattern | None = None
        if self._fetch is not None:
            self._pattern = ReadPattern(
                self._fetch.initial_window, self._fetch.max_window, self.size
            )
        #: terms :meth:`copy_to` checks (``copy``), None once checked or when never to be
        self._unchecked: FileInfo | None = None
        if verify and info is not None:
            if copy and self._fetch is not None:
                self._unchecked = info
                return
            if opening is not None and opening[0] == 0 and self._spans:
                self._prefetch_opening(opening[1])
            self._verify_structure(info)

    def _checked(self) -> None:
        """Check the terms now if :meth:`copy_to` was to (a reader made for a copy that is
        read otherwise)."""
        info = self._unchecked
        if info is not None:
            self._verify_structure(info)
            self._unchecked = None

    def _check_alongside(self) -> Future[None]:
        """The terms' check (if still to be done) started on a thread of its own (done here
        for a file under :data:`CHECK_ALONGSIDE_MIN`): done
        when they check out, failed with its :class:`IntegrityError` (or the error of a
        layout that cannot be had) otherwise."""
        checked: Future[None] = Future()
        info = self._unchecked
        if info is None or self.size < CHECK_ALONGSIDE_MIN:
            self._checked()  # (raises before anything is fetched or written)
            checked.set_result(None)
            return checked

        def run() -> None:
            try:
                self._verify_structure(info)
            except BaseException as exc:  # handed to the copy
                checked.set_exception(exc)
            else:
                self._unchecked = None
                checked.set_result(None)

        threading.Thread(target=run, name="gitxet-check", daemon=True).start()
        return checked

    def _prefetch_opening(self, size: int) -> None:
        """Start fetching what a sequential read of ``size`` bytes from offset 0 reads and
        reads ahead (the window :class:`ReadPattern` gives it), within the first term's xorb:
        its layout is asked for here, the others' all together by the check that follows."""
        p = self._pattern
        if p is None:
            return
        first = min(self.size, size)
        end = min(self.size, first + min(p.maximum, max(p.initial, 2 * first)))
        x0 = self._spans[0].term.xorb_hash
        k = 0
        while k + 1 < len(self._spans) and self._spans[k + 1].term.xorb_hash == x0:
            k += 1
        self._prefetch(0, min(end, self._starts[k] + self._spans[k].term.unpacked_bytes))

    def _verify_structure(self, info: FileInfo) -> None:
        """Check the terms against xorb layouts and the file hash, before reading data."""
        ahead = getattr(self.source, "layouts_ahead", None)
        if ahead is not None and len(info.terms) > 1:
            ahead([t.xorb_hash for t in info.terms])  # a remote source: asked in parallel
        check_terms(self.source, self.file_hash, info)

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
        self._checked()
        end = min(self.size, offset + size)
        if offset >= end:
            return b""
        sequential = False
        if self._pattern is not None:
            sequential, ahead = self._pattern.note(offset, end)
            if ahead is not None:
                self._prefetch(*ahead)
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
            elif self._fetch is not None:
                parts.append(self._fetch.fetch_range(t.xorb_hash, lo, hi, sequential=sequential))
            else:
                c0 = bisect.bisect_right(offs, lo, t.chunk_start, t.chunk_end) - 1
                c1 = bisect.bisect_left(offs, hi, t.chunk_start, t.chunk_end + 1)
                data = b"".join(self._chunks(t.xorb_hash, c0, c1))
                skip = lo - offs[c0]
                parts.append(data[skip : skip + (hi - lo)])
            pos += hi - lo
            k += 1
        return b"".join(parts)

    def read_cached(self, offset: int, size: int) -> bytes | None:
        """Like :meth:`read`, but only from data the source holds verified (its cache):
        ``None`` when anything would have to be fetched. Never waits on a network, so an
        event loop may call it; a sequential reader's read-ahead is started all the same.
        """
        part = self._part
        if part is None or offset < 0 or size < 0 or self._unchecked is not None:
            return None
        end = min(self.size, offset + size)
        if offset >= end:
            return b""
        if self._pattern is not None:
            _, ahead = self._pattern.note(offset, end)
            if ahead is not None:
                self._prefetch(*ahead)
        out: list[bytes] = []
        for xorb, lo, hi in self._pieces(offset, end):
            got = part.read_verified_range(xorb, lo, hi)
            if got is None:
                return None
            out.append(got)
        return out[0] if len(out) == 1 else b"".join(out)

    def _pieces(self, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
        """``(xorb, lo, hi)``: the xorb data ranges holding file bytes ``[start, end)``."""
        k = bisect.bisect_right(self._starts, start) - 1
        pos = start
        while pos < end and k < len(self._spans):
            span = self._spans[k]
            t = span.term
            base = self.source.layout(t.xorb_hash).data_offsets[t.chunk_start]
            lo = base + (pos - span.offset)
            hi = base + min(end - span.offset, t.unpacked_bytes)
            yield t.xorb_hash, lo, hi
            pos += hi - lo
            k += 1

    def _prefetch(self, start: int, end: int) -> None:
        """Start fetching file bytes ``[start, end)`` in the background (best effort)."""
        fetch = self._fetch
        if fetch is None:
            return
        try:
            for xorb, lo, hi in self._pieces(start, end):
                fetch.prefetch(xorb, lo, hi)
        except GitxetError:
            pass  # a read-ahead that cannot start is a read that fetches later

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
        self._checked()
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

    def copy_to(self, out: BinaryIO, *, sha256: str | None = None) -> int:
        """Write the whole file to ``out``; returns the byte count.

        From a :class:`FetchSource`, up to :data:`COPY_WINDOW` bytes of ranges are fetched
        in parallel ahead of the one being written; a range several terms use is fetched
        once while it is in the window.

        With ``sha256`` (a pointer's ``oid``, hex), the bytes are hashed as they are
        written (in file order, also when written at offsets) and checked at the end.

        Raises:
            IntegrityError: the content's SHA-256 is not ``sha256`` (``out`` then holds
                bytes the caller must throw away).
        """
        if sha256 is None:
            return self._copy(out)
        hashing = _Sha256Out.around(out)
        n = self._copy(hashing)  # type: ignore[arg-type]
        got = hashing.hexdigest()
        if got != sha256:
            raise IntegrityError(
                "file",
                to_hex(self.file_hash),
                f"content has sha256 {got}, its pointer says {sha256}",
            )
        return n

    def _copy(self, out: BinaryIO) -> int:
        if self._fetch is None:
            n = 0
            for block in self.iter_blocks():
                out.write(block)
                n += len(block)
            return n
        return self._copy_fetched(self._fetch, out)

    def _copy_fetched(self, fetch: FetchSource, out: BinaryIO) -> int:
        checked = self._check_alongside()  # no byte is written before it is done
        if callable(getattr(out, "write_at", None)):
            n = self._copy_positional(fetch, out, checked)  # type: ignore[arg-type]
        else:
            n = self._copy_in_order(fetch, out, checked)
        checked.result()
        return n

    def _copy_positional(
        self, fetch: FetchSource, out: PositionalOut, checked: Future[None]
    ) -> int:
        """:meth:`copy_to` into an output written at offsets: each range is written where it
        belongs as soon as it arrives (and the terms were ``checked``), on the thread that
        fetched it; the caller only keeps :data:`COPY_WINDOW` bytes in flight and raises
        the first error."""
        pending: deque[tuple[tuple[bytes, int, int], Future[None]]] = deque()
        shared: dict[tuple[bytes, int, int], tuple[Future[Segment], int]] = {}
        held = 0
        # writes running on fetch threads; once the copy ends (an error) none may start, and
        # it returns only after the running ones ended: ``out`` is the caller's again
        writing = threading.Condition()
        active = 0
        stopped = False

        def write_when_done(fut: Future[Segment], lo: int, hi: int, at: int) -> Future[None]:
            wrote: Future[None] = Future()

            def write(done: Future[Segment]) -> None:
                nonlocal active
                with writing:
                    if stopped:
                        wrote.cancel()
                        return
                    active += 1
                try:
                    checked.result()
                    out.write_at(at, done.result().views(lo, hi))
                except BaseException as exc:  # handed to the caller
                    wrote.set_exception(exc)
                else:
                    wrote.set_result(None)
                finally:
                    with writing:
                        active -= 1
                        writing.notify_all()

            fut.add_done_callback(write)
            return wrote

        def finish_one() -> None:
            nonlocal held
            key, wrote = pending.popleft()
            _, lo, hi = key
            held -= hi - lo
            f, users = shared[key]
            if users == 1:
                del shared[key]
            else:
                shared[key] = (f, users - 1)
            wrote.result()

        pos = 0
        try:
            for xorb, lo, hi in self._pieces(0, self.size):
                for a, b in fetch.split_range(xorb, lo, hi):
                    while pending and held >= COPY_WINDOW:
                        finish_one()
                    key = (xorb, a, b)
                    have = shared.get(key)
                    fut = have[0] if have is not None else fetch.stream_range(xorb, a, b)
                    shared[key] = (fut, 1 if have is None else have[1] + 1)
                    pending.append((key, write_when_done(fut, a, b, pos)))
                    held += b - a
                    pos += b - a
            while pending:
                finish_one()
        finally:
            with writing:
                stopped = True
            for f, _ in shared.values():
                f.cancel()
            with writing:
                writing.wait_for(lambda: active == 0)
        return pos

    def _copy_in_order(self, fetch: FetchSource, out: BinaryIO, checked: Future[None]) -> int:
        pending: deque[tuple[tuple[bytes, int, int], Future[Segment]]] = deque()
        shared: dict[tuple[bytes, int, int], tuple[Future[Segment], int]] = {}
        held = 0
        written = 0

        def write_one() -> None:
            nonlocal held, written
            key, fut = pending.popleft()
            _, lo, hi = key
            checked.result()
            for view in fut.result().views(lo, hi):
                out.write(view)
            held -= hi - lo
            written += hi - lo
            f, users = shared[key]
            if users == 1:
                del shared[key]
            else:
                shared[key] = (f, users - 1)

        try:
            for xorb, lo, hi in self._pieces(0, self.size):
                for a, b in fetch.split_range(xorb, lo, hi):
                    while pending and held >= COPY_WINDOW:
                        write_one()
                    key = (xorb, a, b)
                    have = shared.get(key)
                    fut = have[0] if have is not None else fetch.stream_range(xorb, a, b)
                    shared[key] = (fut, 1 if have is None else have[1] + 1)
                    pending.append((key, fut))
                    held += b - a
            while pending:
                write_one()
        finally:
            for _, fut in pending:
                fut.cancel()
        return written


class _Sha256Out(io.RawIOBase):
    """Writes through to ``out`` and hashes (SHA-256) what is written, in file order."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._sha = hashlib.sha256()

    @staticmethod
    def around(out: BinaryIO) -> _Sha256Out:
        """A hashing writer around ``out``, positional when ``out`` is."""
        if callable(getattr(out, "write_at", None)):
            return _Sha256PositionalOut(out)
        return _Sha256Out(out)

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:  # type: ignore[override]
        view = memoryview(data)
        n = self._out.write(view)
        self._sha.update(view if n is None else view[:n])
        return len(view) if n is None else n

    def hexdigest(self) -> str:
        """The SHA-256 of the bytes written so far (in file order)."""
        return self._sha.hexdigest()


class _Sha256PositionalOut(_Sha256Out):
    """:class:`_Sha256Out` for an output written at offsets from several threads: a range
    that arrives before the bytes in front of it is kept (as views: :data:`COPY_WINDOW`
    bounds them) until the hash reaches it."""

    def __init__(self, out: BinaryIO) -> None:
        super().__init__(out)
        self._positional: PositionalOut = out  # type: ignore[assignment]
        self._lock = threading.Lock()
        self._hashed = 0  # bytes hashed: the file offset the hash has reached
        self._early: dict[int, Sequence[memoryview]] = {}

    def write_at(self, offset: int, views: Sequence[memoryview]) -> None:
        self._positional.write_at(offset, views)
        with self._lock:
            if offset != self._hashed:
                self._early[offset] = views
                return
            while True:
                for v in views:
                    self._sha.update(v)
                    self._hashed += len(v)
                nxt = self._early.pop(self._hashed, None)
                if nxt is None:
                    return
                views = nxt

    def hexdigest(self) -> str:
        with self._lock:
            if self._early:  # pragma: no cover - a copy writes every range once, in full
                raise IntegrityError("file", "", "ranges were written with a gap")
            return self._sha.hexdigest()


#: most chunks one :func:`read_whole_files` read spans (a run of adjacent files' chunks)
WHOLE_RUN_CHUNKS = 128


def read_chunk_runs(
    source: ChunkSource, xorb_hash: bytes, start: int, end: int, runs: Sequence[tuple[int, int]]
) -> list[bytes]:
    """The decoded, verified bytes of chunks ``[a, b)`` for each ``(a, b)`` of ``runs``
    (inside ``[start, end)``), read with one ``read_chunks`` of ``[start, end)``; through
    the source's own ``read_chunk_runs`` where it has one (a local store: each run's bytes
    copied once, not once per chunk and again per run)."""
    read = getattr(source, "read_chunk_runs", None)
    if read is not None:
        return read(xorb_hash, start, end, runs)  # type: ignore[no-any-return]
    chunks = source.read_chunks(xorb_hash, start, end)
    if len(chunks) != end - start:
        raise IntegrityError(
            "xorb", to_hex(xorb_hash), f"{len(chunks)} chunks read, {end - start} asked"
        )
    return [b"".join(chunks[a - start : b - start]) for a, b in runs]


def read_whole_files(source: ChunkSource, files: Sequence[tuple[bytes, int]]) -> list[bytes | None]:
    """The whole bytes of many files (small ones, read together), given as (file hash,
    size), one result per file.

    Their reconstructions are asked for in one call (``describe``, where the source has
    it). Each file stored as one term is checked here as a :class:`FileReader` checks it
    (:func:`check_terms`: its reconstruction, its xorb's layout, its verification and file
    hashes), in one pass, with no reader built per file. Files whose chunks sit next to
    each other in a xorb (files added together) are then read with one ``read_chunks`` per
    run of at most :data:`WHOLE_RUN_CHUNKS` chunks: one read, one decode, one hash per
    chunk (the source checks every chunk against its hash), instead of a read per file.
    ``None`` for a file not read this way (several terms, a failed check or read): its own
    read tells why.
    """
    out: list[bytes | None] = [None] * len(files)
    describe = getattr(source, "describe", None)  # a source that describes many at once
    if describe is not None and len(files) > 1:
        try:
            describe([h for h, _ in files])
        except GitxetError:
            pass  # only a hint: file_info reports what fails
    one_term: list[tuple[FileTerm, int]] = []
    for i, (h, size) in enumerate(files):
        try:
            info = source.file_info(h)
            if info is None or len(info.terms) != 1 or info.terms[0].unpacked_bytes != size:
                continue
            check_terms(source, h, info)
        except GitxetError:
            continue
        one_term.append((info.terms[0], i))
    one_term.sort(key=lambda ti: (ti[0].xorb_hash, ti[0].chunk_start))
    k = 0
    while k < len(one_term):
        first, _ = one_term[k]
        xorb, c0, c1 = first.xorb_hash, first.chunk_start, first.chunk_end
        j = k + 1
        while j < len(one_term):
            t = one_term[j][0]
            if t.xorb_hash != xorb or t.chunk_start > c1 or t.chunk_end - c0 > WHOLE_RUN_CHUNKS:
                break
            c1 = max(c1, t.chunk_end)
            j += 1
        run = one_term[k:j]
        try:
            got = read_chunk_runs(
                source, xorb, c0, c1, [(t.chunk_start, t.chunk_end) for t, _ in run]
            )
        except GitxetError:
            got = []
        if len(got) == len(run):
            for (_, i), data in zip(run, got, strict=True):
                if len(data) == files[i][1]:
                    out[i] = data
        k = j
    return out
