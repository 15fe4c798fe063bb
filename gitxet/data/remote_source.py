"""Reading files from a CAS server: a :class:`ChunkSource` over HTTP with an on-disk cache.

A file's description comes from the server's file shard (its terms, plus the chunk hashes
and sizes of every xorb it uses), so every chunk fetched is verified against its hash and
the reader checks the whole file against its file hash before serving a byte. Chunks are
fetched one fetch entry of the reconstruction at a time (a run of chunks the server names
with one URL and byte range), decoded, verified, and kept in :class:`DiskChunkCache`, which
all mounts, fsspec readers and checkouts on a machine can share (``--cache-dir``): a chunk
that any of them fetched is never fetched again, until LRU eviction makes room.

``offline=True`` never touches the network: what is not cached raises
:class:`CacheMissError`, so a pinned, warmed dataset is served without a server.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gitxet.errors import (
    FileNotFoundInCASError,
    FormatError,
    GitxetError,
    IntegrityError,
    RemoteError,
    XorbNotFoundError,
)
from gitxet.formats import shard as shardfmt
from gitxet.formats import xorb as xorbfmt
from gitxet.hashing import chunk_hash, from_hex, is_hex, merkle_root, to_hex
from gitxet.remote import protocol as p
from gitxet.remote.client import CASClient
from gitxet.settings import DEFAULT_CACHE_BYTES, DEFAULT_PREFETCH_BYTES, strip_credentials
from gitxet.util.atomic import atomic_write
from gitxet.util.lru import LRUCache

# Fetch URLs are signed and expire; re-ask for them well before a typical expiry.
URL_TTL = 300.0
# Decoded bytes fetched past the chunk a read needs (one request instead of many).
READ_AHEAD = DEFAULT_PREFETCH_BYTES
#: xorbs whose fetch URLs, locations and fetch locks are remembered (an LRU each)
_MAX_XORB_ENTRIES = 16384


class CacheMissError(GitxetError):
    """Offline, and the data is not in the cache."""


@dataclass(frozen=True, slots=True)
class RemoteLayout:
    """Chunk hashes and decoded offsets of a xorb, from a file shard (verified)."""

    chunk_hashes: tuple[bytes, ...]
    data_offsets: tuple[int, ...]


def chunk_cache_dir(cache_root: str) -> str:
    """Where the shared chunk cache lives under a cache root (``--cache-dir``)."""
    return os.path.join(cache_root, "chunks")


def chunk_cache_bytes(cache_root: str) -> int:
    """Bytes of chunks cached under a cache root (0 when there is no cache yet)."""
    return _tree_bytes(os.path.join(chunk_cache_dir(cache_root), "chunks"))


def _tree_bytes(top: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(top):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, f)).st_size
    return total


class DiskChunkCache:
    """Verified decoded chunks on disk, LRU-evicted to ``max_bytes``; safe across processes.

    Layout: ``<root>/chunks/<xx>/<xorb hex>/<index>`` and ``<root>/shards/<file hex>``.
    Files are written atomically; a reader re-hashes a chunk before trusting it, so a
    damaged cache file is dropped and fetched again, never served.
    """

    def __init__(self, root: str, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.root = os.path.abspath(root)
        self.max_bytes = max_bytes
        os.makedirs(os.path.join(self.root, "chunks"), exist_ok=True)
        os.makedirs(os.path.join(self.root, "shards"), exist_ok=True)
        self._lock = threading.Lock()
        self._approx = self._scan_size()
        self._stats_lock = threading.Lock()  # readers on many threads count here
        self.hits = 0
        self.misses = 0
        self.fetched_bytes = 0  # decoded bytes of the verified chunks fetched from a server

    def _count(self, *, hits: int = 0, misses: int = 0, fetched: int = 0) -> None:
        with self._stats_lock:
            self.hits += hits
            self.misses += misses
            self.fetched_bytes += fetched

    def note_fetched(self, chunks: Sequence[bytes]) -> None:
        """Count chunks fetched from a server (their decoded bytes, whatever the wire form)."""
        self._count(fetched=sum(len(c) for c in chunks))

    def _chunk_path(self, xorb: bytes, idx: int) -> str:
        hx = to_hex(xorb)
        return os.path.join(self.root, "chunks", hx[:2], hx, str(idx))

    def _scan_size(self) -> int:
        return _tree_bytes(os.path.join(self.root, "chunks"))

    @property
    def size(self) -> int:
        """Approximate bytes held (exact after a scan)."""
        return self._approx

    def get(self, xorb: bytes, idx: int, expected_hash: bytes) -> bytes | None:
        path = self._chunk_path(xorb, idx)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            self._count(misses=1)
            return None
        if chunk_hash(data) != expected_hash:
            with contextlib.suppress(OSError):
                os.unlink(path)
            self._count(misses=1)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # LRU by mtime
        self._count(hits=1)
        return data

    def put(self, xorb: bytes, idx: int, data: bytes) -> None:
        path = self._chunk_path(xorb, idx)
        if os.path.exists(path):
            return
        atomic_write(path, data, durable=False)
        with self._lock:
            self._approx += len(data)
            over = self._approx > self.max_bytes
        if over:
            self.evict()

    def evict(self, target: float = 0.9) -> int:
        """Delete least recently used chunks until the cache is under ``target`` of its cap."""
        entries: list[tuple[float, int, str]] = []
        for dirpath, _, files in os.walk(os.path.join(self.root, "chunks")):
            for f in files:
                p = os.path.join(dirpath, f)
                with contextlib.suppress(OSError):
                    st = os.stat(p)
                    entries.append((st.st_mtime, st.st_size, p))
        total = sum(e[1] for e in entries)
        goal = int(self.max_bytes * target)
        freed = 0
        for _, size, p in sorted(entries):
            if total - freed <= goal:
                break
            with contextlib.suppress(OSError):
                os.unlink(p)
                freed += size
        with self._lock:
            self._approx = total - freed
        return freed

    def get_shard(self, file_hash: bytes) -> bytes | None:
        try:
            with open(os.path.join(self.root, "shards", to_hex(file_hash)), "rb") as f:
                return f.read()
        except OSError:
            return None

    def put_shard(self, file_hash: bytes, data: bytes) -> None:
        atomic_write(os.path.join(self.root, "shards", to_hex(file_hash)), data, durable=False)

    def cached_shards(self) -> list[bytes]:
        d = os.path.join(self.root, "shards")
        return [from_hex(n) for n in sorted(os.listdir(d)) if is_hex(n)]


class RemoteChunkSource:
    """A :class:`~gitxet.data.reconstruct.ChunkSource` reading from a CAS server."""

    is_local = False

    def __init__(
        self,
        client: CASClient,
        cache: DiskChunkCache,
        *,
        offline: bool = False,
        read_ahead: int = READ_AHEAD,
    ) -> None:
        self.client = client
        self.cache = cache
        self.offline = offline
        self.read_ahead = max(0, read_ahead)
        self._lock = threading.Lock()
        self._files: dict[bytes, shardfmt.FileInfo] = {}
        self._layouts: dict[bytes, RemoteLayout] = {}
        self._xorb_file: dict[bytes, bytes] = {}  # a file whose reconstruction names the xorb
        # per xorb, bounded: each is fetched again when it is needed after an eviction
        self._urls: LRUCache[bytes, tuple[float, list[tuple[int, int, str, int, int]]]] = LRUCache(
            _MAX_XORB_ENTRIES
        )
        self._fetch_locks: LRUCache[bytes, threading.Lock] = LRUCache(_MAX_XORB_ENTRIES)
        self._locations: LRUCache[bytes, tuple[float, p.XorbLocation]] = LRUCache(_MAX_XORB_ENTRIES)
        self._no_locations = False

    # ---- descriptions ------------------------------------------------------------------

    def file_info(self, file_hash: bytes) -> shardfmt.FileInfo | None:
        with self._lock:
            info = self._files.get(file_hash)
        if info is not None:
            return info
        data = self.cache.get_shard(file_hash)
        if data is None:
            if self.offline:
                raise CacheMissError(f"file {to_hex(file_hash)} is not in the cache (offline)")
            try:
                shard = self.client.get_file_shard(file_hash)
            except FileNotFoundInCASError:
                return None
            data = shardfmt.serialize_shard(shard)
            self.cache.put_shard(file_hash, data)
        else:
            try:
                shard = shardfmt.parse_shard(data)
            except FormatError:
                return None
        return self._register(file_hash, shard)

    def _register(self, file_hash: bytes, shard: shardfmt.Shard) -> shardfmt.FileInfo | None:
        info = next((f for f in shard.files if f.file_hash == file_hash), None)
        if info is None:
            return None
        layouts: dict[bytes, RemoteLayout] = {}
        for x in shard.xorbs:
            hashes = tuple(c.hash for c in x.chunks)
            sizes = [c.size for c in x.chunks]
            if merkle_root(list(zip(hashes, sizes, strict=True))) != x.xorb_hash:
                raise IntegrityError(
                    "xorb", to_hex(x.xorb_hash), "chunk list from the server does not hash to it"
                )
            offs = [0]
            for s in sizes:
                offs.append(offs[-1] + s)
            layouts[x.xorb_hash] = RemoteLayout(hashes, tuple(offs))
        with self._lock:
            self._files[file_hash] = info
            self._layouts.update(layouts)
            for t in info.terms:
                self._xorb_file.setdefault(t.xorb_hash, file_hash)
        return info

    def layout(self, xorb_hash: bytes) -> RemoteLayout:
        with self._lock:
            lay = self._layouts.get(xorb_hash)
        if lay is None:
            raise XorbNotFoundError(to_hex(xorb_hash))
        return lay

    # ---- data --------------------------------------------------------------------------

    def read_chunks(self, xorb_hash: bytes, start: int, end: int) -> list[bytes]:
        lay = self.layout(xorb_hash)
        out: list[bytes | None] = [
            self.cache.get(xorb_hash, i, lay.chunk_hashes[i]) for i in range(start, end)
        ]
        if all(c is not None for c in out):
            return [c for c in out if c is not None]
        if self.offline:
            raise CacheMissError(
                f"xorb {to_hex(xorb_hash)} chunks {start}..{end} are not cached (offline)"
            )
        with self._lock:
            flock = self._fetch_locks.setdefault(xorb_hash, threading.Lock())
        with flock:  # one fetch per xorb at a time: concurrent readers wait and hit the cache
            i = 0
            while i < len(out):
                if out[i] is not None:
                    i += 1
                    continue
                got = self._fetch(xorb_hash, lay, start + i)
                for k, c in got.items():
                    if start <= k < end:
                        out[k - start] = c
                if out[i] is None:
                    raise XorbNotFoundError(to_hex(xorb_hash))
        return [c for c in out if c is not None]

    def _entries(self, xorb_hash: bytes, refresh: bool) -> list[tuple[int, int, str, int, int]]:
        with self._lock:
            cached = self._urls.get(xorb_hash)
            fhash = self._xorb_file.get(xorb_hash)
        if cached is not None and not refresh and time.monotonic() - cached[0] < URL_TTL:
            return cached[1]
        if fhash is None:
            raise XorbNotFoundError(to_hex(xorb_hash))
        rec = self.client.get_reconstruction(fhash)
        now = time.monotonic()
        fresh: dict[bytes, list[tuple[int, int, str, int, int]]] = {}
        for xhex, infos in rec.fetch.items():
            fresh[from_hex(xhex)] = [
                (fi.chunk_start, fi.chunk_end, fi.url, fi.byte_start, fi.byte_end) for fi in infos
            ]
        with self._lock:
            for x, entries in fresh.items():
                self._urls.put(x, (now, entries))
        return fresh.get(xorb_hash, [])

    def _location(self, xorb_hash: bytes, refresh: bool) -> p.XorbLocation | None:
        """The xorb's exact chunk byte offsets and URL (gitxet servers), or None."""
        with self._lock:
            cached = self._locations.get(xorb_hash)
        if cached is not None and not refresh and time.monotonic() - cached[0] < URL_TTL:
            return cached[1]
        if self._no_locations:
            return None
        try:
            loc = self.client.xorb_location(xorb_hash)
        except XorbNotFoundError:
            # not a gitxet server (or an old one): use reconstruction fetch entries
            self._no_locations = True
            return None
        with self._lock:
            self._locations.put(xorb_hash, (time.monotonic(), loc))
        return loc

    def _fetch(self, xorb_hash: bytes, lay: RemoteLayout, idx: int) -> dict[int, bytes]:
        """Fetch chunks from ``idx`` on (a read-ahead window); verify and cache them."""
        for attempt in range(2):
            loc = self._location(xorb_hash, refresh=attempt > 0)
            if loc is None:
                return self._fetch_entry(xorb_hash, lay, idx)
            # read ahead: small random reads cost a round trip each, big ones do not
            offs = loc.data_offsets
            end = idx + 1
            while end < loc.num_chunks and offs[end] - offs[idx] < self.read_ahead:
                end += 1
            try:
                chunks = self.client.read_xorb_chunks(xorb_hash, idx, end, loc)
            except RemoteError as e:
                if e.status == 403 and attempt == 0:
                    continue  # the signed URL expired
                raise
            got: dict[int, bytes] = {}
            for k, c in enumerate(chunks, start=idx):
                if chunk_hash(c) != lay.chunk_hashes[k]:
                    raise IntegrityError("xorb", to_hex(xorb_hash), f"chunk {k} does not match")
                self.cache.put(xorb_hash, k, c)
                got[k] = c
            self.cache.note_fetched(chunks)
            return got
        raise XorbNotFoundError(to_hex(xorb_hash))

    def _fetch_entry(self, xorb_hash: bytes, lay: RemoteLayout, idx: int) -> dict[int, bytes]:
        """Fetch the reconstruction entry holding chunk ``idx``; verify and cache it all."""
        hx = to_hex(xorb_hash)
        for attempt in range(2):
            entries = self._entries(xorb_hash, refresh=attempt > 0)
            entry = next((e for e in entries if e[0] <= idx < e[1]), None)
            if entry is None:
                continue
            cs, ce, url, bs, be = entry
            try:
                raw = self.client.fetch_xorb_range(url, bs, be)
            except RemoteError as e:
                if e.status == 403 and attempt == 0:
                    continue  # the signed URL expired: ask for fresh ones
                raise
            try:
                chunks = xorbfmt.decode_chunks(raw, expected_count=ce - cs)
            except FormatError as e:
                raise IntegrityError(
                    "xorb", hx, f"chunks {cs}..{ce} unreadable ({e.reason})"
                ) from None
            got: dict[int, bytes] = {}
            for k, c in enumerate(chunks, start=cs):
                if chunk_hash(c) != lay.chunk_hashes[k]:
                    raise IntegrityError(
                        "xorb", hx, f"chunk {k} from the server does not match its hash"
                    )
                self.cache.put(xorb_hash, k, c)
                got[k] = c
            self.cache.note_fetched(chunks)
            return got
        raise XorbNotFoundError(hx)

    def warm(self, file_hashes: Sequence[bytes]) -> int:
        """Fetch and cache every chunk of the given files; returns the (decoded) bytes fetched."""
        before = self.cache.fetched_bytes
        for fhash in file_hashes:
            info = self.file_info(fhash)
            if info is None:
                raise FileNotFoundInCASError(to_hex(fhash))
            for t in info.terms:
                self.read_chunks(t.xorb_hash, t.chunk_start, t.chunk_end)
        return self.cache.fetched_bytes - before


