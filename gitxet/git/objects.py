"""Reading git objects straight from the object store, with dulwich (no process per call).

What the read-only filesystem model needs: tree objects parsed strictly (entries the path
rule of :mod:`gitxet.git.paths` refuses are left out, broken bytes raise), object sizes
without reading big blobs (from the pack entry header, the delta header or the loose
object header, as ``git cat-file -s`` does), raw blobs and trees, and commits with tags
peeled. Dulwich objects are not thread-safe, so
:class:`GitObjects` keeps a small pool of repositories, one per concurrent reader.
Formats: git's ``gitformat-pack`` and ``gitformat-loose`` documentation.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from dulwich.errors import NotGitRepository
from dulwich.repo import Repo

from gitxet.errors import FormatError, GitError, GitObjectNotFoundError
from gitxet.git.catfile import Describer
from gitxet.git.paths import unsafe_name

__all__ = [
    "EMPTY_TREE",
    "FILE_MODES",
    "MODE_DIR",
    "MODE_GITLINK",
    "MODE_LINK",
    "OBJ_BLOB",
    "OBJ_COMMIT",
    "OBJ_TREE",
    "SUPPORTED_MODES",
    "GitObjects",
    "Tree",
    "TreeRecord",
    "count_subtrees",
    "loose_size",
    "packed_size",
    "parse_tree",
    "parse_tree_columns",
]

# git tree entry modes
MODE_DIR = 0o040000
MODE_LINK = 0o120000
MODE_GITLINK = 0o160000
FILE_MODES = frozenset({0o100644, 0o100755, 0o100664})  # 100664: written by very old gits
SUPPORTED_MODES = FILE_MODES | {MODE_DIR, MODE_LINK, MODE_GITLINK}
_MODE_TEXT = {f"{m:o}".encode(): m for m in SUPPORTED_MODES}  # as git writes them


def _plain_entries(sha_len: int) -> re.Pattern[bytes]:
    # A file or directory entry whose name is ASCII without '/' or '\\' and does not start
    # with '.', 'g' or 'G': no rule of gitxet.git.paths can refuse such a name (symlinks,
    # and every other name, take the careful path).
    return re.compile(
        rb"(100644|100755|40000|160000) ([^\0/\\.gG\x80-\xff][^\0/\\\x80-\xff]*)\0(.{%d})"
        % sha_len,
        re.DOTALL,
    )


_PLAIN = {20: _plain_entries(20), 32: _plain_entries(32)}  # SHA-1, SHA-256 repositories

# pack entry types (gitformat-pack)
OBJ_COMMIT, OBJ_TREE, OBJ_BLOB, OBJ_TAG, OFS_DELTA, REF_DELTA = 1, 2, 3, 4, 6, 7

GIT_HANDLES = 4  # dulwich repos opened at most (one per concurrent git reader)
DESCRIBERS = 2  # git cat-file --batch-command processes at most
_VARINT_MAX = 10  # bytes of a 64-bit size in git's 7-bit varints


class TreeRecord(NamedTuple):
    """One tree entry: name, git mode, raw object id."""

    name: bytes
    mode: int
    sha: bytes


class Tree(NamedTuple):
    """A parsed tree as columns, in tree order (no object per entry: a listing parses
    trees of thousands of entries)."""

    names: Sequence[bytes]
    modes: Sequence[int]
    shas: Sequence[bytes]

    def records(self) -> list[TreeRecord]:
        """The entries one by one."""
        return list(map(TreeRecord._make, zip(*self, strict=True)))


EMPTY_TREE = Tree((), (), ())


def parse_tree(
    raw: bytes,
    sha_len: int,
    what: str,
    hidden: Callable[[bytes, str], None] | None = None,
) -> list[TreeRecord]:
    """The entries of a tree object that are safe to show, in tree order (see
    :func:`parse_tree_columns`)."""
    return parse_tree_columns(raw, sha_len, what, hidden).records()


def parse_tree_columns(
    raw: bytes,
    sha_len: int,
    what: str,
    hidden: Callable[[bytes, str], None] | None = None,
) -> Tree:
    """The entries of a tree object that are safe to show, in tree order.

    An entry is left out, and ``hidden(name, reason)`` called, when its name breaks the path
    rule of :mod:`gitxet.git.paths` (``..``, ``/``, ``.git`` and its look-alikes, ...), its
    mode is not one git writes, or it repeats an earlier entry's name: the rest of the
    directory stays readable.

    Raises:
        FormatError: the tree's bytes are broken (a bad mode field, a truncated entry).
    """
    fast = _plain_tree(raw, sha_len)
    if fast is not None:
        modes, names, shas = fast
        return Tree(names, list(map(_MODE_TEXT.__getitem__, modes)), shas)
    out: list[TreeRecord] = []
    seen: set[bytes] = set()
    modes_of = _MODE_TEXT
    pos, end = 0, len(raw)
    while pos < end:
        sp = raw.find(b" ", pos, pos + 8)
        mode_text = raw[pos:sp]
        mode = modes_of.get(mode_text) if sp >= 0 else None  # common modes without int()
        if mode is None:
            if sp < 0 or not mode_text or mode_text.strip(b"01234567"):
                raise FormatError(what, f"entry at byte {pos}: bad or missing mode")
            mode = int(mode_text, 8)
        nul = raw.find(b"\0", sp + 1)
        if nul < 0 or nul + 1 + sha_len > end:
            raise FormatError(what, f"entry at byte {pos}: truncated")
        name = raw[sp + 1 : nul]
        sha = raw[nul + 1 : nul + 1 + sha_len]
        pos = nul + 1 + sha_len
        reason = unsafe_name(name, mode)
        if reason is None and mode not in SUPPORTED_MODES:
            reason = f"unsupported mode {mode:o}"
        if reason is None and name in seen:
            reason = "duplicate name"
        if reason is not None:
            if hidden is not None:
                hidden(name, reason)
            continue
        seen.add(name)
        out.append(TreeRecord(name, mode, sha))
    if not out:
        return EMPTY_TREE
    names, int_modes, shas = zip(*out, strict=True)
    return Tree(names, int_modes, shas)


def _plain_tree(
    raw: bytes, sha_len: int
) -> tuple[Sequence[bytes], Sequence[bytes], Sequence[bytes]] | None:
    """``(mode texts, names, ids)`` of the entries, in C, when every entry of the tree is a
    plain one (see :func:`_plain_entries`) and no name repeats; else None (then the
    careful parse decides). Matches that add up to the tree's length tile it exactly, so
    they are the entries :func:`parse_tree` would read."""
    pattern = _PLAIN.get(sha_len)
    if pattern is None:
        return None
    found: list[tuple[bytes, bytes, bytes]] = pattern.findall(raw)
    if not found:
        return ((), (), ()) if not raw else None
    modes, names, shas = zip(*found, strict=True)
    total = (2 + sha_len) * len(found) + sum(map(len, modes)) + sum(map(len, names))
    if total != len(raw) or len(set(names)) != len(found):
        return None
    return modes, names, shas


def count_subtrees(raw: bytes, sha_len: int) -> int:
    """How many entries of a tree are directories (trees or gitlinks) that
    :func:`parse_tree` would show: a scan, no parse (a directory's link count needs only
    this, and a listing asks it of every subdirectory). Broken bytes count what came
    before them."""
    found = _plain_tree(raw, sha_len)
    if found is not None:
        return found[0].count(b"40000") + found[0].count(b"160000")
    count = 0
    pos, end = 0, len(raw)
    while pos < end:
        sp = raw.find(b" ", pos, pos + 8)
        nul = raw.find(b"\0", sp + 1) if sp >= 0 else -1
        if nul < 0 or nul + 1 + sha_len > end:
            break
        mode = raw[pos:sp]
        if (mode == b"40000" or mode == b"160000") and unsafe_name(raw[sp + 1 : nul]) is None:
            count += 1
        pos = nul + 1 + sha_len
    return count


def _varint_le(data: bytes, pos: int, what: str) -> tuple[int, int]:
    """A delta-header size (7 bits per byte, least significant group first)."""
    value = shift = 0
    for i in range(pos, min(len(data), pos + _VARINT_MAX)):
        value |= (data[i] & 0x7F) << shift
        shift += 7
        if not data[i] & 0x80:
            return value, i + 1
    raise FormatError(what, "truncated size in delta header")


def _inflate_prefix(read: Callable[[int], bytes], want: int, what: str) -> bytes:
    """The first ``want`` decompressed bytes of a zlib stream, reading as little as possible."""
    d = zlib.decompressobj()
    out = b""
    for _ in range(64):  # 64 reads of 64 bytes: no sane header needs more
        if len(out) >= want or d.eof:
            return out
        data = d.unconsumed_tail or read(64)
        if not data:
            break
        try:
            out += d.decompress(data, want - len(out))
        except zlib.error as exc:
            raise FormatError(what, f"bad zlib data ({exc})") from None
    if d.eof or len(out) >= want:
        return out
    raise FormatError(what, "zlib stream ends early")


def packed_size(path: str, offset: int, sha_len: int) -> int:
    """Size of the object at ``offset`` in a pack, from its entry header or delta header.

    A non-delta entry's header holds the object size. A delta's compressed data starts with
    the base size and the result size, so only the first bytes need inflating.
    """
    with open(path, "rb", buffering=0) as f:
        return packed_entry(f.fileno(), os.path.basename(path), offset, sha_len, 0)[0]


def packed_entry(
    fd: int, name: str, offset: int, sha_len: int, want: int = 0
) -> tuple[int, bytes | None]:
    """``(size, content)`` of the object at ``offset`` in the pack open as ``fd``.

    The content comes only for a whole (non-delta) blob of at most ``want`` bytes, read
    with its header in one ``pread``; otherwise it is None (a delta needs its base; the
    caller reads it the slow way when it needs it).
    """
    what = f"pack {name} @{offset}"
    slack = want + want // 8 + 64 if want else 0  # zlib's worst case for small inputs
    head = os.pread(fd, 2 * _VARINT_MAX + sha_len + slack, offset)
    if not head:
        raise FormatError(what, "offset beyond the end of the pack")
    kind = (head[0] >> 4) & 7
    size, shift, i = head[0] & 0x0F, 4, 1
    while head[i - 1] & 0x80:
        if i >= min(len(head), _VARINT_MAX):
            raise FormatError(what, "truncated entry header")
        size |= (head[i] & 0x7F) << shift
        shift += 7
        i += 1
    if kind in (OBJ_COMMIT, OBJ_TREE, OBJ_BLOB, OBJ_TAG):
        if kind != OBJ_BLOB or size > want:
            return size, None
        d = zlib.decompressobj()
        try:
            data = d.decompress(head[i:], size + 1)
        except zlib.error as exc:
            raise FormatError(what, f"bad zlib data ({exc})") from None
        # a stream longer than the slack was cut: no content then, never a guess
        return size, data if len(data) == size and d.eof else None
    if kind == OFS_DELTA:
        while i < len(head) and head[i] & 0x80:
            i += 1
        i += 1
    elif kind == REF_DELTA:
        i += sha_len
    else:
        raise FormatError(what, f"unknown entry type {kind}")
    pos = offset + i

    def read(n: int) -> bytes:
        nonlocal pos
        data = os.pread(fd, n, pos)
        pos += len(data)
        return data

    prefix = _inflate_prefix(read, 2 * _VARINT_MAX, what)
    _base, j = _varint_le(prefix, 0, what)
    result, _ = _varint_le(prefix, j, what)
    return result, None


def loose_size(path: str) -> int:
    """Size of a loose blob, from the ``blob <size>\\0`` header at the start of its stream."""
    return loose_head(path, 0)[0]


def loose_head(path: str, want: int) -> tuple[int, bytes | None]:
    """``(size, content)`` of a loose blob; the content only when at most ``want`` bytes."""
    what = f"loose object {os.path.basename(os.path.dirname(path))}{os.path.basename(path)}"
    with open(path, "rb") as f:
        prefix = _inflate_prefix(f.read, 32 + want, what)
    header, nul, rest = prefix.partition(b"\0")
    kind, _sp, size_text = header.partition(b" ")
    if not nul or kind != b"blob" or not size_text.isdigit():
        raise FormatError(what, f"not a blob header: {header[:32]!r}")
    size = int(size_text)
    return size, rest[:size] if size <= want and len(rest) >= size else None


class _Handle:
    """One dulwich repository, used by one thread at a time."""

    def __init__(self, path: str) -> None:
        from gitxet.git.process import common_git_dir

        self.repo = Repo(common_git_dir(path))  # a linked work tree's objects are shared
        try:
            self.store: Any = self.repo.object_store
            self.packs: list[Any] = list(self.store.packs)
            self._alternates: list[tuple[Any, list[Any]]] | None = None
        except BaseException:
            self.repo.close()
            raise
        self._pack_fds: dict[str, int] = {}  # one per pack file, kept open

    def size(self, hexsha: bytes, sha_len: int) -> int:
        return self.head(hexsha, sha_len, 0)[0]

    def head(self, hexsha: bytes, sha_len: int, want: int) -> tuple[int, bytes | None]:
        """``(size, content)``: the content too when the object is a blob of at most
        ``want`` bytes stored whole (one ``pread``); None means "read it with :meth:`raw`"."""
        for attempt in range(2):
            for store, packs in self._stores():
                for pack in packs:
                    try:
                        offset = pack.index.object_offset(hexsha)
                    except KeyError:
                        continue
                    path = os.fspath(pack.data.path)
                    fd = self._pack_fds.get(path)
                    if fd is None:
                        fd = self._pack_fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                    return packed_entry(fd, os.path.basename(path), offset, sha_len, want)
                root = getattr(store, "path", None)
                if root is not None:
                    text = hexsha.decode("ascii")
                    try:
                        return loose_head(os.path.join(os.fspath(root), text[:2], text[2:]), want)
                    except FileNotFoundError:
                        pass
            if attempt == 0:  # a repack may have moved it into a pack we do not know yet
                self.packs = list(self.store.packs)
                self._alternates = None
        # a store that is not on disk: pay for a full read
        data = self.raw(hexsha, OBJ_BLOB)
        return len(data), data if len(data) <= want else None

    def _stores(self) -> list[tuple[Any, list[Any]]]:
        """This repository's object store and its alternates (``objects/info/alternates``),
        each with its packs: sizes must come from headers there too, never a full read."""
        if self._alternates is None:
            found: list[tuple[Any, list[Any]]] = []
            for alt in getattr(self.store, "alternates", ()):
                with contextlib.suppress(Exception):  # an unreadable alternate: skip it
                    found.append((alt, list(alt.packs)))
            self._alternates = found
        return [(self.store, self.packs), *self._alternates]

    def raw(self, hexsha: bytes, want: int) -> bytes:
        try:
            type_num, data = self.store.get_raw(hexsha)
        except KeyError:
            raise GitObjectNotFoundError(hexsha.decode("ascii")) from None
        if type_num != want:
            raise GitError(f"object {hexsha.decode('ascii')} has type {type_num}, not {want}")
        return bytes(data)

    def close(self) -> None:
        for fd in self._pack_fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._pack_fds.clear()
        with contextlib.suppress(Exception):  # dulwich caches them; its close() skips them
            for alt in self.store.alternates:
                alt.close()
        self.repo.close()


class GitObjects:
    """A small pool of dulwich repositories: dulwich objects are not thread-safe."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._cond = threading.Condition()
        self._closed = False
        try:
            first = _Handle(path)
        except (NotGitRepository, FileNotFoundError, NotADirectoryError):
            raise GitError(f"{path}: not a git repository") from None
        self._idle = [first]
        self._count = 1
        # for describe(), started on first use: up to DESCRIBERS, so one listing's Python
        # work overlaps another's wait on git
        self._batches: list[Describer] = []
        self._batch_idle: list[Describer] = []
        self._batch_cond = threading.Condition()

    @contextmanager
    def _handle(self) -> Iterator[_Handle]:
        with self._cond:
            while not self._closed and not self._idle and self._count >= GIT_HANDLES:
                self._cond.wait()
            if self._closed:
                raise GitError("the repository was closed")
            handle = self._idle.pop() if self._idle else None
            if handle is None:
                self._count += 1
        if handle is None:
            try:
                handle = _Handle(self._path)
            except BaseException:
                with self._cond:
                    self._count -= 1
                    self._cond.notify()
                raise
        try:
            yield handle
        finally:
            with self._cond:
                if self._closed:
                    handle.close()
                else:
                    self._idle.append(handle)
                self._cond.notify()

    def raw(self, sha: bytes, want: int) -> bytes:
        with self._handle() as h:
            return h.raw(sha.hex().encode("ascii"), want)

    def size(self, sha: bytes) -> int:
        with self._handle() as h:
            return h.size(sha.hex().encode("ascii"), len(sha))

    def describe(
        self, shas: Sequence[bytes], small: tuple[int, int]
    ) -> tuple[list[int], dict[int, bytes]]:
        """Sizes of many blobs (-1: missing, or not a blob) and the content of those whose
        size is within ``small`` (inclusive; keep it small), by index, through one
        long-lived ``git cat-file`` pair, pipelined: for the blobs of a directory listing,
        git does the work on another core and this process only parses its answers."""
        with self._describer() as batch:
            return batch.describe([s.hex() for s in shas], "blob", small)

    @contextmanager
    def _describer(self) -> Iterator[Describer]:
        with self._batch_cond:
            while not self._closed and not self._batch_idle and len(self._batches) >= DESCRIBERS:
                self._batch_cond.wait()
            if self._closed:
                raise GitError("the repository was closed")
            if self._batch_idle:
                batch = self._batch_idle.pop()
            else:  # (Describer starts git on first use, not here)
                batch = Describer(self._path)
                self._batches.append(batch)
        try:
            yield batch
        finally:
            with self._batch_cond:
                self._batch_idle.append(batch)
                self._batch_cond.notify()

    def trees(self, shas: Sequence[bytes]) -> list[bytes | None]:
        """The raw bytes of many trees through the same pipelined ``git cat-file`` as
        :meth:`describe` (None for a missing object or one that is not a tree)."""
        with self._describer() as batch:
            _, found = batch.describe([s.hex() for s in shas], "tree", (0, 1 << 62))
        return [found.get(i) for i in range(len(shas))]

    def small_blob(self, sha: bytes, want: int) -> tuple[int, bytes | None]:
        """A blob's size and, when it has at most ``want`` bytes, its content: both from one
        read of a pack entry or loose object whenever the blob is stored whole."""
        hexsha = sha.hex().encode("ascii")
        with self._handle() as h:
            size, data = h.head(hexsha, len(sha), want)
            if data is None and size <= want:
                data = h.raw(hexsha, OBJ_BLOB)
        return size, data

    def commit(self, hexsha: bytes) -> tuple[bytes, int]:
        """(tree id, committer time in seconds) of a commit, peeling annotated tags."""
        with self._handle() as h:
            for _ in range(16):
                try:
                    obj = h.store[hexsha]
                except KeyError:
                    raise GitObjectNotFoundError(hexsha.decode("ascii")) from None
                if obj.type_name == b"tag":
                    hexsha = obj.object[1]
                    continue
                if obj.type_name != b"commit":
                    kind = obj.type_name.decode("ascii")
                    raise GitError(f"object {hexsha.decode('ascii')} is a {kind}, not a commit")
                return bytes.fromhex(obj.tree.decode("ascii")), int(obj.commit_time)
        raise GitError(f"tag chain at {hexsha.decode('ascii')} is too long")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for h in idle:
            h.close()
        with self._batch_cond:
            batches, self._batches, self._batch_idle = self._batches, [], []
            self._batch_cond.notify_all()
        for batch in batches:
            batch.close()  # (one in use fails its exchange: the repository is closing)
