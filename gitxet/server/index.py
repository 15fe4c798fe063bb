"""The server's in-memory index over the shards and xorbs in a backend; rebuildable.

It answers three questions quickly: which stored shard describes a file, which xorb holds a
global-dedup-eligible chunk, and where each chunk of a xorb sits (its layout, read from the
xorb's footer). All of it is derived from the backend, so a process may start empty, and
several processes on one bucket stay consistent without talking to each other:

* every registered shard also gets an empty marker ``shard-log/<unix ns>-<name>``; a refresh
  lists only the markers newer than the last one seen (minus a clock-skew window), so it
  costs one small LIST however many shards the bucket holds;
* a file lookup that misses waits for a refresh that *started after* the miss, so a file
  registered through another replica is always found; dedup lookups (best effort, and
  frequent) refresh at most once per ``refresh_interval`` seconds;
* xorb existence and layouts are read from the backend directly and cached forever, since
  stored objects never change.

Only *eligible* chunks are indexed for dedup (hash ``% 1024 == 0``, or the first chunk of a
file), because those are the only ones clients ask about; that keeps the index ~1000x
smaller than a full chunk map.
"""

from __future__ import annotations

import mmap
import threading
import time
from collections.abc import Hashable, Iterable

from gitxet.errors import FormatError, IntegrityError, XorbNotFoundError
from gitxet.formats import shard as shardfmt
from gitxet.formats import xorb as xorbfmt
from gitxet.hashing import from_hex, is_hex, last_word, to_hex
from gitxet.server.backends import Backend, ObjectMissingError
from gitxet.store.cas import XorbLayout
from gitxet.util.lru import LRUCache

__all__ = ["CasIndex", "shard_key", "xorb_key"]

XORB_PREFIX = "xorbs/default/"
SHARD_PREFIX = "shards/"
LOG_PREFIX = "shard-log/"
#: Markers up to this much older than the newest one seen are listed again, so a replica
#: whose clock lags cannot hide a shard from the others.
SKEW_NS = 300 * 10**9
#: Lookups of unknown files list the shard log at most this often (a read token looping on
#: random ids costs one listing per interval, not one per request).
MISS_INTERVAL = 0.25
#: A marker directory's version is trusted once it has not changed for this long (clock
#: granularity and skew of shared filesystems); and the log is listed at least this often.
SETTLED = 5.0
RELIST_EVERY = 60.0
_FOOTER_PROBE = 16 * 1024


def xorb_key(xorb_hash: bytes) -> str:
    """Backend key of a xorb."""
    return XORB_PREFIX + to_hex(xorb_hash)


def shard_key(name: str) -> str:
    """Backend key of a shard named by the Xet hex of its content hash."""
    return f"{SHARD_PREFIX}{name}.shard"


def log_key(name: str, now_ns: int | None = None) -> str:
    """Backend key of the time-ordered marker written after a shard is stored."""
    t = time.time_ns() if now_ns is None else now_ns
    return f"{LOG_PREFIX}{t:020d}-{name}"


def _eligible(h: bytes) -> bool:
    return last_word(h) % 1024 == 0


