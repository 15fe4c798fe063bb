"""Connection-level limits uvicorn does not enforce: request heads, read timeouts, connections.

uvicorn's httptools protocol (what ``uvicorn[standard]`` runs) has no cap on the size or
number of request headers (a 10 MiB header is buffered whole), no timeout while a request
head or body trickles in (its keep-alive timer is cancelled by every byte received), and no
cap on connections (``limit_concurrency`` answers 503 to *requests* once that many
connections exist, so idle sockets lock everyone out). h11 only bounds the head size
(``h11_max_incomplete_event_size``, answered 400).

:func:`protocol_class` returns a subclass of uvicorn's httptools protocol that adds, per
server:

* **head limits**: at most ``max_header_bytes`` of request line + headers (the parser is
  never fed more; memory per connection stays at that size) and ``max_headers`` header
  lines, else ``431`` and the connection is closed after a short drain;
* **header timeout**: the whole head must arrive within ``header_timeout`` seconds of the
  connection opening (or of the request's first byte on a kept-alive connection), else
  ``408`` and close; a slowloris client is cut off then, however slowly it sends;
* **body timeout**: while a request body is being read, ``body_timeout`` seconds without a
  byte closes the connection (not counted while the server itself has paused reading);
* **connections**: at most ``max_connections`` at once. A new connection over the cap
  evicts the least recently active connection that has no request in flight (idle
  keep-alive sockets and half-sent heads); when every connection is busy it gets ``503``.
  So idle or slow connections can never lock a real client out.

The hooks used (``on_message_begin``, ``on_header``, ``on_headers_complete``, ``on_body``,
``on_message_complete``, ``on_response_complete``, ``data_received``) are the parser
callbacks and protocol methods of ``uvicorn.protocols.http.httptools_impl``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from gitxet.errors import ConfigError

__all__ = ["Limits", "protocol_class"]

log = logging.getLogger("gitxet.server.limits")

#: After refusing a request, read (and drop) at most this much of what the client is still
#: sending before closing, so it can read the refusal instead of a connection reset.
_DRAIN_BYTES = 1 << 20
_DRAIN_SECONDS = 1.0
#: Under attack the same refusal repeats per connection: say it once per this many seconds.
_LOG_EVERY = 10.0


class _QuietLog:
    """Warnings of one kind at most once per ``every`` seconds, with a count of the rest."""

    def __init__(self, every: float = _LOG_EVERY) -> None:
        self.every = every
        self.last: dict[str, float] = {}
        self.held: dict[str, int] = {}

    def warning(self, kind: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self.last.get(kind, -self.every) < self.every:
            self.held[kind] = self.held.get(kind, 0) + 1
            return
        self.last[kind] = now
        held = self.held.pop(kind, 0)
        if held:
            msg += f" (and {held} more like it in the last {self.every:g}s)"
        log.warning(msg, *args)


@dataclass(frozen=True)
class Limits:
    """What ``git xet serve`` allows one client; see the module docstring."""

    max_header_bytes: int = 64 << 10
    max_headers: int = 100
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    keep_alive_timeout: int = 30
    max_connections: int = 1000

    def __post_init__(self) -> None:
        if self.max_header_bytes < 1024:
            raise ConfigError("the header size limit must be at least 1K")
        if self.max_headers < 8:
            raise ConfigError("the header count limit must be at least 8")
        if min(self.header_timeout, self.body_timeout, self.keep_alive_timeout) <= 0:
            raise ConfigError("timeouts must be positive")
        if self.max_connections < 2:
            raise ConfigError("the connection limit must be at least 2")


def _response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class _Table:
    """The server's guarded connections, least recently active first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.conns: dict[Any, None] = {}

    def admit(self, conn: Any) -> bool:
        """Add ``conn``, evicting an idle one if full; ``False`` if every one is busy."""
        if len(self.conns) >= self.limit:
            victim = next((c for c in self.conns if not c.gx_busy), None)
            if victim is None:
                return False
            self.conns.pop(victim, None)
            victim.gx_evict()
        self.conns[conn] = None
        return True

    def touch(self, conn: Any) -> None:
        """``conn`` just finished a request: it becomes the most recently active."""
        if conn in self.conns:
            del self.conns[conn]
            self.conns[conn] = None

    def remove(self, conn: Any) -> None:
        self.conns.pop(conn, None)


