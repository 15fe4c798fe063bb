"""The one bounded LRU cache (:class:`LRUCache`) and its variant for shared resources.

:class:`LRUCache` is borg's ``LRUCache(dispose=...)`` made thread-safe and weighed: it holds
entries until their total weight (their count, without a weigher) exceeds its capacity, then
evicts the least recently used ones and hands each evicted value to ``dispose``. ``dispose``
runs after the cache's lock is released, so it may do I/O or call back into the cache.

A resource that readers use *outside* the cache's lock (an open file read with ``pread``, a
spool file, a commit filesystem) must not be closed while a reader still holds it, and must
not be closed "a while later" on the assumption that readers are quick. :class:`LeaseCache`
makes that an invariant: every use is a :class:`Lease` taken with :meth:`LeaseCache.acquire`
and given back with :meth:`Lease.release`; a resource is closed exactly once, when it has
been evicted (or the cache closed) *and* its last user has released it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

__all__ = ["LRUCache", "Lease", "LeaseCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRUCache(Generic[K, V]):
    """A thread-safe LRU of at most ``capacity`` total weight.

    Args:
        capacity: the bound on the sum of the entries' weights (> 0).
        weigher: an entry's weight (default 1 each, so ``capacity`` is a count).
        dispose: called with every value the cache drops on its own (evicted, replaced,
            refused as heavier than ``capacity``, cleared); never with a value that
            :meth:`pop` hands back.
    """

    def __init__(
        self,
        capacity: int,
        *,
        weigher: Callable[[V], int] | None = None,
        dispose: Callable[[V], object] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._weigher = weigher
        self._dispose = dispose
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    def _weigh(self, value: V) -> int:
        return self._weigher(value) if self._weigher is not None else 1

    def _drop(self, values: list[V]) -> None:
        if self._dispose is not None:
            for v in values:
                self._dispose(v)

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used), or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def peek(self, key: K) -> V | None:
        """The value of ``key`` without touching its recency."""
        with self._lock:
            item = self._items.get(key)
            return None if item is None else item[0]

    def _evict(self) -> list[V]:
        gone: list[V] = []
        while self._weight > self.capacity:
            _, (v, w) = self._items.popitem(last=False)
            self._weight -= w
            gone.append(v)
        return gone

    def put(self, key: K, value: V) -> bool:
        """Store ``value`` (the cache now owns it); False when heavier than the capacity, in
        which case it is disposed at once."""
        w = self._weigh(value)
        if w > self.capacity:
            self._drop([value])
            return False
        with self._lock:
            old = self._items.pop(key, None)
            gone: list[V] = []
            if old is not None:
                self._weight -= old[1]
                if old[0] is not value:
                    gone.append(old[0])
            self._items[key] = (value, w)
            self._weight += w
            gone += self._evict()
        self._drop(gone)
        return True

    def setdefault(self, key: K, value: V) -> V:
        """The cached value of ``key`` if any (``value`` stays the caller's), else ``value``,
        stored (the cache owns it; it may be disposed at once if heavier than the capacity)."""
        w = self._weigh(value)
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
                return item[0]
            gone: list[V] = []
            if w > self.capacity:
                gone.append(value)
            else:
                self._items[key] = (value, w)
                self._weight += w
                gone += self._evict()
        self._drop(gone)
        return value

    def pop(self, key: K) -> V | None:
        """Remove ``key`` and hand its value back to the caller (not disposed)."""
        with self._lock:
            item = self._items.pop(key, None)
            if item is None:
                return None
            self._weight -= item[1]
            return item[0]

    def discard(self, key: K) -> None:
        """Remove ``key`` and dispose of its value."""
        v = self.pop(key)
        if v is not None:
            self._drop([v])

    def clear(self) -> None:
        """Dispose of every entry."""
        with self._lock:
            gone = [v for v, _ in self._items.values()]
            self._items.clear()
            self._weight = 0
        self._drop(gone)

    def keys(self) -> list[K]:
        """A snapshot of the keys, least recently used first."""
        with self._lock:
            return list(self._items)

    def values(self) -> list[V]:
        """A snapshot of the values, least recently used first."""
        with self._lock:
            return [v for v, _ in self._items.values()]

    @property
    def weight(self) -> int:
        """The total weight held (the count without a weigher)."""
        return self._weight

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items


class Lease(Generic[V]):
    """A shared resource and its users: closed once retired and released by the last one."""

    __slots__ = ("_close", "_closed", "_lock", "_retired", "_users", "value")

    def __init__(self, value: V, close: Callable[[V], object]) -> None:
        self.value = value
        self._close = close
        self._users = 0
        self._retired = False
        self._closed = False
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        """Become a user; False (and not a user) when the resource is closed already."""
        with self._lock:
            if self._closed:
                return False
            self._users += 1
            return True

    def release(self) -> None:
        """Stop being a user; the last user of a retired resource closes it."""
        with self._lock:
            if self._users <= 0:
                raise RuntimeError("lease released more often than acquired")
            self._users -= 1
            close = self._retired and self._users == 0 and not self._closed
            if close:
                self._closed = True
        if close:
            self._close(self.value)

    def retire(self) -> None:
        """No new users from the cache; closed now if unused, else by the last release."""
        with self._lock:
            self._retired = True
            close = self._users == 0 and not self._closed
            if close:
                self._closed = True
        if close:
            self._close(self.value)

    @property
    def users(self) -> int:
        return self._users

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> V:
        return self.value

    def __exit__(self, *exc: object) -> None:
        self.release()


class LeaseCache(Generic[K, V]):
    """A bounded LRU of shared resources, each closed only when evicted *and* unused.

    At most ``capacity`` (weight) resources are cached; the number open at once is that
    plus the evicted ones still held by a user, so it is bounded by the number of
    concurrent users too.

    Args:
        capacity: bound on the cached resources' total weight.
        close: closes a resource (called exactly once per resource, never under a lock).
        weigher: a resource's weight (default 1).
    """

    def __init__(
        self,
        capacity: int,
        close: Callable[[V], object],
        *,
        weigher: Callable[[V], int] | None = None,
    ) -> None:
        self._close = close
        self._lru: LRUCache[K, Lease[V]] = LRUCache(
            capacity,
            weigher=None if weigher is None else (lambda lease: weigher(lease.value)),
            dispose=Lease.retire,
        )
        self._closed = False

    @property
    def capacity(self) -> int:
        return self._lru.capacity

    def get(self, key: K) -> Lease[V] | None:
        """An acquired lease of the cached resource of ``key``, or None (release it)."""
        while True:
            lease = self._lru.get(key)
            if lease is None:
                return None
            if lease.acquire():
                return lease
            # evicted and closed between the lookup and acquire (so no longer cached):
            # look again

    def acquire(self, key: K, open_: Callable[[], V]) -> Lease[V]:
        """An acquired lease of ``key``'s resource, opened with ``open_`` (outside any lock)
        if not cached; the caller must :meth:`Lease.release` it."""
        lease = self.get(key)
        if lease is not None:
            return lease
        return self.add(key, open_())

    def add(self, key: K, value: V) -> Lease[V]:
        """Cache a freshly opened resource and return an acquired lease of it; when another
        thread cached one for ``key`` meanwhile, ``value`` is closed and that one is used."""
        lease = Lease(value, self._close)
        lease.acquire()
        if self._closed:
            lease.retire()  # used once by the caller, then closed
            return lease
        kept = self._lru.setdefault(key, lease)
        if kept is lease:
            return lease
        if not kept.acquire():  # the other one was closed already: use ours, uncached
            lease.retire()
            return lease
        self._close(value)  # never seen by anyone else
        return kept

    @contextmanager
    def use(self, key: K, open_: Callable[[], V]) -> Iterator[V]:
        """``with cache.use(key, open_) as resource:`` acquire and release around a block."""
        lease = self.acquire(key, open_)
        try:
            yield lease.value
        finally:
            lease.release()

    def keys(self) -> list[K]:
        """A snapshot of the cached keys, least recently used first."""
        return self._lru.keys()

    def discard(self, key: K) -> None:
        """Drop ``key`` from the cache (closed once its users are done)."""
        self._lru.discard(key)

    def clear(self) -> None:
        """Retire everything cached (each closed once its users are done); stays usable."""
        self._lru.clear()

    def close(self) -> None:
        """Retire everything cached; later acquisitions are closed when released."""
        self._closed = True
        self._lru.clear()

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: object) -> bool:
        return key in self._lru
