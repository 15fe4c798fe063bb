"""Import httpx without the async libraries httpcore loads just in case.

httpcore imports ``trio`` and ``anyio`` at import time, for async clients that might run
under them. Both are installed here (FUSE mounts run on trio, the server on anyio), so
every process that talks HTTP paid for them: ~0.07 s of a cold start, and trio runs
``ldconfig -p``. gitxet's HTTP clients are all synchronous (no ``httpx.AsyncClient``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

ASYNC_LIBRARIES = ("trio", "anyio")


@contextlib.contextmanager
def without_async_libraries() -> Iterator[None]:
    """Within: ``import trio`` / ``import anyio`` fail (unless already imported); after:
    both import normally again (a mount daemon imports trio itself)."""
    blocked = [name for name in ASYNC_LIBRARIES if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        yield
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
