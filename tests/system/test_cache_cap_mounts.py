"""Two FUSE mounts of one `git xet serve` repository stream a file through one capped node
cache at once (real uvicorn on loopback, real mounts): the cache never holds more than its
cap plus one range, and both readers get every byte right."""

from __future__ import annotations

import hashlib
import os
import random
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitxet.data.remote_source import UNIT
from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig
from tests.helpers.ci import IN_CI
from tests.helpers.fuse_env import fuse_unavailable_reason

pytestmark = pytest.mark.timeout(300)

CAP = 32 << 20
SIZE = 128 << 20


@pytest.fixture
def srv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The repository URL, with GITXET_TOKEN set, git-xet on PATH and a capped cache."""
    reason = fuse_unavailable_reason()
    if reason:
        assert not IN_CI, f"CI=true: this FUSE test must run: {reason}"
        pytest.skip(reason)
    root = tmp_path / "srv"
    write, _ = TokenStore(str(root)).create("write")
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GITXET_CACHE_SIZE", str(CAP))
    monkeypatch.setenv("GITXET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GITXET_TOKEN", write)
    with BackgroundServer(ServerConfig(root=str(root), port=0)) as s:
        yield f"{s.url}/data.git"


def run(*args: str, cwd: Path) -> None:
    r = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}"


def cache_bytes_on_disk(ranges: Path) -> int:
    """Bytes in the node cache's range files and files being written."""
    total = 0
    for d in (ranges / "data", ranges / "tmp"):
        for dirpath, _, files in os.walk(d):
            for f in files:
                try:
                    total += os.stat(os.path.join(dirpath, f)).st_size
                except OSError:
                    pass  # evicted (or renamed into place) while walking
    return total


def test_two_mounts_stream_through_a_capped_cache(srv: str, tmp_path: Path) -> None:
    run("git-xet", "install", cwd=tmp_path)  # git's credential helper: GITXET_TOKEN
    work = tmp_path / "work"
    run("git", "init", "-q", "-b", "main", str(work), cwd=tmp_path)
    run("git-xet", "init", cwd=work)
    data = random.Random(14).randbytes(SIZE)  # incompressible: every cached byte is paid
    (work / "big.bin").write_bytes(data)
    run("git-xet", "add", "big.bin", cwd=work)
    run("git", "commit", "-qm", "data", cwd=work)
    run("git", "remote", "add", "origin", srv, cwd=work)
    run("git", "push", "-q", "origin", "main", cwd=work)
    want = hashlib.sha256(data).hexdigest()
    del data

    ranges = tmp_path / "cache" / "ranges"
    mnts = [tmp_path / "mnt-a", tmp_path / "mnt-b"]
    for m in mnts:
        m.mkdir()
    mounted: list[Path] = []
    try:
        for m in mnts:
            run("git-xet", "mount", srv, "main", str(m), cwd=tmp_path)
            mounted.append(m)
        most = 0
        done = threading.Event()

        def sample() -> None:
            nonlocal most
            while not done.is_set():
                most = max(most, cache_bytes_on_disk(ranges))
                done.wait(0.005)

        sums: dict[Path, str] = {}
        errors: list[BaseException] = []

        def read(m: Path) -> None:
            try:
                h = hashlib.sha256()
                with open(m / "big.bin", "rb") as f:
                    while b := f.read(1 << 20):
                        h.update(b)
                sums[m] = h.hexdigest()
            except BaseException as e:  # reported by the test thread
                errors.append(e)

        sampler = threading.Thread(target=sample)
        sampler.start()
        readers = [threading.Thread(target=read, args=(m,)) for m in mnts]
        for r in readers:
            r.start()
        for r in readers:
            r.join(200)
        done.set()
        sampler.join(30)
        assert not errors, errors
        assert sums == {m: want for m in mnts}  # no data lost, none wrong
        # the cache was used (not bypassed) and held to its cap plus one range
        assert most > 0
        assert most <= CAP + UNIT, f"{most / (1 << 20):.1f} MiB on disk, cap {CAP >> 20} MiB"
    finally:
        for m in mounted:
            subprocess.run(["git-xet", "unmount", str(m)], capture_output=True, timeout=60)
    # at rest: within the cap on disk and in the index, nothing half-written left behind
    with sqlite3.connect(ranges / "index.sqlite") as db:
        (indexed,) = db.execute("SELECT coalesce(sum(nbytes), 0) FROM ranges").fetchone()
    assert 0 < indexed <= CAP
    assert cache_bytes_on_disk(ranges) <= CAP
    assert not os.listdir(ranges / "tmp")
