"""A read-through cache tier: gitxet's CAS read API in front of an origin CAS server.

``git xet serve --upstream ORIGIN --cache-dir D --cache-size S`` runs this instead of a
CAS of its own. Many nodes of a cluster read a dataset through one tier, and the origin
serves each byte about once, however many nodes read it:

* **Authorization stays with the origin.** Every request that names data (a
  reconstruction, a xorb location, a file shard, a presence or dedup query) is asked of the
  origin *with the client's own token*; the origin's 401/403 is the tier's answer. The tier
  holds no secret but the key it signs its own data URLs with.
* **Fetch URLs are the tier's.** The answers' data URLs are rewritten to the tier's own
  signed, expiring URLs, handed out only for xorbs the origin just let this client read.
* **Ranges are fetched once.** A range the tier lacks is fetched from the origin with one
  ranged GET (the origin's signed URL, learned from the answer that authorised it), every
  chunk verified against its hash, stored in the node cache
  (:class:`~gitxet.store.nodecache.NodeCache`, capped at ``--cache-size``, LRU), and served
  to every client waiting for it: concurrent misses of one range make one origin request
  (the fetch and single-flight logic is :class:`~gitxet.data.remote_source.RemoteChunkSource`,
  the same code every node reads with). Data that fails verification is never cached or
  served: the client gets ``502`` naming the xorb.
* **The tier serves xorbs in their plain framing.** The node cache holds decoded chunks, so
  the tier sends every chunk with scheme NONE (``formats.xorb.frame_plain``) and its
  answers give byte offsets in that framing (``formats.xorb.plain_offsets``). Chunk hashes,
  and so the xorb hash, do not depend on the framing; clients verify as they always do.
* **Writes are refused** (``405``): uploads go to the origin, which checks them. A tier that
  forwarded writes would be a second door to the origin's write path for no gain (each
  byte is written once; it is reads that fan out).

The origin must be a gitxet server (the tier needs ``/v1/xorb-locations`` to verify
chunks). Everything here is blocking; the app (``gitxet.server.tierapp``) runs it in
worker threads.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from gitxet.data.remote_source import RemoteChunkSource, open_node_cache
from gitxet.errors import (
    IntegrityError,
    RangeNotSatisfiableError,
    RemoteError,
)
from gitxet.formats.xorb import frame_plain, plain_offsets
from gitxet.hashing import from_hex, to_hex
from gitxet.remote import protocol as p
from gitxet.remote.client import CASClient, DataBuffer, transport_error
from gitxet.server.backends import LocalBackend
from gitxet.server.signing import KEY_OBJECT, UrlSigner, load_or_create_key
from gitxet.util.lru import LRUCache

__all__ = ["StaleUrlError", "TierService", "TierStats", "register_tier_metrics", "tier_signer"]

#: xorbs whose origin location (URL and layout) the tier remembers
MAX_KNOWN_XORBS = 16384
#: parallel range fetches from the origin
ORIGIN_WORKERS = 16


class StaleUrlError(RemoteError):
    """A tier data URL whose xorb the tier no longer knows how to fetch (a restart, or the
    origin's URL expired): the client should ask for a new location (answered 403)."""

    def __init__(self, xorb_hex: str) -> None:
        super().__init__(
            f"xorb {xorb_hex}: this data URL is no longer valid here; ask for a new location",
            403,
        )


@dataclass(frozen=True, slots=True)
class _Known:
    """What a client's authorised request taught the tier about a xorb."""

    origin: p.XorbLocation  # the origin's signed URL and byte offsets (verified layout)
    plain: tuple[int, ...]  # chunk offsets in the plain framing the tier serves


class TierStats:
    """The tier's counters (thread-safe); :meth:`snapshot` is what ``/v1/tier-stats`` shows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.hits = 0  # data requests served from the cache alone
        self.misses = 0  # data requests that needed (or waited for) an origin fetch
        self.origin_requests = 0  # ranged GETs of xorb data sent to the origin
        self.origin_bytes = 0  # xorb bytes received from the origin
        self.served_bytes = 0  # xorb bytes sent to clients
        self.refused = 0  # origin ranges refused because they failed verification

    def add(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self, cache_bytes: int, cache_cap: int) -> dict[str, int]:
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "origin_requests": self.origin_requests,
                "origin_bytes": self.origin_bytes,
                "served_bytes": self.served_bytes,
                "refused_ranges": self.refused,
                "cache_bytes": cache_bytes,
                "cache_cap_bytes": cache_cap,
            }


class _OriginData(CASClient):
    """The origin as the tier's chunk source sees it: xorb locations only from what clients'
    authorised requests brought (the tier has no token to ask with), data over the
    origin's signed URLs (counted)."""

    def __init__(self, endpoint: str, known: LRUCache[bytes, _Known], stats: TierStats) -> None:
        super().__init__(endpoint, None, max_parallel=ORIGIN_WORKERS)
        self._known = known
        self._stats = stats

    def xorb_location(self, xorb_hash: bytes) -> p.XorbLocation:
        k = self._known.get(xorb_hash)
        if k is None:
            raise StaleUrlError(to_hex(xorb_hash))
        return k.origin

    def fetch_xorb_range(
        self, url: str, start: int, end: int, into: DataBuffer | None = None
    ) -> DataBuffer:
        buf = super().fetch_xorb_range(url, start, end, into)
        self._stats.add(origin_requests=1, origin_bytes=len(buf))
        return buf


#: the tier's counters as Prometheus metrics ``gitxet_tier_<key>``: (key, help, kind)
_METRICS = (
    ("hits", "Data requests served from the tier's cache alone", "counter"),
    ("misses", "Data requests that waited for an origin fetch", "counter"),
    ("origin_requests", "Ranged GETs of xorb data sent to the origin", "counter"),
    ("origin_bytes", "Xorb bytes received from the origin", "counter"),
    ("served_bytes", "Xorb bytes sent to clients", "counter"),
    ("refused_ranges", "Origin ranges refused: they failed verification", "counter"),
    ("cache_bytes", "Bytes in the tier's cache", "gauge"),
    ("cache_cap_bytes", "Cap of the tier's cache", "gauge"),
)


class _TierCollector:
    """A ``prometheus_client`` collector reading the tier's counters when scraped."""

    def __init__(self, tier: TierService) -> None:
        self.tier = tier

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        doc = self.tier.stats_doc()
        for key, text, kind in _METRICS:
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            yield family(f"gitxet_tier_{key}", text, value=doc[key])


def register_tier_metrics(registry: Any, tier: TierService) -> None:
    """Publish the tier's counters (``gitxet_tier_*``) in a ``prometheus_client`` registry
    (the one ``--metrics ADDR`` serves)."""
    registry.register(_TierCollector(tier))


def tier_signer(cache_dir: str, ttl: int) -> UrlSigner:
    """The tier's URL signer; its key lives in ``<cache_dir>/meta`` (created once, readable
    by the tier's user only)."""
    key = load_or_create_key(LocalBackend(cache_dir))
    for path, mode in (
        (os.path.join(cache_dir, "meta"), 0o700),
        (os.path.join(cache_dir, KEY_OBJECT), 0o600),
    ):
        with contextlib.suppress(OSError):
            os.chmod(path, mode)
    return UrlSigner(key, ttl=ttl)


class TierService:
    """The tier's use cases over an origin CAS (see the module docstring).

    Calls that reach the origin's API take the client's token from :meth:`as_client`.
    """

    def __init__(
        self,
        upstream: str,
        cache_dir: str,
        cache_bytes: int,
        *,
        workers: int = ORIGIN_WORKERS,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.cache_dir = os.path.abspath(cache_dir)
        self._token: contextvars.ContextVar[str | None] = contextvars.ContextVar(
            "gitxet_tier_token", default=None
        )
        #: the origin's API, asked with each client's own token
        self.api = CASClient(self.upstream, lambda: self._token.get(), max_parallel=ORIGIN_WORKERS)
        self.stats = TierStats()
        self._known: LRUCache[bytes, _Known] = LRUCache(MAX_KNOWN_XORBS)
        self.cache = open_node_cache(self.cache_dir, cache_bytes)
        self._origin = _OriginData(self.upstream, self._known, self.stats)
        self.source = RemoteChunkSource(
            self._origin,
            self.cache,
            os.path.join(self.cache_dir, "shards"),
            workers=workers,
            has_locations=True,
        )
        self._lookups = ThreadPoolExecutor(8, thread_name_prefix="gitxet-tier-loc")

    def close(self) -> None:
        """Stop the fetch pools and close the origin connections."""
        self.source.close()
        self._lookups.shutdown(wait=False, cancel_futures=True)
        self.api.close()
        self._origin.close()

    @contextlib.contextmanager
    def as_client(self, token: str | None) -> Iterator[None]:
        """Requests to the origin's API made inside carry ``token`` (the client's)."""
        reset = self._token.set(token)
        try:
            yield
        finally:
            self._token.reset(reset)

    def stats_doc(self) -> dict[str, int]:
        """The counters, the cache's size and cap."""
        return self.stats.snapshot(self.cache.total_bytes, self.cache.max_bytes)

    # ---- answers that authorise (asked of the origin with the client's token) ------------

    def _learn(self, xorb_hash: bytes) -> _Known:
        """Ask the origin where a xorb is (with the client's token; the layout is checked
        against the xorb hash) and remember it for the data path."""
        loc = self.api.xorb_location(xorb_hash)
        known = _Known(loc, plain_offsets(loc.data_offsets))
        self._known.put(xorb_hash, known)
        return known

    def location(self, xorb_hash: bytes, url_for: Callable[[str], str]) -> p.XorbLocation:
        """The tier's location of a xorb: its own signed URL and plain byte offsets.

        Raises:
            AuthError: the origin refused the client's token.
            XorbNotFoundError: the origin does not store the xorb.
        """
        known = self._learn(xorb_hash)
        loc = known.origin
        return p.XorbLocation(
            loc.xorb_hex, url_for(loc.xorb_hex), loc.chunk_hashes, known.plain, loc.data_offsets
        )

    def reconstruction(
        self,
        file_hash: bytes,
        byte_range: tuple[int, int | None] | None,
        url_for: Callable[[str], str],
    ) -> p.Reconstruction:
        """The origin's reconstruction (asked with the client's token), its fetch entries
        pointing at the tier in the plain framing. ``byte_range`` is inclusive.

        Raises:
            AuthError, FileNotFoundInCASError, RemoteError: the origin's answer.
        """
        rng = None
        if byte_range is not None:
            a, b = byte_range
            rng = (a, None if b is None else b + 1)
        rec = self.api.get_reconstruction(file_hash, rng)
        wanted = [from_hex(x) for x in rec.fetch]
        # the origin's location of each xorb (in parallel, each with this client's token)
        ctx = contextvars.copy_context()
        futures = [self._lookups.submit(ctx.copy().run, self._learn, x) for x in wanted]
        knowns = {to_hex(x): f.result() for x, f in zip(wanted, futures, strict=True)}
        fetch: dict[str, list[p.FetchInfo]] = {}
        for hx, entries in rec.fetch.items():
            plain = knowns[hx].plain
            url = url_for(hx)
            out = fetch[hx] = []
            for e in entries:
                if not 0 <= e.chunk_start < e.chunk_end < len(plain):
                    raise RemoteError(
                        f"the origin's reconstruction of {to_hex(file_hash)} names chunks "
                        f"{e.chunk_start}..{e.chunk_end} outside xorb {hx}"
                    )
                cs, ce = e.chunk_start, e.chunk_end
                out.append(p.FetchInfo(cs, ce, url, plain[cs], plain[ce] - 1))
        return p.Reconstruction(rec.terms, fetch, rec.offset_into_first_range)

    def forward(
        self, method: str, path: str, *, body: bytes | None = None, query: str = ""
    ) -> tuple[int, bytes, str]:
        """Send a small read request to the origin's API as is, with the client's token:
        ``(status, body, content type)``. For answers the tier needs not understand (file
        shards, presence and dedup queries); the client verifies them as it would the
        origin's.

        Raises:
            RemoteError: the origin could not be reached.
        """
        url = self.upstream + path + (f"?{query}" if query else "")
        headers = {"User-Agent": "gitxet-tier"}
        token = self._token.get()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            r = self.api.http.request(method, url, headers=headers, content=body)
        except httpx.TransportError as e:
            raise transport_error("origin", self.upstream, e) from None
        return r.status_code, r.content, r.headers.get("content-type", p.OCTET)

    # ---- the data path (signed tier URLs; no token) --------------------------------------

    def data_size(self, xorb_hash: bytes) -> int:
        """Bytes of the xorb in the plain framing.

        Raises:
            StaleUrlError: the tier does not know the xorb (any more).
        """
        k = self._known.get(xorb_hash)
        if k is None:
            raise StaleUrlError(to_hex(xorb_hash))
        return k.plain[-1]

    def read(self, xorb_hash: bytes, start: int, end: int) -> Iterator[bytes | memoryview]:
        """Bytes ``[start, end]`` (inclusive, clamped) of a xorb in the plain framing, in
        pieces of about one aligned range each; every piece is fetched from the origin
        (once, verified, cached) when the cache lacks it. Raise before the first piece for a
        request that cannot be served.

        Raises:
            StaleUrlError: the tier does not know the xorb (any more).
            RangeNotSatisfiableError: ``start`` at or past the end.
        """
        k = self._known.get(xorb_hash)
        if k is None:
            raise StaleUrlError(to_hex(xorb_hash))
        plain = k.plain
        size = plain[-1]
        if start >= size:
            raise RangeNotSatisfiableError(f"xorb {to_hex(xorb_hash)}", size)
        end = min(end, size - 1)
        lay = self.source.layout(xorb_hash)
        c0 = bisect.bisect_right(plain, start) - 1
        c1 = bisect.bisect_left(plain, end + 1)
        spans = [(max(c0, a), min(c1, b)) for a, b in lay.unit_spans(c0, c1)]
        if len(spans) > 1:  # fetch the rest in parallel while the first is read
            offs = lay.data_offsets
            self.source.prefetch(xorb_hash, offs[spans[1][0]], offs[c1])
        return self._pieces(xorb_hash, lay.data_offsets, plain, spans, start, end)

    def _pieces(
        self,
        xorb_hash: bytes,
        offs: tuple[int, ...],
        plain: tuple[int, ...],
        spans: list[tuple[int, int]],
        start: int,
        end: int,
    ) -> Iterator[bytes | memoryview]:
        for a, b in spans:
            lo, hi = offs[a], offs[b]
            hit = self.cache.covers(xorb_hash, lo, hi)
            try:
                data = memoryview(self.source.fetch_range(xorb_hash, lo, hi, sequential=True))
            except IntegrityError:
                self.stats.add(refused=1, misses=1)
                raise
            chunks = [data[offs[i] - lo : offs[i + 1] - lo] for i in range(a, b)]
            framed = b"".join(frame_plain(chunks))
            cut_lo = max(start, plain[a]) - plain[a]
            cut_hi = min(end + 1, plain[b]) - plain[a]
            whole = (cut_lo, cut_hi) == (0, len(framed))
            piece = framed if whole else memoryview(framed)[cut_lo:cut_hi]  # no copy
            self.stats.add(served_bytes=len(piece), **({"hits": 1} if hit else {"misses": 1}))
            yield piece

    def forget(self, xorb_hash: bytes) -> None:
        """Drop what the tier knows of a xorb (its origin URL was refused)."""
        self._known.discard(xorb_hash)
