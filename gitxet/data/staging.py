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
first appended to a **journal** (``<store>/staging/*.journal``, one per live session, held
under an ``flock``). The journal is as durable as git's own loose objects (written, not
fsynced); it is truncated once the batch it covers is stored durably, and removed when the
session closes. If the process dies first, :func:`recover` (run when the next session
starts, and before pushes) ingests what the dead session's journal holds, so every pointer
git recorded still finds its data. A record cut short by the crash was never acknowledged
to git and is dropped.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import struct
import threading
import time
from typing import BinaryIO

from gitxet.data.clean import Ingestor, IngestResult
from gitxet.data.dedup import RemoteDedup
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
    ) -> None:
        self.cas = cas
        self.dedup = dedup
        self.stage_max = stage_max
        self.batch_files = batch_files
        self._lock = threading.Lock()
        self._ingestor: Ingestor | None = None
        self._journal: BinaryIO | None = None
        self._journal_path = ""
        self._staged_files = 0
        #: batches written to the store (for tests and statistics)
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
            f = open(name + ".new", "w+b")  # noqa: SIM115 - held until close()
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
            self._ingestor = Ingestor(self.cas, dedup=self.dedup)
        return self._ingestor

    def add(self, stream: BinaryIO, head: bytes = b"") -> IngestResult:
        """Ingest one file (``head``, then the rest of ``stream``). Its data is in the store,
        or in the journal, when this returns."""
        if len(head) <= self.stage_max:
            head += read_up_to(stream, self.stage_max + 1 - len(head))
        with self._lock:
            ing = self._session()
            if len(head) <= self.stage_max:
                if not ing.fits(len(head)):
                    self._flush_locked()  # the xorb being built is full: store it
                j = self._open_journal()
                j.write(_LEN.pack(len(head)))
                j.write(head)
                j.flush()  # in the kernel: survives this process, like git's loose objects
                result = ing.add_bytes(head)
                self._staged_files += 1
                if self._staged_files >= self.batch_files:
                    self._flush_locked()
                return result
            rest = io.BufferedReader(Chained(head, stream), 8 << 20)
            result = ing.add_stream(rest)
            self._flush_locked()  # a big file is durable before its pointer is returned
            return result

    def flush(self) -> None:
        """Write everything staged to the store (xorbs, then one shard) and empty the journal."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._ingestor is not None:
            self._ingestor.flush()
            self.flushes += 1
        self._reset_journal()
        self._staged_files = 0

    def close(self) -> None:
        """Flush, then remove the journal. A failed flush keeps it for :func:`recover`."""
        with self._lock:
            try:
                self._flush_locked()
            finally:
                ing, self._ingestor = self._ingestor, None
                if ing is not None:
                    ing.close()
            j, self._journal = self._journal, None
            if j is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self._journal_path)
                j.close()

    def __enter__(self) -> StagedIngest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
