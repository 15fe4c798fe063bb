"""Prometheus metrics of a mount daemon, through ``prometheus_client``.

Every FUSE daemon keeps a :class:`MountMetrics`: the adapter counts reads (bytes, outcome,
in flight) and errors; the chunk source's own counters (node cache hits, misses and bytes,
bytes fetched from the server) are read at collection time, and each fetch's latency goes
into a histogram. The numbers leave the process two ways:

* ``--metrics ADDR``: an HTTP endpoint (``/metrics``, Prometheus text format) on ``ADDR``;
* always: a text file beside the daemon's log, rewritten every few seconds when something
  changed (node_exporter's textfile format, so one node exporter can publish every mount
  of a node), which ``git xet mounts`` reads for its one-line summary.

Counters start at zero in every serving process (a failover or upgrade is a counter
reset, which Prometheus' ``rate()`` handles).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, write_to_textfile
from prometheus_client import start_http_server as _start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from gitxet.errors import ConfigError, MountError
from gitxet.settings import parse_address

log = logging.getLogger(__name__)

PREFIX = "gitxet_mount"
WRITE_INTERVAL = 2.0  # seconds between rewrites of the metrics file (when it changed)
_FETCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _CacheStats(Protocol):
    hits: int
    misses: int
    hit_bytes: int
    stored_bytes: int

    @property
    def total_bytes(self) -> int: ...


class _Source(Protocol):
    """What is read of a remote chunk source (``gitxet.data.remote_source``)."""

    cache: _CacheStats
    fetched_bytes: int
    on_fetch: Callable[[int, float], None] | None


class MountMetrics:
    """The counters of one mount daemon, in their own registry."""

    def __init__(self, mountpoint: str, commit: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.read_bytes = Counter(
            f"{PREFIX}_read_bytes", "Bytes returned to FUSE read requests", registry=r
        )
        self.reads = Counter(
            f"{PREFIX}_reads", "FUSE read requests by outcome", ["outcome"], registry=r
        )
        self._ok = self.reads.labels(outcome="ok")
        self._failed = self.reads.labels(outcome="error")
        self.errors = Counter(
            f"{PREFIX}_errors", "Requests answered with an error, by operation", ["op"], registry=r
        )
        self.in_flight = Gauge(
            f"{PREFIX}_requests_in_flight", "FUSE read requests being served", registry=r
        )
        self.fetch_seconds = Histogram(
            f"{PREFIX}_fetch_seconds",
            "Latency of one ranged fetch from the server",
            buckets=_FETCH_BUCKETS,
            registry=r,
        )
        self._info = Gauge(
            f"{PREFIX}_info", "The mount this daemon serves", ["mountpoint", "commit"], registry=r
        )
        self.mountpoint = mountpoint
        self.serving(commit)
        self._source: _Source | None = None
        self._events = 0  # bumped by every count (approximate under threads: only a hint)
        r.register(_SourceCollector(self))

    def serving(self, commit: str) -> None:
        """The commit served now (a watched mount switches)."""
        self._info.clear()
        self._info.labels(mountpoint=self.mountpoint, commit=commit).set(1)

    def watch_source(self, source: object) -> None:
        """Report a remote chunk source's cache and fetch counters (others are ignored)."""
        if hasattr(source, "cache") and hasattr(source, "fetched_bytes"):
            src: _Source = source  # type: ignore[assignment]  # checked just above
            self._source = src
            src.on_fetch = self._fetched

    def _fetched(self, nbytes: int, seconds: float) -> None:
        self.fetch_seconds.observe(seconds)

    @contextlib.contextmanager
    def read(self) -> Iterator[Callable[[int], None]]:
        """Count one read: ``with m.read() as done: ...; done(len(data))``; an exception
        leaving the block counts as an error."""
        self.in_flight.inc()
        try:
            yield self._read_done
        except BaseException:
            self._failed.inc()
            self.errors.labels(op="read").inc()
            self._events += 1
            raise
        finally:
            self.in_flight.dec()

    def _read_done(self, nbytes: int) -> None:
        self._ok.inc()
        self.read_bytes.inc(nbytes)
        self._events += 1

    #: count ``nbytes`` served without a read request (stored into the page cache at open)
    served = _read_done

    def error(self, op: str) -> None:
        """Count a request of ``op`` answered with an error."""
        self.errors.labels(op=op).inc()
        self._events += 1

    def snapshot(self) -> tuple[int, ...]:
        """Values that change when anything is counted (to skip rewriting an unchanged file)."""
        src = self._source
        extra: tuple[int, ...] = ()
        if src is not None:
            extra = (src.fetched_bytes, src.cache.hits, src.cache.misses)
        return (self._events, *extra)

    def serve(self, address: str) -> Any:
        """Start the ``/metrics`` endpoint on ``address`` (a daemon thread); returns the
        server (``shutdown()`` stops it). Raises :class:`MountError` when it cannot bind."""
        try:
            host, port = parse_address(address)
        except ConfigError as exc:
            raise MountError(address, str(exc)) from None
        try:
            server, _thread = _start_http_server(port, host, registry=self.registry)
        except OSError as exc:
            raise MountError(address, f"cannot serve metrics there: {exc}") from None
        return server

    def write_periodically(self, path: str, stop: threading.Event) -> threading.Thread:
        """Rewrite ``path`` every :data:`WRITE_INTERVAL` seconds while something changes,
        and once more when ``stop`` is set; removes the file when done."""

        def loop() -> None:
            last: tuple[float, ...] | None = None
            while True:
                stopping = stop.wait(WRITE_INTERVAL)
                now = self.snapshot()
                if now != last:
                    try:
                        write_to_textfile(path, self.registry)
                        last = now
                    except OSError as exc:
                        log.debug("cannot write %s: %s", path, exc)
                if stopping:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    return

        with contextlib.suppress(OSError):
            write_to_textfile(path, self.registry)
        t = threading.Thread(target=loop, name="gitxet-metrics-file", daemon=True)
        t.start()
        return t


