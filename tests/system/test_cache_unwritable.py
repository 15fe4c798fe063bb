"""A cache directory this process cannot write (a read-only filesystem, a path below a
file) does not stop reads of a real `git xet serve` repository: `git xet mount`, `git xet
clone` and ``xet://`` read from the server through a private temporary cache, with one
warning naming the directory. Before, each failed: "Read-only file system: .../repos"
(mount), ".../endpoints" (clone), a raw OSError traceback (``xet://``)."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig
from tests.helpers.fuse_env import fuse_unavailable_reason
from tests.helpers.proc import git, run, use_interpreter

pytestmark = pytest.mark.timeout(120)

WARNING = "cannot be written"


@pytest.fixture
def pushed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, bytes]]:
    """(repository URL, the bytes of its big.bin); GITXET_TOKEN holds a token for it."""
    root = tmp_path / "srv"
    token, _ = TokenStore(str(root)).create("write")
    use_interpreter(monkeypatch, tmp_path)
    monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GITXET_TOKEN", token)
    data = random.Random(31).randbytes(2 << 20)
    with BackgroundServer(ServerConfig(root=str(root), port=0)) as s:
        url = s.url + "/data.git"
        work = tmp_path / "work"
        git("init", "-q", "-b", "main", str(work), cwd=tmp_path)
        run("git-xet", "init", cwd=work)
        (work / "big.bin").write_bytes(data)
        run("git-xet", "add", "big.bin", cwd=work)
        git("commit", "-qm", "data", cwd=work)
        git("push", "-q", url.replace("http://", f"http://user:{token}@"), "main", cwd=work)
        yield url, data


def test_xet_reads_with_a_cache_dir_below_a_file(
    pushed: tuple[str, bytes], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import fsspec

    url, data = pushed
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    xfs = fsspec.filesystem("xet", cache_dir=str(blocker / "cache"), skip_instance_cache=True)
    try:
        with caplog.at_level(logging.WARNING, logger="gitxet"):
            with xfs.open(f"xet://{url}@main/big.bin", "rb") as f:
                f.seek(12345)
                assert f.read(100_000) == data[12345:112345]
            assert xfs.cat_file(f"xet://{url}@main/big.bin") == data
        warned = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
        assert len(warned) == 1 and str(blocker / "cache") in warned[0], warned
    finally:
        xfs.close()


@pytest.fixture
def readonly_dir(tmp_path: Path) -> Iterator[Path]:
    """An empty directory on a read-only tmpfs (root; CI runs as root)."""
    reason = fuse_unavailable_reason()
    if reason:
        pytest.skip(reason)  # (CI=true turns the skip of a `fuse` test into a failure)
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        yield ro
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False, capture_output=True)


@pytest.mark.fuse
def test_mount_and_clone_with_a_read_only_cache_dir(
    pushed: tuple[str, bytes], readonly_dir: Path, tmp_path: Path
) -> None:
    url, data = pushed
    env = {"GITXET_CACHE_DIR": str(readonly_dir / "cache")}
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run("git-xet", "mount", url, "main", str(mnt), cwd=tmp_path, env=env)
    try:
        assert r.stderr.count(WARNING) == 1, r.stderr
        assert (mnt / "big.bin").read_bytes() == data
        fd = os.open(mnt / "big.bin", os.O_RDONLY)
        try:
            assert os.pread(fd, 70_000, (1 << 20) - 3) == data[(1 << 20) - 3 : (1 << 20) + 69_997]
        finally:
            os.close(fd)
    finally:
        run("git-xet", "unmount", str(mnt), cwd=tmp_path, check=False)
    r = run("git-xet", "clone", url, str(tmp_path / "clone"), cwd=tmp_path, env=env)
    assert WARNING in r.stderr
    assert (tmp_path / "clone" / "big.bin").read_bytes() == data
    assert os.listdir(readonly_dir) == []


def test_clone_with_a_cache_whose_writes_fail(pushed: tuple[str, bytes], tmp_path: Path) -> None:
    """A cache directory that can be written at first but whose later writes fail (a disk
    that fills while the clone runs; here its subdirectories are files): the clone reads
    on without the cache and says so once ('No space left on device' from the description
    of the first xorb failed every file of the clone)."""
    url, data = pushed
    cache = tmp_path / "filling"
    cache.mkdir()
    for sub in ("shards", "endpoints"):
        (cache / sub).write_bytes(b"")
    r = run("git-xet", "clone", url, str(tmp_path / "clone"), cwd=tmp_path,
            env={"GITXET_CACHE_DIR": str(cache)})  # fmt: skip
    assert (tmp_path / "clone" / "big.bin").read_bytes() == data
    assert r.stderr.count("not kept in the cache (reads go on without it)") == 1, r.stderr


def _mount_pids(cwd: Path, mnt: Path) -> tuple[int, int]:
    """(supervisor, serving process) of the mount at ``mnt``."""
    out = run("git-xet", "mounts", "--json", cwd=cwd).stdout
    (row,) = [r for r in map(json.loads, out.splitlines()) if r["mountpoint"] == str(mnt)]
    return int(row["supervisor_pid"]), int(row["pid"])


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    return
        except FileNotFoundError:
            return
        assert time.monotonic() < deadline, f"process {pid} does not end"
        time.sleep(0.02)


@pytest.mark.fuse
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL])
def test_a_signalled_mount_daemon_leaves_no_private_cache(
    pushed: tuple[str, bytes], readonly_dir: Path, tmp_path: Path, signum: int
) -> None:
    """The private cache of a mount daemon (its cache directory cannot be written) goes
    with it on every signal that stops it; one a killed process left (SIGKILL; before, a
    SIGHUP too) is removed by the next process that makes one."""
    url, data = pushed
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"GITXET_CACHE_DIR": str(readonly_dir / "cache"), "TMPDIR": str(tmp)}
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run("git-xet", "mount", url, "main", str(mnt), cwd=tmp_path, env=env)
    try:
        assert (mnt / "big.bin").read_bytes() == data
        assert [p.name[:13] for p in tmp.iterdir()] == ["gitxet-cache-"]
        sup, pid = _mount_pids(tmp_path, mnt)
        os.kill(pid, signum)  # its supervisor starts another serving process
        _wait_gone(pid)
        deadline = time.monotonic() + 60
        while _mount_pids(tmp_path, mnt)[1] == pid:
            assert time.monotonic() < deadline, "no new serving process"
            time.sleep(0.05)
        assert (mnt / "big.bin").read_bytes() == data
        (left,) = tmp.iterdir()  # the new process's, not the old one's
        assert left.name.startswith(f"gitxet-cache-{_mount_pids(tmp_path, mnt)[1]}.")
        if signum == signal.SIGKILL:
            sup, pid = _mount_pids(tmp_path, mnt)
            os.kill(sup, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
            _wait_gone(sup)
            _wait_gone(pid)
            run("git-xet", "unmount", str(mnt), cwd=tmp_path)  # a dead mount
            assert [left] == list(tmp.iterdir())
            run("git-xet", "mount", url, "main", str(mnt), cwd=tmp_path, env=env)
            assert (mnt / "big.bin").read_bytes() == data
            assert left not in list(tmp.iterdir())
            signum = signal.SIGTERM
        sup, pid = _mount_pids(tmp_path, mnt)
        os.kill(sup, signum)
        _wait_gone(sup)
        _wait_gone(pid)
    finally:
        run("git-xet", "unmount", "--lazy", str(mnt), cwd=tmp_path, check=False)
    assert list(tmp.iterdir()) == []
