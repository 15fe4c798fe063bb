"""Reading files from a CAS server: the one streaming read path, over the node cache.

Every reader of an http(s) repository (a mount, an ``xet://`` file, ``git checkout``'s
smudge filter, ``git xet checkout`` and ``git xet clone``) reads through
:class:`RemoteChunkSource` and :class:`~gitxet.data.reconstruct.FileReader`:

* A file's description comes from the server's file shard: its terms, plus the chunk hashes
  and sizes of every xorb it uses, each list checked against its xorb hash. The reader
  checks the terms against the file hash before serving a byte.
* Data moves in *ranges*: runs of consecutive chunks of one xorb, fetched with one ranged
  GET from the xorb's signed URL straight into a buffer, decoded (chunks stored
  uncompressed are not copied) and hashed once, chunk by chunk. A range is then stored in
  the node cache (:class:`~gitxet.store.nodecache.NodeCache`, for mounts and fsspec) or
  handed straight to the caller (checkout and clone, which write the file anyway).
* Sequential readers are served ahead: the reader detects sequential access and asks for
  the ranges of the next *window* of the file, which a pool fetches in parallel; the window
  grows from :data:`INITIAL_WINDOW` up to ``max_window`` while reads stay sequential, and is
  zero for random reads, which fetch just the chunks they touch. Sequential fetches use
  ranges aligned on :data:`UNIT` boundaries of each xorb, so every reader on the machine
  asks for (and caches) the same ranges. Concurrent requests for one range share one fetch.

``offline=True`` never touches the network: what is not cached raises
:class:`CacheMissError`, so a pinned, warmed dataset is served without a server.

Through a cache tier (``GITXET_CAS_URL``, ``--cas-url``: a ``git xet serve --upstream``
between the nodes and the origin) the source talks to the tier and keeps the origin's
client as a ``fallback``: when the tier cannot be talked to at all (refused, reset, silent
for ``GITXET_TIER_TIMEOUT``, 30 s by default; tried twice, :data:`TIER_ATTEMPTS`; not when it
*answers* an error), the source logs one warning and reads from the origin from then on, trying the
tier again (a ``/healthz`` probe) every :data:`TIER_RETRY` seconds.
The data is content-addressed and verified either way, so only the path changes.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import itertools
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from gitxet.data.reconstruct import Segment
from gitxet.errors import (
    AuthError,
    FileNotFoundInCASError,
    FormatError,
    GitxetError,
    IntegrityError,
    RemoteError,
    XorbNotFoundError,
)
from gitxet.formats import shard as shardfmt
from gitxet.formats import xorb as xorbfmt
from gitxet.hashing import chunk_hash, from_hex, merkle_root_of, to_hex
from gitxet.remote import protocol as p
from gitxet.remote.client import BufferPool, CASClient, TokenSource
from gitxet.settings import DEFAULT_PREFETCH_BYTES, DEFAULT_TIER_TIMEOUT, strip_credentials
from gitxet.store.nodecache import NodeCache, cache_total
from gitxet.util.atomic import atomic_write
from gitxet.util.flights import Flights
from gitxet.util.lru import LRUCache
from gitxet.util.memory import keep_freed_memory
from gitxet.util.retry import RetryPolicy

_T = TypeVar("_T")

# Fetch URLs are signed and expire; re-ask for them well before a typical expiry.
URL_TTL = 300.0
#: decoded bytes per aligned range of a sequential read (one ranged GET)
UNIT = 8 << 20
#: the smallest aligned range, for node caches too small to hold :data:`UNIT` four times
MIN_UNIT = 64 << 10
#: the read-ahead window of a sequential reader when it starts
INITIAL_WINDOW = 8 << 20
#: the largest read-ahead window (``--prefetch``)
MAX_WINDOW = DEFAULT_PREFETCH_BYTES
#: xorbs whose fetch URLs and locations are remembered (an LRU each)
_MAX_XORB_ENTRIES = 16384
#: file descriptions held in memory (an LRU; a mount describes at most 1,000 at once): one
#: dropped is read again from the cache directory or asked for again. A
#: :meth:`RemoteChunkSource.describe` of more files raises the bound to hold them all: its
#: callers (clone, fetch, warmup) read each file it describes, after it returns
MAX_FILES = 1 << 15
#: parallel range fetches per source
FETCH_WORKERS = 8
#: batches of file descriptions asked for at once (:meth:`RemoteChunkSource.describe`)
DESCRIBE_WORKERS = 4
#: xorb layouts asked for at once (:meth:`RemoteChunkSource.layouts_ahead`): the 16 of a
#: 1 GiB file in one round trip (4 at a time took ~0.13 s of a clone's start on loopback)
LAYOUT_WORKERS = 16
#: a streamed piece at most 1/this of a unit is fetched with its whole aligned range, cached
SMALL_PIECE_FRACTION = 4
#: seconds after falling back to the origin before the cache tier is probed again
TIER_RETRY = 60.0
#: tries of a request to a cache tier: one retry, then the origin (a tier that is down
#: should cost a reader about a second, not the origin's patient backoff)
TIER_ATTEMPTS = RetryPolicy(attempts=2, base_delay=0.25)

log = logging.getLogger(__name__)


def _keep(path: str, data: bytes) -> None:
    """Write a description into the cache, best effort: a cache that cannot be written (a
    full disk, read-only) fails no read; only an ``--offline`` one misses it later."""
    try:
        atomic_write(path, data, durable=False)
    except OSError as exc:  # said once a process: a full cache fails every write
        (log.debug if _unkept_said.is_set() else log.warning)(
            "not kept in the cache (reads go on without it): %s: %s", path, exc
        )
        _unkept_said.set()


_unkept_said = threading.Event()


def _one_file_shard(info: shardfmt.FileInfo) -> bytes:
    """A shard of one file block (a description kept on disk, without its xorbs)."""
    return shardfmt.serialize_shard(shardfmt.Shard([info], []))


class CacheMissError(GitxetError):
    """Offline, and the data is not in the cache."""


@dataclass(frozen=True, slots=True)
class RemoteLayout:
    """Chunk hashes and decoded offsets of a xorb, from a file shard (verified), and the
    chunk indices where its aligned ranges start (the last entry is the chunk count)."""

    chunk_hashes: tuple[bytes, ...]
    data_offsets: tuple[int, ...]
    units: tuple[int, ...]

    def chunk_span(self, lo: int, hi: int) -> tuple[int, int]:
        """The chunks ``[c0, c1)`` that decoded bytes ``[lo, hi)`` touch."""
        offs = self.data_offsets
        return bisect.bisect_right(offs, lo) - 1, bisect.bisect_left(offs, hi)

    def unit_spans(self, c0: int, c1: int) -> list[tuple[int, int]]:
        """The aligned ranges (chunk bounds) that chunks ``[c0, c1)`` touch."""
        u = self.units
        k0, k1 = bisect.bisect_right(u, c0) - 1, bisect.bisect_left(u, c1)
        return [(u[k], u[k + 1]) for k in range(k0, k1)]


def _units(offs: Sequence[int], unit: int) -> tuple[int, ...]:
    """Chunk indices cutting a xorb into runs of about ``unit`` decoded bytes."""
    cuts = [0]
    n = len(offs) - 1
    for i in range(1, n):
        if offs[i + 1] - offs[cuts[-1]] > unit:
            cuts.append(i)
    cuts.append(n)
    return tuple(cuts)


class _Job:
    """One range fetch; whoever claims it runs it, the others wait on ``future``."""

    __slots__ = ("claimed", "future")

    def __init__(self) -> None:
        self.claimed = False
        self.future: Future[Segment] = Future()


class RemoteChunkSource:
    """A :class:`~gitxet.data.reconstruct.ChunkSource` reading from a CAS server, with the
    fetching capabilities :class:`~gitxet.data.reconstruct.FileReader` streams through."""

    is_local = False
    initial_window = INITIAL_WINDOW

    def __init__(
        self,
        client: CASClient,
        cache: NodeCache,
        shard_dir: str,
        *,
        offline: bool = False,
        max_window: int = MAX_WINDOW,
        workers: int = FETCH_WORKERS,
        unit: int = UNIT,
        fallback: CASClient | None = None,
        has_locations: bool | None = None,
        max_files: int = MAX_FILES,
    ) -> None:
        # every read returns new buffers of megabytes: reuse freed ones, not fresh pages
        keep_freed_memory()
        #: where reads go now: the server (or the cache tier, until it fails)
        self.client = client
        self._tier = client if fallback is not None else None
        self._fallback = fallback
        self._fell_back_at = 0.0
        self.cache = cache
        self.shard_dir = shard_dir
        self.offline = offline
        # a window larger than a fraction of the cache would evict itself before it is read
        self.max_window = max(0, min(max_window, cache.max_bytes // 4))
        # and an aligned range larger than that is never cached: each read of a sequential
        # reader would fetch its whole range again (56x the file through a 1 MiB cache)
        self.unit = max(MIN_UNIT, min(unit, cache.max_bytes // 4))
        self._workers = max(1, workers)
        self._pid = os.getpid()
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        # file -> (its description, whether it is still to be kept on disk: described in
        # a batch to keep, it is written when first read, by file_info)
        self._files: LRUCache[bytes, tuple[shardfmt.FileInfo, bool]] = LRUCache(max_files)
        self._max_files = max_files
        self._layouts: dict[bytes, RemoteLayout] = {}
        self._xorb_file: dict[bytes, bytes] = {}  # a file whose reconstruction names the xorb
        # per xorb, bounded: each is asked for again when it is needed after an eviction
        self._urls: LRUCache[bytes, tuple[float, list[p.FetchInfo]]] = LRUCache(_MAX_XORB_ENTRIES)
        self._locations: LRUCache[bytes, tuple[float, p.XorbLocation]] = LRUCache(_MAX_XORB_ENTRIES)
        self._location_flights = Flights()
        # the server has no xorb locations (not a gitxet server) / it has; None: find out
        self._no_locations = has_locations is False
        self._locations_ok = has_locations is True
        self._inflight: dict[bytes, dict[tuple[int, int], _Job]] = {}
        # ranges are received into reused mappings (a range's serialized bytes are its
        # decoded ones plus headers: a unit and some slack), as many as were in use at once
        self._buffers = BufferPool(unit + (1 << 20), 3 * self._workers)
        #: decoded bytes fetched from the server by this source
        self.fetched_bytes = 0
        #: called with (decoded bytes, seconds) after each fetch from the server (metrics)
        self.on_fetch: Callable[[int, float], None] | None = None

    def close(self) -> None:
        """Stop the fetch pool (running fetches finish) and free the receive buffers."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._buffers.clear()

    # ---- the cache tier and its fallback -------------------------------------------------

    def _reader(self) -> CASClient:
        """The client to ask now: the tier, or the origin while the tier is down (probed
        again every :data:`TIER_RETRY` seconds)."""
        client = self.client
        tier = self._tier
        if tier is None or client is tier:
            return client
        now = time.monotonic()
        with self._lock:
            due = now - self._fell_back_at >= TIER_RETRY
            if due:
                self._fell_back_at = now  # one probe per period, whoever comes first
        if due and tier.healthy():
            with self._lock:
                self.client = tier
                self._locations.clear()
                self._urls.clear()
            log.warning("the cache tier %s answers again: reading through it", tier.endpoint)
            return tier
        return client

    def _tier_failed(self, used: CASClient, exc: BaseException) -> bool:
        """Whether ``exc`` (raised by ``used``) means the cache tier cannot be talked to; if
        so, reads go to the origin from now on (the caller asks again)."""
        fallback = self._fallback
        if fallback is None or used is fallback or not isinstance(exc, RemoteError):
            return False
        if isinstance(exc, AuthError) or exc.status is not None:
            return False  # the tier answered: its answer stands
        with self._lock:
            if self.client is fallback:
                return True  # another thread switched already
            self.client = fallback
            self._fell_back_at = time.monotonic()
            # locations name the tier's URLs and byte offsets; chunk layouts stay valid
            self._locations.clear()
            self._urls.clear()
        log.warning(
            "the cache tier %s cannot be reached (%s): reading from the origin %s instead",
            used.endpoint,
            exc,
            fallback.endpoint,
        )
        return True

    def _call(self, fn: Callable[[CASClient], _T]) -> _T:
        """``fn(client)`` with the reader, once more with the origin if the tier is down."""
        used = self._reader()
        try:
            return fn(used)
        except RemoteError as e:
            if not self._tier_failed(used, e):
                raise
        return fn(self.client)

    # ---- descriptions ------------------------------------------------------------------

    def _shard_path(self, file_hash: bytes, with_xorbs: bool = True) -> str:
        return os.path.join(self.shard_dir, to_hex(file_hash) + ("" if with_xorbs else ".terms"))

    def _cached_shard(self, file_hash: bytes, with_xorbs: bool) -> shardfmt.Shard | None:
        try:
            with open(self._shard_path(file_hash, with_xorbs), "rb") as f:
                data = f.read()
        except OSError:
            return None
        with contextlib.suppress(FormatError):
            return shardfmt.parse_shard(data)
        return None

    def file_shard(self, file_hash: bytes, *, with_xorbs: bool = True) -> shardfmt.Shard | None:
        """The server's shard of a file: its block and (``with_xorbs``) the chunk lists of
        its xorbs (kept on disk under the cache; checked against the xorb hashes when
        registered). Reads need only the block: each xorb's chunk list comes once, with its
        location, however many files it holds; dedup needs the chunk lists."""
        shard = self._cached_shard(file_hash, True)
        if shard is None and not with_xorbs:
            shard = self._cached_shard(file_hash, False)
        if shard is not None:
            return shard
        if self.offline:
            raise CacheMissError(f"file {to_hex(file_hash)} is not in the cache (offline)")
        # (a server without locations must send the chunk lists: reads have no other source)
        full = with_xorbs or self._no_locations
        try:
            shard = self._call(lambda c: c.get_file_shard(file_hash, with_xorbs=full))
        except FileNotFoundInCASError:
            return None
        _keep(
            self._shard_path(file_hash, full or bool(shard.xorbs)), shardfmt.serialize_shard(shard)
        )
        return shard

    def query_chunk(self, chunk_hash_: bytes) -> shardfmt.Shard | None:
        """The server's global-dedup answer for a chunk (None offline or when unknown)."""
        if self.offline:
            return None
        return self._call(lambda c: c.query_chunk(chunk_hash_))

    def file_info(self, file_hash: bytes) -> shardfmt.FileInfo | None:
        with self._lock:
            held = self._files.get(file_hash)
            if held is not None and held[1]:
                self._files.put(file_hash, (held[0], False))
        if held is not None:
            info, unkept = held
            if unkept:
                _keep(self._shard_path(file_hash, False), _one_file_shard(info))
            return info
        shard = self.file_shard(file_hash, with_xorbs=False)
        return None if shard is None else self._register(file_hash, shard)

    def describe(self, file_hashes: Sequence[bytes], *, keep: bool = True) -> set[bytes]:
        """Get the descriptions of many files ahead of their readers (a clone, a checkout,
        a directory of a mount): those not yet known here come in batches of
        :data:`~gitxet.remote.protocol.MAX_FILE_SHARDS_BATCH` (``POST /v1/file-shards``, a
        few at once), not one request per file, and (``keep``) the description of each
        file then read (:meth:`file_info`) is kept on disk, for offline and later reads. A
        mount describes a directory's files at once: a file written per description was 60%
        of its time reading 1,000 random files of 100,000 (0.4 ms each on a busy disk). A
        clone or checkout, which writes the files once, passes ``keep=False``. Returns the files of
        ``file_hashes`` that can be read from here (offline: those described before). A
        server without the batch route is asked file by file.

        Raises:
            RemoteError: the server could not be asked, or answered nonsense.
        """
        known: set[bytes] = set()
        want: list[bytes] = []
        unique = list(dict.fromkeys(file_hashes))
        with self._lock:  # each file described here is held until its reader comes
            if len(unique) > self._files.capacity:
                self._files.capacity = len(unique) + self._max_files
        for h in unique:
            with self._lock:
                held = h in self._files
            if held:
                known.add(h)
                continue
            shard = self._cached_shard(h, True) or self._cached_shard(h, False)
            if shard is not None and self._register(h, shard) is not None:
                known.add(h)
            else:
                want.append(h)
        if not want or self.offline:
            return known
        if self._no_locations:
            # (a server without locations must send the chunk lists: reads have no other
            # source, and the batch route sends blocks alone)
            return known | {h for h in want if self.file_info(h) is not None}
        size = p.MAX_FILE_SHARDS_BATCH
        batches = [want[i : i + size] for i in range(0, len(want), size)]

        def one(batch: list[bytes]) -> set[bytes] | None:
            blocks = self._call(lambda c: c.get_file_blocks(batch))
            if blocks is None:
                return None
            for h, info in blocks.items():
                # (kept on disk once read: not 1,000 files a batch)
                self._register(h, shardfmt.Shard([info], []), unkept=keep)
            return set(blocks)

        if len(batches) == 1:
            answers = [one(batches[0])]
        else:
            with ThreadPoolExecutor(
                min(DESCRIBE_WORKERS, len(batches)), thread_name_prefix="gitxet-describe"
            ) as pool:
                answers = list(pool.map(one, batches))
        for batch, got in zip(batches, answers, strict=True):
            if got is None:  # no batch route: file by file
                got = {h for h in batch if self.file_info(h) is not None}
            known |= got
        return known

    def _register(
        self, file_hash: bytes, shard: shardfmt.Shard, *, unkept: bool = False
    ) -> shardfmt.FileInfo | None:
        """Hold the description of ``file_hash`` that ``shard`` holds (``unkept``: to be
        kept on disk when first read) and the verified layouts of its xorbs."""
        info = next((f for f in shard.files if f.file_hash == file_hash), None)
        if info is None:
            return None
        layouts: dict[bytes, RemoteLayout] = {}
        for x in shard.xorbs:
            with self._lock:
                if x.xorb_hash in self._layouts:
                    continue  # verified when it was registered; a later shard repeats it
            layouts[x.xorb_hash] = self._verified_layout(x)
        with self._lock:
            self._files.put(file_hash, (info, unkept))
            self._layouts.update(layouts)
            for t in info.terms:
                self._xorb_file.setdefault(t.xorb_hash, file_hash)
        return info

    def _verified_layout(self, x: shardfmt.XorbInfo) -> RemoteLayout:
        """The layout of a CAS block, checked against its xorb hash."""
        hashes = tuple(c.hash for c in x.chunks)
        sizes = [c.size for c in x.chunks]
        if merkle_root_of(hashes, sizes) != x.xorb_hash:
            raise IntegrityError(
                "xorb", to_hex(x.xorb_hash), "chunk list from the server does not hash to it"
            )
        offs = [0]
        for s in sizes:
            offs.append(offs[-1] + s)
        return RemoteLayout(hashes, tuple(offs), _units(offs, self.unit))

    def _layout_path(self, xorb_hash: bytes) -> str:
        return os.path.join(self.shard_dir, to_hex(xorb_hash) + ".xorb")

    def layout(self, xorb_hash: bytes) -> RemoteLayout:
        """The chunk layout of a xorb of a file this source described, or (from a gitxet
        server) of any xorb it stores: a file added here may point into xorbs of the server
        it was deduplicated against. A layout taken from a location is kept on disk (a
        one-block shard) so that cached data reads again offline and after a restart."""
        with self._lock:
            lay = self._layouts.get(xorb_hash)
        if lay is not None:
            return lay
        # (a kept layout that does not hash to its xorb is asked for again)
        with contextlib.suppress(OSError, FormatError, IntegrityError):
            with open(self._layout_path(xorb_hash), "rb") as f:
                kept = shardfmt.parse_shard(f.read())
            block = next((x for x in kept.xorbs if x.xorb_hash == xorb_hash), None)
            if block is not None:
                lay = self._verified_layout(block)
                with self._lock:
                    return self._layouts.setdefault(xorb_hash, lay)
        if self.offline or self._no_locations:
            raise XorbNotFoundError(to_hex(xorb_hash))
        loc = self._location(xorb_hash, refresh=False)  # checked against the xorb hash
        if loc is None:
            with self._lock:
                described = xorb_hash in self._xorb_file  # by this server
            lost = f"on the server {self.client.lost_data}" if described else ""
            raise XorbNotFoundError(to_hex(xorb_hash), lost)
        offs = loc.data_offsets
        lay = RemoteLayout(loc.chunk_hashes, offs, _units(offs, self.unit))
        sizes = [b - a for a, b in itertools.pairwise(offs)]
        block = shardfmt.XorbInfo.from_chunks(xorb_hash, loc.chunk_hashes, sizes)
        _keep(self._layout_path(xorb_hash), shardfmt.serialize_shard(shardfmt.Shard([], [block])))
        with self._lock:
            return self._layouts.setdefault(xorb_hash, lay)

    def layouts_ahead(self, xorb_hashes: Sequence[bytes]) -> None:
        """Ask for the layouts of many xorbs at once (a file's, before its first byte is
        served: every one is needed to check the file hash), :data:`LAYOUT_WORKERS` at a
        time instead of one round trip after the other. Best effort: a layout that cannot
        be had is asked for again, and its error raised, by :meth:`layout`."""
        with self._lock:
            missing = [x for x in dict.fromkeys(xorb_hashes) if x not in self._layouts]
        if len(missing) < 2 or self.offline or self._no_locations:
            return

        def one(xorb_hash: bytes) -> None:
            with contextlib.suppress(GitxetError):
                self.layout(xorb_hash)

        # (a pool of its own: the caller may be a fetch thread, waiting on the fetch pool)
        with ThreadPoolExecutor(
            min(LAYOUT_WORKERS, len(missing)), thread_name_prefix="gitxet-layouts"
        ) as pool:
            list(pool.map(one, missing))

    # ---- cached data -------------------------------------------------------------------

    def read_verified_part(self, xorb_hash: bytes, index: int, lo: int, hi: int) -> bytes | None:
        lay = self.layout(xorb_hash)
        base = lay.data_offsets[index]
        return self.cache.read(xorb_hash, lay, base + lo, base + hi)

    def read_verified_range(self, xorb_hash: bytes, lo: int, hi: int) -> bytes | None:
        return self.cache.read(xorb_hash, self.layout(xorb_hash), lo, hi)

    def read_chunks(self, xorb_hash: bytes, start: int, end: int) -> list[bytes]:
        lay = self.layout(xorb_hash)
        offs = lay.data_offsets
        data = self.fetch_range(xorb_hash, offs[start], offs[end], sequential=False)
        base = offs[start]
        return [data[offs[i] - base : offs[i + 1] - base] for i in range(start, end)]

    # ---- fetching ----------------------------------------------------------------------

    def split_range(self, xorb_hash: bytes, lo: int, hi: int) -> list[tuple[int, int]]:
        """``[lo, hi)`` cut at the xorb's aligned range boundaries."""
        lay = self.layout(xorb_hash)
        offs = lay.data_offsets
        out: list[tuple[int, int]] = []
        for cs, ce in lay.unit_spans(*lay.chunk_span(lo, hi)):
            a, b = max(lo, offs[cs]), min(hi, offs[ce])
            if a < b:
                out.append((a, b))
        return out

    def fetch_range(self, xorb_hash: bytes, lo: int, hi: int, *, sequential: bool) -> bytes:
        """Decoded bytes ``[lo, hi)`` of a xorb, fetched (and cached) now.

        ``sequential`` fetches the whole aligned ranges around the bytes (the reader will
        want the rest); otherwise just the chunks they touch.

        Raises:
            CacheMissError: offline.
            IntegrityError: the server sent chunks that do not match their hashes.
        """
        if self.offline:
            raise CacheMissError(
                f"xorb {to_hex(xorb_hash)} bytes {lo}..{hi} are not cached (offline)"
            )
        lay = self.layout(xorb_hash)
        c0, c1 = lay.chunk_span(lo, hi)
        if not sequential or not self._aligned(xorb_hash):
            return self._get(xorb_hash, c0, c1).read(lo, hi)
        spans = lay.unit_spans(c0, c1)
        offs = lay.data_offsets
        pieces = [(cs, ce, max(lo, offs[cs]), min(hi, offs[ce])) for cs, ce in spans]
        parts: list[bytes | None] = [self.cache.read(xorb_hash, lay, a, b) for *_, a, b in pieces]
        for (cs, ce, _, _), got in list(zip(pieces, parts, strict=True))[1:]:
            if got is None:
                self._schedule(xorb_hash, cs, ce)
        out = [
            got if got is not None else self._get_within(xorb_hash, cs, ce, a, b)
            for (cs, ce, a, b), got in zip(pieces, parts, strict=True)
        ]
        return out[0] if len(out) == 1 else b"".join(out)

    def _get_within(self, xorb_hash: bytes, cs: int, ce: int, a: int, b: int) -> bytes:
        """Bytes ``[a, b)`` from the aligned range of chunks ``[cs, ce)`` that holds them.
        When that range fails verification, the chunks ``[a, b)`` need are fetched alone:
        one bad chunk must not make its neighbours (other files packed in the same xorb)
        unreadable. A bad chunk among those is still an ``IntegrityError``."""
        try:
            return self._get(xorb_hash, cs, ce).read(a, b)
        except IntegrityError:
            c0, c1 = self.layout(xorb_hash).chunk_span(a, b)
            if (c0, c1) == (cs, ce):
                raise
            # on its own, not joined to a fetch in flight (another reader's whole range)
            return self._fetch(xorb_hash, c0, c1, True).read(a, b)

    def prefetch(self, xorb_hash: bytes, lo: int, hi: int) -> None:
        """Start fetching (into the cache) the aligned ranges around ``[lo, hi)`` that are
        neither cached nor on their way; returns at once."""
        if self.offline:
            return
        lay = self.layout(xorb_hash)
        offs = lay.data_offsets
        span = lay.chunk_span(lo, hi)
        units = lay.unit_spans(*span)
        missing = [(a, b) for a, b in units if not self.cache.covers(xorb_hash, offs[a], offs[b])]
        if not missing:
            return
        if not (
            self._no_locations or self._locations_ok
        ):  # finding out may take a request: not on the reader's thread
            self._executor().submit(self._prefetch_later, xorb_hash, span, missing)
            return
        for cs, ce in missing if self._aligned(xorb_hash) else [span]:
            self._schedule(xorb_hash, cs, ce)

    def _prefetch_later(
        self, xorb_hash: bytes, span: tuple[int, int], missing: list[tuple[int, int]]
    ) -> None:
        with contextlib.suppress(GitxetError):
            for cs, ce in missing if self._aligned(xorb_hash) else [span]:
                self._schedule(xorb_hash, cs, ce)

    def _aligned(self, xorb_hash: bytes) -> bool:
        """Whether any chunk range of the xorb can be fetched (the server tells where each
        chunk is); otherwise only what reconstruction fetch entries name."""
        if self._no_locations or self._locations_ok:
            return not self._no_locations
        return self._location(xorb_hash, refresh=False) is not None

    def stream_range(self, xorb_hash: bytes, lo: int, hi: int) -> Future[Segment]:
        """Decoded bytes ``[lo, hi)`` for a caller that writes them out once (checkout,
        clone): from the cache when it has them, else fetched on the pool without being
        cached. A small piece (a small file) is the exception: its aligned range is fetched
        once into the cache and shared by the writers of its neighbours, so a clone of
        thousands of small files packed in a xorb makes one request per range, not one per
        file. The result's :meth:`Segment.views` give the bytes."""
        cached = self.cache.read(xorb_hash, self.layout(xorb_hash), lo, hi)
        if cached is not None:
            done: Future[Segment] = Future()
            done.set_result(Segment(lo, [cached]))
            return done
        if self.offline:
            raise CacheMissError(
                f"xorb {to_hex(xorb_hash)} bytes {lo}..{hi} are not cached (offline)"
            )
        if hi - lo <= self.unit // SMALL_PIECE_FRACTION and self._aligned(xorb_hash):
            return self._executor().submit(
                lambda: Segment(lo, [self.fetch_range(xorb_hash, lo, hi, sequential=True)])
            )
        lay = self.layout(xorb_hash)
        c0, c1 = lay.chunk_span(lo, hi)
        return self._executor().submit(self._fetch, xorb_hash, c0, c1, False)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pid != os.getpid():  # a forked child (a mount daemon): no pool threads here
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._pool = None
            self._inflight = {}
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="gitxet-fetch")
            return self._pool

    def _job(self, xorb_hash: bytes, cs: int, ce: int) -> tuple[_Job, bool]:
        """The job fetching chunks ``[cs, ce)`` (or a running one that holds them), and
        whether it is new. Call with ``self._lock`` held."""
        jobs = self._inflight.setdefault(xorb_hash, {})
        job = jobs.get((cs, ce))
        if job is None:
            job = next((j for (a, b), j in jobs.items() if a <= cs and ce <= b), None)
        if job is not None:
            return job, False
        job = jobs[(cs, ce)] = _Job()
        return job, True

    def _schedule(self, xorb_hash: bytes, cs: int, ce: int) -> Future[Segment]:
        with self._lock:
            job, new = self._job(xorb_hash, cs, ce)
        if new:
            self._executor().submit(self._claim_and_run, xorb_hash, cs, ce, job)
        return job.future

    def warm(
        self,
        file_hashes: Sequence[bytes],
        progress: Callable[[int], None] | None = None,
        *,
        store: bool = True,
    ) -> int:
        """Fetch into the cache every range of the given files it lacks, in parallel;
        returns the bytes fetched. ``store=False`` fetches (and verifies) without keeping
        the data: what fills a cache tier this source reads through.

        Raises:
            FileNotFoundInCASError: the server does not know a file.
        """
        before = self.fetched_bytes
        if len(file_hashes) > 1:
            self.describe(file_hashes)  # in batches; unknown files fail below, by name
        pending: list[tuple[Future[Segment], int]] = []
        seen: set[tuple[bytes, int, int]] = set()  # a range several files share is fetched once

        def wait_one() -> None:
            fut, n = pending.pop(0)
            fut.result()
            if progress is not None:
                progress(n)

        for fhash in file_hashes:
            info = self.file_info(fhash)
            if info is None:
                raise FileNotFoundInCASError(to_hex(fhash))
            for t in info.terms:
                lay = self.layout(t.xorb_hash)
                offs = lay.data_offsets
                spans = (
                    lay.unit_spans(t.chunk_start, t.chunk_end)
                    if self._aligned(t.xorb_hash)
                    else [(t.chunk_start, t.chunk_end)]
                )
                for cs, ce in spans:
                    if (t.xorb_hash, cs, ce) in seen:
                        continue
                    seen.add((t.xorb_hash, cs, ce))
                    if store and self.cache.covers(t.xorb_hash, offs[cs], offs[ce]):
                        continue
                    while len(pending) >= 2 * self._workers:
                        wait_one()
                    fut = (
                        self._schedule(t.xorb_hash, cs, ce)
                        if store
                        else self._executor().submit(self._fetch, t.xorb_hash, cs, ce, False)
                    )
                    pending.append((fut, offs[ce] - offs[cs]))
        while pending:
            wait_one()
        return self.fetched_bytes - before

    def _get(self, xorb_hash: bytes, cs: int, ce: int) -> Segment:
        """Chunks ``[cs, ce)`` (fetched and cached here, or by a fetch already running)."""
        with self._lock:
            job, _ = self._job(xorb_hash, cs, ce)
            mine = not job.claimed
            job.claimed = True
        if mine:  # nobody started it yet (maybe queued on the pool): run it on this thread
            self._run(xorb_hash, cs, ce, job)
        return job.future.result()

    def _claim_and_run(self, xorb_hash: bytes, cs: int, ce: int, job: _Job) -> None:
        with self._lock:
            if job.claimed:
                return
            job.claimed = True
        self._run(xorb_hash, cs, ce, job)

    def _run(self, xorb_hash: bytes, cs: int, ce: int, job: _Job) -> None:
        try:
            seg = self._fetch(xorb_hash, cs, ce, True)
        except BaseException as exc:
            job.future.set_exception(exc)
        else:
            job.future.set_result(seg)
        finally:
            with self._lock:
                jobs = self._inflight.get(xorb_hash)
                if jobs is not None:
                    for key, j in list(jobs.items()):
                        if j is job:
                            del jobs[key]
                    if not jobs:
                        del self._inflight[xorb_hash]

    def _fetch(self, xorb_hash: bytes, cs: int, ce: int, cache: bool) -> Segment:
        """Fetch chunks ``[cs, ce)`` (or an entry holding them) with one ranged GET, verify
        every chunk, and store them in the cache if ``cache`` (unless a fetch that just
        ended stored them: then they are read from there)."""
        lay = self.layout(xorb_hash)
        if cache:
            offs = lay.data_offsets
            held = self.cache.read(xorb_hash, lay, offs[cs], offs[ce])
            if held is not None:
                return Segment(offs[cs], [held])
        used = self._reader()
        try:
            return self._fetch_from(used, xorb_hash, lay, cs, ce, cache)
        except RemoteError as e:
            if not self._tier_failed(used, e):
                raise
        return self._fetch_from(self.client, xorb_hash, lay, cs, ce, cache)

    def _fetch_from(
        self, client: CASClient, xorb_hash: bytes, lay: RemoteLayout, cs: int, ce: int, cache: bool
    ) -> Segment:
        hx = to_hex(xorb_hash)
        began = time.monotonic()
        for attempt in range(2):
            loc = self._location(xorb_hash, refresh=attempt > 0)
            if loc is not None:
                url, fcs, fce = loc.url, cs, ce
                start, end = loc.byte_offsets[cs], loc.byte_offsets[ce] - 1
            else:
                entry = self._entry(xorb_hash, cs, ce, refresh=attempt > 0)
                url, fcs, fce = entry.url, entry.chunk_start, entry.chunk_end
                start, end = entry.byte_start, entry.byte_end
            try:
                raw = client.fetch_xorb_range(
                    url, start, end, into=self._buffers.take(end - start + 1)
                )
            except AuthError as e:
                if e.status == 403 and attempt == 0:
                    continue  # the signed URL expired: ask for a fresh one
                raise
            break
        else:  # pragma: no cover - the loop either breaks or raises
            raise XorbNotFoundError(hx)
        try:
            chunks = xorbfmt.decode_chunk_views(memoryview(raw), expected_count=fce - fcs)
        except FormatError as e:
            raise IntegrityError(
                "xorb", hx, f"chunks {fcs}..{fce} unreadable ({e.reason})"
            ) from None
        offs = lay.data_offsets
        hashes = lay.chunk_hashes
        for k, c in enumerate(chunks, start=fcs):
            if len(c) != offs[k + 1] - offs[k] or chunk_hash(c) != hashes[k]:
                raise IntegrityError("xorb", hx, f"chunk {k} from the server does not match")
        n = offs[fce] - offs[fcs]
        with self._lock:
            self.fetched_bytes += n
        if self.on_fetch is not None:
            self.on_fetch(n, time.monotonic() - began)
        if cache:
            self.cache.put(xorb_hash, fcs, fce, offs[fcs], chunks)
        return Segment(offs[fcs], chunks)

    def _location(self, xorb_hash: bytes, refresh: bool) -> p.XorbLocation | None:
        """The xorb's chunk byte offsets and URL (gitxet servers), or None. Threads asking
        for one xorb at once (a read-ahead window's fetches) share one request."""
        asked = time.monotonic()

        def cached() -> tuple[bool, p.XorbLocation | None]:
            with self._lock:
                hit = self._locations.get(xorb_hash)
                if (
                    hit is not None
                    and asked - hit[0] < URL_TTL
                    and (not refresh or hit[0] >= asked)
                ):
                    return True, hit[1]  # a refresh takes a location asked after its own
                return self._no_locations, None

        done, loc = cached()
        if done:
            return loc

        def ask() -> p.XorbLocation | None:
            done, loc = cached()  # a flight that just ended may have brought it
            return loc if done else self._ask_location(xorb_hash)

        return self._location_flights.run((xorb_hash, refresh), ask)

    def _ask_location(self, xorb_hash: bytes) -> p.XorbLocation | None:
        try:
            loc = self._call(lambda c: c.xorb_location(xorb_hash))
        except XorbNotFoundError:
            # a server that answered locations before does not store this xorb; one that
            # never did is not a gitxet server (or an old one): use reconstruction entries
            with self._lock:
                if not self._locations_ok:
                    self._no_locations = True
            return None
        with self._lock:
            known = self._layouts.get(xorb_hash)
        if known is not None and loc.chunk_hashes != known.chunk_hashes:
            raise IntegrityError("xorb", to_hex(xorb_hash), "the server's layout disagrees")
        with self._lock:
            self._locations.put(xorb_hash, (time.monotonic(), loc))
            self._locations_ok = True
        return loc

    def _entry(self, xorb_hash: bytes, cs: int, ce: int, refresh: bool) -> p.FetchInfo:
        """A reconstruction fetch entry holding chunk ``cs`` (any Xet server)."""
        with self._lock:
            cached = self._urls.get(xorb_hash)
            fhash = self._xorb_file.get(xorb_hash)
        if cached is None or refresh or time.monotonic() - cached[0] >= URL_TTL:
            if fhash is None:
                raise XorbNotFoundError(to_hex(xorb_hash))
            rec = self._call(lambda c: c.get_reconstruction(fhash))
            now = time.monotonic()
            with self._lock:
                for xhex, infos in rec.fetch.items():
                    self._urls.put(from_hex(xhex), (now, list(infos)))
                cached = self._urls.get(xorb_hash)
        entries = cached[1] if cached is not None else []
        entry = next((e for e in entries if e.chunk_start <= cs < e.chunk_end), None)
        if entry is None:
            raise XorbNotFoundError(to_hex(xorb_hash))
        return entry


