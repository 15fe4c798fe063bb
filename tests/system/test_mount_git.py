"""`git xet mount` / `nfs-serve` of commits made by the git workflow (real git, FUSE, libnfs)."""

from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import json
import os
import random
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.fuse_env import require_fuse
from tests.helpers.proc import git_env, remote_and_work, run, use_interpreter

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    require_fuse()
    use_interpreter(monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A pushed repo: two commits, big and small files, nested dirs, +x, a symlink."""
    tmp = tmp_path_factory.mktemp("ds")
    env = git_env(tmp)

    def sh(*a: str, cwd: Path = tmp) -> None:
        subprocess.run(list(a), cwd=cwd, env=env, check=True, capture_output=True, timeout=300)

    remote, work = remote_and_work(tmp, env)
    rnd = random.Random(9)
    v1 = {
        "big/huge.bin": b"".join(rnd.randbytes(16 << 20) for _ in range(16)),
        "big/mid.bin": rnd.randbytes(20 << 20),
        "nested/a/b/c/deep.bin": rnd.randbytes(1 << 20),
        "small.txt": b"hello\n",
        "nested/notes.md": b"# notes\n",
        "run.sh": b"#!/bin/sh\necho hi\n",
    }
    for p, d in v1.items():
        (work / p).parent.mkdir(parents=True, exist_ok=True)
        (work / p).write_bytes(d)
    (work / "run.sh").chmod(0o755)
    os.symlink("big/mid.bin", work / "link.bin")
    sh("git-xet", "add", ".", cwd=work)
    sh("git", "commit", "-q", "-m", "v1", cwd=work)
    first = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=work, env=env, capture_output=True, text=True
    ).stdout.strip()
    v2 = dict(v1)
    v2["big/mid.bin"] = v1["big/mid.bin"][:1000] + rnd.randbytes(5000) + v1["big/mid.bin"][1000:]
    (work / "big/mid.bin").write_bytes(v2["big/mid.bin"])
    sh("git-xet", "add", ".", cwd=work)
    sh("git", "commit", "-q", "-m", "v2", cwd=work)
    sh("git", "push", "-q", "origin", "main", cwd=work)
    return {"remote": remote, "v1": v1, "v2": v2, "first": first}


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


def test_mount_branch_and_old_commit(tmp_path: Path, dataset: dict[str, object]) -> None:
    remote = dataset["remote"]
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    t = time.monotonic()
    run("git-xet", "mount", str(remote), "main", str(mnt), cwd=tmp_path)
    ready = time.monotonic() - t
    try:
        assert mounted(mnt)
        v2: dict[str, bytes] = dataset["v2"]  # type: ignore[assignment]
        names = sorted(os.listdir(mnt))
        assert names == sorted(
            [".gitattributes", ".xetconfig", "big", "link.bin", "nested", "run.sh", "small.txt"]
        )
        for p, d in v2.items():
            st = os.stat(mnt / p)
            assert st.st_size == len(d), p
            assert sha((mnt / p).read_bytes()) == sha(d), p
        assert os.stat(mnt / "run.sh").st_mode & stat.S_IXUSR
        assert not os.stat(mnt / "small.txt").st_mode & stat.S_IXUSR
        assert os.readlink(mnt / "link.bin") == "big/mid.bin"
        assert (mnt / "link.bin").read_bytes() == v2["big/mid.bin"]
        # random preads of the biggest file
        huge = v2["big/huge.bin"]
        rnd = random.Random(1)
        fd = os.open(mnt / "big/huge.bin", os.O_RDONLY)
        try:
            for _ in range(1000):
                off = rnd.randrange(len(huge))
                n = rnd.choice([1, 4096, 65536, 300_000])
                assert os.pread(fd, n, off) == huge[off : off + n]
        finally:
            os.close(fd)
        # 8 parallel readers of different files
        files = [*list(v2)[:6], "big/huge.bin", "big/mid.bin"]

        def read(p: str) -> bool:
            return sha((mnt / p).read_bytes()) == sha(v2[p])

        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            assert all(ex.map(read, files))
        # read-only
        for op in (
            lambda: os.open(mnt / "new.txt", os.O_WRONLY | os.O_CREAT),
            lambda: os.open(mnt / "small.txt", os.O_WRONLY | os.O_APPEND),
            lambda: os.rename(mnt / "small.txt", mnt / "x"),
            lambda: os.unlink(mnt / "small.txt"),
            lambda: os.mkdir(mnt / "d"),
        ):
            with pytest.raises(OSError) as ei:
                op()
            assert ei.value.errno == errno.EROFS
        listing = run("git-xet", "mounts", cwd=tmp_path).stdout
        assert str(mnt) in listing and "data from the repository's store" in listing
    finally:
        run("git-xet", "unmount", str(mnt), cwd=tmp_path, check=False)
    assert not mounted(mnt)
    assert run("git-xet", "mounts", cwd=tmp_path).stdout.strip() == ""
    assert ready < 30

    # the first commit, by sha
    run("git-xet", "mount", str(remote), str(dataset["first"]), str(mnt), cwd=tmp_path)
    try:
        v1: dict[str, bytes] = dataset["v1"]  # type: ignore[assignment]
        assert (mnt / "big/mid.bin").read_bytes() == v1["big/mid.bin"]
    finally:
        run("git-xet", "unmount", str(mnt), cwd=tmp_path, check=False)


def test_bad_commit_and_missing_data(tmp_path: Path, dataset: dict[str, object]) -> None:
    remote = Path(str(dataset["remote"]))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run("git-xet", "mount", str(remote), "no-such-branch", str(mnt), cwd=tmp_path, check=False)
    assert r.returncode != 0 and "no such revision" in r.stderr and "Traceback" not in r.stderr
    assert not mounted(mnt)
    # a copy of the remote whose xorbs vanish while mounted: reads fail with EIO, no hang
    copy = tmp_path / "copy.git"
    shutil.copytree(remote, copy)
    run("git-xet", "mount", str(copy), "main", str(mnt), cwd=tmp_path)
    try:
        shutil.rmtree(copy / "xet" / "xorbs")
        t = time.monotonic()
        with pytest.raises(OSError) as ei:
            (mnt / "big/huge.bin").read_bytes()
        assert ei.value.errno == errno.EIO
        assert time.monotonic() - t < 30
        # the daemon's log says which file and why, in one line
        (rec,) = [
            json.loads(line)
            for line in run("git-xet", "mounts", "--json", cwd=tmp_path).stdout.splitlines()
        ]
        log = Path(rec["log"]).read_text()
        assert "Traceback" not in log
        assert any(
            "/big/huge.bin: cannot read data" in line and "not found" in line
            for line in log.splitlines()
        ), log
    finally:
        run("git-xet", "unmount", str(mnt), cwd=tmp_path, check=False)


def test_each_mount_has_its_own_log(tmp_path: Path, dataset: dict[str, object]) -> None:
    """``/x/a_b`` and ``/x/a/b`` once shared one log file (the name replaced "/" by "_")."""
    remote = dataset["remote"]
    mnts = [tmp_path / "a_b", tmp_path / "a" / "b"]
    try:
        for mnt in mnts:
            mnt.mkdir(parents=True)
            run("git-xet", "mount", str(remote), "main", str(mnt), cwd=tmp_path)
        # only this test's mounts: the listing also names other gitxet mounts of the machine
        # (a dead one, from another process's state, has no log)
        listed = [
            json.loads(line)
            for line in run("git-xet", "mounts", "--json", cwd=tmp_path).stdout.splitlines()
        ]
        recs = {
            rec["mountpoint"]: rec.get("log")
            for rec in listed
            if Path(rec["mountpoint"]).is_relative_to(tmp_path)
        }
        assert set(recs) == {str(m) for m in mnts}
        logs = set(recs.values())
        assert len(logs) == 2 and all(Path(log).is_file() for log in logs), recs
    finally:
        for mnt in mnts:
            run("git-xet", "unmount", str(mnt), cwd=tmp_path, check=False)


@pytest.mark.nfs
def test_nfs_serve_with_libnfs(tmp_path: Path, dataset: dict[str, object]) -> None:
    if shutil.which("nfs-cat") is None:
        pytest.skip("nfs-cat (libnfs-utils) not installed")
    with subprocess.Popen(
        ["git-xet", "nfs-serve", str(dataset["remote"]), "main"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as p:
        _check_nfs(p, dataset)


def _check_nfs(p: subprocess.Popen[str], dataset: dict[str, object]) -> None:
    try:
        assert p.stdout is not None
        url = p.stdout.readline().strip()
        assert url.startswith("nfs://127.0.0.1/"), url
        base, _, query = url.partition("?")
        ls = subprocess.run(["nfs-ls", url], capture_output=True, text=True, timeout=60)
        assert "small.txt" in ls.stdout and "big" in ls.stdout, ls.stderr
        v2: dict[str, bytes] = dataset["v2"]  # type: ignore[assignment]
        for path in ("big/mid.bin", "nested/a/b/c/deep.bin"):
            out = subprocess.run(
                ["nfs-cat", f"{base.rstrip('/')}//{path}?{query}"], capture_output=True, timeout=120
            )
            assert out.returncode == 0, out.stderr
            assert sha(out.stdout) == sha(v2[path])
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_unmount_of_a_busy_mount_says_so_and_keeps_serving(
    tmp_path: Path, dataset: dict[str, object]
) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run("git-xet", "mount", str(dataset["remote"]), "main", str(mnt), cwd=tmp_path)
    v2: dict[str, bytes] = dataset["v2"]  # type: ignore[assignment]
    try:
        with open(mnt / "small.txt", "rb") as held:
            r = run("git-xet", "unmount", str(mnt), cwd=tmp_path, check=False)
            # one line: busy, what it means, the way out (was "unmount failed: fusermount3:
            # status 1; umount: umount: MNT: target is busy.")
            assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
            assert "busy" in r.stderr and f"git xet unmount --lazy {mnt}" in r.stderr
            assert "fusermount3" not in r.stderr and "Traceback" not in r.stderr
            assert mounted(mnt) and held.read() == v2["small.txt"]
            assert (mnt / "big/mid.bin").read_bytes() == v2["big/mid.bin"]
            assert str(mnt) in run("git-xet", "mounts", cwd=tmp_path).stdout
        run("git-xet", "unmount", str(mnt), cwd=tmp_path)
        assert not mounted(mnt) and os.listdir(mnt) == []
    finally:
        run("git-xet", "unmount", str(mnt), cwd=tmp_path, check=False)
