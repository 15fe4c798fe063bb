"""The node cache: verified xorb ranges on disk, shared by every reader on the machine.

Every mount, ``xet://`` reader and checkout of an http(s) repository on a machine reads
through one cache directory (``--cache-dir``). Its unit is a *range*: the decoded bytes of
the consecutive chunks ``[cs, ce)`` of one xorb, in one file, exactly as a fetch brought
them. A read of data the cache holds is one ``pread`` of exactly the bytes asked for.

Layout under ``root``::

    index.sqlite                    one row per range: xorb, chunks, bytes, last use; the total
    data/<xx>/<xorb hex>.<cs>-<ce>  the decoded bytes of chunks [cs, ce)
    tmp/                            ranges being written

How it stays fast and bounded with many processes at once:

* **Opening is O(1)**: the index is sqlite (WAL); nothing walks the directory tree.
* **The cap holds under concurrent writers**: a writer *reserves* its range's bytes in the
  index before it writes the file, evicting least recently used ranges in the same
  transaction, so the bytes the index counts (ranges written plus ranges being written)
  never exceed the cap, however many processes write.
* **Eviction cost does not grow with the cache**: victims come from an index on last use.
* **A killed writer leaves nothing that sticks**: a writer holds a lock on its range's temp
  file (``tmp/r<row>``) from moments after reserving it until it publishes it; a range
  reserved whose temp file nobody holds, or still unwritten after
  :data:`STALE_RESERVATION`, is a dead writer's (``kill -9`` of a mount daemon): the next
  writer of that range takes it over at once, and opening the cache stops counting the rest.
* **Last use is approximate**: hits are remembered in memory and written in one
  transaction every few seconds, so a read never writes to the index.
* **Integrity**: a range is written only from chunks verified against their hashes. A
  process hashes each chunk of a range file once, the first time it reads it through its
  open descriptor (the file could have been damaged since: a crash, a disk), and then
  serves it with plain ``pread`` calls, as long as the file's mtime and ctime stay what they
  were when it was hashed (one ``fstat`` per read): a file written to since is hashed again.
  A range whose file is missing, short or fails its hashes is dropped, and the caller
  fetches the data again.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gitxet.errors import StoreError
from gitxet.hashing import chunk_hash, to_hex
from gitxet.settings import DEFAULT_CACHE_BYTES
from gitxet.util import sqlite
from gitxet.util.atomic import claim_temp, temp_writer_alive
from gitxet.util.lru import Lease, LeaseCache, LRUCache
from gitxet.util.memory import filled_bytes
from gitxet.util.streams import write_all

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ranges (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: processes key open files by it
    xorb BLOB NOT NULL,
    cs INTEGER NOT NULL,
    ce INTEGER NOT NULL,
    dlo INTEGER NOT NULL,
    nbytes INTEGER NOT NULL,
    ready INTEGER NOT NULL,
    used REAL NOT NULL,
    UNIQUE (xorb, cs, ce)
);
CREATE INDEX IF NOT EXISTS ranges_used ON ranges (used);
CREATE INDEX IF NOT EXISTS ranges_unready ON ranges (used) WHERE ready = 0;
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);
INSERT OR IGNORE INTO meta (k, v) VALUES ('total', 0);
"""

#: how often remembered hits are written to the index (seconds)
TOUCH_INTERVAL = 2.0
#: range files a process keeps open
OPEN_FILES = 64
#: temp files older than this are debris of killed writers (seconds)
STALE_TMP = 3600.0
#: a range reserved this long ago and still not written is a killed writer's (seconds):
#: its bytes stop counting and the range may be written again (a live writer that slow
#: only loses its write: publishing finds its row gone)
STALE_RESERVATION = 120.0


def _drop_tmp(fd: int, name: str) -> None:
    """Close and remove a temp file that will not be published."""
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)


class ChunkLayout(Protocol):
    """What the cache needs to know of a xorb to verify its chunks."""

    @property
    def chunk_hashes(self) -> tuple[bytes, ...]: ...

    @property
    def data_offsets(self) -> tuple[int, ...]: ...


