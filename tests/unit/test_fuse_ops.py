"""XetFuseOperations called directly (no kernel, no mount) over MemoryFS."""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from collections.abc import Callable
from typing import Any

import pytest

pyfuse3 = pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed (extra 'mount')")
trio = pytest.importorskip("trio", reason="trio is not installed (extra 'mount')")

from gitxet.errors import MountError  # noqa: E402
from gitxet.mount.fuse import (  # noqa: E402
    CACHE_TIMEOUT,
    FAST_STREAK,
    XetFuseOperations,
    _FastReads,
)
from gitxet.mount.runner import mount_options  # noqa: E402
from gitxet.vfs.nodes import Attrs, FSStats  # noqa: E402
from tests.helpers.memfs import MemoryFS  # noqa: E402

CTX: Any = object()  # the handlers never look at the request context

TREE: dict[str, object] = {
    "a.txt": b"hello world",
    "run.sh": b"#!/bin/sh\n",
    "dir/b.bin": bytes(range(256)) * 40,
    "dir/sub/c.txt": b"c",
    "link": ("link", "dir/b.bin"),
    "empty": None,
}


def run(fn: Callable[..., Any], *args: Any) -> Any:
    return trio.run(fn, *args)


def fuse_errno(fn: Callable[..., Any], *args: Any) -> int:
    with pytest.raises(pyfuse3.FUSEError) as info:
        trio.run(fn, *args)
    return int(info.value.errno)


@pytest.fixture
def fs() -> MemoryFS:
    return MemoryFS(TREE)


@pytest.fixture
def ops(fs: MemoryFS) -> XetFuseOperations:
    return XetFuseOperations(fs, uid=1234, gid=5678)


def lookup_path(ops: XetFuseOperations, path: str) -> Any:
    ino = pyfuse3.ROOT_INODE
    for part in path.split("/"):
        ino = run(ops.lookup, ino, part.encode(), CTX).st_ino
    return run(ops.getattr, ino, CTX)


# ---- attributes --------------------------------------------------------------------------------


def test_lookup_translates_attributes(ops: XetFuseOperations, fs: MemoryFS) -> None:
    e = run(ops.lookup, pyfuse3.ROOT_INODE, b"a.txt", CTX)
    model = fs.lookup(fs.root_ino, b"a.txt")
    assert e.st_ino == model.ino
    assert e.st_mode == stat.S_IFREG | 0o644
    assert e.st_size == 11
    assert e.st_nlink == 1
    assert (e.st_uid, e.st_gid) == (1234, 5678)
    assert e.st_blocks == 1
    assert e.st_mtime_ns == e.st_ctime_ns == e.st_atime_ns == model.mtime_ns
    assert e.attr_timeout == e.entry_timeout == CACHE_TIMEOUT


def test_exec_bit_symlink_and_dir_modes(ops: XetFuseOperations) -> None:
    assert lookup_path(ops, "run.sh").st_mode == stat.S_IFREG | 0o755
    link = lookup_path(ops, "link")
    assert stat.S_ISLNK(link.st_mode)
    assert link.st_size == len(b"dir/b.bin")
    assert stat.S_ISDIR(lookup_path(ops, "dir/sub").st_mode)
    big = lookup_path(ops, "dir/b.bin")
    assert big.st_size == 10240
    assert big.st_blocks == 20


def test_missing_name_is_a_cached_negative_entry(ops: XetFuseOperations) -> None:
    e = run(ops.lookup, pyfuse3.ROOT_INODE, b"nope", CTX)
    assert e.st_ino == 0
    assert e.entry_timeout == CACHE_TIMEOUT


def test_lookup_under_a_file_is_enotdir(ops: XetFuseOperations) -> None:
    ino = lookup_path(ops, "a.txt").st_ino
    assert fuse_errno(ops.lookup, ino, b"x", CTX) == errno.ENOTDIR