class HttpCASRemote:
    """A :class:`~gitxet.data.transfer.CASRemote` for a CAS server (push side), which also
    offers a :class:`RemoteChunkSource` for reads. With ``reads`` (a cache tier's client)
    file data is read through the tier, falling back to ``client`` when the tier is down;
    everything else (uploads, presence, shards for fetch) goes to ``client``."""

    def __init__(
        self,
        client: CASClient,
        cache: NodeCache,
        shard_dir: str,
        *,
        max_window: int = MAX_WINDOW,
        reads: CASClient | None = None,
    ) -> None:
        self.name = client.endpoint
        self.client = client
        self.reads = reads
        self.cache = cache
        self.shard_dir = shard_dir
        self.max_window = max_window
        self._source: RemoteChunkSource | None = None
        self._source_lock = threading.Lock()

    def close(self) -> None:
        """At the end of its use: stop its chunk source's fetches and close its clients'
        connections (they cannot send afterwards)."""
        if self._source is not None:
            self._source.close()
        for client in (self.reads, self.client):
            if client is not None:
                client.close()

    def has_xorb(self, xorb_hash: bytes) -> bool:
        return self.client.has_xorb(xorb_hash)

    def upload_xorb(self, xorb_hash: bytes, body: bytes) -> bool:
        return self.client.upload_xorb(xorb_hash, body)

    def upload_shard(self, data: bytes) -> None:
        self.client.upload_shard(data)

    def shards_for_file(self, file_hash: bytes) -> list[bytes]:
        return self.client.shards_for_file(file_hash)

    def missing_files(self, file_hashes: Sequence[bytes]) -> set[bytes]:
        """The files the server cannot serve: one presence request per 10,000 files (fsck,
        push checks) instead of a shard download per file."""
        return self.client.missing_files(file_hashes)

    def has_file(self, file_hash: bytes) -> bool:
        return self.client.has_file(file_hash)

    def download_xorb(self, xorb_hash: bytes) -> memoryview:
        return self.client.download_xorb(xorb_hash)

    def chunk_source(self) -> RemoteChunkSource:
        """The one chunk source of this remote: what one thread describes, another finds
        (two made at once by a checkout's first smudges, each on its own thread, had one
        thread's batch of descriptions unseen by the other's reads: a GET per file)."""
        with self._source_lock:
            return self._make_source()

    def _make_source(self) -> RemoteChunkSource:
        if self._source is None:
            if self.reads is not None:
                self._source = RemoteChunkSource(
                    self.reads,
                    self.cache,
                    self.shard_dir,
                    max_window=self.max_window,
                    fallback=self.client,
                )
            else:
                self._source = RemoteChunkSource(
                    self.client, self.cache, self.shard_dir, max_window=self.max_window
                )
        return self._source

    def tier_source(self) -> RemoteChunkSource | None:
        """A source reading through the cache tier only, without falling back to the
        origin (what fills the tier: ``git xet warmup --cas-url``); None without a tier."""
        if self.reads is None:
            return None
        return RemoteChunkSource(self.reads, self.cache, self.shard_dir, max_window=0)


