"""Advisory file locks so concurrent filter processes, pushes and mounts share a store safely."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from gitxet.errors import StoreError


@contextlib.contextmanager
def file_lock(path: str, *, shared: bool = False, timeout: float = 300.0) -> Iterator[None]:
    """Hold an flock on ``path`` (created if needed); StoreError after ``timeout`` seconds."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        op = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            try:
                fcntl.flock(fd, op | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"timed out after {timeout:.0f}s waiting for lock {path}"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
        yield
    finally:
        os.close(fd)  # closing releases the lock
