"""The CAS client: the Xet HTTP API over httpx (the only module that imports httpx).

:class:`CASClient` speaks the same dialect as hf_xet 1.8, so it works against our server
and any Xet CAS: reconstructions V2 with a V1 fallback, xorb uploads through upload grants
with a ``POST /v1/xorbs`` fallback, shard uploads V2 with a V1 fallback, global-dedup
queries, and ranged xorb GETs on the signed URLs a reconstruction hands out. Fallback
choices are remembered per client, as hf_xet does.

Reliability: connection errors, 429 (except for dedup queries), 500, 502, 503 and 504 are
retried with exponential backoff and jitter, honouring ``Retry-After``; a ranged GET whose
body breaks off resumes from the last byte received, and data URLs that expire during a long
download are replaced by asking for the rest of the file. Transfers run on a bounded pool.

What is verified:

* :meth:`CASClient.download` of a whole file re-hashes every decoded chunk and checks the
  Merkle root against the file hash before returning (:class:`IntegrityError` otherwise).
  The bytes are written to ``out`` as they arrive, so write to a temporary file and rename
  on success.
* Ranged reads check every fetched range structurally (chunk headers, LZ4 frames, chunk
  count, each term's ``unpacked_length``). To check their content too, pass the file's
  shard from :meth:`CASClient.get_file_shard` (a gitxet extension route): its CAS blocks
  give every chunk hash, which are themselves checked against the file hash.
* Dedup shards and file shards are parsed strictly; upload answers are checked for shape.

Tokens are sent only as ``Authorization: Bearer`` to the CAS endpoint; data and grant URLs
carry their own signature and never get the header. No error message contains a token or a
URL query string.
"""

from __future__ import annotations

import email.utils
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

import httpx

from gitxet.errors import (
    AuthError,
    FileNotFoundInCASError,
    FormatError,
    IntegrityError,
    RemoteError,
    XorbNotFoundError,
)
from gitxet.formats.shard import Shard, parse_shard
from gitxet.formats.xorb import decode_chunks, verify_xorb
from gitxet.hashing import chunk_hash, file_hash, from_hex, to_hex
from gitxet.remote import protocol as p
from gitxet.settings import strip_credentials
from gitxet.util.retry import Retry, RetryPolicy, retry_call

__all__ = ["CASClient", "RetryPolicy", "discover"]

USER_AGENT = "gitxet"
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

TokenSource = str | Callable[[], str] | None


def _retry_after(resp: httpx.Response) -> float | None:
    v = resp.headers.get("retry-after")
    if not v:
        return None
    v = v.strip()
    if v.isdigit():
        return float(v)
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _detail(resp: httpx.Response) -> str:
    """A short, printable reason from an error response body."""
    try:
        text = resp.text
    except (UnicodeDecodeError, httpx.ResponseNotRead):
        return ""
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


