"""The CAS client: the Xet HTTP API (the only module that talks HTTP to a CAS).

:class:`CASClient` speaks the same dialect as hf_xet 1.8, so it works against our server
and any Xet CAS: reconstructions V2 with a V1 fallback, xorb uploads through upload grants
with a ``POST /v1/xorbs`` fallback, shard uploads V2 with a V1 fallback, global-dedup
queries, and ranged xorb GETs on the signed URLs the server hands out. Fallback choices are
remembered per client, as hf_xet does.

The API calls (small JSON and shard bodies) go through httpx. Ranged GETs of xorb data, the
bulk of every download, go through the standard library's ``http.client`` straight into a
caller's buffer (``readinto``): on loopback that moves about three times the bytes per CPU
second of httpx's 64 KiB-at-a-time streaming. Each thread keeps its own keep-alive
connection per host; ``HTTP(S)_PROXY``/``NO_PROXY`` are honoured for both.

Reliability: the one retry helper (``gitxet.util.retry``) runs every request and every
composite flow (upload grant -> PUT -> commit, a V2 shard upload's progress stream) with one
attempt budget: connection errors, 429 (except for dedup queries), 500, 502, 503 and 504 are
retried with exponential backoff and jitter, honouring ``Retry-After``. A ranged GET whose
body breaks off resumes from the last byte received.

What is verified here: dedup shards and file shards are parsed strictly, xorb locations are
checked against the xorb hash, upload answers are checked for shape, ranged GETs must return
exactly the bytes asked for. The chunks themselves are hashed by the caller
(``gitxet.data.remote_source``), which knows their expected hashes.

Tokens are sent only as ``Authorization: Bearer`` to the CAS endpoint; data and grant URLs
carry their own signature and never get the header. No error message contains a token or a
URL query string.
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import importlib
import itertools
import json
import mmap
import os
import socket
import ssl
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from gitxet.errors import (
    AuthError,
    FileNotFoundInCASError,
    FormatError,
    IntegrityError,
    RemoteError,
    UnreachableError,
    XorbNotFoundError,
)
from gitxet.formats.shard import FileInfo, Shard, parse_shard
from gitxet.formats.xorb import MAX_XORB_READ_BYTES, verify_xorb
from gitxet.hashing import from_hex, to_hex
from gitxet.remote import protocol as p
from gitxet.remote._sync_only import without_unused
from gitxet.remote.probe import USER_AGENT, info_refs_url, is_gitxet_challenge
from gitxet.settings import strip_credentials
from gitxet.util.retry import Retry, RetryPolicy, retry_call

with without_unused():  # gitxet.remote._sync_only: ~0.15 s of every cold start
    import httpx

    importlib.import_module("httpcore")  # what the first httpx.Client imports

__all__ = ["CASClient", "RetryPolicy", "discover", "is_gitxet_server"]

_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

_tls_context: ssl.SSLContext | None = None


def _tls() -> ssl.SSLContext:
    """The TLS settings every httpx client of this process uses (httpx's defaults: its CA
    bundle, or ``SSL_CERT_FILE``/``SSL_CERT_DIR``), made once: each client made its own,
    ~25 ms of loading CA certificates apiece (two before a clone's first byte)."""
    global _tls_context
    if _tls_context is None:
        _tls_context = httpx.create_ssl_context()
    return _tls_context


TokenSource = str | Callable[[], str | None] | None
T = TypeVar("T")


def _parse_retry_after(v: str | None) -> float | None:
    if not v:
        return None
    v = v.strip()
    seconds = p.parse_decimal(v, max_digits=6)  # ASCII only: isdigit() takes '²', float() not
    if seconds is not None:
        return float(seconds)
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


#: The most bytes an API answer may hold once decoded: JSON answers, and shards (a stored
#: shard is at most 64 MiB; a batch of descriptions stays far below). A bigger answer, or a
#: small gzip body that inflates to gigabytes, is refused before it fills memory.
MAX_JSON_ANSWER = 32 << 20
MAX_SHARD_ANSWER = 256 << 20
#: After the first ``timeout`` seconds, an answer's body must keep arriving at this average
#: rate (bytes per second): a server dripping a byte a second fails in bounded time (the
#: per-read timeout alone never fires while each byte comes in time).
MIN_BODY_RATE = 64 << 10
#: Redirects a discovery request follows (on the same server only).
MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: Headers that describe the wire body, not the decoded one kept.
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})
#: A request body larger than this is handed to httpx in views of this size: httpcore
#: sends a ``bytes`` body with ``buffer = buffer[sent:]`` after each partial send, a copy
#: of the rest each time (an upload of a 64 MiB xorb held it a second time, per worker).
SEND_PIECE = 1 << 20


