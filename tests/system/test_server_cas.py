"""The CAS API on a real uvicorn (loopback), local disk and S3 (moto server process).

hf_xet 1.8 is the reference client: what it uploads must come back byte-identical through
``download_files`` and ranged ``XetSession`` streams, and through gitxet's own client; what
gitxet's client uploads must be downloadable by hf_xet. Bad input must get the right 4xx and
leave nothing stored.
"""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gitxet.errors import AuthError, RemoteError, XorbNotFoundError
from gitxet.formats.xorb import decode_chunks
from gitxet.hashing import from_hex, to_hex
from gitxet.remote.client import CASClient
from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig
from tests.helpers.server_env import S3_ENV, S3Server, build_upload, read_back

hf_xet = pytest.importorskip("hf_xet")

MAX_BODY = 8 << 20

# The brief pins hf_xet's classic entry points, which 1.8 marks as deprecated.
pytestmark = pytest.mark.filterwarnings("ignore:hf_xet.*deprecated:DeprecationWarning")


@dataclass
class Srv:
    url: str
    write: str
    read: str
    server: BackgroundServer
    root: Path


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    pytest.importorskip("moto.server", reason="S3 tests need moto[server] (the test extra)")
    s = S3Server(str(tmp_path_factory.mktemp("moto")))
    yield s
    s.stop()


@pytest.fixture(scope="module", params=["local", "s3"])
def srv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Srv]:
    root = tmp_path_factory.mktemp(f"srv-{request.param}")
    storage = None
    saved = {k: os.environ.get(k) for k in S3_ENV}
    if request.param == "s3":
        s3: S3Server = request.getfixturevalue("s3")
        s3.make_bucket("cas-suite")
        storage = s3.url("cas-suite")
        os.environ.update(S3_ENV)
    ts = TokenStore(str(root))
    write, _ = ts.create("write")
    read, _ = ts.create("read")
    server = BackgroundServer(
        ServerConfig(root=str(root), port=0, storage=storage, max_body=MAX_BODY)
    )
    server.start()
    yield Srv(server.url, write, read, server, root)
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _hf_token(tok: str) -> tuple[str, int]:
    return tok, int(time.time()) + 3600


def test_hf_xet_upload_then_every_download_path(srv: Srv, tmp_path: Path) -> None:
    data = random.Random(3).randbytes(3 * 1024 * 1024) + random.Random(10).randbytes(512_000)
    src = tmp_path / "f.bin"
    src.write_bytes(data)
    [info] = hf_xet.upload_files([str(src)], srv.url, _hf_token(srv.write), None, None, "model")
    assert info.hash == "fa94c3f695511ec0ea17ce8c1e44a60b966f8610bd421db000ff67327d338c76"

    out = tmp_path / "out.bin"
    dl = hf_xet.PyXetDownloadInfo(str(out), info.hash, len(data))
    hf_xet.download_files([dl], srv.url, _hf_token(srv.read), None, None)
    assert out.read_bytes() == data

    group = hf_xet.XetSession().new_download_stream_group(
        endpoint=srv.url, token=srv.read, token_expiry_unix_secs=int(time.time()) + 3600
    )
    fi = hf_xet.XetFileInfo(info.hash, len(data))
    for a, b in [(14_989, 2_000_000), (0, 1), (len(data) - 1, len(data)), (31_548, len(data))]:
        assert b"".join(group.download_stream(fi, a, b)) == data[a:b], (a, b)

    with CASClient(srv.url, srv.read) as c:
        fh = from_hex(info.hash)
        assert read_back(c, fh) == data  # every chunk verified, terms against the file hash
        assert read_back(c, fh, (100_000, 1_500_000)) == data[100_000:1_500_000]
        assert read_back(c, fh, (5, 70_000)) == data[5:70_000]
        shard = c.get_file_shard(fh)
        # Global dedup: the file's first chunk is known and answered with a keyed shard.
        first = shard.xorbs[0].chunks[shard.files[0].terms[0].chunk_start].hash
        dedup = c.query_chunk(first)
        assert dedup is not None and dedup.footer is not None and dedup.footer.protected


