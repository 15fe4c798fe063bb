"""The cache tier's ASGI app: the CAS read routes of ``gitxet.server.app``, answered by a
:class:`~gitxet.server.tier.TierService` in front of an origin.

Routes (the client-facing half of the server's table in ``docs/operations/server.md``):

* ``GET /v1|v2/reconstructions/{file}`` (+ ``Range``), ``GET /v1/reconstructions?file_id=``
* ``GET /v1/xorb-locations/{xorb}``, ``GET /v1/file-shards/{file}``,
  ``POST /v1/file-shards``, ``POST /v1/file-presence``, ``GET /v1/chunks/{prefix}/{chunk}``
* ``GET /xorb-data/default/{xorb}?exp=&sig=`` with ``Range`` (the tier's own signed URLs)
* ``GET /healthz``, ``GET /v1/tier-stats`` (JSON counters), ``POST /v1/telemetry``
* uploads (``/v1/xorbs``, ``/v1/xorb-grants``, ``/v1/shards``, ...): ``405``, read-only;
  git (``*.git/...``): ``404``, git goes to the origin.

A request without a token, or with one the origin refuses, gets the origin's 401/403 and
no data. Errors are JSON ``{"error": "..."}``; tokens and queries never reach logs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from gitxet.errors import (
    AuthError,
    FileNotFoundInCASError,
    IntegrityError,
    RangeNotSatisfiableError,
    RemoteError,
    UnreachableError,
    XorbNotFoundError,
)
from gitxet.remote import protocol as p
from gitxet.server.app import (
    SMALL_BODY,
    AccessLog,
    HttpError,
    batch_ids,
    batch_reconstruction,
    data_request,
    data_span,
    hash_param,
    range_param,
    read_body,
    request_token,
)
from gitxet.server.index import parse_hex
from gitxet.server.signing import UrlSigner
from gitxet.server.tier import StaleUrlError, TierService

if TYPE_CHECKING:
    from gitxet.server.metrics import ServerMetrics

__all__ = ["TierState", "create_tier_app"]

log = logging.getLogger("gitxet.server.tier")


@dataclass
class TierState:
    """What the tier's handlers share."""

    tier: TierService
    signer: UrlSigner
    public_url: str | None = None
    #: request counters and the tier's own (``--metrics``); None without prometheus_client
    metrics: ServerMetrics | None = None


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _st(request: Request) -> TierState:
    state: TierState = request.app.state.gitxet_tier
    return state


def _data_url(request: Request) -> Callable[[str], str]:
    st = _st(request)
    base = st.public_url or str(request.base_url).rstrip("/")
    now = time.time()
    return lambda hx: f"{base}/xorb-data/{p.DEFAULT_PREFIX}/{hx}?{st.signer.data_query(hx, now)}"


async def _as_client(request: Request, fn: Callable[[], Any]) -> Any:
    """``fn()`` in a worker thread, its origin requests carrying the client's token."""
    tier = _st(request).tier
    token = request_token(request)

    def call() -> Any:
        with tier.as_client(token):
            return fn()

    return await run_in_threadpool(call)


# ---------------------------------------------------------------------------- routes


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok", "tier": True})


async def tier_stats(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(_st(request).tier.stats_doc))


async def telemetry(request: Request) -> Response:
    return JSONResponse({})


async def _reconstruction(request: Request, version: int) -> Response:
    fhash = hash_param(request, "file_id")
    rng = range_param(request)
    tier = _st(request).tier
    url_for = _data_url(request)
    rec = await _as_client(request, lambda: tier.reconstruction(fhash, rng, url_for))
    return JSONResponse(rec.to_v2() if version == 2 else rec.to_v1())


async def reconstruction_v1(request: Request) -> Response:
    return await _reconstruction(request, 1)


async def reconstruction_v2(request: Request) -> Response:
    return await _reconstruction(request, 2)


async def reconstruction_batch(request: Request) -> Response:
    hashes = batch_ids(request)
    tier = _st(request).tier
    url_for = _data_url(request)

    def build() -> dict[str, Any]:
        return batch_reconstruction(hashes, lambda h: tier.reconstruction(h, None, url_for))

    return JSONResponse(await _as_client(request, build))


async def xorb_location(request: Request) -> Response:
    xh = hash_param(request, "xorb")
    tier = _st(request).tier
    url_for = _data_url(request)
    loc = await _as_client(request, lambda: tier.location(xh, url_for))
    return JSONResponse(loc.to_json())


async def _forward(request: Request, path: str, *, body: bytes | None = None) -> Response:
    tier = _st(request).tier
    query = request.url.query
    status, content, ctype = await _as_client(
        request, lambda: tier.forward(request.method, path, body=body, query=query)
    )
    if status >= 500:
        raise HttpError(502, f"the origin answered {status}")
    headers = {"WWW-Authenticate": 'Bearer realm="gitxet"'} if status == 401 else None
    return Response(content, status_code=status, media_type=ctype, headers=headers)


async def file_shard(request: Request) -> Response:
    hash_param(request, "file_id")
    return await _forward(request, request.url.path)


async def dedup_chunk(request: Request) -> Response:
    hash_param(request, "chunk")
    return await _forward(request, request.url.path)


async def file_presence(request: Request) -> Response:
    return await _forward(request, p.FILE_PRESENCE, body=await read_body(request, SMALL_BODY))


async def file_shards(request: Request) -> Response:
    return await _forward(request, p.FILE_SHARDS, body=await read_body(request, SMALL_BODY))


