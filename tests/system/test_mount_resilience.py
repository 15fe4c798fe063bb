"""Mounts that never strand a job: dead mounts shown and repaired (real git, real FUSE)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.fuse_env import STEP_TIMEOUT, force_unmount, require_fuse

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    require_fuse()
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("GITXET_STATE_DIR", str(tmp_path / "state"))


def run(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A work tree with two commits on main: a chunked file and a small one."""
    tmp = tmp_path_factory.mktemp("res")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    home = tmp / "home"
    home.mkdir()
    env.update(HOME=str(home), GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=str(home / ".gitconfig"))
    for k, v in (("user.name", "t"), ("user.email", "t@t"), ("init.defaultBranch", "main")):
        subprocess.run(["git", "config", "--global", k, v], env=env, check=True)

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
    out = run("git-xet", "mounts", "--json", cwd=cwd).stdout
    return [json.loads(line) for line in out.splitlines()]


def kill_daemon(cwd: Path, mnt: Path) -> int:
    (row,) = [r for r in listing(cwd) if r["mountpoint"] == str(mnt)]
    pid = int(str(row["pid"]))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + STEP_TIMEOUT
    while os.path.exists(f"/proc/{pid}") and b"Z" not in _state(pid):
        assert time.monotonic() < deadline, "the killed daemon does not go away"
        time.sleep(0.02)
    return pid


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
    kill_daemon(tmp_path, mnt)
    with pytest.raises(OSError) as ei:
        os.listdir(mnt)
    assert ei.value.errno == errno.ENOTCONN

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
    kill_daemon(tmp_path, mnt)
    run("git-xet", "unmount", str(mnt), cwd=tmp_path)
    assert listing(tmp_path) == []
    assert os.listdir(mnt) == []