class CASClient:
    """A client for one CAS endpoint. Thread-safe; use as a context manager or ``close()``.

    ``token`` is a bearer token, a zero-argument callable returning one (called per request,
    so it may refresh), or ``None``. Pass ``http`` to inject a transport (tests use
    ``httpx.MockTransport``); otherwise the client owns an ``httpx.Client``.
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
        self.http = http or httpx.Client(
            timeout=httpx.Timeout(timeout, connect=15.0),
            limits=httpx.Limits(max_connections=max_parallel * 2),
            follow_redirects=False,
        )
        self.max_parallel = max(1, max_parallel)
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self.session_id = str(uuid.uuid4())
        self._lock = threading.Lock()
        # Remembered fallbacks (None = not known yet).
        self._recon_v2: bool | None = None
        self._shards_v2: bool | None = None
        self._grants: bool | None = None

    # ---- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Close the HTTP client if this object created it."""
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
            h["Authorization"] = f"Bearer {tok}"
        return h

    def _url(self, path: str) -> str:
        return self.endpoint + path

    def _request(
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
    ) -> httpx.Response:
        """Send with retries; return a response whose status is in ``ok``, else raise."""
        return retry_call(
            lambda _: self._send_once(
                method,
                url,
                what=what,
                auth=auth,
                ok=ok,
                retry_statuses=retry_statuses,
                headers=headers,
                content=content,
                json_body=json_body,
            ),
            self.retry,
            sleep=self._sleep,
        )

    def _send_once(
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
    ) -> httpx.Response:
        """One try of :meth:`_request`: a transient failure raises :class:`Retry`."""
        hdrs = self._headers(auth)
        if headers:
            hdrs.update(headers)
        try:
            resp = self.http.request(method, url, headers=hdrs, content=content, json=json_body)
        except httpx.TransportError as e:
            error = RemoteError(f"{what}: {type(e).__name__} talking to {strip_credentials(url)}")
            raise Retry(error) from None
        if resp.status_code in frozenset(ok):
            return resp
        if resp.status_code in retry_statuses:
            raise Retry(self._error(resp, what), after=_retry_after(resp))
        raise self._error(resp, what)

    def _error(self, resp: httpx.Response, what: str) -> RemoteError:
        status = resp.status_code
        msg = f"{what}: HTTP {status}"
        d = _detail(resp)
        if d:
            msg += f" ({d})"
        if status == 401:
            return AuthError(msg + "; the token is missing, invalid or expired", status)
        if status == 403:
            return AuthError(msg + "; the token's scope does not allow this", status)
        return RemoteError(msg, status)

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

    def fetch_xorb_range(self, url: str, start: int, end: int) -> bytes:
        """GET bytes ``[start, end]`` (inclusive, as in ``url_range``) of a data URL.

        No Authorization header is sent (the URL is signed). A body that breaks off is
        resumed from the last byte received.

        Raises:
            RemoteError: after the retries, or on a short/long body or a non-206 answer.
        """
        if end < start:
            raise ValueError(f"inverted range {start}-{end}")
        want = end - start + 1
        buf = bytearray()  # kept across attempts: a retry resumes after the last byte
        what = f"xorb range {strip_credentials(url)}"

        def attempt(_: int) -> bytes:
            hdrs = self._headers(auth=False)
            hdrs["Range"] = p.format_range(start + len(buf), end)
            try:
                with self.http.stream("GET", url, headers=hdrs) as resp:
                    if resp.status_code not in (200, 206):
                        resp.read()
                        if resp.status_code in _RETRY_STATUSES:
                            raise Retry(self._error(resp, what), after=_retry_after(resp))
                        raise self._error(resp, what)
                    if resp.status_code == 200:
                        # A server that ignored Range sends the whole object: slice it.
                        body = resp.read()
                        if len(body) <= end:
                            raise RemoteError(f"{what}: object shorter than the range")
                        return bytes(body[start : end + 1])
                    for part in resp.iter_bytes():
                        buf.extend(part)
                        if len(buf) > want:
                            raise RemoteError(f"{what}: longer than the {want} bytes asked for")
            except httpx.TransportError as e:
                error = RemoteError(f"{what}: {type(e).__name__} after {len(buf)} bytes")
                raise Retry(error) from None
            if len(buf) != want:
                raise Retry(RemoteError(f"{what}: got {len(buf)} of {want} bytes"))
            return bytes(buf)

        return retry_call(attempt, self.retry, sleep=self._sleep)

    def fetch_chunks(self, fi: p.FetchInfo) -> list[bytes]:
        """Fetch and decode the chunks ``[fi.chunk_start, fi.chunk_end)`` a fetch entry names.

        Raises:
            RemoteError: transfer failure, or bytes that are not the chunks announced.
        """
        raw = self.fetch_xorb_range(fi.url, fi.byte_start, fi.byte_end)
        try:
            return decode_chunks(raw, expected_count=fi.chunk_end - fi.chunk_start)
        except FormatError as e:
            raise RemoteError(f"xorb range {strip_credentials(fi.url)}: {e}") from None

    def iter_file(
        self,
        file_hash_: bytes,
        byte_range: tuple[int, int] | None = None,
        *,
        verify: bool = True,
        chunk_hashes: Mapping[str, Sequence[bytes]] | None = None,
    ) -> Iterator[bytes]:
        """Yield the bytes of a file (or of ``[start, end)``) in order, fetched in parallel.

        With ``verify`` a whole-file read is checked against the file hash at the end (an
        :class:`IntegrityError` is raised after the last piece). ``chunk_hashes`` maps a
        xorb's hex to its chunk hashes (from :meth:`get_file_shard`); when given, every
        decoded chunk is checked against it, which also covers ranged reads.
        """
        want_start = 0 if byte_range is None else byte_range[0]
        want_end = None if byte_range is None else byte_range[1]
        check_file = verify and byte_range is None
        entries: list[tuple[bytes, int]] = []
        recon = self.get_reconstruction(file_hash_, byte_range)
        out_pos = want_start  # file offset of the next byte to yield
        next_chunk = want_start - recon.offset_into_first_range  # where the next chunk starts
        refreshes = 0
        while True:
            try:
                for term, chunks in self._term_chunks(recon):
                    if chunk_hashes is not None:
                        self._check_chunks(term, chunks, chunk_hashes)
                    for c in chunks:
                        c_start = next_chunk
                        next_chunk += len(c)
                        if check_file:
                            entries.append((chunk_hash(c), len(c)))
                        if next_chunk <= out_pos:
                            continue
                        hi = len(c) if want_end is None else min(len(c), want_end - c_start)
                        lo = out_pos - c_start
                        if hi > lo:
                            yield c[lo:hi] if lo or hi < len(c) else c
                            out_pos = c_start + hi
                        if want_end is not None and out_pos >= want_end:
                            return
                break
            except AuthError as e:
                # A data URL expired mid-download (403): ask again for the rest, starting
                # at the next chunk so hashing and offsets carry on seamlessly.
                if e.status != 403 or refreshes >= 3:
                    raise
                refreshes += 1
                recon = self.get_reconstruction(file_hash_, (next_chunk, want_end))
                if recon.offset_into_first_range:
                    raise RemoteError(
                        f"reconstruction of {to_hex(file_hash_)}: a range starting on a chunk "
                        "boundary came back with an offset"
                    ) from None
        if check_file and file_hash(entries) != file_hash_:
            raise IntegrityError("file", to_hex(file_hash_), "downloaded chunks do not hash to it")

    @staticmethod
    def _check_chunks(
        term: p.Term, chunks: list[bytes], known: Mapping[str, Sequence[bytes]]
    ) -> None:
        hashes = known.get(term.xorb_hex)
        if hashes is None or len(hashes) < term.chunk_end:
            raise IntegrityError("xorb", term.xorb_hex, "no chunk hashes known to verify against")
        for i, c in enumerate(chunks):
            if chunk_hash(c) != hashes[term.chunk_start + i]:
                raise IntegrityError(
                    "xorb", term.xorb_hex, f"chunk {term.chunk_start + i} does not match its hash"
                )

    def _term_chunks(self, recon: p.Reconstruction) -> Iterator[tuple[p.Term, list[bytes]]]:
        """Each term with its decoded chunks, fetching distinct ranges once, in parallel.

        ``max_parallel`` fetches run at once and at most ``2 * max_parallel`` ranges are
        held ahead of the term being yielded; a range is dropped after its last term.
        """
        terms = recon.terms
        fis = [recon.fetch_for(t) for t in terms]
        keys = [(f.url, f.byte_start, f.byte_end) for f in fis]
        last_use = {k: i for i, k in enumerate(keys)}
        futures: dict[tuple[str, int, int], Future[list[bytes]]] = {}
        order = list(dict.fromkeys(keys))  # distinct ranges in order of first use
        by_key = dict(zip(keys, fis, strict=True))
        next_submit = 0
        window = 2 * self.max_parallel  # ranges held (in flight or fetched, not yet used)
        with ThreadPoolExecutor(self.max_parallel, thread_name_prefix="gitxet-fetch") as ex:
            try:
                for i, (term, fi, k) in enumerate(zip(terms, fis, keys, strict=True)):
                    # Keep the pool busy ahead of the reader, and make sure the range this
                    # term needs is on its way even when the window is full of reused ones.
                    while next_submit < len(order) and (len(futures) < window or k not in futures):
                        nk = order[next_submit]
                        futures[nk] = ex.submit(self.fetch_chunks, by_key[nk])
                        next_submit += 1
                    unit = futures[k].result()
                    if last_use[k] == i:
                        del futures[k]
                    chunks = unit[
                        term.chunk_start - fi.chunk_start : term.chunk_end - fi.chunk_start
                    ]
                    if sum(len(c) for c in chunks) != term.unpacked_length:
                        raise RemoteError(
                            f"term {i} of xorb {term.xorb_hex}: decoded length differs from "
                            f"unpacked_length {term.unpacked_length}"
                        )
                    yield term, chunks
            finally:
                for f in futures.values():
                    f.cancel()

    def download(
        self,
        file_hash_: bytes,
        out: BinaryIO,
        byte_range: tuple[int, int] | None = None,
        *,
        verify: bool = True,
    ) -> int:
        """Write a file (or ``[start, end)`` of it) to ``out``; returns the bytes written.

        See :meth:`iter_file` for what is verified.
        """
        n = 0
        for piece in self.iter_file(file_hash_, byte_range, verify=verify):
            out.write(piece)
            n += len(piece)
        return n

    def read_range(self, file_hash_: bytes, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a file (structurally checked; see :meth:`iter_file`)."""
        return b"".join(self.iter_file(file_hash_, (start, end), verify=False))

    def get_file_shard(self, file_hash_: bytes) -> Shard:
        """The file's block plus the CAS blocks of its xorbs (gitxet extension route).

        Raises:
            FileNotFoundInCASError: unknown file (or a server without the extension).
            RemoteError: malformed shard or transfer failure.
        """
        fx = to_hex(file_hash_)
        r = self._request(
            "GET", self._url(p.FILE_SHARD.format(file_id=fx)), what=f"shard of {fx}", ok=(200, 404)
        )
        if r.status_code == 404:
            raise FileNotFoundInCASError(fx)
        try:
            return parse_shard(r.content)
        except FormatError as e:
            raise RemoteError(f"shard of {fx}: {e}") from None

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
        if r.status_code == 404:
            raise XorbNotFoundError(hx)
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
            "GET", self._url(p.FILE_SHARD.format(file_id=fx)), what=f"shard of {fx}", ok=(200, 404)
        )
        if r.status_code == 404:
            return []
        try:
            parse_shard(r.content)
        except FormatError as e:
            raise RemoteError(f"shard of {fx}: {e}") from None
        return [r.content]

    def read_xorb_chunks(
        self, xorb_hash: bytes, start: int, end: int, location: p.XorbLocation | None = None
    ) -> list[bytes]:
        """Decoded chunks ``[start, end)`` of a xorb, each verified against its hash.

        Pass a ``location`` from :meth:`xorb_location` to save a request (its URL must not
        have expired).

        Raises:
            IndexError: the range is not inside the xorb.
            IntegrityError: a chunk does not match its hash.
        """
        loc = location or self.xorb_location(xorb_hash)
        if not 0 <= start < end <= loc.num_chunks:
            raise IndexError(f"chunk range [{start}, {end}) outside a {loc.num_chunks}-chunk xorb")
        fi = p.FetchInfo(start, end, loc.url, loc.byte_offsets[start], loc.byte_offsets[end] - 1)
        chunks = self.fetch_chunks(fi)
        for i, c in enumerate(chunks):
            if chunk_hash(c) != loc.chunk_hashes[start + i]:
                raise IntegrityError(
                    "xorb", loc.xorb_hex, f"chunk {start + i} does not match its hash"
                )
        return chunks

    def download_xorb(self, xorb_hash: bytes) -> bytes:
        """The whole serialized xorb (no footer), verified against ``xorb_hash``.

        What ``git fetch`` needs to fill a local store; the result can be handed to
        ``LocalCAS.put_xorb`` as is.
        """
        loc = self.xorb_location(xorb_hash)
        body = self.fetch_xorb_range(loc.url, 0, loc.byte_offsets[-1] - 1)
        try:
            verify_xorb(body, xorb_hash)
        except FormatError as e:
            raise IntegrityError(
                "xorb", loc.xorb_hex, f"downloaded bytes are not a xorb ({e})"
            ) from None
        return body

    # ---- uploads -----------------------------------------------------------------------

    def upload_xorb(self, xorb_hash: bytes, body: bytes) -> bool:
        """Upload a serialized xorb (no footer); ``False`` if the server already had it.

        Uses the upload-grant flow when the server offers it (a 404 on the grant route
        switches this client to ``POST /v1/xorbs`` for good).

        Raises:
            AuthError: missing token or read-only scope.
            RemoteError: rejected (400: the bytes do not hash to ``xorb_hash``) or failed.
        """
        hx = to_hex(xorb_hash)
        what = f"upload of xorb {hx}"
        if self._grants is not False:
            done = self._upload_with_grant(hx, body, what)
            if done is not None:
                return done
        r = self._request("POST", self._url(p.xorb_route(hx)), what=what, content=body)
        doc = self._json(r, what)
        return bool(doc.get("was_inserted", True)) if isinstance(doc, dict) else True

    def _upload_with_grant(self, hx: str, body: bytes, what: str) -> bool | None:
        """The grant flow; ``None`` when the server has no grant route."""
        req = p.grant_request(len(body), p.crc64nvme(body))
        for _ in range(3):
            r = self._request(
                "POST",
                self._url(p.xorb_grant_route(hx)),
                what=what,
                json_body=req,
                ok=(200, 201, 404),
            )
            if r.status_code == 404:
                self._grants = False
                return None
            self._grants = True
            if r.status_code == 200:
                return False
            grant = p.Grant.from_json(self._json(r, what))
            put = self._request(
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
            if put.status_code == 403:  # grant expired: ask again
                continue
            c = self._request(
                "POST", self._url(p.xorb_commit_route(hx, grant.id)), what=what, ok=(200, 404)
            )
            if c.status_code == 404:  # the data did not arrive: ask again
                continue
            doc = self._json(c, what) if c.content else {}
            return bool(doc.get("was_inserted", True)) if isinstance(doc, dict) else True
        raise RemoteError(f"{what}: the upload grant was refused three times")

    def upload_xorbs(
        self,
        items: Iterable[tuple[bytes, bytes]],
        on_done: Callable[[bytes, bool], None] | None = None,
    ) -> dict[bytes, bool]:
        """Upload ``(xorb_hash, body)`` pairs, ``max_parallel`` at a time.

        At most ``2 * max_parallel`` bodies are held at once, so ``items`` may be a lazy
        generator reading xorbs from disk. Returns ``{hash: was_inserted}``.
        """
        out: dict[bytes, bool] = {}
        pending: dict[Future[bool], bytes] = {}
        with ThreadPoolExecutor(self.max_parallel, thread_name_prefix="gitxet-upload") as ex:

            def drain(limit: int) -> None:
                while len(pending) > limit:
                    fut = next(iter(pending))
                    h = pending.pop(fut)
                    out[h] = fut.result()
                    if on_done is not None:
                        on_done(h, out[h])

            try:
                for h, body in items:
                    pending[ex.submit(self.upload_xorb, h, body)] = h
                    drain(2 * self.max_parallel)
                drain(0)
            finally:
                for fut in pending:
                    fut.cancel()
        return out

    def upload_shard(self, data: bytes) -> bool:
        """Register an upload shard (after its xorbs); ``False`` if it was already known.

        Tries ``/v2/shards`` (NDJSON progress frames) and falls back to ``/v1/shards`` on
        404 or 501, remembering the choice.

        Raises:
            AuthError: missing token or read-only scope.
            RemoteError: the server rejected the shard (400: invalid, a missing xorb, a
                wrong verification hash) or failed.
        """
        what = "shard upload"

        def attempt_v2(_: int) -> bool | None:
            """The V2 result, or ``None`` for a server without V2."""
            r = self._send_once(
                "POST",
                self._url(p.SHARDS_V2),
                what=what,
                content=data,
                headers={"Content-Type": p.OCTET},
                ok=(200, 404, 501),
            )
            if r.status_code != 200:
                self._shards_v2 = False
                return None
            self._shards_v2 = True
            result, retryable, message = self._ndjson_result(r.text)
            if result is not None:
                return result
            error = RemoteError(f"{what}: {message}", 200)
            if retryable:
                raise Retry(error)
            raise error

        if self._shards_v2 is not False:
            # one retry budget for both transport failures and retryable error frames
            done = retry_call(attempt_v2, self.retry, sleep=self._sleep)
            if done is not None:
                return done
        r = self._request(
            "POST",
            self._url(p.SHARDS_V1),
            what=what,
            content=data,
            headers={"Content-Type": p.OCTET},
        )
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
    client = http or httpx.Client(timeout=30.0, follow_redirects=True)
    url = repo_url.rstrip("/") + p.DISCOVERY_SUFFIX
    where = f"discovery at {strip_credentials(url)}"
    headers = {"User-Agent": USER_AGENT}
    auth: httpx.Auth | None = None
    if token is not None:
        auth = httpx.BasicAuth("gitxet", token)
    try:
        try:
            r = (
                client.get(url, headers=headers, auth=auth)
                if auth
                else client.get(url, headers=headers)
            )
        except httpx.TransportError as e:
            raise RemoteError(f"{where}: {type(e).__name__}") from None
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


def is_gitxet_server(repo_url: str, *, timeout: float = 5.0) -> bool:
    """Whether ``repo_url``'s server is a gitxet server that wants a token: an anonymous
    ``info/refs`` request is answered 401 with the ``realm="gitxet"`` challenge.

    Used by the git credential helper to offer ``GITXET_TOKEN`` (and the ``git xet login``
    hint) only to gitxet servers, never to every host git asks about. Any failure is "no".
    """
    url = repo_url.rstrip("/") + "/info/refs?service=git-upload-pack"
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False) as client:
            r = client.get(url, headers={"User-Agent": USER_AGENT})
    except (httpx.HTTPError, ValueError):
        return False
    challenge = r.headers.get("www-authenticate", "")
    return r.status_code == 401 and 'realm="gitxet"' in challenge
