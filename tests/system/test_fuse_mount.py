"""A real FUSE mount of MemoryFS served by a child process (tests/helpers/fuse_serve.py)."""

from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.fuse_env import (
    REPO_ROOT,
    STEP_TIMEOUT,
    helper_argv,
    mountinfo_has,
    require_fuse,
    spawn,
    stop,
    wait_exit,
    wait_for_file,
    wait_unmounted,
)
from tests.helpers.fuse_serve import MANY, PARALLEL_FILES, build_tree

pytestmark = pytest.mark.fuse

Mounted = tuple[Path, "subprocess.Popen[bytes]"]
TREE = build_tree()
GATED = "slow.bin"  # reads of this file wait for SIGUSR1 in the shared mount
FRESH = "fresh.bin"  # read only by the gate test


@pytest.fixture(autouse=True)
def _need_fuse() -> None:
    require_fuse()


@pytest.fixture(scope="module")
def mounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mounted]:
    require_fuse()
    base = tmp_path_factory.mktemp("fuse")
    mnt = base / "mnt"
    mnt.mkdir()
    proc = None
    try:
        proc = spawn(
            str(mnt), base / "daemon.log", "--gate", GATED, "--gate-entered", str(base / "entered")
        )
        yield mnt, proc
    finally:
        stop(str(mnt), proc)


def files_of_tree() -> dict[str, bytes]:
    return {p: c for p, c in TREE.items() if isinstance(c, bytes)}


def test_listing(mounted: Mounted) -> None:
    mnt, _ = mounted
    top = {p.split("/")[0] for p in TREE}
    assert sorted(os.listdir(mnt)) == sorted(top)
    many = os.listdir(mnt / "many")
    assert len(many) == MANY
    assert many == sorted(many)  # readdir order is the model's (sorted) order, over many pages
    assert os.listdir(mnt / "empty_dir") == []
    kinds = {e.name: (e.is_dir(), e.is_symlink()) for e in os.scandir(mnt)}
    assert kinds["data"] == (True, False)
    assert kinds["link"] == (False, True)
    assert kinds["README.md"] == (False, False)


def test_stat_sizes_and_modes(mounted: Mounted) -> None:
    mnt, _ = mounted
    for path, content in files_of_tree().items():
        st = os.lstat(mnt / path)
        assert stat.S_ISREG(st.st_mode), path
        assert st.st_size == len(content), path
        want = 0o755 if path.endswith(".sh") else 0o644
        assert stat.S_IMODE(st.st_mode) == want, path
    assert os.access(mnt / "run.sh", os.X_OK)
    assert not os.access(mnt / "README.md", os.X_OK)
    link = os.lstat(mnt / "link")
    assert stat.S_ISLNK(link.st_mode)
    assert os.readlink(mnt / "link") == "data/big.bin"
    assert os.stat(mnt / "link").st_size == len(TREE["data/big.bin"])  # type: ignore[arg-type]
    assert os.readlink(mnt / "dangling") == "nowhere/at/all"
    assert not os.path.exists(mnt / "dangling")
    assert stat.S_ISDIR(os.stat(mnt / "data/nested/deep").st_mode)
    with pytest.raises(FileNotFoundError):
        os.stat(mnt / "does-not-exist")


def test_file_contents(mounted: Mounted) -> None:
    mnt, _ = mounted
    for path, content in files_of_tree().items():
        if path in (GATED, FRESH):
            continue
        got = hashlib.sha256((mnt / path).read_bytes()).hexdigest()
        assert got == hashlib.sha256(content).hexdigest(), path
    assert (mnt / "link").read_bytes() == TREE["data/big.bin"]


def test_random_preads(mounted: Mounted) -> None:
    mnt, _ = mounted
    src = TREE["data/big.bin"]
    assert isinstance(src, bytes)
    rng = random.Random(7)
    fd = os.open(mnt / "data/big.bin", os.O_RDONLY)
    try:
        for _ in range(1000):
            off = rng.randrange(0, len(src) + 10)
            size = rng.choice([1, 17, 4096, 65536, rng.randrange(1, 300_000)])
            assert os.pread(fd, size, off) == src[off : off + size], (off, size)
    finally:
        os.close(fd)


def test_parallel_readers(mounted: Mounted) -> None:
    mnt, _ = mounted

    def digest(i: int) -> str:
        h = hashlib.sha256()
        with open(mnt / f"par/f{i}.bin", "rb", buffering=0) as f:
            while chunk := f.read(64 * 1024):
                h.update(chunk)
        return h.hexdigest()

    with concurrent.futures.ThreadPoolExecutor(PARALLEL_FILES) as pool:
        futures = {i: pool.submit(digest, i) for i in range(PARALLEL_FILES)}
        for i, fut in futures.items():
            want = TREE[f"par/f{i}.bin"]
            assert isinstance(want, bytes)
            assert fut.result(STEP_TIMEOUT) == hashlib.sha256(want).hexdigest()


