"""CommitFS behind the real NFS server, read by libnfs's ``nfs-ls`` and ``nfs-cat``."""

from __future__ import annotations

import hashlib
import io
import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitxet.data.clean import Ingestor
from gitxet.formats.pointer import Pointer
from gitxet.hashing import to_hex
from gitxet.mount.nfs.server import NFSServer
from gitxet.store.cas import LocalCAS
from gitxet.vfs.model import CommitFS

pytestmark = [
    pytest.mark.nfs,
    pytest.mark.skipif(
        shutil.which("nfs-ls") is None or shutil.which("nfs-cat") is None,
        reason="nfs-ls/nfs-cat not installed (apt-get install libnfs-utils)",
    ),
]

TIMEOUT = 30
DATA = random.Random(21).randbytes((2 << 20) + 12345)


def git(cwd: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)
    return out.stdout


def run(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(args, capture_output=True, timeout=TIMEOUT, check=False)


@pytest.fixture
def served(git_repo: Path, tmp_path: Path) -> Iterator[NFSServer]:
    cas = LocalCAS(str(tmp_path / "cas"), durable=False)
    with Ingestor(cas) as ing:
        r = ing.add_stream(io.BytesIO(DATA))
        ing.flush()
    pointer = Pointer(sha256=r.sha256, size=r.size, xet_hash=to_hex(r.file_hash)).encode()
    (git_repo / "data").mkdir()
    (git_repo / "data" / "big.bin").write_bytes(pointer)
    (git_repo / "README.md").write_bytes(b"hello\n")
    (git_repo / "run.sh").write_bytes(b"#!/bin/sh\n")
    os.chmod(git_repo / "run.sh", 0o755)
    git(git_repo, "add", "-A")
    git(git_repo, "commit", "-q", "-m", "data")
    commit = git(git_repo, "rev-parse", "HEAD").strip()
    try:
        with CommitFS(str(git_repo), commit, cas) as fs, NFSServer(fs) as srv:
            yield srv
    finally:
        cas.close()


def test_pointer_file_is_read_byte_identically(served: NFSServer) -> None:
    result = run("nfs-cat", served.url_for("data/big.bin"))
    assert result.returncode == 0, result.stderr.decode()
    assert hashlib.sha256(result.stdout).hexdigest() == hashlib.sha256(DATA).hexdigest()
    small = run("nfs-cat", served.url_for("README.md"))
    assert small.returncode == 0 and small.stdout == b"hello\n"


def test_listing_shows_read_only_modes_and_real_sizes(served: NFSServer) -> None:
    result = run("nfs-ls", "-R", served.url)
    assert result.returncode == 0, result.stderr.decode()
    listing = {}
    for line in result.stdout.decode().splitlines():
        if line.strip():
            mode, _nlink, _uid, _gid, size, name = line.split(maxsplit=5)
            listing[name] = (mode, int(size))
    assert listing["data/big.bin"] == ("-r--r--r--", len(DATA))
    assert listing["run.sh"] == ("-r-xr-xr-x", len(b"#!/bin/sh\n"))
    assert listing["data"][0] == "dr-xr-xr-x"
