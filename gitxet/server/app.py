"""The ASGI app: the Xet CAS API (``/v1``, ``/v2``), signed data/grant URLs, and git over HTTP.

Routes (hashes are Xet hex; see ``docs/operations/server.md`` for the full table):

* ``GET /v1|v2/reconstructions/{file}`` (+ ``Range``), ``GET /v1/reconstructions?file_id=``
* ``POST /v1/xorbs/default/{xorb}``; ``POST /v1/xorb-grants/default/{xorb}`` →
  ``PUT /xorb-upload/default/{xorb}/{grant}?…`` (signed) → ``POST /v1/xorb-commits/…``
* ``POST /v1/shards`` (JSON) and ``/v2/shards`` (NDJSON frames)
* ``GET /v1/chunks/{default|default-merkledb}/{chunk}`` (global dedup)
* ``GET /v1/file-shards/{file}`` (gitxet extension: file block + xorb chunk lists)
* ``POST /v1/file-shards`` (gitxet extension: the blocks of up to 1,000 files at once)
* ``POST /v1/file-presence`` (gitxet extension: which of many files are unknown)
* ``GET /v1/xorb-locations/{xorb}`` (gitxet extension: signed URL + chunk layout)
* ``GET /xorb-data/default/{xorb}?exp=&sig=`` with ``Range`` (signed, no Authorization)
* ``/{name}.git/info/refs|git-upload-pack|git-receive-pack`` (``git http-backend``),
  ``/{name}.git/info/xet`` (CAS discovery); ``/healthz``; ``POST /v1/telemetry``

Everything else is 404: hf_xet takes a 200 from an unknown grant route as "already there".
Errors are JSON ``{"error": "..."}`` (one ``text/plain`` line on git routes, which git shows);
tokens and URL queries never appear in logs or errors.
"""

from __future__ import annotations

import base64
import errno
import hmac
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gitxet.errors import (
    BackendError,
    FileNotFoundInCASError,
    FormatError,
    GitError,
    IntegrityError,
    RangeNotSatisfiableError,
    RemoteError,
    RequestRejectedError,
    XorbNotFoundError,
)
from gitxet.formats.xorb import MAX_XORB_READ_BYTES
from gitxet.hashing import from_hex, to_hex
from gitxet.remote import protocol as p
from gitxet.server.auth import TokenRecord, TokenStore, valid_repo_name
from gitxet.server.backends import ObjectMissingError
from gitxet.server.githttp import SERVICES, BodyTooLargeError, GitHttpBackend
from gitxet.server.index import parse_hex, xorb_key
from gitxet.server.service import CasService
from gitxet.server.signing import UrlSigner

if TYPE_CHECKING:
    from gitxet.server.metrics import ServerMetrics

__all__ = ["AccessLog", "AppState", "create_app", "request_token"]

access_log = logging.getLogger("gitxet.server.access")
log = logging.getLogger("gitxet.server")

_GIT_PATH = re.compile(r"^/(?P<name>.*?)\.git(?P<rest>/.*)?$")
SMALL_BODY = 1 << 20
#: Data responses up to this size are read in one go; larger ones are streamed.
_ONE_SHOT = 8 << 20


