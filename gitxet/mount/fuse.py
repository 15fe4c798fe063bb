"""FUSE adapter: pyfuse3 ``Operations`` over the read-only filesystem model.

This module only translates. The model (:class:`gitxet.vfs.nodes.ReadOnlyFS`) owns every
filesystem rule; here its ``Attrs`` become ``EntryAttributes``, its ``OSError.errno`` becomes
``FUSEError`` and its inode numbers become FUSE inode numbers.

Concurrency (see ``docs/design/concurrency.md``): pyfuse3 runs the handlers as trio tasks in
one thread. Every model call that may block (reads, lookups, directory listings, symlink
targets, statfs) runs in a worker thread through ``trio.to_thread.run_sync``; reads and
metadata calls have separate capacity limiters, so a burst of slow chunk fetches can never
starve ``ls``. ``getattr`` on a known inode is answered from the model's memory and stays on
the trio thread.

A commit never changes, so attributes, entries (also negative ones) and page-cache contents
are cached by the kernel for a long time (``keep_cache``, long timeouts). Reads of data the
model holds verified are answered on the trio thread (cheaper than a thread hop), the rest
on workers; after a small read the rest of its chunk is stored into the page cache by a
worker (``gitxet.mount.readaround``), so nearby reads never reach this process. A small
file (up to :data:`FILL_MAX`) is stored whole into the page cache at its first ``open``,
before the open returns: its reads are page-cache hits, and the trio thread (one core for
the whole mount) answers no read request for it.
"""

from __future__ import annotations

import errno
import functools
import inspect
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

import pyfuse3
import trio

from gitxet.errors import MountError
from gitxet.mount.follow import Follower
from gitxet.mount.metrics import MountMetrics
from gitxet.mount.readaround import ChunkedFS, ChunkReadAround
from gitxet.mount.runner import find_mount, mount_options, normalize_mountpoint
from gitxet.mount.supervisor import Takeover
from gitxet.util.lru import LRUCache
from gitxet.vfs.model import CommitFS
from gitxet.vfs.nodes import Attrs, NodeKind, ReadOnlyFS

log = logging.getLogger(__name__)

T = TypeVar("T")

CACHE_TIMEOUT = 3600.0  # seconds the kernel may keep attributes and entries (content is immutable)
READ_THREADS = 16  # concurrent model reads (each may wait on a network fetch)
META_THREADS = 8  # concurrent lookups / listings / readlinks, kept apart from reads
BLOCK_SIZE = 128 * 1024  # st_blksize: the I/O size we hint to readers
READ_AHEAD_KB = 1024  # measured ~20% faster sequential reads than the 128 KiB default
LISTING_ENTRIES = 1 << 18  # directory entries kept listed (all directories together)
SERVE_NICE = -5  # the serving thread's priority, where allowed (see _raise_priority)
FAST_SPIN = 100e-6  # seconds a fast taker polls for the next request before sleeping
FAST_STREAK = 16  # requests taken in a row without a pass through trio's scheduler
SHUTDOWN_GRACE = 5.0  # seconds in-flight requests get after SIGTERM before they are abandoned
FILL_MAX = 1 << 20  # files up to this size are stored whole into the page cache at open
FILLED_INODES = 1 << 16  # inodes remembered as stored (a later open does not store again)

#: a directory's listing as the replies send it, "." and ".." first: names, inode numbers,
#: modes, sizes, blocks, link counts, mtimes (columns: no object per entry)
_Listing = tuple[list[bytes], list[int], list[int], list[int], list[int], list[int], list[int]]

# trio renamed ``cancellable`` to ``abandon_on_cancel`` (0.23) and warns on the old name.
_ABANDON_KW = (
    "abandon_on_cancel"
    if "abandon_on_cancel" in inspect.signature(trio.to_thread.run_sync).parameters
    else "cancellable"
)


def _notify_store(kernel_ino: int, offset: int, data: memoryview) -> None:
    pyfuse3.notify_store(kernel_ino, offset, data)  # type: ignore[arg-type]  # any buffer