def _endpoint_record(root: str, url: str) -> str:
    key = hashlib.sha256(strip_credentials(url).encode()).hexdigest()[:24]
    return os.path.join(root, "endpoints", key + ".json")


def node_cache_dir(cache_root: str) -> str:
    """Where the node cache lives under a cache root (``--cache-dir``)."""
    return os.path.join(cache_root, "ranges")


def node_cache_bytes(cache_root: str) -> int:
    """Bytes the node cache under a cache root holds (read from its index: O(1))."""
    return cache_total(node_cache_dir(cache_root))


_caches: dict[tuple[str, int], NodeCache] = {}
_caches_lock = threading.Lock()


def open_node_cache(cache_root: str, max_bytes: int) -> NodeCache:
    """The process's node cache under ``cache_root`` (one per root and cap)."""
    key = (os.path.abspath(cache_root), max_bytes)
    with _caches_lock:
        cache = _caches.get(key)
        if cache is None:
            _drop_old_layout(cache_root)
            cache = _caches[key] = NodeCache(node_cache_dir(cache_root), max_bytes)
        return cache


def _drop_old_layout(cache_root: str) -> None:
    """Delete, in the background, the one-file-per-chunk cache of earlier versions."""
    old = os.path.join(cache_root, "chunks")
    if os.path.isdir(old):
        with contextlib.suppress(OSError):
            os.rename(old, f"{old}.old-{os.getpid()}")
    with contextlib.suppress(OSError):
        doomed = [n for n in os.listdir(cache_root) if n.startswith("chunks.old-")]
        for name in doomed:
            threading.Thread(
                target=shutil.rmtree,
                args=(os.path.join(cache_root, name),),
                kwargs={"ignore_errors": True},
                name="gitxet-old-cache",
                daemon=True,
            ).start()


