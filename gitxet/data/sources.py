"""Chunk sources layered in order: the first that knows a file or holds a xorb serves it.

A mount of a working repository reads from its own store first and then from its remotes
(an embedded store read in place, or a CAS server through the shared chunk cache), so
nothing is copied: chunks are read lazily where they live.
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Sequence
from concurrent.futures import Future

from gitxet.data.reconstruct import ChunkSource, Layout, Segment, read_chunk_runs
from gitxet.errors import DataUnavailableError, GitxetError, WouldBlockError, XorbNotFoundError
from gitxet.formats.shard import FileInfo
from gitxet.hashing import to_hex
from gitxet.util.lru import LRUCache


def _has_xorb(layer: ChunkSource, xorb_hash: bytes) -> bool:
    has = getattr(layer, "has_xorb", None)
    if has is not None:
        return bool(has(xorb_hash))
    try:  # a remote source knows the layouts of the xorbs of files it described
        layer.layout(xorb_hash)
    except GitxetError:  # XorbNotFoundError, or a layer that cannot answer
        return False
    return True


def describe_files(
    source: ChunkSource, file_hashes: Sequence[bytes], *, keep: bool = True
) -> set[bytes]:
    """The files of ``file_hashes`` that ``source`` can read, their descriptions got ahead
    of the readers: in batches from a source that can (a CAS server's: one request per
    1,000 files, kept on disk with ``keep``), else one by one."""
    batch = getattr(source, "describe", None)
    if batch is not None:
        return set(batch(file_hashes, keep=keep))
    return {h for h in dict.fromkeys(file_hashes) if source.file_info(h) is not None}


class LayeredSource:
    """A :class:`ChunkSource` over several sources (local stores, remote caches), tried in order.

    ``names`` (one per layer) make a miss explicit: when no layer knows a file,
    :meth:`file_info` raises :class:`~gitxet.errors.DataUnavailableError` saying what each
    layer answered, instead of returning None. A layer that fails (a server that is down)
    counts as a miss; its error is reported only if no other layer has the file.
    ``is_local`` is True when every layer is local (no read ever waits on a network).
    """

    def __init__(self, layers: Sequence[ChunkSource], names: Sequence[str] | None = None) -> None:
        if names is not None and len(names) != len(layers):
            raise ValueError("one name per layer")
        self.layers = list(layers)
        self.names = list(names) if names is not None else None
        self.is_local = all(getattr(s, "is_local", False) for s in self.layers)
        # xorbs are immutable: once found, known (bounded: looked up again after eviction)
        self._where: LRUCache[bytes, ChunkSource] = LRUCache(1 << 16)

    def file_info(self, file_hash: bytes) -> FileInfo | None:
        tried: list[tuple[str, str]] = []
        causes: list[BaseException] = []
        for i, s in enumerate(self.layers):
            try:
                info = s.file_info(file_hash)
            except WouldBlockError:
                raise  # not a failure of this layer: the caller reads again, waiting
            except GitxetError as exc:
                causes.append(exc)
                tried.append((self._name(i), str(exc)))
                continue
            if info is not None:
                # (a xorb this layer was found to hold is not looked for again: a stat each)
                where = self._where.get
                if not all(
                    where(t.xorb_hash) is s or _has_xorb(s, t.xorb_hash) for t in info.terms
                ):
                    self._open_later(i, file_hash)
                return info
            tried.append((self._name(i), "does not have it"))
        if self.names is None:
            if causes:
                raise causes[0]
            return None
        raise DataUnavailableError(to_hex(file_hash), tried, causes)

    def describe(self, file_hashes: Sequence[bytes], *, keep: bool = True) -> set[bytes]:
        """The files of ``file_hashes`` some layer can read, each layer asked (in batches
        where it can) for those the layers before it do not know; a layer that fails
        counts as knowing none (:meth:`file_info` reports it)."""
        known: set[bytes] = set()
        rest = list(dict.fromkeys(file_hashes))
        for s in self.layers:
            if not rest:
                break
            with contextlib.suppress(WouldBlockError, GitxetError):
                known |= describe_files(s, rest, keep=keep)
            rest = [h for h in rest if h not in known]
        return known

    def _open_later(self, i: int, file_hash: bytes) -> None:
        """The file layer ``i`` describes points into xorbs it lacks (added against a CAS
        server's data): let the later layers (servers are opened on first use) know the
        file, so the layer holding those xorbs is found."""
        for s in self.layers[i + 1 :]:
            with contextlib.suppress(GitxetError):
                s.file_info(file_hash)

    def _name(self, i: int) -> str:
        return self.names[i] if self.names is not None else f"layer {i}"

    def _holder(self, xorb_hash: bytes) -> ChunkSource:
        store = self._where.get(xorb_hash)
        if store is not None:
            return store
        for s in self.layers:
            if _has_xorb(s, xorb_hash):
                self._where.put(xorb_hash, s)
                return s
        raise XorbNotFoundError(to_hex(xorb_hash))

    def layout(self, xorb_hash: bytes) -> Layout:
        return self._holder(xorb_hash).layout(xorb_hash)

    def read_chunks(self, xorb_hash: bytes, start: int, end: int) -> list[bytes]:
        return self._holder(xorb_hash).read_chunks(xorb_hash, start, end)

    def read_chunk_runs(
        self, xorb_hash: bytes, start: int, end: int, runs: Sequence[tuple[int, int]]
    ) -> list[bytes]:
        return read_chunk_runs(self._holder(xorb_hash), xorb_hash, start, end, runs)

    def read_verified_part(self, xorb_hash: bytes, index: int, lo: int, hi: int) -> bytes | None:
        read = getattr(self._holder(xorb_hash), "read_verified_part", None)
        return read(xorb_hash, index, lo, hi) if read is not None else None  # type: ignore[no-any-return]

    def read_verified_range(self, xorb_hash: bytes, lo: int, hi: int) -> bytes | None:
        read = getattr(self._holder(xorb_hash), "read_verified_range", None)
        return read(xorb_hash, lo, hi) if read is not None else None  # type: ignore[no-any-return]

    # ---- fetching (layers behind a network; see FetchSource) -------------------------------

    @property
    def initial_window(self) -> int:
        return max((int(getattr(s, "initial_window", 0)) for s in self.layers), default=0)

    @property
    def max_window(self) -> int:
        """Non-zero when some layer is behind a network: readers then read ahead."""
        return max((int(getattr(s, "max_window", 0)) for s in self.layers), default=0)

    def fetch_range(self, xorb_hash: bytes, lo: int, hi: int, *, sequential: bool) -> bytes:
        holder = self._holder(xorb_hash)
        fetch = getattr(holder, "fetch_range", None)
        if fetch is not None:
            return fetch(xorb_hash, lo, hi, sequential=sequential)  # type: ignore[no-any-return]
        return _read(holder, xorb_hash, lo, hi)

    def prefetch(self, xorb_hash: bytes, lo: int, hi: int) -> None:
        prefetch = getattr(self._holder(xorb_hash), "prefetch", None)
        if prefetch is not None:
            prefetch(xorb_hash, lo, hi)

    def split_range(self, xorb_hash: bytes, lo: int, hi: int) -> list[tuple[int, int]]:
        split = getattr(self._holder(xorb_hash), "split_range", None)
        if split is not None:
            return split(xorb_hash, lo, hi)  # type: ignore[no-any-return]
        step = 8 << 20
        return [(a, min(hi, a + step)) for a in range(lo, hi, step)]

    def stream_range(self, xorb_hash: bytes, lo: int, hi: int) -> Future[Segment]:
        holder = self._holder(xorb_hash)
        stream = getattr(holder, "stream_range", None)
        if stream is not None:
            return stream(xorb_hash, lo, hi)  # type: ignore[no-any-return]
        done: Future[Segment] = Future()
        done.set_result(Segment(lo, [_read(holder, xorb_hash, lo, hi)]))
        return done


def _read(source: ChunkSource, xorb_hash: bytes, lo: int, hi: int) -> bytes:
    """Decoded bytes ``[lo, hi)`` of a xorb from a local source (a pread when verified)."""
    read = getattr(source, "read_verified_range", None)
    data = read(xorb_hash, lo, hi) if read is not None else None
    if data is not None:
        return data  # type: ignore[no-any-return]
    offs = source.layout(xorb_hash).data_offsets
    c0, c1 = bisect.bisect_right(offs, lo) - 1, bisect.bisect_left(offs, hi)
    joined = b"".join(source.read_chunks(xorb_hash, c0, c1))
    return joined[lo - offs[c0] : hi - offs[c0]]