def _errno_of(exc: OSError) -> int:
    return exc.errno if isinstance(exc.errno, int) and exc.errno > 0 else errno.EIO


class XetFuseOperations(pyfuse3.Operations):
    """Read-only pyfuse3 handlers over a :class:`ReadOnlyFS`.

    The model's inode numbers are used as FUSE inode numbers, except that the model's root
    and FUSE's ``ROOT_INODE`` (1) trade places when they differ (a swap is its own inverse,
    so one function maps both ways and no number is ever shared by two nodes).
    """

    supports_dot_lookup = True
    enable_writeback_cache = False

    def __init__(
        self,
        fs: ReadOnlyFS,
        *,
        uid: int | None = None,
        gid: int | None = None,
        cache_timeout: float = CACHE_TIMEOUT,
        read_threads: int = READ_THREADS,
        meta_threads: int = META_THREADS,
        read_around: bool = True,
        metrics: MountMetrics | None = None,
    ) -> None:
        super().__init__()
        self.fs = fs
        self.metrics = metrics
        self._try_read: Callable[[int, int, int], bytes | None] | None = getattr(
            fs, "try_read", None
        )
        #: stores the rest of a chunk in the page cache after a small read (started by
        #: :func:`serve` once the mount exists; see ``gitxet.mount.readaround``)
        self.read_around: ChunkReadAround | None = (
            ChunkReadAround(cast(ChunkedFS, fs), _notify_store)
            if read_around and callable(getattr(fs, "chunk_extent", None))
            else None
        )
        #: puts bytes into the kernel page cache (``FUSE_NOTIFY_STORE``); set by :func:`serve`
        #: once the mount exists, with ``read_around``: small files are then stored whole at
        #: their first open (see :meth:`_fill`)
        self.page_store: Callable[[int, int, memoryview], None] | None = None
        self._fill_max = FILL_MAX if read_around else 0
        self._filled: LRUCache[int, bool] = LRUCache(FILLED_INODES)
        # fills that wait on a disk or a network; apart from reads, which a fill's store may
        # wait for (see _fill)
        self._fill_limiter = trio.CapacityLimiter(read_threads)
        self._open_count: dict[int, int] = {}  # model inode -> handles open (this process's)
        self._lookup_nowait: Callable[[int, bytes], Attrs | None] | None = getattr(
            fs, "lookup_nowait", None
        )
        self._root = fs.root_ino
        if self._root <= 0:
            raise ValueError(f"model root inode must be positive, got {self._root}")
        self._uid = os.getuid() if uid is None else uid
        self._gid = os.getgid() if gid is None else gid
        self._timeout = cache_timeout
        self._read_limiter = trio.CapacityLimiter(read_threads)
        self._meta_limiter = trio.CapacityLimiter(meta_threads)
        # File and directory handles are the model inode itself: no per-open state, so a
        # serving process that takes over the FUSE connection (gitxet.mount.supervisor)
        # understands the handles its predecessor gave out. Listings are kept per directory
        # (a commit's directory never changes) with their attributes, bounded by their
        # entry count (~150 bytes an entry).
        self._listings: LRUCache[int, _Listing] = LRUCache(
            LISTING_ENTRIES, weigher=lambda listing: len(listing[0]) + 1
        )

    #: called from libfuse's INIT handler (a takeover swaps the real connection in there)
    on_init: Callable[[], None] | None = None

    def init(self) -> None:
        if self.on_init is not None:
            self.on_init()

    # ---- translation -----------------------------------------------------------------------

    def _swap(self, ino: int) -> int:
        if ino == pyfuse3.ROOT_INODE:
            return self._root
        if ino == self._root:
            return pyfuse3.ROOT_INODE
        return ino

    def entry(
        self, attrs: Attrs, e: pyfuse3.EntryAttributes | None = None
    ) -> pyfuse3.EntryAttributes:
        """``EntryAttributes`` for a model node; with ``e`` (made here before, for a node of
        the same commit) only the fields that differ between nodes are set on it."""
        if e is None:
            e = pyfuse3.EntryAttributes()
            e.generation = 0
            e.entry_timeout = self._timeout
            e.attr_timeout = self._timeout
            e.st_uid = self._uid
            e.st_gid = self._gid
            e.st_rdev = 0
            e.st_blksize = BLOCK_SIZE
        ino, _, e.st_mode, size, e.st_nlink, mtime = attrs  # (a listing: once per entry)
        e.st_ino = ino if ino != self._root and ino != pyfuse3.ROOT_INODE else self._swap(ino)
        e.st_size = size
        e.st_blocks = (size + 511) // 512
        if e.st_mtime_ns != mtime:
            e.st_atime_ns = mtime
            e.st_mtime_ns = mtime
            e.st_ctime_ns = mtime
        return e

    def _fail(self, what: str, exc: BaseException) -> pyfuse3.FUSEError:
        if self.metrics is not None:
            self.metrics.error(what.split(" ", 1)[0])
        if isinstance(exc, OSError):
            code = _errno_of(exc)
            if code == errno.EIO:
                log.warning("%s: %s", what, exc)
            return pyfuse3.FUSEError(code)
        log.error("%s: unexpected %s", what, type(exc).__name__, exc_info=exc)
        return pyfuse3.FUSEError(errno.EIO)

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """Run a fast model call on the trio thread with errno translation."""
        try:
            return fn(*args)
        except Exception as exc:
            raise self._fail(what, exc) from None

    async def _offload(
        self, limiter: trio.CapacityLimiter, what: str, fn: Callable[..., T], *args: Any
    ) -> T:
        """Run a model call that may block in a worker thread, with errno translation.

        On cancellation (shutdown only) the thread is abandoned rather than awaited, so a
        stuck fetch cannot hold the unmount hostage.
        """
        try:
            result: T = await trio.to_thread.run_sync(
                functools.partial(fn, *args),
                limiter=limiter,
                **{_ABANDON_KW: True},  # type: ignore[arg-type]  # keyword differs by trio version
            )
        except Exception as exc:
            raise self._fail(what, exc) from None
        return result

    # ---- metadata --------------------------------------------------------------------------

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        parent = self._swap(parent_inode)
        try:
            # a listed directory answers from memory, here (no thread hop)
            attrs = self._lookup_nowait(parent, name) if self._lookup_nowait else None
            if attrs is None:
                attrs = await trio.to_thread.run_sync(
                    self.fs.lookup,
                    parent,
                    name,
                    limiter=self._meta_limiter,
                    **{_ABANDON_KW: True},  # type: ignore[arg-type]  # keyword differs by trio version
                )
        except FileNotFoundError:
            # A negative entry (inode 0) lets the kernel cache "no such name" as long as a
            # positive one; the tree is immutable, so that is always right.
            e = pyfuse3.EntryAttributes()
            e.st_ino = 0
            e.entry_timeout = self._timeout
            return e
        except Exception as exc:
            raise self._fail(f"lookup {parent}/{name!r}", exc) from None
        assert attrs is not None  # the worker's lookup returns Attrs or raises
        return self.entry(attrs)

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        ino = self._swap(inode)
        return self.entry(self._call(f"getattr {ino}", self.fs.getattr, ino))

    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        ino = self._swap(inode)
        return await self._offload(self._meta_limiter, f"readlink {ino}", self.fs.readlink, ino)

    async def access(self, inode: int, mode: int, ctx: pyfuse3.RequestContext) -> bool:
        ino = self._swap(inode)
        self._call(f"access {ino}", self.fs.getattr, ino)
        if mode & os.W_OK:
            raise pyfuse3.FUSEError(errno.EROFS)
        return True

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        nowait = getattr(self.fs, "statfs_nowait", None)
        if nowait is not None:  # never waits for a walk of the whole tree (find asks first)
            st = self._call("statfs", nowait)
        else:
            st = await self._offload(self._meta_limiter, "statfs", self.fs.statfs)
        out = pyfuse3.StatvfsData()
        bsize = max(st.block_size, 1)
        out.f_bsize = bsize
        out.f_frsize = bsize
        out.f_blocks = (st.total_bytes + bsize - 1) // bsize
        out.f_bfree = 0
        out.f_bavail = 0
        out.f_files = st.files
        out.f_ffree = 0
        out.f_favail = 0
        out.f_namemax = st.name_max
        return out

    # ---- directories -----------------------------------------------------------------------

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        ino = self._swap(inode)
        attrs = self._call(f"opendir {ino}", self.fs.getattr, ino)
        if attrs.kind is not NodeKind.DIR:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return ino

    def _listing(self, ino: int) -> _Listing:
        # "." and ".." first; offsets are index + 1 into this list, stable because the model
        # lists a directory of an immutable commit the same way every time.
        columns = getattr(self.fs, "readdir_columns", None)
        if columns is not None:
            names, inos, modes, sizes, nlinks, mtimes = columns(ino)
        else:
            listed = self.fs.readdir(ino)
            names = [n for n, _ in listed]
            inos, _, modes, sizes, nlinks, mtimes = (
                (list(col) for col in zip(*(a for _, a in listed), strict=True))
                if listed
                else ([], [], [], [], [], [])
            )
        if self._root != pyfuse3.ROOT_INODE:  # (a model whose root is not FUSE's number)
            inos = [self._swap(i) for i in inos]
        dot, dotdot = self.fs.getattr(ino), self.fs.getattr(self.fs.parent(ino))
        return (
            [b".", b"..", *names],
            [self._swap(dot.ino), self._swap(dotdot.ino), *inos],
            [dot.mode, dotdot.mode, *modes],
            [dot.size, dotdot.size, *sizes],
            [(size + 511) // 512 for size in (dot.size, dotdot.size, *sizes)],
            [dot.nlink, dotdot.nlink, *nlinks],
            [dot.mtime_ns, dotdot.mtime_ns, *mtimes],
        )

    def root_changed(self, names: Iterable[bytes]) -> None:
        """The commit behind the root changed (a watched mount, ``gitxet.mount.follow``):
        forget our listing of the root and make the kernel drop its cached entries for
        ``names`` (the old and the new root's) and the root's attributes, so the next path
        walk looks them up again. Entries below the root belong to their commit's inodes and
        stay valid. Call from a thread that is not serving a request."""
        self._listings.discard(self._root)
        dropped = 0
        for name in names:
            try:
                pyfuse3.invalidate_entry(pyfuse3.ROOT_INODE, name)
                dropped += 1
            except OSError:
                pass  # ENOENT: the kernel had not cached it
        try:
            pyfuse3.invalidate_inode(pyfuse3.ROOT_INODE, attr_only=False)
        except OSError as exc:
            log.debug("invalidating the root: %s", exc)
        log.debug("root changed: %d cached entries dropped", dropped)

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        listing = self._listings.get(fh)
        if listing is None:
            # Listed once, not per readdir call: a huge directory is read in many readdir
            # calls, and re-listing it on every call would be quadratic.
            listing = await self._offload(self._meta_limiter, f"readdir {fh}", self._listing, fh)
            self._listings.put(fh, listing)
        names, inos, modes, sizes, blocks, nlinks, mtimes = listing
        if start_id >= len(names):
            return
        # one EntryAttributes for the whole reply (readdir_reply copies it out at once),
        # only what differs between entries set per entry: a listing of a million files
        # sends a million
        e = self.entry(
            Attrs(inos[start_id], NodeKind.FILE, 0, 0, 0, mtimes[start_id])  # (the rest below)
        )
        reply = pyfuse3.readdir_reply
        mtime = mtimes[start_id]
        for idx in range(start_id, len(names)):
            e.st_ino = inos[idx]
            e.st_mode = modes[idx]
            e.st_size = sizes[idx]
            e.st_blocks = blocks[idx]
            e.st_nlink = nlinks[idx]
            if mtimes[idx] != mtime:
                mtime = e.st_atime_ns = e.st_mtime_ns = e.st_ctime_ns = mtimes[idx]
            if not reply(token, names[idx], e, idx + 1):
                break

    async def releasedir(self, fh: int) -> None:
        pass  # listings stay cached (bounded): the directory cannot change

    # ---- files -----------------------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        ino = self._swap(inode)
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_CREAT):
            raise pyfuse3.FUSEError(errno.EROFS)
        attrs = self._call(f"open {ino}", self.fs.getattr, ino)
        if attrs.kind is NodeKind.DIR:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if attrs.kind is not NodeKind.FILE:
            raise pyfuse3.FUSEError(errno.ELOOP)
        opened = self._open_count.get(ino, 0)
        self._open_count[ino] = opened + 1
        if not opened and 0 < attrs.size <= self._fill_max and self._filled.get(ino) is None:
            await self._fill(inode, ino, attrs.size)
        fh = ino  # stateless: see __init__
        # keep_cache: pages cached by an earlier open stay valid, the content cannot change
        # (and so do the pages _fill stored).
        return pyfuse3.FileInfo(fh=fh, keep_cache=True, direct_io=False)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        if self.metrics is None:
            return await self._read(fh, off, size)
        with self.metrics.read() as done:
            data = await self._read(fh, off, size)
            done(len(data))
        return data

    async def _read(self, fh: int, off: int, size: int) -> bytes:
        ino = fh  # the model inode (see open)
        # what the model holds verified (a chunk already hashed through an open descriptor,
        # a cached range, a small blob in memory) is served right here, one pread at most;
        # the rest on a worker thread: a first read decodes and hashes, and may wait on a
        # cold disk or a network, and 8 readers of 8 files must not queue behind each other
        cached = self._try_read(ino, off, size) if self._try_read is not None else None
        if cached is not None:
            data = cached
        else:
            data = await self._offload(
                self._read_limiter, f"read {ino} @{off}+{size}", self.fs.read, ino, off, size
            )
        if self.read_around is not None and len(data) == size:
            self.read_around.offer(self._swap(ino), ino, off, size)
        return data

    async def release(self, fh: int) -> None:
        # handles hold no state; the count only says when no read of the file can be in flight
        opened = self._open_count.pop(fh, 0)
        if opened > 1:
            self._open_count[fh] = opened - 1

    async def _fill(self, kernel_ino: int, ino: int, size: int) -> None:
        """Store a small file whole into the page cache before its first open returns.

        Per request, this process costs far more than a page copy, and one thread answers
        them all: a reader of many small files would otherwise wait on it for every read.
        The kernel keeps the pages a read waits for locked, and a store into them waits
        until that read is answered: so a store runs on the trio thread only at the first
        open of a file with no handle open (no read of it can be in flight), and never in
        a serving process that took over handles it did not open (``page_store`` unset).
        Bytes the model holds or can read without waiting (:meth:`_try_read`) are stored
        right here (a thread hop costs more than the store); the rest are read and stored
        by a worker, apart from the read workers (its store may wait for a read of the
        same file by a later open). Best effort: what fails is left to :meth:`read`,
        which reports it.
        """
        if self.page_store is None:
            return
        data = self._try_read(ino, 0, size) if self._try_read is not None else None
        try:
            if data is not None:
                self._store_whole(kernel_ino, ino, size, data)
            else:
                await trio.to_thread.run_sync(
                    self._fill_now,
                    kernel_ino,
                    ino,
                    size,
                    limiter=self._fill_limiter,
                    **{_ABANDON_KW: True},  # type: ignore[arg-type]  # keyword differs by trio version
                )
        except Exception as exc:
            log.debug("storing inode %d at its open: %s", ino, exc)

    def _fill_now(self, kernel_ino: int, ino: int, size: int) -> None:
        self._store_whole(kernel_ino, ino, size, self.fs.read(ino, 0, size))

    def _store_whole(self, kernel_ino: int, ino: int, size: int, data: bytes) -> None:
        store = self.page_store  # None once the mount is closing
        if store is not None and len(data) == size:
            store(kernel_ino, 0, memoryview(data))
            self._filled.put(ino, True)
            if self.metrics is not None:  # served, though not by a read request
                self.metrics.served(size)

    # ---- everything that would change the tree -----------------------------------------------

    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def setxattr(
        self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext
    ) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)


