"""Crash-safe file writes: temp file in the same directory, fsync, rename, fsync the directory.

A reader therefore sees either the old file, no file, or the complete new file — never a
torn one, even if the writer is killed or the machine loses power.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import BinaryIO


def fsync_dir(path: str) -> None:
    """Persist a directory entry change (rename/create) where the platform allows it."""
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
    path: str, *, mode: int = 0o644, durable: bool = True, tmp_dir: str | None = None
) -> Iterator[BinaryIO]:
    """Yield a file to write; on success it replaces ``path`` atomically, else it is removed.

    The temp file goes in ``tmp_dir`` when given (it must be on the same filesystem as
    ``path``; a killed writer then leaves its debris there, not beside ``path``), else in
    ``path``'s own directory.
    """
    directory = os.path.dirname(path) or "."
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


def atomic_write(path: str, data: bytes, *, mode: int = 0o644, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_writer(path, mode=mode, durable=durable) as f:
        f.write(data)
