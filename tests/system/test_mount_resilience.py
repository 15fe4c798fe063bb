"""Mounts that never strand a job: dead mounts shown and repaired (real git, real FUSE)."""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import mmap
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.fuse_env import STEP_TIMEOUT, force_unmount, require_fuse
from tests.helpers.proc import git_env, run, use_interpreter

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    require_fuse()
    use_interpreter(monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A work tree with two commits on main: a chunked file and a small one."""
    tmp = tmp_path_factory.mktemp("res")
    env = git_env(tmp)

    def sh(*a: str) -> str:
        r = subprocess.run(list(a), cwd=work, env=env, check=True, capture_output=True, text=True)
        return r.stdout.strip()

    work = tmp / "work"
    subprocess.run(["git", "init", "-q", str(work)], env=env, check=True)
    sh("git-xet", "init")
    rnd = random.Random(18)
    files = {"big.bin": rnd.randbytes(4 << 20), "sub/small.txt": b"small\n"}
    for p, d in files.items():
        (work / p).parent.mkdir(parents=True, exist_ok=True)
        (work / p).write_bytes(d)
    sh("git-xet", "add", ".")
    sh("git", "commit", "-q", "-m", "v1")
    first = sh("git", "rev-parse", "HEAD")
    (work / "sub/small.txt").write_bytes(b"changed\n")
    sh("git-xet", "add", ".")
    sh("git", "commit", "-q", "-m", "v2")
    return {"work": work, "files": files, "first": first}


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "mnt"
    path.mkdir()
    try:
        yield path
    finally:
        run("git-xet", "unmount", "--lazy", str(path), cwd=tmp_path, check=False)
        force_unmount(str(path))


def listing(cwd: Path) -> list[dict[str, object]]:
    """This test's mounts (under ``cwd``): the machine may hold others' (dead) mounts."""
    out = run("git-xet", "mounts", "--json", cwd=cwd).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    return [r for r in rows if str(r["mountpoint"]).startswith(f"{cwd}/")]


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT
    while os.path.exists(f"/proc/{pid}") and _state(pid) not in (b"Z", b"X"):
        assert time.monotonic() < deadline, "a killed process does not go away"
        time.sleep(0.02)


def kill_all(cwd: Path, mnt: Path) -> None:
    """SIGKILL the mount's supervisor, then its serving process: a dead mount."""
    (row,) = [r for r in listing(cwd) if r["mountpoint"] == str(mnt)]
    for key in ("supervisor_pid", "pid"):
        if row[key] is not None:
            os.kill(int(str(row[key])), signal.SIGKILL)
            wait_gone(int(str(row[key])))


def _state(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return b"X"


def test_a_dead_mount_is_listed_repaired_and_removed(
    repo: dict[str, object], mnt: Path, tmp_path: Path
) -> None:
    work = repo["work"]
    files = repo["files"]
    assert isinstance(work, Path) and isinstance(files, dict)
    rel = os.path.relpath(work, tmp_path)
    run("git-xet", "mount", "--subdir", "sub", rel, "main", str(mnt), cwd=tmp_path)
    (row,) = listing(tmp_path)
    # a relative repo path is recorded absolute; the subdir is shown
    assert row["repo"] == str(work) and row["subdir"] == "sub" and row["state"] == "ok"
    assert "sub" in run("git-xet", "mounts", cwd=tmp_path).stdout.split()[3]
    run("git-xet", "unmount", str(mnt), cwd=tmp_path)

    run("git-xet", "mount", str(work), "main", str(mnt), cwd=tmp_path)
    kill_all(tmp_path, mnt)
    with pytest.raises(OSError) as ei:
        os.listdir(mnt)
    assert ei.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)

    # shown dead, with the fix
    (row,) = listing(tmp_path)
    assert row["state"] == "dead" and "git xet mount" in str(row["fix"])
    text = run("git-xet", "mounts", cwd=tmp_path).stdout
    assert "\tdead\t" in text and f"git xet unmount {mnt}" in text

    # another commit onto the dead mount is refused, naming the way out
    r = run("git-xet", "mount", str(work), str(repo["first"]), str(mnt), cwd=tmp_path, check=False)
    assert r.returncode != 0 and "dead gitxet mount" in r.stderr and "unmount" in r.stderr
    assert "Traceback" not in r.stderr

    # the same repo and commit repairs it
    r = run("git-xet", "mount", str(work), "main", str(mnt), cwd=tmp_path)
    assert "dead mount" in r.stderr
    got = (mnt / "big.bin").read_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(files["big.bin"]).digest()
    assert (mnt / "sub/small.txt").read_bytes() == b"changed\n"
    (row,) = listing(tmp_path)
    assert row["state"] == "ok"

    # unmount cleans a dead one
    kill_all(tmp_path, mnt)
    run("git-xet", "unmount", str(mnt), cwd=tmp_path)
    assert listing(tmp_path) == []
    assert os.listdir(mnt) == []


# ---- failover: the supervisor keeps the FUSE connection, serving processes come and go ----

BIG = 256 << 20
STORM_SECONDS = 20.0
EVENT_AT = 5.0
READERS = 8


@pytest.fixture(scope="module")
def big_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A work tree whose one commit holds a 256 MiB file of random bytes."""
    tmp = tmp_path_factory.mktemp("big")
    env = git_env(tmp)
    work = tmp / "work"
    subprocess.run(["git", "init", "-q", str(work)], env=env, check=True)
    rnd = random.Random(256)
    data = b"".join(rnd.randbytes(16 << 20) for _ in range(BIG // (16 << 20)))
    (work / "big.bin").write_bytes(data)
    for cmd in (["git-xet", "init"], ["git-xet", "add", "."], ["git", "commit", "-qm", "big"]):
        subprocess.run(cmd, cwd=work, env=env, check=True, capture_output=True, timeout=300)
    return work, data


@dataclass
class Storm:
    errors: list[str]
    wrong: int
    reads: int
    done: list[float]  # monotonic completion times


def read_storm(path: Path, data: bytes, event: Callable[[], None]) -> tuple[Storm, float]:
    """8 threads of random O_DIRECT preads (each one a FUSE request) for 20 s; ``event``
    runs at 5 s. Returns what the readers saw and when the event started."""
    end = time.monotonic() + STORM_SECONDS
    lock = threading.Lock()
    storm = Storm([], 0, 0, [])

    def reader(seed: int) -> None:
        rnd = random.Random(seed)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)  # no page cache: every read is served
        buf = mmap.mmap(-1, 1 << 20)
        try:
            while time.monotonic() < end:
                n = rnd.choice((4096, 65536, 131072, 1 << 20))
                off = rnd.randrange(0, len(data) - n) & ~4095
                try:
                    got = os.preadv(fd, [memoryview(buf)[:n]], off)
                except OSError as exc:
                    with lock:
                        storm.errors.append(f"pread @{off}+{n}: {exc}")
                    continue
                ok = got == n and buf[:n] == data[off : off + n]
                with lock:
                    storm.reads += 1
                    storm.wrong += not ok
                    storm.done.append(time.monotonic())
        finally:
            os.close(fd)
            buf.close()

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(READERS)]
    for t in threads:
        t.start()
    time.sleep(EVENT_AT)
    at = time.monotonic()
    event()
    for t in threads:
        t.join(STORM_SECONDS + 30)
    assert not any(t.is_alive() for t in threads), "a reader is stuck"
    return storm, at


def check_storm(storm: Storm, at: float) -> float:
    """Assert no error, no wrong byte, and reads going on within 5 s; returns the longest
    pause in completions after the event."""
    assert storm.errors == [], storm.errors[:5]
    assert storm.wrong == 0
    after = [at, *sorted(t for t in storm.done if t > at)]
    assert len(after) > 1, "no read completed after the event"
    pause = max(b - a for a, b in itertools.pairwise(after))
    assert pause < 5.0, f"reads paused {pause:.1f} s after the event"
    assert after[-1] > at + 10, "reads did not go on after the event"
    return pause


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigkill", "upgrade"])
def test_readers_see_no_error_when_the_serving_process_goes(
    big_repo: tuple[Path, bytes], mnt: Path, tmp_path: Path, how: str
) -> None:
    work, data = big_repo
    run("git-xet", "mount", str(work), "main", str(mnt), cwd=tmp_path)
    (row,) = listing(tmp_path)
    first, supervisor = row["pid"], row["supervisor_pid"]
    assert isinstance(first, int) and isinstance(supervisor, int) and first != supervisor

    def event() -> None:
        if how == "sigkill":
            os.kill(first, signal.SIGKILL)
        else:
            r = run("git-xet", "mount", "--upgrade", str(mnt), cwd=tmp_path)
            assert f"was {first}" in r.stderr

    storm, at = read_storm(mnt / "big.bin", data, event)
    pause = check_storm(storm, at)
    (row,) = listing(tmp_path)
    assert row["state"] == "ok" and row["supervisor_pid"] == supervisor
    assert row["pid"] not in (first, None)
    print(f"{how}: {storm.reads} reads, 0 errors, longest pause after it {pause:.2f} s")
    log = Path(str(row["log"])).read_text()
    assert "in-flight requests re-sent" in log  # the new process asked for the re-send


def test_killing_supervisor_and_server_leaves_a_dead_mount_that_repairs(
    repo: dict[str, object], mnt: Path, tmp_path: Path
) -> None:
    work = repo["work"]
    assert isinstance(work, Path)
    run("git-xet", "mount", str(work), "main", str(mnt), cwd=tmp_path)
    (row,) = listing(tmp_path)
    os.kill(int(str(row["supervisor_pid"])), signal.SIGKILL)
    # the supervisor alone: its serving process still serves, but nobody would replace it
    assert (mnt / "sub/small.txt").read_bytes() == b"changed\n"
    (row2,) = listing(tmp_path)
    assert row2["state"] == "orphan" and "failover" in str(row2["fix"])
    os.kill(int(str(row["pid"])), signal.SIGKILL)
    wait_gone(int(str(row["pid"])))
    (row3,) = listing(tmp_path)
    assert row3["state"] == "dead"
    run("git-xet", "mount", str(work), "main", str(mnt), cwd=tmp_path)
    assert (mnt / "sub/small.txt").read_bytes() == b"changed\n"
    kill_all(tmp_path, mnt)
    run("git-xet", "unmount", str(mnt), cwd=tmp_path)
    assert listing(tmp_path) == []
