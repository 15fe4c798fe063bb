"""CASClient: the API against httpx.MockTransport (fallbacks, grants, retries), ranged data
GETs against a real loopback HTTP server (resume, short bodies, retries)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import httpx
import pytest

from gitxet.errors import AuthError, FileNotFoundInCASError, IntegrityError, RemoteError
from gitxet.formats.shard import parse_shard
from gitxet.hashing import to_hex
from gitxet.remote import protocol as p
from gitxet.remote.client import BufferPool, CASClient, RetryPolicy, discover
from tests.helpers.server_env import DataServer, Upload, build_upload

TOKEN = "gxt_000000000000_secret-token-value-that-must-not-leak-anywhere"
EP = "http://cas.test"
DATA_URL = "http://data.test/x?sig=SIGNATURE"

Handler = Callable[[httpx.Request], httpx.Response]


def client(handler: Handler, sleeps: list[float] | None = None, **kw: object) -> CASClient:
    http = httpx.Client(transport=httpx.MockTransport(handler))
    record = sleeps if sleeps is not None else []
    return CASClient(
        EP,
        TOKEN,
        http=http,
        retry=RetryPolicy(attempts=4, base_delay=0.01),
        sleep=record.append,
        **kw,
    )  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def upload() -> Upload:
    return build_upload(random.Random(9).randbytes(300_000))


def recon_for(u: Upload, url: str = DATA_URL) -> p.Reconstruction:
    n = len(u.xorb.chunk_sizes)
    hx = to_hex(u.xorb.hash)
    return p.Reconstruction(
        [p.Term(hx, 0, n, len(u.data))],
        {hx: [p.FetchInfo(0, n, url, 0, len(u.xorb.body) - 1)]},
    )


def serve_data(u: Upload, req: httpx.Request, body: bytes | None = None) -> httpx.Response:
    assert "authorization" not in req.headers  # data URLs authorise themselves
    a, b = p.parse_range_header(req.headers["range"])
    blob = u.xorb.body if body is None else body
    return httpx.Response(206, content=blob[a : (b or len(blob) - 1) + 1])


# ---- reconstruction -------------------------------------------------------------------------


def test_reconstruction_falls_back_to_v1_and_remembers(upload: Upload) -> None:
    seen: list[str] = []

    def h(req: httpx.Request) -> httpx.Response:
        seen.append(req.url.path)
        assert req.headers["authorization"] == f"Bearer {TOKEN}"
        if req.url.path.startswith("/v2/"):
            return httpx.Response(404)
        return httpx.Response(200, json=recon_for(upload).to_v1())

    c = client(h)
    fx = to_hex(upload.file_hash)
    assert c.get_reconstruction(upload.file_hash).terms[0].unpacked_length == len(upload.data)
    c.get_reconstruction(upload.file_hash)
    assert seen == [
        f"/v2/reconstructions/{fx}",
        f"/v1/reconstructions/{fx}",
        f"/v1/reconstructions/{fx}",
    ]


def test_reconstruction_v2_and_range_header(upload: Upload) -> None:
    def h(req: httpx.Request) -> httpx.Response:
        assert req.url.path.startswith("/v2/")
        assert req.headers["range"] == "bytes=10-19"
        return httpx.Response(200, json=recon_for(upload).to_v2())

    r = client(h).get_reconstruction(upload.file_hash, (10, 20))
    assert r.fetch_for(r.terms[0]).url == DATA_URL


def test_unknown_file_and_501_fallback() -> None:
    def h(req: httpx.Request) -> httpx.Response:
        return httpx.Response(501 if req.url.path.startswith("/v2/") else 404)

    with pytest.raises(FileNotFoundInCASError):
        client(h).get_reconstruction(b"\x01" * 32)


def test_retries_honour_retry_after_then_give_up() -> None:
    calls = 0

    def h(req: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(503, headers={"Retry-After": "2"}, json={"error": "busy"})

    sleeps: list[float] = []
    with pytest.raises(RemoteError, match="HTTP 503") as ei:
        client(h, sleeps).get_reconstruction(b"\x01" * 32)
    assert calls == 4 and sleeps == [2.0, 2.0, 2.0]
    assert ei.value.status == 503


def test_retry_then_success_and_connection_errors() -> None:
    calls = 0

    def h(req: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.ConnectError("refused")
        if calls == 2:
            return httpx.Response(429)
        return httpx.Response(200, json={"was_inserted": True})

    c = client(h)
    c._grants = False
    assert c.upload_xorb(b"\x02" * 32, b"body") is True
    assert calls == 3


@pytest.mark.parametrize(("status", "word"), [(401, "missing, invalid"), (403, "scope")])
def test_auth_errors_do_not_leak_the_token(status: int, word: str) -> None:
    def h(req: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"error": "nope"})

    with pytest.raises(AuthError, match=word) as ei:
        client(h).get_reconstruction(b"\x01" * 32)
    assert TOKEN not in str(ei.value)


# ---- ranged GETs of data URLs (a real loopback HTTP server) -------------------------------------


def test_ranged_get_reads_exactly_the_range(upload: Upload) -> None:
    body = upload.xorb.body
    with DataServer({"/x": body}) as ds:
        c = client(lambda req: httpx.Response(404))
        url = f"{ds.url}/x?sig=SIGNATURE"
        assert c.fetch_xorb_range(url, 0, len(body) - 1) == body
        into = bytearray(10)
        assert c.fetch_xorb_range(url, 5, 14, into) is into and into == body[5:15]
        assert ds.requests[0] == ("/x?sig=SIGNATURE", f"bytes=0-{len(body) - 1}")
        c.close()


def test_buffer_pool_reuses_a_mapping_only_once_its_views_are_gone() -> None:
    pool = BufferPool(4 << 20, keep=2)
    a = pool.take(3 << 20)
    a[:4] = b"held"
    held = a[:4]  # a reader still holds part of what was received into it
    del a
    b = pool.take(2 << 20)  # the first mapping is not free: a second one
    b[:4] = b"next"
    assert bytes(held) == b"held" and len(b) == 2 << 20
    c = pool.take(1 << 20)  # both taken, keep=2 reached: a fresh buffer
    assert not isinstance(c, memoryview)
    del held
    d = pool.take(4 << 20)  # the first is free again: reused (its bytes are still there)
    assert isinstance(d, memoryview) and bytes(d[:4]) == b"held"
    assert len(pool._maps) == 2
    assert len(pool.take(5 << 20)) == 5 << 20  # larger than the capacity: its own buffer
    pool.clear()  # the views taken stay valid; new ones come from new mappings
    assert bytes(d[:4]) == b"held" and len(pool._maps) == 0
    assert isinstance(pool.take(1 << 20), memoryview) and len(pool._maps) == 1


def test_ranged_get_resumes_after_a_broken_body(upload: Upload) -> None:
    body = upload.xorb.body
    cuts = [1000]

    def fault(path: str, start: int, end: int) -> tuple[str, int] | None:
        return ("cut", cuts.pop()) if cuts else None

    with DataServer({"/x": body}, fault) as ds:
        c = client(lambda req: httpx.Response(404))
        assert c.fetch_xorb_range(f"{ds.url}/x", 0, len(body) - 1) == body
        assert [r for _, r in ds.requests] == [
            f"bytes=0-{len(body) - 1}",
            f"bytes=1000-{len(body) - 1}",
        ]
        c.close()


def test_short_body_is_an_error_and_redacts_the_query(upload: Upload) -> None:
    with DataServer({"/x": upload.xorb.body}, lambda p, a, b: ("cut", 0)) as ds:
        sleeps: list[float] = []
        c = client(lambda req: httpx.Response(404), sleeps)
        with pytest.raises(RemoteError, match=r"got 0 of 10 bytes") as ei:
            c.fetch_xorb_range(f"{ds.url}/x?sig=SIGNATURE", 0, 9)
        assert "SIGNATURE" not in str(ei.value)
        assert len(ds.requests) == 4 and len(sleeps) == 3  # one budget of attempts
        c.close()


def test_data_url_403_is_an_auth_error_and_503_is_retried(upload: Upload) -> None:
    statuses = [503, 403]

    def fault(path: str, start: int, end: int) -> tuple[str, int] | None:
        return ("status", statuses.pop(0)) if statuses else None

    with DataServer({"/x": upload.xorb.body}, fault) as ds:
        c = client(lambda req: httpx.Response(404))
        with pytest.raises(AuthError):
            c.fetch_xorb_range(f"{ds.url}/x", 0, 9)
        assert len(ds.requests) == 2
        assert c.fetch_xorb_range(f"{ds.url}/x", 0, 9) == upload.xorb.body[:10]
        c.close()


# ---- uploads ------------------------------------------------------------------------------------


def grant_server(mode: dict[str, object]) -> tuple[Handler, list[str]]:
    log: list[str] = []
    state = {
        "stored": False,
        "put_fail": int(mode.get("put_fail", 0)),
        "commit_fail": int(mode.get("commit_fail", 0)),
    }

    def h(req: httpx.Request) -> httpx.Response:
        log.append(f"{req.method} {req.url.path}")
        if req.url.path.startswith("/v1/xorb-grants/"):
            if mode.get("no_grants"):
                return httpx.Response(404)
            body = json.loads(req.content)
            assert body["length"] == len(b"XORB-BYTES")
            assert body["checksum"] == {
                "algo": "crc64nvme",
                "value": str(p.crc64nvme(b"XORB-BYTES")),
            }
            if mode.get("exists"):
                return httpx.Response(200, json={})
            return httpx.Response(
                201,
                json={
                    "id": "g1",
                    "method": "PUT",
                    "url": "http://up.test/put?sig=x",
                    "headers": {"X-Need": "1"},
                },
            )
        if req.url.host == "up.test":
            assert "authorization" not in req.headers and req.headers["x-need"] == "1"
            assert req.content == b"XORB-BYTES"
            if state["put_fail"]:
                state["put_fail"] = int(state["put_fail"]) - 1
                return httpx.Response(403)
            state["stored"] = True
            return httpx.Response(200)
        if req.url.path.startswith("/v1/xorb-commits/"):
            assert req.url.path.endswith("/grant/g1")
            if state["commit_fail"]:
                state["commit_fail"] = int(state["commit_fail"]) - 1
                return httpx.Response(404)
            return httpx.Response(200, json={"was_inserted": True})
        if req.url.path.startswith("/v1/xorbs/default/"):
            assert req.content == b"XORB-BYTES"
            return httpx.Response(200, json={"was_inserted": True})
        return httpx.Response(404)

    return h, log


XH = b"\x03" * 32
XP = to_hex(XH)


def test_grant_flow() -> None:
    h, log = grant_server({})
    assert client(h).upload_xorb(XH, b"XORB-BYTES") is True
    assert log == [
        f"POST /v1/xorb-grants/default/{XP}",
        "PUT /put",
        f"POST /v1/xorb-commits/default/{XP}/grant/g1",
    ]


def test_grant_200_means_already_there() -> None:
    h, log = grant_server({"exists": True})
    assert client(h).upload_xorb(XH, b"XORB-BYTES") is False
    assert len(log) == 1


def test_grant_retries_on_expired_put_and_missing_commit() -> None:
    h, log = grant_server({"put_fail": 1, "commit_fail": 1})
    assert client(h).upload_xorb(XH, b"XORB-BYTES") is True
    assert sum(1 for e in log if "xorb-grants" in e) == 3


def test_grant_gives_up_after_the_retry_budget() -> None:
    h, log = grant_server({"put_fail": 5})
    with pytest.raises(RemoteError, match="expired before the data"):
        client(h).upload_xorb(XH, b"XORB-BYTES")
    # one attempt budget (4 in these tests) for the whole flow: nothing nests
    assert sum(1 for e in log if "xorb-grants" in e) == 4


def test_transient_failures_inside_a_grant_share_one_budget() -> None:
    h, _ = grant_server({})
    calls = 0

    def flaky(req: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if req.url.host == "up.test":
            return httpx.Response(503)
        return h(req)

    with pytest.raises(RemoteError, match="HTTP 503"):
        client(flaky).upload_xorb(XH, b"XORB-BYTES")
    assert calls == 8  # 4 attempts of (grant, PUT): not 4 x 4


def test_no_grants_falls_back_to_post_and_remembers() -> None:
    h, log = grant_server({"no_grants": True})
    c = client(h)
    assert c.upload_xorb(XH, b"XORB-BYTES") is True
    assert c.upload_xorb(XH, b"XORB-BYTES") is True
    assert log == [
        f"POST /v1/xorb-grants/default/{XP}",
        f"POST /v1/xorbs/default/{XP}",
        f"POST /v1/xorbs/default/{XP}",
    ]


def _ndjson(*frames: dict[str, object]) -> str:
    return "".join(json.dumps(f) + "\n" for f in frames)


def test_shard_v2_result_and_error_frames() -> None:
    frames = iter(
        [
            _ndjson(
                {"type": "validating", "verified": 1, "total": 1}, {"type": "result", "result": 0}
            ),
            _ndjson({"type": "error", "message": "missing xorb", "retryable": False}),
        ]
    )

    def h(req: httpx.Request) -> httpx.Response:
        assert req.url.path == "/v2/shards"
        return httpx.Response(200, text=next(frames))

    c = client(h)
    assert c.upload_shard(b"shard") is False
    with pytest.raises(RemoteError, match="missing xorb"):
        c.upload_shard(b"shard")


def test_shard_retries_share_one_budget() -> None:
    """Transport failures and retryable error frames count against the same attempts.

    (The V2 loop used to wrap ``_request``'s own retry loop: 4 x 4 tries here.)
    """
    calls = 0

    def h(req: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls % 2:
            raise httpx.ConnectError("reset")
        return httpx.Response(
            200, text=_ndjson({"type": "error", "message": "busy", "retryable": True})
        )

    sleeps: list[float] = []
    with pytest.raises(RemoteError, match="shard upload: busy"):
        client(h, sleeps).upload_shard(b"shard")
    assert calls == 4 and len(sleeps) == 3


def test_shard_falls_back_to_v1() -> None:
    paths: list[str] = []

    def h(req: httpx.Request) -> httpx.Response:
        paths.append(req.url.path)
        if req.url.path == "/v2/shards":
            return httpx.Response(404)
        return httpx.Response(200, json={"result": 1})

    c = client(h)
    assert c.upload_shard(b"s") is True
    assert c.upload_shard(b"s") is True
    assert paths == ["/v2/shards", "/v1/shards", "/v1/shards"]


def test_shard_rejection_is_an_error() -> None:
    def h(req: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": "shard file x: wrong verification hash"})

    with pytest.raises(RemoteError, match="verification") as ei:
        client(h).upload_shard(b"s")
    assert ei.value.status == 400


def test_query_chunk(upload: Upload) -> None:
    from gitxet.formats.shard import XorbInfo, dedup_response_shard

    info = XorbInfo.from_chunks(upload.xorb.hash, upload.xorb.chunk_hashes, upload.xorb.chunk_sizes)
    answer = dedup_response_shard([info], b"\x07" * 32, 1, 2**40)
    calls: list[str] = []

    def h(req: httpx.Request) -> httpx.Response:
        calls.append(req.url.path)
        if req.url.path.endswith("00" * 32):
            return httpx.Response(429)  # not retried
        if req.url.path.endswith("01" * 32):
            return httpx.Response(404)
        return httpx.Response(200, content=answer)

    c = client(h)
    assert c.query_chunk(b"\x00" * 32) is None
    assert c.query_chunk(b"\x01" * 32) is None
    shard = c.query_chunk(upload.xorb.chunk_hashes[0])
    assert shard is not None and shard.xorbs[0].xorb_hash == upload.xorb.hash
    assert len(calls) == 3
    assert parse_shard(answer).footer is not None


def test_discover() -> None:
    def h(req: httpx.Request) -> httpx.Response:
        assert req.url.path == "/data.git/info/xet"
        if "authorization" in req.headers:
            return httpx.Response(
                200, json={"casUrl": "http://cas:1/", "accessToken": "t", "exp": 9}
            )
        return httpx.Response(200, json={"casUrl": "http://cas:1", "tokenHint": "git-credential"})

    http = httpx.Client(transport=httpx.MockTransport(h))
    d = discover("http://git.test/data.git/", http=http)
    assert d.cas_url == "http://cas:1" and d.access_token is None
    d = discover("http://git.test/data.git", token="tok", http=http)
    assert d.access_token == "t" and d.expires == 9

    def missing(req: httpx.Request) -> httpx.Response:
        return httpx.Response(404)

    with pytest.raises(RemoteError, match="not a gitxet remote"):
        discover("http://git.test/x.git", http=httpx.Client(transport=httpx.MockTransport(missing)))


def _location(u: Upload, **changes: object) -> dict[str, object]:
    offs = [0]
    for size in u.xorb.chunk_sizes:
        offs.append(offs[-1] + size)
    loc = p.XorbLocation(
        to_hex(u.xorb.hash),
        DATA_URL,
        tuple(u.xorb.chunk_hashes),
        tuple(u.xorb.byte_offsets),
        tuple(offs),
    )
    doc = loc.to_json()
    doc.update(changes)
    return doc


def test_xorb_location_and_download(upload: Upload) -> None:
    with DataServer({"/x": upload.xorb.body}) as ds:

        def h(req: httpx.Request) -> httpx.Response:
            if req.url.path.endswith("00" * 32):
                return httpx.Response(404)
            return httpx.Response(200, json=_location(upload, url=f"{ds.url}/x?sig=s"))

        c = client(h)
        assert c.has_xorb(upload.xorb.hash) and not c.has_xorb(b"\x00" * 32)
        assert c.download_xorb(upload.xorb.hash) == upload.xorb.body
        c.close()


def test_xorb_location_is_checked_against_the_hash(upload: Upload) -> None:
    bad = _location(upload)
    hashes = list(bad["chunk_hashes"])  # type: ignore[call-overload]
    hashes[0], hashes[1] = hashes[1], hashes[0]
    bad["chunk_hashes"] = hashes

    def h(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=bad)

    with pytest.raises(IntegrityError, match="layout"):
        client(h).xorb_location(upload.xorb.hash)
    with pytest.raises(RemoteError, match="offset"):
        p.XorbLocation.from_json(_location(upload, byte_offsets=[0, 5]))


def test_retry_after_takes_ascii_seconds_or_a_date_and_nothing_else() -> None:
    from gitxet.remote.client import _parse_retry_after

    assert _parse_retry_after("7") == 7.0
    assert _parse_retry_after("²") is None  # str.isdigit() says yes; float() raises
    assert _parse_retry_after("٣") is None
    assert _parse_retry_after("9" * 40) is None
    assert _parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


def test_the_data_connections_of_threads_that_ended_are_closed() -> None:
    """A data connection is one per thread and host: those of threads that have ended are
    closed when another thread opens one (a mount's worker threads come and go; each kept
    a socket open until the client was closed: a descriptor leak under ulimit -n)."""
    import socket
    import threading

    from gitxet.remote.client import _DataConnections

    with socket.create_server(("127.0.0.1", 0)) as srv:  # connects queue in its backlog
        url = f"http://127.0.0.1:{srv.getsockname()[1]}/xorb"
        data = _DataConnections(10.0)
        used = []

        def use() -> None:
            conn, target = data.get(url)
            assert target == "/xorb"
            conn.connect()
            used.append(conn)

        for _ in range(3):
            t = threading.Thread(target=use)
            t.start()
            t.join()
        # the second thread closed the first's; the third the second's
        assert [c.sock is None for c in used] == [True, True, False]
        assert list(data._all) == [used[2]]
        conn, _ = data.get(url)  # this thread's own: the third thread's is closed too
        assert conn not in used and used[2].sock is None and list(data._all) == [conn]
        conn.connect()
        data.close()
        assert conn.sock is None and data._all == {}
        # a close() while a request was still connecting: the socket opened after it is
        # registered at the connection's next use, and closed by the next close()
        conn, _ = data.get(url)
        data.close()
        conn.connect()
        assert data.get(url)[0] is conn
        data.close()
        assert conn.sock is None


def test_a_range_larger_than_a_xorb_is_refused_before_any_buffer_or_request() -> None:
    """A hostile reconstruction's fetch entry claiming 2^40 bytes: no 1 TiB buffer is made,
    no request is sent (nothing listens on the URL's port)."""
    from gitxet.errors import RemoteError
    from gitxet.remote.client import CASClient

    with CASClient("http://127.0.0.1:9") as c, pytest.raises(RemoteError, match="more than a xorb"):
        c.fetch_xorb_range("http://127.0.0.1:9/xorb-data/x", 0, (1 << 40) - 1)
