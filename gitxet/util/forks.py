"""A fork waits for other threads' imports in progress (a before-fork hook, registered when
this module is imported).

Python imports a module under a per-module lock (``importlib._bootstrap._ModuleLock``) held
by the importing thread until the module has run. A fork copies that lock as it is: held, by
a thread the child does not have. The child's first import of that module waits on it for
good. gitxet imports its heavier parts on first use (httpx, keyring, the commit model), so a
DataLoader worker forked while a parent thread opened its first ``xet://`` file hung in the
child's own first read, at ``import keyring``. So ``os.fork`` waits (at most
:data:`FORK_WAIT` seconds) until no other thread holds a module lock.
"""

from __future__ import annotations

import os
import sys
import threading
import time

FORK_WAIT = 10.0  # seconds a fork waits for other threads (imports, SQLite statements); then
# it forks anyway (gitxet.util.sqlite waits as long for its gate)
_POLL = 0.001


def imports_in_progress() -> list[str]:
    """Names of the modules other threads are importing now."""
    bootstrap = sys.modules.get("importlib._bootstrap")
    locks = getattr(bootstrap, "_module_locks", None)
    if not isinstance(locks, dict):
        return []
    me = threading.get_ident()
    busy = []
    for name, ref in list(locks.items()):
        lock = ref() if callable(ref) else None
        owner = getattr(lock, "owner", None)
        if owner is not None and owner != me:
            busy.append(name)
    return busy


def wait_for_imports(timeout: float = FORK_WAIT) -> bool:
    """Wait until no other thread is importing a module (at most ``timeout`` seconds); true
    if none is."""
    deadline = time.monotonic() + timeout
    while imports_in_progress():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL)
    return True


def _before_fork() -> None:
    wait_for_imports()


os.register_at_fork(before=_before_fork)