class HttpCASRemote:
    """A :class:`~gitxet.data.transfer.CASRemote` for a CAS server (push side), which also
    offers a :class:`RemoteChunkSource` for reads."""

    def __init__(
        self, client: CASClient, cache: DiskChunkCache, *, read_ahead: int = READ_AHEAD
    ) -> None:
        self.name = client.endpoint
        self.client = client
        self.cache = cache
        self.read_ahead = read_ahead
        self._source: RemoteChunkSource | None = None

    def has_xorb(self, xorb_hash: bytes) -> bool:
        return self.client.has_xorb(xorb_hash)

    def upload_xorb(self, xorb_hash: bytes, body: bytes) -> bool:
        return self.client.upload_xorb(xorb_hash, body)

    def upload_shard(self, data: bytes) -> None:
        self.client.upload_shard(data)

    def shards_for_file(self, file_hash: bytes) -> list[bytes]:
        return self.client.shards_for_file(file_hash)

    def download_xorb(self, xorb_hash: bytes) -> bytes:
        return self.client.download_xorb(xorb_hash)

    def chunk_source(self) -> RemoteChunkSource:
        if self._source is None:
            self._source = RemoteChunkSource(self.client, self.cache, read_ahead=self.read_ahead)
        return self._source


def _endpoint_record(root: str, url: str) -> str:
    import hashlib

    key = hashlib.sha256(strip_credentials(url).encode()).hexdigest()[:24]
    return os.path.join(root, "endpoints", key + ".json")


def http_remote_factory(
    root: str,
    max_bytes: int,
    *,
    offline: bool = False,
    token: str | None = None,
    token_lookup: Callable[[str], str | None] | None = None,
    read_ahead: int = READ_AHEAD,
) -> Callable[[str], HttpCASRemote]:
    """Build the CAS remote of an http(s) git URL: discovery, token, the shared chunk cache
    under ``root``. Offline, the endpoint found by an earlier online use is reused."""

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
            atomic_write(record, json.dumps({"cas_url": endpoint}).encode(), durable=False)
        client = CASClient(endpoint, tok)
        cache = DiskChunkCache(chunk_cache_dir(root), max_bytes)
        remote = HttpCASRemote(client, cache, read_ahead=read_ahead)
        if offline:
            remote.chunk_source().offline = True
        return remote

    return make
