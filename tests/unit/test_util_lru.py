"""The one bounded LRU (gitxet.util.lru): bounds, weights, dispose, and leases."""

from __future__ import annotations

import os
import random
import threading

import pytest

from gitxet.util.lru import Lease, LeaseCache, LRUCache


def test_count_bound_evicts_least_recently_used() -> None:
    gone: list[int] = []
    c: LRUCache[str, int] = LRUCache(2, dispose=gone.append)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # "b" is now the oldest
    c.put("c", 3)
    assert gone == [2] and "b" not in c and len(c) == 2
    assert c.peek("a") == 1 and c.get("zz") is None


def test_weigher_bounds_total_weight_and_refuses_heavy_values() -> None:
    gone: list[bytes] = []
    c: LRUCache[int, bytes] = LRUCache(10, weigher=len, dispose=gone.append)
    for i in range(5):
        c.put(i, b"x" * 4)
    assert c.weight <= 10 and len(c) == 2
    assert c.put(99, b"y" * 11) is False and gone[-1] == b"y" * 11 and 99 not in c
    c.put(3, b"z")  # replacing disposes the old value, and re-weighs
    assert gone[-1] == b"x" * 4 and c.weight == 5


def test_setdefault_pop_discard_clear() -> None:
    gone: list[int] = []
    c: LRUCache[str, int] = LRUCache(3, dispose=gone.append)
    assert c.setdefault("a", 1) == 1
    assert c.setdefault("a", 2) == 1 and gone == []  # 2 stays the caller's
    assert c.pop("a") == 1 and gone == []  # handed back, not disposed
    c.put("b", 2)
    c.discard("b")
    assert gone == [2]
    c.put("c", 3)
    c.put("d", 4)
    c.clear()
    assert sorted(gone) == [2, 3, 4] and len(c) == 0 and c.weight == 0
    with pytest.raises(ValueError):
        LRUCache(0)


def test_dispose_runs_outside_the_lock() -> None:
    c: LRUCache[int, int] = LRUCache(1)
    seen: list[int | None] = []
    c._dispose = lambda v: seen.append(c.get(v))  # would deadlock under the lock
    c.put(1, 1)
    c.put(2, 2)
    assert seen == [None]


def test_lease_closes_once_after_retire_and_last_release() -> None:
    closed: list[str] = []
    lease = Lease("r", closed.append)
    assert lease.acquire() and lease.acquire()
    lease.retire()
    lease.release()
    assert closed == [] and not lease.closed
    lease.release()
    assert closed == ["r"] and lease.closed
    assert not lease.acquire()
    lease.retire()
    assert closed == ["r"]
    with pytest.raises(RuntimeError):
        lease.release()


def test_lease_cache_never_closes_a_held_resource_and_bounds_open_ones() -> None:
    """Many threads, a tiny cache: every resource is closed exactly once, never while a
    user holds it, and the number open stays under capacity + concurrent users."""
    lock = threading.Lock()
    state: dict[int, str] = {}
    users: dict[int, int] = {}
    open_now = [0]
    peak = [0]
    counter = [0]
    errors: list[str] = []

    def open_(key: int) -> int:
        with lock:
            counter[0] += 1
            rid = counter[0]
            state[rid] = "open"
            users[rid] = 0
            open_now[0] += 1
            peak[0] = max(peak[0], open_now[0])
        return rid

    def close(rid: int) -> None:
        with lock:
            if state[rid] != "open":
                errors.append(f"{rid} closed twice")
            if users[rid]:
                errors.append(f"{rid} closed while held by {users[rid]}")
            state[rid] = "closed"
            open_now[0] -= 1

    cache: LeaseCache[int, int] = LeaseCache(4, close)
    threads_n = 8

    def work(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(2000):
            key = rnd.randrange(16)
            with cache.use(key, lambda k=key: open_(k)) as rid:  # type: ignore[misc]
                with lock:
                    if state[rid] != "open":
                        errors.append(f"{rid} used after close")
                    users[rid] += 1
                os.sched_yield()
                with lock:
                    users[rid] -= 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert peak[0] <= 4 + threads_n
    cache.close()
    assert open_now[0] == 0 and all(s == "closed" for s in state.values())


def test_lease_cache_after_close_closes_on_release() -> None:
    closed: list[int] = []
    cache: LeaseCache[str, int] = LeaseCache(2, closed.append)
    held = cache.acquire("a", lambda: 1)
    cache.close()
    assert closed == []  # still held
    held.release()
    assert closed == [1]
    with cache.use("b", lambda: 2) as v:
        assert v == 2
    assert closed == [1, 2]


def test_lease_cache_race_keeps_one_resource() -> None:
    closed: list[int] = []
    cache: LeaseCache[str, int] = LeaseCache(2, closed.append)
    first = cache.add("k", 1)
    second = cache.add("k", 2)  # lost a race: 2 is closed, 1 is shared
    assert second is first and closed == [2] and first.users == 2
    first.release()
    second.release()
    assert cache.get("k") is first