@dataclass(slots=True)
class _Range:
    """A ready range this process knows of."""

    rowid: int
    cs: int
    ce: int
    dlo: int
    dhi: int


@dataclass(slots=True)
class _Open:
    """An open range file: the descriptor, which of its chunks were hashed through it, and
    the file's (mtime, ctime) then: a write to the file since (a damaged or tampered range)
    changes them, and its chunks are hashed again before they are served."""

    fd: int
    verified: bytearray
    stamp: tuple[int, int] = field(default=(0, 0))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


@dataclass(frozen=True, slots=True)
class CacheStats:
    """What this process's cache object saw."""

    hits: int
    misses: int
    stored_bytes: int
    total_bytes: int


def cache_total(root: str) -> int:
    """Bytes the node cache at ``root`` holds, from its index (0 when there is none)."""
    path = os.path.join(root, "index.sqlite")
    if not os.path.exists(path):
        return 0
    try:
        conn = sqlite.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute("SELECT v FROM meta WHERE k = 'total'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return 0
    return int(row[0]) if row else 0


class NodeCache:
    """Verified decoded xorb ranges on disk, capped at ``max_bytes``; safe across processes."""

    def __init__(self, root: str, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.root = os.path.abspath(root)
        self.max_bytes = max(0, max_bytes)
        self._data = os.path.join(self.root, "data")
        self._tmp = os.path.join(self.root, "tmp")
        try:
            os.makedirs(self._data, mode=0o700, exist_ok=True)
            os.makedirs(self._tmp, mode=0o700, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot open the cache at {self.root}: {e}") from None
        self._start()
        self.hits = 0
        self.misses = 0
        self.hit_bytes = 0  # decoded bytes served by read()
        self.stored_bytes = 0
        self._sweep_tmp()
        self._drop_stale_reservations()

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite.connect(
                os.path.join(self.root, "index.sqlite"),
                timeout=60,
                isolation_level=None,
                check_same_thread=False,
            )
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the cache at {self.root}: {e}") from None
        return db

    def _index_id(self) -> tuple[int, int] | None:
        """(device, inode) of the index file now, or None when it is gone."""
        try:
            st = os.stat(os.path.join(self.root, "index.sqlite"))
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _start(self) -> None:
        """This process's connection and state (again in a forked child: an sqlite
        connection must not cross a fork, and locks may have been held by other threads)."""
        self._pid = os.getpid()
        self._db_conn = self._connect()
        self._opened_index = self._index_id()
        self._db_lock = threading.Lock()
        self._lock = threading.Lock()  # guards the dicts below; never held during I/O
        self._known: LRUCache[bytes, list[_Range]] = LRUCache(4096)
        # open range files, by row id: closed once evicted (or forgotten) *and* no read
        # holds them, so a descriptor is never closed, and its number reused, under a pread
        self._open: LeaseCache[int, _Open] = LeaseCache(OPEN_FILES, _Open.close)
        self._touched: dict[int, float] = {}
        self._last_flush = time.monotonic()

    def _after_fork(self) -> None:
        if self._pid != os.getpid():
            self._start()  # the parent's connection is left alone (never closed here)

    def _reopen_if_gone(self) -> None:
        """Open the cache again when its directory was deleted or replaced under this
        process (``rm -rf`` of the cache while a mount runs): the old index is then a
        deleted file no other process sees, and range files written through it would land
        uncounted in the directory that replaced it (or nowhere)."""
        now = self._index_id()
        if now is not None and now == self._opened_index:
            return
        with self._db_lock:
            now = self._index_id()
            if now is not None and now == self._opened_index:
                return  # (another thread did it)
            try:
                os.makedirs(self._data, mode=0o700, exist_ok=True)
                os.makedirs(self._tmp, mode=0o700, exist_ok=True)
                db = self._connect()
            except (OSError, StoreError):
                return  # writes keep failing quietly; reads go to the server
            old, self._db_conn = self._db_conn, db
            self._opened_index = self._index_id()
            with contextlib.suppress(sqlite3.Error):
                old.close()
        with self._lock:
            self._known.clear()
            self._touched.clear()
        self._open.clear()  # (row ids start again in the new index)
        log.warning("node cache: %s was deleted or replaced: opened it again", self.root)

    @property
    def _db(self) -> sqlite3.Connection:
        self._after_fork()
        return self._db_conn

    # ---- housekeeping ------------------------------------------------------------------

    def _sweep_tmp(self) -> None:
        cutoff = time.time() - STALE_TMP
        with contextlib.suppress(OSError):
            for name in os.listdir(self._tmp):
                p = os.path.join(self._tmp, name)
                with contextlib.suppress(OSError):
                    if os.stat(p).st_mtime < cutoff:
                        os.unlink(p)

    def _drop_stale_reservations(self) -> None:
        """Forget ranges reserved by writers that died before publishing them."""
        cutoff = time.time() - STALE_RESERVATION
        with contextlib.suppress(sqlite3.Error), self._db_lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "SELECT count(*), coalesce(sum(nbytes), 0) FROM ranges "
                    "WHERE ready = 0 AND used < ?",
                    (cutoff,),
                ).fetchone()
                if row[0]:
                    db.execute("DELETE FROM ranges WHERE ready = 0 AND used < ?", (cutoff,))
                    db.execute(
                        "UPDATE meta SET v = max(0, v - ?) WHERE k = 'total'", (int(row[1]),)
                    )
            finally:
                db.execute("COMMIT")

    def close(self) -> None:
        """Write remembered hits, close open range files and the index."""
        self._after_fork()
        self.flush()
        self._open.clear()
        self._known.clear()
        with self._db_lock:
            self._db.close()

    def _path(self, xorb: bytes, cs: int, ce: int) -> str:
        hx = to_hex(xorb)
        return os.path.join(self._data, hx[:2], f"{hx}.{cs}-{ce}")

    @property
    def total_bytes(self) -> int:
        """Bytes held (ranges written and being written), from the index."""
        self._after_fork()
        with self._db_lock:
            row = self._db.execute("SELECT v FROM meta WHERE k = 'total'").fetchone()
        return int(row[0]) if row else 0

    def stats(self) -> CacheStats:
        return CacheStats(self.hits, self.misses, self.stored_bytes, self.total_bytes)

    def trim(self, keep_bytes: int = 0) -> tuple[int, int]:
        """Evict the least recently used written ranges until at most ``keep_bytes`` are
        held (``git xet prune --cache``); ranges being written stay. Readers holding an
        evicted range's file keep reading it; the others fetch it again. Returns (ranges,
        bytes) removed."""
        self._after_fork()
        self.flush()
        victims: list[tuple[bytes, int, int]] = []
        freed = 0
        with self._db_lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                total = int(db.execute("SELECT v FROM meta WHERE k = 'total'").fetchone()[0])
                rows = db.execute(
                    "SELECT id, xorb, cs, ce, nbytes FROM ranges WHERE ready = 1 ORDER BY used"
                ).fetchall()
                for rid, vx, vcs, vce, vn in rows:
                    if total - freed <= keep_bytes:
                        break
                    db.execute("DELETE FROM ranges WHERE id = ?", (rid,))
                    freed += int(vn)
                    victims.append((bytes(vx), int(vcs), int(vce)))
                db.execute("UPDATE meta SET v = ? WHERE k = 'total'", (max(0, total - freed),))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        for vx, vcs, vce in victims:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(vx, vcs, vce))
        self._forget_victims(victims)
        return len(victims), freed

    def flush(self) -> None:
        """Write the last-use times of ranges read since the last flush."""
        self._after_fork()
        with self._lock:
            touched, self._touched = self._touched, {}
            self._last_flush = time.monotonic()
        if not touched:
            return
        with contextlib.suppress(sqlite3.Error), self._db_lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "UPDATE ranges SET used = ? WHERE id = ?",
                    [(t, rid) for rid, t in touched.items()],
                )
            finally:
                self._db.execute("COMMIT")

    # ---- finding ranges ----------------------------------------------------------------

    def _load(self, xorb: bytes) -> list[_Range]:
        """The ready ranges of ``xorb`` in the index, sorted by start (also remembered)."""
        with self._db_lock:
            rows = self._db.execute(
                "SELECT id, cs, ce, dlo, nbytes FROM ranges WHERE xorb = ? AND ready = 1",
                (xorb,),
            ).fetchall()
        found = sorted(
            (
                _Range(int(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[3]) + int(r[4]))
                for r in rows
            ),
            key=lambda r: r.dlo,
        )
        self._known.put(xorb, found)
        return found

    @staticmethod
    def _cover(ranges: list[_Range], lo: int, hi: int) -> list[tuple[_Range, int, int]] | None:
        """``(range, a, b)``: the ranges that together hold ``[lo, hi)`` and the part
        ``[a, b)`` to take from each (ranges may overlap), in order; or None."""
        out: list[tuple[_Range, int, int]] = []
        starts = [r.dlo for r in ranges]
        pos = lo
        while pos < hi:
            i = bisect.bisect_right(starts, pos)
            best: _Range | None = None
            for r in reversed(ranges[max(0, i - 8) : i]):
                if r.dhi > pos and (best is None or r.dhi > best.dhi):
                    best = r
            if best is None:
                return None
            end = min(hi, best.dhi)
            out.append((best, pos, end))
            pos = end
        return out

    def _find(self, xorb: bytes, lo: int, hi: int) -> list[tuple[_Range, int, int]] | None:
        with self._lock:
            known = self._known.get(xorb)
        if known is not None:
            found = self._cover(known, lo, hi)
            if found is not None:
                return found
        return self._cover(self._load(xorb), lo, hi)

    def covers(self, xorb: bytes, lo: int, hi: int) -> bool:
        """Whether decoded bytes ``[lo, hi)`` of ``xorb`` are cached (nothing is read)."""
        self._after_fork()
        return self._find(xorb, lo, hi) is not None

    # ---- reading -----------------------------------------------------------------------

    def _fd(self, xorb: bytes, r: _Range) -> Lease[_Open] | None:
        """A lease on the open file of range ``r`` (release it), or None when its file is
        gone or damaged (then forgotten, or dropped)."""
        lease = self._open.get(r.rowid)
        if lease is not None:
            op = lease.value
            try:
                st = os.fstat(op.fd)  # (~1 us: every read, so no write goes unnoticed)
            except OSError:
                st = None
            if st is None or st.st_nlink == 0:
                # evicted meanwhile (by any process): stop holding its disk space
                lease.release()
                self._forget(xorb, r)
                return None
            stamp = (st.st_mtime_ns, st.st_ctime_ns)
            if stamp != op.stamp:
                # written to since its chunks were hashed: hash them again as they are read
                log.warning(
                    "node cache: %s changed on disk: hashing it again",
                    self._path(xorb, r.cs, r.ce),
                )
                op.verified[:] = bytes(len(op.verified))
                op.stamp = stamp
                if st.st_size != r.dhi - r.dlo:
                    lease.release()
                    self._drop(xorb, r)
                    return None
            return lease
        try:
            fd = os.open(self._path(xorb, r.cs, r.ce), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._drop(xorb, r)
            return None
        try:
            st = os.fstat(fd)
            if st.st_size != r.dhi - r.dlo:
                os.close(fd)
                self._drop(xorb, r)
                return None
        except OSError:
            os.close(fd)
            return None
        op = _Open(fd, bytearray(r.ce - r.cs), (st.st_mtime_ns, st.st_ctime_ns))
        return self._open.add(r.rowid, op)

    def _forget(self, xorb: bytes, r: _Range) -> None:
        """Stop using a range this process knew of (its file is gone or bad)."""
        self._open.discard(r.rowid)  # closed when the reads holding it are done
        with self._lock:
            known = self._known.peek(xorb)
            if known is not None:
                self._known.put(xorb, [k for k in known if k.rowid != r.rowid])
            self._touched.pop(r.rowid, None)

    def _drop(self, xorb: bytes, r: _Range) -> None:
        """Remove a range whose file is missing or damaged, from the index and the disk."""
        self._forget(xorb, r)
        with contextlib.suppress(sqlite3.Error), self._db_lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT nbytes FROM ranges WHERE id = ?", (r.rowid,)
                ).fetchone()
                if row is not None:
                    self._db.execute("DELETE FROM ranges WHERE id = ?", (r.rowid,))
                    self._db.execute(
                        "UPDATE meta SET v = max(0, v - ?) WHERE k = 'total'", (int(row[0]),)
                    )
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(xorb, r.cs, r.ce))
            finally:
                self._db.execute("COMMIT")

    def read(self, xorb: bytes, layout: ChunkLayout, lo: int, hi: int) -> bytes | None:
        """Decoded bytes ``[lo, hi)`` of ``xorb`` when the cache holds all of them, else None.

        ``layout`` gives the chunk hashes and decoded offsets the data is checked against
        (once per chunk and open file in this process).
        """
        self._after_fork()
        if hi <= lo:
            return b""
        ranges = self._find(xorb, lo, hi)
        if ranges is None:
            self.misses += 1
            return None
        if len(ranges) == 1:
            r, a, b = ranges[0]
            one = self._read_one(xorb, r, layout, a, b)
            data = bytes(one) if isinstance(one, memoryview) else one  # (never a view)
        else:
            # several range files: read straight into the one object returned (a join
            # would copy every byte once more)
            def fill(out: memoryview) -> bool:
                return all(
                    self._read_one(xorb, r, layout, a, b, out[a - lo : b - lo]) is not None
                    for r, a, b in ranges
                )

            data = filled_bytes(hi - lo, fill)
        if data is None:
            self.misses += 1
            return None
        self.hits += 1
        self.hit_bytes += hi - lo
        now = time.time()
        with self._lock:
            for r, _, _ in ranges:
                self._touched[r.rowid] = now
            due = time.monotonic() - self._last_flush > TOUCH_INTERVAL
        if due:
            self.flush()
        return data

    def _read_one(
        self,
        xorb: bytes,
        r: _Range,
        layout: ChunkLayout,
        a: int,
        b: int,
        into: memoryview | None = None,
    ) -> bytes | memoryview | None:
        """Bytes ``[a, b)`` of range ``r`` (written ``into`` that view if given), or None."""
        lease = self._fd(xorb, r)
        if lease is None:
            return None
        try:
            return self._read_leased(xorb, r, lease.value, layout, a, b, into)
        finally:
            lease.release()

    def _read_leased(
        self,
        xorb: bytes,
        r: _Range,
        op: _Open,
        layout: ChunkLayout,
        a: int,
        b: int,
        into: memoryview | None = None,
    ) -> bytes | memoryview | None:
        offs = layout.data_offsets
        c0 = bisect.bisect_right(offs, a) - 1
        c1 = bisect.bisect_left(offs, b)
        marks = op.verified
        first = c0 - r.cs
        if marks.find(0, first, c1 - r.cs) == -1:
            if into is not None:
                if os.preadv(op.fd, [into], a - r.dlo) != b - a:
                    self._drop(xorb, r)
                    return None
                return into
            data = os.pread(op.fd, b - a, a - r.dlo)
            if len(data) != b - a:
                self._drop(xorb, r)
                return None
            return data
        # hash the chunks the read touches (once), and serve from what was read for it
        whole = os.pread(op.fd, offs[c1] - offs[c0], offs[c0] - r.dlo)
        if len(whole) != offs[c1] - offs[c0]:
            self._drop(xorb, r)
            return None
        view = memoryview(whole)
        hashes = layout.chunk_hashes
        for c in range(c0, c1):
            if not marks[c - r.cs]:
                piece = view[offs[c] - offs[c0] : offs[c + 1] - offs[c0]]
                if chunk_hash(piece) != hashes[c]:
                    self._drop(xorb, r)
                    return None
                marks[c - r.cs] = 1
        if into is not None:
            into[:] = view[a - offs[c0] : b - offs[c0]]
            return into
        return bytes(view[a - offs[c0] : b - offs[c0]])

    # ---- writing -----------------------------------------------------------------------

    def put(
        self,
        xorb: bytes,
        cs: int,
        ce: int,
        dlo: int,
        parts: Sequence[ReadableBuffer],
    ) -> bool:
        """Store the decoded, verified chunks ``[cs, ce)`` of ``xorb`` (``parts``, in order;
        ``dlo`` is where chunk ``cs`` starts in the xorb's decoded data).

        Returns False when the range was not stored (larger than the cap, already there or
        being written by someone else, or evicted before it was complete).
        """
        self._after_fork()
        views = [memoryview(p).cast("B") for p in parts]
        n = sum(len(v) for v in views)
        if n == 0 or n > self.max_bytes:
            return False
        self._reopen_if_gone()
        try:
            opened = self._open_tmp(xorb, cs, ce)
        except OSError:
            return False
        if opened is None:
            return False  # a live writer is writing this very range
        fd, tmp = opened
        try:
            rowid = self._reserve(xorb, cs, ce, dlo, n)
        except BaseException:
            _drop_tmp(fd, tmp)  # never a locked temp file left open: its range is blocked
            raise
        if rowid is None:
            _drop_tmp(fd, tmp)
            return False
        try:
            # in calls of <= 256 KiB (streams.WRITE_BATCH): a range written in one 8 MiB
            # writev took large page-cache folios, whose pages cost ~2 s of system time
            # per GiB on a VM that hands free memory back to its host
            write_all(fd, views)
        except OSError:
            _drop_tmp(fd, tmp)
            self._release(rowid)
            return False
        except BaseException:
            _drop_tmp(fd, tmp)
            raise
        final = self._path(xorb, cs, ce)
        if not self._finish(rowid, xorb, cs, ce, tmp, final):
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        self.stored_bytes += n
        r = _Range(rowid, cs, ce, dlo, dlo + n)
        try:
            st = os.fstat(fd)  # after the rename (which sets its ctime)
            stamp = (st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            stamp = (0, 0)  # (checked at the first read)
        # cached for the reads to come (this write held it only while adding it)
        self._open.add(rowid, _Open(fd, bytearray(b"\x01" * (ce - cs)), stamp)).release()
        with self._lock:
            known = self._known.peek(xorb)
            if known is not None:
                known = [k for k in known if not (k.cs >= cs and k.ce <= ce)]
                bisect.insort(known, r, key=lambda k: k.dlo)
                self._known.put(xorb, known)
        return True

    def _tmp_of(self, xorb: bytes, cs: int, ce: int) -> str:
        """The temp file a writer of chunks ``[cs, ce)`` of ``xorb`` writes, holding its lock
        from before it reserves the range until it publishes it."""
        return os.path.join(self._tmp, f"{to_hex(xorb)}.{cs}-{ce}")

    def _open_tmp(self, xorb: bytes, cs: int, ce: int) -> tuple[int, str] | None:
        """Create and lock the range's temp file (kept open for reads once published); None
        when a live writer holds it. One a dead writer left is taken over in place."""
        name = self._tmp_of(xorb, cs, ce)
        fd = claim_temp(name)
        return None if fd is None else (fd, name)

    def _writer_alive(self, xorb: bytes, cs: int, ce: int, reserved_at: float, now: float) -> bool:
        """Whether the writer of a reserved range may still publish it: it holds its temp
        file's lock (taken before it reserved; the kernel drops it when the writer dies),
        and reserved it less than :data:`STALE_RESERVATION` ago."""
        if now - reserved_at >= STALE_RESERVATION:
            return False
        tmp = self._tmp_of(xorb, cs, ce)
        return os.path.lexists(tmp) and temp_writer_alive(tmp)

    def _reserve(self, xorb: bytes, cs: int, ce: int, dlo: int, n: int) -> int | None:
        """Count ``n`` bytes for a range about to be written, evicting to stay under the cap."""
        victims: list[tuple[bytes, int, int]] = []
        try:
            with self._db_lock:
                db = self._db
                db.execute("BEGIN IMMEDIATE")
                try:
                    total = int(db.execute("SELECT v FROM meta WHERE k = 'total'").fetchone()[0])
                    now = time.time()
                    for rid, ready, used, held_n, rcs, rce in db.execute(
                        "SELECT id, ready, used, nbytes, cs, ce FROM ranges "
                        "WHERE xorb = ? AND cs <= ? AND ce >= ?",
                        (xorb, cs, ce),
                    ).fetchall():
                        if ready or (
                            (rcs, rce) != (cs, ce)  # (its file is not ours)
                            and self._writer_alive(xorb, int(rcs), int(rce), float(used), now)
                        ):
                            db.execute("ROLLBACK")
                            return None
                        # reserved by a writer that died before publishing it: we hold
                        # this range's temp file, so its writer cannot be alive
                        db.execute("DELETE FROM ranges WHERE id = ?", (rid,))
                        total -= int(held_n)
                    while total + n > self.max_bytes:
                        rows = db.execute(
                            "SELECT id, xorb, cs, ce, nbytes FROM ranges ORDER BY used LIMIT 32"
                        ).fetchall()
                        if not rows:
                            total = 0  # the count drifted (a crash): nothing is left
                            break
                        for rid, vx, vcs, vce, vn in rows:
                            if total + n <= self.max_bytes:
                                break
                            db.execute("DELETE FROM ranges WHERE id = ?", (rid,))
                            total -= int(vn)
                            victims.append((bytes(vx), int(vcs), int(vce)))
                            with contextlib.suppress(FileNotFoundError):
                                os.unlink(self._path(bytes(vx), int(vcs), int(vce)))
                    cur = db.execute(
                        "INSERT INTO ranges (xorb, cs, ce, dlo, nbytes, ready, used) "
                        "VALUES (?, ?, ?, ?, ?, 0, ?)",
                        (xorb, cs, ce, dlo, n, time.time()),
                    )
                    db.execute("UPDATE meta SET v = ? WHERE k = 'total'", (max(0, total) + n,))
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
        except sqlite3.Error:
            return None
        self._forget_victims(victims)
        return cur.lastrowid

    def _forget_victims(self, victims: list[tuple[bytes, int, int]]) -> None:
        if not victims:
            return
        with self._lock:
            for vx, vcs, vce in victims:
                known = self._known.peek(vx)
                if known is None:
                    continue
                for k in known:
                    if k.cs == vcs and k.ce == vce:
                        self._open.discard(k.rowid)  # closed when its readers are done
                self._known.put(vx, [k for k in known if not (k.cs == vcs and k.ce == vce)])

    def _release(self, rowid: int) -> None:
        """Give back a reservation whose file could not be written."""
        with contextlib.suppress(sqlite3.Error), self._db_lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT nbytes FROM ranges WHERE id = ?", (rowid,)
                ).fetchone()
                if row is not None:
                    self._db.execute("DELETE FROM ranges WHERE id = ?", (rowid,))
                    self._db.execute(
                        "UPDATE meta SET v = max(0, v - ?) WHERE k = 'total'", (int(row[0]),)
                    )
            finally:
                self._db.execute("COMMIT")

    def _finish(self, rowid: int, xorb: bytes, cs: int, ce: int, tmp: str, final: str) -> bool:
        """Publish a written range, unless it was evicted while being written."""
        gone: list[tuple[bytes, int, int]] = []
        try:
            with self._db_lock:
                db = self._db
                db.execute("BEGIN IMMEDIATE")
                try:
                    if db.execute("SELECT 1 FROM ranges WHERE id = ?", (rowid,)).fetchone() is None:
                        db.execute("ROLLBACK")
                        return False
                    os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
                    os.rename(tmp, final)
                    db.execute("UPDATE ranges SET ready = 1 WHERE id = ?", (rowid,))
                    # ranges inside this one are redundant now
                    inner = db.execute(
                        "SELECT id, cs, ce, nbytes FROM ranges WHERE xorb = ? AND cs >= ? "
                        "AND ce <= ? AND id != ? AND ready = 1",
                        (xorb, cs, ce, rowid),
                    ).fetchall()
                    freed = 0
                    for rid, ics, ice, inb in inner:
                        db.execute("DELETE FROM ranges WHERE id = ?", (rid,))
                        freed += int(inb)
                        gone.append((xorb, int(ics), int(ice)))
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self._path(xorb, int(ics), int(ice)))
                    if freed:
                        db.execute("UPDATE meta SET v = max(0, v - ?) WHERE k = 'total'", (freed,))
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
        except (sqlite3.Error, OSError):
            return False
        self._forget_victims(gone)
        return True
