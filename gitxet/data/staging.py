"""Batched ingest for the filter process: many small files share xorbs and one shard.

git hands the long-running filter one file at a time and stores the pointer it gets back.
Flushing every file on its own (a xorb, a shard, two fsyncs and an index transaction each)
costs ~20 ms per file and makes one tiny xorb per file. A :class:`StagedIngest` keeps one
:class:`~gitxet.data.clean.Ingestor` session for the whole conversation instead: chunks of
consecutive files are packed into shared xorbs of up to the protocol's 64 MiB, and the store
is written once per xorb: when the next small file would not fit in the xorb being built
(so small files are never split across xorbs), when a big file arrives (it is stored before
its pointer is returned), after :data:`BATCH_FILES` files, and when the session ends.

A pointer is handed to git before its data is in the store, so each small file's bytes are
first appended to a **journal** (``<store>/staging/*.journal``, one per batch, held under an
``flock`` by the live session). The journal is as durable as git's own loose objects
(written, not fsynced); it is removed only once the batch it covers is stored durably. If
the process dies first, :func:`recover` (run when the next session starts, and before
pushes) ingests what the dead session's journals hold, so every pointer git recorded still
finds its data. A record cut short by the crash was never acknowledged to git and is dropped.

A full batch (its xorb full, or :data:`BATCH_FILES` files) is stored **in the background**
while the next batch fills a new journal: writing a 64 MiB xorb, its shard and the store's
index took ~20% of a small-file ``git add`` when git waited for it. The durability argument
is unchanged, because it never relied on the store: every pointer git holds has its bytes in
a journal that is unlinked only after its batch's xorb, shard and index are durable. At most
one batch is being stored at a time (the next rotation waits for it), which bounds memory to
about two xorbs; a failed background store is raised by the next :meth:`StagedIngest.add` (or
by :meth:`StagedIngest.close`) and leaves its journal for :func:`recover`. A big file and
:meth:`StagedIngest.flush` are stored before they return, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO

from gitxet.data.clean import Hashed, Ingestor, IngestResult, hash_small, unchanged
from gitxet.data.dedup import RemoteDedup
from gitxet.formats import xorb as xorbfmt
from gitxet.store.cas import LocalCAS
from gitxet.util.streams import Chained, read_up_to

#: files up to this size are staged (journaled and packed); bigger ones flush the session
STAGE_MAX = 8 << 20
#: files staged before the session is written (bounds the journal and the session's memory)
BATCH_FILES = 20_000

_MAGIC = b"gitxet-journal-1\n"
_LEN = struct.Struct(">Q")
#: a journal still being created (``.journal.new``) this old was left by a dead session
_STALE_NEW_S = 60.0


def journal_dir(cas: LocalCAS) -> str:
    """Where the journals of a store's sessions live."""
    return os.path.join(cas.root, "staging")