async def xorb_data(request: Request) -> Response:
    st = _st(request)
    hx, xh, exp, rng = data_request(request, st.signer)
    tier = st.tier
    start, end, status, headers = data_span(hx, rng, tier.data_size(xh), exp)
    pieces = await run_in_threadpool(tier.read, xh, start, end)
    # the first piece before the status line: a request that cannot be served fails cleanly
    first = await run_in_threadpool(next, pieces, None)
    length = end - start + 1
    if first is not None and len(first) == length:
        return Response(first, status_code=status, headers=headers, media_type=p.OCTET)

    async def rest() -> AsyncIterator[bytes | memoryview]:
        if first is not None:
            yield first
        try:
            async for piece in iterate_in_threadpool(pieces):
                yield piece
        except Exception as e:  # headers are out: all that can be done is to cut it short
            log.error("xorb %s: serving stopped: %s", hx, e)
            raise

    headers["Content-Length"] = str(length)
    return StreamingResponse(rest(), status_code=status, headers=headers, media_type=p.OCTET)


async def read_only(request: Request) -> Response:
    upstream = _st(request).tier.upstream
    raise HttpError(405, f"this is a read-only gitxet cache tier: upload to the origin {upstream}")


async def fallback(request: Request) -> Response:
    path = request.url.path
    if ".git/" in path or path.endswith(".git"):
        raise HttpError(404, "a cache tier serves no git repositories: git goes to the origin")
    raise HttpError(404, "no such route")


# ---------------------------------------------------------------------------- errors


def _exc_response(request: Request, exc: Exception) -> Response:
    if isinstance(exc, HttpError):
        return _error(exc.status, exc.message, exc.headers)
    if isinstance(exc, StaleUrlError):
        return _error(403, str(exc))
    if isinstance(exc, AuthError):
        xh = request.path_params.get("xorb")
        if request.url.path.startswith("/xorb-data/"):
            # the origin refused the tier's remembered URL (expired): the client asks again
            h = parse_hex(xh) if isinstance(xh, str) else None
            if h is not None:
                _st(request).tier.forget(h)
            return _error(403, "this data URL is no longer valid here; ask for a new location")
        hdr = {"WWW-Authenticate": 'Bearer realm="gitxet"'} if exc.status == 401 else None
        return _error(exc.status or 403, f"the origin refused the token: {exc}", hdr)
    if isinstance(exc, RangeNotSatisfiableError):
        return _error(416, str(exc), {"Content-Range": f"bytes */{exc.size}"})
    if isinstance(exc, (FileNotFoundInCASError, XorbNotFoundError)):
        return _error(404, str(exc))
    if isinstance(exc, IntegrityError):
        log.error("origin data refused: %s", exc)
        return _error(
            502, f"the origin sent data that failed verification ({exc}); it is not served"
        )
    if isinstance(exc, UnreachableError):
        log.error("origin unreachable: %s", exc)
        return _error(502, f"the origin cannot be reached: {exc.reason}", {"Retry-After": "1"})
    if isinstance(exc, RemoteError):
        if exc.status in (400, 404, 416):
            return _error(exc.status, str(exc))
        log.error("origin failure: %s", exc)
        return _error(502, f"the origin failed: {exc}")
    log.exception("unhandled error", exc_info=exc)
    return _error(500, "internal server error")


def _handler(
    fn: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    async def wrapped(request: Request) -> Response:
        try:
            return await fn(request)
        except Exception as e:  # every failure becomes a JSON status, never a traceback
            return _exc_response(request, e)

    wrapped.__name__ = fn.__name__
    return wrapped


def create_tier_app(state: TierState) -> ASGIApp:
    """The tier's ASGI application (wrapped in the server's access-log middleware)."""
    h = _handler
    methods = ["GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS"]
    routes = [
        Route(p.HEALTHZ, h(healthz), methods=["GET"]),
        Route("/v1/tier-stats", h(tier_stats), methods=["GET"]),
        Route(p.TELEMETRY, h(telemetry), methods=["POST"]),
        Route("/v1/reconstructions", h(reconstruction_batch), methods=["GET"]),
        Route("/v1/reconstructions/{file_id}", h(reconstruction_v1), methods=["GET"]),
        Route("/v2/reconstructions/{file_id}", h(reconstruction_v2), methods=["GET"]),
        Route("/v1/xorb-locations/{xorb}", h(xorb_location), methods=["GET"]),
        Route(p.FILE_SHARDS, h(file_shards), methods=["POST"]),
        Route("/v1/file-shards/{file_id}", h(file_shard), methods=["GET"]),
        Route("/v1/chunks/{prefix}/{chunk}", h(dedup_chunk), methods=["GET"]),
        Route(p.FILE_PRESENCE, h(file_presence), methods=["POST"]),
        Route("/xorb-data/{prefix}/{xorb}", h(xorb_data), methods=["GET"]),
        Route("/v1/xorbs/{path:path}", h(read_only), methods=methods),
        Route("/v1/xorb-grants/{path:path}", h(read_only), methods=methods),
        Route("/v1/xorb-commits/{path:path}", h(read_only), methods=methods),
        Route("/xorb-upload/{path:path}", h(read_only), methods=methods),
        Route(p.SHARDS_V1, h(read_only), methods=methods),
        Route(p.SHARDS_V2, h(read_only), methods=methods),
        Route("/{path:path}", h(fallback), methods=methods),
    ]
    app = Starlette(routes=routes)
    # no 307 to a path without its trailing slash: a path no route takes (a control
    # character, which the catch-all cannot match) gets a 404, not a redirect
    app.router.redirect_slashes = False
    app.state.gitxet_tier = state
    return AccessLog(app, state.metrics, logging.getLogger("gitxet.server.tier.access"))
