"""Server start removes what killed writers left: temp files in a local storage directory,
and multipart uploads nobody finished under an S3 prefix (moto's S3 server process)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitxet.server.backends import S3Backend
from gitxet.server.run import ServerConfig, build_state
from tests.helpers.server_env import S3_ENV, S3Server


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    pytest.importorskip("moto.server", reason="S3 tests need moto[server] (the test extra)")
    for k, v in S3_ENV.items():
        monkeypatch.setenv(k, v)
    s = S3Server(str(tmp_path))
    yield s
    s.stop()


def test_local_storage_is_swept_at_start(tmp_path: Path) -> None:
    root = tmp_path / "root"
    state = build_state(ServerConfig(root=str(root)))
    state.service.backend.close()
    cas = root / "cas"
    old = [cas / ".tmp" / ".tmp-killed.incomplete", cas / "shards" / ".tmp-legacy"]
    (cas / "shards").mkdir(exist_ok=True)
    os.unlink(cas / ".swept-v1")
    for p in old:
        p.write_bytes(b"half")
        os.utime(p, (1, 1))
    build_state(ServerConfig(root=str(root))).service.backend.close()
    assert not any(p.exists() for p in old)


def test_unfinished_multipart_uploads_under_the_prefix_are_aborted(s3: S3Server) -> None:
    s3.make_bucket("sweep")
    b = S3Backend("sweep", "cas", endpoint_url=s3.endpoint, region="us-east-1")
    mine = b.client.create_multipart_upload(Bucket="sweep", Key="cas/xorbs/default/x")
    other = b.client.create_multipart_upload(Bucket="sweep", Key="elsewhere/y")
    # moto reports every upload as initiated in 2010, so both count as abandoned here
    assert b.remove_stale_temps() == 1
    left = b.client.list_multipart_uploads(Bucket="sweep").get("Uploads", [])
    assert [u["UploadId"] for u in left] == [other["UploadId"]]
    assert mine["UploadId"] != other["UploadId"]
    b.close()
