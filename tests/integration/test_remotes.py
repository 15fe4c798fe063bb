"""Data from whichever remote has it (issue 13, item 2), with path remotes and the real git.

A fork workflow: ``origin`` has v1, ``upstream`` alone has v2's new file. Every way of getting
v2's data into a clone of origin must find it on upstream: ``git pull upstream main`` (the
smudge filter), ``git xet pull``, ``git xet fetch upstream``, ``git xet checkout``. When no
remote has the data, the error names each remote and what it answered.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from gitxet.hashing import from_hex
from gitxet.store.cas import LocalCAS
from tests.helpers.proc import git, run

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def gitxet_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


def xet(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run("git-xet", *args, cwd=cwd, check=check)


@pytest.fixture
def fork(tmp_path: Path) -> dict[str, object]:
    """origin.git has v1 (a.bin); upstream.git has v1 and v2 (b.bin, whose data only it has)."""
    origin, upstream, work = tmp_path / "origin.git", tmp_path / "upstream.git", tmp_path / "work"
    git("init", "-q", "--bare", str(origin), cwd=tmp_path)
    git("init", "-q", "--bare", str(upstream), cwd=tmp_path)
    git("init", "-q", str(work), cwd=tmp_path)
    git("remote", "add", "origin", str(origin), cwd=work)
    git("remote", "add", "upstream", str(upstream), cwd=work)
    xet("init", cwd=work)
    rnd = random.Random(13)
    a, b = rnd.randbytes(400_000), rnd.randbytes(500_000)
    (work / "a.bin").write_bytes(a)
    xet("add", ".", cwd=work)
    git("commit", "-qm", "v1", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    git("push", "-q", "upstream", "main", cwd=work)
    (work / "b.bin").write_bytes(b)
    xet("add", "b.bin", cwd=work)
    git("commit", "-qm", "v2", cwd=work)
    git("push", "-q", "upstream", "main", cwd=work)
    b_hash = [
        ln.split()[0] for ln in xet("ls-files", cwd=work).stdout.splitlines() if "b.bin" in ln
    ]
    assert b_hash
    return {"origin": origin, "upstream": upstream, "a": a, "b": b, "tmp": tmp_path}


def clone_of_origin(fork: dict[str, object], name: str, *, lazy: bool = False) -> Path:
    tmp = Path(str(fork["tmp"]))
    clone = tmp / name
    xet("clone", *(["--lazy"] if lazy else []), str(fork["origin"]), str(clone), cwd=tmp)
    git("remote", "add", "upstream", str(fork["upstream"]), cwd=clone)
    assert not (clone / "b.bin").exists()
    return clone


def is_pointer(path: Path) -> bool:
    return path.read_bytes().startswith(b"version https://gitxet.dev/spec/v1\n")


def test_git_pull_from_the_remote_that_alone_has_the_data(fork: dict[str, object]) -> None:
    clone = clone_of_origin(fork, "clone")
    git("pull", "-q", "upstream", "main", cwd=clone)  # the smudge filter fetches b.bin
    assert (clone / "b.bin").read_bytes() == fork["b"]
    assert git("status", "--porcelain", cwd=clone) == ""
    # the same through git xet pull (its batch fetch, then git's pull)
    clone2 = clone_of_origin(fork, "clone2")
    xet("pull", "upstream", "main", cwd=clone2)
    assert (clone2 / "b.bin").read_bytes() == fork["b"]


def test_plain_checkout_of_a_remote_branch_finds_its_data(fork: dict[str, object]) -> None:
    clone = clone_of_origin(fork, "clone")
    git("fetch", "-q", "upstream", cwd=clone)
    git("checkout", "-q", "upstream/main", cwd=clone)  # git names the ref to the filter
    assert (clone / "b.bin").read_bytes() == fork["b"]


def test_xet_fetch_and_checkout_in_a_lazy_clone(fork: dict[str, object]) -> None:
    lazy = clone_of_origin(fork, "lazy", lazy=True)
    git("pull", "-q", "upstream", "main", cwd=lazy)  # lazy: pointers only
    assert is_pointer(lazy / "b.bin") and is_pointer(lazy / "a.bin")
    xet("fetch", "upstream", cwd=lazy)
    store = LocalCAS(str(lazy / ".git" / "xet"))
    for line in xet("ls-files", "--json", cwd=lazy).stdout.splitlines():
        import json

        rec = json.loads(line)  # a.bin from origin, b.bin from upstream: both here now
        assert store.file_info(from_hex(rec["xet_hash"])) is not None, rec["path"]
    xet("checkout", cwd=lazy)
    assert (lazy / "b.bin").read_bytes() == fork["b"]
    assert (lazy / "a.bin").read_bytes() == fork["a"]
    assert git("status", "--porcelain", cwd=lazy) == ""
    # no fetch first: git xet checkout asks every remote itself
    lazy2 = clone_of_origin(fork, "lazy2", lazy=True)
    git("pull", "-q", "upstream", "main", cwd=lazy2)
    xet("checkout", "b.bin", cwd=lazy2)
    assert (lazy2 / "b.bin").read_bytes() == fork["b"]
    assert is_pointer(lazy2 / "a.bin")


@pytest.mark.fuse
def test_mount_of_a_lazy_clone_reads_data_only_upstream_has(fork: dict[str, object]) -> None:
    from tests.helpers.fuse_env import fuse_unavailable_reason

    reason = fuse_unavailable_reason()
    if reason:
        pytest.skip(reason)
    tmp = Path(str(fork["tmp"]))
    lazy = clone_of_origin(fork, "lazy", lazy=True)
    git("fetch", "-q", "upstream", cwd=lazy)
    mnt = tmp / "mnt"
    mnt.mkdir()
    xet("mount", str(lazy), "upstream/main", str(mnt), cwd=tmp)
    try:
        assert (mnt / "a.bin").read_bytes() == fork["a"]  # origin's store, read in place
        assert (mnt / "b.bin").read_bytes() == fork["b"]  # upstream's store
    finally:
        xet("unmount", str(mnt), cwd=tmp, check=False)
    # nothing was copied into the clone: a mount reads data where it lies
    xorbs = lazy / ".git" / "xet" / "xorbs"
    assert not xorbs.exists() or not [p for p in xorbs.rglob("*") if p.is_file()]


def test_when_no_remote_has_the_data_each_one_is_named(fork: dict[str, object]) -> None:
    tmp = Path(str(fork["tmp"]))
    clone = clone_of_origin(fork, "clone")
    git("remote", "add", "gone", str(tmp / "gone.git"), cwd=clone)
    ptr = (
        "version https://gitxet.dev/spec/v1\n"
        f"oid sha256:{'a' * 64}\nsize 1000\nxet-hash {'b' * 64}\n"
    )
    (clone / "ghost.bin").write_text(ptr)
    git("add", "ghost.bin", cwd=clone)
    git("commit", "-qm", "ghost", cwd=clone)
    (clone / "ghost.bin").unlink()
    r = xet("checkout", "ghost.bin", cwd=clone, check=False)
    assert r.returncode == 4 and "Traceback" not in r.stderr, r.stderr
    err = r.stderr
    assert "ghost.bin" in err and "b" * 16 in err
    assert f"origin {fork['origin']}: does not have it" in err
    assert f"upstream {fork['upstream']}: does not have it" in err
    assert "gone" in err and "not reachable" in err
    # the smudge filter says the same through git
    r = run("git", "checkout", "--", "ghost.bin", cwd=clone, check=False)
    assert r.returncode != 0 and "upstream" in r.stderr and "does not have it" in r.stderr
    r = xet("fetch", cwd=clone, check=False)
    assert r.returncode == 4 and "ghost.bin" in r.stderr and "gone" in r.stderr, r.stderr


def test_status_names_an_xet_remote_git_does_not_know(tmp_path: Path) -> None:
    """xet.remote set to a name git has no remote for: status says so (it showed
    'remote nosuch: nosuch', as if the name were its URL); push refuses it."""
    work = tmp_path / "work"
    git("init", "-q", str(work), cwd=tmp_path)
    xet("init", cwd=work)
    git("config", "xet.remote", "nosuch", cwd=work)
    out = xet("status", cwd=work).stdout
    assert "remote nosuch: no such remote" in out.splitlines()[0]
    shown = json.loads(xet("status", "--json", cwd=work).stdout)
    assert shown["remote"] == {"name": "nosuch", "url": None}
    push = xet("push", cwd=work, check=False)
    assert push.returncode != 0 and "no remote named 'nosuch'" in push.stderr
