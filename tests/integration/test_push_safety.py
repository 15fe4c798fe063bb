"""Every clone can push safely: hooks from the filter, the repair verb, fsck (issue 13)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.proc import run

pytestmark = pytest.mark.timeout(300)

POINTER_PREFIX = b"version https://gitxet.dev/spec/v1\n"


@pytest.fixture(autouse=True)
def gitxet_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """git calls ``git-xet`` back: make sure it is this interpreter's."""
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


def git(*args: str, cwd: Path) -> str:
    return run("git", *args, cwd=cwd).stdout


def xet(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run("git-xet", *args, cwd=cwd, check=check)


def origin_with_data(tmp: Path) -> tuple[Path, dict[str, bytes]]:
    """A bare remote holding one commit with a pointer file, pushed by a `git xet init` repo."""
    remote = tmp / "remote.git"
    work = tmp / "origin"
    git("init", "-q", "--bare", str(remote), cwd=tmp)
    git("init", "-q", str(work), cwd=tmp)
    git("remote", "add", "origin", str(remote), cwd=work)
    xet("init", cwd=work)
    files = {"a.bin": random.Random(1).randbytes(600_000), "small.txt": b"small\n"}
    for name, data in files.items():
        (work / name).write_bytes(data)
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "one", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    return remote, files


def test_plain_clone_gets_the_hook_and_a_plain_push_uploads(tmp_path: Path) -> None:
    remote, files = origin_with_data(tmp_path)
    xet("install", cwd=tmp_path)  # global filter config only
    plain = tmp_path / "plain"
    git("clone", "-q", str(remote), str(plain), cwd=tmp_path)
    assert (plain / "a.bin").read_bytes() == files["a.bin"]
    hook = plain / ".git" / "hooks" / "pre-push"
    assert hook.exists() and b"# gitxet hook" in hook.read_bytes()

    new = random.Random(2).randbytes(2 << 20)
    (plain / "new.bin").write_bytes(new)
    git("add", "new.bin", cwd=plain)
    git("commit", "-q", "-m", "new", cwd=plain)
    assert git("cat-file", "-p", "HEAD:new.bin", cwd=plain).encode().startswith(POINTER_PREFIX)
    git("push", "-q", "origin", "main", cwd=plain)

    third = tmp_path / "third"
    git("clone", "-q", str(remote), str(third), cwd=tmp_path)
    assert (third / "new.bin").read_bytes() == new
    assert (third / "a.bin").read_bytes() == files["a.bin"]


def test_filter_chains_a_user_hook_and_warns_once_when_it_cannot(tmp_path: Path) -> None:
    remote, _ = origin_with_data(tmp_path)
    xet("install", cwd=tmp_path)
    clone = tmp_path / "clone"
    git("clone", "-q", "--no-checkout", str(remote), str(clone), cwd=tmp_path)
    hooks = clone / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "pre-push").write_bytes(b"#!/bin/sh\necho user hook >&2\n")
    (hooks / "pre-push").chmod(0o755)
    git("checkout", "-q", "main", cwd=clone)
    assert (hooks / "pre-push.gitxet-chained").read_bytes() == b"#!/bin/sh\necho user hook >&2\n"
    assert b"# gitxet hook" in (hooks / "pre-push").read_bytes()

    # a hooks directory outside the repository (core.hooksPath) is never written to
    shared = tmp_path / "shared-hooks"
    shared.mkdir()
    other = tmp_path / "other"
    git("clone", "-q", "--no-checkout", str(remote), str(other), cwd=tmp_path)
    git("config", "core.hooksPath", str(shared), cwd=other)
    r = run("git", "checkout", "main", cwd=other)
    assert "pre-push hook not installed" in r.stderr
    assert list(shared.iterdir()) == []
    (other / "a.bin").unlink()
    r = run("git", "checkout", "--", "a.bin", cwd=other)
    assert "pre-push hook not installed" not in r.stderr  # once per repository
    # `git xet install` in the repository repairs what it can, and says where
    r = xet("install", cwd=other)
    assert (shared / "pre-push").exists()


