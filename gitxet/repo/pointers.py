"""Pointer blobs in git's objects: recognising them and finding them in trees, the index
and history (one pipelined ``cat-file`` per listing, never a round trip per blob)."""

from __future__ import annotations

import contextlib
import fnmatch
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gitxet.errors import GitObjectNotFoundError, PointerFormatError, UnsafePathError
from gitxet.formats.pointer import MAX_POINTER_SIZE, Pointer
from gitxet.git import process
from gitxet.git.catfile import batch_read
from gitxet.git.checkattr import xet_filtered
from gitxet.git.paths import unsafe_path
from gitxet.git.worktree import WorkTree
from gitxet.git.xetconfig import is_never_pointer

__all__ = [
    "PointerFile",
    "history_pointers",
    "is_materialized",
    "paths_in_history",
    "pointer_files",
    "read_pointer_blobs",
    "received_pointers",
    "try_pointer",
]


@dataclass(frozen=True, slots=True)
class PointerFile:
    """A pointer blob at a path of a tree or the index."""

    path: str
    pointer: Pointer
    materialized: bool | None  # None: not checked (bare repo or another revision)


def try_pointer(data: bytes) -> Pointer | None:
    """The pointer ``data`` encodes, or None when it is anything else."""
    if len(data) > MAX_POINTER_SIZE:
        return None
    try:
        return Pointer.decode(data)
    except PointerFormatError:
        return None


def read_pointer_blobs(
    cwd: str | os.PathLike[str], oids: Sequence[tuple[str, bytes]]
) -> Iterator[tuple[bytes, Pointer]]:
    """``(path, pointer)`` for each ``(blob id, path)`` whose blob is a pointer.

    Raises:
        GitObjectNotFoundError: a blob id the repository lacks.
    """
    if not oids:
        return
    # one pipelined cat-file for all of them: no round trip per blob, and each distinct
    # blob read and parsed once (a tree of 100,000 copies of one file: one read)
    unique = list(dict.fromkeys(oid for oid, _ in oids))
    found: dict[str, Pointer | None] = {}
    for oid, info, data in batch_read(cwd, unique, MAX_POINTER_SIZE):
        if info is None:
            raise GitObjectNotFoundError(oid)
        found[oid] = try_pointer(data) if info.type == "blob" and data else None
    for oid, path in oids:
        ptr = found[oid]
        if ptr is not None:
            yield path, ptr


def _one_per_file(found: Iterator[tuple[bytes, Pointer]]) -> list[tuple[str, Pointer]]:
    seen: dict[str, tuple[str, Pointer]] = {}
    for path, ptr in found:
        seen.setdefault(ptr.xet_hash, (os.fsdecode(path), ptr))
    return list(seen.values())


def received_pointers(git_dir: str, tips: Sequence[str]) -> list[tuple[str, Pointer]]:
    """``(path, pointer)`` of the pointer blobs ``tips`` reach and no ref does, one per file.

    That is what a push adds, asked from a pre-receive hook (git makes the pushed objects
    visible to it before any ref moves). Paths are rev-list's hints, for messages.
    """
    if not tips:
        return []
    blobs = [(b.oid, b.path) for b in process.small_blobs(git_dir, tips, exclude_refs=True)]
    return _one_per_file(read_pointer_blobs(git_dir, blobs))


def history_pointers(cwd: str, revs: Sequence[str]) -> list[tuple[str, Pointer]]:
    """(path, pointer) of every pointer blob reachable from ``revs``, one per file."""
    if not revs:
        return []
    blobs = [(b.oid, b.path) for b in process.small_blobs(cwd, revs)]
    return _one_per_file(read_pointer_blobs(cwd, blobs))


def paths_in_history(
    cwd: str, revs: Sequence[str], exclude: Sequence[str] = (), remote: str | None = None
) -> list[tuple[str, Pointer]]:
    """(path, pointer) of the pointer blobs in commits ``revs`` that ``exclude`` and
    ``refs/remotes/<remote>`` lack (what a push sends). ``exclude`` may name commits this
    repository lacks (a remote's tip nobody fetched here): those are skipped."""
    found = process.small_blobs(cwd, revs, exclude, remote, ignore_missing=bool(exclude))
    blobs = [(b.oid, b.path) for b in found]
    return [(os.fsdecode(p), ptr) for p, ptr in read_pointer_blobs(cwd, blobs)]


