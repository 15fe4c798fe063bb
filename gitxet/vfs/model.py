"""``CommitFS``: one git commit (or a directory inside it) as a read-only filesystem.

The model reads git with dulwich, straight from the object store (no process per call), and
turns the commit's tree into nodes lazily: a directory's tree object is parsed the first
time the directory is listed or looked up, and its children get nodes then. Blobs that are
gitxet pointers report the pointed-to size and are read through ``data.reconstruct``; every
other blob is served from git. The design notes are in ``docs/design/filesystem-model.md``.

Why these choices:

* Inode numbers are a hash of (commit, path), so two processes serving the same commit hand
  out the same numbers and NFS handles survive a server restart. An inode this instance has
  not handed out yet is found by expanding the whole tree once.
* Sizes must not cost a full read of a big blob: they come from the pack entry header (or
  the delta header) and the loose object header, which is what ``git cat-file -s`` does.
  Only blobs small enough to be pointers are read, because a pointer's real size is inside.
* Nothing holds a lock while reading data: caches are guarded by short critical sections and
  concurrent loads of the same thing are collapsed so the work is done once.
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import logging
import os
import stat
import struct
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import IO, NamedTuple, TypeVar

from gitxet.data.reconstruct import ChunkCache, ChunkSource, FileReader, read_whole_files
from gitxet.errors import (
    FormatError,
    GitError,
    IntegrityError,
    PointerFormatError,
)
from gitxet.formats.pointer import (
    MAX_POINTER_SIZE,
    POINTER_SIZES,
    Pointer,
    looks_like_pointer,
)
from gitxet.git.objects import (
    EMPTY_TREE,
    FILE_MODES,
    MODE_DIR,
    MODE_GITLINK,
    MODE_LINK,
    OBJ_BLOB,
    OBJ_TREE,
    GitObjects,
    Tree,
    TreeRecord,
    count_subtrees,
    parse_tree_columns,
)
from gitxet.git.paths import PATH_MAX
from gitxet.git.xetconfig import NEVER_POINTERS
from gitxet.hashing import from_hex
from gitxet.util.flights import Flights
from gitxet.util.lru import Lease, LeaseCache, LRUCache
from gitxet.util.nowait import nowait
from gitxet.vfs.nodes import Attrs, Columns, FSStats, NodeKind

__all__ = ["BROKEN_LINK_TARGET", "ROOT_INO", "CommitFS"]

log = logging.getLogger(__name__)

#: Inode number of the filesystem root (FUSE's own root number; see the design note).
ROOT_INO = 1
_INO_MASK = (1 << 63) - 1  # inode numbers are 63-bit: they stay positive as signed 64-bit
_INO_PERSON = b"gitxet.vfs.ino"  # blake2b personalisation: domain-separates the hash

_MAX_SPOOLS = 8  # big plain blobs kept in temporary files
_IDLE_BEFORE_STATS = 0.5  # seconds without a listing or a first read of a file before statfs
# is summed in the background (its walk would compete with them for the one interpreter)
_SIBLINGS_AHEAD = 32  # directories after a listed one offered to the prefetcher
_MAX_INFOS = 1 << 16  # blob sizes/pointers remembered (a node keeps its own attributes)
#: entries of a directory whose pointer files are described together at a first read from
#: a server that starts nowhere near the last batch (:meth:`CommitFS._describe_around`):
#: a scattered read pays for a few descriptions, not for its whole directory's
DESCRIBE_FIRST = 16
#: most entries of one batch: the batch doubles, up to this, while the first reads go on
#: right after it (a scan of the directory, or of small directories one after the other)
DESCRIBE_WINDOW = 1000
#: most directories listed for one such batch (small directories after the one read)
DESCRIBE_DIRS = 64
#: seconds a first read waits for the batch describing its file (then reads on its own)
_DESCRIBE_WAIT = 60.0
#: batches remembered per directory (a first read in one of them asks nothing)
_SCANS_KEPT = 16

#: a small file's first read from a local store reads the next files after it with it (their
#: chunks sit next to each other when they were added together): files of at most this
#: many bytes, this many in one batch, kept ready (until read once) up to this many bytes
AHEAD_FILE_MAX = 1 << 20
AHEAD_BATCH = 16
AHEAD_BYTES = 16 << 20

#: What a symlink whose target no system accepts (empty, or ``PATH_MAX`` bytes or more)
#: points to instead: a path through ``/dev/null``, which never resolves.
BROKEN_LINK_TARGET = b"/dev/null/gitxet-unusable-symlink-target"

T = TypeVar("T")


# ---- nodes ----------------------------------------------------------------------------------


_DIR_MODES = (MODE_DIR, MODE_GITLINK)


_KINDS: dict[int, NodeKind] = {
    **dict.fromkeys(FILE_MODES, NodeKind.FILE),
    **dict.fromkeys(_DIR_MODES, NodeKind.DIR),
    MODE_LINK: NodeKind.SYMLINK,
}
#: a file's st_mode by its git mode (read-only; executable as git says)
_FILE_PERMS = {m: stat.S_IFREG | (0o555 if m & 0o100 else 0o444) for m in FILE_MODES}
#: a node's st_mode by its git mode
_ST_MODES = {
    **_FILE_PERMS,
    **dict.fromkeys(_DIR_MODES, stat.S_IFDIR | 0o555),
    MODE_LINK: stat.S_IFLNK | 0o777,
}
#: the kind of a tree entry's mode (None: a mode the model does not serve); a listing asks
#: this of every entry
_kind_of = _KINDS.get


# ---- caches --------------------------------------------------------------------------------


class _Prefetcher:
    """Background threads listing directories a walk will reach next, most recently
    offered first (a depth-first walk goes into the directory it just listed); bounded."""

    def __init__(self, work: Callable[[_Dir], None], limit: int = 512, threads: int = 2) -> None:
        self._work = work
        self._limit = limit
        self._threads = threads  # two: one parses while the other waits on git
        self._todo: deque[_Dir] = deque()
        self._queued: set[int] = set()  # inode numbers in _todo (each is queued once)
        self._cond = threading.Condition()
        self._started = 0
        self._closed = False

    def offer(self, nodes: list[_Dir]) -> None:
        if not nodes:
            return
        with self._cond:
            if self._closed:
                return
            fresh = [n for n in nodes if n.ino not in self._queued]
            self._queued.update(n.ino for n in fresh)
            self._todo.extendleft(reversed(fresh))  # the first child comes out first
            while len(self._todo) > self._limit:
                self._queued.discard(self._todo.pop().ino)
            # as many threads as there is work for (a flat tree is offered once, at the root)
            while self._started < min(self._threads, len(self._todo)):
                self._started += 1
                threading.Thread(target=self._run, name="gitxet-prefetch", daemon=True).start()
            self._cond.notify(len(nodes))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._todo and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                node = self._todo.popleft()
                self._queued.discard(node.ino)
            try:
                self._work(node)
            except Exception as exc:  # a closed repository, ...: prefetch is only a hint
                log.debug("prefetch of %s: %s", node.shown, exc)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._todo.clear()
            self._cond.notify_all()


class _Spool:
    """A big plain blob in an unlinked temporary file (a :class:`LeaseCache` closes it)."""

    def __init__(self, data: bytes) -> None:
        # kept open past this call on purpose: the spool cache closes it
        self._file: IO[bytes] = tempfile.TemporaryFile(prefix="gitxet-blob-")  # noqa: SIM115
        try:
            self._file.write(data)
            self._file.flush()
        except BaseException:
            self._file.close()
            raise

    def pread(self, offset: int, size: int) -> bytes:
        """Read (while holding a lease on the spool)."""
        return os.pread(self._file.fileno(), size, offset)

    def close(self) -> None:
        self._file.close()


class _BlobCache:
    """Plain blob bytes: small ones in memory (byte-bounded LRU), big ones spooled to disk
    (at most :data:`_MAX_SPOOLS` files, each closed once evicted and no longer read)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.spool_over = max(max_bytes // 8, 1)
        self._mem: LRUCache[bytes, bytes] = LRUCache(max_bytes, weigher=len)
        self._spools: LeaseCache[bytes, _Spool] = LeaseCache(_MAX_SPOOLS, _Spool.close)
        self._closed = False

    def peek_bytes(self, sha: bytes) -> bytes | None:
        """A small blob held in memory, or None (never a spool: no file is touched)."""
        return self._mem.get(sha)

    def get(self, sha: bytes) -> bytes | Lease[_Spool] | None:
        """Cached bytes, or a lease on a spool (release it), or None."""
        data = self._mem.get(sha)
        if data is not None:
            return data
        return self._spools.get(sha)

    def put(self, sha: bytes, data: bytes) -> None:
        if self._closed:
            return
        if len(data) > self.spool_over:
            self._spools.add(sha, _Spool(data)).release()
        elif sha not in self._mem:
            self._mem.put(sha, data)

    def close(self) -> None:
        self._closed = True
        self._spools.close()
        self._mem.clear()


# ---- nodes ---------------------------------------------------------------------------------


#: files git reads itself (``.gitignore``...): their blob is their content even when its text
#: is a pointer (a hostile ``.git* filter=xet``), as a checkout writes them
_NEVER = frozenset(os.fsencode(n) for n in NEVER_POINTERS)


class _BlobInfo(NamedTuple):
    """What a file blob is: its reported size and, for a pointer, the pointer."""

    size: int
    pointer: Pointer | None


class _Node:
    """One file or symlink of the commit, kept small: a commit may have millions.

    ``size`` is the reported size once known (-1 before); for a directory, its link count.
    """

    __slots__ = ("ino", "kind", "mode", "name", "parent", "sha", "size")

    def __init__(
        self, ino: int, parent: _Dir | None, name: bytes, mode: int, sha: bytes, kind: NodeKind
    ) -> None:
        self.ino = ino
        self.parent: _Dir = parent if parent is not None else self  # type: ignore[assignment]
        self.name = name
        self.mode = mode
        self.sha = sha
        self.kind = kind
        self.size = -1

    @property
    def path(self) -> bytes:
        """From the repository root, so inode numbers ignore ``subdir``."""
        up = self.parent.path
        return up + b"/" + self.name if up else self.name

    @property
    def shown(self) -> str:
        """The path for messages."""
        return "/" + self.path.decode("utf-8", errors="replace")


class _Scan:
    """The entries ``lo`` to ``hi`` of a directory described in one batch (``ready`` once
    asked; ``size``: the batch's size, which a scan continuing right after it doubles)."""

    __slots__ = ("hi", "lo", "ready", "size")

    def __init__(
        self,
        lo: int,
        hi: int,
        size: int,
        *,
        ready: threading.Event | None = None,
        done: bool = False,
    ) -> None:
        self.lo = lo
        self.hi = hi
        self.size = size
        self.ready = ready if ready is not None else threading.Event()
        if done:
            self.ready.set()


class _Dir(_Node):
    """A directory: its children live in ``names`` and ``order`` (sorted by name, so a
    lookup is a bisection, no dict) once listed; ``entries`` holds its parsed tree until
    then."""

    __slots__ = ("_path", "entries", "listed", "names", "order")

    def __init__(
        self, ino: int, parent: _Dir | None, name: bytes, mode: int, sha: bytes, path: bytes
    ) -> None:
        super().__init__(ino, parent, name, mode, sha, NodeKind.DIR)
        self._path = path
        self.entries: Tree | None = EMPTY_TREE if mode == MODE_GITLINK else None
        self.names: list[bytes] | None = None
        self.order: list[_Node] = []
        self.listed = False  # children, their sizes and link counts all known

    @property
    def path(self) -> bytes:
        return self._path


def inode_number(commit_hex: str, path: bytes) -> int:
    """The inode number of ``path`` (from the repository root) in a commit, before probing."""
    return inode_numbers(commit_hex, [path])[0]


def inode_numbers(commit_hex: str, paths: list[bytes]) -> list[int]:
    """:func:`inode_number` of many paths (the hash state of the commit is made once; the
    digests become numbers in one ``struct.unpack``)."""
    copy = hashlib.blake2b(
        commit_hex.encode("ascii") + b"\0", digest_size=8, person=_INO_PERSON
    ).copy
    digests = []
    for path in paths:
        h = copy()
        h.update(path)
        digests.append(h.digest())
    out = [n & _INO_MASK for n in struct.unpack(f">{len(digests)}Q", b"".join(digests))]
    if out and min(out) <= ROOT_INO:  # (0 and 1 are not inode numbers: 2**-62 a path)
        out = [ino if ino > ROOT_INO else ino + 2 for ino in out]
    return out


def _by_name(node: _Node) -> bytes:
    return node.name


def _join(parent: str, name: bytes) -> str:
    shown = name.decode("utf-8", errors="replace")
    return f"/{shown}" if parent == "/" else f"{parent}/{shown}"


def _path_among(nodes: list[_Node]) -> Callable[[bytes], str]:
    """The path of the first of ``nodes`` holding a blob, looked up only when asked."""

    def path_of(sha: bytes) -> str:
        return next((n.shown for n in nodes if n.sha == sha), "?")

    return path_of


def _path_in(parent: str, entries: list[TreeRecord]) -> Callable[[bytes], str]:
    """The path of the first of a tree's ``entries`` holding a blob, built only when asked."""

    def path_of(sha: bytes) -> str:
        return next((_join(parent, e.name) for e in entries if e.sha == sha), parent)

    return path_of


# ---- the filesystem ------------------------------------------------------------------------


class CommitFS:
    """A commit's tree, or the directory ``subdir`` inside it, as a read-only filesystem.

    Implements :class:`gitxet.vfs.nodes.ReadOnlyFS`; thread-safe. Call :meth:`close` (or use
    it as a context manager) to release the repository's files.

    Args:
        repo_path: a repository, bare or not (anything ``dulwich.repo.Repo`` opens).
        commit: a full commit id in hex (an annotated tag's id is peeled to its commit).
        source: where pointer files' chunks come from.
        subdir: a directory of the commit to serve as the root (``/``-separated).
        cache: decoded-chunk cache shared by all pointer files (a 64 MiB one if omitted).
        readers: how many open pointer-file readers to keep (LRU).
        blob_cache_bytes: memory for plain blobs; blobs over 1/8 of it go to temporary files.

    Raises:
        GitError: not a repository, or ``commit`` is not a commit.
        GitObjectNotFoundError: the commit is not in the repository.
        FileNotFoundError: ``subdir`` is not in the commit.
        NotADirectoryError: ``subdir`` names a file.
        ValueError: malformed ``commit``/``subdir`` or a non-positive ``readers``.
    """

    def __init__(
        self,
        repo_path: str,
        commit: bytes | str,
        source: ChunkSource,
        *,
        subdir: bytes = b"",
        cache: ChunkCache | None = None,
        readers: int = 256,
        blob_cache_bytes: int = 64 << 20,
    ) -> None:
        text = commit.decode("ascii", errors="replace") if isinstance(commit, bytes) else commit
        if len(text) not in (40, 64) or text.strip("0123456789abcdef"):
            raise ValueError(f"commit must be a full lowercase hex object id, got {text[:80]!r}")
        if readers < 1 or blob_cache_bytes < 1:
            raise ValueError("readers and blob_cache_bytes must be positive")
        parts = [p for p in subdir.split(b"/") if p]
        if any(p in (b".", b"..") for p in parts):
            raise ValueError(f"subdir must not contain '.' or '..': {subdir!r}")
        self._commit_hex = text
        self._source = source
        #: True when every read only touches local disk and memory (no network): adapters
        #: may then serve reads on their event-loop thread instead of paying a thread hop.
        self.inline_reads = bool(getattr(source, "is_local", False))
        self._cache = cache if cache is not None else ChunkCache()
        self._lock = threading.Lock()  # guards the dicts below; never held during I/O
        self._flights = Flights()
        self._blobs = _BlobCache(blob_cache_bytes)
        self._readers: LRUCache[str, FileReader] = LRUCache(readers)  # by Xet hash (hex)
        # the last batch of each directory's pointer files described (or being described)
        self._scans: LRUCache[int, list[_Scan]] = LRUCache(4096)
        self._infos: LRUCache[bytes, _BlobInfo] = LRUCache(_MAX_INFOS)
        self._warned: LRUCache[bytes, bool] = LRUCache(4096)  # bad pointers, logged once
        self._hidden: LRUCache[str, bool] = LRUCache(4096)  # paths left out, logged once
        self._nodes: dict[int, _Node] = {}
        self._expanded_all = False
        self._stats: FSStats | None = None
        self._stats_started = False
        self._busy_at = 0.0  # when a listing or a file's first read last ran (statfs waits)
        self._git = GitObjects(repo_path)
        self._prefetcher = _Prefetcher(self._prefetch_one)
        #: whole small files read with an earlier one's batch, until their first read
        self._ready: LRUCache[int, bytes] = LRUCache(AHEAD_BYTES, weigher=len)
        try:
            tree, seconds = self._git.commit(text.encode("ascii"))
            self.mtime_ns = seconds * 1_000_000_000
            self._root = self._find_root(tree, parts)
        except BaseException:
            self.close()
            raise

    def _find_root(self, tree: bytes, parts: list[bytes]) -> _Dir:
        node = _Dir(ROOT_INO, None, b"", MODE_DIR, tree, b"")
        for part in parts:
            entry = next((e for e in self._entries(node).records() if e.name == part), None)
            path = node.path + b"/" + part if node.path else part
            where = f"{path.decode('utf-8', errors='replace')!r} in commit {self._commit_hex}"
            if entry is None:
                raise FileNotFoundError(errno.ENOENT, f"no directory {where}")
            if _kind_of(entry.mode) is not NodeKind.DIR:
                raise NotADirectoryError(errno.ENOTDIR, f"not a directory: {where}")
            node = _Dir(ROOT_INO, None, part, entry.mode, entry.sha, path)
        self._nodes[ROOT_INO] = node
        self._entries(node)  # a broken root tree fails here, not at the first listing
        return node

    # ---- ReadOnlyFS ------------------------------------------------------------------------

    @property
    def root_ino(self) -> int:
        return ROOT_INO

    @property
    def commit(self) -> str:
        """The commit served, in hex."""
        return self._commit_hex

    def knows(self, ino: int, *, search: bool = False) -> bool:
        """Whether ``ino`` is a node of this commit: handed out already (memory only), or,
        with ``search``, found by expanding the whole tree once (see :meth:`_node`)."""
        with self._lock:
            if ino in self._nodes:
                return True
        if not search:
            return False
        try:
            self._node(ino)
        except FileNotFoundError:
            return False
        return True

    def getattr(self, ino: int) -> Attrs:
        """Attributes of a known inode (memory only once the node was handed out)."""
        return self._attrs(self._node(ino))

    def lookup(self, parent_ino: int, name: bytes) -> Attrs:
        """The child ``name`` of a directory, or the directory itself / its parent."""
        node = self._dir(parent_ino)
        if name == b".":
            return self._attrs(node)
        if name == b"..":
            return self._attrs(node.parent)
        child = self._child(node, name)
        if child is None:
            raise FileNotFoundError(errno.ENOENT, f"{_join(node.shown, name)}: no such file")
        return self._attrs(child)

    def lookup_nowait(self, parent_ino: int, name: bytes) -> Attrs | None:
        """:meth:`lookup` from memory alone (a listed directory, a child whose attributes
        are known), or ``None`` when it would read git: cheap enough for an event loop.

        Raises:
            FileNotFoundError: the directory is listed and has no ``name``.
        """
        with self._lock:
            node = self._nodes.get(parent_ino)
        if not isinstance(node, _Dir) or node.names is None or name in (b".", b".."):
            return None
        names = node.names
        i = bisect.bisect_left(names, name)
        if i >= len(names) or names[i] != name:
            raise FileNotFoundError(errno.ENOENT, f"{_join(node.shown, name)}: no such file")
        child = node.order[i]
        if child.size < 0:
            return None
        return self._attrs(child)

    def parent(self, ino: int) -> int:
        """Inode of the directory holding ``ino``; the root is its own parent."""
        return self._node(ino).parent.ino

    def readdir(self, ino: int) -> list[tuple[bytes, Attrs]]:
        """Children of a directory sorted by name (bytes order), without ``.`` and ``..``."""
        node = self._listed(ino)
        # most entries are sized files: their attributes built inline, not through _attrs
        attrs, file, mtime = self._attrs, NodeKind.FILE, self.mtime_ns
        return [
            (c.name, Attrs(c.ino, file, _FILE_PERMS[c.mode], c.size, 1, mtime))
            if c.kind is file and c.size >= 0
            else (c.name, attrs(c))
            for c in node.order
        ]

    def readdir_columns(self, ino: int) -> Columns:
        """:meth:`readdir` as columns (no object per entry: a FUSE listing's form)."""
        node = self._listed(ino)
        order = node.order
        for c in order:
            if c.size < 0:
                self._attrs(c)  # (what the batches could not size, one by one)
        assert node.names is not None
        dirs = [c.kind is NodeKind.DIR for c in order]
        return Columns(
            node.names,
            [c.ino for c in order],
            [_ST_MODES[c.mode] for c in order],
            [0 if d else c.size for c, d in zip(order, dirs, strict=True)],
            [c.size if d else 1 for c, d in zip(order, dirs, strict=True)],
            [self.mtime_ns] * len(order),
        )

    def _listed(self, ino: int) -> _Dir:
        """A directory, listed (children and their attributes known) and its
        subdirectories offered to the prefetcher."""
        node = self._dir(ino)
        self._busy_at = time.monotonic()
        if not node.listed:
            self._flights.run(("list", node.ino), lambda: self._list(node))
        # what a depth-first walk reaches next: this directory's subdirectories, then the
        # siblings after it (offered again and again as the walk goes: the prefetcher
        # keeps only its last offers)
        ahead = [c for c in node.order if isinstance(c, _Dir) and not c.listed]
        up = node.parent
        if up is not node and up.names is not None:
            i = bisect.bisect_right(up.names, node.name)
            ahead += [
                c for c in up.order[i : i + _SIBLINGS_AHEAD] if isinstance(c, _Dir) and not c.listed
            ]
        self._prefetcher.offer(ahead)
        return node

    def _list(self, node: _Dir) -> None:
        """A directory's children and the sizes of its files and link counts of its
        subdirectories (what a listing shows)."""
        self._children(node)
        if any(c.size < 0 and c.kind is not NodeKind.DIR for c in node.order):
            self._fill_attrs(node)
        subdirs = [c for c in node.order if isinstance(c, _Dir) and c.size < 0]
        for i in range(0, len(subdirs), 256):  # batches of trees in memory at once
            part = subdirs[i : i + 256]
            try:
                raws = self._git.trees([c.sha for c in part])
            except GitError:
                return  # _attrs parses them one by one (and reports what is broken)
            for c, raw in zip(part, raws, strict=True):
                if raw is not None:
                    c.size = 2 + count_subtrees(raw, len(c.sha))
        node.listed = True

    def _prefetch_one(self, node: _Dir) -> None:
        """Prefetch: list a directory a walk is about to reach (``find`` lists each
        subdirectory right after its parent), overlapping that work with the walk."""
        if not node.listed:
            try:
                self._flights.run(("list", node.ino), lambda: self._list(node))
            except OSError:
                pass  # logged; the listing itself reports it again

    def _fill_attrs(self, node: _Dir) -> None:
        """Attributes of a directory's files and symlinks in one batch (a listing asks for
        all of them: READDIRPLUS, ``ls -l``, ``find``): their sizes, and the bytes of those
        that may be pointers, come from one pipelined ``git cat-file`` exchange instead of
        one object read each. Anything the batch cannot answer is left to :meth:`_attrs`,
        which reads it alone (and reports it)."""
        blobs = [c for c in node.order if c.size < 0 and c.kind is not NodeKind.DIR]
        sizes, _ = self._batch_infos([c.sha for c in blobs], node.shown, _path_among(blobs))
        get, file = sizes.get, NodeKind.FILE
        for c in blobs:
            size = get(c.sha, -1)
            # (a symlink too long or empty: _attrs says it is broken; a file git reads
            # itself is sized as its blob there)
            if size >= 0 and (c.kind is file or 0 < size < PATH_MAX) and c.name not in _NEVER:
                c.size = size

    def _batch_infos(
        self, shas: list[bytes], shown: str, path_of: Callable[[bytes], str]
    ) -> tuple[dict[bytes, int], dict[bytes, Pointer]]:
        """The reported sizes of blobs, and the pointers among them, from one pipelined
        ``git cat-file`` exchange; blobs it cannot answer have size -1 or are left out (the
        caller sizes them one by one, and reports them). A listing asks this of every file:
        no object per blob but for pointers. ``shown`` names the directory, ``path_of`` a
        blob's file (asked only to report a broken pointer: no name is built per entry)."""
        unique = list(dict.fromkeys(shas))
        if not unique:
            return {}, {}
        try:
            # (only blobs of a pointer's possible sizes are read)
            found, small = self._git.describe(unique, (POINTER_SIZES[0], POINTER_SIZES[-1]))
        except GitError as exc:  # no git binary, a broken store: one by one then
            log.debug("%s: batch sizing failed (%s); sizing one by one", shown, exc)
            return {}, {}
        sizes = dict(zip(unique, found, strict=True))  # (-1: not answered)
        pointers: dict[bytes, Pointer] = {}
        for i, data in small.items():
            if not looks_like_pointer(data):
                continue
            sha = unique[i]
            pointer = self._parse_pointer(sha, data, path_of)
            if pointer is not None:  # a read of the file needs it soon
                pointers[sha] = pointer
                sizes[sha] = pointer.size
                self._infos.put(sha, _BlobInfo(pointer.size, pointer))
        return sizes, pointers

    def readlink(self, ino: int) -> bytes:
        """Target of a symlink: the blob's content, or :data:`BROKEN_LINK_TARGET` when no
        system would accept it (empty, or ``PATH_MAX`` bytes or more: never read whole)."""
        node = self._node(ino)
        if node.kind is not NodeKind.SYMLINK:
            raise OSError(errno.EINVAL, f"{node.shown}: not a symlink")
        if self._link_size(node.sha, node.shown) is None:
            return BROKEN_LINK_TARGET
        cached = self._blobs.get(node.sha)
        if isinstance(cached, bytes):
            return cached
        if cached is not None:  # cannot happen below PATH_MAX bytes, but never leak a user
            cached.release()
        data = self._git_op(node.shown, "read link", lambda: self._git.raw(node.sha, OBJ_BLOB))
        if not 0 < len(data) < PATH_MAX:  # the header lied: the object store is damaged
            bad = FormatError(f"blob {node.sha.hex()}", f"{len(data)} bytes, not as its header")
            raise self._eio(node.shown, "inconsistent object", bad) from bad
        self._blobs.put(node.sha, data)
        return data

    def _link_size(self, sha: bytes, shown: str) -> int | None:
        """A symlink target's length from the object header, or None when it is unusable."""
        size = self._git_op(shown, "size link", lambda: self._git.size(sha))
        if 0 < size < PATH_MAX:
            return size
        with self._lock:
            first = shown not in self._hidden
            self._hidden.put(shown, True)
        if first:
            log.warning(
                "commit %s: %r: symlink target of %d bytes shown as a broken link",
                self._commit_hex,
                shown,
                size,
            )
        return None

    def read(self, ino: int, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset``; ``b""`` at or past the end.

        A pointer file whose data cannot be fetched or verified raises ``OSError(EIO)``
        (logged with the path and the cause); wrong bytes are never returned.
        """
        node = self._node(ino)
        kind = node.kind
        if kind is NodeKind.DIR:
            raise IsADirectoryError(errno.EISDIR, f"{node.shown}: is a directory")
        if kind is NodeKind.SYMLINK:
            raise OSError(errno.EINVAL, f"{node.shown}: is a symlink")
        if offset < 0 or size < 0:
            raise OSError(errno.EINVAL, f"{node.shown}: negative offset or size")
        info = self._file_info(node)
        if size == 0 or offset >= info.size:
            return b""
        if info.pointer is not None:
            return self._read_pointer(node, info.pointer, offset, size)
        return self._read_plain(node, info.size, offset, size)

    def try_read(self, ino: int, offset: int, size: int) -> bytes | None:
        """:meth:`read` of a pointer file's bytes the data source holds verified in its
        cache (one ``pread``), or ``None`` when serving them could wait on a network (or
        needs :meth:`read`'s checks and error reporting): the caller then calls
        :meth:`read` where blocking is fine. Cheap enough for an event loop."""
        node = self._nodes.get(ino)
        if node is None or node.kind is not NodeKind.FILE or offset < 0 or size <= 0:
            return None
        if node.name in _NEVER:
            return None  # read() serves its blob
        if offset == 0 and self._ready:
            ready = self._ready.pop(ino)
            if ready is not None:  # read and verified with an earlier file's batch
                return ready if size >= len(ready) else ready[:size]
        with self._lock:
            info = self._infos.get(node.sha)
        if info is not None and info.pointer is None:  # a plain blob: if it is in memory
            cached = self._blobs.peek_bytes(node.sha)
            return cached[offset : offset + size] if cached is not None else None
        if info is None or info.pointer is None or offset >= info.size:
            return None
        with self._lock:
            reader = self._readers.get(info.pointer.xet_hash)
        if reader is not None and reader.size == info.pointer.size:
            try:
                got = reader.read_cached(offset, size)
            except Exception:
                return None  # read() reports it
            if got is not None or not self.inline_reads:
                return got
        if not self.inline_reads:
            return None
        # A local store: read it here as long as nothing waits on the disk (the page cache
        # holds it), else give up and let read() do it on a thread that may wait
        try:
            with nowait():
                if reader is None:
                    self._busy_at = time.monotonic()  # a reader of files: statfs waits
                    self._describe_around(node)  # its neighbours' descriptions, in one batch
                    if offset == 0 and size >= info.size and info.size <= AHEAD_FILE_MAX:
                        whole = self._read_batch(node)
                        if whole is not None:
                            return whole
                    reader = FileReader(
                        self._source, from_hex(info.pointer.xet_hash), cache=self._cache
                    )
                    self._readers.put(info.pointer.xet_hash, reader)
                if reader.size != info.pointer.size:
                    return None
                return reader.read(offset, size)
        except Exception:
            return None  # WouldBlockError; anything else read() reports

    def pointer(self, ino: int) -> Pointer | None:
        """The pointer a regular file is stored as; None for a plain git blob (and for
        anything that is not a regular file)."""
        node = self._node(ino)
        if node.kind is not NodeKind.FILE:
            return None
        return self._file_info(node).pointer

    def chunk_extent(self, ino: int, offset: int) -> tuple[int, int] | None:
        """The byte range of the stored chunk holding ``offset`` of a pointer file.

        ``None`` for plain blobs, offsets past the end and anything that is not a file, and
        when the file's data cannot be opened: this is a hint for read-around (a whole chunk
        is decoded and verified anyway), never needed for correctness.
        """
        node = self._node(ino)
        if node.kind is not NodeKind.FILE:
            return None
        info = self._file_info(node)
        if info.pointer is None or not 0 <= offset < info.size:
            return None
        try:
            return self._reader(info.pointer).chunk_extent(offset)
        except Exception:
            return None

    def statfs(self) -> FSStats:
        """Sum of the reported sizes of the tree's files and symlinks, and its node count.

        Computed once, on the first call, by walking every tree object (each distinct tree
        once) and sizing every blob; pointer-sized blobs are read for that.
        """
        stats = self._stats
        if stats is None:
            total, count = self._flights.run("statfs", self._walk_totals)
            stats = self._stats = FSStats(total_bytes=total, files=count)
        return stats

    def statfs_nowait(self) -> FSStats:
        """:meth:`statfs` if it is known, else provisional zeros at once while a background
        thread computes it: ``find`` and NFS clients ask for it first thing, and summing a
        million-file commit must not stand in their way."""
        stats = self._stats
        if stats is not None:
            return stats
        with self._lock:
            start = not self._stats_started
            self._stats_started = True
        if start:
            threading.Thread(target=self._stats_in_background, daemon=True).start()
        return FSStats(total_bytes=0, files=0)

    def _stats_in_background(self) -> None:
        def pace() -> None:  # give way while the tree is being listed
            while time.monotonic() - self._busy_at < _IDLE_BEFORE_STATS:
                time.sleep(_IDLE_BEFORE_STATS)

        try:
            total, count = self._flights.run("statfs", lambda: self._walk_totals(pace))
            self._stats = FSStats(total_bytes=total, files=count)
        except Exception as exc:  # logged where it happened; the figures stay provisional
            log.debug("statfs in the background: %s", exc)

    # ---- extras ----------------------------------------------------------------------------

    def resolve_path(self, path: bytes) -> Attrs:
        """Attributes of ``path`` relative to the root (``/``-separated; ``.``/``..`` allowed).

        Symlinks are not followed. Raises ``FileNotFoundError`` or ``NotADirectoryError``.
        """
        node: _Node = self._root
        for part in path.split(b"/"):
            if part and part != b".":
                node = self._node(self.lookup(node.ino, part).ino)
        return self._attrs(node)

    def close(self) -> None:
        """Release the repository's files and the temporary files of big plain blobs."""
        self._prefetcher.close()
        self._ready.clear()
        self._git.close()
        self._blobs.close()
        self._readers.clear()

    def __enter__(self) -> CommitFS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- nodes -----------------------------------------------------------------------------

    def _node(self, ino: int) -> _Node:
        with self._lock:
            node = self._nodes.get(ino)
        if node is not None:
            return node
        if not self._expanded_all and ROOT_INO < ino <= _INO_MASK:
            # A number we never handed out: a client holding a handle from an earlier server
            # for this commit. Numbers are a function of the path, so expanding every
            # directory once finds it (or proves it stale).
            self._flights.run("expand-all", self._expand_all)
            with self._lock:
                node = self._nodes.get(ino)
            if node is not None:
                return node
        raise FileNotFoundError(errno.ENOENT, f"stale inode {ino}")

    def _expand_all(self) -> None:
        stack = [self._root]
        while stack:
            node = stack.pop()
            try:
                kids = self._children(node)
            except OSError:  # a broken tree (logged): its paths cannot be found anyway
                continue
            stack.extend(c for c in kids if isinstance(c, _Dir))
        self._expanded_all = True

    def _dir(self, ino: int) -> _Dir:
        node = self._node(ino)
        if not isinstance(node, _Dir):
            raise NotADirectoryError(errno.ENOTDIR, f"{node.shown}: not a directory")
        return node

    def _entries(self, node: _Dir) -> Tree:
        entries = node.entries
        if entries is None:
            entries = node.entries = self._tree(node.sha, node.shown)
        return entries

    def _tree(self, sha: bytes, shown: str) -> Tree:
        def load() -> Tree:
            raw = self._git_op(shown, "read tree", lambda: self._git.raw(sha, OBJ_TREE))
            hidden: list[tuple[bytes, str]] = []
            try:
                entries = parse_tree_columns(
                    raw, len(sha), f"tree {sha.hex()}", lambda n, why: hidden.append((n, why))
                )
            except FormatError as exc:
                raise self._eio(shown, "bad tree", exc) from exc
            for name, why in hidden:
                self._log_hidden(_join(shown, name), why)
            return entries

        return self._flights.run(("tree", sha), load)

    def _log_hidden(self, shown: str, why: str) -> None:
        """Say once per path that a tree entry is not shown, naming the commit."""
        with self._lock:
            first = shown not in self._hidden
            self._hidden.put(shown, True)
        if first:
            log.warning("commit %s: %r is not shown: %s", self._commit_hex, shown, why)

    def _children(self, node: _Dir) -> list[_Node]:
        """A directory's children, sorted by name (created on the first call)."""
        if node.names is not None:
            return node.order
        names, modes, shas = self._entries(node)
        base = node.path
        # hash outside the lock: a directory can have 100k entries
        paths = [base + b"/" + name for name in names] if base else list(names)
        numbers = inode_numbers(self._commit_hex, paths)
        kinds = list(map(_kind_of, modes))  # (parse_tree admits known modes only)
        folder = NodeKind.DIR
        with self._lock:
            if node.names is not None:
                return node.order
            nodes = self._nodes
            if len(set(numbers)) != len(numbers) or not nodes.keys().isdisjoint(numbers):
                numbers = self._probe(numbers, paths)
            kids: list[_Node] = [
                _Dir(ino, node, name, mode, sha, path)
                if kind is folder
                else _Node(ino, node, name, mode, sha, kind)  # type: ignore[arg-type]
                for ino, name, mode, sha, kind, path in zip(
                    numbers, names, modes, shas, kinds, paths, strict=True
                )
            ]
            nodes.update(zip(numbers, kids, strict=True))
            by_name = sorted(names)
            if by_name != list(names):  # (tree order puts "a/" after "a-b": a directory)
                kids.sort(key=_by_name)
            node.order = kids
            node.size = 2 + kinds.count(folder)  # nlink
            node.names = by_name
            node.entries = None  # the children hold what is needed: free the parsed tree
        return kids

    def _probe(self, numbers: list[int], paths: list[bytes]) -> list[int]:
        """Inode numbers free of 63-bit collisions (with numbers handed out, or within
        ``numbers``): the next free number, said in the log. Call with the lock held."""
        nodes = self._nodes
        taken: dict[int, bytes] = {}
        out: list[int] = []
        for ino, path in zip(numbers, paths, strict=True):
            while ino in nodes or ino in taken:
                other = nodes[ino].shown if ino in nodes else repr(taken[ino])
                log.warning("inode %d of %r collides with %s", ino, path, other)
                ino = ino + 1 if ino < _INO_MASK else ROOT_INO + 1
            taken[ino] = path
            out.append(ino)
        return out

    def _child(self, node: _Dir, name: bytes) -> _Node | None:
        kids = self._children(node)
        names = node.names
        assert names is not None
        i = bisect.bisect_left(names, name)
        return kids[i] if i < len(names) and names[i] == name else None

    def _attrs(self, node: _Node) -> Attrs:
        kind = node.kind
        mtime = self.mtime_ns
        if isinstance(node, _Dir):
            if node.size < 0:
                try:
                    modes = self._entries(node).modes
                    node.size = 2 + modes.count(MODE_DIR) + modes.count(MODE_GITLINK)
                except OSError:  # a broken tree (logged): still listed, unreadable when opened
                    node.size = 2
            return Attrs(node.ino, kind, _ST_MODES[MODE_DIR], 0, node.size, mtime)
        if kind is NodeKind.FILE:
            if node.size < 0:
                node.size = self._file_info(node).size
            return Attrs(node.ino, kind, _FILE_PERMS[node.mode], node.size, 1, mtime)
        if node.size < 0:
            target = self._link_size(node.sha, node.shown)
            node.size = len(BROKEN_LINK_TARGET) if target is None else target
        return Attrs(node.ino, kind, _ST_MODES[MODE_LINK], node.size, 1, mtime)

    # ---- blobs -----------------------------------------------------------------------------

    def _file_info(self, node: _Node) -> _BlobInfo:
        """What a file node is: :meth:`_blob_info`, but a file git reads itself is always
        its blob, never a pointer (as a checkout writes it)."""
        if node.name in _NEVER:
            sha = node.sha
            return _BlobInfo(
                self._git_op(node.shown, "size blob", lambda: self._git.size(sha)), None
            )
        return self._blob_info(node.sha, node.shown)

    def _blob_info(self, sha: bytes, shown: str) -> _BlobInfo:
        info = self._infos.get(sha)
        if info is None:
            info = self._flights.run(("info", sha), lambda: self._load_info(sha, shown))
        return info

    def _load_info(self, sha: bytes, shown: str) -> _BlobInfo:
        # size and, for a blob small enough to be a pointer, its bytes: one read of the pack
        size, data = self._git_op(
            shown, "size blob", lambda: self._git.small_blob(sha, MAX_POINTER_SIZE)
        )
        pointer = None
        if data is not None:  # small enough to be a pointer: read it to know
            if len(data) != size:
                bad = FormatError(f"blob {sha.hex()}", f"{len(data)} bytes, header says {size}")
                raise self._eio(shown, "inconsistent object", bad) from bad
            self._cache_blob(sha, shown, data)
            pointer = self._parse_pointer(sha, data, shown)
        info = _BlobInfo(pointer.size if pointer is not None else size, pointer)
        self._infos.put(sha, info)
        return info

    def _parse_pointer(
        self, sha: bytes, data: bytes, shown: str | Callable[[bytes], str]
    ) -> Pointer | None:
        """The pointer a small blob holds, or None (a broken one is logged once, with its
        file's path: ``shown``, or ``shown(sha)``)."""
        if not looks_like_pointer(data):
            return None
        try:
            return Pointer.decode(data)
        except PointerFormatError as exc:
            with self._lock:
                first = sha not in self._warned
                self._warned.put(sha, True)
            if first:
                where = shown if isinstance(shown, str) else shown(sha)
                log.warning("%s: not a valid pointer (%s); served as is", where, exc.reason)
            return None

    def _read_blob(self, sha: bytes, shown: str, size: int) -> bytes:
        """A blob's bytes from git, checked against its size, and cached."""
        data = self._git_op(shown, "read blob", lambda: self._git.raw(sha, OBJ_BLOB))
        if len(data) != size:
            bad = FormatError(f"blob {sha.hex()}", f"{len(data)} bytes, its header says {size}")
            raise self._eio(shown, "inconsistent object", bad) from bad
        self._cache_blob(sha, shown, data)
        return data

    def _cache_blob(self, sha: bytes, shown: str, data: bytes) -> None:
        try:
            self._blobs.put(sha, data)
        except OSError as exc:  # no room for a spool file: serve it anyway, uncached
            log.warning("%s: cannot cache blob: %s", shown, exc)

    def _read_plain(self, node: _Node, total: int, offset: int, size: int) -> bytes:
        cached = self._blobs.get(node.sha)
        if cached is None:
            data = self._flights.run(
                ("blob", node.sha), lambda: self._read_blob(node.sha, node.shown, total)
            )
            return data[offset : offset + size]
        if isinstance(cached, bytes):
            return cached[offset : offset + size]
        try:
            return cached.value.pread(offset, min(size, total - offset))
        except OSError as exc:
            raise self._eio(node.shown, "read spooled blob", exc) from exc
        finally:
            cached.release()

    def _read_pointer(self, node: _Node, pointer: Pointer, offset: int, size: int) -> bytes:
        if self._readers.get(pointer.xet_hash) is None:
            self._busy_at = time.monotonic()  # a reader of files: statfs waits
            self._describe_around(node)
        try:
            reader = self._reader(pointer, (offset, size))
            if reader.size != pointer.size:
                detail = f"reconstructs to {reader.size} bytes, the pointer says {pointer.size}"
                raise IntegrityError("file", pointer.xet_hash, detail)
            return reader.read(offset, size)
        except Exception as exc:  # any failure of the source: never half-served data
            raise self._eio(node.shown, "cannot read data", exc) from exc

    def _read_batch(self, node: _Node) -> bytes | None:
        """A small pointer file's whole bytes, read with the files after it in its listed
        directories (:meth:`_files_after`; a reader of one image reads the next ones next):
        one read, decode and hash per run of adjacent chunks instead of one per file
        (``read_whole_files``). The others are kept ready for their first read (bounded,
        each handed out once). None when the file could not be read this way."""
        batch = [node]
        for n in self._files_after(node):
            if len(batch) >= AHEAD_BATCH:
                break
            if 0 < n.size <= AHEAD_FILE_MAX and n.ino not in self._ready:
                batch.append(n)
        got = self._read_ahead(batch)
        for n, data in zip(batch[1:], got[1:], strict=True):
            if data is not None:
                self._ready.put(n.ino, data)
        return got[0]

    def _files_after(self, node: _Node) -> Iterator[_Node]:
        """The files after ``node`` in path order through listed directories: the rest of
        its directory, depth first, then what follows it in its parent, and so on up to
        the root; it stops at a directory not listed yet (listing could wait on git)."""
        here = node.parent
        start = bisect.bisect_right(here.names or [], node.name)
        below: list[tuple[_Dir, int]] = []  # directories entered: where each continues
        while True:
            if not here.listed:
                return
            kids = here.order
            i = start
            while i < len(kids):
                c = kids[i]
                i += 1
                if isinstance(c, _Dir):
                    if not c.listed:
                        return
                    below.append((here, i))
                    here, kids, i = c, c.order, 0
                elif c.kind is NodeKind.FILE:
                    yield c
            if below:
                here, start = below.pop()
                continue
            up = here.parent
            if up is here or not up.listed:
                return
            start = bisect.bisect_right(up.names or [], here.name)
            here = up

    def _read_ahead(self, nodes: list[_Node]) -> list[bytes | None]:
        """The whole verified bytes of small pointer files, read and checked together
        (:func:`read_whole_files`: no reader made per file); None for any other file, or
        one that failed (its own read reports it)."""
        jobs: list[int] = []
        wants: list[tuple[bytes, int]] = []
        for k, n in enumerate(nodes):
            with self._lock:
                info = self._infos.get(n.sha) if n.name not in _NEVER else None
            if info is None or info.pointer is None or not 0 < info.size <= AHEAD_FILE_MAX:
                continue
            jobs.append(k)
            wants.append((from_hex(info.pointer.xet_hash), info.pointer.size))
        out: list[bytes | None] = [None] * len(nodes)
        for k, data in zip(jobs, read_whole_files(self._source, wants), strict=True):
            out[k] = data
        return out

    def _describe_around(self, node: _Node) -> None:
        """Before the first read of a pointer file from a server: the descriptions of the
        pointer files around it, in one batch, sized like a read-ahead window. A first read
        nowhere near the directory's last batch describes the :data:`DESCRIBE_FIRST`
        entries around it; one that lands right after the last batch (a scan) describes the
        next entries, twice as many each time up to :data:`DESCRIBE_WINDOW`, and, when the
        directory is small, continues into the directories after it in its parent (an image
        dataset of 20 files a directory: a request per many directories, not per directory,
        nor per file). Only a hint: what fails is left to the reads."""
        describe = getattr(self._source, "describe", None)
        here = node.parent
        names = here.names
        if describe is None or names is None:
            return
        i = bisect.bisect_left(names, node.name)
        with self._lock:
            scans = self._scans.get(here.ino) or []
            covering = next((b for b in scans if b.lo <= i < b.hi), None)
            last = scans[-1] if scans else None
            if covering is not None:
                batch = None  # described, or being described
            else:
                if last is not None and last.hi <= i < last.hi + last.size:
                    size = min(2 * last.size, DESCRIBE_WINDOW)
                    lo = last.hi
                else:
                    size = DESCRIBE_FIRST
                    lo = i - i % size
                batch = _Scan(lo, max(lo + size, i + 1), size)
                self._scans.put(here.ino, [*scans[1 - _SCANS_KEPT :], batch])
        if covering is not None:
            covering.ready.wait(_DESCRIBE_WAIT)
            return
        assert batch is not None
        try:
            self._describe_batch(here, batch, describe)
        except Exception as exc:  # a server that is down: each read reports it
            log.debug("%s: describing its files failed: %s", here.shown, exc)
        finally:
            batch.ready.set()

    def _describe_batch(
        self, here: _Dir, batch: _Scan, describe: Callable[[list[bytes]], object]
    ) -> None:
        """Describe the entries ``batch`` covers of ``here`` (and of the small directories
        after it, each then covered by a batch of its own that a scan continues)."""
        inline = self.inline_reads  # a local store, from try_read on an event loop
        files = here.order[batch.lo : batch.hi]
        up = here.parent
        after = (
            up.order[bisect.bisect_right(up.names, here.name) :]
            if up is not here and up.names is not None
            else []
        )
        ended = batch.hi >= len(here.order)  # the batch reaches the directory's end
        small = len(here.order) < DESCRIBE_WINDOW // 2
        for dirs, sib in enumerate(after):
            if not ended or not isinstance(sib, _Dir):
                break
            with self._lock:
                if self._scans.get(sib.ino):
                    break  # a batch of its own: a scan continues from there
                if (
                    not small
                    or len(files) >= batch.size
                    or dirs >= DESCRIBE_DIRS
                    or (inline and sib.names is None)  # (an event loop lists nothing)
                ):
                    # the next directory: a scan reaching it continues this batch's size
                    self._scans.put(sib.ino, [_Scan(0, 0, batch.size, done=True)])
                    break
            try:
                kids = self._children(sib)  # lists it: a walk will, next
            except (OSError, GitError):
                break  # its reads report it
            take = kids[: batch.size - len(files)]
            files += take
            ended = len(take) == len(kids)
            with self._lock:
                self._scans.put(sib.ino, [_Scan(0, len(take), batch.size, ready=batch.ready)])
        shas = [c.sha for c in files if c.kind is NodeKind.FILE]
        if inline:  # only what the listings found: no git on an event loop
            with self._lock:
                infos = [self._infos.get(sha) for sha in shas]
            found = [i.pointer for i in infos if i is not None and i.pointer is not None]
        else:
            found = list(self._batch_infos(shas, here.shown, _path_among(files))[1].values())
        hashes = list(dict.fromkeys(from_hex(p.xet_hash) for p in found if p.size))
        if hashes:  # (one file too: a batch of one, not a read describing it alone later)
            describe(hashes)

    def _reader(self, pointer: Pointer, opening: tuple[int, int] | None = None) -> FileReader:
        key = pointer.xet_hash
        reader = self._readers.get(key)
        if reader is None:
            reader = self._flights.run(
                ("reader", key),
                lambda: FileReader(self._source, from_hex(key), cache=self._cache, opening=opening),
            )
            self._readers.put(key, reader)
        return reader

    # ---- totals ----------------------------------------------------------------------------

    def _walk_totals(self, pace: Callable[[], None] | None = None) -> tuple[int, int]:
        """(bytes, nodes) of the served tree; each distinct tree object is summed once
        (``pace`` is called before each)."""
        root = self._root
        if root.mode == MODE_GITLINK:
            return 0, 1
        done: dict[bytes, tuple[int, int]] = {}
        stack: list[tuple[bytes, str, bool]] = [(root.sha, root.shown, False)]
        while stack:
            sha, shown, ready = stack.pop()
            if sha in done:
                continue
            if pace is not None:
                pace()
            try:
                entries = self._tree(sha, shown).records()
            except OSError:  # a broken tree (logged): counted as an empty directory
                done[sha] = (0, 1)
                continue
            if not ready:
                subs = [
                    (e.sha, _join(shown, e.name), False)
                    for e in entries
                    if e.mode == MODE_DIR and e.sha not in done
                ]
                if subs:
                    stack.append((sha, shown, True))
                    stack.extend(subs)
                    continue
            total, count = 0, 1
            known, _ = self._batch_infos(
                [e.sha for e in entries if e.mode not in (MODE_DIR, MODE_GITLINK)],
                shown,
                _path_in(shown, entries),
            )
            for e in entries:
                if e.mode == MODE_DIR:
                    sub_total, sub_count = done[e.sha]
                    total += sub_total
                    count += sub_count
                    continue
                count += 1
                size = known.get(e.sha, -1)
                if size >= 0 and (e.mode != MODE_LINK or 0 < size < PATH_MAX):
                    total += size
                    continue
                where = _join(shown, e.name)
                try:
                    if e.mode == MODE_LINK:
                        link = self._link_size(e.sha, where)
                        total += len(BROKEN_LINK_TARGET) if link is None else link
                    elif e.mode != MODE_GITLINK:
                        total += self._blob_info(e.sha, where).size
                except OSError:  # a missing or damaged object (logged): it reads as EIO
                    pass
            done[sha] = (total, count)
        return done[root.sha]

    # ---- errors ----------------------------------------------------------------------------

    def _git_op(self, shown: str, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except Exception as exc:  # a missing or damaged object: the file is unreadable
            raise self._eio(shown, what, exc) from exc

    def _eio(self, shown: str, what: str, exc: BaseException) -> OSError:
        log.warning("%s: %s: %s: %s", shown, what, type(exc).__name__, exc)
        return OSError(errno.EIO, f"{shown}: {what}: {exc}")