def test_push_repairs_a_ref_pushed_without_its_data_and_fsck_says_where(tmp_path: Path) -> None:
    remote, _ = origin_with_data(tmp_path)
    xet("install", cwd=tmp_path)
    plain = tmp_path / "plain"
    git("clone", "-q", str(remote), str(plain), cwd=tmp_path)
    new = random.Random(3).randbytes(1 << 20)
    (plain / "new.bin").write_bytes(new)
    git("add", "new.bin", cwd=plain)
    git("commit", "-q", "-m", "new", cwd=plain)
    # what a clone without the hook does: the pointer goes, the data does not. The remote got
    # gitxet's pre-receive hook from the first gitxet push, so it refuses, naming the file
    env = {**os.environ, "GITXET_SKIP_PREPUSH": "1"}
    r = subprocess.run(
        ["git", "push", "-q", "origin", "main"], cwd=plain, env=env, capture_output=True, text=True
    )
    assert r.returncode != 0 and "new.bin" in r.stderr, r.stderr
    # a remote gitxet never guarded (made by an older version) takes it
    (remote / "hooks" / "pre-receive").unlink()
    subprocess.run(["git", "push", "-q", "origin", "main"], cwd=plain, env=env, check=True)

    lazy = tmp_path / "lazy"
    xet("clone", "--lazy", str(remote), str(lazy), cwd=tmp_path)
    r = xet("fsck", cwd=lazy, check=False)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "missing  new.bin: not in the local store, not on origin" in r.stdout
    assert "1 only on origin, 1 missing" in r.stdout
    # status sends no one to a checkout that cannot write the file
    out = xet("status", cwd=lazy).stdout
    assert "(2 materialized" not in out and "'git xet checkout' writes" not in out, out
    assert "the data of 1 of them is in no store and not on origin" in out, out

    assert "files whose data origin lacks: 1" in xet("status", cwd=plain).stdout
    r = xet("push", cwd=plain)
    assert "1 xorb(s) and 1 shard(s) uploaded" in r.stderr, r.stderr
    assert "files whose data origin lacks: 0" in xet("status", cwd=plain).stdout
    assert "0 xorb(s) and 0 shard(s) uploaded" in xet("push", "--all", cwd=plain).stderr

    r = xet("fsck", "--all", cwd=lazy)
    assert "2 only on origin, 0 missing" in r.stdout
    assert "'git xet checkout' writes their data" in xet("status", cwd=lazy).stdout
    xet("checkout", cwd=lazy)
    assert (lazy / "new.bin").read_bytes() == new
    assert "2 in the local store, 0 only on origin, 0 missing" in xet("fsck", cwd=lazy).stdout

    # a damaged xorb in the local store is named
    (xorb,) = [p for p in (plain / ".git" / "xet" / "xorbs").rglob("*") if p.is_file()][:1]
    raw = bytearray(xorb.read_bytes())
    raw[100] ^= 0xFF
    xorb.write_bytes(bytes(raw))
    r = xet("fsck", cwd=plain, check=False)
    assert r.returncode == 3 and f"damaged  xorb {xorb.name}" in r.stdout, r.stdout
    assert "Traceback" not in r.stderr


LFS_POINTER = f"version https://git-lfs.github.com/spec/v1\noid sha256:{'4' * 64}\nsize 12345\n"


def _snapshot(repo: Path) -> tuple[str, list[str], bytes, str]:
    hooks = sorted(p.name for p in (repo / ".git" / "hooks").iterdir())
    attrs = (repo / ".gitattributes").read_bytes() if (repo / ".gitattributes").exists() else b""
    return (repo / ".git" / "config").read_text(), hooks, attrs, git("ls-files", "-s", cwd=repo)


@pytest.mark.parametrize("evidence", ["attributes", "committed-attributes", "pointer"])
def test_init_refuses_a_git_lfs_repository_and_changes_nothing(
    tmp_path: Path, evidence: str
) -> None:
    repo = tmp_path / "lfs"
    git("init", "-q", str(repo), cwd=tmp_path)
    (repo / "readme.txt").write_text("hi\n")
    if evidence == "pointer":
        (repo / "model.bin").write_text(LFS_POINTER)
    else:
        (repo / ".gitattributes").write_text("# data\n*.bin filter=lfs diff=lfs merge=lfs -text\n")
    if evidence != "attributes":
        git("add", ".", cwd=repo)
        git("commit", "-q", "-m", "lfs", cwd=repo)
    before = _snapshot(repo)
    r = xet("init", cwd=repo, check=False)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "git-lfs" in lines[0] and "git xet migrate" in lines[0], lines
    assert "Traceback" not in r.stderr
    assert _snapshot(repo) == before