def pointer_files(
    cwd: str, worktree: Path | None, rev: str | None = "HEAD", paths: Sequence[str] = ()
) -> list[PointerFile]:
    """Pointer files of a revision (or of the index when ``rev`` is None: only those git's
    checkout sends through the xet filter), limited to the pathspecs ``paths``; whether
    each is materialized is checked in ``worktree`` (None: not checked). A hostile tree's
    unsafe paths (``.git/x``, ``../x``) are never listed, nor the files git reads itself
    (``.gitmodules``...: never written as content)."""
    entries: list[tuple[str, bytes]] = []
    if rev is None:
        index = process.index_files(cwd, paths)
        entries = [(oid, os.fsencode(path)) for path, (_mode, oid) in index.items()]
    else:
        for e in process.iter_ls_tree(cwd, rev, recursive=True):
            if e.type == "blob" and e.mode in (0o100644, 0o100755):
                if paths and not any(_matches(e.path, p) for p in paths):
                    continue
                if unsafe_path(e.path) is not None:
                    continue  # a hostile tree's '.git/x', '../x': never a file of ours
                if e.size is not None and e.size <= MAX_POINTER_SIZE:
                    entries.append((e.oid, e.path))
    sizes = process.blob_sizes(cwd, list(dict.fromkeys(oid for oid, _ in entries)))
    small = [
        (oid, path)
        for oid, path in entries
        if sizes.get(oid, MAX_POINTER_SIZE + 1) <= MAX_POINTER_SIZE
    ]
    found = [
        (p, ptr)
        for p, ptr in ((os.fsdecode(path), ptr) for path, ptr in read_pointer_blobs(cwd, small))
        if not is_never_pointer(p)  # git reads it itself: its text stays (a hostile .gitmodules)
    ]
    if rev is None:  # what git checks out: pointer text where the xet filter does not apply
        filtered = xet_filtered(cwd, [p for p, _ in found])
        found = [(p, ptr) for p, ptr in found if p in filtered]
    result: list[PointerFile] = []
    with contextlib.ExitStack() as stack:
        wt = stack.enter_context(WorkTree(worktree)) if worktree is not None else None
        for p, ptr in found:
            result.append(PointerFile(p, ptr, is_materialized(wt, p, ptr)))
    return result


def is_materialized(wt: WorkTree | None, path: str, ptr: Pointer) -> bool | None:
    """Whether ``path`` in the work tree holds the content (not the pointer text): a
    regular file of the pointer's size that is not itself a pointer; None without a
    work tree."""
    if wt is None:
        return None
    try:
        st = wt.lstat(path)
        if st is None or not stat.S_ISREG(st.st_mode):
            return False
        if st.st_size <= MAX_POINTER_SIZE:
            head = wt.read_head(path, MAX_POINTER_SIZE + 1)
            if head is None or try_pointer(head) is not None:
                return False
    except (UnsafePathError, OSError):
        # materialize() refuses it, by name; a name the file system cannot hold (too long)
        # or a file this user cannot read is no content either
        return False
    return st.st_size == ptr.size


def has_own_changes(wt: WorkTree, path: str, ptr: Pointer) -> bool:
    """Whether ``path`` in the work tree is a regular file holding something else than its
    pointer text or content (a different size, not a pointer): the user's changes, which a
    checkout must not write over. A missing file, or one that cannot be read, has none.

    A file of its content's size, or of its pointer text's, is taken as unchanged without a
    read (a clone checks every pointer git just wrote: one ``lstat`` each, not a read)."""
    try:
        st = wt.lstat(path)
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_size == ptr.size:
            return False
        if st.st_size == len(ptr.encode()):
            return False
        if st.st_size > MAX_POINTER_SIZE:
            return True
        head = wt.read_head(path, MAX_POINTER_SIZE + 1)
    except (UnsafePathError, OSError):
        return False  # materialize() refuses it, by name
    return head is not None and try_pointer(head) is None


def _matches(path: bytes, pattern: str) -> bool:
    p = os.fsdecode(path)
    pat = pattern.rstrip("/")
    return p == pat or p.startswith(pat + "/") or fnmatch.fnmatch(p, pattern)
