#!/usr/bin/env python3
"""Reading one big file of a commit through fsspec (``xet://``) vs through the FUSE mount.

Both read the same committed file of the same repository in the same run: a sequential scan
in 1 MiB reads and N random 4 KiB reads (the same offsets for both), each cold and then warm.

* cold: the xorb files are evicted from the page cache (``posix_fadvise(DONTNEED)``, which
  touches only those files) and the reader starts empty: ``XetFileSystem.close()`` drops its
  commits and chunk cache; the mount is unmounted and mounted again.
* warm: the same reads again right away (page cache, chunk cache and, for the mount, the
  kernel's cache of the file as they were left).

Every pass checks what it read (SHA-256 of the scan, a digest of the random reads), so a fast
wrong answer cannot win. The FUSE rows need root and /dev/fuse; without them they say n/a.

    python bench/fsspec.py [--size-mib 1024] [--reads 10000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# This file is named like the fsspec package: take its directory off the import path, or
# "import fsspec" would import this script.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

SEQ_BLOCK = 1 << 20
RANDOM_SIZE = 4096
FILE_NAME = "big.bin"


def sh(*args: str, cwd: Path, env: dict[str, str]) -> str:
    r = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
    return r.stdout.strip()


def make_repo(root: Path, size: int, env: dict[str, str]) -> tuple[Path, str, str]:
    """A repository whose one commit holds FILE_NAME of ``size`` random bytes.

    The work-tree copy is deleted after the commit: the data then lives only in the store,
    where both readers get it. Returns (repo, commit, sha256 of the file).
    """
    repo = root / "repo"
    repo.mkdir()
    sh("git", "init", "-q", cwd=repo, env=env)
    sh("git-xet", "init", cwd=repo, env=env)
    digest = hashlib.sha256()
    rnd = random.Random(1)
    with open(repo / FILE_NAME, "wb") as f:
        left = size
        while left:
            block = rnd.randbytes(min(16 << 20, left))
            digest.update(block)
            f.write(block)
            left -= len(block)
    t = time.perf_counter()
    sh("git-xet", "add", FILE_NAME, cwd=repo, env=env)
    sh("git", "commit", "-q", "-m", "data", cwd=repo, env=env)
    print(f"ingested {size / 2**20:.0f} MiB in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    os.unlink(repo / FILE_NAME)
    return repo, sh("git", "rev-parse", "HEAD", cwd=repo, env=env), digest.hexdigest()


def evict(store: Path) -> None:
    """Drop the store's files from the page cache (only these files)."""
    for p in store.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(fn: Callable[[], str]) -> tuple[float, str]:
    t = time.perf_counter()
    check = fn()
    return time.perf_counter() - t, check


def scan(read: Callable[[int], bytes]) -> str:
    h = hashlib.sha256()
    while block := read(SEQ_BLOCK):
        h.update(block)
    return h.hexdigest()


def random_digest(pread: Callable[[int], bytes], offsets: Sequence[int]) -> str:
    h = hashlib.sha256()
    for off in offsets:
        h.update(pread(off))
    return h.hexdigest()


class FsspecReader:
    def __init__(self, url: str) -> None:
        import fsspec

        self.url = url
        self.fs = fsspec.filesystem("xet")

    def reset(self) -> None:
        self.fs.close()

    def seq(self) -> str:
        with self.fs.open(self.url) as f:
            return scan(f.read)

    def rand(self, offsets: Sequence[int]) -> str:
        with self.fs.open(self.url) as f:

            def pread(off: int) -> bytes:
                f.seek(off)
                data: bytes = f.read(RANDOM_SIZE)
                return data

            return random_digest(pread, offsets)

    def close(self) -> None:
        self.fs.close()


