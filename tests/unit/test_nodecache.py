"""The node cache: ranges on disk, an sqlite index, a cap that holds with many writers."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from gitxet.hashing import chunk_hash
from gitxet.store.nodecache import NodeCache, cache_total


class Lay:
    """A fake xorb: chunks of random sizes, with their hashes and offsets."""

    def __init__(self, seed: int, n: int = 40, size: int = 4096) -> None:
        rnd = random.Random(seed)
        self.chunks = [rnd.randbytes(rnd.randint(size // 2, size)) for _ in range(n)]
        self.chunk_hashes = tuple(chunk_hash(c) for c in self.chunks)
        offs = [0]
        for c in self.chunks:
            offs.append(offs[-1] + len(c))
        self.data_offsets = tuple(offs)
        self.data = b"".join(self.chunks)
        self.xorb = seed.to_bytes(32, "little")

    def put(self, cache: NodeCache, cs: int, ce: int) -> bool:
        return cache.put(self.xorb, cs, ce, self.data_offsets[cs], self.chunks[cs:ce])


def test_put_read_and_ranges_that_meet(tmp_path: Path) -> None:
    lay = Lay(1)
    cache = NodeCache(str(tmp_path / "c"), 1 << 20)
    offs = lay.data_offsets
    assert cache.read(lay.xorb, lay, 0, 10) is None
    assert lay.put(cache, 0, 10) and lay.put(cache, 10, 25)
    assert not lay.put(cache, 2, 5)  # inside a cached range: nothing to store
    assert cache.read(lay.xorb, lay, 5, offs[10]) == lay.data[5 : offs[10]]
    # across the two ranges, and from a second process's view (a new object)
    other = NodeCache(str(tmp_path / "c"), 1 << 20)
    assert other.read(lay.xorb, lay, 100, offs[20]) == lay.data[100 : offs[20]]
    assert other.covers(lay.xorb, 0, offs[25]) and not other.covers(lay.xorb, 0, offs[26])
    assert other.read(lay.xorb, lay, offs[24], offs[26]) is None
    assert cache.total_bytes == offs[25] == cache_total(str(tmp_path / "c"))
    # a bigger range replaces the ranges it contains
    assert lay.put(cache, 0, 30)
    assert cache.total_bytes == offs[30]
    assert len([f for f in (tmp_path / "c" / "data").rglob("*") if f.is_file()]) == 1
    cache.close()
    other.close()


def test_overlapping_ranges_serve_each_byte_once(tmp_path: Path) -> None:
    lay = Lay(6)
    offs = lay.data_offsets
    cache = NodeCache(str(tmp_path / "c"), 1 << 20)
    assert lay.put(cache, 0, 10) and lay.put(cache, 5, 15) and lay.put(cache, 12, 20)
    fresh = NodeCache(str(tmp_path / "c"), 1 << 20)
    for c in (cache, fresh):
        assert c.read(lay.xorb, lay, 3, offs[20]) == lay.data[3 : offs[20]]
        assert c.read(lay.xorb, lay, offs[6], offs[13] + 7) == lay.data[offs[6] : offs[13] + 7]
    cache.close()
    fresh.close()


def test_damaged_or_missing_range_files_are_dropped_never_served(tmp_path: Path) -> None:
    lay = Lay(2)
    root = tmp_path / "c"
    cache = NodeCache(str(root), 1 << 20)
    lay.put(cache, 0, 20)
    lay.put(cache, 20, 40)
    cache.close()
    files = sorted((root / "data").rglob("*.*-*"))
    first = next(f for f in files if f.name.endswith(".0-20"))
    raw = bytearray(first.read_bytes())
    raw[100] ^= 1  # same size, other content
    first.write_bytes(raw)
    next(f for f in files if f.name.endswith(".20-40")).unlink()
    fresh = NodeCache(str(root), 1 << 20)  # a new process verifies what it reads, once
    assert fresh.read(lay.xorb, lay, 0, 200) is None
    assert fresh.read(lay.xorb, lay, lay.data_offsets[25], lay.data_offsets[26]) is None
    assert fresh.total_bytes == 0 and not fresh.covers(lay.xorb, 0, 1)
    assert lay.put(fresh, 0, 20)
    assert fresh.read(lay.xorb, lay, 0, 200) == lay.data[:200]
    fresh.close()


def test_cap_evicts_least_recently_used(tmp_path: Path) -> None:
    lays = [Lay(10 + i, n=10) for i in range(6)]
    one = lays[0].data_offsets[-1]
    cap = max(lay.data_offsets[-1] for lay in lays) * 3 + 10
    cache = NodeCache(str(tmp_path / "c"), cap)
    for lay in lays[:3]:
        assert lay.put(cache, 0, 10)
    assert cache.read(lays[0].xorb, lays[0], 0, one) == lays[0].data  # now the most recent
    cache.flush()
    assert lays[3].put(cache, 0, 10)
    assert cache.total_bytes <= cap
    assert cache.covers(lays[0].xorb, 0, one)  # read recently: kept
    assert not cache.covers(lays[1].xorb, 0, 1)  # the least recently used went
    big = Lay(99, n=40, size=cap // 20)
    assert not big.put(cache, 0, 40)  # bigger than the whole cap: never stored
    cache.close()


def test_opening_does_not_walk_the_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lay = Lay(3)
    cache = NodeCache(str(tmp_path / "c"), 1 << 20)
    lay.put(cache, 0, 40)
    cache.close()
    data_dir = str(tmp_path / "c" / "data")
    listed: list[str] = []
    real_listdir, real_scandir = os.listdir, os.scandir

    def listdir(path: str = ".") -> list[str]:
        listed.append(str(path))
        return real_listdir(path)

    def scandir(path: str = ".") -> object:
        listed.append(str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)
    opened = NodeCache(str(tmp_path / "c"), 1 << 20)
    assert opened.read(lay.xorb, lay, 0, 100) == lay.data[:100]
    opened.close()
    assert not [p for p in listed if p.startswith(data_dir)]


def test_an_evicted_range_still_open_is_read_whole(tmp_path: Path) -> None:
    lay, other = Lay(4), Lay(5)
    cap = max(lay.data_offsets[-1], other.data_offsets[-1]) + 100
    reader = NodeCache(str(tmp_path / "c"), cap)
    writer = NodeCache(str(tmp_path / "c"), cap)
    lay.put(writer, 0, 40)
    assert reader.read(lay.xorb, lay, 0, 10) == lay.data[:10]  # the reader holds it open
    assert other.put(writer, 0, 40)  # evicts the first range (the cap fits one)
    assert not writer.covers(lay.xorb, 0, 1)
    # the reader either still serves the bytes it verified, whole and right, or says miss
    got = reader.read(lay.xorb, lay, 10, 5000)
    assert got is None or got == lay.data[10:5000]
    # the new range may sit where the evicted one sat in the index: never served its bytes
    assert reader.read(other.xorb, other, 0, 5000) == other.data[:5000]
    reader.close()
    writer.close()


def _writer(root: str, cap: int, seed: int, rounds: int) -> None:
    cache = NodeCache(root, cap)
    rnd = random.Random(seed)
    for _ in range(rounds):
        lay = Lay(rnd.randrange(1 << 30), n=8, size=64 << 10)
        assert lay.put(cache, 0, 8) or True
        got = cache.read(lay.xorb, lay, 0, lay.data_offsets[-1])
        assert got is None or got == lay.data  # a range evicted by another writer is a miss
    cache.close()


def test_cap_holds_with_concurrent_writer_processes(tmp_path: Path) -> None:
    root = str(tmp_path / "c")
    cap = 4 << 20
    NodeCache(root, cap).close()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(root, cap, i, 25)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    on_disk = sum(f.stat().st_size for f in (tmp_path / "c" / "data").rglob("*") if f.is_file())
    with sqlite3.connect(os.path.join(root, "index.sqlite")) as db:
        (indexed,) = db.execute("SELECT coalesce(sum(nbytes), 0) FROM ranges").fetchone()
    assert on_disk <= cap and indexed <= cap
    assert cache_total(root) == indexed
    assert not os.listdir(os.path.join(root, "tmp"))


def _put_in_child(cache: NodeCache, seed: int) -> None:
    lay = Lay(seed)
    assert lay.put(cache, 0, 40)
    assert cache.read(lay.xorb, lay, 0, 100) == lay.data[:100]


def test_a_cache_opened_before_a_fork_works_in_the_child(tmp_path: Path) -> None:
    """Mount daemons are forked after the cache was opened: the child's writes must land
    (an sqlite connection used across a fork loses them when the parent closes its own)."""
    cache = NodeCache(str(tmp_path / "c"), 1 << 20)
    assert Lay(7).put(cache, 0, 10)
    child = multiprocessing.get_context("fork").Process(target=_put_in_child, args=(cache, 8))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    cache.close()  # the parent closes its connection after the child wrote
    fresh = NodeCache(str(tmp_path / "c"), 1 << 20)
    lay = Lay(8)
    assert fresh.read(lay.xorb, lay, 0, lay.data_offsets[-1]) == lay.data
    fresh.close()


def test_trim_evicts_least_recently_used_down_to_what_is_kept(tmp_path: Path) -> None:
    lay = Lay(9)
    offs = lay.data_offsets
    root = str(tmp_path / "c")
    cache = NodeCache(root, 1 << 20)
    assert lay.put(cache, 0, 10) and lay.put(cache, 10, 20) and lay.put(cache, 20, 30)
    assert cache.read(lay.xorb, lay, 0, 10) is not None  # the first range is used last
    cache.flush()
    other = NodeCache(root, 1 << 20)  # another process trims (git xet prune --cache)
    size_first = offs[10]
    removed, freed = other.trim(size_first)
    assert (removed, freed) == (2, offs[30] - offs[10])
    assert cache_total(root) == size_first
    assert other.read(lay.xorb, lay, 0, 10) == lay.data[:10]
    assert other.read(lay.xorb, lay, offs[10], offs[10] + 5) is None  # evicted: fetch again
    assert other.trim(0) == (1, size_first) and cache_total(root) == 0
    assert not [f for f in (tmp_path / "c" / "data").rglob("*.*-*") if f.is_file()]
    cache.close()
    other.close()


def test_a_read_across_ranges_with_a_bad_one_is_none_never_partial(tmp_path: Path) -> None:
    lay = Lay(7)
    offs = lay.data_offsets
    root = tmp_path / "c"
    cache = NodeCache(str(root), 1 << 20)
    assert lay.put(cache, 0, 10) and lay.put(cache, 10, 20) and lay.put(cache, 20, 30)
    cache.close()
    fresh = NodeCache(str(root), 1 << 20)  # verifies what it reads, then serves it
    got = fresh.read(lay.xorb, lay, 5, offs[30] - 5)
    assert type(got) is bytes and got == lay.data[5 : offs[30] - 5]
    again = fresh.read(lay.xorb, lay, 7, offs[25])  # verified: read straight into place
    assert again == lay.data[7 : offs[25]]
    fresh.close()
    last = next(f for f in (root / "data").rglob("*.*-*") if f.name.endswith(".20-30"))
    raw = bytearray(last.read_bytes())
    raw[-1] ^= 1
    last.write_bytes(raw)
    other = NodeCache(str(root), 1 << 20)
    assert other.read(lay.xorb, lay, 5, offs[30] - 5) is None
    assert other.read(lay.xorb, lay, 5, offs[20]) == lay.data[5 : offs[20]]
    other.close()


def test_a_range_whose_writer_died_is_stored_again_and_not_counted(tmp_path: Path) -> None:
    # A writer killed (kill -9 of a mount daemon) between reserving a range and publishing
    # it left an unready row behind: every later put of that range was refused ("being
    # written by someone else"), so the node never cached it again, and the index counted
    # its bytes forever. A writer holds its range's temp file locked from before it
    # reserves; a reservation whose lock is gone, or older than the bound, is a dead one's.
    from gitxet.store import nodecache

    lay = Lay(11)
    root = str(tmp_path / "c")
    cache = NodeCache(root, 1 << 20)
    n = lay.data_offsets[10] - lay.data_offsets[0]
    held = cache._open_tmp(lay.xorb, 0, 10)  # a writer takes the range's temp file
    assert held is not None
    assert cache._reserve(lay.xorb, 0, 10, 0, n) is not None  # and reserves the range
    assert not lay.put(cache, 0, 10)  # a live writer's reservation is respected
    os.close(held[0])  # then the writer dies: its lock goes with it
    assert lay.put(cache, 0, 10)  # the dead writer's reservation is taken over
    old = nodecache.time.time() - nodecache.STALE_RESERVATION - 1
    db = sqlite3.connect(os.path.join(root, "index.sqlite"))
    assert cache.read(lay.xorb, lay, 0, n) == lay.data[:n]
    assert cache_total(root) == n
    # one left by a dead writer for a range nobody asks for again: dropped at open
    assert cache._reserve(lay.xorb, 20, 30, lay.data_offsets[20], 1000) is not None
    with db:
        db.execute("UPDATE ranges SET used = ? WHERE ready = 0", (old,))
    cache.close()
    assert cache_total(root) == n + 1000
    NodeCache(root, 1 << 20).close()
    assert cache_total(root) == n
    assert db.execute("SELECT count(*) FROM ranges WHERE ready = 0").fetchone()[0] == 0
    db.close()


def _die_while_writing(root: str, seed: int, conn: object) -> None:
    """Put a range and stop for good in the middle of writing it, once it is reserved."""
    from gitxet.store import nodecache

    def stuck(fd: int, views: object) -> None:
        conn.send("writing")  # type: ignore[attr-defined]
        time.sleep(3600)

    nodecache.write_all = stuck  # type: ignore[assignment]
    lay = Lay(seed)
    lay.put(NodeCache(root, 1 << 20), 0, 10)


def test_a_range_whose_writer_was_killed_is_stored_again_at_once(tmp_path: Path) -> None:
    """A writer killed (kill -9) while writing a range it had reserved made everyone else
    leave that range uncached for two minutes (STALE_RESERVATION): a 'git xet warmup' run
    again right after a killed one said all was verified, and 'mount --offline' then failed
    with EIO. A writer holds a lock on its temp file, which its death drops."""
    root = str(tmp_path / "c")
    NodeCache(root, 1 << 20).close()
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_die_while_writing, args=(root, 12, there))
    child.start()
    assert here.poll(60) and here.recv() == "writing"
    lay = Lay(12)
    cache = NodeCache(root, 1 << 20)
    assert not lay.put(cache, 0, 10)  # a live writer's range is left to it
    os.kill(child.pid, signal.SIGKILL)
    child.join(60)
    n = lay.data_offsets[10]
    assert lay.put(cache, 0, 10)  # taken over at once, not after STALE_RESERVATION
    assert cache.read(lay.xorb, lay, 0, n) == lay.data[:n]
    assert cache_total(root) == n
    cache.close()
    assert not os.listdir(os.path.join(root, "tmp"))  # the dead writer's temp file too


def test_a_range_written_to_after_it_was_hashed_is_hashed_again(tmp_path: Path) -> None:
    # A process hashes a range's chunks once, then serves them with pread: a byte flipped
    # in the file afterwards (by any process) was served as it was, wrong, until it restarted.
    lay = Lay(9)
    cache = NodeCache(str(tmp_path / "c"), 1 << 20)
    assert lay.put(cache, 0, 20)
    (path,) = (tmp_path / "c" / "data").rglob("*.0-20")
    # an mtime no write can give it, so the flip below changes it whatever the clock's grain
    os.utime(path, ns=(10**9, 10**9))
    assert cache.read(lay.xorb, lay, 0, 300) == lay.data[:300]  # hashed again: still right
    with open(path, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    assert cache.read(lay.xorb, lay, 50, 150) is None  # never the flipped byte
    assert not cache.covers(lay.xorb, 0, 1) and not path.exists()
    assert lay.put(cache, 0, 20)
    assert cache.read(lay.xorb, lay, 50, 150) == lay.data[50:150]
    cache.close()


def test_a_cache_deleted_under_a_process_is_opened_again(tmp_path: Path) -> None:
    # `rm -rf` of the cache while a mount runs: its writes went to a deleted index, and,
    # once another process had made the cache again, into files no index counted (never
    # evicted, beyond the cap)
    import shutil

    root = tmp_path / "c"
    lay = Lay(12)
    offs = lay.data_offsets
    mount = NodeCache(str(root), 1 << 20)
    assert lay.put(mount, 0, 10)
    shutil.rmtree(root)
    other = NodeCache(str(root), 1 << 20)  # another process makes the cache again
    assert lay.put(mount, 10, 20)
    assert other.read(lay.xorb, lay, offs[10], offs[20]) == lay.data[offs[10] : offs[20]]
    on_disk = sum(f.stat().st_size for f in (root / "data").rglob("*") if f.is_file())
    assert on_disk == offs[20] - offs[10] == cache_total(str(root)) == other.total_bytes
    assert mount.read(lay.xorb, lay, 0, offs[3]) is None  # (gone with the directory)
    assert mount.read(lay.xorb, lay, offs[12], offs[15]) == lay.data[offs[12] : offs[15]]
    other.close()
    # and alone: the process makes the cache again itself
    shutil.rmtree(root)
    assert lay.put(mount, 20, 30)
    assert cache_total(str(root)) == offs[30] - offs[20]
    fresh = NodeCache(str(root), 1 << 20)
    assert fresh.read(lay.xorb, lay, offs[21], offs[22]) == lay.data[offs[21] : offs[22]]
    fresh.close()
    mount.close()
