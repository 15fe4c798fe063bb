"""``git xet mount --watch``: a push to the branch reaches new opens within 3 s, a file held
open across the switch reads its old content to the end, also across a failover (real
uvicorn, real git, real FUSE)."""

from __future__ import annotations

import json
import mmap
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig
from tests.helpers.fuse_env import force_unmount, require_fuse
from tests.helpers.proc import run

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

MiB = 1 << 20
V1 = random.Random(21).randbytes(4 * MiB)
V2 = random.Random(22).randbytes(4 * MiB)


def rows(cwd: Path) -> list[dict[str, object]]:
    out = run("git-xet", "mounts", "--json", cwd=cwd).stdout
    return [json.loads(line) for line in out.splitlines()]


def wait_for(check: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``check()`` held (polled every 20 ms); fails after ``timeout``."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - start


def content_is(path: Path, want: bytes) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return path.read_bytes() == want  # a new open each time
        except OSError:
            return False

    return check


class Held:
    """A file opened with O_DIRECT (every read reaches the daemon, none is served from the
    page cache) and kept open."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        self.buf = mmap.mmap(-1, MiB)

    def read(self, off: int, n: int = MiB) -> bytes:
        got = os.preadv(self.fd, [memoryview(self.buf)[:n]], off)
        return bytes(self.buf[:got])

    def read_all(self, size: int) -> bytes:
        return b"".join(self.read(off) for off in range(0, size, MiB))

    def close(self) -> None:
        os.close(self.fd)
        self.buf.close()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    require_fuse()
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GITXET_STATE_DIR", str(tmp_path / "state"))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    yield mnt
    run("git-xet", "unmount", str(mnt), cwd=tmp_path, check=False)
    force_unmount(str(mnt))


def commit_files(work: Path, files: dict[str, bytes], message: str) -> str:
    for name, data in files.items():
        (work / name).write_bytes(data)
    run("git-xet", "add", *files, cwd=work)
    run("git", "commit", "-qm", message, cwd=work)
    return run("git", "rev-parse", "HEAD", cwd=work).stdout.strip()


def test_a_push_reaches_new_opens_and_open_files_keep_their_commit(
    env: Path, tmp_path: Path
) -> None:
    mnt = env
    root = tmp_path / "srv"
    token, _ = TokenStore(str(root)).create("write")
    with BackgroundServer(ServerConfig(root=str(root), port=0)) as srv:
        url = f"{srv.url}/data.git".replace("http://", f"http://u:{token}@")
        work = tmp_path / "work"
        run("git", "init", "-q", str(work), cwd=tmp_path)
        run("git", "remote", "add", "origin", url, cwd=work)
        run("git-xet", "init", cwd=work)
        commit_files(work, {"data.bin": V1, "small.txt": b"one\n"}, "v1")
        run("git", "push", "-q", "origin", "main", cwd=work)

        run("git-xet", "mount", "--watch=1s", url, "main", str(mnt), cwd=tmp_path)
        held = Held(mnt / "data.bin")
        try:
            assert held.read(0) == V1[:MiB]
            assert (mnt / "small.txt").read_bytes() == b"one\n"
            assert not (mnt / "new.txt").exists()  # a negative entry the switch must drop
            (row,) = rows(tmp_path)
            assert row["watch"] == "main" and row["state"] == "ok"

            v2 = commit_files(work, {"data.bin": V2, "new.txt": b"new\n"}, "v2")
            run("git", "push", "-q", "origin", "main", cwd=work)
            took = wait_for(content_is(mnt / "data.bin", V2), 10.0)
            assert took < 3.0, f"the push reached a new open after {took:.2f} s"
            assert (mnt / "new.txt").read_bytes() == b"new\n"
            assert "new.txt" in os.listdir(mnt)
            # the file held open across the switch reads its commit to the end
            assert held.read_all(len(V1)) == V1
            (row,) = rows(tmp_path)
            assert row["commit"] == v2
            print(f"push visible to a new open after {took:.2f} s")

            # the serving process dies: its successor still serves both commits
            first = int(str(row["pid"]))
            os.kill(first, signal.SIGKILL)
            wait_for(lambda: rows(tmp_path)[0]["pid"] not in (first, None), 30.0)
            assert held.read_all(len(V1)) == V1
            assert (mnt / "data.bin").read_bytes() == V2
            assert rows(tmp_path)[0]["commit"] == v2
        finally:
            held.close()


def test_watching_a_local_branch_and_bad_uses(env: Path, tmp_path: Path) -> None:
    mnt = env
    work = tmp_path / "work"
    run("git", "init", "-q", "-b", "main", str(work), cwd=tmp_path)
    run("git-xet", "init", cwd=work)
    v1 = commit_files(work, {"a.txt": b"1\n", "d.bin": V1[:MiB]}, "v1")

    # refused before anything is mounted, in one line each
    for args, needle in (
        (["--watch=1s", "--nfs", str(work), "main"], "FUSE"),
        (["--watch=1s", str(work), v1[:10]], "commit id"),
        (["--watch=soon", str(work), "main"], "not a duration"),
        (["--watch=0s", str(work), "main"], "out of range"),
    ):
        r = run("git-xet", "mount", *args, str(mnt), cwd=tmp_path, check=False)
        assert r.returncode != 0 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert rows(tmp_path) == []

    # --watch without a value, before the arguments: the default interval
    run("git-xet", "mount", "--watch", str(work), "main", str(mnt), cwd=tmp_path)
    (row,) = rows(tmp_path)
    assert row["watch"] == "main" and row["commit"] == v1
    run("git-xet", "unmount", str(mnt), cwd=tmp_path)

    run("git-xet", "mount", "--watch=500ms", str(work), "main", str(mnt), cwd=tmp_path)
    sub = mnt / "sub"
    assert not sub.exists()
    v2 = commit_files(work, {"a.txt": b"2\n"}, "v2")
    took = wait_for(content_is(mnt / "a.txt", b"2\n"), 10.0)
    assert took < 3.0
    (work / "sub").mkdir()
    commit_files(work, {"sub/b.txt": b"b\n"}, "v3")
    wait_for(content_is(mnt / "sub" / "b.txt", b"b\n"), 10.0)
    assert rows(tmp_path)[0]["commit"] != v2  # v3 now
    text = run("git-xet", "mounts", cwd=tmp_path).stdout
    assert "(following main)" in text
