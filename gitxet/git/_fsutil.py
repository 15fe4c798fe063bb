"""Atomic file replacement for the small files the git edge edits (.gitattributes, hooks)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from gitxet.errors import GitError


def atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data``: temp file in the same directory, fsync, rename.

    A reader (git, or a crash) sees the old file or the new one, never a mix. ``mode``
    is applied to the new file; pass the old file's mode to keep it.
    """
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise GitError(f"cannot write {path}: {exc}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise GitError(f"cannot write {path}: {exc}") from exc
    # Make the rename itself durable; not every platform or filesystem allows this.
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def existing_mode(path: Path, default: int) -> int:
    """Permission bits of ``path`` if it exists, else ``default``."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        return default
