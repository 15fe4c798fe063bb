"""Chunk read-around on a real FUSE mount: after a small read, the rest of its chunk is in
the kernel page cache (seen with mincore), the bytes are right, and --no-read-around stops it.
A small file is in the page cache whole once its first open returns.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import hashlib
import mmap
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gitxet.chunking import chunk_bytes
from tests.helpers.fuse_env import require_fuse

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
]  # fmt: skip
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident_pages(fd: int, size: int) -> bytes:
    """One byte per page of the file: bit 0 set when the page is in the page cache."""
    addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    try:
        pages = -(-size // mmap.PAGESIZE)
        vec = ctypes.create_string_buffer(pages)
        assert _libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        return bytes(b & 1 for b in vec.raw[:pages])
    finally:
        _libc.munmap(addr, size)


def git_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_fuse()
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("GITXET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    for k, v in (("user.name", "t"), ("user.email", "t@t"), ("init.defaultBranch", "main")):
        subprocess.run(["git", "config", "--global", k, v], check=True)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, bytes]:
    git_env(tmp_path, monkeypatch)
    rnd = random.Random(21)
    # incompressible, then compressible (stored LZ4), then an odd-sized incompressible tail
    data = rnd.randbytes(3 << 20) + b"0123456789abcdef" * (1 << 17) + rnd.randbytes(123_457)
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.bin").write_bytes(data)
    for args in (["git", "init", "-q"], ["git-xet", "init"], ["git-xet", "add", "."]):
        subprocess.run(args, cwd=work, check=True, capture_output=True, timeout=120)
    subprocess.run(["git", "commit", "-qm", "d"], cwd=work, check=True, timeout=60)
    return work, data


def mount(work: Path, mnt: Path, *extra: str) -> None:
    mnt.mkdir()
    subprocess.run(
        ["git-xet", "mount", str(work), "main", str(mnt), *extra],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip


def unmount(mnt: Path) -> None:
    subprocess.run(["git-xet", "unmount", str(mnt)], check=False, capture_output=True, timeout=60)


def a_big_chunk(data: bytes) -> tuple[int, int]:
    pos = 0
    for c in chunk_bytes(data):
        if len(c) >= 48 * 1024:
            return pos, pos + len(c)
        pos += len(c)
    raise AssertionError("no chunk of 48 KiB or more")


def whole_pages(start: int, end: int) -> range:
    return range(-(-start // mmap.PAGESIZE), end // mmap.PAGESIZE)


def test_a_small_read_brings_its_chunk_into_the_page_cache(
    repo: tuple[Path, bytes], tmp_path: Path
) -> None:
    work, data = repo
    start, end = a_big_chunk(data)
    mid = (start + end) // 2 // mmap.PAGESIZE * mmap.PAGESIZE
    mnt = tmp_path / "mnt"
    mount(work, mnt)
    try:
        fd = os.open(mnt / "data.bin", os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no kernel read-ahead
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            assert os.pread(fd, 4096, mid) == data[mid : mid + 4096]
            want = whole_pages(start, end)
            deadline = time.monotonic() + 5
            while True:
                pages = resident_pages(fd, len(data))
                if all(pages[p] for p in want) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert all(pages[p] for p in want), "the chunk's pages were not stored"
            assert sum(pages) < len(want) + 4  # its chunk, not the file
            # what was stored is right: random small reads (mostly page-cache hits now)
            rnd = random.Random(3)
            for _ in range(3000):
                off = rnd.randrange(len(data))
                n = rnd.choice([1, 100, 4096, 6000, 20_000])
                assert os.pread(fd, n, off) == data[off : off + n], off
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_NORMAL)
        finally:
            os.close(fd)
        digest = hashlib.sha256((mnt / "data.bin").read_bytes()).hexdigest()
        assert digest == hashlib.sha256(data).hexdigest()
    finally:
        unmount(mnt)


def test_no_read_around_leaves_the_page_cache_to_the_kernel(
    repo: tuple[Path, bytes], tmp_path: Path
) -> None:
    work, data = repo
    start, end = a_big_chunk(data)
    mid = (start + end) // 2 // mmap.PAGESIZE * mmap.PAGESIZE
    mnt = tmp_path / "mnt"
    mount(work, mnt, "--no-read-around")
    try:
        fd = os.open(mnt / "data.bin", os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            assert os.pread(fd, 4096, mid) == data[mid : mid + 4096]
            time.sleep(0.5)
            pages = resident_pages(fd, len(data))
            assert pages[mid // mmap.PAGESIZE] and sum(pages) <= 2
        finally:
            os.close(fd)
    finally:
        unmount(mnt)


def test_a_small_file_is_in_the_page_cache_once_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    git_env(tmp_path, monkeypatch)
    rnd = random.Random(22)
    files = {
        "d/small.bin": rnd.randbytes(300_000),  # a pointer (>= 256 KiB), under FILL_MAX
        "d/tiny.txt": b"a plain git blob\n" * 20,
        "big.bin": rnd.randbytes(3 << 20),  # over FILL_MAX: left to reads
    }
    work = tmp_path / "work"
    for rel, data in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(data)
    for args in (["git", "init", "-q"], ["git-xet", "init"], ["git-xet", "add", "."]):
        subprocess.run(args, cwd=work, check=True, capture_output=True, timeout=120)
    subprocess.run(["git", "commit", "-qm", "d"], cwd=work, check=True, timeout=60)
    mnt = tmp_path / "mnt"
    mount(work, mnt)
    try:
        for rel in ("d/small.bin", "d/tiny.txt"):
            fd = os.open(mnt / rel, os.O_RDONLY)
            try:  # nothing read yet: every page is there already
                assert all(resident_pages(fd, len(files[rel]))), rel
            finally:
                os.close(fd)
        fd = os.open(mnt / "big.bin", os.O_RDONLY)
        try:
            assert not any(resident_pages(fd, len(files["big.bin"])))
        finally:
            os.close(fd)

        # many readers at once, opening and reading the same files: always the right bytes
        def read_all(rel: str) -> bytes:
            return (mnt / rel).read_bytes()

        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            jobs = [(rel, ex.submit(read_all, rel)) for rel in list(files) * 8]
            for rel, job in jobs:
                assert job.result(timeout=120) == files[rel], rel
    finally:
        unmount(mnt)

    mnt2 = tmp_path / "mnt2"
    mount(work, mnt2, "--no-read-around")  # leaves the page cache to the kernel
    try:
        fd = os.open(mnt2 / "d/small.bin", os.O_RDONLY)
        try:
            assert not any(resident_pages(fd, len(files["d/small.bin"])))
            assert os.pread(fd, 100, 5000) == files["d/small.bin"][5000:5100]
        finally:
            os.close(fd)
    finally:
        unmount(mnt2)