class CasIndex:
    """File, dedup and layout lookups over a :class:`Backend`. Thread-safe."""

    def __init__(
        self,
        backend: Backend,
        *,
        refresh_interval: float = 1.0,
        miss_interval: float = MISS_INTERVAL,
        cache_shards: int = 256,
    ) -> None:
        self.backend = backend
        self.refresh_interval = refresh_interval
        self.miss_interval = miss_interval
        self._last_list = float("-inf")  # when the last listing began (monotonic)
        self._seen: Hashable | None = None  # the marker directory's version at that listing
        self._seen_settled = False  # ... taken long enough after its last change to trust
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._files: dict[bytes, str] = {}
        self._chunks: dict[bytes, bytes] = {}
        self._shards: set[str] = set()
        self._xorbs: set[bytes] = set()
        self._layouts: LRUCache[bytes, XorbLayout] = LRUCache(8192)
        self._shard_cache: LRUCache[str, shardfmt.Shard] = LRUCache(cache_shards)
        self._last_refresh = float("-inf")
        self._log_mark: str | None = None  # newest marker seen; None: no full listing yet

    # ---- shards ---------------------------------------------------------------------------

    def register(
        self, name: str, shard: shardfmt.Shard, first_chunks: dict[bytes, bytes] | None = None
    ) -> None:
        """Index a shard stored under :func:`shard_key` ``(name)``.

        ``first_chunks`` (chunk hash -> xorb) adds files' first chunks that the shard's own
        CAS blocks cannot name (a first term pointing into an older xorb); the uploading
        process knows them from the layouts it validated against.
        """
        cas = {x.xorb_hash: x for x in shard.xorbs}
        chunks: dict[bytes, bytes] = dict(first_chunks or {})
        for x in shard.xorbs:
            for c in x.chunks:
                if _eligible(c.hash):
                    chunks.setdefault(c.hash, x.xorb_hash)
        for f in shard.files:
            if f.terms:
                t = f.terms[0]
                first = cas.get(t.xorb_hash)
                if first is not None and t.chunk_start < len(first.chunks):
                    chunks.setdefault(first.chunks[t.chunk_start].hash, t.xorb_hash)
        with self._lock:
            for f in shard.files:
                self._files.setdefault(f.file_hash, name)
            for h, xh in chunks.items():
                self._chunks.setdefault(h, xh)
            self._xorbs.update(cas)
            self._shards.add(name)
            self._shard_cache.put(name, shard)

    def has_shard(self, name: str) -> bool:
        """Whether this process has indexed the shard."""
        with self._lock:
            return name in self._shards

    def load_shard(self, name: str) -> shardfmt.Shard:
        """A stored shard, parsed (cached).

        Raises:
            ObjectMissingError: no such shard.
            IntegrityError: the stored bytes no longer parse.
        """
        with self._lock:
            s = self._shard_cache.get(name)
        if s is not None:
            return s
        data = self.backend.get(shard_key(name))
        try:
            s = shardfmt.parse_shard(data)
        except FormatError as e:
            raise IntegrityError("shard", name, f"stored shard is damaged ({e})") from None
        with self._lock:
            self._shard_cache.put(name, s)
        return s

    def refresh(self, *, force: bool = False, since: float | None = None) -> int:
        """Index shards other processes stored since the last refresh; returns how many.

        Without ``force`` or ``since`` this does nothing if the last refresh began less than
        ``refresh_interval`` seconds ago, so a burst of misses costs one listing. With
        ``since`` (a ``time.monotonic()`` value) it makes sure a refresh began after then.
        """
        if since is not None:
            # Misses list at most once per miss_interval. The wait happens outside the
            # lock, so everyone who misses meanwhile waits alongside and is served by the
            # one listing that follows.
            with self._refresh_lock:
                if self._last_refresh >= since or self._skip_unchanged(force):
                    return 0
                wait = self._last_list + self.miss_interval - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        with self._refresh_lock:
            now = time.monotonic()
            if since is not None:
                if self._last_refresh >= since:
                    return 0
            elif not force and now - self._last_refresh < self.refresh_interval:
                return 0
            probe = self.backend.version(LOG_PREFIX) if self._log_mark is not None else None
            if not force and self._unchanged(probe, now):
                self._last_refresh = now
                return 0
            self._last_refresh = self._last_list = now
            self._seen = None if probe is None else probe[1]
            self._seen_settled = probe is not None and time.time() - probe[0] >= SETTLED
            if self._log_mark is None:
                names = [
                    k[len(SHARD_PREFIX) :].removesuffix(".shard")
                    for k in self.backend.list(SHARD_PREFIX)
                ]
                marks = list(self.backend.list(LOG_PREFIX))
                self._log_mark = marks[-1] if marks else ""
            else:
                start = self._log_mark[len(LOG_PREFIX) :].partition("-")[0]
                after = LOG_PREFIX + f"{max(0, int(start or 0) - SKEW_NS):020d}"
                names = []
                for k in self.backend.list(LOG_PREFIX, start_after=after):
                    names.append(k.rpartition("-")[2])
                    self._log_mark = max(self._log_mark, k)
            new = 0
            for name in names:
                if not is_hex(name) or self.has_shard(name):
                    continue
                try:
                    self.register(name, self.load_shard(name))
                    new += 1
                except (ObjectMissingError, IntegrityError):
                    continue  # deleted under us, or damaged: skip rather than fail startup
            return new

    def _skip_unchanged(self, force: bool) -> bool:
        """Under the lock: when the marker directory is provably unchanged, note a refresh
        now and say so (nothing to list, nothing to wait for)."""
        if force or self._log_mark is None:
            return False
        now = time.monotonic()
        if self._unchanged(self.backend.version(LOG_PREFIX), now):
            self._last_refresh = now
            return True
        return False

    def _unchanged(self, probe: tuple[float, Hashable] | None, now: float) -> bool:
        """Whether the marker directory provably gained nothing since the last listing.

        Its version was taken before that listing; a marker created since changes it,
        unless it landed within the filesystem's timestamp granularity of the change
        before, which cannot happen once the directory had been quiet for ``SETTLED``
        seconds when the version was taken. A full listing still runs every
        ``RELIST_EVERY`` seconds.
        """
        return (
            probe is not None
            and self._seen_settled
            and probe[1] == self._seen
            and now - self._last_list < RELIST_EVERY
        )

    def rebuild(self) -> int:
        """Forget everything and index every shard in the backend."""
        with self._lock:
            self._files.clear()
            self._chunks.clear()
            self._shards.clear()
        with self._refresh_lock:
            self._log_mark = None
        return self.refresh(force=True)

    # ---- lookups ----------------------------------------------------------------------------

    def file_info(self, file_hash: bytes) -> shardfmt.FileInfo | None:
        """The stored reconstruction of a file, looking in the backend on a miss."""
        for attempt in range(2):
            missed = time.monotonic()
            with self._lock:
                name = self._files.get(file_hash)
            if name is not None:
                for f in self.load_shard(name).files:
                    if f.file_hash == file_hash:
                        return f
                return None
            if attempt == 0:
                self.refresh(since=missed)
        return None

    def has_file(self, file_hash: bytes) -> bool:
        """Whether an indexed shard describes the file (memory only, no refresh)."""
        with self._lock:
            return file_hash in self._files

    def xorb_for_chunk(self, chunk_hash: bytes) -> bytes | None:
        """A xorb that holds an eligible chunk, looking in the backend on a miss."""
        for attempt in range(2):
            with self._lock:
                xh = self._chunks.get(chunk_hash)
            if xh is not None:
                return xh
            if attempt == 0 and not self.refresh():
                return None
        return None

    def files(self) -> Iterable[bytes]:
        """Every indexed file hash (a snapshot)."""
        with self._lock:
            return list(self._files)

    # ---- xorbs ------------------------------------------------------------------------------

    def has_xorb(self, xorb_hash: bytes) -> bool:
        """Whether the backend holds the xorb (positive answers are cached)."""
        with self._lock:
            if xorb_hash in self._xorbs:
                return True
        if self.backend.exists(xorb_key(xorb_hash)):
            self.add_xorb(xorb_hash)
            return True
        return False

    def add_xorb(self, xorb_hash: bytes, layout: XorbLayout | None = None) -> None:
        """Note a xorb as stored (and its layout, when the caller just computed it)."""
        with self._lock:
            self._xorbs.add(xorb_hash)
            if layout is not None:
                self._layouts.put(xorb_hash, layout)

    def forget_xorb(self, xorb_hash: bytes) -> None:
        """Note that the backend lost the xorb (a read found its object gone): it counts as
        not stored again, so an upload of it is taken instead of answered "already here"."""
        with self._lock:
            self._xorbs.discard(xorb_hash)
            self._layouts.discard(xorb_hash)

    def cached_layout(self, xorb_hash: bytes) -> XorbLayout | None:
        """The layout if it is in memory (never touches the backend; safe on the event loop)."""
        with self._lock:
            return self._layouts.get(xorb_hash)

    def layout(self, xorb_hash: bytes) -> XorbLayout:
        """Where each chunk of a stored xorb is, read from its footer and verified.

        Raises:
            XorbNotFoundError: not stored.
            IntegrityError: the stored footer is missing, damaged or names other chunks.
        """
        with self._lock:
            lay = self._layouts.get(xorb_hash)
        if lay is not None:
            return lay
        hx = to_hex(xorb_hash)
        key = xorb_key(xorb_hash)
        try:
            tail, size = self.backend.get_tail(key, _FOOTER_PROBE)
            if len(tail) >= 4:
                need = int.from_bytes(tail[-4:], "little") + 4
                if len(tail) < need <= size:
                    tail, size = self.backend.get_tail(key, need)
        except ObjectMissingError:
            raise XorbNotFoundError(hx) from None
        footer = _footer_from_tail(tail, size, hx)
        lay = XorbLayout.from_footer(xorb_hash, footer)
        self.add_xorb(xorb_hash, lay)
        return lay


def _footer_from_tail(tail: bytes, size: int, hx: str) -> xorbfmt.XorbFooter:
    """Parse a xorb footer given only the object's last bytes and its total size.

    ``parse_footer`` checks the footer against the body length, so it is handed an
    anonymous mapping of the object's full size (zero pages cost nothing until touched)
    with the tail copied to its end.
    """
    if size < len(tail) or size == 0:
        raise IntegrityError("xorb", hx, "stored object is empty or shorter than its tail")
    m = mmap.mmap(-1, size)
    try:
        m[size - len(tail) :] = tail
        with memoryview(m) as mv:
            try:
                footer = xorbfmt.parse_footer(mv)
            except FormatError as e:
                raise IntegrityError("xorb", hx, f"damaged footer ({e.reason})") from None
    finally:
        m.close()
    if footer is None:
        raise IntegrityError("xorb", hx, "stored without its chunk index footer")
    return footer


def parse_hex(s: str) -> bytes | None:
    """Raw hash of a Xet hex path segment, or ``None`` when malformed."""
    return from_hex(s) if is_hex(s) else None
