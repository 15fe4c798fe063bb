"""Thousands of small pointer files: clone and a parallel mount read under ``ulimit -n 256``,
and batched adds (shared xorbs, a journal a crashed filter leaves, recovered on push).

The dataset is the bad case for descriptors: every file in its own xorb (what a store made
before small files were packed looks like), so reading them all touches thousands of xorbs.
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gitxet.data.clean import Ingestor
from gitxet.formats.pointer import Pointer
from gitxet.hashing import to_hex
from gitxet.store.cas import LocalCAS
from tests.helpers.fuse_env import require_fuse

pytestmark = [pytest.mark.timeout(600)]

N_FILES = 2500
FD_LIMIT = 256


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("GITXET_STATE_DIR", str(tmp_path / "state"))


def run(
    *args: str, cwd: Path, check: bool = True, limit: bool = False, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        list(args),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_limit_fds if limit else None,
    )
    if check and r.returncode != 0:
        raise AssertionError(f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture(scope="module")
def many_xorbs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    """A committed work repo of N_FILES small pointer files, each file in its own xorb."""
    tmp = tmp_path_factory.mktemp("many")
    work = tmp / "work"
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    subprocess.run(["git", "init", "-q", str(work)], check=True, env=env)
    subprocess.run(["git-xet", "init"], cwd=work, check=True, env=env, capture_output=True)
    cas = LocalCAS(str(work / ".git" / "xet"), durable=False)
    rnd = random.Random(16)
    files: dict[str, bytes] = {}
    for i in range(N_FILES):
        data = rnd.randbytes(rnd.randrange(1, 6000))
        with Ingestor(cas) as ing:  # one session per file: one xorb each
            r = ing.add_bytes(data)
            ing.flush()
        rel = f"d{i % 50:02d}/s{i % 7}/f{i:05d}.bin"
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        ptr = Pointer(sha256=r.sha256, size=r.size, xet_hash=to_hex(r.file_hash))
        (work / rel).write_bytes(ptr.encode())  # git keeps a pointer as it is
        files[rel] = data
    cas.close()
    assert len(list(cas.xorb_hashes())) == N_FILES
    subprocess.run(["git", "add", "."], cwd=work, check=True, env=env)
    subprocess.run(["git", "commit", "-qm", "many"], cwd=work, check=True, env=env)
    return work, files


def test_clone_of_thousands_of_xorbs_under_ulimit_256(
    tmp_path: Path, many_xorbs: tuple[Path, dict[str, bytes]]
) -> None:
    work, files = many_xorbs
    clone = tmp_path / "clone"
    run("git-xet", "clone", str(work), str(clone), cwd=tmp_path, limit=True)
    for rel, data in files.items():
        assert (clone / rel).read_bytes() == data, rel
    status = run("git", "status", "--porcelain", cwd=clone).stdout
    assert status == ""


@pytest.mark.fuse
def test_mount_parallel_read_under_ulimit_256(
    tmp_path: Path, many_xorbs: tuple[Path, dict[str, bytes]]
) -> None:
    require_fuse()
    work, files = many_xorbs
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run("git-xet", "mount", str(work), "HEAD", str(mnt), cwd=tmp_path, limit=True)
    try:

        def read(rel: str) -> str | None:
            try:
                with open(mnt / rel, "rb") as f:
                    return None if f.read() == files[rel] else f"{rel}: wrong bytes"
            except OSError as exc:
                return f"{rel}: {exc}"

        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            errors = [e for e in ex.map(read, files) if e is not None]
        assert errors == []
    finally:
        run("git-xet", "unmount", str(mnt), cwd=tmp_path, check=False)


def test_batched_add_packs_small_files_and_a_crashed_filter_is_recovered(
    tmp_path: Path,
) -> None:
    remote, work = tmp_path / "remote.git", tmp_path / "work"
    run("git", "init", "-q", "--bare", str(remote), cwd=tmp_path)
    run("git", "init", "-q", str(work), cwd=tmp_path)
    run("git", "remote", "add", "origin", str(remote), cwd=work)
    run("git-xet", "init", "--threshold", "0", cwd=work)
    run("git", "commit", "-qm", "rules", cwd=work)
    rnd = random.Random(17)
    files = {f"a/{i:04d}.bin": rnd.randbytes(rnd.randrange(1, 30_000)) for i in range(600)}
    # dated back, so no file is "racily clean" (same second as the index): git would
    # re-clean every such file below with a one-shot filter process each (~600 processes)
    written = time.time() - 300
    for rel, data in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(data)
        os.utime(work / rel, (written, written))
    # a filter that dies right after git hung up, before it wrote its batch to the store:
    # git has already recorded the pointers
    crash = tmp_path / "crash_filter.py"
    crash.write_text(
        "import os\n"
        "from gitxet.cli import hot\n"
        "from gitxet.git import filter_protocol\n"
        "serve = filter_protocol.serve\n"
        "def dying(*a, **k):\n"
        "    serve(*a, **k)\n"
        "    os._exit(0)\n"
        "filter_protocol.serve = dying\n"
        "hot.filter_process()\n"
    )
    real = run("git", "config", "filter.xet.process", cwd=work).stdout.strip()
    run("git", "config", "filter.xet.process", f"{sys.executable} {crash}", cwd=work)
    run("git", "add", "a", cwd=work)
    store = LocalCAS(str(work / ".git" / "xet"))
    assert list(store.xorb_hashes()) == []  # the batch never reached the store
    assert len(os.listdir(work / ".git" / "xet" / "staging")) == 1
    # with no process filter set, git re-cleans changed (or racily clean: same second as
    # the index) files with the one-shot filter: it stores the dead session's journal
    # before cleaning, so it finds those chunks. It used to write a xorb per re-cleaned
    # file (here the three changed ones; ~600 when all were racily clean)
    run("git", "config", "--unset", "filter.xet.process", cwd=work)
    for rel in list(files)[:3]:
        os.utime(work / rel, (time.time() - 200, time.time() - 200))  # changed, not racy
    run("git", "add", "a", cwd=work)
    assert len(list(store.xorb_hashes())) == 1  # 600 files, one shared xorb
    assert os.listdir(work / ".git" / "xet" / "staging") == []
    run("git", "config", "filter.xet.process", real, cwd=work)
    run("git", "commit", "-qm", "small files", cwd=work)
    run("git", "push", "-q", "origin", "main", cwd=work)
    assert len(list(store.xorb_hashes())) == 1
    # once more, and this time the push is what stores the journal: files older than the
    # index are not racy, so nothing re-cleans them before it
    old = time.time() - 100
    for i in range(5):
        files[f"a/new{i}.bin"] = rnd.randbytes(5_000)
        (work / f"a/new{i}.bin").write_bytes(files[f"a/new{i}.bin"])
        os.utime(work / f"a/new{i}.bin", (old, old))
    run("git", "config", "filter.xet.process", f"{sys.executable} {crash}", cwd=work)
    run("git", "add", "a", cwd=work)
    run("git", "config", "filter.xet.process", real, cwd=work)
    run("git", "commit", "-qm", "five more", cwd=work)
    assert len(os.listdir(work / ".git" / "xet" / "staging")) == 1
    run("git", "push", "-q", "origin", "main", cwd=work)  # recovers the journal, then pushes
    assert len(list(store.xorb_hashes())) == 2
    assert os.listdir(work / ".git" / "xet" / "staging") == []
    clone = tmp_path / "clone"
    run("git-xet", "clone", str(remote), str(clone), cwd=tmp_path)
    for rel, data in files.items():
        assert (clone / rel).read_bytes() == data, rel
    assert run("git", "status", "--porcelain", cwd=clone).stdout == ""