class HttpError(Exception):
    """Answer ``status`` with a JSON error (raised inside handlers)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass
class AppState:
    """Everything the handlers share."""

    service: CasService
    tokens: TokenStore
    signer: UrlSigner
    git: GitHttpBackend
    max_body: int
    public_url: str | None = None
    #: A per-process read token for the server's own pre-receive hooks (never stored).
    internal_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    #: request counters (``--metrics``); ``None`` when prometheus_client is not installed
    metrics: ServerMetrics | None = None


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


# ---------------------------------------------------------------------------- helpers


def request_token(request: Request) -> str | None:
    """The token from ``Authorization: Bearer`` or the password of Basic auth."""
    h = request.headers.get("authorization")
    if not h:
        return None
    scheme, _, value = h.partition(" ")
    scheme = scheme.lower()
    if scheme == "bearer":
        return value.strip() or None
    if scheme == "basic":
        try:
            user, _, pw = (
                base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
            )
        except ValueError:  # binascii.Error, UnicodeDecodeError, or non-ASCII text
            return None
        return pw or user or None
    return None


#: What the internal token may do: read the CAS (the pre-receive check), nothing else.
_HOOK_TOKEN = TokenRecord("receive-hook", "", "read", None, 0)


def _authorize(
    request: Request, need: str, repo: str | None = None, *, challenge: str = "Bearer"
) -> TokenRecord:
    state: AppState = request.app.state.gitxet
    tok = request_token(request)
    hdr = {"WWW-Authenticate": f'{challenge} realm="gitxet"'}
    if tok is None:
        raise HttpError(401, "authentication required: send a gitxet token", hdr)
    rec = state.tokens.authenticate(tok)
    if rec is None and hmac.compare_digest(tok.encode(), state.internal_token.encode()):
        rec = _HOOK_TOKEN
    if rec is None:
        raise HttpError(401, "invalid or revoked token", hdr)
    request.scope.setdefault("state", {})["token_id"] = rec.id
    if not rec.allows(need, repo):
        what = f"repository {repo}" if repo else "the CAS"
        raise HttpError(403, f"token {rec.id} has no {need} access to {what}")
    return rec


async def read_body(request: Request, limit: int) -> bytes:
    cl = request.headers.get("content-length")
    if cl is not None:
        n = p.parse_decimal(cl)
        if n is None:
            raise HttpError(400, "bad Content-Length")
        if n > limit:
            raise HttpError(413, f"body of {n} bytes exceeds the {limit}-byte limit")
    buf = bytearray()
    async for part in request.stream():
        buf += part
        if len(buf) > limit:
            raise HttpError(413, f"body exceeds the {limit}-byte limit")
    return bytes(buf)


async def _json_body(request: Request, limit: int) -> Any:
    """The request body parsed as JSON; 400 for anything that is not (deep nesting too)."""
    data = await read_body(request, limit)
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise HttpError(400, "body is not valid JSON") from None


def hash_param(request: Request, name: str) -> bytes:
    h = parse_hex(request.path_params[name])
    if h is None:
        raise HttpError(400, f"{name} is not a 64-digit Xet hex hash")
    return h


def _base_url(request: Request) -> str:
    state: AppState = request.app.state.gitxet
    if state.public_url:
        return state.public_url
    return str(request.base_url).rstrip("/")


Range = tuple[int, int | None] | None  # a Range header: first byte, last byte (None: to the end)


def range_param(request: Request) -> Range:
    v = request.headers.get("range")
    if v is None:
        return None
    try:
        return p.parse_range_header(v)
    except ValueError as e:
        raise HttpError(400, str(e)) from None


def check_prefix(request: Request) -> None:
    if request.path_params["prefix"] != p.DEFAULT_PREFIX:
        raise HttpError(404, "unknown xorb prefix")


def _st(request: Request) -> AppState:
    state: AppState = request.app.state.gitxet
    return state


# ---------------------------------------------------------------------------- CAS routes


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def telemetry(request: Request) -> Response:
    await read_body(request, SMALL_BODY)  # read and drop: fire-and-forget for hf_xet
    return JSONResponse({})


def _data_url(request: Request) -> Callable[[str], str]:
    base = _base_url(request)
    signer = _st(request).signer
    now = time.time()
    return lambda hx: f"{base}/xorb-data/{p.DEFAULT_PREFIX}/{hx}?{signer.data_query(hx, now)}"


async def _reconstruction(request: Request, version: int) -> Response:
    _authorize(request, "read")
    fhash = hash_param(request, "file_id")
    rng = range_param(request)
    recon = await run_in_threadpool(
        _st(request).service.reconstruct, fhash, rng, _data_url(request)
    )
    return JSONResponse(recon.to_v2() if version == 2 else recon.to_v1())


async def reconstruction_v1(request: Request) -> Response:
    return await _reconstruction(request, 1)


async def reconstruction_v2(request: Request) -> Response:
    return await _reconstruction(request, 2)


def batch_ids(request: Request) -> list[bytes]:
    """The ``file_id`` query parameters of a batch reconstruction (1 to 1000 hashes)."""
    ids = request.query_params.getlist("file_id")
    if not ids or len(ids) > 1000:
        raise HttpError(400, "give 1 to 1000 file_id parameters")
    hashes = [parse_hex(i) for i in ids]
    if any(h is None for h in hashes):
        raise HttpError(400, "file_id is not a 64-digit Xet hex hash")
    return [h for h in hashes if h is not None]


def batch_reconstruction(hashes: list[bytes], one: Callable[[bytes], Any]) -> dict[str, Any]:
    """The batch answer: each file's terms, and the fetch info of all of them merged
    (``one(hash)`` is a file's reconstruction)."""
    files: dict[str, Any] = {}
    fetch: dict[str, list[Any]] = {}
    for h in hashes:
        doc = one(h).to_v1()
        files[to_hex(h)] = doc["terms"]
        for x, entries in doc["fetch_info"].items():
            have = fetch.setdefault(x, [])
            have.extend(e for e in entries if e not in have)
    return {"files": files, "fetch_info": fetch}


async def reconstruction_batch(request: Request) -> Response:
    _authorize(request, "read")
    hashes = batch_ids(request)
    url_for = _data_url(request)
    service = _st(request).service

    def build() -> dict[str, Any]:
        return batch_reconstruction(hashes, lambda h: service.reconstruct(h, None, url_for))

    return JSONResponse(await run_in_threadpool(build))


async def xorb_upload(request: Request) -> Response:
    check_prefix(request)
    _authorize(request, "write")
    xh = hash_param(request, "xorb")
    st = _st(request)
    if await run_in_threadpool(st.service.has_xorb, xh):
        # Do not make the client send 64 MiB for nothing; the body is left unread.
        return JSONResponse({"was_inserted": False})
    data = await read_body(request, min(st.max_body, MAX_XORB_READ_BYTES + (1 << 20)))
    inserted = await run_in_threadpool(st.service.put_xorb, xh, data)
    return JSONResponse({"was_inserted": inserted})


async def xorb_grant(request: Request) -> Response:
    check_prefix(request)
    _authorize(request, "write")
    xh = hash_param(request, "xorb")
    st = _st(request)
    try:
        length, crc = p.parse_grant_request(await _json_body(request, 64 * 1024))
    except RemoteError as e:
        raise HttpError(400, f"bad grant request: {e}") from None
    if length > min(st.max_body, MAX_XORB_READ_BYTES + (1 << 20)):
        raise HttpError(413, f"xorb of {length} bytes exceeds the upload limit")
    if await run_in_threadpool(st.service.has_xorb, xh):
        return JSONResponse({}, status_code=200)
    hx = to_hex(xh)
    gid = secrets.token_urlsafe(12)
    query = st.signer.grant_query(hx, gid, length, crc)
    url = f"{_base_url(request)}/xorb-upload/{p.DEFAULT_PREFIX}/{hx}/{gid}?{query}"
    grant = p.Grant(gid, "PUT", url, {"Content-Type": p.OCTET})
    return JSONResponse(grant.to_json(), status_code=201)


async def xorb_grant_put(request: Request) -> Response:
    check_prefix(request)
    xh = hash_param(request, "xorb")
    hx = to_hex(xh)
    gid = request.path_params["grant"]
    q = request.query_params
    st = _st(request)
    length, crc = q.get("len", ""), q.get("crc", "")
    if not st.signer.verify_grant(hx, gid, length, crc, q.get("exp", ""), q.get("sig", "")):
        raise HttpError(403, "grant URL signature is invalid or expired")
    if await run_in_threadpool(st.service.has_xorb, xh):
        raise HttpError(412, "xorb already stored")
    want = int(length)  # ASCII digits: verify_grant checked
    data = await read_body(request, want)
    if len(data) != want:
        raise HttpError(400, f"body is {len(data)} bytes, the grant says {length}")
    # The xorb hash (checked next) is the real integrity check; the CRC is only checked
    # when it is cheap, since the pure-Python fallback would hold the GIL for seconds.
    if crc and p.native_crc() and await run_in_threadpool(p.crc64nvme, data) != int(crc):
        raise HttpError(400, "body does not match the grant's CRC-64/NVME")
    await run_in_threadpool(st.service.put_xorb, xh, data)
    return Response(status_code=200)


async def xorb_commit(request: Request) -> Response:
    check_prefix(request)
    _authorize(request, "write")
    xh = hash_param(request, "xorb")
    if not await run_in_threadpool(_st(request).service.has_xorb, xh):
        raise HttpError(404, "no data was received for this grant")
    return JSONResponse({"was_inserted": True})


async def shards_v1(request: Request) -> Response:
    _authorize(request, "write")
    st = _st(request)
    data = await read_body(request, st.max_body)
    created = await run_in_threadpool(st.service.put_shard, data)
    return JSONResponse({"result": 1 if created else 0})


async def shards_v2(request: Request) -> Response:
    _authorize(request, "write")
    st = _st(request)
    data = await read_body(request, st.max_body)
    created = await run_in_threadpool(st.service.put_shard, data)
    frames = [
        {"type": "validating", "verified": 1, "total": 1},
        {"type": "committing", "stage": "uploading"},
        {"type": "committing", "stage": "syncing"},
        {"type": "result", "result": 1 if created else 0},
    ]
    body = "".join(json.dumps(f) + "\n" for f in frames)
    return Response(body, media_type=p.NDJSON)


async def file_presence(request: Request) -> Response:
    _authorize(request, "read")
    try:
        hexes = p.parse_presence_request(await _json_body(request, 1 << 20))
    except RemoteError as e:
        raise HttpError(400, f"bad presence request: {e}") from None
    missing = await run_in_threadpool(
        _st(request).service.missing_files, [from_hex(x) for x in hexes]
    )
    return JSONResponse({"missing": [to_hex(h) for h in missing]})


async def dedup_chunk(request: Request) -> Response:
    if request.path_params["prefix"] not in p.CHUNK_PREFIXES:
        raise HttpError(404, "unknown chunk prefix")
    _authorize(request, "read")
    ch = hash_param(request, "chunk")
    data = await run_in_threadpool(_st(request).service.dedup_shard, ch)
    if data is None:
        raise HttpError(404, "chunk not known")
    return Response(data, media_type=p.OCTET)


async def file_shard(request: Request) -> Response:
    _authorize(request, "read")
    fhash = hash_param(request, "file_id")
    with_xorbs = request.url.query != p.FILE_SHARD_TERMS_ONLY
    service = _st(request).service
    data = await run_in_threadpool(lambda: service.file_shard(fhash, with_xorbs=with_xorbs))
    return Response(data, media_type=p.OCTET)


async def file_shards(request: Request) -> Response:
    _authorize(request, "read")
    try:
        hexes = p.parse_presence_request(
            await _json_body(request, 1 << 20), p.MAX_FILE_SHARDS_BATCH
        )
    except RemoteError as e:
        raise HttpError(400, f"bad file-shards request: {e}") from None
    service = _st(request).service
    data = await run_in_threadpool(service.file_blocks, [from_hex(x) for x in hexes])
    return Response(data, media_type=p.OCTET)


async def xorb_location(request: Request) -> Response:
    _authorize(request, "read")
    xh = hash_param(request, "xorb")
    lay = await run_in_threadpool(_st(request).service.layout, xh)
    hx = to_hex(xh)
    loc = p.XorbLocation(
        hx, _data_url(request)(hx), lay.chunk_hashes, lay.byte_offsets, lay.data_offsets
    )
    return JSONResponse(loc.to_json())


def data_request(request: Request, signer: UrlSigner) -> tuple[str, bytes, str, Range]:
    """(hex, hash, expiry, range) of a signed ``GET /xorb-data/...``; 403 unless signed."""
    check_prefix(request)
    hx = request.path_params["xorb"]
    xh = parse_hex(hx)
    q = request.query_params
    exp = q.get("exp", "")
    if xh is None or not signer.verify_data(hx, exp, q.get("sig", "")):
        raise HttpError(403, "data URL signature is invalid or expired")
    return hx, xh, exp, range_param(request)


def data_span(hx: str, rng: Range, size: int, exp: str) -> tuple[int, int, int, dict[str, str]]:
    """(first byte, last byte, status, headers) of the answer to ``rng`` of a ``size``-byte
    xorb whose URL expires at ``exp``; 416 for a range starting past its end."""
    start, end = (0, size - 1) if rng is None else (rng[0], size - 1 if rng[1] is None else rng[1])
    if start >= size:
        raise RangeNotSatisfiableError(f"xorb {hx}", size)
    end = min(end, size - 1)
    max_age = max(0, int(exp) - int(time.time()))
    headers = {
        "Accept-Ranges": "bytes",
        "Cache-Control": f"public, max-age={max_age}, immutable",
        "ETag": f'"{hx}"',
    }
    status = 200
    if rng is not None:
        status = 206
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    return start, end, status, headers


async def xorb_data(request: Request) -> Response:
    st = _st(request)
    hx, xh, exp, rng = data_request(request, st.signer)
    service = st.service
    lay = service.index.cached_layout(xh)
    if lay is None:
        lay = await run_in_threadpool(service.layout, xh)
    start, end, status, headers = data_span(hx, rng, lay.body_size, exp)
    length = end - start + 1
    key = xorb_key(xh)
    backend = service.backend

    def first(at: int, n: int) -> bytes:
        try:
            return backend.get_range(key, at, n)
        except ObjectMissingError:
            # indexed, but gone from storage: not stored any more, so a client that has it
            # can upload it again (an upload was answered "already stored" before)
            log.error("storage lost xorb %s", hx)
            service.index.forget_xorb(xh)
            raise HttpError(
                404, f"xorb {hx} is lost from this server's storage (indexed, object gone)"
            ) from None

    if length <= _ONE_SHOT:
        data = await run_in_threadpool(first, start, length)
        if len(data) != length:
            raise IntegrityError("xorb", hx, "stored object is truncated")
        return Response(data, status_code=status, headers=headers, media_type=p.OCTET)

    # A stored object cut short (a disk or bucket fault) must fail before the 206 headers
    # go out: its last byte is read first (the object is immutable), so the stream below
    # never breaks off halfway
    last = await run_in_threadpool(first, end, 1)
    if len(last) != 1:
        raise IntegrityError("xorb", hx, "stored object is truncated")

    async def pieces() -> AsyncIterator[bytes]:
        pos = start
        while pos <= end:
            n = min(_ONE_SHOT, end + 1 - pos)
            part = await run_in_threadpool(backend.get_range, key, pos, n)
            if len(part) != n:
                raise IntegrityError("xorb", hx, "stored object is truncated")
            yield part
            pos += n

    headers["Content-Length"] = str(length)
    return StreamingResponse(pieces(), status_code=status, headers=headers, media_type=p.OCTET)


# ---------------------------------------------------------------------------- git routes


async def _git_or_404(request: Request) -> Response:
    path = request.url.path
    m = _GIT_PATH.match(path)
    if m is None:
        raise HttpError(404, "no such route")
    name, rest = m.group("name"), m.group("rest") or ""
    if not valid_repo_name(name):
        raise HttpError(400, "invalid repository name")
    if rest == p.DISCOVERY_SUFFIX and request.method == "GET":
        return _discovery(request, name)
    if rest not in SERVICES:
        raise HttpError(404, "no such route")
    return await _git(request, name, rest)


def _discovery(request: Request, name: str) -> Response:
    doc = p.Discovery(_base_url(request))
    if request_token(request) is not None:
        _authorize(request, "read", name, challenge="Basic")
        tok = request_token(request)
        doc = p.Discovery(doc.cas_url, doc.token_hint, tok, int(time.time()) + 24 * 3600)
    return JSONResponse(doc.to_json(), headers={"Cache-Control": "no-store"})


async def _git(request: Request, name: str, rest: str) -> Response:
    st = _st(request)
    query = request.url.query
    service = request.query_params.get("service", "")
    if request.method not in ("GET", "POST") or (rest == "/info/refs") != (request.method == "GET"):
        raise HttpError(405, "method not allowed")
    write = rest == "/git-receive-pack" or (rest == "/info/refs" and service == "git-receive-pack")
    rec = _authorize(request, "write" if write else "read", name, challenge="Basic")
    if not st.git.exists(name):
        if write and rest == "/info/refs":
            if await st.git.create(name):
                log.info("created repository %s on first push (token %s)", name, rec.id)
        else:
            raise HttpError(404, f"repository {name} does not exist")
    if write:
        await st.git.ensure_receive_hook(name)
    cl = p.parse_decimal(request.headers.get("content-length", ""))
    if cl is not None and cl > st.git.max_body:
        raise HttpError(413, f"body exceeds the {st.git.max_body}-byte limit")
    client = request.client.host if request.client else ""
    cgi = await st.git.run(
        name=name,
        path_suffix=rest,
        method=request.method,
        query=query,
        headers={k.lower(): v for k, v in request.headers.items()},
        body=request.stream(),
        remote_user=rec.id,
        remote_addr=client,
    )
    return StreamingResponse(cgi.body, status_code=cgi.status, headers=dict(cgi.headers))


async def fallback(request: Request) -> Response:
    try:
        return await _git_or_404(request)
    except HttpError as e:
        if _GIT_PATH.match(request.url.path) is None:
            raise
        # git shows a text/plain error body to its user ("remote: <line>"); JSON it hides,
        # leaving only "The requested URL returned error: 403"
        return PlainTextResponse(f"{e.message}\n", status_code=e.status, headers=e.headers)


# ---------------------------------------------------------------------------- errors


def _exc_response(exc: Exception) -> Response:
    if isinstance(exc, HttpError):
        return _error(exc.status, exc.message, exc.headers)
    if isinstance(exc, RangeNotSatisfiableError):
        return _error(416, str(exc), {"Content-Range": f"bytes */{exc.size}"})
    if isinstance(exc, ObjectMissingError):  # indexed, but gone from storage
        log.error("storage lost an object: %s", exc)
        return _error(404, str(exc))
    if isinstance(exc, (FileNotFoundInCASError, XorbNotFoundError)):
        return _error(404, str(exc))
    if isinstance(exc, (RequestRejectedError, FormatError)):
        return _error(400, str(exc))
    if isinstance(exc, BodyTooLargeError):
        return _error(413, str(exc))
    if isinstance(exc, ClientDisconnect):  # gone mid-body (or cut off by --body-timeout)
        return _error(400, "the client disconnected before sending the whole body")
    if isinstance(exc, BackendError):
        log.error("storage failure: %s", exc)
        return _error(503, "storage temporarily unavailable", {"Retry-After": "1"})
    if isinstance(exc, IntegrityError):  # the server's stored copy (uploads are checked)
        log.error("stored data is damaged: %s", exc)
        # 410, not 500: a damaged object stays damaged, so a client must not retry it
        return _error(410, f"{exc}: this server's copy is damaged; it cannot be served")
    if isinstance(exc, GitError):
        log.error("git failure: %s", exc)
        return _error(500, "git backend failed")
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        # too many clients for the open-file limit (warned about at start): they may retry
        log.error("out of file descriptors (raise ulimit -n): %s", exc)
        return _error(503, "server busy: out of file descriptors", {"Retry-After": "1"})
    log.exception("unhandled error", exc_info=exc)
    return _error(500, "internal server error")


def _handler(
    fn: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    async def wrapped(request: Request) -> Response:
        try:
            return await fn(request)
        except Exception as e:  # every failure becomes a JSON status, never a traceback
            return _exc_response(e)

    wrapped.__name__ = fn.__name__
    return wrapped


# ---------------------------------------------------------------------------- access log


class AccessLog:
    """ASGI middleware: one structured line per request, without query strings or tokens."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: ServerMetrics | None = None,
        log: logging.Logger = access_log,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        info: dict[str, Any] = {"status": 0, "bytes": 0}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                info["status"] = message["status"]
            elif message["type"] == "http.response.body":
                info["bytes"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            if self.metrics is not None:
                self.metrics.observe(
                    scope.get("path", ""), info["status"], time.perf_counter() - t0, info["bytes"]
                )
            if self.log.isEnabledFor(logging.INFO):
                client = scope.get("client")
                rec = {
                    "client": client[0] if client else None,
                    "method": scope.get("method"),
                    "path": scope.get("path"),  # never the query: it holds signatures
                    "status": info["status"],
                    "bytes": info["bytes"],
                    "ms": round((time.perf_counter() - t0) * 1000, 1),
                    "token": scope.get("state", {}).get("token_id"),
                }
                self.log.info(json.dumps(rec, separators=(",", ":")))


# ---------------------------------------------------------------------------- assembly


def create_app(state: AppState) -> ASGIApp:
    """The ASGI application for ``state`` (wrapped in the access-log middleware)."""
    h = _handler
    methods = ["GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS"]
    routes = [
        Route(p.HEALTHZ, h(healthz), methods=["GET"]),
        Route(p.TELEMETRY, h(telemetry), methods=["POST"]),
        Route("/v1/reconstructions", h(reconstruction_batch), methods=["GET"]),
        Route("/v1/reconstructions/{file_id}", h(reconstruction_v1), methods=["GET"]),
        Route("/v2/reconstructions/{file_id}", h(reconstruction_v2), methods=["GET"]),
        Route("/v1/xorbs/{prefix}/{xorb}", h(xorb_upload), methods=["POST"]),
        Route("/v1/xorb-grants/{prefix}/{xorb}", h(xorb_grant), methods=["POST"]),
        Route("/v1/xorb-commits/{prefix}/{xorb}/grant/{grant}", h(xorb_commit), methods=["POST"]),
        Route("/xorb-upload/{prefix}/{xorb}/{grant}", h(xorb_grant_put), methods=["PUT"]),
        Route(p.SHARDS_V1, h(shards_v1), methods=["POST"]),
        Route(p.SHARDS_V2, h(shards_v2), methods=["POST"]),
        Route("/v1/chunks/{prefix}/{chunk}", h(dedup_chunk), methods=["GET"]),
        Route(p.FILE_SHARDS, h(file_shards), methods=["POST"]),
        Route("/v1/file-shards/{file_id}", h(file_shard), methods=["GET"]),
        Route(p.FILE_PRESENCE, h(file_presence), methods=["POST"]),
        Route("/v1/xorb-locations/{xorb}", h(xorb_location), methods=["GET"]),
        Route("/xorb-data/{prefix}/{xorb}", h(xorb_data), methods=["GET"]),
        Route("/{path:path}", h(fallback), methods=methods),
    ]
    app = Starlette(routes=routes)
    # no 307 to a path without its trailing slash: a path no route takes (a control
    # character, which the catch-all cannot match) gets a 404, not a redirect
    app.router.redirect_slashes = False
    app.state.gitxet = state
    return AccessLog(app, state.metrics)
