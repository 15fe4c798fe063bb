"""The mount lifecycle with real FUSE daemons (tests/helpers/fuse_serve.py)."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitxet.errors import MountError
from gitxet.mount.runner import (
    MountProcess,
    MountRecord,
    MountRegistry,
    is_mounted,
    process_alive,
    start_background,
    unmount,
)
from tests.helpers.fuse_env import (
    REPO_ROOT,
    STEP_TIMEOUT,
    force_unmount,
    helper_argv,
    kill_pid,
    require_fuse,
    wait_for_file,
)

pytestmark = pytest.mark.fuse


@pytest.fixture(autouse=True)
def _need_fuse() -> None:
    require_fuse()


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "mnt"
    path.mkdir()
    try:
        yield path
    finally:
        force_unmount(str(path))


def start(mnt: Path, tmp_path: Path, *flags: str) -> MountProcess:
    return start_background(
        helper_argv(str(mnt), *flags),
        str(mnt),
        timeout=STEP_TIMEOUT,
        log_path=str(tmp_path / "daemon.log"),
        cwd=str(REPO_ROOT),
    )


def wait_dead(proc: MountProcess, timeout: float = STEP_TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while proc.alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_start_record_list_unmount(mnt: Path, tmp_path: Path) -> None:
    reg = MountRegistry(tmp_path / "state")
    proc = start(mnt, tmp_path)
    try:
        assert is_mounted(str(mnt))
        assert proc.alive()
        assert os.getsid(proc.pid) == proc.pid  # its own session: outlives our terminal
        assert (mnt / "README.md").read_bytes() == b"# test tree\n"
        rec = MountRecord.for_process(proc, kind="fuse", repo="r", commit="c" * 40, cache_dir="d")
        reg.record(rec)
        assert reg.list() == [rec]
        unmount(str(mnt), registry=reg, timeout=STEP_TIMEOUT)
        assert not is_mounted(str(mnt))
        assert not proc.alive()
        assert reg.list() == []
        assert reg.get(str(mnt)) is None
        assert "unmounted" in (tmp_path / "daemon.log").read_text()
    finally:
        kill_pid(proc.pid)


def test_unmount_without_registry_finds_our_daemon(mnt: Path, tmp_path: Path) -> None:
    proc = start(mnt, tmp_path)
    try:
        unmount(str(mnt), timeout=STEP_TIMEOUT)
        assert not is_mounted(str(mnt))
        assert wait_dead(proc, 0.1)  # unmount() already waited for it
    finally:
        kill_pid(proc.pid)


def test_sigterm_unmounts_cleanly(mnt: Path, tmp_path: Path) -> None:
    reg = MountRegistry(tmp_path / "state")
    proc = start(mnt, tmp_path)
    try:
        reg.record(MountRecord.for_process(proc, kind="fuse", repo="", commit="", cache_dir=""))
        os.kill(proc.pid, signal.SIGTERM)
        assert wait_dead(proc)
        assert not is_mounted(str(mnt))
        log = (tmp_path / "daemon.log").read_text()
        assert "signal 15" in log and "unmounted" in log  # serve() returned normally
        assert reg.list() == []  # pruned: the daemon is gone
    finally:
        kill_pid(proc.pid)


def test_unmount_after_daemon_died(mnt: Path, tmp_path: Path) -> None:
    proc = start(mnt, tmp_path)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_dead(proc)
        with pytest.raises(OSError) as info:
            os.listdir(mnt)  # (a stat could still be answered from the attribute cache)
        # ECONNABORTED while the kernel is still tearing the connection down, then ENOTCONN.
        assert info.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
        unmount(str(mnt), timeout=STEP_TIMEOUT)
        assert not is_mounted(str(mnt))
        assert os.listdir(mnt) == []
    finally:
        kill_pid(proc.pid)


def test_busy_mount_needs_lazy(mnt: Path, tmp_path: Path) -> None:
    proc = start(mnt, tmp_path)
    fd = os.open(mnt / "data/big.bin", os.O_RDONLY)
    try:
        with pytest.raises(MountError, match="unmount failed") as info:
            unmount(str(mnt), timeout=STEP_TIMEOUT)
        assert "busy" in info.value.reason
        assert is_mounted(str(mnt)) and proc.alive()
        # Lazy: detached at once; the daemon, still holding an open file, is stopped after
        # the timeout and the open descriptor stops working.
        unmount(str(mnt), timeout=0.5, lazy=True)
        assert not is_mounted(str(mnt))
        assert not proc.alive()
        with pytest.raises(OSError):
            os.pread(fd, 10, 0)
    finally:
        os.close(fd)
        kill_pid(proc.pid)


def test_second_mount_on_same_mountpoint_is_refused(mnt: Path, tmp_path: Path) -> None:
    proc = start(mnt, tmp_path)
    try:
        with pytest.raises(MountError, match="already mounted"):
            start(mnt, tmp_path)
        assert process_alive(proc.pid, proc.start_time)
    finally:
        unmount(str(mnt), timeout=STEP_TIMEOUT)
        kill_pid(proc.pid)


def test_real_daemon_failure_carries_its_traceback(tmp_path: Path) -> None:
    # The mountpoint vanishes between the runner's check and the daemon's own: serve() raises
    # and the daemon dies with a traceback, which must come back in the error.
    mnt = tmp_path / "gone"
    mnt.mkdir()
    daemon = " ".join(f"'{a}'" for a in helper_argv(str(mnt)))
    argv = ["sh", "-c", f"rmdir '{mnt}' && exec {daemon}"]
    with pytest.raises(MountError) as info:
        start_background(argv, str(mnt), timeout=STEP_TIMEOUT, cwd=str(REPO_ROOT))
    assert info.value.returncode not in (None, 0)
    assert "MountError" in info.value.log_tail
    assert "mountpoint is not a directory" in info.value.log_tail


def test_sigterm_with_a_stuck_read_still_unmounts(mnt: Path, tmp_path: Path) -> None:
    entered = tmp_path / "entered"
    proc = start(
        mnt, tmp_path, "--gate", "slow.bin", "--gate-entered", str(entered), "--grace", "0.5"
    )
    outcome: list[BaseException | bytes] = []

    def stuck_reader() -> None:
        try:
            outcome.append((mnt / "slow.bin").read_bytes())
        except OSError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=stuck_reader, daemon=True)
    reader.start()
    try:
        wait_for_file(entered)  # the read reached the daemon
        assert reader.is_alive()  # ... and waits for a gate that never opens
        began = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        assert wait_dead(proc)
        assert time.monotonic() - began < 15  # the grace was 0.5 s; the gate would wait 30 s
        assert not is_mounted(str(mnt))
        reader.join(STEP_TIMEOUT)
        assert len(outcome) == 1 and isinstance(outcome[0], OSError)
        log = (tmp_path / "daemon.log").read_text()
        assert "abandoning" in log and "unmounted" in log
    finally:
        kill_pid(proc.pid)
