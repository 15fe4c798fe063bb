"""Import httpx without what it and httpcore load just in case.

httpcore imports ``trio`` and ``anyio`` at import time, for async clients that might run
under them; httpx imports its command-line tool (``httpx._main``: click, rich, pygments)
when click is installed. All of them are here (FUSE mounts run on trio, the server on
anyio, the CLI on typer), so every process that talks HTTP paid for them: ~0.15 s of a
cold start, and trio runs ``ldconfig -p``. gitxet's HTTP clients are all synchronous (no
``httpx.AsyncClient``) and never run httpx's tool.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

UNUSED = ("trio", "anyio", "httpx._main")


@contextlib.contextmanager
def without_unused() -> Iterator[None]:
    """Within: importing one of :data:`UNUSED` fails (unless it was imported already);
    after: they import normally again (a mount daemon imports trio itself)."""
    blocked = [name for name in UNUSED if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        yield
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
