"""Damaged and hostile data through the CLI, as users run it.

* A remote whose xorb does not match its hash (bit rot, or someone tampering with it): the
  clone fails naming the xorb, keeps no damaged copy in its store (it is moved to
  ``<store>/damaged``), and once the remote is repaired ``git xet checkout`` and a plain
  ``git checkout`` get the data again. Before, the bad xorb stayed in the clone's store (it
  is hard-linked from a remote on the same disk) and every later read failed.
* After a read finds a local xorb corrupt and sets it aside, ``git xet fsck`` says so, where
  the copy is and how to repair it (not "not in the store"), and ``git xet fetch`` repairs.
* A pointer naming real data by its ``xet-hash`` but another ``oid sha256`` (the oid is
  normative: docs/internals/pointer.md rule 5) is refused by ``git xet clone``, a plain
  ``git clone`` (the smudge filter) and ``git xet checkout`` with one line, the file is not
  written, and ``git xet fsck`` names it (exit 3).
"""

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


def commit_blob(work: Path, name: str, blob: bytes, message: str) -> None:
    """Commit ``blob`` as ``name`` byte for byte (no filter), as an attacker would."""
    oid = subprocess.run(
        ["git", "hash-object", "-w", "--no-filters", "--stdin"],
        cwd=work, input=blob, capture_output=True, check=True, timeout=60,
    ).stdout.decode().strip()  # fmt: skip
    ok("git", "update-index", "--add", "--cacheinfo", f"100644,{oid},{name}", cwd=work)
    ok("git", "commit", "-qm", message, cwd=work)


def one_line(stderr: str) -> str:
    """The error's line: the last one that is not a hint."""
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("hint: ")]
    assert "Traceback" not in stderr, stderr
    return lines[-1]


@pytest.fixture
def published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A work repository whose a.bin (DATA) is pushed to a bare remote ``remote.git``."""
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    remote, work = tmp_path / "remote.git", tmp_path / "work"
    ok("git", "init", "-q", "--bare", str(remote), cwd=tmp_path)
    ok("git", "init", "-q", str(work), cwd=tmp_path)
    ok("git-xet", "init", cwd=work)
    (work / "a.bin").write_bytes(DATA)
    ok("git", "add", ".", cwd=work)
    ok("git", "commit", "-qm", "one", cwd=work)
    ok("git", "remote", "add", "origin", str(remote), cwd=work)
    ok("git", "push", "-q", "origin", "HEAD:main", cwd=work)
    return work, remote


def test_a_damaged_remote_xorb_is_not_kept_and_is_fetched_again_once_repaired(
    published: tuple[Path, Path], tmp_path: Path
) -> None:
    _work, remote = published
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


def test_a_pointer_whose_oid_is_not_its_data_is_refused_and_reported(
    published: tuple[Path, Path], tmp_path: Path
) -> None:
    work, remote = published
    good = ok("git", "show", "HEAD:a.bin", cwd=work).encode()
    lie = good.replace(good[good.index(b"sha256:") + 7 :][:64], b"ab" * 32)
    assert lie != good and len(lie) == len(good)
    commit_blob(work, "b.bin", lie, "a pointer that lies about its oid")
    ok("git", "push", "-q", "origin", "HEAD:main", cwd=work)

    r = run("git-xet", "fsck", cwd=work)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "damaged  pointer b.bin" in r.stdout, r.stdout
    assert "a.bin" not in r.stdout.replace("damaged  pointer b.bin", "")
    assert "do not match their data" in one_line(r.stderr)

    r = run("git-xet", "clone", str(remote), "clone", cwd=tmp_path)
    assert r.returncode == 3, (r.stdout, r.stderr)
    line = one_line(r.stderr)
    assert "b.bin" in line and "sha256" in line, r.stderr
    clone = tmp_path / "clone"
    assert (clone / "a.bin").read_bytes() == DATA  # the honest file is written
    assert (clone / "b.bin").read_bytes() == lie  # the other stays the pointer it is
    r = run("git-xet", "checkout", cwd=clone)
    assert r.returncode == 3 and "b.bin" in one_line(r.stderr), r.stderr
    assert (clone / "b.bin").read_bytes() == lie
    assert not list((clone / ".git" / "xet" / "tmp").glob("*"))  # no half-written file

    plain = tmp_path / "plain"
    config = ["--config", "filter.xet.process=git-xet filter-process"]
    config += ["--config", "filter.xet.required=true"]
    r = run("git", "clone", "-q", *config, str(remote), str(plain), cwd=tmp_path)
    assert r.returncode != 0 and "sha256" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (plain / "b.bin").exists() or (plain / "b.bin").read_bytes() != DATA


def test_fsck_reports_a_pointer_whose_size_is_not_its_datas(
    published: tuple[Path, Path],
) -> None:
    """A pointer with the right oid and xet-hash but another size (here the largest one the
    spec allows) is an altered pointer too: fsck used to pass it, as checkout refuses it."""
    work, _remote = published
    good = ok("git", "show", "HEAD:a.bin", cwd=work).encode()
    lie = good.replace(b"\nsize %d\n" % len(DATA), b"\nsize 9223372036854775807\n")
    assert lie != good
    commit_blob(work, "c.bin", lie, "a pointer that lies about its size")
    r = run("git-xet", "fsck", cwd=work)
    assert r.returncode == 3, (r.stdout, r.stderr)
    want = (
        f"damaged  pointer c.bin: size 9,223,372,036,854,775,807 is not the size of its data "
        f"({len(DATA):,}); the pointer was altered"
    )
    assert want in r.stdout, r.stdout
    assert "a.bin" not in r.stdout and "Traceback" not in r.stderr
    r = run("git-xet", "checkout", "c.bin", cwd=work)
    assert r.returncode == 3 and "c.bin" in one_line(r.stderr), r.stderr
    assert not (work / "c.bin").exists()  # nothing written for it


def test_fsck_after_a_corrupt_xorb_was_set_aside_says_so_and_fetch_repairs(
    published: tuple[Path, Path],
) -> None:
    work, _remote = published
    store = work / ".git" / "xet"
    (xorb,) = (store / "xorbs").glob("*/*")
    bad = bytearray(xorb.read_bytes())
    bad[len(bad) // 2] ^= 0xFF  # inside a chunk's data: the footer still names it
    xorb.unlink()  # a new file: the remote's copy may be a hard link of this one
    xorb.write_bytes(bytes(bad))
    (work / "a.bin").unlink()
    r = run("git", "checkout", "--", "a.bin", cwd=work)  # the read that finds it corrupt
    assert r.returncode != 0 and f"xorb {xorb.name}" in r.stderr, r.stderr
    kept = store / "damaged" / xorb.name
    assert kept.read_bytes() == bytes(bad)

    r = run("git-xet", "fsck", cwd=work)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "set aside in" in r.stdout and str(kept) in r.stdout, r.stdout
    assert "corrupt" in r.stdout and "git xet fetch" in r.stdout, r.stdout
    assert "which is not in the store" not in r.stdout
    assert "Traceback" not in r.stderr

    ok("git-xet", "fetch", cwd=work)
    ok("git-xet", "fsck", cwd=work)
    ok("git", "checkout", "--", "a.bin", cwd=work)
    assert (work / "a.bin").read_bytes() == DATA
