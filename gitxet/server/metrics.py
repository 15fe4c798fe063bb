"""Prometheus metrics of ``git xet serve``: requests by operation and status, their latency
and bytes (``prometheus_client``), served on their own address (``--metrics ADDR``).

The operation is a fixed set derived from the route (never the raw path, which holds
repository names and hashes): ``git-upload-pack`` is a clone or fetch, ``git-receive-pack``
a push, ``info-refs`` their first request; the CAS routes are named after the API.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client import start_http_server as _start_http_server

from gitxet.errors import ConfigError
from gitxet.settings import parse_address

PREFIX = "gitxet_server"

_CAS_OPS = {
    "reconstructions": "reconstruction",
    "xorbs": "xorb-upload",
    "xorb-grants": "xorb-grant",
    "xorb-commits": "xorb-commit",
    "xorb-upload": "xorb-upload",
    "shards": "shard-upload",
    "shard": "shard-upload",
    "chunks": "dedup-query",
    "file-shards": "file-shard",
    "file-presence": "file-presence",
    "xorb-locations": "xorb-location",
    "xorb-data": "xorb-data",
    "healthz": "healthz",
}


def classify(path: str) -> str:
    """The operation a request path names (a small fixed set, for metric labels)."""
    if path.endswith("/git-upload-pack"):
        return "git-upload-pack"
    if path.endswith("/git-receive-pack"):
        return "git-receive-pack"
    if path.endswith("/info/refs"):
        return "info-refs"
    if path.endswith("/info/xet"):
        return "info-xet"
    parts = [p for p in path.split("/") if p]
    if parts == ["v1", "file-shards"]:
        return "file-shards"  # the blocks of many files (POST), not one file's shard
    for part in parts[:2]:
        if part in _CAS_OPS:
            return _CAS_OPS[part]
    return "other"


class ServerMetrics:
    """Counters of one server process, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests", "Requests by operation and status", ["op", "status"], registry=r
        )
        self.seconds = Histogram(
            f"{PREFIX}_request_seconds", "Request latency by operation", ["op"], registry=r
        )
        self.sent = Counter(
            f"{PREFIX}_response_bytes", "Response body bytes by operation", ["op"], registry=r
        )

    def observe(self, path: str, status: int, seconds: float, nbytes: int) -> None:
        """Count one finished request."""
        op = classify(path)
        self.requests.labels(op=op, status=str(status)).inc()
        self.seconds.labels(op=op).observe(seconds)
        self.sent.labels(op=op).inc(nbytes)

    def serve(self, address: str) -> Any:
        """Start ``/metrics`` on ``address`` (a daemon thread); returns the HTTP server.

        Raises:
            ConfigError: a bad address, or it cannot be bound.
        """
        host, port = parse_address(address)
        try:
            server, _thread = _start_http_server(port, host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {address}: {exc}") from None
        return server