def http_remote_factory(
    root: str,
    max_bytes: int,
    *,
    offline: bool = False,
    token: str | None = None,
    token_lookup: Callable[[str], str | None] | None = None,
    read_ahead: int = MAX_WINDOW,
    cas_url: str | None = None,
    rotating: bool = False,
    tier_timeout: float = DEFAULT_TIER_TIMEOUT,
) -> Callable[[str], HttpCASRemote]:
    """Build the CAS remote of an http(s) git URL: discovery, token, the shared node cache
    under ``root``. Offline, the endpoint found by an earlier online use is reused.
    ``read_ahead`` is the largest read-ahead window of sequential readers; ``cas_url`` a
    cache tier file data is read through (with the same token; the origin is the
    fallback), which may stay silent ``tier_timeout`` seconds before it is taken as down (the
    origin's client keeps its longer default). ``rotating``: ``token_lookup`` may answer
    differently over time (a token file), so it is asked before every request instead of
    once."""

    def make(url: str) -> HttpCASRemote:
        from gitxet.remote.client import discover

        tok = token or (token_lookup(url) if token_lookup is not None else None)
        record = _endpoint_record(root, url)
        if offline:
            try:
                with open(record, encoding="utf-8") as f:
                    endpoint = json.load(f)["cas_url"]
            except (OSError, ValueError, KeyError):
                raise CacheMissError(
                    f"{url}: never used online, nothing cached (offline)"
                ) from None
        else:
            found = discover(url, token=tok)
            endpoint = found.cas_url
            tok = tok or found.access_token
            _keep(record, json.dumps({"cas_url": endpoint}).encode())
        live: TokenSource = tok
        if rotating and token is None and token_lookup is not None:
            # a token file: looked up before every request (a stat unless it changed), so
            # a rotated token is used at once and a revoked one never again
            first = tok

            def live_token() -> str | None:
                return token_lookup(url) or first

            live = live_token
        client = CASClient(endpoint, live)
        reads = None
        if cas_url and not offline:
            reads = CASClient(cas_url, live, timeout=tier_timeout, retry=TIER_ATTEMPTS)
        cache = open_node_cache(root, max_bytes)
        remote = HttpCASRemote(
            client, cache, os.path.join(root, "shards"), max_window=read_ahead, reads=reads
        )
        if offline:
            remote.chunk_source().offline = True
        return remote

    return make
