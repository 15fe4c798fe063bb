"""The local content-addressed store: xorbs, shards and the indexes over them.

Layout under ``root`` (the same for a repository's cache ``.git/xet`` and for the embedded
remote ``<remote>/xet``)::

    xorbs/<2 hex>/<xorb hex>      xorb body + CasObjectInfo footer (chunk hashes and offsets)
    shards/<shard hex>.shard      shards exactly as uploaded (the source of truth for files)
    index.sqlite                  file -> shard and chunk -> (xorb, index); rebuildable
    tmp/, locks/

Every write is atomic (temp file in ``tmp/`` + fsync + rename), so a killed writer leaves
nothing half written, only a temp file that the next open of the store removes once no
writer could still be using it (an hour untouched); shards are only accepted once every
xorb they reference is present, so a store never references a missing xorb. Reads
verify: a xorb's footer must Merkle-hash to the xorb's name, and every chunk read must hash
to the footer's entry. A chunk stored uncompressed is hashed the first time it is read
through an open descriptor; later reads of parts of it through that descriptor are plain
``pread`` calls (xorb files are immutable and never rewritten in place; a reopened
descriptor starts unverified again).

Shards may carry a file's SHA-256 (the metadata extension). It is the uploader's claim and
nothing checks it, so gitxet never reads it: a file is identified and verified by its Xet
hash alone (the pointer's ``oid sha256`` is what git-lfs tooling sees).

Open xorb descriptors live in a bounded :class:`~gitxet.util.lru.LeaseCache`: every read
holds a lease on the descriptor it reads through, and a descriptor is closed only once it
is evicted *and* no read holds it, so a descriptor number is never reused under a reader,
and the number open is bounded by :data:`MAX_OPEN_XORBS` plus the concurrent readers.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass

from gitxet.errors import (
    FormatError,
    GitxetError,
    IntegrityError,
    ShardFormatError,
    StoreError,
    WouldBlockError,
    XorbFormatError,
    XorbNotFoundError,
)
from gitxet.formats import shard as shardfmt
from gitxet.formats import xorb as xorbfmt
from gitxet.hashing import chunk_hash, merkle_root_of, to_hex
from gitxet.store.locking import file_lock
from gitxet.util import bgio, nowait, sqlite
from gitxet.util.atomic import atomic_write, atomic_writer, remove_stale_temps, sync_written
from gitxet.util.lru import Lease, LeaseCache, LRUCache
from gitxet.util.streams import write_all

#: open xorb descriptors kept per store (plus those that concurrent reads still hold)
MAX_OPEN_XORBS = 64
#: open shard descriptors kept per store
MAX_OPEN_SHARDS = 16
#: verified xorb layouts kept per store
MAX_LAYOUTS = 4096
#: a blocking read that continues the previous one of its xorb (within this many bytes)...
_SEQ_NEAR = 2 << 20
#: ... asks the kernel to read this much further ahead (consecutive small files)
_SEQ_AHEAD = 16 << 20
#: an event loop's read of a xorb that continues its last one has the next bytes read into
#: memory ahead of it by the C I/O thread (see :class:`_PreReads`), in blocks of this many
#: bytes, this many blocks ahead
PREREAD_BLOCK = 4 << 20
PREREAD_DEPTH = 2
#: file reconstructions kept per store
_DESCRIBE_SPAN = 4 << 20  # bytes of a shard read at once for the file blocks describe() wants
_DESCRIBE_BATCH = 1000  # files :meth:`LocalCAS.lacking_data` reads, then checks, at once
MAX_FILE_INFOS = 1 << 16  # ~300 bytes each: a clone asks for every file several times

# files.pos: the byte offset of the file's block in its shard, so a lookup reads one block
# instead of parsing a shard of maybe 100,000 files
_SCHEMA_VERSION = 2
#: A shard file the index does not name and that is older than this (seconds) was left by a
#: writer killed between writing it and committing its rows (``put_shards``); the store
#: indexes it when opened. A younger one may be a live writer's, not yet durable.
LEFT_SHARD_AGE = 60.0
_SCHEMA = """
CREATE TABLE IF NOT EXISTS shards (name TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS files (
    hash BLOB PRIMARY KEY, shard TEXT NOT NULL, pos INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chunks (
    hash BLOB PRIMARY KEY, xorb BLOB NOT NULL, idx INTEGER NOT NULL
) WITHOUT ROWID;
"""


@dataclass(frozen=True, slots=True)
class XorbLayout:
    """Where each chunk of a stored xorb is: verified against the xorb hash."""

    xorb_hash: bytes
    chunk_hashes: tuple[bytes, ...]
    byte_offsets: tuple[int, ...]  # n+1 offsets of serialized chunks in the body
    data_offsets: tuple[int, ...]  # n+1 offsets of the chunks in the decoded data

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_hashes)

    @classmethod
    def from_footer(cls, xorb_hash: bytes, footer: xorbfmt.XorbFooter) -> XorbLayout:
        """The layout a stored footer describes, once it is shown to hash to ``xorb_hash``.

        Raises:
            IntegrityError: the footer names another xorb or its chunks hash to another.
        """
        ends = footer.uncompressed_ends
        sizes = [b - a for a, b in zip((0, *ends), ends, strict=False)]
        if footer.xorb_hash != xorb_hash or merkle_root_of(footer.chunk_hashes, sizes) != xorb_hash:
            raise IntegrityError(
                "xorb", to_hex(xorb_hash), "chunk index does not match the xorb hash"
            )
        return cls(xorb_hash, tuple(footer.chunk_hashes), (0, *footer.byte_ends), (0, *ends))

    @property
    def body_size(self) -> int:
        return self.byte_offsets[-1]

    @property
    def data_size(self) -> int:
        return self.data_offsets[-1]


class _XorbFile:
    """An open xorb and which of its chunks were verified through this descriptor (a shard
    is kept open the same way, without the marks)."""

    __slots__ = ("ahead", "fd", "last_end", "raw_ok")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        # chunk index -> 1 once that chunk, stored uncompressed, was verified through fd
        self.raw_ok: bytearray | None = None
        self.last_end = -1  # where the last blocking read ended (byte offset)
        self.ahead = 0  # read-ahead asked of the kernel up to here

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counts and on-disk bytes of a store."""

    xorbs: int
    xorb_bytes: int
    shards: int
    shard_bytes: int


class _Block:
    __slots__ = ("data", "end", "start", "xf", "xorb")

    def __init__(self, xorb: bytes, xf: _XorbFile, start: int, end: int) -> None:
        self.xorb, self.xf, self.start, self.end = xorb, xf, start, end
        self.data: memoryview | None = None  # None until read


_ABANDONED: list[object] = []  # workers of a parent process (a forked child never touches them)


class _PreReads:
    """Xorb bytes read into memory ahead of an event loop's sequential reads, by the C I/O
    thread (``gitxet.util.bgio``), which never takes the interpreter lock.

    The event loop serving a mount answers every request on one thread; its ``pread`` of
    xorb bytes (a copy of memory the disk just filled: at 20,000 small files a fifth of
    that thread) is taken off it: when its read of a xorb continues the last one, the next
    :data:`PREREAD_DEPTH` blocks of :data:`PREREAD_BLOCK` bytes are read by the C thread
    (which may wait on the disk), and a later read they hold is answered from them. Nothing
    ever waits for that thread: a block not read yet is simply not used. Only raw bytes,
    read through the same open file (a ``dup`` of its descriptor): the caller decodes and
    verifies them as it would its own ``pread``'s. At most ``PREREAD_DEPTH + 1`` blocks
    are kept. Without the C extension, nothing is read ahead.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._worker: bgio.Worker | None = None
        self._pid = 0
        self._blocks: list[_Block] = []
        self._pending: dict[int, _Block] = {}
        self._last: tuple[bytes, int] | None = None  # (xorb, end) of the last read asked
        self._next = 0
        self._closed = False

    def take(self, xf: _XorbFile, lay: XorbLayout, a: int, b: int) -> list[memoryview] | None:
        """Bytes ``[a, b)`` (whole chunks) of the xorb ``lay`` describes if read ahead
        through ``xf``, in parts that each hold whole chunks (blocks end where a chunk
        does: nothing is joined), else None; has the bytes after them read ahead when this
        read continues the last one."""
        if bgio.Worker is None:
            return None
        xorb = lay.xorb_hash
        with self._lock:
            if self._closed:
                return None
            worker = self._reap()
            last, self._last = self._last, (xorb, b)
            got = self._find(xf, xorb, a, b)
            if last is None or last[0] != xorb or abs(a - last[1]) > _SEQ_NEAR:
                return got
            # consumed blocks go; so do another xorb's (the reader moved on)
            keep = [k for k in self._blocks if k.xf is xf and k.end > a]
            top = max((k.end for k in keep), default=b)
            offs = lay.byte_offsets
            limit = min(offs[-1], b + PREREAD_DEPTH * PREREAD_BLOCK)
            while top < limit and len(keep) <= PREREAD_DEPTH:
                # the last chunk start at or before the block's size (a chunk of more
                # than a block: that chunk's end)
                end = offs[bisect.bisect_right(offs, min(limit, top + PREREAD_BLOCK)) - 1]
                if end <= top:
                    end = offs[bisect.bisect_right(offs, top)] if top < offs[-1] else top
                if end <= top:
                    break
                block = _Block(xorb, xf, top, end)
                token = self._next
                self._next += 1
                if not worker.read(token, xf.fd, block.start, block.end - block.start):
                    break  # (its queue is full)
                self._pending[token] = block
                keep.append(block)
                top = block.end
            self._blocks = keep
        return got

    def _reap(self) -> bgio.Worker:
        worker = self._worker
        if worker is None or self._pid != os.getpid():
            if worker is not None:  # forked: its thread is not in this process
                _ABANDONED.append(worker)
                self._pending.clear()
                self._blocks = []
            assert bgio.Worker is not None
            worker = self._worker = bgio.Worker(limit=2 * PREREAD_DEPTH + 2)  # (bounds memory)
            self._pid = os.getpid()
        for token, n, data in worker.reap():
            block = self._pending.pop(token, None)
            if block is not None and data is not None and n == block.end - block.start:
                block.data = memoryview(data)
        return worker

    def _find(self, xf: _XorbFile, xorb: bytes, a: int, b: int) -> list[memoryview] | None:
        parts = []
        at = a
        for k in sorted(self._blocks, key=lambda k: k.start):
            if k.data is None or k.xf is not xf or k.xorb != xorb or not k.start <= at < k.end:
                continue
            parts.append(k.data[at - k.start : min(b, k.end) - k.start])
            at = min(b, k.end)
            if at == b:
                return parts
        return None

    def close(self) -> None:
        """Stop the thread and forget the blocks (reads go on without them)."""
        with self._lock:
            self._closed = True
            self._blocks = []
            self._pending.clear()
            worker, self._worker = self._worker, None
        if worker is not None and self._pid == os.getpid():
            worker.stop(1.0)


class LocalCAS:
    """A content-addressed store in one directory; safe for concurrent processes."""

    #: reads never wait on a network (see ``CommitFS.inline_reads``)
    is_local = True

    def __init__(self, root: str, *, durable: bool = True) -> None:
        self.root = os.path.abspath(root)
        self.durable = durable
        self._layouts: LRUCache[bytes, XorbLayout] = LRUCache(MAX_LAYOUTS)
        self._infos: LRUCache[bytes, shardfmt.FileInfo] = LRUCache(MAX_FILE_INFOS)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._files: LeaseCache[bytes, _XorbFile] = LeaseCache(MAX_OPEN_XORBS, _XorbFile.close)
        # open shards, by name (a read of each of 20,000 files asks one for its block)
        self._shard_fds: LeaseCache[str, _XorbFile] = LeaseCache(MAX_OPEN_SHARDS, _XorbFile.close)
        self._pre = _PreReads()
        self._left_checked = False  # shards a killed writer left unindexed: looked for once
        self.tmp = os.path.join(self.root, "tmp")
        try:
            for d in ("xorbs", "shards", "tmp", "locks"):
                os.makedirs(os.path.join(self.root, d), exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create store at {self.root}: {e.strerror}") from None
        self._sweep()

    def _sweep(self) -> None:
        """Remove what killed writers left: temp files in ``tmp/`` no writer has touched for
        an hour. Once per store, also those older versions left beside xorbs and shards."""
        remove_stale_temps(self.tmp)
        marker = os.path.join(self.root, ".swept-v1")  # not in tmp/: that stays empty
        if os.path.exists(marker):
            return
        dirs = [os.path.join(self.root, "shards")]
        with contextlib.suppress(OSError):
            base = os.path.join(self.root, "xorbs")
            dirs += [os.path.join(base, d) for d in os.listdir(base) if len(d) == 2]
        for d in dirs:
            remove_stale_temps(d, any_suffix=True)
        with contextlib.suppress(OSError):
            atomic_write(marker, b"", durable=False)

    # ---- paths -------------------------------------------------------------------------

    def xorb_path(self, xorb_hash: bytes) -> str:
        hx = to_hex(xorb_hash)
        return os.path.join(self.root, "xorbs", hx[:2], hx)

    def shard_path(self, name: str) -> str:
        return os.path.join(self.root, "shards", name + ".shard")

    def _lock_path(self, name: str) -> str:
        return os.path.join(self.root, "locks", name)

    # ---- index ---------------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            path = os.path.join(self.root, "index.sqlite")
            fresh = not os.path.exists(path)
            conn = sqlite.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            if conn.execute("PRAGMA user_version").fetchone()[0] != _SCHEMA_VERSION:
                fresh |= self._migrate(conn)
            self._local.conn = conn
            if fresh:
                self._left_checked = True
                self.rebuild_index()
            elif not self._left_checked:
                self._left_checked = True
                self.index_left_shards()
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> bool:
        """Create the tables, or drop an older layout's (a cache: rebuilt from the shards);
        True when the index must be rebuilt."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("PRAGMA user_version").fetchone()[0] == _SCHEMA_VERSION:
                conn.execute("COMMIT")
                return False  # another process did it meanwhile
            for table in ("files", "chunks", "shards"):
                conn.execute(f"DROP TABLE IF EXISTS {table}")
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return True

    def close(self) -> None:
        """Close open xorb files (those being read, once read) and this thread's index
        connection. The store stays usable."""
        self._files.clear()
        self._shard_fds.clear()
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def rebuild_index(self) -> int:
        """Re-index every shard on disk (the index is a cache of the shards); returns a count."""
        names = list(self.shard_names())
        for i in range(0, len(names), 256):  # one transaction per 256 shards
            self._index_shards(self._loadable(names[i : i + 256]))
        return len(names)

    def index_left_shards(self, min_age: float = LEFT_SHARD_AGE) -> int:
        """Index the shard files the index does not name that are older than ``min_age``
        seconds (a writer killed between a shard's file and its rows left them: readers
        would not find their files); returns how many. Costs one directory listing."""
        on_disk = set(self.shard_names())
        if not on_disk:
            return 0
        known = {row[0] for row in self._db().execute("SELECT name FROM shards")}
        cutoff = time.time() - min_age
        left = []
        for name in sorted(on_disk - known):
            with contextlib.suppress(OSError):
                if os.stat(self.shard_path(name)).st_mtime <= cutoff:
                    left.append(name)
        if not left:
            return 0
        try:
            # a prune deletes the shards it took out of the index: never index them back
            # while one runs (the next open will, if it was killed before deleting them)
            with file_lock(self._lock_path("prune"), shared=True, timeout=0):
                loaded = list(self._loadable(left))  # a damaged file: no transaction at all
                if loaded:
                    self._index_shards(loaded)
        except (StoreError, sqlite3.Error, OSError):
            return 0  # a prune is running, or a read-only store: readers do without them
        return len(loaded)

    def _loadable(self, names: Iterable[str]) -> Iterator[tuple[str, shardfmt.Shard]]:
        """Each shard of ``names`` that can be read and parsed, one at a time."""
        for name in names:
            try:
                shard = self._load_shard(name)
            except (FormatError, OSError):
                continue
            yield name, shard
            del shard

    def _index_shard(self, name: str, shard: shardfmt.Shard) -> None:
        self._index_shards([(name, shard)])

    def _index_shards(self, shards: Iterable[tuple[str, shardfmt.Shard]]) -> None:
        """Index ``shards`` in one transaction, each dropped once its rows are inserted (a
        store's worth of parsed shards is ~1 KB a file: never held all at once)."""
        db = self._db()
        with db:
            db.execute("BEGIN IMMEDIATE")
            for name, shard in shards:
                self._insert_shard(db, name, shard)
                del shard  # not held while the next one is parsed

    @staticmethod
    def _insert_shard(db: sqlite3.Connection, name: str, shard: shardfmt.Shard) -> None:
        offsets = shardfmt.file_block_offsets(shard.files)
        db.executemany(
            "INSERT OR IGNORE INTO files(hash, shard, pos) VALUES (?, ?, ?)",
            ((f.file_hash, name, p) for f, p in zip(shard.files, offsets, strict=True)),
        )
        db.executemany(
            "INSERT OR IGNORE INTO chunks(hash, xorb, idx) VALUES (?, ?, ?)",
            ((c.hash, x.xorb_hash, i) for x in shard.xorbs for i, c in enumerate(x.chunks)),
        )
        db.execute("INSERT OR IGNORE INTO shards(name) VALUES (?)", (name,))

    def lookup_chunk(self, h: bytes) -> tuple[bytes, int] | None:
        """(xorb hash, chunk index) of a stored chunk, for dedup."""
        row = self._db().execute("SELECT xorb, idx FROM chunks WHERE hash = ?", (h,)).fetchone()
        return (bytes(row[0]), int(row[1])) if row else None

    def lookup_chunks(self, hashes: Sequence[bytes]) -> dict[bytes, tuple[bytes, int]]:
        """Batch :meth:`lookup_chunk` for the hashes that are known."""
        out: dict[bytes, tuple[bytes, int]] = {}
        db = self._db()
        for i in range(0, len(hashes), 500):
            part = hashes[i : i + 500]
            marks = ",".join("?" * len(part))
            q = f"SELECT hash, xorb, idx FROM chunks WHERE hash IN ({marks})"
            for h, x, idx in db.execute(q, part):
                out[bytes(h)] = (bytes(x), int(idx))
        return out

    # ---- xorbs ---------------------------------------------------------------------------

    def has_xorb(self, xorb_hash: bytes) -> bool:
        return os.path.exists(self.xorb_path(xorb_hash))

    def has_file_data(self, file_hash: bytes) -> bool:
        """Whether a stored shard describes the file and every xorb it names is here (a
        file added against a server's data, or whose xorb was quarantined, is not)."""
        info = self.file_info(file_hash)
        return info is not None and all(self.has_xorb(t.xorb_hash) for t in info.terms)

    def lacking_data(self, file_hashes: Iterable[bytes]) -> list[bytes]:
        """Those of ``file_hashes`` (each once) that :meth:`has_file_data` says no for, with
        their reconstructions read in batches (:meth:`describe`) and each xorb looked for
        once (a clone of 20,000 small files names a few dozen xorbs). The batches are of
        :data:`_DESCRIBE_BATCH` files, each checked right after it is read: reading them all
        first overflowed the cache of reconstructions past its 65,536 files, and each was
        then read again."""
        hashes = list(dict.fromkeys(file_hashes))
        here: dict[bytes, bool] = {}

        def has(x: bytes) -> bool:
            found = here.get(x)
            if found is None:
                found = here[x] = self.has_xorb(x)
            return found

        lacking = []
        for i in range(0, len(hashes), _DESCRIBE_BATCH):
            batch = hashes[i : i + _DESCRIBE_BATCH]
            self.describe(batch)
            for h in batch:
                info = self.file_info(h)
                if info is None or not all(has(t.xorb_hash) for t in info.terms):
                    lacking.append(h)
        return lacking

    def quarantined(self, xorb_hash: bytes) -> str | None:
        """Where :meth:`quarantine` set this xorb aside, when it did (and it is not back)."""
        kept = os.path.join(self.root, "damaged", to_hex(xorb_hash))
        return kept if os.path.exists(kept) and not self.has_xorb(xorb_hash) else None

    def quarantine(self, xorb_hash: bytes) -> None:
        """Move a xorb that failed verification out of the store, to ``damaged/`` (kept:
        its other chunks may be the only copy of some unpushed data), so that it reads as
        missing and the next fetch or checkout gets it again from a remote that has it."""
        damaged = os.path.join(self.root, "damaged")
        kept = os.path.join(damaged, to_hex(xorb_hash))
        with contextlib.suppress(OSError):
            os.makedirs(damaged, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(kept)  # (a rename onto another link of the same file does nothing)
            os.replace(self.xorb_path(xorb_hash), kept)
        self._files.discard(xorb_hash)
        self._layouts.discard(xorb_hash)

    def put_serialized(self, sx: xorbfmt.SerializedXorb) -> bool:
        """Store a xorb built by our own serializer (hash already computed); False if present."""
        path = self.xorb_path(sx.hash)
        if os.path.exists(path):
            return False
        footer = sx.footer()
        with atomic_writer(path, durable=self.durable, tmp_dir=self.tmp) as f:
            f.flush()
            write_all(f.fileno(), [*sx.parts, footer])
        return True

    def put_xorb(
        self, xorb_hash: bytes, data: xorbfmt.BytesLike, *, durable: bool | None = None
    ) -> bool:
        """Verify and store a xorb received from elsewhere (footer optional); False if present.

        Raises:
            XorbFormatError: the bytes are not a xorb.
            IntegrityError: the chunks do not hash to ``xorb_hash``.
        """
        if self.has_xorb(xorb_hash):
            return False
        body, _ = xorbfmt.split_footer(data)
        parsed = xorbfmt.verify_xorb(body, xorb_hash, keep_chunks=False)
        ends: list[int] = []
        total = 0
        for size in parsed.chunk_sizes:
            total += size
            ends.append(total)
        footer = xorbfmt.build_footer(xorb_hash, parsed.chunk_hashes, parsed.byte_offsets[1:], ends)
        keep = self.durable if durable is None else durable
        with atomic_writer(self.xorb_path(xorb_hash), durable=keep, tmp_dir=self.tmp) as f:
            f.write(body)
            f.write(footer)
        return True

    def _read_body(self, xorb_hash: bytes, size: int) -> bytes:
        """The first ``size`` bytes of a stored xorb (its body: the footer is not read, nor
        copied out of a read of the whole file)."""
        try:
            with open(self.xorb_path(xorb_hash), "rb") as f:
                data = f.read(size)
        except FileNotFoundError:
            raise XorbNotFoundError(to_hex(xorb_hash)) from None
        if len(data) != size:
            raise IntegrityError("xorb", to_hex(xorb_hash), "truncated on disk")
        return data

    def layout(self, xorb_hash: bytes) -> XorbLayout:
        """Chunk layout of a stored xorb, read from its footer and verified against its hash."""
        cached = self._layouts.get(xorb_hash)
        if cached is not None:
            return cached
        if nowait.active():  # the footer is read through a mapping: it could wait
            raise WouldBlockError("xorb layout not loaded yet")
        path = self.xorb_path(xorb_hash)
        hx = to_hex(xorb_hash)
        try:
            # mmap: split_footer reads only the trailer, so this costs O(footer), not O(xorb)
            with open(path, "rb") as f:
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                try:
                    mv = memoryview(m)
                    body, footer = xorbfmt.split_footer(mv)
                    body.release()
                    mv.release()
                except FormatError as e:
                    raise IntegrityError("xorb", hx, f"damaged footer ({e.reason})") from None
                finally:
                    with contextlib.suppress(BufferError):  # a view kept alive by a traceback
                        m.close()
        except FileNotFoundError:
            raise XorbNotFoundError(hx) from None
        except ValueError:  # mmap of an empty file
            raise IntegrityError("xorb", hx, "empty file") from None
        if footer is None:
            raise IntegrityError("xorb", hx, "stored without its chunk index footer")
        lay = XorbLayout.from_footer(xorb_hash, footer)
        self._layouts.put(xorb_hash, lay)
        return lay

    def _open_xorb(self, xorb_hash: bytes) -> Lease[_XorbFile]:
        """A lease on an open descriptor of a stored xorb (release it when done)."""

        def open_() -> _XorbFile:
            try:
                return _XorbFile(os.open(self.xorb_path(xorb_hash), os.O_RDONLY | os.O_CLOEXEC))
            except FileNotFoundError:
                raise XorbNotFoundError(to_hex(xorb_hash)) from None

        return self._files.acquire(xorb_hash, open_)

    @staticmethod
    def _pread(xf: _XorbFile, xorb_hash: bytes, size: int, offset: int) -> bytes:
        data = nowait.pread(xf.fd, size, offset)
        if len(data) != size:
            raise IntegrityError("xorb", to_hex(xorb_hash), "truncated on disk")
        return data

    @staticmethod
    def _read_ahead(xf: _XorbFile, lay: XorbLayout, start: int, end: int) -> None:
        """After a read that waited on the disk: when it continues the last one (readers of
        consecutive small files), ask the kernel for the next ``_SEQ_AHEAD`` bytes, so the
        next files' reads find the page cache and never wait (``gitxet.util.nowait``)."""
        lo, hi = lay.byte_offsets[start], lay.byte_offsets[end]
        last, xf.last_end = xf.last_end, hi
        if last < 0 or abs(lo - last) > _SEQ_NEAR or xf.ahead >= hi + _SEQ_AHEAD // 2:
            return
        top = min(lay.byte_offsets[-1], hi + _SEQ_AHEAD)
        a = max(hi, xf.ahead)
        if a < top:
            with contextlib.suppress(OSError):
                os.posix_fadvise(xf.fd, a, top - a, os.POSIX_FADV_WILLNEED)
        xf.ahead = top

    def read_raw_range(self, xorb_hash: bytes, start: int, end: int) -> bytes:
        """Serialized bytes (headers included) of chunks ``[start, end)``, unverified."""
        lay = self.layout(xorb_hash)
        with self._open_xorb(xorb_hash) as xf:
            return self._read_raw(xf, lay, start, end)

    def _read_raw(self, xf: _XorbFile, lay: XorbLayout, start: int, end: int) -> bytes:
        a, b = self._raw_span(lay, start, end)
        return self._pread(xf, lay.xorb_hash, b - a, a)

    @staticmethod
    def _raw_span(lay: XorbLayout, start: int, end: int) -> tuple[int, int]:
        """Where chunks ``[start, end)`` lie in the xorb file."""
        if not 0 <= start < end <= lay.num_chunks:
            raise IndexError(
                f"chunk range [{start}, {end}) outside xorb of {lay.num_chunks} chunks"
            )
        return lay.byte_offsets[start], lay.byte_offsets[end]

    def read_chunks(self, xorb_hash: bytes, start: int, end: int) -> list[bytes]:
        """Decoded chunks ``[start, end)``, each verified against its hash."""
        return self._read_decoded(xorb_hash, start, end, lambda views: [bytes(v) for v in views])

    def read_chunk_runs(
        self, xorb_hash: bytes, start: int, end: int, runs: Sequence[tuple[int, int]]
    ) -> list[bytes]:
        """The decoded bytes of chunks ``[a, b)`` for each ``(a, b)`` of ``runs`` (inside
        ``[start, end)``), read, decoded and verified as :meth:`read_chunks` does them: each
        run's bytes copied once from the read (not once per chunk and again per run)."""
        for a, b in runs:
            if not start <= a < b <= end:
                raise IndexError(f"chunk run [{a}, {b}) outside [{start}, {end})")
        return self._read_decoded(
            xorb_hash,
            start,
            end,
            lambda views: [b"".join(views[a - start : b - start]) for a, b in runs],
        )

    def _read_decoded(
        self,
        xorb_hash: bytes,
        start: int,
        end: int,
        use: Callable[[list[memoryview | bytes]], list[bytes]],
    ) -> list[bytes]:
        """``use`` of the verified chunks ``[start, end)``: views of the read where a chunk
        is stored uncompressed, valid only during the call (the read's buffer is reused)."""
        lay = self.layout(xorb_hash)
        hx = to_hex(xorb_hash)
        a, b = self._raw_span(lay, start, end)
        with self._open_xorb(xorb_hash) as xf:
            # decoded at once: read into this thread's reused buffer (the chunks are copies),
            # on an event loop maybe read ahead of it by the C I/O thread
            pre = self._pre.take(xf, lay, a, b) if nowait.active() else None
            parts = pre if pre is not None else [nowait.pread_view(xf.fd, b - a, a)]
            if sum(len(p) for p in parts) != b - a:
                raise IntegrityError("xorb", hx, "truncated on disk")
            try:
                if len(parts) == 1:
                    chunks = xorbfmt.decode_chunk_views(parts[0], expected_count=end - start)
                else:  # (parts hold whole chunks)
                    chunks = [c for p in parts for c in xorbfmt.decode_chunk_views(p)]
                    if len(chunks) != end - start:
                        raise XorbFormatError(
                            "xorb range", f"{len(chunks)} chunks, expected {end - start}"
                        )
            except FormatError as e:
                self.quarantine(xorb_hash)
                raise IntegrityError(
                    "xorb", hx, f"chunks {start}..{end} unreadable ({e.reason})"
                ) from None
            for i, c in enumerate(chunks):
                if chunk_hash(c) != lay.chunk_hashes[start + i]:
                    self.quarantine(xorb_hash)
                    raise IntegrityError("xorb", hx, f"chunk {start + i} does not match its hash")
            self._note_verified(xf, lay, chunks, start)
            if not nowait.active():
                self._read_ahead(xf, lay, start, end)
            return use(chunks)

    def _note_verified(
        self, xf: _XorbFile, lay: XorbLayout, chunks: list[memoryview | bytes], start: int
    ) -> None:
        """Remember which of the verified chunks from ``start`` on (read through ``xf``,
        decoded by ``decode_chunk_views``: a view where stored uncompressed) are stored
        uncompressed."""
        with self._lock:
            marks = xf.raw_ok
            if marks is None:
                marks = xf.raw_ok = bytearray(lay.num_chunks)
            for i, c in enumerate(chunks, start):
                if isinstance(c, memoryview):
                    marks[i] = 1

    def read_verified_part(self, xorb_hash: bytes, index: int, lo: int, hi: int) -> bytes | None:
        """Bytes ``[lo, hi)`` of chunk ``index`` with one ``pread``, or ``None``.

        Only for a chunk stored uncompressed and already verified through the open
        descriptor; for any other chunk this returns ``None`` and the caller decodes it with
        :meth:`read_chunks` (which verifies it, and makes later calls succeed).
        """
        lease = self._files.get(xorb_hash)
        if lease is None:
            return None
        with lease as xf:
            marks = xf.raw_ok
            if marks is None or not marks[index]:
                return None
            lay = self.layout(xorb_hash)
            if not 0 <= lo <= hi <= lay.data_offsets[index + 1] - lay.data_offsets[index]:
                raise IndexError(f"range [{lo}, {hi}) outside chunk {index}")
            at = lay.byte_offsets[index] + xorbfmt.CHUNK_HEADER_SIZE + lo
            return self._pread(xf, xorb_hash, hi - lo, at)

    def read_verified_range(self, xorb_hash: bytes, lo: int, hi: int) -> bytes | None:
        """Decoded bytes ``[lo, hi)`` of a xorb's data with one ``pread``, or ``None``.

        Only when every chunk the range touches is stored uncompressed and was verified
        through the open descriptor (see :meth:`read_verified_part`); the chunk headers
        between them are cut out. Otherwise ``None``: the caller decodes the chunks with
        :meth:`read_chunks`, which verifies them.
        """
        lease = self._files.get(xorb_hash)
        if lease is None:
            return None
        with lease as xf:
            marks = xf.raw_ok
            if marks is None:
                return None
            lay = self.layout(xorb_hash)
            offs = lay.data_offsets
            if not 0 <= lo < hi <= offs[-1]:
                raise IndexError(f"range [{lo}, {hi}) outside a xorb of {offs[-1]} bytes")
            c0 = bisect.bisect_right(offs, lo) - 1
            c1 = bisect.bisect_left(offs, hi)
            if marks.find(0, c0, c1) != -1:
                return None
            bo = lay.byte_offsets
            base = bo[c0]
            raw = self._pread(xf, xorb_hash, bo[c1] - base, base)
        head = xorbfmt.CHUNK_HEADER_SIZE
        if c1 - c0 == 1:
            return raw[head + lo - offs[c0] : head + hi - offs[c0]]
        view = memoryview(raw)
        pieces = []
        for i in range(c0, c1):
            at = bo[i] - base + head
            a = lo - offs[i] if i == c0 else 0
            b = hi - offs[i] if i == c1 - 1 else offs[i + 1] - offs[i]
            pieces.append(view[at + a : at + b])
        return b"".join(pieces)

    def readahead(self, xorb_hash: bytes, start: int, end: int) -> None:
        """Ask the kernel to read chunks ``[start, end)`` of a stored xorb into the page
        cache now, in the background (a hint: errors are ignored). Many threads reading
        parts of one xorb at once defeat the kernel's own read-ahead."""
        try:
            lay = self.layout(xorb_hash)
            a, b = lay.byte_offsets[start], lay.byte_offsets[min(end, lay.num_chunks)]
            with self._open_xorb(xorb_hash) as xf:
                os.posix_fadvise(xf.fd, a, b - a, os.POSIX_FADV_WILLNEED)
        except (OSError, GitxetError, IndexError):
            pass

    def xorb_body(self, xorb_hash: bytes, *, verify: bool = True) -> bytes:
        """The whole serialized xorb without footer (what is uploaded).

        ``verify=False`` skips re-hashing the chunks, for callers handing the bytes to a
        receiver that verifies them anyway (every ``put_xorb`` and every CAS server does).
        """
        lay = self.layout(xorb_hash)
        body = self._read_body(xorb_hash, lay.body_size)
        if not verify:
            return body
        chunks = xorbfmt.decode_chunks(body)
        if [chunk_hash(c) for c in chunks] != list(lay.chunk_hashes):
            raise IntegrityError("xorb", to_hex(xorb_hash), "content does not match its hash")
        return body

    def xorb_hashes(self) -> Iterator[bytes]:
        """Every xorb on disk."""
        from gitxet.hashing import from_hex, is_hex

        base = os.path.join(self.root, "xorbs")
        for sub in sorted(os.listdir(base)):
            d = os.path.join(base, sub)
            if not os.path.isdir(d):
                continue
            for name in sorted(os.listdir(d)):
                if is_hex(name):
                    yield from_hex(name)

    # ---- shards --------------------------------------------------------------------------

    def shard_names(self) -> Iterator[str]:
        for name in sorted(os.listdir(os.path.join(self.root, "shards"))):
            if name.endswith(".shard") and not name.startswith("."):
                yield name[: -len(".shard")]

    def has_shard(self, name: str) -> bool:
        """Whether the shard is stored and indexed. A file a killed writer left without its
        index rows is not: readers cannot find its files, so a push must send it again
        (which indexes it)."""
        row = self._db().execute("SELECT 1 FROM shards WHERE name = ?", (name,)).fetchone()
        return row is not None and os.path.exists(self.shard_path(name))

    def shard_bytes(self, name: str) -> bytes:
        with open(self.shard_path(name), "rb") as f:
            return f.read()

    def _load_shard(self, name: str) -> shardfmt.Shard:
        return shardfmt.parse_shard(self.shard_bytes(name))

    def put_shard(self, data: bytes) -> str:
        """Validate, store and index a shard; every xorb it references must be present.

        Returns the shard's name (Xet hex of its content hash).
        """
        return self.put_shards([data])[0]

    def put_shards(
        self, datas: Iterable[bytes], *, remote_xorbs: Collection[bytes] = ()
    ) -> list[str]:
        """:meth:`put_shard` for many shards: written, then made durable together (one
        filesystem sync), then indexed in one transaction. Returns their names.

        ``remote_xorbs`` are xorbs a CAS server stores that the shards' terms may name
        without this store holding them (dedup against the server): reading such a file
        takes the server, pushing it to that server sends none of their bytes.

        Raises:
            ShardFormatError: a shard is malformed or references a missing xorb (the shards
                before it are stored).
        """
        names: list[str] = []
        written: list[str] = []
        db = self._db()
        # each shard's rows go into the open transaction as soon as it is written, and the
        # parsed shard is dropped (~1 KB a file: a push of 100,000 files held 100 MB of
        # them); the transaction commits after the sync, so the index never names a shard
        # that is not durable
        db.execute("BEGIN IMMEDIATE")
        keep = True  # whether the rows inserted so far may be committed
        try:
            for data in datas:
                shard = shardfmt.parse_shard(data)
                refs = {t.xorb_hash for f in shard.files for t in f.terms}
                missing = sorted(x for x in refs | {x.xorb_hash for x in shard.xorbs})
                missing = [x for x in missing if x not in remote_xorbs and not self.has_xorb(x)]
                if missing:
                    raise ShardFormatError("shard", f"references missing xorb {to_hex(missing[0])}")
                name = to_hex(chunk_hash(data))
                path = self.shard_path(name)
                if not os.path.exists(path):
                    atomic_write(path, data, durable=False, tmp_dir=self.tmp)
                written.append(path)  # also one a killed writer left, maybe never synced
                keep = False
                self._insert_shard(db, name, shard)
                keep = True
                del shard
                names.append(name)
        finally:
            try:
                if self.durable:
                    sync_written(written)
            except BaseException:
                keep = False
                raise
            finally:
                db.execute("COMMIT" if keep else "ROLLBACK")
        return names

    def file_info(self, file_hash: bytes) -> shardfmt.FileInfo | None:
        """The reconstruction of a file, if some stored shard describes it."""
        info = self._infos.get(file_hash)
        if info is not None:
            return info
        q = "SELECT shard, pos FROM files WHERE hash = ?"
        row = self._db().execute(q, (file_hash,)).fetchone()
        if row is None:
            return None
        name, pos = str(row[0]), int(row[1])
        try:
            with self._shard_fd(name) as sf:
                size = self._file_block_size(sf, name, pos)
                block = nowait.pread(sf.fd, size, pos)
        except FileNotFoundError:
            self._forget_shard(name)
            return None
        return self._file_block(file_hash, name, pos, block)

    def _forget_shard(self, name: str) -> None:
        """Drop from the index a shard whose file is gone (deleted by hand, or by a prune an
        older gitxet was killed in): its files are then absent, to be fetched from a
        remote, instead of failing every read of the store. A read-only store keeps its
        rows (each read then finds the file gone again)."""
        db = self._db()
        with contextlib.suppress(sqlite3.Error), db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM files WHERE shard = ?", (name,))
            db.execute("DELETE FROM shards WHERE name = ?", (name,))

    def describe(self, file_hashes: Sequence[bytes], *, keep: bool = True) -> set[bytes]:
        """The files of ``file_hashes`` some stored shard describes, their reconstructions
        read ahead for :meth:`file_info`: one index query per 500 files and one read per
        shard for the blocks of those files (neighbours in a shard when they were added
        together), instead of a query and two reads per file. ``keep`` is for sources that
        could also keep them on disk: these are on disk already."""
        known = {h for h in dict.fromkeys(file_hashes) if self._infos.get(h) is not None}
        want = [h for h in dict.fromkeys(file_hashes) if h not in known]
        by_shard: dict[str, list[tuple[int, bytes]]] = {}
        db = self._db()
        for i in range(0, len(want), 500):
            part = want[i : i + 500]
            q = f"SELECT hash, shard, pos FROM files WHERE hash IN ({','.join('?' * len(part))})"
            for h, name, pos in db.execute(q, part).fetchall():
                by_shard.setdefault(str(name), []).append((int(pos), bytes(h)))
        for name, blocks in by_shard.items():
            blocks.sort()
            lo, last = blocks[0][0], blocks[-1][0]
            try:
                with self._shard_fd(name) as sf:
                    hi = last + self._file_block_size(sf, name, last)
                    span = nowait.pread(sf.fd, hi - lo, lo) if hi - lo <= _DESCRIBE_SPAN else b""
                for pos, h in blocks:
                    if span:
                        head = span[pos - lo : pos - lo + shardfmt.RECORD_SIZE]
                        end = pos - lo + shardfmt.file_block_size(head)
                        if end > len(span):
                            raise ShardFormatError(f"shard {name}", "file blocks overlap")
                        self._file_block(h, name, pos, span[pos - lo : end])
                    else:
                        self.file_info(h)
                    known.add(h)
            except (GitxetError, OSError):
                continue  # file_info reports it, for the file whose read needs it
        return known

    def _shard_fd(self, name: str) -> contextlib.AbstractContextManager[_XorbFile]:
        path = self.shard_path(name)
        return self._shard_fds.use(
            name, lambda: _XorbFile(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        )

    @staticmethod
    def _file_block_size(sf: _XorbFile, name: str, pos: int) -> int:
        size = shardfmt.file_block_size(nowait.pread(sf.fd, shardfmt.RECORD_SIZE, pos))
        if size > shardfmt.MAX_SHARD_BYTES:
            raise ShardFormatError(
                f"shard {name} file block at byte {pos}", f"declares {size} bytes"
            )
        return size

    def _file_block(self, file_hash: bytes, name: str, pos: int, block: bytes) -> shardfmt.FileInfo:
        what = f"shard {name} file block at byte {pos}"
        info = shardfmt.parse_file_block(block, what)
        if info.file_hash != file_hash:
            raise ShardFormatError(what, "holds another file (the index is stale)")
        self._infos.put(file_hash, info)
        return info

    def xorbs_for_files(self, file_hashes: Iterable[bytes]) -> set[bytes]:
        """Every xorb the given files' reconstructions reference (files unknown are skipped)."""
        out: set[bytes] = set()
        for fhash in file_hashes:
            info = self.file_info(fhash)
            if info is not None:
                out.update(t.xorb_hash for t in info.terms)
        return out

    def shards_for_files(self, file_hashes: Iterable[bytes]) -> set[str]:
        """Names of the shards that describe the given files."""
        return set(self.file_shards(file_hashes).values())

    def file_shards(self, file_hashes: Iterable[bytes]) -> dict[bytes, str]:
        """The shard that describes each of ``file_hashes`` the index knows: one query per
        500 files, not one per file."""
        want = list(dict.fromkeys(file_hashes))
        db = self._db()
        out: dict[bytes, str] = {}
        for i in range(0, len(want), 500):
            part = want[i : i + 500]
            q = f"SELECT hash, shard FROM files WHERE hash IN ({','.join('?' * len(part))})"
            for h, name in db.execute(q, part).fetchall():
                out[bytes(h)] = str(name)
        return out

    # ---- misc ----------------------------------------------------------------------------

    def lock(
        self, name: str = "store", *, shared: bool = False
    ) -> contextlib.AbstractContextManager[None]:
        """A cross-process lock scoped to this store."""
        return file_lock(self._lock_path(name), shared=shared)

    def remove_objects(self, shards: Iterable[str], xorbs: Iterable[bytes]) -> None:
        """Re-index the shards that stay (one transaction: readers see the old index or the
        new one), then delete the removed shards, then xorbs: a process killed at any point
        leaves no index entry naming a deleted shard, nor a kept shard naming a deleted
        xorb. The caller makes sure no kept shard names a removed xorb
        (``gitxet.data.prune``)."""
        gone = set(shards)
        with self.lock("prune"):
            db = self._db()
            with db:
                db.execute("BEGIN IMMEDIATE")
                for table in ("files", "chunks", "shards"):
                    db.execute(f"DELETE FROM {table}")
                for name in list(self.shard_names()):
                    if name not in gone:
                        with contextlib.suppress(FormatError, OSError):
                            self._insert_shard(db, name, self._load_shard(name))
            for name in gone:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.shard_path(name))
            for h in xorbs:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.xorb_path(h))
            self._infos.clear()
            self._layouts.clear()
            self._files.clear()
            self._shard_fds.clear()

    def stats(self) -> StoreStats:
        xorbs = xorb_bytes = 0
        for h in self.xorb_hashes():
            xorbs += 1
            xorb_bytes += os.path.getsize(self.xorb_path(h))
        shards = shard_bytes = 0
        for n in self.shard_names():
            shards += 1
            shard_bytes += os.path.getsize(self.shard_path(n))
        return StoreStats(xorbs, xorb_bytes, shards, shard_bytes)
