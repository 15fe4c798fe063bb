"""An in-memory ReadOnlyFS used to test the FUSE and NFS adapters without git or a store."""

from __future__ import annotations

import errno
import stat
import threading

from gitxet.vfs.nodes import Attrs, FSStats, NodeKind


class MemoryFS:
    """A tiny read-only tree built from a ``{path: bytes | ("link", target) | None}`` dict.

    ``None`` makes an empty directory; parents are created as needed. ``fail_reads`` makes
    every read raise EIO (to test the adapters' error paths); ``read_delay`` slows reads.
    """

    def __init__(self, files: dict[str, object], mtime_ns: int = 1_700_000_000_000_000_000) -> None:
        self._attrs: dict[int, Attrs] = {}
        self._children: dict[int, dict[bytes, int]] = {}
        self._parent: dict[int, int] = {}
        self._data: dict[int, bytes] = {}
        self._links: dict[int, bytes] = {}
        self._mtime = mtime_ns
        self._next = 2
        self.fail_reads = False
        self.read_event: threading.Event | None = None  # when set, reads wait on it
        self._root = 1
        self._attrs[1] = Attrs(1, NodeKind.DIR, stat.S_IFDIR | 0o755, 0, 2, mtime_ns)
        self._children[1] = {}
        self._parent[1] = 1
        for path, content in sorted(files.items()):
            self._add(path, content)

    def _mkdirs(self, parts: list[bytes]) -> int:
        cur = 1
        for p in parts:
            nxt = self._children[cur].get(p)
            if nxt is None:
                nxt = self._new(cur, p, NodeKind.DIR, stat.S_IFDIR | 0o755, 0)
                self._children[nxt] = {}
            cur = nxt
        return cur

    def _new(self, parent: int, name: bytes, kind: NodeKind, mode: int, size: int) -> int:
        ino = self._next
        self._next += 1
        self._attrs[ino] = Attrs(
            ino, kind, mode, size, 2 if kind is NodeKind.DIR else 1, self._mtime
        )
        self._children[parent][name] = ino
        self._parent[ino] = parent
        return ino

    def _add(self, path: str, content: object) -> None:
        parts = [p.encode() for p in path.strip("/").split("/")]
        if content is None:
            self._mkdirs(parts)
            return
        parent = self._mkdirs(parts[:-1])
        if isinstance(content, tuple):
            target = str(content[1]).encode()
            ino = self._new(parent, parts[-1], NodeKind.SYMLINK, stat.S_IFLNK | 0o777, len(target))
            self._links[ino] = target
        else:
            assert isinstance(content, bytes)
            mode = 0o755 if path.endswith(".sh") else 0o644
            ino = self._new(parent, parts[-1], NodeKind.FILE, stat.S_IFREG | mode, len(content))
            self._data[ino] = content

    @property
    def root_ino(self) -> int:
        return self._root

    def getattr(self, ino: int) -> Attrs:
        try:
            return self._attrs[ino]
        except KeyError:
            raise FileNotFoundError(errno.ENOENT, "stale inode") from None

    def lookup(self, parent_ino: int, name: bytes) -> Attrs:
        if self.getattr(parent_ino).kind is not NodeKind.DIR:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        if name == b".":
            return self._attrs[parent_ino]
        if name == b"..":
            return self._attrs[self._parent[parent_ino]]
        try:
            return self._attrs[self._children[parent_ino][name]]
        except KeyError:
            raise FileNotFoundError(errno.ENOENT, name.decode(errors="replace")) from None

    def parent(self, ino: int) -> int:
        self.getattr(ino)
        return self._parent[ino]

    def readdir(self, ino: int) -> list[tuple[bytes, Attrs]]:
        if self.getattr(ino).kind is not NodeKind.DIR:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        return [(n, self._attrs[i]) for n, i in sorted(self._children[ino].items())]

    def readlink(self, ino: int) -> bytes:
        if ino not in self._links:
            raise OSError(errno.EINVAL, "not a symlink")
        return self._links[ino]

    def read(self, ino: int, offset: int, size: int) -> bytes:
        attrs = self.getattr(ino)
        if attrs.kind is NodeKind.DIR:
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        if self.read_event is not None:
            self.read_event.wait(30)
        if self.fail_reads:
            raise OSError(errno.EIO, "data unavailable")
        return self._data[ino][offset : offset + size]

    def statfs(self) -> FSStats:
        return FSStats(total_bytes=sum(len(d) for d in self._data.values()), files=len(self._attrs))
