"""Dedup against a real `git xet serve` over HTTP: an edit in a fresh clone uploads only
its new chunks (the shards of the version being edited, and the server's global dedup)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture
def srv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """(repository URL, server storage dir), GITXET_TOKEN set, git-xet on PATH."""
    root = tmp_path / "srv"
    write, _ = TokenStore(str(root)).create("write")
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GITXET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GITXET_TOKEN", write)
    with BackgroundServer(ServerConfig(root=str(root), port=0)) as s:
        yield f"{s.url}/data.git", root


def run(*args: str, cwd: Path) -> str:
    r = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


def stored_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def percent(out: str) -> float:
    # "1 file(s) stored as Xet pointers: N new bytes, M reused bytes (99.9% deduplicated)"
    return float(out.rsplit("(", 1)[1].split("%", 1)[0])


def test_an_edit_in_a_fresh_http_clone_uploads_only_new_chunks(
    srv: tuple[str, Path], tmp_path: Path
) -> None:
    url, storage = srv
    run("git-xet", "install", cwd=tmp_path)
    work = tmp_path / "work"
    run("git", "init", "-q", "-b", "main", str(work), cwd=tmp_path)
    run("git-xet", "init", cwd=work)
    data = bytearray(random.Random(3).randbytes(32 << 20))
    (work / "big.bin").write_bytes(data)
    run("git-xet", "add", ".", cwd=work)
    run("git", "commit", "-qm", "v1", cwd=work)
    run("git", "remote", "add", "origin", url, cwd=work)
    run("git", "push", "-q", "origin", "main", cwd=work)

    before = stored_bytes(storage)
    clone = tmp_path / "clone"
    run("git-xet", "clone", url, str(clone), cwd=tmp_path)
    xorbs = clone / ".git" / "xet" / "xorbs"
    assert not [f for f in xorbs.rglob("*") if f.is_file()]  # a clone stores no data
    data[12_345_678:12_345_688] = b"0123456789"
    (clone / "big.bin").write_bytes(data)
    out = run("git-xet", "add", "big.bin", cwd=clone)
    assert percent(out) >= 90.0, out
    run("git", "commit", "-qm", "v2", cwd=clone)
    run("git", "push", "-q", "origin", "main", cwd=clone)
    grew = stored_bytes(storage) - before
    assert grew < 2 << 20, grew

    # the edited file reads back whole, from this clone (its store, then the server)...
    (clone / "big.bin").unlink()
    run("git", "checkout", "--", "big.bin", cwd=clone)
    assert (clone / "big.bin").read_bytes() == data
    # ... and from another clone
    other = tmp_path / "other"
    run("git-xet", "clone", url, str(other), cwd=tmp_path)
    assert (other / "big.bin").read_bytes() == data
    assert "0 damaged" in run("git-xet", "fsck", cwd=clone)

    # a copy under a new name: nothing at that path before, the server's global dedup
    # finds it from its first chunk (and the chunks after it, keyed with the answer's key)
    (other / "copy.bin").write_bytes(data)
    out = run("git-xet", "add", "copy.bin", cwd=other)
    assert percent(out) >= 90.0, out