def test_gitxet_upload_then_hf_xet_download(srv: Srv, tmp_path: Path) -> None:
    up = build_upload(random.Random(21).randbytes(700_000))
    with CASClient(srv.url, srv.write) as c:
        assert c.upload_xorb(up.xorb.hash, up.xorb.body) is True
        assert c.upload_xorb(up.xorb.hash, up.xorb.body) is False
        assert c.upload_shard(up.shard) is True
        assert c.upload_shard(up.shard) is False
    out = tmp_path / "o.bin"
    dl = hf_xet.PyXetDownloadInfo(str(out), to_hex(up.file_hash), len(up.data))
    hf_xet.download_files([dl], srv.url, _hf_token(srv.read), None, None)
    assert out.read_bytes() == up.data
    # The plain POST path and shards v1 work too (a client that skips grants and v2).
    up2 = build_upload(random.Random(22).randbytes(50_000))
    h = {"Authorization": f"Bearer {srv.write}"}
    r = httpx.post(
        f"{srv.url}/v1/xorbs/default/{to_hex(up2.xorb.hash)}", content=up2.xorb.body, headers=h
    )
    assert r.status_code == 200 and r.json() == {"was_inserted": True}
    r = httpx.post(f"{srv.url}/v1/shards", content=up2.shard, headers=h)
    assert r.status_code == 200 and r.json() == {"result": 1}
    with CASClient(srv.url, srv.read) as c:
        assert read_back(c, up2.file_hash) == up2.data


def _get(srv: Srv, path: str, tok: str | None = None, **kw: object) -> httpx.Response:
    headers = dict(kw.pop("headers", {}) or {})  # type: ignore[call-overload]
    if tok:
        headers["Authorization"] = f"Bearer {tok}"
    return httpx.get(srv.url + path, headers=headers, **kw)  # type: ignore[arg-type]


