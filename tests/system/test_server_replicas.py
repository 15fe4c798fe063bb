"""Two server processes on one S3 bucket, graceful shutdown, and logs without secrets."""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gitxet.remote.client import CASClient
from gitxet.server.auth import TokenStore
from tests.helpers.server_env import (
    S3Server,
    build_upload,
    logged_port,
    read_back,
    stop_process,
    wait_port,
)

hf_xet = pytest.importorskip("hf_xet")
pytestmark = pytest.mark.filterwarnings("ignore:hf_xet.*deprecated:DeprecationWarning")

_SERVE = """
import logging, sys
from gitxet.server.run import ServerConfig, serve
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(message)s")
serve(ServerConfig(root=sys.argv[1], port=int(sys.argv[2]), storage=sys.argv[3] or None,
                   graceful_timeout=5))
"""


def start(
    root: Path, storage: str, log: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str]:
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, str(root), "0", storage],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
        )
    port = logged_port(log, proc)
    wait_port(port, 30, proc)
    return proc, f"http://127.0.0.1:{port}"


def test_two_processes_share_one_bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from tests.helpers.server_env import S3_ENV

    pytest.importorskip("moto.server", reason="S3 tests need moto[server] (the test extra)")
    for k, v in S3_ENV.items():
        monkeypatch.setenv(k, v)
    s3 = S3Server(str(tmp_path))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        s3.make_bucket("shared")
        storage = s3.url("shared", "prod")
        root_a, root_b = tmp_path / "a", tmp_path / "b"
        write, _ = TokenStore(str(root_a)).create("write")
        root_b.mkdir()
        shutil.copy(root_a / "tokens.json", root_b / "tokens.json")  # replicas share tokens
        env = dict(os.environ)
        a, url_a = start(root_a, storage, tmp_path / "a.log", env)
        procs.append(a)
        b, url_b = start(root_b, storage, tmp_path / "b.log", env)
        procs.append(b)

        # hf_xet uploads through A; B, which saw nothing, serves it (index miss -> bucket).
        data = random.Random(77).randbytes(2_500_000)
        src = tmp_path / "f.bin"
        src.write_bytes(data)
        tok = (write, int(time.time()) + 3600)
        [info] = hf_xet.upload_files([str(src)], url_a, tok, None, None, "model")
        out = tmp_path / "out.bin"
        hf_xet.download_files(
            [hf_xet.PyXetDownloadInfo(str(out), info.hash, len(data))], url_b, tok, None, None
        )
        assert out.read_bytes() == data

        # gitxet's client the other way round, including a dedup query on A for B's upload.
        up = build_upload(random.Random(78).randbytes(600_000))
        with CASClient(url_b, write) as cb:
            cb.upload_xorb(up.xorb.hash, up.xorb.body)
            cb.upload_shard(up.shard)
        with CASClient(url_a, write) as ca:
            assert read_back(ca, up.file_hash) == up.data
            assert ca.query_chunk(up.xorb.chunk_hashes[0]) is not None
            # A data URL signed by A is accepted by B (shared key in the bucket): a load
            # balancer may send the ranged GET anywhere.
            recon = ca.get_reconstruction(up.file_hash)
        fi = recon.fetch_for(recon.terms[0])
        url_on_b = fi.url.replace(url_a, url_b)
        r = httpx.get(url_on_b, headers={"Range": f"bytes={fi.byte_start}-{fi.byte_end}"})
        assert r.status_code == 206 and r.content == up.xorb.body[fi.byte_start : fi.byte_end + 1]

        # Graceful shutdown on SIGTERM; logs never hold the token or a URL signature.
        # uvicorn re-raises the signal after its graceful shutdown, hence -SIGTERM.
        assert stop_process(a) in (0, -signal.SIGTERM)
        assert stop_process(b) in (0, -signal.SIGTERM)
        for log in (tmp_path / "a.log", tmp_path / "b.log"):
            text = log.read_text()
            assert "Finished server process" in text
            assert '"status":200' in text
            assert write not in text and write.split("_", 2)[2] not in text
            assert "sig=" not in text and "Authorization" not in text
    finally:
        for p in procs:
            stop_process(p)
        s3.stop()