class StagedIngest:
    """One batching ingest session over ``cas``; thread-safe; :meth:`close` it (or use
    ``with``) to write what is staged."""

    def __init__(
        self,
        cas: LocalCAS,
        *,
        stage_max: int = STAGE_MAX,
        batch_files: int = BATCH_FILES,
        dedup: RemoteDedup | None = None,
        max_xorb_bytes: int = xorbfmt.MAX_XORB_BYTES,
    ) -> None:
        self.cas = cas
        self.dedup = dedup
        self.stage_max = stage_max
        self.batch_files = batch_files
        self._max_xorb_bytes = max_xorb_bytes
        self._lock = threading.Lock()
        self._ingestor: Ingestor | None = None
        self._journal: BinaryIO | None = None
        self._journal_path = ""
        self._staged_files = 0
        # the batch being stored in the background (at most one) and its thread
        self._storing: Future[None] | None = None
        self._storer: ThreadPoolExecutor | None = None
        #: batches handed to the store (for tests and statistics)
        self.flushes = 0

    # ---- the journal -----------------------------------------------------------------------

    def _open_journal(self) -> BinaryIO:
        if self._journal is None:
            d = journal_dir(self.cas)
            os.makedirs(d, exist_ok=True)
            name = os.path.join(d, f"{os.getpid()}-{os.urandom(6).hex()}.journal")
            # locked before :func:`recover` can see it: under its final name an unlocked
            # journal looks like a dead session's, and a recover racing this open would
            # unlink it (this session then journaling into a deleted file)
            f = open(name + ".new", "w+b")  # noqa: SIM115 - held until its batch is stored
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                f.write(_MAGIC)
                f.flush()
                os.rename(name + ".new", name)
            except BaseException:
                f.close()
                with contextlib.suppress(OSError):
                    os.unlink(name + ".new")
                raise
            self._journal = f
            self._journal_path = name
        return self._journal

    def _reset_journal(self) -> None:
        j = self._journal
        if j is not None:
            j.seek(len(_MAGIC))
            j.truncate()

    # ---- ingest ------------------------------------------------------------------------------

    def _session(self) -> Ingestor:
        if self._ingestor is None:
            self._ingestor = Ingestor(
                self.cas, dedup=self.dedup, max_xorb_bytes=self._max_xorb_bytes
            )
        return self._ingestor

    def add(
        self,
        stream: BinaryIO,
        head: bytes = b"",
        hashed: Callable[[bytes], Hashed | None] | None = None,
    ) -> IngestResult:
        """Ingest one file (``head``, then the rest of ``stream``). Its data is in the store,
        or in a journal, when this returns. ``hashed(data)``: the :func:`hash_small` of a
        small file's bytes if it is known already (else None)."""
        if len(head) <= self.stage_max:
            head += read_up_to(stream, self.stage_max + 1 - len(head))
        known = hashed(head) if hashed is not None and len(head) <= self.stage_max else None
        dedup = self.dedup
        if dedup is not None and len(head) <= self.stage_max:
            # a version the path has already (git re-cleaning a file it just checked out):
            # nothing to journal, store or ask the server
            known = known or hash_small(head)
            same = unchanged(dedup, known, len(head))
            if same is not None:
                return same
        with self._lock:
            self._check_storing()
            ing = self._session()
            if len(head) <= self.stage_max:
                if not ing.fits(len(head)):
                    self._rotate_locked()  # the xorb being built is full: store it
                    ing = self._session()
                j = self._open_journal()
                j.write(_LEN.pack(len(head)))
                j.write(head)
                j.flush()  # in the kernel: survives this process, like git's loose objects
                result = ing.add_bytes(head, known)
                self._staged_files += 1
                if self._staged_files >= self.batch_files:
                    self._rotate_locked()
                return result
            rest = io.BufferedReader(Chained(head, stream), 8 << 20)
            result = ing.add_stream(rest)
            self._flush_locked()  # a big file is durable before its pointer is returned
            return result

    def flush(self) -> None:
        """Write everything staged to the store (xorbs, then one shard) and empty the journal."""
        with self._lock:
            self._wait_storing()
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._ingestor is not None:
            self._ingestor.flush()
            self.flushes += 1
        self._reset_journal()
        self._staged_files = 0

    def _rotate_locked(self) -> None:
        """Hand the current batch (its session and journal) to the background store; the
        next file starts a new one. Waits for the batch stored before (one at a time)."""
        ing, j, path = self._ingestor, self._journal, self._journal_path
        if ing is None:
            return
        self._wait_storing()
        self._ingestor, self._journal, self._journal_path = None, None, ""
        self._staged_files = 0
        if self._storer is None:
            self._storer = ThreadPoolExecutor(1, thread_name_prefix="gitxet-staged-store")
        self._storing = self._storer.submit(_store_batch, ing, j, path)
        self.flushes += 1

    def _check_storing(self) -> None:
        """Raise the failure of a background store that has finished (without waiting)."""
        fut = self._storing
        if fut is not None and fut.done():
            self._storing = None
            fut.result()

    def _wait_storing(self) -> None:
        fut, self._storing = self._storing, None
        if fut is not None:
            fut.result()  # re-raises a failed store (its journal is kept for recover)

    def close(self) -> None:
        """Flush, then remove the journal. A failed flush (or background store) keeps its
        journal for :func:`recover`."""
        with self._lock:
            failed: BaseException | None = None
            try:
                self._wait_storing()
            except BaseException as exc:  # the batch stored before failed: store this one
                failed = exc
            finally:
                if self._storer is not None:
                    self._storer.shutdown(wait=True)
                    self._storer = None
            stored = False
            try:
                self._flush_locked()
                stored = True
            finally:
                ing, self._ingestor = self._ingestor, None
                j, self._journal = self._journal, None
                try:
                    if ing is not None:
                        ing.close()
                finally:
                    if j is not None:
                        if stored:
                            with contextlib.suppress(OSError):
                                os.unlink(self._journal_path)
                        j.close()  # unlocked: a journal kept is recover's now
            if failed is not None:
                raise failed

    def __enter__(self) -> StagedIngest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _store_batch(ing: Ingestor, journal: BinaryIO | None, path: str) -> None:
    """Store a full batch durably, then remove its journal (kept, and unlocked for
    :func:`recover`, if storing fails)."""
    try:
        ing.flush()
    except BaseException:
        with contextlib.suppress(Exception):
            ing.close()
        if journal is not None:
            journal.close()  # the lock goes with it: the journal is now a dead session's
        raise
    try:
        ing.close()
    finally:
        if journal is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)  # unlinked before unlocked: recover never sees it stored
            journal.close()


def recover(cas: LocalCAS) -> int:
    """Store the data of journals left by sessions that died; returns the files recovered.

    A journal whose session is alive (its lock is held) is left alone. Safe to run from
    several processes at once.
    """
    d = journal_dir(cas)
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return 0
    count = 0
    for name in names:
        path = os.path.join(d, name)
        if name.endswith(".journal.new"):
            _remove_if_dead(path)  # a session that died before its first record
            continue
        if not name.endswith(".journal"):
            continue
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            continue
        with f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live session
            if not os.path.exists(path):
                continue  # its owner closed it meanwhile (unlinked, then unlocked)
            datas = _records(f)
            if datas:
                with Ingestor(cas) as ing:
                    for data in datas:
                        ing.add_bytes(data)
                    ing.flush()
                count += len(datas)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return count


def _remove_if_dead(path: str) -> None:
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with f:
        # a young one may be a session between its open and its flock: leave it
        if time.time() - os.fstat(f.fileno()).st_mtime < _STALE_NEW_S:
            return
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _records(f: BinaryIO) -> list[bytes]:
    """The complete records of a journal (a torn last record was never acknowledged)."""
    if f.read(len(_MAGIC)) != _MAGIC:
        return []
    out: list[bytes] = []
    while True:
        head = f.read(_LEN.size)
        if len(head) < _LEN.size:
            return out
        (n,) = _LEN.unpack(head)
        data = f.read(n)
        if len(data) < n:
            return out
        out.append(data)
