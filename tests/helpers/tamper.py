"""A hostile server in front of a real one: a proxy on 127.0.0.1 that forwards every request
to ``upstream`` and lets a test rewrite the answer (a wrong, short or long body, a gzip
bomb, a redirect, a body dripped a byte at a time).

The ``Host`` header is forwarded as the client sent it, so the URLs the real server builds
(the discovery's ``casUrl``, signed xorb URLs) point at the proxy, and every later request
passes through it too. Each request is recorded (method, path, headers).
"""

from __future__ import annotations

import gzip
import http.client
import http.server
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Seen:
    """One request the proxy received."""

    method: str
    path: str
    headers: dict[str, str]


@dataclass
class Reply:
    """What the proxy sends back. ``send`` (``"whole"``, ``"cut"``: the headers of the
    whole body, then ``cut`` bytes and close; ``"drip"``: a byte every ``drip`` seconds)."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    send: str = "whole"
    cut: int = 0
    drip: float = 1.0
    extra: dict[str, str] = field(default_factory=dict)

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None


#: ``tamper(seen, reply)``: the reply to send instead (or the same one)
Tamper = Callable[[Seen, Reply], Reply]

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"}


def gzip_bomb(size: int) -> bytes:
    """``size`` spaces, gzipped (about 1 KB per MiB)."""
    return gzip.compress(b" " * size, 9)


class _Handler(http.server.BaseHTTPRequestHandler):
    """Forwards a request to the proxy's upstream, then sends what ``tamper`` makes of it."""

    protocol_version = "HTTP/1.1"
    proxy: TamperProxy

    def log_message(self, *args: object) -> None:
        """Quiet."""

    def _any(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        hdrs = {k: v for k, v in self.headers.items()}
        seen = Seen(self.command, self.path, hdrs)
        self.proxy.seen.append(seen)
        up = http.client.HTTPConnection(self.proxy.up_host, self.proxy.up_port, timeout=60)
        try:
            fwd = {k: v for k, v in hdrs.items() if k.lower() not in _HOP}
            fwd["Accept-Encoding"] = "identity"
            up.request(self.command, self.path, body=body or None, headers=fwd)
            r = up.getresponse()
            reply = Reply(
                r.status,
                [(k, v) for k, v in r.getheaders() if k.lower() not in _HOP],
                r.read(),
            )
        finally:
            up.close()
        if self.proxy.tamper is not None:
            reply = self.proxy.tamper(seen, reply)
        self._send(reply)

    do_GET = do_POST = do_PUT = do_HEAD = _any

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        for k, v in reply.headers:
            self.send_header(k, v)
        for k, v in reply.extra.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(reply.body)))
        if reply.send != "whole":
            self.send_header("Connection", "close")
        self.end_headers()
        if reply.send == "cut":
            self.wfile.write(reply.body[: reply.cut])
            self.wfile.flush()
            self.close_connection = True
        elif reply.send == "drip":
            for i in range(len(reply.body)):
                if self.proxy.stopping.wait(reply.drip):
                    break
                try:
                    self.wfile.write(reply.body[i : i + 1])
                    self.wfile.flush()
                except OSError:
                    break
            self.close_connection = True
        else:
            self.wfile.write(reply.body)


class TamperProxy:
    """The proxy; use as a context manager. ``tamper`` may be set at any time."""

    def __init__(self, upstream: str, tamper: Tamper | None = None) -> None:
        u = urlsplit(upstream)
        self.up_host, self.up_port = u.hostname or "127.0.0.1", u.port or 80
        self.tamper = tamper
        self.seen: list[Seen] = []
        self.stopping = threading.Event()
        handler = type("Handler", (_Handler,), {"proxy": self})
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def paths(self, contains: str) -> list[Seen]:
        """The requests whose path contains ``contains``."""
        return [s for s in self.seen if contains in s.path]

    def __enter__(self) -> TamperProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(10)
        time.sleep(0)
