"""Shared pieces of the real-FUSE system tests: availability check, daemon start and cleanup.

A FUSE test (marked ``fuse``) skips only with a reason naming what is missing; under
``CI=true`` the hook in tests/helpers/ci.py turns that skip into a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
STEP_TIMEOUT = 20.0  # any single wait in these tests; a hang fails instead of stalling CI


def fuse_unavailable_reason() -> str | None:
    """Why a real FUSE mount cannot be made here, or ``None`` when it can."""
    try:
        import pyfuse3  # noqa: F401
        import trio  # noqa: F401
    except ImportError as exc:
        return f"pyfuse3/trio cannot be imported ({exc}); install the 'mount' extra"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse device (load the fuse module, or run the container with --device)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"/dev/fuse cannot be opened: {exc}"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian/Ubuntu package fuse3)"
    if os.geteuid() != 0 and not os.stat(shutil.which("fusermount3") or "").st_mode & 0o4000:
        return "not root and fusermount3 is not setuid"
    return None


def require_fuse() -> None:
    """Skip when FUSE is unavailable (a failure under CI=true: the test is marked ``fuse``)."""
    reason = fuse_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


def mountinfo_has(mountpoint: str) -> bool:
    """Whether ``mountpoint`` is in the mount table (never touches the mount)."""
    target = os.path.realpath(os.path.dirname(mountpoint))
    target = os.path.join(target, os.path.basename(mountpoint))
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            field = line.split(b" ")[4].replace(b"\\040", b" ")
            if os.fsdecode(field) == target:
                return True
    return False


def helper_argv(mountpoint: str, *flags: str) -> list[str]:
    """Command line of the test mount daemon (run it with ``cwd=REPO_ROOT``)."""
    return [sys.executable, "-m", "tests.helpers.fuse_serve", mountpoint, *flags]


def spawn(mountpoint: str, log: Path, *flags: str) -> subprocess.Popen[bytes]:
    """Start the test daemon and wait until its mount is in the mount table."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            helper_argv(mountpoint, *flags),
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + STEP_TIMEOUT
    while not mountinfo_has(mountpoint):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(mountpoint, proc)
            pytest.fail(f"test daemon did not mount {mountpoint}:\n{log.read_text()}")
        time.sleep(0.02)
    return proc


def wait_for_file(path: Path, timeout: float = STEP_TIMEOUT) -> None:
    """Wait until ``path`` exists (a marker a daemon creates); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {timeout:g} s")
        time.sleep(0.01)


def wait_exit(proc: subprocess.Popen[bytes], timeout: float = STEP_TIMEOUT) -> int | None:
    """The exit status, or ``None`` if the process is still running after ``timeout``."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def wait_unmounted(mountpoint: str, timeout: float = STEP_TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while mountinfo_has(mountpoint):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def force_unmount(mountpoint: str) -> None:
    """Lazy unmount, ignoring every error (for finally blocks)."""
    if mountinfo_has(mountpoint):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                ["fusermount3", "-u", "-z", mountpoint],
                capture_output=True,
                timeout=10,
                check=False,
            )


def stop(mountpoint: str, proc: subprocess.Popen[bytes] | None) -> None:
    """Detach the mount and make sure the daemon is gone (for finally blocks)."""
    force_unmount(mountpoint)
    if proc is not None and proc.poll() is None and wait_exit(proc, 5) is None:
        proc.kill()
        proc.wait(10)


def kill_pid(pid: int) -> None:
    """SIGKILL a pid that may already be gone (for finally blocks)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)