class _SourceCollector:
    """Reads the chunk source's counters at collection time (they live in the data layer,
    which knows nothing of Prometheus)."""

    def __init__(self, metrics: MountMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        src = self._metrics._source
        if src is None:
            return
        cache = src.cache
        for name, doc, value in (
            ("cache_hits", "Reads served from the node cache", cache.hits),
            ("cache_misses", "Reads the node cache could not serve", cache.misses),
            ("cache_hit_bytes", "Bytes served from the node cache", cache.hit_bytes),
            ("cache_stored_bytes", "Bytes this daemon cached", cache.stored_bytes),
            ("fetched_bytes", "Decoded bytes fetched from the server", src.fetched_bytes),
        ):
            yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)
        yield GaugeMetricFamily(
            f"{PREFIX}_cache_bytes", "Bytes in the node cache (all processes)", cache.total_bytes
        )


@dataclass(frozen=True, slots=True)
class Summary:
    """The numbers ``git xet mounts`` shows for a mount."""

    read_bytes: float
    reads: float
    read_errors: float
    cache_hits: float
    cache_misses: float
    fetched_bytes: float


def read_summary(text: str) -> Summary:
    """A :class:`Summary` from the Prometheus text a daemon wrote or served."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if sample.labels.get("outcome"):
                key += "/" + sample.labels["outcome"]
            values[key] = values.get(key, 0.0) + sample.value
    p = PREFIX
    return Summary(
        read_bytes=values.get(f"{p}_read_bytes_total", 0.0),
        reads=values.get(f"{p}_reads_total/ok", 0.0) + values.get(f"{p}_reads_total/error", 0.0),
        read_errors=values.get(f"{p}_reads_total/error", 0.0),
        cache_hits=values.get(f"{p}_cache_hits_total", 0.0),
        cache_misses=values.get(f"{p}_cache_misses_total", 0.0),
        fetched_bytes=values.get(f"{p}_fetched_bytes_total", 0.0),
    )
