"""Materialization: pointer text in the work tree replaced by content and back, each file
atomically, with git's index told the new stat data (no read back through the filter).

:class:`MaterializedRecords` remembers what was written, so that the filter's clean of an
untouched materialized file returns its pointer without re-chunking it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, cast

from gitxet.errors import (
    GitError,
    GitxetError,
    LocalChangesError,
    MaterializeError,
    UnsafePathError,
)
from gitxet.formats.pointer import Pointer
from gitxet.git import process
from gitxet.git.index import Restat, blob_id, restat_entries
from gitxet.git.paths import unsafe_path
from gitxet.git.worktree import WorkTree
from gitxet.hashing import from_hex
from gitxet.repo.content import Content, Progress
from gitxet.repo.pointers import PointerFile, has_own_changes, try_pointer
from gitxet.store.cas import LocalCAS
from gitxet.util.atomic import atomic_writer, remove_stale_temps
from gitxet.util.streams import write_all_at

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["MaterializedRecords", "Materializer"]


class MaterializedRecords:
    """Files :class:`Materializer` wrote, by path: ``[size, mtime_ns, inode, pointer
    text]``, in ``<store>/materialized.json`` (``<directory>/materialized.json``: a linked
    work tree's own, next to its index). A file with the same stat still holds the content
    it was written with, so its pointer is known without reading it."""

    def __init__(self, cas: LocalCAS, directory: Path | None = None) -> None:
        self._cas = cas
        self.path = (directory or Path(cas.root)) / "materialized.json"
        self._cached: tuple[tuple[int, int, int], dict[str, list[object]]] | None = None

    def remember(self, written: dict[str, list[object]]) -> None:
        """Add ``written`` (path -> record) to the records (under the store's lock)."""
        if not written:
            return
        with self._cas.lock("materialized"):
            records = self._load()
            records.update(written)
            with atomic_writer(str(self.path), durable=False) as f:
                f.write(json.dumps(records).encode())

    def _load(self) -> dict[str, list[object]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def records(self) -> dict[str, list[object]]:
        """The records, parsed again only when the file changed (the filter process asks
        for every file it cleans)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return {}
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        cached = self._cached
        if cached is not None and cached[0] == key:
            return cached[1]
        records = self._load()
        self._cached = (key, records)
        return records

    def pointer_for(self, worktree: Path | None, path: str) -> bytes | None:
        """The pointer of ``path`` when it is a file written from that pointer and not
        touched since (same size, mtime and inode), else None."""
        if not path or worktree is None:
            return None
        rec = self.records().get(path)
        if not isinstance(rec, list) or len(rec) != 4:
            return None
        try:
            with WorkTree(worktree) as wt:
                st = wt.lstat(path)
        except (OSError, UnsafePathError):
            return None
        if st is None or [st.st_size, st.st_mtime_ns, st.st_ino] != rec[:3]:
            return None
        ptr = try_pointer(str(rec[3]).encode())
        return ptr.encode() if ptr is not None and ptr.size == st.st_size else None


class Materializer:
    """Writes pointer files' content into the work tree ``worktree`` of the repository at
    ``git_dir`` (git runs in ``cwd``) and puts pointer text back."""

    def __init__(
        self,
        git_dir: Path,
        worktree: Path | None,
        cwd: str,
        content: Content,
        records: MaterializedRecords,
    ) -> None:
        self.git_dir = git_dir
        self.worktree = worktree
        self.cwd = cwd
        self.content = content
        self.records = records

    def materialize(
        self,
        files: Sequence[PointerFile],
        remote: str | None = None,
        progress: Progress | None = None,
        workers: int | None = None,
        *,
        absent: bool = False,
    ) -> int:
        """Replace pointer text in the work tree by content, atomically per file; returns
        how many files were written.

        Files are written in parallel straight from the local store (no pipe through git),
        then their index entries get the new stat data, so git sees them unchanged without
        reading them back through the filter. Every file that can be written is; if some
        cannot, :class:`MaterializeError` names them afterwards (they stay pointers).

        With ``absent`` the work tree has no file at these paths yet (a clone whose
        checkout left them out: :meth:`XetRepo.checkout_without_pointers`): each is created,
        nothing is looked at first; one found there after all is checked for the user's
        changes and replaced as usual. A file that cannot be written then stays missing.
        """
        if self.worktree is None:
            raise GitError("a bare repository has no work tree to check out into")
        todo = [f for f in files if not f.materialized]
        # a run killed between writing a file and recording its stat leaves git thinking it
        # modified (the index still has the pointer's size): let git check those again
        if not absent:
            self._refresh(self._stat_dirty([f.path for f in files if f.materialized]))
        if not todo:
            return 0
        head = self._head()  # the remotes holding HEAD are asked first
        with contextlib.suppress(GitxetError):
            # one batch fetch; a file whose data cannot be had fails below, by name
            self.content.ensure_local([f.pointer for f in todo], remote, commit=head)
        lock = threading.Lock()
        stopping = threading.Event()

        def advance(n: int) -> None:
            if stopping.is_set():
                raise _Stopped
            if progress is not None:
                with lock:
                    progress(n)

        tmp_dir = self._worktree_tmp_dir()
        modes, failed = self._named_by_index(todo)
        wt = WorkTree(self.worktree)
        if not absent:
            with WorkTree(self.worktree) as seen:  # a file the user changed: never written over
                for f in todo:
                    if f.path in modes and has_own_changes(seen, f.path, f.pointer):
                        del modes[f.path]
                        failed.append((f.path, LocalChangesError(f.path)))
        # A writer checks ``stopping`` and counts itself in ``putting`` under ``gate``
        # before it puts its file in place (renames it), and records it in ``done`` under
        # ``gate`` after; an interrupt sets ``stopping`` and waits for ``putting`` to drain:
        # once stopping, no file is put in place, and every file that was is in ``done``
        # (restated below), however late a writer is (one slow on a loaded machine used to
        # finish after the stop and show modified). The renames themselves run outside the
        # lock: held across them, the lock serialized the writers (~70% of their time was
        # waiting for it in a 5,000-file clone).
        gate = threading.Condition()
        done: dict[str, os.stat_result] = {}
        putting = 0

        def write_one(f: PointerFile) -> tuple[str, os.stat_result]:
            mode = file_mode(modes[f.path])
            if absent:
                try:
                    return put(f, wt.create(f.path, mode=mode))
                except FileExistsError:  # something is there after all: as for any checkout
                    if has_own_changes(wt, f.path, f.pointer):
                        raise LocalChangesError(f.path) from None
            return put(f, wt.replace(f.path, mode=mode, tmp_dir=tmp_dir, keep_mode=True))

        def put(
            f: PointerFile,
            writing: contextlib.AbstractContextManager[tuple[BinaryIO, list[os.stat_result]]],
        ) -> tuple[str, os.stat_result]:
            nonlocal putting
            counted = False
            try:
                with writing as (out, st):
                    self.content.write(
                        f.pointer,
                        cast(BinaryIO, _Counting(out, advance)),
                        remote,
                        commit=head,
                        path=f.path,
                    )
                    out.flush()
                    date_before_index(out.fileno())
                    with gate:
                        if stopping.is_set():
                            raise _Stopped  # the temp file goes; the file stays a pointer
                        putting += 1
                        counted = True
                with gate:
                    done[f.path] = st[0]
            finally:
                if counted:
                    with gate:
                        putting -= 1
                        gate.notify_all()
            return f.path, st[0]

        # file creation is syscall-bound (the GIL is released): one writer more than the cores
        # pays off, but more contend for the GIL (2 cores, a 5,000-file clone: 8 writers
        # 5.5 s, 3 writers 4.8 s, with ~12% of all CPU in futex wake-ups at 8)
        n_workers = workers or max(1, min(8, len(todo), len(os.sched_getaffinity(0)) + 1))
        by_path = {f.path: f for f in todo}
        # in store order: the writers then read each xorb front to back, and it is read
        # ahead of them (8 threads reading parts of one file defeat the kernel's read-ahead)
        ordered, ahead = store_order(self.content.cas, [f for f in todo if f.path in modes])

        def collect(
            finished: Iterable[concurrent.futures.Future[tuple[str, os.stat_result]]],
        ) -> None:
            for fut in finished:
                try:
                    fut.result()  # a file written is in ``done`` already
                except (GitxetError, OSError) as exc:
                    failed.append((futures.pop(fut), exc))
                else:
                    futures.pop(fut)

        futures: dict[concurrent.futures.Future[tuple[str, os.stat_result]], str] = {}
        pool = concurrent.futures.ThreadPoolExecutor(n_workers, "gitxet-materialize")
        try:
            with wt:
                try:
                    for f in ahead.pace(ordered):  # a bounded window in flight
                        while len(futures) >= 4 * n_workers:
                            finished, _ = concurrent.futures.wait(
                                futures, return_when=concurrent.futures.FIRST_COMPLETED
                            )
                            collect(finished)
                        futures[pool.submit(write_one, f)] = f.path
                    collect(list(concurrent.futures.as_completed(list(futures))))
                except BaseException:
                    # interrupted (Ctrl-C): start no file, put no more in place, stop the
                    # writers at their next write (their temp files are removed), keep what
                    # is complete (``done``)
                    with gate:
                        stopping.set()
                        gate.wait_for(lambda: putting == 0, STOP_WAIT)
                    pool.shutdown(wait=False, cancel_futures=True)
                    live = [fut for fut in futures if not fut.cancelled()]
                    concurrent.futures.wait(live, timeout=STOP_WAIT)
                    raise
        finally:
            pool.shutdown(wait=not stopping.is_set())
            # what was written is recorded and restated even when the run is cut short, so
            # git sees those files unchanged and the rest still as the pointers they are
            with gate:  # no writer adds to it any more (all ended, or stopping)
                kept = dict(done)
            written = {
                path: [
                    st.st_size, st.st_mtime_ns, st.st_ino, by_path[path].pointer.encode().decode()
                ]
                for path, st in kept.items()
            }  # fmt: skip
            self.records.remember(written)
            self._restat({path: (by_path[path].pointer, st) for path, st in kept.items()})
        if failed:
            raise MaterializeError(sorted(failed, key=lambda item: item[0]))
        return len(kept)

    def dematerialize(self, files: Sequence[PointerFile]) -> int:
        """Put pointer text back in the work tree (the data stays in the local store);
        returns how many files were rewritten."""
        if self.worktree is None:
            raise GitError("a bare repository has no work tree")
        todo = [f for f in files if f.materialized]
        modes, failed = self._named_by_index(todo)
        tmp_dir = self._worktree_tmp_dir()
        done: list[str] = []
        with WorkTree(self.worktree) as wt:
            for f in todo:
                if f.path not in modes:
                    continue
                mode = file_mode(modes[f.path])
                try:
                    with wt.replace(f.path, mode=mode, tmp_dir=tmp_dir, keep_mode=True) as (
                        out,
                        _st,
                    ):
                        out.write(f.pointer.encode())
                except (GitxetError, OSError) as exc:
                    failed.append((f.path, exc))
                else:
                    done.append(f.path)
        self._refresh(done)
        if failed:
            raise MaterializeError(sorted(failed, key=lambda item: item[0]))
        return len(done)

    def _named_by_index(
        self, files: Sequence[PointerFile]
    ) -> tuple[dict[str, int], list[tuple[str, BaseException]]]:
        """Which of ``files`` may be written: those git's index names, as that very pointer
        blob, at a path the path rule accepts (path -> git mode); the others, refused."""
        index = process.index_files(self.cwd)
        fmt = process.object_format(self.cwd)
        modes: dict[str, int] = {}
        refused: list[tuple[str, BaseException]] = []
        for f in files:
            entry = index.get(f.path)
            reason = unsafe_path(os.fsencode(f.path))
            if reason is None and (
                entry is None or entry[1] != blob_id(f.pointer.encode(), fmt).hex()
            ):
                reason = "git's index does not name this pointer file there"
            if reason is not None or entry is None:
                refused.append((f.path, UnsafePathError(f.path, reason or "")))
            else:
                modes[f.path] = entry[0]
        return modes, refused

    def _head(self) -> str | None:
        try:
            return process.rev_parse(self.cwd, "HEAD")
        except GitError:
            return None

    def _worktree_tmp_dir(self) -> str | None:
        """Where files bound for the work tree are written before their rename: inside the
        git dir, so a killed checkout leaves no stray file in the work tree. Leftovers of
        killed runs are removed here. None when the git dir is on another filesystem."""
        tmp = self.git_dir / "xet" / "tmp"
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            if tmp.stat().st_dev != self.worktree.stat().st_dev:  # type: ignore[union-attr]
                return None
        except OSError:
            return None
        remove_stale_temps(tmp, older_than=600)  # a live writer keeps its temp file fresh
        return str(tmp)

    def _restat(self, files: dict[str, tuple[Pointer, os.stat_result]]) -> None:
        """Tell git's index the new stat of files whose cleaned content is their pointer."""
        if not files:
            return
        fmt = process.object_format(self.cwd)
        want = {
            os.fsencode(path): Restat(blob_id(ptr.encode(), fmt), st)
            for path, (ptr, st) in files.items()
        }
        patched = restat_entries(self.git_dir, want)
        # whatever could not be patched in place (a busy or unusual index), git re-checks
        self._refresh([os.fsdecode(p) for p in want if p not in patched])

    def _stat_dirty(self, paths: Sequence[str]) -> list[str]:
        """Those of ``paths`` whose index stat no longer matches the work tree (no reads)."""
        if not paths:
            return []
        dirty = process.stat_changed(self.cwd)
        return [p for p in paths if p in dirty]

    def _refresh(self, paths: Sequence[str]) -> None:
        # stat info changed but the cleaned content did not: let git re-check it
        process.refresh_index(self.cwd, paths)


def date_before_index(fd: int) -> None:
    """Move a just-written file's mtime back by one second. git takes an index entry whose
    mtime falls in the index file's own second for "racily clean" and compares content
    instead of stat data: the first ``git status`` after a clone or checkout sent every
    file written in its last second back through the clean filter (after a clone of a
    1 GiB file: 0.52 s, the whole file piped to the filter). The index is written after
    the files, so it is dated in a later second; any later change of the file is dated
    later still, so git sees it."""
    st = os.fstat(fd)
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))


def file_mode(git_mode: int) -> int:
    """Permission bits of a new file for git's mode (a rewritten file keeps its own:
    ``WorkTree.replace(keep_mode=True)``)."""
    return 0o755 if git_mode & 0o100 else 0o644


def store_order(cas: LocalCAS, files: list[PointerFile]) -> tuple[list[PointerFile], ReadAhead]:
    """``files`` sorted by where their data is in the local store (xorb, first chunk),
    and a pacer that reads each xorb's needed chunks ahead as the writers reach it."""
    keyed: list[tuple[bytes, int, PointerFile]] = []
    spans: dict[bytes, list[int]] = {}
    for f in files:
        info = cas.file_info(from_hex(f.pointer.xet_hash)) if f.pointer.size else None
        if info is None or not info.terms:
            keyed.append((b"", 0, f))
            continue
        for t in info.terms:
            span = spans.setdefault(t.xorb_hash, [t.chunk_start, t.chunk_end])
            span[0], span[1] = min(span[0], t.chunk_start), max(span[1], t.chunk_end)
        first = info.terms[0]
        keyed.append((first.xorb_hash, first.chunk_start, f))
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [f for _, _, f in keyed], ReadAhead(cas, [k[0] for k in keyed], spans)


class ReadAhead:
    """Hands out files in order and asks the store to read ahead the xorbs the next ones
    need (``LocalCAS.readahead``), at most two xorbs (~128 MiB) ahead of the writers."""

    def __init__(self, cas: LocalCAS, xorbs: list[bytes], spans: dict[bytes, list[int]]) -> None:
        self._cas = cas
        self._xorbs = xorbs
        self._spans = spans
        self._advised: set[bytes] = set()

    def pace(self, files: list[PointerFile]) -> Iterator[PointerFile]:
        """``files`` (in the order they were given to :func:`store_order`), each handed
        out once its xorb and the next one were asked to be read ahead."""
        order = list(dict.fromkeys(x for x in self._xorbs if x))
        where = {x: i for i, x in enumerate(order)}
        for i, f in enumerate(files):
            x = self._xorbs[i]
            if x:
                for y in order[where[x] : where[x] + 2]:  # this xorb and the next one
                    if y not in self._advised:
                        self._advised.add(y)
                        lo, hi = self._spans[y]
                        self._cas.readahead(y, lo, hi)
            yield f


#: Seconds an interrupted materialize waits for its writers to stop (each stops at its next
#: write; one blocked on a server that stopped answering is abandoned).
STOP_WAIT = 5.0


class _Stopped(Exception):
    """The materialize this writer works for was interrupted."""


class _Counting(io.RawIOBase):
    """Writes through to ``out`` and reports each write's size to ``advance``; a new file
    is also written at offsets (``write_at``, from the threads that fetched the data:
    :class:`~gitxet.data.reconstruct.PositionalOut`), one range at a time: the kernel takes
    one file's buffered writes one at a time anyway (ext4 holds the inode lock for each),
    and threads waiting on it spin, ~0.1 s of CPU per GiB taken from the fetch and hash
    threads on two cores; waiting on a lock here they sleep."""

    def __init__(self, out: BinaryIO, advance: Callable[[int], None]) -> None:
        self._out = out
        self._advance = advance
        self._writing = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:  # type: ignore[override]
        n = self._out.write(data)
        self._advance(n)
        return n

    def write_at(self, offset: int, views: Sequence[memoryview]) -> None:
        """Write ``views`` at ``offset`` of the (new, empty) file; thread-safe."""
        fd = self._out.fileno()
        n = sum(len(v) for v in views)
        with self._writing:
            write_all_at(fd, views, offset)
        self._advance(n)