# ---- mounting --------------------------------------------------------------------------------


def tune_readahead(mountpoint: str, kb: int = READ_AHEAD_KB) -> bool:
    """Raise the kernel read-ahead of a mounted FUSE connection (best effort).

    The FUSE connection's backing-device entry is ``/sys/class/bdi/<major:minor>``; the
    device number comes from the mount table, so this never touches the mount itself (which
    would deadlock if called before the FUSE loop runs).
    """
    info = find_mount(mountpoint)
    if info is None:
        return False
    path = f"/sys/class/bdi/{info.device}/read_ahead_kb"
    try:
        with open(path, "w", encoding="ascii") as f:
            f.write(f"{kb}\n")
    except OSError as exc:
        log.debug("cannot raise read-ahead via %s: %s", path, exc)
        return False
    return True


_serving = threading.Lock()  # libfuse state in pyfuse3 is per process: one mount at a time


def _raise_priority() -> None:
    """Run the serving thread (and the threads it starts) at :data:`SERVE_NICE`, where the
    process may (root, ``CAP_SYS_NICE``); else leave it be.

    One thread answers the requests of every reader of the mount. At the same priority, the
    reader each reply wakes takes the CPU from it (it preempts the thread that woke it),
    and every other reader then waits until the daemon runs again: on 2 cores, a cold read
    of 5,000 small files by 8 threads took 2.0-2.25 s, 1.83-1.87 s at nice -5.
    """
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)  # (on Linux: this thread)
        if current > SERVE_NICE:
            os.setpriority(os.PRIO_PROCESS, 0, SERVE_NICE)
    except OSError as exc:  # EACCES/EPERM: an unprivileged mount stays as it is
        log.debug("serving at the default priority: %s", exc)