def protocol_class(limits: Limits) -> type[asyncio.Protocol]:
    """A uvicorn HTTP protocol class enforcing ``limits`` (one connection table per call).

    Raises:
        ConfigError: ``httptools`` (from ``uvicorn[standard]``) is not installed.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        raise ConfigError(
            "git xet serve needs httptools: install gitxet's server extra "
            "(it pulls in uvicorn[standard])"
        ) from None
    table = _Table(limits.max_connections)
    quiet = _QuietLog()

    class GuardedProtocol(HttpToolsProtocol):  # type: ignore[misc]
        """uvicorn's httptools protocol with gitxet's limits (see the module docstring)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.gx_busy = False  # a request is in flight: headers read, response not done
            self.gx_in_body = False  # between the end of a head and the end of its body
            self.gx_head = 0  # bytes of the current head fed to the parser
            self.gx_headers = 0
            self.gx_refused = False
            self.gx_drained = 0
            self.gx_timer: asyncio.TimerHandle | None = None
            self.gx_last_rx = 0.0

        # ---- timers --------------------------------------------------------------------

        def gx_arm(self, delay: float, what: str) -> None:
            self.gx_cancel()
            self.gx_timer = self.loop.call_later(delay, self.gx_expired, what)

        def gx_cancel(self) -> None:
            if self.gx_timer is not None:
                self.gx_timer.cancel()
                self.gx_timer = None

        def gx_expired(self, what: str) -> None:
            self.gx_timer = None
            if self.transport is None or self.transport.is_closing() or self.gx_refused:
                return
            if what == "body":
                idle = self.loop.time() - self.gx_last_rx
                if self.flow.read_paused or idle < limits.body_timeout:
                    # paused by us (the app is slow), or data came in: wait for the rest
                    self.gx_arm(max(0.05, limits.body_timeout - idle), "body")
                    return
                quiet.warning(
                    "body",
                    "closing %s: no request body for %gs",
                    self.gx_peer(),
                    limits.body_timeout,
                )
                self.transport.close()
                return
            quiet.warning(
                "head-time",
                "closing %s: request head not received within %gs",
                self.gx_peer(),
                limits.header_timeout,
            )
            if self.cycle is None or self.cycle.response_complete:
                # no drain: a client this slow gets the answer and the connection ends now
                self.transport.write(
                    _response(408, "Request Timeout", "request head not received in time")
                )
            self.gx_refused = True
            self.transport.close()

        def gx_peer(self) -> str:
            return f"{self.client[0]}:{self.client[1]}" if self.client else "a client"

        # ---- refusing ------------------------------------------------------------------

        def gx_refuse(self, status: int, reason: str, message: str) -> None:
            """Answer ``status`` and close, after draining what the client still sends."""
            self.gx_refused = True
            self.gx_busy = False
            self.gx_cancel()
            transport = self.transport
            transport.write(_response(status, reason, message))
            if transport.can_write_eof():
                transport.write_eof()
                self.loop.call_later(_DRAIN_SECONDS, transport.close)
            else:
                transport.close()

        def gx_evict(self) -> None:
            quiet.warning(
                "evict", "closing idle connection %s: connection limit reached", self.gx_peer()
            )
            self.gx_cancel()
            self.transport.close()

        # ---- asyncio protocol ----------------------------------------------------------

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if not table.admit(self):
                quiet.warning(
                    "full",
                    "refusing %s: %d connections, all busy",
                    self.gx_peer(),
                    limits.max_connections,
                )
                self.gx_refuse(503, "Service Unavailable", "too many connections")
                return
            self.gx_arm(limits.header_timeout, "header")

        def connection_lost(self, exc: Exception | None) -> None:
            table.remove(self)
            self.gx_cancel()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.gx_refused:
                self.gx_drained += len(data)
                if self.gx_drained > _DRAIN_BYTES:
                    self.transport.close()
                return
            while data:
                if self.gx_in_body:
                    self.gx_last_rx = self.loop.time()
                    piece, data = data, b""
                else:
                    budget = limits.max_header_bytes - self.gx_head
                    if budget <= 0:
                        quiet.warning(
                            "head-size",
                            "refusing %s: request head over %d bytes",
                            self.gx_peer(),
                            limits.max_header_bytes,
                        )
                        self.gx_refuse(
                            431,
                            "Request Header Fields Too Large",
                            f"request head over {limits.max_header_bytes} bytes",
                        )
                        return
                    if len(data) <= budget:
                        piece, data = data, b""
                    else:  # never hand the parser more head than the limit
                        piece, data = data[:budget], data[budget:]
                    self.gx_head += len(piece)
                super().data_received(piece)
                if self.gx_refused or self.transport.is_closing():
                    return

        # ---- parser callbacks ----------------------------------------------------------

        def on_message_begin(self) -> None:
            if self.gx_refused:
                return
            if self.gx_timer is None:  # a kept-alive connection: the head's clock starts now
                self.gx_arm(limits.header_timeout, "header")
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            if not self.gx_refused:
                super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            if self.gx_refused:
                return
            self.gx_headers += 1
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            if self.gx_refused:
                return
            if self.gx_headers > limits.max_headers:
                quiet.warning(
                    "head-count",
                    "refusing %s: %d request headers (limit %d)",
                    self.gx_peer(),
                    self.gx_headers,
                    limits.max_headers,
                )
                self.gx_refuse(
                    431,
                    "Request Header Fields Too Large",
                    f"more than {limits.max_headers} request headers",
                )
                return
            self.gx_busy = True
            self.gx_in_body = True
            self.gx_last_rx = self.loop.time()
            self.gx_arm(limits.body_timeout, "body")
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self.gx_refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self.gx_refused:
                return
            self.gx_in_body = False
            self.gx_head = 0
            self.gx_headers = 0
            self.gx_cancel()
            super().on_message_complete()

        def on_response_complete(self) -> None:
            self.gx_busy = False
            table.touch(self)
            super().on_response_complete()

        def send_400_response(self, msg: str) -> None:
            if not self.gx_refused:
                self.gx_refused = True
                self.gx_cancel()
                super().send_400_response(msg)

    return GuardedProtocol
