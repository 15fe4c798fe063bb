"""Writing into a git work tree without ever leaving it.

A path that comes from a tree or the index is hostile input. :class:`WorkTree` holds the
work tree open as a directory handle and reaches every path from it one component at a
time (``openat`` with ``O_NOFOLLOW | O_DIRECTORY``), after checking the path against the
rule of :mod:`gitxet.git.paths`: so neither ``../x``, ``/etc/x``, ``.git/config`` nor a
directory that is (or is swapped for) a symlink can make a write land outside the work tree
or in its ``.git``. Files are replaced atomically (:func:`gitxet.util.atomic.atomic_writer_at`)
and created atomically (:func:`gitxet.util.atomic.atomic_creator_at`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

from gitxet.errors import UnsafePathError
from gitxet.git.paths import unsafe_path
from gitxet.util.atomic import atomic_creator_at, atomic_writer_at
from gitxet.util.lru import LeaseCache

__all__ = ["WorkTree"]

#: directory handles a :class:`WorkTree` keeps open for :meth:`WorkTree.create`
KEPT_DIRS = 16
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class WorkTree:
    """A work tree opened once; see the module docstring. Thread-safe; close it after use.

    Paths are ``/``-separated and relative to the work tree's root (as git prints them).
    Every method raises :class:`UnsafePathError` for a path the rule refuses or one that
    leads through a symlink or a non-directory, and ``OSError`` for anything else.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        self._fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # directories :meth:`create` writes into, kept open while files go into them
        self._dirs: LeaseCache[str, int] = LeaseCache(KEPT_DIRS, os.close)

    def close(self) -> None:
        self._dirs.close()  # each closed once no writer uses it
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> WorkTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def parent(self, path: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """``(directory handle, name)`` of ``path``'s last component; with ``create`` the
        missing directories on the way are made (never through a symlink)."""
        parts = self._checked(path)
        fd = self._walk(path, parts, create)
        try:
            yield fd, parts[-1]
        finally:
            if fd != self._fd:
                os.close(fd)

    @staticmethod
    def _checked(path: str) -> list[str]:
        reason = unsafe_path(os.fsencode(path))
        if reason is not None:
            raise UnsafePathError(path, reason)
        return path.split("/")

    def _walk(self, path: str, parts: list[str], create: bool) -> int:
        """The directory holding ``path``'s last component, opened one component at a
        time (the work tree's own handle when that is the top)."""
        fd = self._fd
        try:
            for i, part in enumerate(parts[:-1]):
                fd_next = self._open_dir(fd, part, path, "/".join(parts[: i + 1]), create)
                if fd != self._fd:
                    os.close(fd)
                fd = fd_next
        except BaseException:
            if fd != self._fd:
                os.close(fd)
            raise
        return fd

    @staticmethod
    def _open_dir(fd: int, name: str, path: str, upto: str, create: bool) -> int:
        for attempt in range(2):
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create or attempt:
                    raise
                with contextlib.suppress(FileExistsError):  # a racing creator: fine
                    os.mkdir(name, 0o777, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePathError(path, f"{upto} is a symlink or not a directory") from None
                raise
        raise AssertionError("unreachable")

    def lstat(self, path: str) -> os.stat_result | None:
        """``path``'s own stat (a symlink is not followed), or None when it is missing."""
        try:
            with self.parent(path) as (fd, name):
                return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def read_head(self, path: str, size: int) -> bytes | None:
        """The first ``size`` bytes of the regular file ``path``; None when it is missing or
        not a regular file (a symlink is not followed)."""
        try:
            with self.parent(path) as (dfd, name):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return os.read(fd, size)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def replace(
        self, path: str, *, mode: int, tmp_dir: str | None = None, keep_mode: bool = False
    ) -> Iterator[tuple[BinaryIO, list[os.stat_result]]]:
        """Yield ``(file, out)``: what is written replaces ``path`` atomically (a symlink
        there is replaced, not followed); ``out`` then holds the new file's stat. With
        ``keep_mode`` an existing regular file's permission bits are kept (``mode``
        otherwise), looked up from the same directory handle."""
        out: list[os.stat_result] = []
        with self.parent(path, create=True) as (fd, name):
            if keep_mode:
                with contextlib.suppress(OSError):
                    old = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISREG(old.st_mode):
                        mode = old.st_mode & 0o777
            with atomic_writer_at(fd, name, mode=mode, durable=False, tmp_dir=tmp_dir) as f:
                yield f, out
            out.append(os.stat(name, dir_fd=fd, follow_symlinks=False))

    @contextlib.contextmanager
    def create(self, path: str, *, mode: int) -> Iterator[tuple[BinaryIO, list[os.stat_result]]]:
        """Yield ``(file, out)``: what is written becomes the new file ``path`` once complete
        (missing directories are made; ``out`` then holds its stat). Nothing is replaced:
        ``FileExistsError`` says something is at ``path`` already, and then nothing was
        written there."""
        parts = self._checked(path)
        if len(parts) == 1:
            with atomic_creator_at(self._fd, path, mode=mode) as (f, out):
                yield f, out
            return
        # the directory's handle is kept for the next files into it (a clone writes its
        # files directory by directory): one walk per directory, not one per file
        head = path.rpartition("/")[0]
        with (
            self._dirs.use(head, lambda: self._walk(path, parts, True)) as fd,
            atomic_creator_at(fd, parts[-1], mode=mode) as (f, out),
        ):
            yield f, out