def _fuse_fd(takeover: Takeover | None) -> int | None:
    """The descriptor of this process's FUSE connection (after ``pyfuse3.init``), or None
    when it cannot be told apart."""
    if takeover is not None:
        return takeover.session_fd
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                found.append(int(name))
        except OSError:
            continue
    return found[0] if len(found) == 1 else None


class _FastReads:
    """Take FUSE requests that are already waiting without a pass through trio's scheduler.

    pyfuse3's request loop waits for every request with a trio lock and
    ``trio.lowlevel.wait_readable`` (two ``epoll_ctl``, an ``epoll_wait`` and a scheduler
    pass each), which costs about as much as answering a lookup from memory. While requests
    queue up (many readers), this waits only when ``poll`` has seen none for
    :data:`FAST_SPIN`, and at least every :data:`FAST_STREAK` requests, so tasks woken by
    worker threads still run. Installed
    in place of pyfuse3's private ``_wait_fuse_readable`` (same contract: True when the
    descriptor is readable, False when the loop should end); pyfuse3 calls
    ``fuse_session_receive_buf`` right after it returns, with no await in between, so no
    other task can take the request that ``poll`` saw.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.closing = False
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self._lock: trio.Lock | None = None
        self._streak = 0

    async def wait(self) -> bool:
        if self._streak < FAST_STREAK and self._poll.poll(0):
            self._streak += 1
            return True
        if self._streak < FAST_STREAK:
            # with many readers the next request is usually a few microseconds away:
            # polling for it (the lock is free during each poll) costs less than a sleep
            # in epoll and the wake-up (cold read of 20,000 small files, two A/B pairs:
            # 6.46/6.06 s against 8.03/6.32 s, the serving thread's CPU the same)
            deadline = time.perf_counter() + FAST_SPIN
            while time.perf_counter() < deadline:
                if self._poll.poll(0):
                    self._streak += 1
                    return True
        self._streak = 0
        if self._lock is None:
            self._lock = trio.Lock()
        try:
            async with self._lock:  # one waiter on the descriptor (trio allows no second)
                while not self.closing:
                    await trio.lowlevel.wait_readable(self.fd)
                    if self._poll.poll(0):  # (a fast taker may have emptied it meanwhile)
                        return True
        except trio.ClosedResourceError:
            pass
        return False

    def install(self) -> Callable[[], None]:
        """Put :meth:`wait` in pyfuse3's place; returns the undo."""
        previous = pyfuse3._wait_fuse_readable  # type: ignore[attr-defined]
        pyfuse3._wait_fuse_readable = self.wait  # type: ignore[attr-defined]

        def undo() -> None:
            pyfuse3._wait_fuse_readable = previous  # type: ignore[attr-defined]

        return undo