def test_dot_lookups(ops: XetFuseOperations) -> None:
    sub = lookup_path(ops, "dir/sub")
    parent = lookup_path(ops, "dir")
    assert run(ops.lookup, sub.st_ino, b".", CTX).st_ino == sub.st_ino
    assert run(ops.lookup, sub.st_ino, b"..", CTX).st_ino == parent.st_ino
    assert run(ops.lookup, pyfuse3.ROOT_INODE, b"..", CTX).st_ino == pyfuse3.ROOT_INODE


def test_getattr_stale_inode_is_enoent(ops: XetFuseOperations) -> None:
    assert fuse_errno(ops.getattr, 999_999, CTX) == errno.ENOENT


def test_readlink(ops: XetFuseOperations) -> None:
    assert run(ops.readlink, lookup_path(ops, "link").st_ino, CTX) == b"dir/b.bin"
    assert fuse_errno(ops.readlink, lookup_path(ops, "a.txt").st_ino, CTX) == errno.EINVAL


def test_access(ops: XetFuseOperations) -> None:
    ino = lookup_path(ops, "a.txt").st_ino
    assert run(ops.access, ino, os.R_OK, CTX) is True
    assert run(ops.access, ino, os.F_OK, CTX) is True
    assert fuse_errno(ops.access, ino, os.W_OK, CTX) == errno.EROFS
    assert fuse_errno(ops.access, 424242, os.R_OK, CTX) == errno.ENOENT


