"""The one atomic file writer: temp file beside the target, optional fsync, rename.

A reader sees the old file, no file, or the complete new file, never a torn one, even if
the writer is killed. With ``durable=True`` (the default) the data is fsynced before the
rename and the directory after it, so that also holds across a power loss; caches that can
be rebuilt pass ``durable=False``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

__all__ = ["atomic_create", "atomic_write", "atomic_writer", "fsync_dir"]

StrPath = str | os.PathLike[str]


def fsync_dir(path: StrPath) -> None:
    """Persist a directory entry change (rename, create) where the platform allows it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(
    path: StrPath,
    *,
    mode: int = 0o644,
    keep_mode: bool = False,
    durable: bool = True,
    tmp_dir: StrPath | None = None,
) -> Iterator[BinaryIO]:
    """Yield a file to write; on success it replaces ``path`` atomically, else it is removed.

    ``mode`` is the new file's permission bits; with ``keep_mode`` an existing file's bits
    win. The temp file goes in ``tmp_dir`` when given (same filesystem as ``path``; a killed
    writer then leaves its debris there, not beside ``path``), else in ``path``'s directory,
    which is created if missing. Raises ``OSError``; callers translate it.
    """
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    if keep_mode:
        with contextlib.suppress(FileNotFoundError):
            mode = os.stat(path).st_mode & 0o7777
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".incomplete", dir=tmp_dir or directory)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        if durable:
            fsync_dir(directory)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write(
    path: StrPath, data: bytes, *, mode: int = 0o644, keep_mode: bool = False, durable: bool = True
) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path, mode=mode, keep_mode=keep_mode, durable=durable) as f:
        f.write(data)


def atomic_create(path: StrPath, data: bytes, *, mode: int = 0o644, durable: bool = True) -> bool:
    """Create ``path`` holding ``data`` unless it exists; returns whether this call created it.

    The data goes to a temp file that is then hard-linked into place: ``link`` fails when
    the name exists, so of concurrent writers exactly one wins and nobody sees a partial file.
    """
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".incomplete", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        if durable:
            fsync_dir(directory)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
