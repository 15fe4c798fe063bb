"""The C background I/O thread (``_bgio``), or None where it was not built.

:class:`Worker` runs ``pread`` s on a pthread that never takes the interpreter lock (see
``_bgio.c``). Local builds may lack it (its users then do that I/O themselves); CI and
release builds insist on it (``GITXET_REQUIRE_NATIVE=1``).
"""

from __future__ import annotations

try:
    from gitxet.util._bgio import Block, Worker
except ImportError:  # pragma: no cover - the extension is built wherever CI runs
    Block = None  # type: ignore[assignment,misc]
    Worker = None  # type: ignore[assignment,misc]

__all__ = ["NATIVE", "Block", "Worker"]

#: the C thread is built
NATIVE = Worker is not None