def _post(
    srv: Srv, path: str, tok: str | None, content: bytes = b"", **kw: object
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {tok}"} if tok else {}
    return httpx.post(srv.url + path, headers=headers, content=content, **kw)  # type: ignore[arg-type]


def _stored(srv: Srv, xorb_hash: bytes) -> bool:
    return srv.server.state.service.backend.exists(f"xorbs/default/{to_hex(xorb_hash)}")


def test_bad_uploads_are_rejected_and_nothing_is_stored(srv: Srv) -> None:
    up = build_upload(random.Random(31).randbytes(200_000))
    hx = to_hex(up.xorb.hash)
    # Hash mismatch: the body is a valid xorb, but of other chunks.
    other = build_upload(random.Random(32).randbytes(10_000))
    r = _post(srv, f"/v1/xorbs/default/{hx}", srv.write, other.xorb.body)
    assert r.status_code == 400 and "mismatch" in r.json()["error"]
    # Malformed and truncated bodies.
    for body in (b"garbage", up.xorb.body[:-3], b""):
        assert _post(srv, f"/v1/xorbs/default/{hx}", srv.write, body).status_code == 400
    # Oversized body.
    r = _post(srv, f"/v1/xorbs/default/{hx}", srv.write, bytes(MAX_BODY + 1))
    assert r.status_code == 413
    # Read-only and missing tokens.
    assert _post(srv, f"/v1/xorbs/default/{hx}", srv.read, up.xorb.body).status_code == 403
    r = _post(srv, f"/v1/xorbs/default/{hx}", None, up.xorb.body)
    assert r.status_code == 401 and "bearer" in r.headers["www-authenticate"].lower()
    assert (
        _post(srv, f"/v1/xorbs/default/{hx}", "gxt_000000000000_" + "A" * 43, b"").status_code
        == 401
    )
    assert _post(srv, "/v1/xorbs/default/not-a-hash", srv.write, b"x").status_code == 400
    assert not _stored(srv, up.xorb.hash)
    # A shard naming a xorb that is not stored; a malformed shard; read-only token.
    r = _post(srv, "/v1/shards", srv.write, up.shard)
    assert r.status_code == 400 and "not stored" in r.json()["error"]
    assert _post(srv, "/v2/shards", srv.write, up.shard[:100]).status_code == 400
    assert _post(srv, "/v1/shards", srv.read, up.shard).status_code == 403
    assert _get(srv, f"/v1/reconstructions/{to_hex(up.file_hash)}", srv.read).status_code == 404
    with CASClient(srv.url, srv.read) as c, pytest.raises(AuthError):
        c.upload_xorb(up.xorb.hash, up.xorb.body)
    assert not _stored(srv, up.xorb.hash)


def test_grant_urls_check_signature_length_and_checksum(srv: Srv) -> None:
    up = build_upload(random.Random(41).randbytes(100_000))
    hx = to_hex(up.xorb.hash)
    from gitxet.remote import protocol as p

    req = p.grant_request(len(up.xorb.body), p.crc64nvme(up.xorb.body))
    r = httpx.post(
        f"{srv.url}/v1/xorb-grants/default/{hx}",
        json=req,
        headers={"Authorization": f"Bearer {srv.write}"},
    )
    assert r.status_code == 201
    grant = p.Grant.from_json(r.json())
    assert httpx.put(grant.url.replace("sig=", "sig=x"), content=up.xorb.body).status_code == 403
    assert httpx.put(grant.url.replace("len=", "len=1"), content=up.xorb.body).status_code == 403
    bad = bytearray(up.xorb.body)
    bad[-1] ^= 1
    assert httpx.put(grant.url, content=bytes(bad)).status_code == 400  # CRC or xorb hash
    assert httpx.put(grant.url, content=up.xorb.body[:-1]).status_code == 400  # length
    commit = f"{srv.url}/v1/xorb-commits/default/{hx}/grant/{grant.id}"
    assert httpx.post(commit, headers={"Authorization": f"Bearer {srv.write}"}).status_code == 404
    assert not _stored(srv, up.xorb.hash)
    assert httpx.put(grant.url, content=up.xorb.body, headers=grant.headers).status_code == 200
    assert httpx.put(grant.url, content=up.xorb.body).status_code == 412
    assert httpx.post(commit, headers={"Authorization": f"Bearer {srv.write}"}).status_code == 200
    r = httpx.post(
        f"{srv.url}/v1/xorb-grants/default/{hx}",
        json=req,
        headers={"Authorization": f"Bearer {srv.write}"},
    )
    assert r.status_code == 200  # already there


def test_data_urls_ranges_and_signatures(srv: Srv) -> None:
    up = build_upload(random.Random(51).randbytes(400_000))
    with CASClient(srv.url, srv.write) as c:
        c.upload_xorb(up.xorb.hash, up.xorb.body)
        c.upload_shard(up.shard)
    fx = to_hex(up.file_hash)
    size = len(up.data)
    r = _get(
        srv, f"/v1/reconstructions/{fx}", srv.read, headers={"Range": f"bytes={size}-{size + 5}"}
    )
    assert r.status_code == 416 and r.headers["content-range"] == f"bytes */{size}"
    r = _get(srv, f"/v1/reconstructions/{fx}", srv.read, headers={"Range": "bytes=10-99999999"})
    assert r.status_code == 200
    doc = r.json()
    assert doc["offset_into_first_range"] == 10
    assert sum(t["unpacked_length"] for t in doc["terms"]) == size  # clamped, nothing lost
    assert (
        _get(
            srv, f"/v1/reconstructions/{fx}", srv.read, headers={"Range": "bytes=oops"}
        ).status_code
        == 400
    )
    assert _get(srv, f"/v1/reconstructions/{fx}").status_code == 401
    [entry] = doc["fetch_info"][to_hex(up.xorb.hash)]
    url, body_len = entry["url"], len(up.xorb.body)
    r = httpx.get(url, headers={"Range": "bytes=0-99"})
    assert r.status_code == 206 and r.content == up.xorb.body[:100]
    assert r.headers["content-range"] == f"bytes 0-99/{body_len}"
    assert "immutable" in r.headers["cache-control"]
    r = httpx.get(url, headers={"Range": f"bytes=100-{body_len + 500}"})  # clamped: no footer bytes
    assert r.status_code == 206 and r.content == up.xorb.body[100:]
    assert httpx.get(url, headers={"Range": f"bytes={body_len}-"}).status_code == 416
    assert (
        httpx.get(url.replace("sig=", "sig=A"), headers={"Range": "bytes=0-9"}).status_code == 403
    )
    assert httpx.get(url.split("?")[0], headers={"Range": "bytes=0-9"}).status_code == 403
    hx = to_hex(up.xorb.hash)
    expired = srv.server.state.signer.data_query(hx, now=time.time() - 10 * 3600)
    assert (
        httpx.get(
            f"{srv.url}/xorb-data/default/{hx}?{expired}", headers={"Range": "bytes=0-9"}
        ).status_code
        == 403
    )


def test_routes_health_and_unknowns(srv: Srv) -> None:
    assert _get(srv, "/healthz").json() == {"status": "ok"}
    assert _post(srv, "/v1/telemetry", srv.read, b'{"event":"x"}').status_code == 200
    hx = "00" * 32
    for method, path in [
        ("GET", "/nope"),
        ("POST", "/v1/unknown"),
        ("GET", f"/v1/xorb-grants/default/{hx}"),
        ("POST", f"/v1/xorbs/other/{hx}"),
        ("GET", f"/v3/reconstructions/{hx}"),
        ("POST", f"/v1/xorb-grants/default/{hx}/extra"),
        ("GET", f"/v1/chunks/nope/{hx}"),
    ]:
        r = httpx.request(method, srv.url + path, headers={"Authorization": f"Bearer {srv.write}"})
        assert r.status_code == 404, (method, path)
    assert _get(srv, f"/v1/chunks/default-merkledb/{hx}", srv.read).status_code == 404
    assert _get(srv, f"/v1/chunks/default/{hx}", srv.read).status_code == 404
    r = _get(srv, f"/v1/reconstructions?file_id={hx}&file_id=zz", srv.read)
    assert r.status_code == 400


def _raw_status(srv: Srv, raw_path: str) -> int:
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), 5) as s:
        s.sendall(f"GET {raw_path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        head = s.recv(100).decode("latin-1")
    return int(head.split(" ")[1])


@pytest.mark.parametrize(
    "path",
    ["/../etc.git/info/refs", "/%2e%2e/x.git/info/refs", "/a/b.git/info/refs", "/..git/info/refs",
     "/x%2f..%2fy.git/info/refs", "/.hidden.git/info/refs"],
)  # fmt: skip
def test_traversal_in_repo_names_is_400(srv: Srv, path: str) -> None:
    assert _raw_status(srv, path) == 400


def test_client_reports_missing_files(srv: Srv) -> None:
    from gitxet.errors import FileNotFoundInCASError

    with CASClient(srv.url, srv.read) as c:
        with pytest.raises(FileNotFoundInCASError):
            c.get_reconstruction(b"\x0e" * 32)
        with pytest.raises(FileNotFoundInCASError):
            c.get_reconstruction(b"\x0e" * 32, (5, 10))
    up = build_upload(random.Random(61).randbytes(1000))
    with CASClient(srv.url, srv.write) as c:
        c.upload_xorb(up.xorb.hash, up.xorb.body)
        c.upload_shard(up.shard)
        with pytest.raises(RemoteError) as ei:
            c.get_reconstruction(up.file_hash, (1000, 1001))
        assert ei.value.status == 416
        assert read_back(c, up.file_hash, (990, 5000)) == up.data[990:]


def test_fetch_primitives_fill_a_local_store(srv: Srv, tmp_path: Path) -> None:
    """What ``git fetch`` needs: has_xorb, download_xorb, shards_for_file -> LocalCAS."""
    from gitxet.store.cas import LocalCAS

    up = build_upload(random.Random(71).randbytes(500_000))
    with CASClient(srv.url, srv.write) as c:
        assert not c.has_xorb(up.xorb.hash)
        assert c.shards_for_file(up.file_hash) == []
        c.upload_xorb(up.xorb.hash, up.xorb.body)
        c.upload_shard(up.shard)
        assert c.has_xorb(up.xorb.hash)
        local = LocalCAS(str(tmp_path / "store"), durable=False)
        assert local.put_xorb(up.xorb.hash, c.download_xorb(up.xorb.hash))
        for shard in c.shards_for_file(up.file_hash):
            local.put_shard(shard)
        info = local.file_info(up.file_hash)
        assert info is not None and info.size == len(up.data)
        assert b"".join(local.read_chunks(up.xorb.hash, 0, len(up.xorb.chunk_sizes))) == up.data
        loc = c.xorb_location(up.xorb.hash)
        raw = c.fetch_xorb_range(loc.url, loc.byte_offsets[1], loc.byte_offsets[2] - 1)
        assert decode_chunks(raw) == local.read_chunks(up.xorb.hash, 1, 2)
    assert _get(srv, f"/v1/xorb-locations/{to_hex(up.xorb.hash)}").status_code == 401


def test_a_xorb_gone_from_storage_is_404_not_a_retried_500(srv: Srv) -> None:
    """An indexed xorb whose object storage lost (an operator's delete, a bucket rule): its
    data URL answers 404 with no traceback, so a reader fails at once instead of retrying
    a 500 for seconds."""
    up = build_upload(random.Random(71).randbytes(150_000))
    with CASClient(srv.url, srv.write) as c:
        c.upload_xorb(up.xorb.hash, up.xorb.body)
        c.upload_shard(up.shard)
    doc = _get(srv, f"/v1/reconstructions/{to_hex(up.file_hash)}", srv.read).json()
    [entry] = doc["fetch_info"][to_hex(up.xorb.hash)]
    assert httpx.get(entry["url"], headers={"Range": "bytes=0-99"}).status_code == 206
    srv.server.state.service.backend.delete(f"xorbs/default/{to_hex(up.xorb.hash)}")
    r = httpx.get(entry["url"], headers={"Range": "bytes=0-99"})
    assert r.status_code == 404 and "lost from this server's storage" in r.json()["error"]
    r = httpx.get(entry["url"], headers={"Range": f"bytes=0-{len(up.xorb.body) - 1}"})
    assert r.status_code == 404
    with CASClient(srv.url, srv.read) as c, pytest.raises(XorbNotFoundError) as ei:
        read_back(c, up.file_hash)
    assert f"{srv.url} describes data it no longer has" in str(ei.value)
    # it counts as not stored any more: a client that has it uploads it again
    with CASClient(srv.url, srv.write) as c:
        assert not c.has_xorb(up.xorb.hash)
        assert c.upload_xorb(up.xorb.hash, up.xorb.body) is True
        assert read_back(c, up.file_hash) == up.data


def test_a_truncated_stored_xorb_is_a_clean_410_not_a_retried_500(
    srv: Srv, caplog: pytest.LogCaptureFixture
) -> None:
    """A stored xorb cut short (a disk or bucket fault): a range reaching past what is left
    answers 410 with a JSON error and one server log line, before any byte of a streamed
    (> 8 MiB) answer is sent; gitxet's client fails at once with that status."""
    up = build_upload(random.Random(73).randbytes(12 << 20))  # > 8 MiB: streamed answers
    service = srv.server.state.service
    service.put_xorb(up.xorb.hash, up.xorb.body)  # in-process: past --max-body
    with CASClient(srv.url, srv.write) as c:
        c.upload_shard(up.shard)
    doc = _get(srv, f"/v1/reconstructions/{to_hex(up.file_hash)}", srv.read).json()
    [entry] = doc["fetch_info"][to_hex(up.xorb.hash)]
    key = f"xorbs/default/{to_hex(up.xorb.hash)}"
    stored = service.backend.get(key)
    half = len(stored) // 2
    service.backend.put(key, stored[:half])
    assert httpx.get(entry["url"], headers={"Range": "bytes=0-99"}).status_code == 206
    body = len(up.xorb.body)
    for rng in (f"0-{body - 1}", f"{half - 10}-{half + 10}", f"{half + 5}-{half + 6}"):
        with caplog.at_level("ERROR", logger="gitxet.server"):
            caplog.clear()
            r = httpx.get(entry["url"], headers={"Range": f"bytes={rng}"}, timeout=60)
        assert r.status_code == 410, (rng, r.status_code, r.text[:200])
        assert "truncated" in r.json()["error"]
        assert any("stored data is damaged" in m for m in caplog.messages), caplog.messages
    with CASClient(srv.url, srv.read) as c, pytest.raises(RemoteError) as ei:
        read_back(c, up.file_hash)
    assert ei.value.status == 410  # not retried as a 500 would be (seconds of backoff)
    assert "\n" not in str(ei.value) and "truncated" in str(ei.value)
