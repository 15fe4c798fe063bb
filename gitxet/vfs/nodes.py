"""Protocol-neutral types of the read-only filesystem model.

The FUSE and NFS adapters translate these to their own wire types (``EntryAttributes``,
``fattr3``); the model never sees those. Names are ``bytes`` exactly as stored in git trees.

Errors are the builtin ``OSError`` family with ``errno`` set (``FileNotFoundError`` for
ENOENT, ``NotADirectoryError``, ``IsADirectoryError``, ``OSError(errno.EIO, ...)`` for data
that cannot be fetched); adapters map ``errno`` to their protocol's status codes.
"""

from __future__ import annotations

import enum
import stat
from dataclasses import dataclass
from typing import NamedTuple, Protocol


class NodeKind(enum.Enum):
    """What a node is."""

    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"


class Attrs(NamedTuple):
    """Attributes of one node. ``mode`` includes the type bits (``stat.S_IFREG | 0o644``).

    A named tuple: a listing makes one per entry, and a tuple is built several times
    faster than a frozen dataclass."""

    ino: int
    kind: NodeKind
    mode: int
    size: int
    nlink: int
    mtime_ns: int

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


class Columns(NamedTuple):
    """A directory's children as columns, sorted by name (``.`` and ``..`` left out):
    what a listing sends for each entry, with no object per entry (a FUSE listing of a
    million-file commit sends a million)."""

    names: list[bytes]
    inos: list[int]
    modes: list[int]  # with the type bits, as :attr:`Attrs.mode`
    sizes: list[int]
    nlinks: list[int]
    mtimes_ns: list[int]


@dataclass(frozen=True, slots=True)
class FSStats:
    """Whole-filesystem figures for statfs / FSSTAT."""

    total_bytes: int
    files: int
    block_size: int = 4096
    name_max: int = 255


class ReadOnlyFS(Protocol):
    """What every adapter (FUSE, NFS) needs from the model.

    Inode numbers are stable: the same commit and path always give the same number, so a
    remounted or restarted server can answer old handles. ``root_ino`` is never 0.

    An implementation may also have ``inline_reads: bool``: True when ``read`` touches only
    local disk and memory, so an adapter may call it on its event loop instead of a worker
    thread (a thread hop costs more than such a read); and ``readdir_columns(ino) ->
    Columns``: :meth:`readdir` without an object per entry.
    """

    @property
    def root_ino(self) -> int: ...

    def getattr(self, ino: int) -> Attrs:
        """Attributes of a known inode; ``FileNotFoundError`` when unknown (stale)."""
        ...

    def lookup(self, parent_ino: int, name: bytes) -> Attrs:
        """The child ``name`` of a directory; ``b"."`` and ``b".."`` are answered too."""
        ...

    def parent(self, ino: int) -> int:
        """Inode of the directory holding ``ino`` (the root is its own parent)."""
        ...

    def readdir(self, ino: int) -> list[tuple[bytes, Attrs]]:
        """Children of a directory, sorted by name, without ``.`` and ``..``."""
        ...

    def readlink(self, ino: int) -> bytes:
        """Target of a symlink."""
        ...

    def read(self, ino: int, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset``; short only at end of file. May block on I/O."""
        ...

    def statfs(self) -> FSStats:
        """Filesystem totals."""
        ...