def test_rules_travel_with_the_repository(tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    work = tmp_path / "origin"
    git("init", "-q", "--bare", str(remote), cwd=tmp_path)
    git("init", "-q", str(work), cwd=tmp_path)
    git("remote", "add", "origin", str(remote), cwd=work)
    xet("init", "--threshold", "300k", cwd=work)
    r = xet("track", "*.jpg", "--threshold", "0", "--dry-run", cwd=work)
    assert "would track '*.jpg'" in r.stderr and "would set xet.threshold = 0" in r.stderr
    assert "xet=always" not in (work / ".gitattributes").read_text()
    xet("track", "*.jpg", cwd=work)
    rnd = random.Random(4)
    images = {f"img/{i:03d}.jpg": rnd.randbytes(rnd.randrange(2_000, 9_000)) for i in range(40)}
    others = {"notes.txt": b"small text\n", "mid.bin": rnd.randbytes(100_000)}
    for name, data in {**images, **others}.items():
        (work / name).parent.mkdir(exist_ok=True)
        (work / name).write_bytes(data)
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "images", cwd=work)
    stored = {n: git("cat-file", "-p", f"HEAD:{n}", cwd=work).encode() for n in images}
    assert all(b.startswith(POINTER_PREFIX) for b in stored.values())  # always, tiny or not
    blob = subprocess.run(
        ["git", "cat-file", "-p", "HEAD:mid.bin"], cwd=work, capture_output=True, check=True
    ).stdout
    assert blob == others["mid.bin"]  # by size: under 300k, a plain blob

    listing = xet("track", cwd=work).stdout
    assert "*.jpg  always a pointer" in listing and ".gitattributes:2" in listing
    assert "*      a pointer by size" in listing
    assert "threshold: 300.0 KiB (.xetconfig)" in listing
    r = xet("untrack", "data/*.bin", cwd=work, check=False)
    assert r.returncode == 1 and "not a rule of .gitattributes: nothing changed" in r.stderr
    # the old way (a local git config) no longer decides: say so, never silently ignore it
    git("config", "xet.threshold", "0", cwd=work)
    warning = "git config xet.threshold = 0 has no effect: the repository's .xetconfig sets 300k"
    assert warning in xet("add", "mid.bin", cwd=work).stderr
    assert warning in xet("track", cwd=work).stdout
    git("config", "--unset", "xet.threshold", cwd=work)

    # threshold 0 from now on: every file is a pointer, except the files git reads
    xet("track", "--threshold", "0", cwd=work)
    (work / ".gitignore").write_text("*.tmp\n")
    (work / "more.txt").write_text("tiny\n")
    git("add", "--renormalize", ".", cwd=work)  # committed files follow the new rules too
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "threshold 0", cwd=work)
    for name in (".gitattributes", ".xetconfig", ".gitignore"):
        assert not git("cat-file", "-p", f"HEAD:{name}", cwd=work).startswith("version ")
    for name in ("more.txt", "notes.txt", "mid.bin"):
        assert git("cat-file", "-p", f"HEAD:{name}", cwd=work).encode().startswith(POINTER_PREFIX)
    git("push", "-q", "origin", "main", cwd=work)

    xet("install", cwd=tmp_path)
    for how in ("git", "git-xet"):
        clone = tmp_path / f"clone-{how}"
        run(how, "clone", *(["-q"] if how == "git" else []), str(remote), str(clone), cwd=tmp_path)
        assert (clone / "img/007.jpg").read_bytes() == images["img/007.jpg"]
        assert git("status", "--porcelain", cwd=clone).strip() == ""
        # every file cleaned again, as git does for any racily-clean entry: same blobs
        git("add", "--renormalize", ".", cwd=clone)
        assert git("status", "--porcelain", cwd=clone).strip() == "", how
        assert "threshold: 0 B (.xetconfig)" in xet("track", cwd=clone).stdout

    # untrack undoes exactly what track did
    r = xet("untrack", "*.jpg", "--dry-run", cwd=work)
    assert "would untrack '*.jpg'" in r.stderr
    assert "xet=always" in (work / ".gitattributes").read_text()
    xet("untrack", "*.jpg", cwd=work)
    assert (work / ".gitattributes").read_text() == "* filter=xet diff=xet merge=xet -text\n"
    assert git("diff", "--cached", "--name-only", cwd=work).strip() == ".gitattributes"


def test_a_push_of_data_already_on_the_remote_says_so(tmp_path: Path) -> None:
    """A push the remote refused after the hook uploaded its data, pushed again: the data
    is there already, and the summary says so (it said 'sent 0 xorbs, 0 already on the
    remote')."""
    remote, _ = origin_with_data(tmp_path)
    work = tmp_path / "origin"
    (work / "b.bin").write_bytes(random.Random(3).randbytes(300_000))
    git("add", "b.bin", cwd=work)
    git("commit", "-q", "-m", "two", cwd=work)
    once = tmp_path / "refused-once"
    refuse = remote / "hooks" / "pre-receive"  # (gitxet may chain it: it refuses only once)
    refuse.write_bytes(f"#!/bin/sh\n[ -e '{once}' ] && exit 0\ntouch '{once}'\nexit 1\n".encode())
    refuse.chmod(0o755)
    first = run("git", "push", "origin", "main", cwd=work, check=False)
    assert first.returncode != 0 and "sent 1 xorbs" in first.stderr, first.stderr
    out = run("git", "push", "origin", "main", cwd=work).stderr
    assert "git-xet: 1 files (300,000 bytes): all already on the remote" in out, out
    assert "sent 0 xorbs" not in out, out