class FuseReader:
    def __init__(self, repo: Path, commit: str, mnt: Path, env: dict[str, str]) -> None:
        self.repo, self.commit, self.mnt, self.env = repo, commit, mnt, env
        self.mounted = False

    def reset(self) -> None:
        if self.mounted:
            self.close()
        sh(
            "git-xet",
            "mount",
            str(self.repo),
            self.commit,
            str(self.mnt),
            cwd=self.repo,
            env=self.env,
        )
        self.mounted = True

    def seq(self) -> str:
        with open(self.mnt / FILE_NAME, "rb", buffering=0) as f:
            return scan(f.read)

    def rand(self, offsets: Sequence[int]) -> str:
        fd = os.open(self.mnt / FILE_NAME, os.O_RDONLY)
        try:
            return random_digest(lambda off: os.pread(fd, RANDOM_SIZE, off), offsets)
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.mounted:
            sh("git-xet", "unmount", str(self.mnt), cwd=self.repo, env=self.env)
            self.mounted = False


def fuse_reason() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None and os.geteuid() != 0:
        return "no fusermount3 and not root"
    try:
        import pyfuse3  # noqa: F401
    except ImportError:
        return "pyfuse3 is not installed"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--reads", type=int, default=10_000)
    ap.add_argument("--dir", help="where to build the repository (default: a temp dir)")
    args = ap.parse_args()
    size = args.size_mib << 20
    root = Path(tempfile.mkdtemp(prefix="gitxet-bench-fsspec-", dir=args.dir))
    home = root / "home"
    home.mkdir()
    env = dict(os.environ, HOME=str(home), GIT_CONFIG_GLOBAL=str(home / ".gitconfig"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    env["GITXET_STATE_DIR"] = str(root / "state")
    for k, v in (("user.name", "bench"), ("user.email", "bench@invalid")):
        sh("git", "config", "--global", k, v, cwd=root, env=env)
    os.environ.update(HOME=env["HOME"], GIT_CONFIG_GLOBAL=env["GIT_CONFIG_GLOBAL"])
    try:
        repo, commit, want = make_repo(root, size, env)
        store = repo / ".git" / "xet"
        rnd = random.Random(2)
        offsets = [rnd.randrange(size - RANDOM_SIZE) for _ in range(args.reads)]
        from gitxet.fsspec import format_url

        readers: list[tuple[str, object]] = [
            ("fsspec", FsspecReader(format_url(str(repo), commit, FILE_NAME)))
        ]
        reason = fuse_reason()
        if reason is None:
            mnt = root / "mnt"
            mnt.mkdir()
            readers.append(("FUSE", FuseReader(repo, commit, mnt, env)))
        rows: list[tuple[str, str, str, str]] = []
        expect_random: str | None = None
        for name, reader in readers:
            assert isinstance(reader, FsspecReader | FuseReader)
            try:
                for kind in ("seq", "rand"):
                    for state in ("cold", "warm"):
                        if state == "cold":
                            reader.reset()
                            evict(store)
                        if kind == "seq":
                            secs, check = timed(reader.seq)
                            if check != want:
                                raise SystemExit(f"{name}: the scan read wrong bytes")
                            rate = f"{size / secs / 2**20:8.0f} MiB/s"
                        else:
                            secs, check = timed(lambda r=reader: r.rand(offsets))
                            if expect_random is None:
                                expect_random = check
                            elif check != expect_random:
                                raise SystemExit(f"{name}: random reads disagree")
                            rate = f"{len(offsets) / secs:8.0f} reads/s"
                        label = (
                            f"sequential {args.size_mib} MiB"
                            if kind == "seq"
                            else f"{len(offsets)} x 4 KiB random"
                        )
                        rows.append((name, label, state, f"{secs:7.2f} s  {rate}"))
                        print(f"{name:7} {label:24} {state}: {rows[-1][3]}", file=sys.stderr)
            finally:
                reader.close()
        print()
        print("| reader | workload | cache | time, rate |")
        print("|---|---|---|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3].strip()} |")
        if reason is not None:
            print(f"\nFUSE: n/a ({reason})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