def test_statfs(ops: XetFuseOperations, fs: MemoryFS) -> None:
    s = run(ops.statfs, CTX)
    want = fs.statfs()
    assert s.f_bsize == s.f_frsize == want.block_size
    assert s.f_blocks == -(-want.total_bytes // want.block_size)
    assert s.f_bfree == s.f_bavail == s.f_ffree == 0
    assert s.f_files == want.files
    assert s.f_namemax == 255


# ---- files -------------------------------------------------------------------------------------


def test_open_read_release(ops: XetFuseOperations) -> None:
    ino = lookup_path(ops, "dir/b.bin").st_ino
    fi = run(ops.open, ino, os.O_RDONLY, CTX)
    assert fi.keep_cache is True
    assert fi.direct_io is False
    data = bytes(range(256)) * 40
    assert run(ops.read, fi.fh, 0, 100) == data[:100]
    assert run(ops.read, fi.fh, 10200, 4096) == data[10200:]  # short only at end of file
    assert run(ops.read, fi.fh, 20000, 10) == b""
    run(ops.release, fi.fh)
    # handles hold no state (a process taking over the connection understands them): the
    # handle is the model inode, so a read after release still reads that file
    assert run(ops.read, fi.fh, 0, 5) == data[:5]


def test_a_small_file_is_stored_whole_at_its_first_open(
    ops: XetFuseOperations, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored: list[tuple[int, int, bytes]] = []
    ops.page_store = lambda ino, off, data: stored.append((ino, off, bytes(data)))
    data = bytes(range(256)) * 40
    ino = lookup_path(ops, "dir/b.bin").st_ino
    fh = run(ops.open, ino, os.O_RDONLY, CTX).fh
    assert stored == [(ino, 0, data)]  # the kernel's inode number, the whole file
    # a handle is open (a read of it may be in flight): a second open stores nothing
    fh2 = run(ops.open, ino, os.O_RDONLY, CTX).fh
    run(ops.release, fh)
    run(ops.release, fh2)
    # stored once: a later open leaves it to the page cache (or to read())
    run(ops.release, run(ops.open, ino, os.O_RDONLY, CTX).fh)
    assert len(stored) == 1
    # files over FILL_MAX are not stored
    monkeypatch.setattr(ops, "_fill_max", 11 - 1)
    run(ops.open, lookup_path(ops, "a.txt").st_ino, os.O_RDONLY, CTX)
    assert len(stored) == 1


def test_a_failed_store_is_left_to_read(ops: XetFuseOperations) -> None:
    def refuse(ino: int, off: int, data: memoryview) -> None:
        raise OSError(errno.ENOENT, "no such inode in the kernel")

    ops.page_store = refuse
    ino = lookup_path(ops, "a.txt").st_ino
    fh = run(ops.open, ino, os.O_RDONLY, CTX).fh
    assert run(ops.read, fh, 0, 100) == b"hello world"
    run(ops.release, fh)
    stored: list[int] = []
    ops.page_store = lambda ino, off, data: stored.append(ino)
    run(ops.open, ino, os.O_RDONLY, CTX)  # not marked stored: tried again
    assert stored == [ino]


@pytest.mark.parametrize(
    "flags",
    [os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_WRONLY | os.O_APPEND],
    ids=["wronly", "rdwr", "trunc", "append"],
)
def test_open_for_writing_is_erofs(ops: XetFuseOperations, flags: int) -> None:
    ino = lookup_path(ops, "a.txt").st_ino
    assert fuse_errno(ops.open, ino, flags, CTX) == errno.EROFS


def test_open_directory_and_stale(ops: XetFuseOperations) -> None:
    assert fuse_errno(ops.open, pyfuse3.ROOT_INODE, os.O_RDONLY, CTX) == errno.EISDIR
    assert fuse_errno(ops.open, 777_777, os.O_RDONLY, CTX) == errno.ENOENT


def test_failed_read_is_eio_and_logged(
    ops: XetFuseOperations, fs: MemoryFS, caplog: pytest.LogCaptureFixture
) -> None:
    fi = run(ops.open, lookup_path(ops, "a.txt").st_ino, os.O_RDONLY, CTX)
    fs.fail_reads = True
    with caplog.at_level(logging.WARNING, logger="gitxet.mount.fuse"):
        assert fuse_errno(ops.read, fi.fh, 0, 5) == errno.EIO
    assert any("data unavailable" in r.getMessage() for r in caplog.records)


class BrokenFS(MemoryFS):
    """A model with bugs: unexpected exceptions and errno-less OSErrors."""

    def read(self, ino: int, offset: int, size: int) -> bytes:
        raise KeyError("bug in the model")

    def readdir(self, ino: int) -> list[tuple[bytes, Attrs]]:
        raise OSError("no errno at all")

    def statfs(self) -> FSStats:
        raise OSError(errno.ENOSPC, "weird but passed through")


def test_unexpected_errors_become_eio(caplog: pytest.LogCaptureFixture) -> None:
    ops = XetFuseOperations(BrokenFS(TREE))
    fi = run(ops.open, lookup_path(ops, "a.txt").st_ino, os.O_RDONLY, CTX)
    with caplog.at_level(logging.ERROR, logger="gitxet.mount.fuse"):
        assert fuse_errno(ops.read, fi.fh, 0, 5) == errno.EIO
    assert any("KeyError" in r.getMessage() for r in caplog.records)
    fh = run(ops.opendir, pyfuse3.ROOT_INODE, CTX)
    assert fuse_errno(ops.readdir, fh, 0, object()) == errno.EIO
    assert fuse_errno(ops.statfs, CTX) == errno.ENOSPC


# ---- writes ------------------------------------------------------------------------------------

WRITE_OPS: list[tuple[str, tuple[Any, ...]]] = [
    ("setattr", (1, None, None, None, CTX)),
    ("write", (1, 0, b"x")),
    ("create", (1, b"new", 0o644, os.O_WRONLY | os.O_CREAT, CTX)),
    ("mkdir", (1, b"d", 0o755, CTX)),
    ("mknod", (1, b"n", stat.S_IFIFO | 0o644, 0, CTX)),
    ("symlink", (1, b"s", b"target", CTX)),
    ("link", (2, 1, b"l", CTX)),
    ("unlink", (1, b"a.txt", CTX)),
    ("rmdir", (1, b"empty", CTX)),
    ("rename", (1, b"a.txt", 1, b"b.txt", 0, CTX)),
    ("setxattr", (1, b"user.x", b"v", CTX)),
    ("removexattr", (1, b"user.x", CTX)),
]


@pytest.mark.parametrize(("name", "args"), WRITE_OPS, ids=[n for n, _ in WRITE_OPS])
def test_every_write_op_is_erofs(ops: XetFuseOperations, name: str, args: tuple[Any, ...]) -> None:
    assert fuse_errno(getattr(ops, name), *args) == errno.EROFS


# ---- directories -------------------------------------------------------------------------------


class FakeKernel:
    """Stands in for pyfuse3.readdir_reply: accepts ``room`` entries per readdir call."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.got: list[tuple[bytes, int, int]] = []

    def reply(self, token: Any, name: bytes, attr: Any, next_id: int) -> bool:
        if self.room == 0:
            return False
        self.room -= 1
        self.got.append((name, attr.st_ino, next_id))
        return True


def read_all(
    ops: XetFuseOperations, monkeypatch: pytest.MonkeyPatch, ino: int, per_call: int
) -> list[tuple[bytes, int, int]]:
    fh = run(ops.opendir, ino, CTX)
    out: list[tuple[bytes, int, int]] = []
    start = 0
    for _ in range(1000):
        kernel = FakeKernel(per_call)
        monkeypatch.setattr(pyfuse3, "readdir_reply", kernel.reply)
        run(ops.readdir, fh, start, object())
        if not kernel.got:
            break
        out.extend(kernel.got)
        start = kernel.got[-1][2]
    run(ops.releasedir, fh)
    return out


def test_readdir_offsets_are_stable_index_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    fs = MemoryFS({f"d/e{i:03d}": b"x" for i in range(25)})
    ops = XetFuseOperations(fs)
    d = run(ops.lookup, pyfuse3.ROOT_INODE, b"d", CTX).st_ino
    whole = read_all(ops, monkeypatch, d, per_call=1000)
    names = [n for n, _, _ in whole]
    assert names == [b".", b"..", *[f"e{i:03d}".encode() for i in range(25)]]
    assert [t for _, _, t in whole] == list(range(1, 28))
    assert whole[0][1] == d
    assert whole[1][1] == pyfuse3.ROOT_INODE
    # Paging in small steps (as the kernel does with its 4 KiB buffer) gives the same list.
    for per_call in (1, 2, 7):
        assert read_all(ops, monkeypatch, d, per_call) == whole
    # Resuming from any token gives exactly the rest, also on a fresh open (seekdir).
    fh = run(ops.opendir, d, CTX)
    for start in (0, 5, 26, 27):
        kernel = FakeKernel(1000)
        monkeypatch.setattr(pyfuse3, "readdir_reply", kernel.reply)
        run(ops.readdir, fh, start, object())
        assert kernel.got == whole[start:]


def test_readdir_lists_once_per_open(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    class Counting(MemoryFS):
        def readdir(self, ino: int) -> list[tuple[bytes, Attrs]]:
            calls.append(ino)
            return super().readdir(ino)

    ops = XetFuseOperations(Counting({f"f{i}": b"" for i in range(10)}))
    read_all(ops, monkeypatch, pyfuse3.ROOT_INODE, per_call=2)
    assert len(calls) == 1


def test_opendir_errors(ops: XetFuseOperations) -> None:
    assert fuse_errno(ops.opendir, lookup_path(ops, "a.txt").st_ino, CTX) == errno.ENOTDIR
    assert fuse_errno(ops.opendir, 999_999, CTX) == errno.ENOENT
    assert fuse_errno(ops.readdir, 12345, 0, object()) == errno.ENOENT  # no such inode


# ---- inode mapping -----------------------------------------------------------------------------


class SwappedFS:
    """MemoryFS seen through a renumbering: its root is 5 and its node 5 is called 1."""

    def __init__(self, inner: MemoryFS) -> None:
        self.inner = inner

    @staticmethod
    def _map(ino: int) -> int:
        return {1: 5, 5: 1}.get(ino, ino)

    def _attrs(self, a: Attrs) -> Attrs:
        return Attrs(self._map(a.ino), a.kind, a.mode, a.size, a.nlink, a.mtime_ns)

    @property
    def root_ino(self) -> int:
        return 5

    def getattr(self, ino: int) -> Attrs:
        return self._attrs(self.inner.getattr(self._map(ino)))

    def lookup(self, parent_ino: int, name: bytes) -> Attrs:
        return self._attrs(self.inner.lookup(self._map(parent_ino), name))

    def parent(self, ino: int) -> int:
        return self._map(self.inner.parent(self._map(ino)))

    def readdir(self, ino: int) -> list[tuple[bytes, Attrs]]:
        return [(n, self._attrs(a)) for n, a in self.inner.readdir(self._map(ino))]

    def readlink(self, ino: int) -> bytes:
        return self.inner.readlink(self._map(ino))

    def read(self, ino: int, offset: int, size: int) -> bytes:
        return self.inner.read(self._map(ino), offset, size)

    def statfs(self) -> FSStats:
        return self.inner.statfs()


def test_model_root_is_mapped_to_fuse_root_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    inner = MemoryFS({f"f{i}": f"file {i}".encode() for i in range(6)})
    fs = SwappedFS(inner)
    ops = XetFuseOperations(fs)
    root = run(ops.getattr, pyfuse3.ROOT_INODE, CTX)
    assert root.st_ino == pyfuse3.ROOT_INODE
    assert stat.S_ISDIR(root.st_mode)
    # The node the model numbers 1 must not collide with the FUSE root: it appears as 5.
    victim = next(name for name, a in fs.readdir(5) if a.ino == 1)
    e = run(ops.lookup, pyfuse3.ROOT_INODE, victim, CTX)
    assert e.st_ino == 5
    fi = run(ops.open, e.st_ino, os.O_RDONLY, CTX)
    assert run(ops.read, fi.fh, 0, 100) == inner.read(5, 0, 100)
    listing = read_all(ops, monkeypatch, pyfuse3.ROOT_INODE, per_call=100)
    assert listing[0][1] == listing[1][1] == pyfuse3.ROOT_INODE
    inos = [i for _, i, _ in listing[2:]]
    assert len(set(inos)) == len(inos)
    assert pyfuse3.ROOT_INODE not in inos


def test_zero_root_is_refused() -> None:
    class ZeroRoot(MemoryFS):
        @property
        def root_ino(self) -> int:
            return 0

    with pytest.raises(ValueError):
        XetFuseOperations(ZeroRoot({}))


# ---- concurrency -------------------------------------------------------------------------------


class GateFS(MemoryFS):
    """Reads of files whose name starts with ``slow`` wait for ``gate``."""

    def __init__(self) -> None:
        super().__init__({"slow1": b"1" * 10, "slow2": b"2" * 10, "slow3": b"3", "fast": b"f"})
        self.gate = threading.Event()
        self.slow = {self.lookup(1, n).ino for n in (b"slow1", b"slow2", b"slow3")}
        self.read_threads: set[int] = set()
        self.waiting = 0  # slow reads now held at the gate
        self._count = threading.Lock()

    def read(self, ino: int, offset: int, size: int) -> bytes:
        self.read_threads.add(threading.get_ident())
        if ino in self.slow:
            with self._count:
                self.waiting += 1
            self.gate.wait(10)
        return super().read(ino, offset, size)


def test_blocked_reads_do_not_block_metadata_or_other_reads() -> None:
    fs = GateFS()
    ops = XetFuseOperations(fs, read_threads=2, meta_threads=2)
    results: dict[str, bytes] = {}

    async def main() -> None:
        fhs = {}
        for name in ("slow1", "slow2", "slow3", "fast"):
            e = await ops.lookup(pyfuse3.ROOT_INODE, name.encode(), CTX)
            fhs[name] = (await ops.open(e.st_ino, os.O_RDONLY, CTX)).fh

        async def reader(name: str) -> None:
            results[name] = await ops.read(fhs[name], 0, 100)

        async with trio.open_nursery() as nursery:
            for name in ("slow1", "slow2"):  # fill the whole read limiter
                nursery.start_soon(reader, name)
            with trio.fail_after(5):  # both really wait inside the model
                while fs.waiting < 2:
                    await trio.sleep(0.005)
            with trio.fail_after(5):
                e = await ops.lookup(pyfuse3.ROOT_INODE, b"fast", CTX)
                assert e.st_ino != 0
                assert (await ops.getattr(pyfuse3.ROOT_INODE, CTX)).st_ino == 1
                await ops.statfs(CTX)
            assert results == {}
            fs.gate.set()
        with trio.fail_after(5):
            results["fast"] = await ops.read(fhs["fast"], 0, 100)

    trio.run(main)
    assert results == {"slow1": b"1" * 10, "slow2": b"2" * 10, "fast": b"f"}
    assert threading.get_ident() not in fs.read_threads  # reads ran in worker threads


def test_cancelled_read_abandons_its_thread() -> None:
    fs = GateFS()
    ops = XetFuseOperations(fs)

    async def main() -> float:
        e = await ops.lookup(pyfuse3.ROOT_INODE, b"slow1", CTX)
        fh = (await ops.open(e.st_ino, os.O_RDONLY, CTX)).fh
        start = trio.current_time()
        with trio.move_on_after(0.2):
            await ops.read(fh, 0, 10)
        return trio.current_time() - start

    try:
        assert trio.run(main) < 2.0  # the gate waits 10 s: shutdown did not wait for it
    finally:
        fs.gate.set()


# ---- mount options -----------------------------------------------------------------------------


def test_mount_options_defaults() -> None:
    opts = mount_options("gitxet:repo@abc")
    assert opts == {"ro", "default_permissions", "fsname=gitxet:repo@abc", "subtype=gitxet"}
    assert "allow_other" in mount_options(allow_other=True)
    assert "noatime" in mount_options(options=["noatime"])


def test_mount_options_sanitize_and_refuse() -> None:
    assert "fsname=a_b_c_" in mount_options("a,b c\u00e9")
    with pytest.raises(MountError, match="max_read"):
        mount_options(options=["max_read=131072"])
    for bad in ("a,b", "", "caf\u00e9"):
        with pytest.raises(MountError):
            mount_options(options=[bad])


# ---- taking waiting requests without trio's scheduler (_FastReads) ----------------------------


def _pipe_test(body: Callable[[_FastReads, int], Any]) -> None:
    r, w = os.pipe()
    try:
        trio.run(body, _FastReads(r), w)
    finally:
        os.close(r)
        os.close(w)


def test_fast_reads_take_waiting_requests_without_a_checkpoint() -> None:
    import trio.testing

    async def body(fast: _FastReads, w: int) -> None:
        os.write(w, b"x")  # a request is waiting: pyfuse3 would read it right after
        with trio.testing.assert_no_checkpoints():
            for _ in range(FAST_STREAK):
                assert await fast.wait()
        with trio.testing.assert_checkpoints():  # then one pass, so other tasks run
            assert await fast.wait()
        with trio.testing.assert_no_checkpoints():
            assert await fast.wait()

    _pipe_test(body)


def test_fast_reads_wait_when_no_request_is_there() -> None:
    import trio.testing

    async def body(fast: _FastReads, w: int) -> None:
        async def arrive() -> None:
            await trio.testing.wait_all_tasks_blocked()
            os.write(w, b"x")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(arrive)
            assert await fast.wait()

    _pipe_test(body)


def test_fast_reads_end_the_loop_when_closing() -> None:
    import trio.testing

    async def body(fast: _FastReads, w: int) -> None:
        r = fast.fd
        results: list[bool] = []

        async def waiter() -> None:
            results.append(await fast.wait())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            nursery.start_soon(waiter)  # queued behind the first on the lock
            await trio.testing.wait_all_tasks_blocked()
            fast.closing = True  # as _Loop.stop does, then pyfuse3.terminate()
            trio.lowlevel.notify_closing(r)
        assert results == [False, False]

    _pipe_test(body)


def test_fast_reads_install_replaces_pyfuse3s_wait_and_undo_restores_it() -> None:
    r, w = os.pipe()
    before = pyfuse3._wait_fuse_readable
    try:
        fast = _FastReads(r)
        undo = fast.install()
        assert pyfuse3._wait_fuse_readable == fast.wait
        undo()
        assert pyfuse3._wait_fuse_readable is before
    finally:
        pyfuse3._wait_fuse_readable = before
        os.close(r)
        os.close(w)
