"""Read-ahead of the work-tree files a ``git add`` is about to hand the clean filter.

git cleans files one at a time, in the order of their paths, reading each one itself
(cold, from disk) while the filter waits for it: with many small files most of that wait
is the disk's latency per file, which nothing overlaps. :class:`CleanReadahead` is told the
path of each clean request (:meth:`CleanReadahead.saw`) and, on a thread of its own, walks
the work tree in git's path order from there, asking the kernel to start reading the next
files (``POSIX_FADV_WILLNEED``: the pages come into the cache while git reads the files
before them), so git's own read finds them there.

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
from collections.abc import Iterator

__all__ = ["CleanReadahead"]

#: most files read ahead of the last requested one
WINDOW_FILES = 128
#: most bytes read ahead of the last requested one
WINDOW_BYTES = 64 << 20
#: the window after a start or a miss (doubles on each hit)
FIRST_WINDOW = 4

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


class CleanReadahead:
    """Reads ahead (see the module docstring) in the work tree at ``root``; thread-safe.
    :meth:`close` it when the filter conversation ends."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        window_files: int = WINDOW_FILES,
        window_bytes: int = WINDOW_BYTES,
    ) -> None:
        self._root = os.fsencode(root)
        self._max_files = window_files
        self._max_bytes = window_bytes
        self._cond = threading.Condition()
        self._latest: bytes | None = None
        self._closed = False
        self._idle = True
        self._thread: threading.Thread | None = None
        #: files the kernel was asked to read (for tests and statistics)
        self.advised = 0
        #: requests for a file that had been read ahead
        self.hits = 0

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

    def _run(self) -> None:
        ahead: deque[tuple[bytes, int]] = deque()  # read ahead, not requested yet
        ahead_bytes = 0
        window = FIRST_WINDOW
        files: Iterator[bytes] = iter(())
        while True:
            with self._cond:
                while (
                    not self._closed
                    and self._latest is None
                    and (len(ahead) >= window or ahead_bytes >= self._max_bytes)
                ):
                    self._wait_idle()
                if self._closed:
                    return
                latest, self._latest = self._latest, None
            if latest is not None:
                if any(p == latest for p, _ in ahead):
                    self.hits += 1
                    window = min(window * 2, self._max_files)
                    while ahead:
                        p, n = ahead.popleft()
                        ahead_bytes -= n
                        if p == latest:
                            break
                else:  # not what we predicted: start over from there
                    ahead.clear()
                    ahead_bytes = 0
                    window = FIRST_WINDOW
                    files = walk_after(self._root, latest)
                continue
            rel = next(files, None)
            if rel is None:
                with self._cond:  # the walk is over: wait for a request
                    while not self._closed and self._latest is None:
                        self._wait_idle()
                continue
            ahead.append((rel, n := self._advise(rel)))
            ahead_bytes += n

    def _wait_idle(self) -> None:
        self._idle = True
        self._cond.notify_all()
        self._cond.wait()

    def _advise(self, rel: bytes) -> int:
        """Ask the kernel to read ``rel`` into the page cache; its size (0 if unreadable)."""
        try:
            fd = os.open(os.path.join(self._root, rel), _OPEN_FLAGS)
        except OSError:
            return 0
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return 0
            n = min(st.st_size, self._max_bytes)
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, 0, n, os.POSIX_FADV_WILLNEED)
            self.advised += 1
            return n
        finally:
            os.close(fd)
