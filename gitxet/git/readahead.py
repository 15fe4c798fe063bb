"""Read-ahead of the work-tree files a ``git add`` is about to hand the clean filter.

git cleans files one at a time, in the order of their paths, reading each one itself
(cold, from disk) while the filter waits for it: with many small files most of that wait
is the disk's latency per file, which nothing overlaps. :class:`CleanReadahead` is told the
path of each clean request (:meth:`CleanReadahead.saw`) and, on a thread of its own, walks
the work tree in git's path order from there, asking the kernel to start reading the next
files (``POSIX_FADV_WILLNEED``: the pages come into the cache while git reads the files
before them), so git's own read finds them there. A ``told`` function hears of the files
read ahead, in batches (the filter asks ``git check-attr`` about them before git does).

With a ``prepare`` function, the same thread also reads the first few small files of its
window and computes ``prepare(content)`` (the filter's chunking and hashing) on the other
core while git is still busy with the files before them; :meth:`CleanReadahead.take` hands
that result over only if the content git sent is byte for byte the content prepared (a
file changed in between is prepared again by the filter itself). It prepares only while
the results are taken: after :data:`PREPARE_UNUSED` unused ones in a row it stops until the
next :meth:`~CleanReadahead.take`.

Only a hint, bounded and self-correcting: it reads ahead at most :data:`WINDOW_FILES`
files and :data:`WINDOW_BYTES` bytes, starts with a small window that doubles while git
asks for the files it predicted, and falls back to the small window from the requested
path whenever git asks for one it did not predict (a ``git add`` of a few changed files
in a big tree costs a few small windows). It only opens regular files (never follows a
symlink, never blocks on a FIFO), never reads a byte itself, and skips ``.git``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["CleanReadahead", "walk_after"]

#: most files read ahead of the last requested one
WINDOW_FILES = 128
#: most bytes read ahead of the last requested one
WINDOW_BYTES = 64 << 20
#: the window after a start or a miss (doubles on each hit)
FIRST_WINDOW = 4
#: files prepared at most this far ahead of the last requested one ...
PREPARE_FILES = 32
#: ... holding at most this many bytes of content
PREPARE_BYTES = 16 << 20
#: files bigger than this are not prepared
PREPARE_MAX = 1 << 20
#: prepared results dropped unused in a row before preparing stops
PREPARE_UNUSED = 32

T = TypeVar("T")

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


def walk_after(root: bytes, start: bytes) -> Iterator[bytes]:
    """The regular files under ``root`` (relative, ``/``-separated) whose path sorts after
    ``start``, in git's order (paths compared as bytes, a directory as its name and ``/``);
    ``.git`` at the top is skipped, symlinks are not followed."""

    def walk(prefix: bytes) -> Iterator[bytes]:
        try:
            with os.scandir(os.path.join(root, prefix) if prefix else root) as it:
                entries = []
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        entries.append((prefix + e.name + b"/", True))
                    elif e.is_file(follow_symlinks=False):
                        entries.append((prefix + e.name, False))
        except OSError:
            return
        entries.sort()
        for rel, is_dir in entries:
            if is_dir:
                # every path under rel sorts before start when start is past rel and not in it
                if rel == b".git/" or (start > rel and not start.startswith(rel)):
                    continue
                yield from walk(rel)
            elif rel > start:
                yield rel

    return walk(b"")


class _Ahead(Generic[T]):
    """A file read ahead: its path, the bytes advised, and once prepared its content and
    what ``prepare`` made of it."""

    __slots__ = ("data", "prepared", "rel", "size", "tried")

    def __init__(self, rel: bytes, size: int) -> None:
        self.rel = rel
        self.size = size
        self.tried = False
        self.data: bytes | None = None
        self.prepared: T | None = None


class CleanReadahead(Generic[T]):
    """Reads ahead (see the module docstring) in the work tree at ``root``; thread-safe.
    :meth:`close` it when the filter conversation ends."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        prepare: Callable[[bytes], T] | None = None,
        told: Callable[[list[tuple[str, int]]], object] | None = None,
        window_files: int = WINDOW_FILES,
        window_bytes: int = WINDOW_BYTES,
    ) -> None:
        self._root = os.fsencode(root)
        self._prepare = prepare
        self._told = told
        self._fresh: list[tuple[str, int]] = []  # read ahead, not told yet
        self._max_files = window_files
        self._max_bytes = window_bytes
        self._cond = threading.Condition()
        # all below under _cond
        self._latest: bytes | None = None
        self._closed = False
        self._idle = True
        self._ahead: deque[_Ahead[T]] = deque()  # read ahead; [0] may be the current request
        self._ahead_bytes = 0
        self._prepared_bytes = 0
        self._window = FIRST_WINDOW
        self._walk_done = True
        self._preparing = False  # results are being taken
        self._unused = 0  # prepared results dropped untaken, in a row
        self._thread: threading.Thread | None = None
        #: files the kernel was asked to read (for tests and statistics)
        self.advised = 0
        #: requests for a file that had been read ahead
        self.hits = 0
        #: files prepared, and prepared results taken
        self.prepared = 0
        self.taken = 0

    def saw(self, path: str) -> None:
        """git asked to clean ``path`` (relative to the work tree): read on from there."""
        with self._cond:
            if self._closed:
                return
            self._latest = os.fsencode(path)
            self._idle = False
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="gitxet-readahead", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def take(self, path: str, data: bytes) -> T | None:
        """What ``prepare`` made of ``path``'s content, if it prepared exactly ``data``; a
        call also asks for the next files to be prepared."""
        rel = os.fsencode(path)
        with self._cond:
            if not self._preparing:
                self._preparing = True
                self._idle = self._thread is None
                self._cond.notify_all()
            for e in self._ahead:
                if e.rel != rel:
                    continue
                got, prepared = e.data, e.prepared
                if got is None or prepared is None:
                    return None
                self._forget_locked(e)
                if got != data:
                    return None
                self._unused = 0
                self.taken += 1
                return prepared
        return None

    def settled(self, timeout: float) -> bool:
        """Wait until the thread has nothing left to do (its window full, or the walk
        over) or ``timeout`` seconds; whether it settled (for tests)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._idle or self._closed, timeout)

    def close(self) -> None:
        """Stop reading ahead (waits for the thread's current file)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        self._ahead.clear()

    # ---- the thread (state under _cond; file work outside it) ----------------------------

    def _forget_locked(self, e: _Ahead[T]) -> None:
        if e.data is not None:
            self._prepared_bytes -= len(e.data)
        e.data = e.prepared = None

    def _drop_locked(self) -> None:
        e = self._ahead.popleft()
        self._ahead_bytes -= e.size
        if e.prepared is not None:
            self._unused += 1
            if self._unused >= PREPARE_UNUSED:
                self._preparing = False
        self._forget_locked(e)

    def _seen_locked(self, latest: bytes) -> bool:
        """Account for a request; True when the walk must start over from it."""
        if any(e.rel == latest for e in self._ahead):
            self.hits += 1
            self._window = min(self._window * 2, self._max_files)
            while self._ahead[0].rel != latest:
                self._drop_locked()
            return False
        while self._ahead:
            self._drop_locked()
        self._fresh.clear()
        self._window = FIRST_WINDOW
        self._walk_done = False
        return True

    def _to_prepare_locked(self) -> _Ahead[T] | None:
        if self._prepare is None or not self._preparing:
            return None
        for i, e in enumerate(self._ahead):
            if i >= PREPARE_FILES or self._prepared_bytes + e.size > PREPARE_BYTES:
                return None
            if not e.tried and e.size <= PREPARE_MAX:
                return e
        return None

    def _advise_more_locked(self) -> bool:
        return (
            not self._walk_done
            and len(self._ahead) < self._window
            and self._ahead_bytes < self._max_bytes
        )

    def _run(self) -> None:
        files: Iterator[bytes] = iter(())
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    if self._latest is not None:
                        latest, self._latest = self._latest, None
                        if self._seen_locked(latest):
                            files = walk_after(self._root, latest)
                        continue
                    advise = self._advise_more_locked()
                    fresh: list[tuple[str, int]] = []
                    if not advise and self._fresh:
                        fresh, self._fresh = self._fresh, []
                        break
                    todo = None if advise else self._to_prepare_locked()
                    if advise or todo is not None:
                        break
                    self._idle = True
                    self._cond.notify_all()
                    self._cond.wait()
                if todo is not None:
                    todo.tried = True
            if fresh:
                if self._told is not None:
                    with contextlib.suppress(Exception):  # only a hint
                        self._told(fresh)
                continue
            if todo is not None:
                self._prepare_one(todo)
                continue
            rel = next(files, None)
            n = 0 if rel is None else self._advise(rel)
            with self._cond:
                if rel is None:
                    self._walk_done = True
                else:
                    self._ahead.append(_Ahead(rel, n))
                    self._ahead_bytes += n
                    if self._told is not None:
                        self._fresh.append((os.fsdecode(rel), n))

    def _advise(self, rel: bytes) -> int:
        """Ask the kernel to read ``rel`` into the page cache; its size (0 if unreadable)."""
        fd = self._open(rel)
        if fd is None:
            return 0
        try:
            n = min(os.fstat(fd).st_size, self._max_bytes)
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, 0, n, os.POSIX_FADV_WILLNEED)
            self.advised += 1
            return n
        finally:
            os.close(fd)

    def _open(self, rel: bytes) -> int | None:
        """A descriptor of the regular file ``rel``, or None."""
        try:
            fd = os.open(os.path.join(self._root, rel), _OPEN_FLAGS)
        except OSError:
            return None
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
        except OSError:
            pass
        os.close(fd)
        return None

    def _prepare_one(self, e: _Ahead[T]) -> None:
        assert self._prepare is not None
        fd = self._open(e.rel)
        if fd is None:
            return
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(PREPARE_MAX + 1)
        except OSError:
            return
        finally:
            os.close(fd)
        if len(data) > PREPARE_MAX:
            return
        prepared = self._prepare(data)
        self.prepared += 1
        with self._cond:
            if any(x is e for x in self._ahead):  # still ahead of git
                e.data, e.prepared = data, prepared
                self._prepared_bytes += len(data)