class _Pieces:
    """A request body sent as views of ``data``, :data:`SEND_PIECE` bytes each; iterable
    again for each attempt of a retried request."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __iter__(self) -> Iterator[bytes]:
        view = memoryview(self._data)
        for start in range(0, len(view), SEND_PIECE):
            yield view[start : start + SEND_PIECE]  # type: ignore[misc]  # h11 takes any buffer


def too_slow(started: float, got: int, timeout: float) -> bool:
    """Whether a body of which ``got`` bytes arrived since ``started`` (monotonic) is slower
    than ``timeout`` seconds plus :data:`MIN_BODY_RATE`."""
    return time.monotonic() - started > timeout + got / MIN_BODY_RATE


def _read_bounded(
    client: httpx.Client, request: httpx.Request, *, what: str, limit: int, timeout: float
) -> httpx.Response:
    """Send ``request`` and read its answer whole, decoded, refusing one over ``limit``
    bytes or one slower than :func:`too_slow` allows.

    Raises:
        RemoteError: too big, too slow or undecodable.
        httpx.TransportError: the request failed.
    """
    started = time.monotonic()
    resp = client.send(request, stream=True, follow_redirects=False)
    body = bytearray()
    try:
        for part in resp.iter_bytes():
            body += part
            if len(body) > limit:
                raise RemoteError(
                    f"{what}: the server's answer is larger than {limit >> 20} MiB",
                    resp.status_code,
                )
            if too_slow(started, len(body), timeout):
                raise RemoteError(
                    f"{what}: the server's answer is too slow ({len(body)} bytes in "
                    f"{time.monotonic() - started:.0f} s)",
                    resp.status_code,
                )
    except httpx.DecodingError:
        raise RemoteError(
            f"{what}: the server's answer cannot be decoded "
            f"(Content-Encoding: {resp.headers.get('content-encoding', '')[:40]})",
            resp.status_code,
        ) from None
    finally:
        resp.close()
    kept = [(k, v) for k, v in resp.headers.multi_items() if k.lower() not in _WIRE_HEADERS]
    return httpx.Response(resp.status_code, headers=kept, content=bytes(body), request=request)


def _detail_text(text: str) -> str:
    """A short, printable reason from an error response body."""
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        for k in ("error", "message", "detail"):
            if isinstance(doc.get(k), str):
                text = doc[k]
                break
    text = " ".join(text.split())
    return text[:200]


def _detail(resp: httpx.Response) -> str:
    try:
        return _detail_text(resp.text)
    except (UnicodeDecodeError, httpx.ResponseNotRead):
        return ""


def _transport_reason(exc: BaseException) -> str:
    """A transport failure in words: ``connection refused``, ``timed out``, ``unknown host``."""
    text = str(exc).lower()
    if isinstance(exc, httpx.TimeoutException) or "timed out" in text:
        return "timed out"
    if "refused" in text:
        return "connection refused"
    if "name or service not known" in text or "nodename nor servname" in text:
        return "unknown host"
    if "no route" in text or "unreachable" in text:
        return "no route to host"
    if "reset" in text:
        return "connection reset"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "the server closed the connection"
    return type(exc).__name__


def transport_error(what: str, url: str, exc: BaseException) -> RemoteError:
    """The error for a request that got no HTTP answer (credentials never in the message):
    :class:`UnreachableError` when no connection was made, else a :class:`RemoteError`."""
    shown = strip_credentials(url)
    reason = _transport_reason(exc)
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, ConnectionRefusedError)):
        return UnreachableError(what, shown, reason)
    return RemoteError(f"{what}: {reason} talking to {shown}")


def _status_error(status: int, what: str, detail: str) -> RemoteError:
    msg = f"{what}: HTTP {status}"
    if detail:
        msg += f" ({detail})"
    if status == 401:
        return AuthError(msg + "; the token is missing, invalid or expired", status)
    if status == 403:
        return AuthError(msg + "; the token's scope does not allow this", status)
    return RemoteError(msg, status)


class _DataConnections:
    """Keep-alive ``http.client`` connections for data URLs, one per host and thread."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._local = threading.local()
        self._ssl: ssl.SSLContext | None = None
        self._lock = threading.Lock()
        # every thread's, for close(), with the thread using it: those of threads that ended
        # are closed when a thread opens one (a mount's worker threads come and go; each
        # left a keep-alive socket open until the client was closed)
        self._all: dict[http.client.HTTPConnection, threading.Thread] = {}
        self._pid = os.getpid()

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def get(self, url: str) -> tuple[http.client.HTTPConnection, str]:
        """A connection for ``url`` and the request target to send on it."""
        if self._pid != os.getpid():  # a forked child: never share the parent's sockets
            self._pid = os.getpid()
            self._local = threading.local()
            self._lock = threading.Lock()
            self._all = {}
        s = urlsplit(url)
        if s.scheme not in ("http", "https") or not s.hostname:
            raise RemoteError(f"data URL {strip_credentials(url)}: not an http(s) URL")
        key = (s.scheme, s.hostname, s.port)
        # per thread: each host's connection, and whether it goes through an http proxy
        conns: dict[tuple[str, str, int | None], tuple[http.client.HTTPConnection, bool]] | None
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        target = s.path + ("?" + s.query if s.query else "")
        entry = conns.get(key)
        if entry is None:
            # the proxy is decided once per connection (scanning the environment for it on
            # every range took a tenth of the reading threads' time)
            proxy = None if urllib.request.proxy_bypass(s.hostname) else _proxy_for(s.scheme)
            opened = self._open(s.scheme, s.hostname, s.port, proxy)
            entry = conns[key] = (opened, proxy is not None and s.scheme == "http")
            self._close_ended()
        conn, via_proxy = entry
        if via_proxy:
            target = urlunsplit((s.scheme, s.netloc, s.path, s.query, ""))
        if conn not in self._all:  # new, or let go by close() (even while connecting)
            with self._lock:
                self._all[conn] = threading.current_thread()
        return conn, target

    def _open(
        self, scheme: str, host: str, port: int | None, proxy: tuple[str, int] | None
    ) -> http.client.HTTPConnection:
        if scheme == "https":
            if proxy is None:
                return http.client.HTTPSConnection(
                    host, port, timeout=self.timeout, context=self._context()
                )
            tunnel = http.client.HTTPSConnection(
                proxy[0], proxy[1], timeout=self.timeout, context=self._context()
            )
            tunnel.set_tunnel(host, port)
            return tunnel
        if proxy is None:
            return http.client.HTTPConnection(host, port, timeout=self.timeout)
        return http.client.HTTPConnection(proxy[0], proxy[1], timeout=self.timeout)

    def drop(self, url: str) -> None:
        """Close this thread's connection for ``url``'s host (after an error)."""
        s = urlsplit(url)
        conns = getattr(self._local, "conns", None)
        if conns is not None:
            entry = conns.pop((s.scheme, s.hostname, s.port), None)
            if entry is not None:
                conn = entry[0]
                conn.close()
                with self._lock:
                    self._all.pop(conn, None)

    def close(self) -> None:
        """Close every thread's connections (a later request opens a new one)."""
        with self._lock:
            conns, self._all = self._all, {}
        for conn in conns:
            conn.close()

    def _close_ended(self) -> None:
        """Close the connections of threads that have ended."""
        with self._lock:
            ended = [c for c, t in self._all.items() if not t.is_alive()]
            for conn in ended:
                del self._all[conn]
        for conn in ended:
            conn.close()


