"""Prometheus metrics: the server's /metrics counts a push and a clone; a mount daemon's
/metrics counts what a reader read (real uvicorn, real git, real FUSE, scraped over HTTP)."""

from __future__ import annotations

import json
import mmap
import os
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig
from tests.helpers.fuse_env import force_unmount, require_fuse
from tests.helpers.proc import run, use_interpreter
from tests.helpers.server_env import free_port

pytestmark = pytest.mark.timeout(300)


def scrape(addr: str) -> dict[str, float]:
    """``name{label=value,...}`` -> value of every sample at http://addr/metrics."""
    r = httpx.get(f"http://{addr}/metrics", timeout=10)
    assert r.status_code == 200
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    want = [f"{k}={v}" for k, v in labels.items()]
    return sum(
        v for k, v in samples.items() if k.split("{")[0] == name and all(w in k for w in want)
    )


@pytest.fixture
def srv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """(base URL with a write token, the metrics address) of a server with --metrics."""
    root = tmp_path / "srv"
    token, _ = TokenStore(str(root)).create("write")
    use_interpreter(monkeypatch, tmp_path)
    monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp_path / "cache"))
    with BackgroundServer(ServerConfig(root=str(root), port=0, metrics="127.0.0.1:0")) as s:
        assert s.metrics_endpoint is not None
        addr = f"127.0.0.1:{s.metrics_endpoint.server_address[1]}"
        yield s.url.replace("http://", f"http://user:{token}@"), addr


def test_server_metrics_count_a_push_and_a_clone(srv: tuple[str, str], tmp_path: Path) -> None:
    base, addr = srv
    url = f"{base}/data.git"
    work = tmp_path / "work"
    run("git", "init", "-q", str(work), cwd=tmp_path)
    run("git", "remote", "add", "origin", url, cwd=work)
    run("git-xet", "init", cwd=work)
    (work / "big.bin").write_bytes(random.Random(3).randbytes(2 << 20))
    run("git-xet", "add", "big.bin", cwd=work)
    run("git", "commit", "-qm", "v1", cwd=work)
    before = scrape(addr)
    assert total(before, "gitxet_server_requests_total", op="git-receive-pack") == 0
    run("git", "push", "-q", "origin", "main", cwd=work)
    pushed = scrape(addr)
    assert total(pushed, "gitxet_server_requests_total", op="git-receive-pack", status="200") >= 1
    assert total(pushed, "gitxet_server_requests_total", op="shard-upload") >= 1
    assert total(pushed, "gitxet_server_requests_total", op="git-upload-pack") == 0
    run("git-xet", "clone", url, str(tmp_path / "clone"), cwd=tmp_path)
    cloned = scrape(addr)
    assert total(cloned, "gitxet_server_requests_total", op="git-upload-pack", status="200") >= 1
    assert total(cloned, "gitxet_server_request_seconds_count", op="git-upload-pack") >= 1
    assert (
        total(cloned, "gitxet_server_response_bytes_total", op="xorb-data") > 0
        or total(cloned, "gitxet_server_response_bytes_total", op="reconstruction") > 0
    )
    # no path, token or query ends up in a label
    assert not any("data.git" in k or "user" in k for k in cloned)


@pytest.mark.fuse
def test_mount_metrics_match_what_was_read(srv: tuple[str, str], tmp_path: Path) -> None:
    require_fuse()
    base, _ = srv
    url = f"{base}/data.git"
    work = tmp_path / "work"
    run("git", "init", "-q", str(work), cwd=tmp_path)
    run("git", "remote", "add", "origin", url, cwd=work)
    run("git-xet", "init", cwd=work)
    data = random.Random(4).randbytes(3 << 20)
    (work / "big.bin").write_bytes(data)
    run("git-xet", "add", "big.bin", cwd=work)
    run("git", "commit", "-qm", "v1", cwd=work)
    run("git", "push", "-q", "origin", "main", cwd=work)

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    # a port picked before the daemon binds it (the record 'git xet mounts' shows keeps
    # the address asked for, so port 0 would show as 0 there)
    maddr = f"127.0.0.1:{free_port()}"
    run("git-xet", "mount", "--metrics", maddr, url, "main", str(mnt), cwd=tmp_path)
    try:
        fd = os.open(mnt / "big.bin", os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, 1 << 20)
        got = bytearray()
        try:
            for off in range(0, len(data), 1 << 20):
                n = os.preadv(fd, [buf], off)
                got += buf[:n]
        finally:
            os.close(fd)
            buf.close()
        assert bytes(got) == data
        m = scrape(maddr)
        assert total(m, "gitxet_mount_read_bytes_total") == len(data)
        assert total(m, "gitxet_mount_reads_total", outcome="error") == 0
        assert total(m, "gitxet_mount_reads_total", outcome="ok") >= len(data) // (1 << 20)
        assert total(m, "gitxet_mount_fetched_bytes_total") == len(data)
        assert total(m, "gitxet_mount_cache_misses_total") >= 1
        assert total(m, "gitxet_mount_fetch_seconds_count") >= 1
        assert total(m, "gitxet_mount_requests_in_flight") == 0
        assert total(m, "gitxet_mount_cache_bytes") >= len(data)
        # git xet mounts: the endpoint, and a one-line summary from the metrics file
        (row,) = [
            json.loads(x)
            for x in run("git-xet", "mounts", "--json", cwd=tmp_path).stdout.splitlines()
        ]
        assert row["metrics"] == maddr
        run("git-xet", "unmount", str(mnt), cwd=tmp_path)

        # a new daemon reads the same bytes from the node cache: hits, nothing fetched
        run("git-xet", "mount", "--metrics", maddr, url, "main", str(mnt), cwd=tmp_path)
        assert (mnt / "big.bin").read_bytes() == data
        m = scrape(maddr)
        assert total(m, "gitxet_mount_fetched_bytes_total") == 0
        assert total(m, "gitxet_mount_cache_hits_total") >= 1
        assert total(m, "gitxet_mount_cache_hit_bytes_total") >= len(data)
        assert total(m, "gitxet_mount_read_bytes_total") > 0
        text = run("git-xet", "mounts", cwd=tmp_path).stdout
        assert f"metrics at http://{maddr}/metrics" in text or "read " in text
    finally:
        run("git-xet", "unmount", str(mnt), cwd=tmp_path, check=False)
        force_unmount(str(mnt))