def _stop_signals() -> tuple[int, ...]:
    """The signals that end serving cleanly (unmount, or leave it to the supervisor) rather
    than kill the process: SIGTERM, SIGINT and, unless ignored (``nohup``), SIGHUP (a closed
    terminal killed a foreground mount outright, and a hangup a serving process, leaving a
    dead mount or a private cache directory behind)."""
    hup = () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGTERM, signal.SIGINT, *hup)


class _Loop:
    """The trio side of :func:`serve`: FUSE main loop, signals, readiness, shutdown."""

    def __init__(
        self, mountpoint: str, ready: Callable[[], None] | None, signals: bool, grace: float
    ) -> None:
        self.mountpoint = mountpoint
        self.ready = ready
        self.signals = signals
        self.grace = grace
        self.error: BaseException | None = None
        self.early_signals: list[int] = []  # arrived while trio was not listening
        self._stopping = False
        self.follower: Follower | None = None  # started once the mount serves
        self.fast: _FastReads | None = None  # takes waiting requests without trio's scheduler
        self.stop_signals = _stop_signals()

    def note_signal(self, signum: int, frame: object) -> None:
        """Signal handler for the moments around the trio loop: remember, do not die."""
        self.early_signals.append(signum)

    def stop(self, nursery: trio.Nursery) -> None:
        """Ask the FUSE loop to finish; abandon in-flight requests after a grace period."""
        if self._stopping:
            return
        self._stopping = True
        if self.fast is not None:
            self.fast.closing = True
        pyfuse3.terminate()
        nursery.start_soon(self._deadline, nursery)

    async def _deadline(self, nursery: trio.Nursery) -> None:
        await trio.sleep(self.grace)
        log.warning("requests still running %g s after shutdown; abandoning them", self.grace)
        nursery.cancel_scope.cancel()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._fuse_main, nursery)
            if self.signals:
                await nursery.start(self._watch_signals, nursery)
            if self.early_signals:
                log.info("signal received while mounting: unmounting %s", self.mountpoint)
                self.stop(nursery)
                return
            nursery.start_soon(self._after_mount, nursery)

    async def _fuse_main(self, nursery: trio.Nursery) -> None:
        try:
            await pyfuse3.main()
        except Exception as exc:
            log.error("FUSE main loop failed", exc_info=exc)
            self.error = exc
        finally:
            # The loop ends when the kernel unmounts us or after stop(): end the helpers too.
            nursery.cancel_scope.cancel()

    async def _watch_signals(
        self, nursery: trio.Nursery, *, task_status: Any = trio.TASK_STATUS_IGNORED
    ) -> None:
        with trio.open_signal_receiver(*self.stop_signals) as signals:
            task_status.started()
            async for signum in signals:
                log.info("signal %d received: unmounting %s", signum, self.mountpoint)
                self.stop(nursery)

    async def _after_mount(self, nursery: trio.Nursery) -> None:
        # Worker threads, not the trio thread: ready() may well stat the mount, which needs
        # the FUSE loop running here to answer.
        await trio.to_thread.run_sync(tune_readahead, self.mountpoint)
        if self.follower is not None:
            self.follower.start()
        if self.ready is None:
            return
        try:
            await trio.to_thread.run_sync(self.ready)
        except Exception as exc:
            log.error("ready() callback failed; unmounting", exc_info=exc)
            self.error = exc
            self.stop(nursery)