class _Deadlines:
    """Ranged GETs in flight and when each must be done. A daemon thread shuts a late
    one's socket down (its read then ends short): a server that drips a byte in time for
    every per-read timeout still fails in bounded time. One for the process, made again in
    a forked child."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, socket.socket]] = {}
        self._fired: set[int] = set()
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")  # when the thread wakes next

    def watch(self, sock: socket.socket, due: float) -> int:
        """Shut ``sock`` down at ``due`` (monotonic) unless :meth:`done` comes first."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="gitxet-range-deadlines", daemon=True
                )
                self._thread.start()
            key = next(self._keys)
            self._due[key] = (due, sock)
            if due < self._wake_at:  # else the thread wakes in time anyway
                self._cond.notify()
            return key

    def done(self, key: int) -> bool:
        """Stop watching; whether the deadline had come."""
        with self._cond:
            self._due.pop(key, None)
            if key in self._fired:
                self._fired.discard(key)
                return True
            return False

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for key, (due, sock) in list(self._due.items()):
                    if due <= now:
                        del self._due[key]
                        self._fired.add(key)
                        with contextlib.suppress(OSError):
                            # the plain socket's: an SSLSocket's own would drop TLS and let
                            # the reader take raw records for data
                            socket.socket.shutdown(sock, socket.SHUT_RDWR)
                nearest = min((due for due, _ in self._due.values()), default=None)
                self._wake_at = float("inf") if nearest is None else nearest
                self._cond.wait(None if nearest is None else max(0.01, nearest - now))

    def reset(self) -> None:
        """In a forked child: the parent's thread and lock are not ours."""
        self.__init__()  # type: ignore[misc]


_DEADLINES = _Deadlines()
os.register_at_fork(after_in_child=_DEADLINES.reset)


def _proxy_for(scheme: str) -> tuple[str, int] | None:
    url = urllib.request.getproxies().get(scheme)
    if not url:
        return None
    s = urlsplit(url if "://" in url else "http://" + url)
    if not s.hostname:
        return None
    return s.hostname, s.port or 80


#: a buffer xorb data is received into (a view: part of a :class:`BufferPool` mapping)
DataBuffer = bytearray | mmap.mmap | memoryview

#: buffers from this size on are anonymous mappings (see :func:`data_buffer`)
_MAPPED_BUFFER = 1 << 20


def data_buffer(n: int) -> DataBuffer:
    """A writable buffer of ``n`` bytes to receive data into. Large ones are anonymous
    mappings: a new bytearray is zero-filled and page-faulted with the GIL held (about 2 ms
    per 8 MiB range, which stalled every other fetch and reader thread), a mapping's pages
    are faulted in by the kernel while it copies the data in, outside the GIL. (Private: a
    forked child never writes into its parent's pages.)"""
    return mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE) if n >= _MAPPED_BUFFER else bytearray(n)


class BufferPool:
    """Anonymous mappings of ``capacity`` bytes that received ranges are read into again
    and again: a fresh mapping costs a page fault and a zeroed page per 4 KiB and an unmap
    afterwards (about 1 s of CPU per GiB on a 2-core VM, against 0.05 s to reuse one).

    There is no "give back": a mapping is taken again once nothing refers to its previous
    data (every view of it is gone: a mapping with live views refuses to resize), so bytes
    a reader still holds are never overwritten. At most ``keep`` mappings are made (as
    many as were in use at once); a larger request, or one while all are in use, gets a
    fresh :func:`data_buffer`. Thread-safe."""

    def __init__(self, capacity: int, keep: int) -> None:
        self.capacity = capacity
        self.keep = keep
        self._maps: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self._usable = True

    def take(self, n: int) -> DataBuffer:
        """A writable buffer of exactly ``n`` bytes."""
        if n > self.capacity or n < _MAPPED_BUFFER or not self._usable:
            return data_buffer(n)
        with self._lock:
            for m in self._maps:
                try:
                    m.resize(self.capacity)  # a no-op, refused while a view of it lives
                except BufferError:
                    continue
                except (OSError, SystemError, ValueError):  # no mremap: no reuse
                    self._usable = False
                    break
                return memoryview(m)[:n]  # the view marks it taken, under the lock
            else:
                if len(self._maps) < self.keep:
                    m = mmap.mmap(-1, self.capacity, flags=mmap.MAP_PRIVATE)
                    self._maps.append(m)
                    return memoryview(m)[:n]
        return data_buffer(n)

    def clear(self) -> None:
        """Let go of every mapping (each is unmapped once the last view of it is gone)."""
        with self._lock:
            self._maps = []