def _write_ops(mnt: Path) -> list[tuple[str, Callable[[], object]]]:
    return [
        ("open-w", lambda: open(mnt / "README.md", "wb")),
        ("open-a", lambda: open(mnt / "README.md", "ab")),
        ("open-rw", lambda: os.open(mnt / "README.md", os.O_RDWR)),
        ("create", lambda: os.open(mnt / "new.txt", os.O_WRONLY | os.O_CREAT, 0o644)),
        ("mkdir", lambda: os.mkdir(mnt / "newdir")),
        ("rename", lambda: os.rename(mnt / "README.md", mnt / "README2.md")),
        ("unlink", lambda: os.unlink(mnt / "README.md")),
        ("rmdir", lambda: os.rmdir(mnt / "empty_dir")),
        ("symlink", lambda: os.symlink("README.md", mnt / "sl")),
        ("link", lambda: os.link(mnt / "README.md", mnt / "hl")),
        ("chmod", lambda: os.chmod(mnt / "README.md", 0o600)),
        ("truncate", lambda: os.truncate(mnt / "README.md", 0)),
        ("utime", lambda: os.utime(mnt / "README.md", (0, 0))),
        ("setxattr", lambda: os.setxattr(mnt / "README.md", "user.k", b"v")),
    ]


def test_writes_fail_with_erofs(mounted: Mounted) -> None:
    mnt, _ = mounted
    for name, op in _write_ops(mnt):
        with pytest.raises(OSError) as info:
            op()
        assert info.value.errno == errno.EROFS, name
    assert (mnt / "README.md").read_bytes() == TREE["README.md"]
    assert not (mnt / "new.txt").exists()
    vfs = os.statvfs(mnt)
    assert vfs.f_flag & os.ST_RDONLY


def test_the_serving_thread_runs_at_a_raised_priority_where_allowed(mounted: Mounted) -> None:
    """The thread answering every request runs at SERVE_NICE when the process may raise
    its priority (as root here), so the readers its replies wake do not preempt it."""
    from gitxet.mount.fuse import SERVE_NICE

    _, proc = mounted
    probe = subprocess.run(
        [sys.executable, "-c", "import os; os.setpriority(os.PRIO_PROCESS, 0, -1)"],
        capture_output=True,
        check=False,
        timeout=60,
    )
    own = os.getpriority(os.PRIO_PROCESS, 0)  # what the daemon inherited
    expected = min(own, SERVE_NICE) if probe.returncode == 0 else own
    # (the main thread's nice: the thread id of a process's main thread is its pid)
    assert os.getpriority(os.PRIO_PROCESS, proc.pid) == expected


def test_blocked_read_leaves_the_mount_responsive(mounted: Mounted) -> None:
    mnt, proc = mounted
    result: dict[str, bytes | BaseException] = {}

    def slow_reader() -> None:
        try:
            result["slow"] = (mnt / GATED).read_bytes()
        except BaseException as exc:
            result["slow"] = exc

    t = threading.Thread(target=slow_reader, daemon=True)
    t.start()
    try:
        wait_for_file(mnt.parent / "entered")  # the gated read reached the daemon
        assert t.is_alive() and not result  # ... and waits there
        start = time.monotonic()
        assert len(os.listdir(mnt / "many")) == MANY
        os.stat(mnt / "edge/page.bin")
        assert (mnt / FRESH).read_bytes() == TREE[FRESH]  # another file's reads still served
        assert time.monotonic() - start < 30  # not behind the gated read, which never ends
        assert t.is_alive()  # ... while the gated one still waits
    finally:
        os.kill(proc.pid, signal.SIGUSR1)
        t.join(STEP_TIMEOUT)
    assert result["slow"] == TREE[GATED]


def test_failed_reads_are_eio_quickly(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = None
    try:
        proc = spawn(str(mnt), tmp_path / "daemon.log", "--fail-reads")
        assert os.stat(mnt / "README.md").st_size == len(TREE["README.md"])  # type: ignore[arg-type]
        start = time.monotonic()
        with pytest.raises(OSError) as info:
            (mnt / "README.md").read_bytes()
        assert info.value.errno == errno.EIO
        assert time.monotonic() - start < 5
        assert "data unavailable" in (tmp_path / "daemon.log").read_text()
    finally:
        stop(str(mnt), proc)


def test_unmount_leaves_no_process_and_no_mount(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = None
    try:
        proc = spawn(str(mnt), tmp_path / "daemon.log")
        assert (mnt / "data/nested/deep/leaf.txt").read_bytes() == b"leaf\n"
        subprocess.run(["fusermount3", "-u", str(mnt)], check=True, timeout=STEP_TIMEOUT)
        assert wait_exit(proc) == 0
        assert wait_unmounted(str(mnt))
        assert not mountinfo_has(str(mnt))
        assert "unmounted" in (tmp_path / "daemon.log").read_text()
        assert os.listdir(mnt) == []  # the plain directory underneath is back
    finally:
        stop(str(mnt), proc)


def test_failing_ready_callback_unmounts_and_reraises(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            helper_argv(str(mnt), "--fail-ready"),
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        assert wait_exit(proc) not in (None, 0)
        assert not mountinfo_has(str(mnt))
        text = log.read_text()
        assert "mounted" in text and "RuntimeError: ready callback refuses" in text
    finally:
        stop(str(mnt), proc)
