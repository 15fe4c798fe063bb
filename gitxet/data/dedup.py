"""Dedup against a CAS server: chunks it already stores, found without downloading them.

What ``add`` learns here, for a repository whose remote is a CAS server (the Xet protocol's
upload step 2, ``xet-protocol.md`` §9):

* **Files the commit being edited already has.** Before a file is added at a path, the
  pointer the path had (in ``HEAD``, or in the index) names a file the server holds; its
  shard (the server's file shard, kept in the node cache directory) lists every chunk hash
  of every xorb that file uses. An edit of that file then finds all its unchanged chunks.
  The shard is asked for at the first lookup of a chunk nothing here knows, not before: a
  file whose content *is* that version (git re-cleans the files a checkout just wrote when
  it cannot trust their timestamps, thousands after a clone) costs no request
  (:meth:`RemoteDedup.holds`).
* **The server's global dedup.** A chunk that nothing local knows and that is *eligible*
  (the first chunk of a file, or one whose hash's last word is 0 mod 1024) is asked for
  with ``GET /v1/chunks/default/<hash>``. The answer is a shard of xorbs holding it whose
  chunk hashes are keyed (HMAC) with a key in its footer; the following chunks of the file
  are matched against it by keying their hashes the same way.

A match is a ``(xorb, chunk index)`` of a xorb stored on the server and not here: the new
file's terms point into it, and only its new chunks are uploaded. Dedup is an optimization:
a server that cannot be asked (down, 429) just means the chunks are uploaded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from gitxet.errors import GitxetError
from gitxet.formats import shard as shardfmt
from gitxet.hashing import is_global_dedup_eligible, protected_chunk_hash

#: chunk hashes remembered from file shards (about 64 GiB of data); then it starts over
MAX_KNOWN_CHUNKS = 1 << 20
#: global-dedup answers that keyed hashes are checked against (the ones that matched last)
MAX_ANSWERS = 4
#: global-dedup queries per process (each is a request); more are not asked
MAX_QUERIES = 1024


class DedupServer(Protocol):
    """What dedup needs from a CAS server (``RemoteChunkSource`` and its client)."""

    def file_shard(self, file_hash: bytes) -> shardfmt.Shard | None: ...

    def query_chunk(self, chunk_hash: bytes) -> shardfmt.Shard | None: ...


class _Answer:
    """A global-dedup answer: keyed chunk hash -> (xorb, index)."""

    __slots__ = ("expiry", "key", "where")

    def __init__(self, shard: shardfmt.Shard) -> None:
        footer = shard.footer
        self.key = footer.chunk_hash_hmac_key if footer is not None else bytes(32)
        self.expiry = footer.shard_key_expiry if footer is not None else 0
        self.where = {c.hash: (x.xorb_hash, i) for x in shard.xorbs for i, c in enumerate(x.chunks)}


class RemoteDedup:
    """Chunks a CAS server stores, for :class:`~gitxet.data.clean.Ingestor`; thread-safe."""

    def __init__(self, server: DedupServer, now: Callable[[], float] = time.time) -> None:
        self.server = server
        self._now = now
        self._lock = threading.Lock()
        self._known: dict[bytes, tuple[bytes, int]] = {}
        self._files: set[bytes] = set()  # files whose shard was asked for
        self._told: set[bytes] = set()  # files :meth:`versions` named
        self._pending: list[bytes] = []  # the current file's versions, not asked for yet
        self._learning = threading.Lock()  # one thread asks for the pending shards
        self._answers: list[_Answer] = []
        self._asked: set[bytes] = set()
        self.queries = 0

    def versions(self, file_hashes: Iterable[bytes]) -> None:
        """The versions the file about to be added had (its pointers in ``HEAD`` and in the
        index; the files before it are done): their chunks are learned at its first lookup
        of a chunk unknown here, a shard each (once per file), not now."""
        with self._lock:
            hashes = list(dict.fromkeys(file_hashes))
            if len(self._told) > MAX_KNOWN_CHUNKS:
                self._told.clear()
            self._told.update(hashes)
            self._pending = [h for h in hashes if h not in self._files]

    def holds(self, file_hash: bytes) -> bool:
        """Whether ``file_hash`` is a version :meth:`versions` named: content hashing to it
        is what the commit has already, nothing to store and nothing to ask."""
        with self._lock:
            return file_hash in self._told

    def _learn_pending(self) -> None:
        """Ask for the shards of the pending versions (a thread asking waits for another's)."""
        with self._learning:
            with self._lock:
                pending, self._pending = self._pending, []
            for h in pending:
                self.add_file(h)

    def add_file(self, file_hash: bytes) -> None:
        """Learn the chunks of a file the server holds (its shard; once per file)."""
        with self._lock:
            if file_hash in self._files:
                return
            self._files.add(file_hash)
        try:
            shard = self.server.file_shard(file_hash)
        except GitxetError:
            return
        if shard is None:
            return
        with self._lock:
            if len(self._known) > MAX_KNOWN_CHUNKS:
                self._known.clear()
            for x in shard.xorbs:
                for i, c in enumerate(x.chunks):
                    self._known.setdefault(c.hash, (x.xorb_hash, i))

    def lookup(
        self, hashes: Sequence[bytes], first_in_file: bool = False
    ) -> dict[bytes, tuple[bytes, int]]:
        """Where the server stores the given chunks (those it is known to store).

        ``first_in_file``: ``hashes[0]`` is a file's first chunk (always eligible for a
        global-dedup query).
        """
        self._learn_pending()  # (waits while another thread asks for them)
        out: dict[bytes, tuple[bytes, int]] = {}
        rest: list[tuple[int, bytes]] = []
        with self._lock:
            for i, h in enumerate(hashes):
                loc = self._known.get(h)
                if loc is not None:
                    out[h] = loc
                else:
                    rest.append((i, h))
        if not rest:
            return out
        for i, h in rest:
            if h in out:
                continue
            loc = self._answered(h)
            if loc is None and is_global_dedup_eligible(h, first_in_file and i == 0):
                loc = self._query(h)
            if loc is not None:
                out[h] = loc
        return out

    def _answered(self, h: bytes) -> tuple[bytes, int] | None:
        """``h`` found in a global-dedup answer (keyed with that answer's key)."""
        with self._lock:
            answers = list(self._answers)
        now = self._now()
        for a in answers:
            if a.expiry and a.expiry < now:
                continue  # the server's key expired: its answer no longer counts
            loc = a.where.get(protected_chunk_hash(a.key, h))
            if loc is not None:
                with self._lock:  # most recently useful first
                    if a in self._answers:
                        self._answers.remove(a)
                        self._answers.insert(0, a)
                return loc
        return None

    def _query(self, h: bytes) -> tuple[bytes, int] | None:
        with self._lock:
            if h in self._asked or self.queries >= MAX_QUERIES:
                return None
            self._asked.add(h)
            self.queries += 1
        try:
            shard = self.server.query_chunk(h)
        except GitxetError:
            return None
        if shard is None:
            return None
        answer = _Answer(shard)
        with self._lock:
            self._answers.insert(0, answer)
            del self._answers[MAX_ANSWERS:]
        return answer.where.get(protected_chunk_hash(answer.key, h))
