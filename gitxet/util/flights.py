"""Single flight: concurrent computations of the same key collapse into one.

The first caller of :meth:`Flights.run` for a key computes; callers that arrive while it
runs wait and get its result (or its exception). Nothing is remembered afterwards: caching
the result is the caller's business.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["Flights"]

T = TypeVar("T")


class Flights:
    """Collapses concurrent computations of the same key into one (the others wait)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[Hashable, Future[Any]] = {}

    def run(self, key: Hashable, fn: Callable[[], T]) -> T:
        """``fn()``, or the result of the call of it already running for ``key``."""
        with self._lock:
            fut = self._running.get(key)
            owner = fut is None
            if fut is None:
                fut = self._running[key] = Future()
        if not owner:
            result: T = fut.result()
            return result
        try:
            value = fn()
        except BaseException as exc:
            fut.set_exception(exc)
            raise
        else:
            fut.set_result(value)
            return value
        finally:
            with self._lock:
                del self._running[key]
