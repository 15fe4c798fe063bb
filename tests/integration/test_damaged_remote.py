"""A remote whose xorb does not match its hash (bit rot, or someone tampering with it): the
clone fails naming the xorb, keeps no damaged copy in its store (it is moved to
``<store>/damaged``), and once the remote is repaired ``git xet checkout`` and a plain
``git checkout`` get the data again. Before, the bad xorb stayed in the clone's store (it
is hard-linked from a remote on the same disk) and every later read failed."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

DATA = random.Random(7).randbytes(2_000_000)  # many chunks, whatever their boundaries


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=240)


def ok(*args: str, cwd: Path) -> str:
    r = run(*args, cwd=cwd)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def test_a_damaged_remote_xorb_is_not_kept_and_is_fetched_again_once_repaired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    remote, work = tmp_path / "remote.git", tmp_path / "work"
    ok("git", "init", "-q", "--bare", str(remote), cwd=tmp_path)
    ok("git", "init", "-q", str(work), cwd=tmp_path)
    ok("git-xet", "init", cwd=work)
    (work / "a.bin").write_bytes(DATA)
    ok("git", "add", ".", cwd=work)
    ok("git", "commit", "-qm", "one", cwd=work)
    ok("git", "push", "-q", str(remote), "HEAD:main", cwd=work)
    (xorb,) = (remote / "xet" / "xorbs").glob("*/*")
    good = xorb.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # inside a chunk's data: the footer still names it

    def put(data: bytes) -> None:  # a new file (the clone may hold a link to the old one)
        xorb.unlink()
        xorb.write_bytes(data)

    put(bytes(bad))
    r = run("git-xet", "clone", str(remote), "clone", cwd=tmp_path)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert f"xorb {xorb.name}" in r.stderr and "Traceback" not in r.stderr
    clone = tmp_path / "clone"
    store = clone / ".git" / "xet"
    assert not (store / "xorbs" / xorb.parent.name / xorb.name).exists()
    assert (store / "damaged" / xorb.name).read_bytes() == bytes(bad)  # kept aside
    # still damaged on the remote: the same one-line error, nothing kept
    r = run("git-xet", "checkout", cwd=clone)
    assert r.returncode == 3 and f"xorb {xorb.name}" in r.stderr, r.stderr
    assert not (store / "xorbs" / xorb.parent.name / xorb.name).exists()

    put(good)
    ok("git-xet", "checkout", cwd=clone)
    assert (clone / "a.bin").read_bytes() == DATA
    assert ok("git", "status", "--porcelain", cwd=clone) == ""
    assert run("git-xet", "fsck", cwd=clone).returncode == 0

    # a plain git clone (the smudge filter) heals the same way
    put(bytes(bad))
    plain = tmp_path / "plain"
    config = ["--config", "filter.xet.process=git-xet filter-process"]
    config += ["--config", "filter.xet.required=true"]
    r = run("git", "clone", "-q", *config, str(remote), str(plain), cwd=tmp_path)
    assert r.returncode != 0 and f"xorb {xorb.name}" in r.stderr
    put(good)
    ok("git", "checkout", "-f", "HEAD", "--", ".", cwd=plain)
    assert (plain / "a.bin").read_bytes() == DATA