class CASClient:
    """A client for one CAS endpoint. Thread-safe; use as a context manager or ``close()``.

    ``token`` is a bearer token, a zero-argument callable returning one (called per request,
    so it may refresh), or ``None``. Pass ``http`` to inject a transport for the API calls
    (tests use ``httpx.MockTransport``); otherwise the client owns an ``httpx.Client``.
    """

    def __init__(
        self,
        endpoint: str,
        token: TokenSource = None,
        *,
        http: httpx.Client | None = None,
        max_parallel: int = 8,
        retry: RetryPolicy | None = None,
        timeout: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        #: How push/fetch name this remote in messages (``gitxet.data.transfer.CASRemote``).
        self.name = self.endpoint
        self._token = token
        self._own_http = http is None
        self._pid = os.getpid()
        self._limits = httpx.Limits(max_connections=max_parallel * 2)
        self.http = http or httpx.Client(
            timeout=httpx.Timeout(timeout, connect=15.0),
            limits=self._limits,
            follow_redirects=False,
            verify=_tls(),
        )
        self.max_parallel = max(1, max_parallel)
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._timeout = timeout
        self._data = _DataConnections(timeout)
        self.session_id = str(uuid.uuid4())
        # Remembered fallbacks (None = not known yet).
        self._recon_v2: bool | None = None
        self._shards_v2: bool | None = None
        self._grants: bool | None = None

    # ---- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Close the data connections, and the HTTP client if this object created it."""
        self._data.close()
        if self._own_http:
            self.http.close()

    def __enter__(self) -> CASClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing ----------------------------------------------------------------------

    def _headers(self, auth: bool) -> dict[str, str]:
        h = {"User-Agent": USER_AGENT, p.SESSION_HEADER: self.session_id}
        if auth and self._token is not None:
            tok = self._token() if callable(self._token) else self._token
            if tok:  # a callable may have none for this request (a cache tier's client)
                h["Authorization"] = f"Bearer {tok}"
        return h

    def _url(self, path: str) -> str:
        return self.endpoint + path

    def _retrying(self, attempt: Callable[[], T]) -> T:
        return retry_call(lambda _: attempt(), self.retry, sleep=self._sleep)

    def _send(
        self,
        method: str,
        url: str,
        *,
        what: str,
        auth: bool = True,
        ok: Iterable[int] = (200,),
        retry_statuses: frozenset[int] = _RETRY_STATUSES,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
        json_body: Any = None,
        limit: int = MAX_JSON_ANSWER,
    ) -> httpx.Response:
        """One attempt: a response whose status is in ``ok`` (its body at most ``limit``
        bytes); ``Retry`` for a failure worth retrying; any other status raises its error."""
        hdrs = self._headers(auth)
        if headers:
            hdrs.update(headers)
        body: bytes | _Pieces | None = content
        if content is not None and len(content) > SEND_PIECE:
            hdrs["Content-Length"] = str(len(content))  # (not sent chunked)
            body = _Pieces(content)
        if self._own_http and self._pid != os.getpid():
            # a forked child (a mount daemon) must not share the parent's pooled sockets
            self._pid = os.getpid()
            self.http = httpx.Client(timeout=self.http.timeout, limits=self._limits, verify=_tls())
        try:
            request = self.http.build_request(
                method, url, headers=hdrs, content=body, json=json_body
            )
            resp = _read_bounded(self.http, request, what=what, limit=limit, timeout=self._timeout)
        except httpx.TransportError as e:
            raise Retry(transport_error(what, url, e)) from None
        if resp.status_code in ok:
            return resp
        err = self._error(resp, what)
        if resp.status_code in retry_statuses:
            raise Retry(err, after=_parse_retry_after(resp.headers.get("retry-after")))
        raise err

    def _request(self, method: str, url: str, *, what: str, **kw: Any) -> httpx.Response:
        """:meth:`_send` under the retry loop."""
        return self._retrying(lambda: self._send(method, url, what=what, **kw))

    def _error(self, resp: httpx.Response, what: str) -> RemoteError:
        return _status_error(resp.status_code, what, _detail(resp))

    def healthy(self, timeout: float = 2.0) -> bool:
        """Whether the endpoint answers ``GET /healthz`` with 200 within ``timeout`` seconds
        (one try; any failure is "no")."""
        try:
            r = self.http.get(
                self._url(p.HEALTHZ), headers=self._headers(auth=False), timeout=timeout
            )
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    # ---- reconstruction and downloads --------------------------------------------------

    def get_reconstruction(
        self, file_hash_: bytes, byte_range: tuple[int, int | None] | None = None
    ) -> Reconstruction:
        """The reconstruction of a file, or of bytes ``[start, end)`` of it.

        ``end`` may be ``None`` (to the end of the file). Tries ``/v2`` first and falls
        back to ``/v1`` on 404 or 501, remembering a V1-only server. A file that is empty
        needs no call (its hash is all zeros).

        Raises:
            FileNotFoundInCASError: the server does not know the file.
            RemoteError: 416 (range outside the file) and other failures.
        """
        fx = to_hex(file_hash_)
        headers: dict[str, str] = {}
        if byte_range is not None:
            start, end = byte_range
            if start < 0 or (end is not None and end <= start):
                raise ValueError(f"empty or negative byte range {byte_range}")
            headers["Range"] = f"bytes={start}-" if end is None else p.format_range(start, end - 1)
        what = f"reconstruction of {fx}"
        if self._recon_v2 is not False:
            r = self._request(
                "GET",
                self._url(p.RECONSTRUCTION_V2.format(file_id=fx)),
                what=what,
                headers=headers,
                ok=(200, 404, 501),
            )
            if r.status_code == 200:
                self._recon_v2 = True
                return p.Reconstruction.from_v2(self._json(r, what))
            if r.status_code == 404 and self._recon_v2:
                raise FileNotFoundInCASError(fx)
        r = self._request(
            "GET",
            self._url(p.RECONSTRUCTION_V1.format(file_id=fx)),
            what=what,
            headers=headers,
            ok=(200, 404),
        )
        if r.status_code == 404:
            raise FileNotFoundInCASError(fx)
        if self._recon_v2 is None:
            self._recon_v2 = False
        return p.Reconstruction.from_v1(self._json(r, what))

    @staticmethod
    def _json(resp: httpx.Response, what: str) -> Any:
        try:
            return resp.json()
        except ValueError:
            raise RemoteError(f"{what}: response is not JSON", resp.status_code) from None

    def fetch_xorb_range(
        self, url: str, start: int, end: int, into: DataBuffer | None = None
    ) -> DataBuffer:
        """GET bytes ``[start, end]`` (inclusive, as in ``url_range``) of a data URL.

        The body is read straight into ``into`` (exactly ``end - start + 1`` bytes) or a new
        buffer (:func:`data_buffer`), which is returned. No Authorization header is sent
        (the URL is signed). A body that breaks off is resumed from the last byte received.

        Raises:
            AuthError: 401/403 (a data URL that expired: ask for a new one).
            RemoteError: after the retries, or on a short/long body or a non-206 answer.
        """
        if end < start:
            raise ValueError(f"inverted range {start}-{end}")
        want = end - start + 1
        if want > MAX_XORB_READ_BYTES:  # what a reconstruction of a hostile server may say
            raise RemoteError(
                f"xorb range {strip_credentials(url)[:200]}: {want:,} bytes asked for, more "
                "than a xorb holds (a malformed reconstruction)"
            )
        buf = into if into is not None else data_buffer(want)
        if len(buf) != want:
            raise ValueError(f"buffer of {len(buf)} bytes for a {want}-byte range")
        view = memoryview(buf)
        got = 0
        what = f"xorb range {strip_credentials(url)}"

        def attempt() -> None:
            nonlocal got
            conn, target = self._data.get(url)
            hdrs = self._headers(auth=False)
            hdrs["Range"] = p.format_range(start + got, end)
            first, started, watch = got, time.monotonic(), None
            try:
                if conn.sock is None:
                    conn.connect()
                # the whole answer within the timeout plus MIN_BODY_RATE
                due = started + self._timeout + (want - got) / MIN_BODY_RATE
                watch = _DEADLINES.watch(conn.sock, due)
                conn.request("GET", target, headers=hdrs)
                resp = conn.getresponse()
                if resp.status not in (200, 206):
                    detail = _detail_text(resp.read(4096).decode("utf-8", "replace"))
                    self._data.drop(url)
                    err = _status_error(resp.status, what, detail)
                    if resp.status == 404:  # it handed out the URL: it describes the data
                        err = RemoteError(f"{err}: the server {self.lost_data}", 404)
                    if resp.status in _RETRY_STATUSES:
                        raise Retry(err, after=_parse_retry_after(resp.getheader("retry-after")))
                    raise err
                if resp.status == 200:
                    # A server that ignored Range sends the whole object: take the part (of
                    # at most a whole xorb's bytes, never an unbounded body in memory).
                    limit = max(end + 1, MAX_XORB_READ_BYTES)
                    body = resp.read(limit + 1)
                    self._data.drop(url)
                    if len(body) > limit:
                        raise RemoteError(f"{what}: the whole object is larger than a xorb")
                    if len(body) <= end:
                        raise RemoteError(f"{what}: object shorter than the range")
                    view[got:] = body[start + got : end + 1]
                    got = want
                    return
                length = resp.getheader("content-length")
                if length is not None and length.isdigit() and int(length) > want - got:
                    self._data.drop(url)
                    raise RemoteError(f"{what}: longer than the {want} bytes asked for")
                while got < want:
                    n = resp.readinto(view[got:])
                    if not n:
                        break
                    got += n
                if got < want:
                    self._data.drop(url)
                    if _DEADLINES.done(watch):
                        raise self._too_slow(what, got - first, started)
                    raise Retry(RemoteError(f"{what}: got {got} of {want} bytes"))
                if resp.read(1):
                    self._data.drop(url)
                    raise RemoteError(f"{what}: longer than the {want} bytes asked for")
            except (OSError, http.client.HTTPException) as e:
                self._data.drop(url)
                if watch is not None and _DEADLINES.done(watch):
                    raise self._too_slow(what, got - first, started) from None
                if got == 0 and isinstance(e, ConnectionRefusedError):
                    raise Retry(transport_error("xorb range", url, e)) from None
                reason = _transport_reason(e)
                raise Retry(RemoteError(f"{what}: {reason} after {got} bytes")) from None
            finally:
                if watch is not None:
                    _DEADLINES.done(watch)

        self._retrying(attempt)
        return buf

    @property
    def lost_data(self) -> str:
        """What to say of data this server describes and does not have."""
        return (
            f"{strip_credentials(self.endpoint)} describes data it no longer has; a clone "
            "that has the data sends it again: git xet push --all"
        )

    def _too_slow(self, what: str, got: int, started: float) -> RemoteError:
        return RemoteError(
            f"{what}: the server is too slow ({got} bytes in "
            f"{time.monotonic() - started:.0f} s; the timeout is {self._timeout:g} s)"
        )

    def get_file_shard(self, file_hash_: bytes, *, with_xorbs: bool = True) -> Shard:
        """The file's block plus (``with_xorbs``) the CAS blocks of its xorbs (gitxet
        extension route; a server that predates ``with_xorbs=False`` sends them anyway).

        Raises:
            FileNotFoundInCASError: unknown file (or a server without the extension).
            RemoteError: malformed shard or transfer failure.
        """
        fx = to_hex(file_hash_)
        r = self._request(
            "GET",
            self._url(p.FILE_SHARD.format(file_id=fx))
            + ("" if with_xorbs else f"?{p.FILE_SHARD_TERMS_ONLY}"),
            what=f"shard of {fx}",
            ok=(200, 404),
            limit=MAX_SHARD_ANSWER,
        )
        if r.status_code == 404:
            raise FileNotFoundInCASError(fx)
        try:
            return parse_shard(r.content)
        except FormatError as e:
            raise RemoteError(f"shard of {fx}: {e}") from None

    def get_file_blocks(self, file_hashes: Sequence[bytes]) -> dict[bytes, FileInfo] | None:
        """The blocks (terms, verification hashes) of those of ``file_hashes`` the server
        knows, asked for in batches of :data:`~gitxet.remote.protocol.MAX_FILE_SHARDS_BATCH`
        (``POST /v1/file-shards``, gitxet extension); unknown files are absent. ``None``
        from a server without the route: ask file by file (:meth:`get_file_shard`). The
        terms are the server's claim: a reader checks them against the file hash.

        Raises:
            RemoteError: a malformed answer, one holding a file that was not asked about,
                or a transfer failure.
        """
        out: dict[bytes, FileInfo] = {}
        hexes = [to_hex(h) for h in dict.fromkeys(file_hashes)]
        for i in range(0, len(hexes), p.MAX_FILE_SHARDS_BATCH):
            part = hexes[i : i + p.MAX_FILE_SHARDS_BATCH]
            what = f"descriptions of {len(part)} files"
            r = self._request(
                "POST",
                self._url(p.FILE_SHARDS),
                what=what,
                json_body=p.presence_request(part),
                ok=(200, 404, 405, 501),
                limit=MAX_SHARD_ANSWER,
            )
            if r.status_code != 200:  # an older server, or not a gitxet server
                return None
            try:
                shard = parse_shard(r.content)
            except FormatError as e:
                raise RemoteError(f"{what}: {e}") from None
            asked = {from_hex(x) for x in part}
            for info in shard.files:
                if info.file_hash not in asked:
                    raise RemoteError(
                        f"malformed server response: {what}: names file "
                        f"{to_hex(info.file_hash)}, which was not asked about"
                    )
                out[info.file_hash] = info
        return out

    # ---- whole xorbs and chunk ranges (gitxet extension) --------------------------------

    def xorb_location(self, xorb_hash: bytes) -> p.XorbLocation:
        """A signed URL and the chunk layout of a stored xorb, checked against its hash.

        Raises:
            XorbNotFoundError: not stored (or a server without the extension).
            IntegrityError: the layout does not Merkle-hash to ``xorb_hash``.
        """
        hx = to_hex(xorb_hash)
        what = f"location of xorb {hx}"
        r = self._request(
            "GET", self._url(p.XORB_LOCATION.format(xorb=hx)), what=what, ok=(200, 404)
        )
        if r.status_code == 404:  # asked for a xorb one of its descriptions names
            raise XorbNotFoundError(hx, f"on the server {self.lost_data}")
        loc = p.XorbLocation.from_json(self._json(r, what))
        if loc.xorb_hex != hx or not loc.verify():
            raise IntegrityError("xorb", hx, "the server's chunk layout does not hash to it")
        return loc

    def has_xorb(self, xorb_hash: bytes) -> bool:
        """Whether the server stores the xorb (gitxet extension route; 404 means no)."""
        hx = to_hex(xorb_hash)
        r = self._request(
            "GET", self._url(p.XORB_LOCATION.format(xorb=hx)), what=f"xorb {hx}", ok=(200, 404)
        )
        return r.status_code == 200

    def missing_files(self, file_hashes: Sequence[bytes]) -> set[bytes]:
        """The files of ``file_hashes`` the server cannot serve (gitxet extension route,
        batched; a server without it is asked one file at a time)."""
        out: set[bytes] = set()
        hexes = [to_hex(h) for h in dict.fromkeys(file_hashes)]
        for i in range(0, len(hexes), p.MAX_PRESENCE_BATCH):
            part = hexes[i : i + p.MAX_PRESENCE_BATCH]
            what = f"presence of {len(part)} files"
            r = self._request(
                "POST",
                self._url(p.FILE_PRESENCE),
                what=what,
                json_body=p.presence_request(part),
                ok=(200, 404),
            )
            if r.status_code == 404:  # an older server
                out.update(from_hex(x) for x in part if not self.shards_for_file(from_hex(x)))
                continue
            out.update(
                from_hex(x) for x in p.parse_presence_response(self._json(r, what), set(part))
            )
        return out

    def has_file(self, file_hash_: bytes) -> bool:
        """Whether the server can serve the file."""
        return not self.missing_files([file_hash_])

    def shards_for_file(self, file_hash_: bytes) -> list[bytes]:
        """Serialized shards describing a file: ``[]`` if unknown, else one stored shard
        holding its block and its xorbs' chunk lists (``GET /v1/file-shards``)."""
        fx = to_hex(file_hash_)
        r = self._request(
            "GET",
            self._url(p.FILE_SHARD.format(file_id=fx)),
            what=f"shard of {fx}",
            ok=(200, 404),
            limit=MAX_SHARD_ANSWER,
        )
        if r.status_code == 404:
            return []
        try:
            parse_shard(r.content)
        except FormatError as e:
            raise RemoteError(f"shard of {fx}: {e}") from None
        return [r.content]

    def download_xorb(self, xorb_hash: bytes) -> memoryview:
        """The whole serialized xorb (no footer), verified against ``xorb_hash``: a view of
        the buffer it was received into (not copied: a fetch holds each xorb once).

        What ``git fetch`` needs to fill a local store; the result can be handed to
        ``LocalCAS.put_xorb`` as is.
        """
        loc = self.xorb_location(xorb_hash)
        body = memoryview(self.fetch_xorb_range(loc.url, 0, loc.byte_offsets[-1] - 1))
        try:
            verify_xorb(body, xorb_hash, keep_chunks=False)
        except FormatError as e:
            raise IntegrityError(
                "xorb", loc.xorb_hex, f"downloaded bytes are not a xorb ({e})"
            ) from None
        return body

    # ---- uploads -----------------------------------------------------------------------

    def upload_xorb(self, xorb_hash: bytes, body: bytes) -> bool:
        """Upload a serialized xorb (no footer); ``False`` if the server already had it.

        Uses the upload-grant flow when the server offers it (a 404 on the grant route
        switches this client to ``POST /v1/xorbs`` for good). The whole flow (grant, PUT,
        commit) is one attempt of the retry loop: an expired grant (PUT 403) or data that
        did not arrive (commit 404) starts it over.

        Raises:
            AuthError: missing token or read-only scope.
            RemoteError: rejected (400: the bytes do not hash to ``xorb_hash``) or failed.
        """
        hx = to_hex(xorb_hash)
        what = f"upload of xorb {hx}"
        if self._grants is not False:
            req = p.grant_request(len(body), p.crc64nvme(body))
            done = self._retrying(lambda: self._grant_attempt(hx, body, req, what))
            if done is not None:
                return done
        r = self._request("POST", self._url(p.xorb_route(hx)), what=what, content=body)
        doc = self._json(r, what)
        return bool(doc.get("was_inserted", True)) if isinstance(doc, dict) else True

    def _grant_attempt(self, hx: str, body: bytes, req: Any, what: str) -> bool | None:
        """One pass of the grant flow; ``None`` when the server has no grant route."""
        r = self._send(
            "POST", self._url(p.xorb_grant_route(hx)), what=what, json_body=req, ok=(200, 201, 404)
        )
        if r.status_code == 404:
            self._grants = False
            return None
        self._grants = True
        if r.status_code == 200:
            return False
        grant = p.Grant.from_json(self._json(r, what))
        put = self._send(
            grant.method,
            grant.url,
            what=what,
            auth=False,
            headers=grant.headers,
            content=body,
            ok=(200, 201, 204, 403, 412),
        )
        if put.status_code == 412:
            return False
        if put.status_code == 403:
            raise Retry(RemoteError(f"{what}: the upload grant expired before the data"))
        c = self._send(
            "POST", self._url(p.xorb_commit_route(hx, grant.id)), what=what, ok=(200, 404)
        )
        if c.status_code == 404:
            raise Retry(RemoteError(f"{what}: the server did not receive the granted data"))
        doc = self._json(c, what) if c.content else {}
        return bool(doc.get("was_inserted", True)) if isinstance(doc, dict) else True

    def upload_shard(self, data: bytes) -> bool:
        """Register an upload shard (after its xorbs); ``False`` if it was already known.

        Tries ``/v2/shards`` (NDJSON progress frames; a retryable error frame is retried
        like a 503) and falls back to ``/v1/shards`` on 404 or 501, remembering the choice.

        Raises:
            AuthError: missing token or read-only scope.
            RemoteError: the server rejected the shard (400: invalid, a missing xorb, a
                wrong verification hash) or failed.
        """
        what = "shard upload"
        hdrs = {"Content-Type": p.OCTET}
        if self._shards_v2 is not False:

            def v2() -> bool | None:
                r = self._send(
                    "POST",
                    self._url(p.SHARDS_V2),
                    what=what,
                    content=data,
                    headers=hdrs,
                    ok=(200, 404, 501),
                )
                if r.status_code != 200:
                    self._shards_v2 = False
                    return None
                self._shards_v2 = True
                result, retryable, message = self._ndjson_result(r.text)
                if result is not None:
                    return result
                err = RemoteError(f"{what}: {message}", 200)
                if retryable:
                    raise Retry(err)
                raise err

            done = self._retrying(v2)
            if done is not None:
                return done
        r = self._request("POST", self._url(p.SHARDS_V1), what=what, content=data, headers=hdrs)
        doc = self._json(r, what)
        return bool(doc.get("result", 1)) if isinstance(doc, dict) else True

    @staticmethod
    def _ndjson_result(text: str) -> tuple[bool | None, bool, str]:
        """``(result, retryable, message)`` from a V2 shard response stream."""
        for line in reversed(text.splitlines()):
            if not line.strip():
                continue
            try:
                frame = json.loads(line)
            except ValueError:
                return None, True, "unreadable progress stream"
            if not isinstance(frame, dict):
                continue
            kind = frame.get("type")
            if kind == "result":
                return bool(frame.get("result", 1)), False, ""
            if kind == "error":
                return (
                    None,
                    bool(frame.get("retryable", False)),
                    str(frame.get("message", ""))[:200],
                )
            break
        return None, True, "the progress stream ended without a result"

    def query_chunk(self, chunk_hash_: bytes) -> Shard | None:
        """Global dedup: the server's shard of xorbs holding this chunk, or ``None``.

        Chunk hashes in the returned shard are HMAC-protected with its footer key (see
        ``gitxet.hashing.protected_chunk_hash``). 429 is not retried, as in hf_xet.
        """
        cx = to_hex(chunk_hash_)
        r = self._request(
            "GET",
            self._url(p.chunk_route(cx)),
            what=f"dedup query for {cx}",
            ok=(200, 404, 429),
            retry_statuses=_RETRY_STATUSES - {429},
            limit=MAX_SHARD_ANSWER,
        )
        if r.status_code != 200:
            return None
        try:
            return parse_shard(r.content)
        except FormatError as e:
            raise RemoteError(f"dedup query for {cx}: {e}") from None


Reconstruction = p.Reconstruction


def discover(
    repo_url: str, *, token: str | None = None, http: httpx.Client | None = None
) -> p.Discovery:
    """Ask a git remote where its CAS is: ``GET <repo_url>/info/xet``.

    ``token`` (or credentials in the URL) authenticate the request; the answer then also
    carries an access token. A 404 means the git server has no CAS.

    Raises:
        RemoteError: no discovery document (404), a malformed one, or a transfer failure.
    """
    client = http or httpx.Client(timeout=30.0, verify=_tls())
    url = repo_url.rstrip("/") + p.DISCOVERY_SUFFIX
    where = f"discovery at {strip_credentials(url)}"
    headers = {"User-Agent": USER_AGENT}
    auth: httpx.Auth | None = None
    if token is not None:
        auth = httpx.BasicAuth("gitxet", token)
    else:
        s = urlsplit(url)
        if s.username is not None:  # kept for a redirect on the same server
            auth = httpx.BasicAuth(unquote(s.username), unquote(s.password or ""))
    try:
        for _ in range(MAX_REDIRECTS + 1):
            try:
                request = client.build_request("GET", url, headers=headers)
                if auth is not None:
                    request = next(auth.auth_flow(request))
                r = _read_bounded(client, request, what=where, limit=MAX_JSON_ANSWER, timeout=30.0)
            except httpx.TransportError as e:
                raise transport_error("discovery", repo_url, e) from None
            location = r.headers.get("location")
            if r.status_code not in _REDIRECTS or location is None:
                break
            target = urljoin(url, location)
            if not same_server(url, target):
                # the answer would name the CAS our token goes to: never another server's
                raise RemoteError(
                    f"{where}: redirected to another server "
                    f"({strip_credentials(target)[:200]}), not followed; if that is the "
                    "repository's new address, use it as the remote's URL",
                    r.status_code,
                )
            url = target
        else:
            raise RemoteError(f"{where}: more than {MAX_REDIRECTS} redirects", r.status_code)
        if r.status_code in (401, 403):
            raise AuthError(f"{where}: HTTP {r.status_code}", r.status_code)
        if r.status_code != 200:
            raise RemoteError(
                f"{where}: HTTP {r.status_code} (not a gitxet remote?)",
                r.status_code,
            )
        try:
            doc = r.json()
        except ValueError:
            raise RemoteError(f"{where}: response is not JSON") from None
        return p.Discovery.from_json(doc)
    finally:
        if http is None:
            client.close()


def same_server(url: str, target: str) -> bool:
    """Whether ``target`` is on ``url``'s server: the same scheme, host and port, or the
    same host moved from http to https (its default port)."""
    a, b = urlsplit(url), urlsplit(target)
    try:
        a_port, b_port = a.port, b.port
    except ValueError:
        return False
    if a.hostname is None or a.hostname != b.hostname:
        return False
    if (a.scheme, a_port) == (b.scheme, b_port):
        return True
    return a.scheme == "http" and b.scheme == "https" and b_port in (None, 443)


def is_gitxet_server(repo_url: str, *, timeout: float = 5.0) -> bool:
    """Whether ``repo_url``'s server is a gitxet server that wants a token: an anonymous
    ``info/refs`` request is answered 401 with the ``realm="gitxet"`` challenge.

    Used by the git credential helper to offer ``GITXET_TOKEN`` (and the ``git xet login``
    hint) only to gitxet servers, never to every host git asks about. Any failure is "no".
    """
    url = info_refs_url(repo_url)
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False, verify=_tls()) as client:
            request = client.build_request("GET", url, headers={"User-Agent": USER_AGENT})
            r = _read_bounded(client, request, what=url, limit=MAX_JSON_ANSWER, timeout=timeout)
    except (httpx.HTTPError, RemoteError, ValueError):
        return False
    return is_gitxet_challenge(r.status_code, r.headers.get("www-authenticate", ""))