def serve(
    fs: ReadOnlyFS,
    mountpoint: str,
    *,
    fsname: str = "gitxet",
    options: Iterable[str] = (),
    ready: Callable[[], None] | None = None,
    allow_other: bool = False,
    uid: int | None = None,
    gid: int | None = None,
    shutdown_grace: float = SHUTDOWN_GRACE,
    read_around: bool = True,
    metrics: MountMetrics | None = None,
    takeover: Takeover | None = None,
    follower: Follower | None = None,
) -> None:
    """Mount ``fs`` read-only at ``mountpoint`` and serve it until it is unmounted.

    With ``follower`` (``fs`` is its :class:`~gitxet.mount.follow.FollowingFS`) the branch is
    polled once the mount serves, and each switch drops the kernel's cached root entries.

    With ``takeover`` (a supervisor started this process, ``gitxet.mount.supervisor``) the
    mount already exists: its connection is served, and SIGTERM ends this process without
    unmounting (the supervisor starts the next serving process).

    Returns after an external unmount (``fusermount3 -u``) or, when called from the main
    thread, after SIGTERM / SIGINT / SIGHUP, which unmount cleanly: requests still running
    ``shutdown_grace`` seconds later are abandoned (their callers get ENOTCONN). ``ready()``
    is called once, in a worker thread, when the mount is live. ``read_around`` turns on
    chunk read-around (``gitxet.mount.readaround``) and stores of small files at their first
    open (``XetFuseOperations._fill``); ``metrics`` counts reads and errors
    (``gitxet.mount.metrics``). Raises :class:`MountError` when the
    mount cannot be made, and re-raises what ``ready()`` raised after unmounting.
    """
    mnt = normalize_mountpoint(mountpoint)
    # (a stat of a taken-over mountpoint would wait for this very process to answer it)
    if takeover is None and not os.path.isdir(mnt):
        raise MountError(mnt, "mountpoint is not a directory")
    opts = mount_options(fsname, options, allow_other=allow_other)
    ops = XetFuseOperations(fs, uid=uid, gid=gid, read_around=read_around, metrics=metrics)
    if takeover is not None:
        ops.on_init = takeover.on_init
    if not _serving.acquire(blocking=False):
        raise MountError(mnt, "this process already serves a FUSE mount")
    main_thread = threading.current_thread() is threading.main_thread()
    loop = _Loop(mnt, ready, main_thread, shutdown_grace)
    if follower is not None:
        loop.follower = follower

        def switched(prev: CommitFS, cur: CommitFS) -> None:
            names = {n for n, _ in prev.readdir(prev.root_ino)}
            names.update(n for n, _ in cur.readdir(cur.root_ino))
            ops.root_changed(sorted(names))
            if metrics is not None:
                metrics.serving(cur.commit)

        follower.on_switch = switched
    # Outside trio's own signal receiver (before the loop starts, and while unmounting after
    # it ends) SIGTERM must not kill us: that would leave a dead mount behind. Python-level
    # handlers only exist in the main thread.
    previous = (
        {s: signal.signal(s, loop.note_signal) for s in loop.stop_signals} if main_thread else {}
    )
    try:
        try:
            pyfuse3.init(ops, mnt if takeover is None else takeover.session_path, opts)
        except RuntimeError as exc:
            # libfuse has printed its reason on stderr (the daemon log).
            raise MountError(mnt, f"FUSE mount failed: {exc}") from exc
        if ops.read_around is not None:
            ops.read_around.start()
        if read_around and (takeover is None or not takeover.resend):
            ops.page_store = _notify_store  # (a successor serves handles it did not open)
        _raise_priority()
        fd = _fuse_fd(takeover) if hasattr(pyfuse3, "_wait_fuse_readable") else None
        loop.fast = _FastReads(fd) if fd is not None else None
        undo = loop.fast.install() if loop.fast is not None else None
        try:
            trio.run(loop.run)
        finally:
            if undo is not None:
                undo()
            ops.page_store = None  # no store may reach a closed session either
            if follower is not None:
                follower.stop()  # no invalidation may reach a closed session
            # The worker must be done with the session before close() frees it.
            if ops.read_around is not None and not ops.read_around.stop():
                log.warning("read-around worker still busy at unmount")
            # Unmounts if the loop ended for any reason but an external unmount (then the
            # kernel side is already gone and libfuse notices), and closes /dev/fuse, which
            # fails any request still waiting with ENOTCONN.
            pyfuse3.close(unmount=takeover is None)
        if loop.error is not None:
            raise loop.error
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _serving.release()
