"""``XetFileSystem``: any commit of a gitxet repository as a read-only fsspec filesystem.

Listings and sizes come from git trees through :class:`~gitxet.vfs.model.CommitFS` (no file
data is fetched for them); file data is read through the same ``CommitFS.read`` the mount
uses, so only the chunks a range needs are read, and every byte is verified first. The URL
grammar is in :mod:`gitxet.fsspec.url`.

fsspec keeps one instance per thread (its instance cache is keyed by thread), so the state
worth sharing — opened repositories, resolved revisions, commits and decoded chunks — lives in
a process-wide :class:`CommitPool` per set of options, shared by those instances.
"""

from __future__ import annotations

import atexit
import datetime
import errno
import stat
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

from fsspec.spec import AbstractFileSystem
from fsspec.utils import stringify_path

from gitxet.data.reconstruct import DEFAULT_CHUNK_CACHE_BYTES
from gitxet.dataset import HttpAccess
from gitxet.fsspec.file import READAHEAD_CACHE, XetFile
from gitxet.fsspec.sources import DEFAULT_MAX_COMMITS, CommitPool, FetchStats, Lease
from gitxet.fsspec.url import PROTOCOL, XetURL, canonical, parse_url
from gitxet.settings import Settings, redact
from gitxet.vfs.nodes import Attrs, NodeKind

DEFAULT_MAX_GAP = 64 << 10  # cat_ranges merges ranges this close: about one chunk
_RANGE_WORKERS = 4

_pools: dict[tuple[int, int, Settings], CommitPool] = {}
_pools_lock = threading.Lock()


@atexit.register
def _shutdown_pools() -> None:
    """The pools live as long as the process (instances share them): their connections are
    closed when it ends, not left to the garbage collector."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.shutdown()


def _shared_pool(
    cache_bytes: int,
    max_commits: int,
    token: str | None = None,
    cache_dir: str | None = None,
    cache_size: str | None = None,
    cas_url: str | None = None,
) -> CommitPool:
    """The pool for these options, with the CLI's settings (``gitxet.settings``): the same
    cache directory, cache cap, cache tier and token lookup under every variable the CLI
    honours."""
    settings = Settings.load(
        cache_dir=cache_dir, cache_size=cache_size, token=token, cas_url=cas_url
    )
    key = (cache_bytes, max_commits, settings)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            access = HttpAccess.from_settings(settings)
            pool = _pools[key] = CommitPool(cache_bytes, max_commits, access)
        return pool


def _read_only(what: str) -> NoReturn:
    raise PermissionError(
        errno.EROFS, f"xet:// is read-only: cannot {what} (change data with git and git xet)"
    )


def _span(start: int | None, end: int | None, size: int) -> tuple[int, int]:
    """Absolute [start, end) of a Python-slice-like range of a file of ``size`` bytes."""
    s = 0 if start is None else (max(0, size + start) if start < 0 else start)
    e = size if end is None else (size + end if end < 0 else end)
    e = min(e, size)
    return s, max(s, e)


class XetFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """Read-only fsspec filesystem over gitxet commits: ``xet://<repo>@<rev>/<path>``.

    Args:
        cache_bytes: memory for decoded chunks, shared by all commits (and by every instance
            created with the same options in this process).
        max_commits: commits kept open (LRU); one in use by an open file is never closed.
        block_size: the largest read-ahead of files opened here (default 8 MiB).
        cas_url: a cache tier (``git xet serve --upstream``) to read file data through,
            like ``GITXET_CAS_URL``; git metadata still comes from the repository's server.

    Errors: a missing path, repository or revision raises ``FileNotFoundError`` (the message
    says which); a malformed URL raises :class:`~gitxet.errors.URLFormatError` (a
    ``ValueError``); any write raises ``PermissionError`` (``EROFS``); a server that refuses
    the token (or gets none) raises ``PermissionError`` (``EACCES``); data that cannot be
    fetched or fails verification raises ``OSError`` (``EIO``) and is never returned.
    """

    protocol = PROTOCOL
    root_marker = ""

    def __init__(
        self,
        *,
        cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES,
        max_commits: int = DEFAULT_MAX_COMMITS,
        block_size: int | None = None,
        token: str | None = None,
        cache_dir: str | None = None,
        cache_size: str | None = None,
        cas_url: str | None = None,
        **storage_options: Any,
    ) -> None:
        if self._cached:
            return
        if "watch" in storage_options:
            # fsspec would keep an unknown option silently: say why it does nothing here
            raise ValueError(
                "xet:// paths name one commit and do not follow a branch: resolve the branch "
                "again to see new commits, or mount it with 'git xet mount --watch'"
            )
        super().__init__(**storage_options)
        self._pool = _shared_pool(cache_bytes, max_commits, token, cache_dir, cache_size, cas_url)
        self._block_size = block_size

    # ---- paths ---------------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        return canonical(stringify_path(path))

    @classmethod
    def _parent(cls, path: str) -> str:
        p = cls._strip_protocol(path)
        at = p.find("@")
        if at < 0 or p.find("/", at + 1) < 0:
            return str(p)  # a commit's root is its own parent
        return str(p.rsplit("/", 1)[0])

    def unstrip_protocol(self, name: str) -> str:
        return name if name.startswith(PROTOCOL + "://") else f"{PROTOCOL}://{name}"

    @property
    def fsid(self) -> str:
        return PROTOCOL

    # ---- commits -------------------------------------------------------------------------

    @property
    def fetch_stats(self) -> FetchStats:
        """Chunk bytes, chunks and read calls fetched from storage so far (this pool)."""
        return self._pool.stats

    def reset_fetch_stats(self) -> None:
        self._pool.reset_stats()

    def resolve(self, path: str) -> str:
        """The full commit id the revision of ``path`` names now."""
        url = parse_url(stringify_path(path))
        return self._pool.resolve(url.repo, url.rev)

    def acquire_path(self, url: XetURL) -> tuple[Lease, Attrs]:
        """The commit of ``url`` and the attributes of its path; :meth:`release_lease` it."""
        lease = self._pool.acquire(url.repo, url.rev)
        try:
            return lease, self._attrs(lease, url)
        except BaseException:
            self._pool.release(lease)
            raise

    def release_lease(self, lease: Lease) -> None:
        self._pool.release(lease)

    def _attrs(self, lease: Lease, url: XetURL) -> Attrs:
        try:
            return lease.value.fs.resolve_path(url.path.encode("utf-8", "surrogateescape"))
        except (FileNotFoundError, NotADirectoryError):
            commit = lease.value.key[1][:12]
            raise FileNotFoundError(
                errno.ENOENT, f"xet: no {url.path or '/'!r} at {url.rev} ({commit})"
            ) from None

    def _entry(self, lease: Lease, url: XetURL, path: str, attrs: Attrs) -> dict[str, Any]:
        kind = {NodeKind.FILE: "file", NodeKind.DIR: "directory"}.get(attrs.kind, "other")
        out: dict[str, Any] = {
            "name": url.name(path),
            "size": 0 if attrs.kind is NodeKind.DIR else attrs.size,
            "type": kind,
            "mode": stat.S_IMODE(attrs.mode),
            "mtime": lease.value.mtime,
            "commit": lease.value.key[1],
        }
        if attrs.kind is NodeKind.SYMLINK:
            out["islink"] = True
            target = lease.value.fs.readlink(attrs.ino)
            out["destination"] = target.decode("utf-8", "surrogateescape")
        return out

    # ---- listing -------------------------------------------------------------------------

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """Entries of a directory (or the one entry of a file), from the git tree only."""
        url = parse_url(stringify_path(path))
        lease, attrs = self.acquire_path(url)
        try:
            if attrs.kind is not NodeKind.DIR:
                entries = [self._entry(lease, url, url.path, attrs)]
            else:
                base = url.path + "/" if url.path else ""
                entries = [
                    self._entry(lease, url, base + name.decode("utf-8", "surrogateescape"), a)
                    for name, a in lease.value.fs.readdir(attrs.ino)
                ]
        finally:
            self.release_lease(lease)
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        url = parse_url(stringify_path(path))
        lease, attrs = self.acquire_path(url)
        try:
            return self._entry(lease, url, url.path, attrs)
        finally:
            self.release_lease(lease)

    def modified(self, path: str) -> datetime.datetime:
        """The commit's committer time (every file of a commit has it)."""
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], datetime.UTC)

    def created(self, path: str) -> datetime.datetime:
        return self.modified(path)

    def invalidate_cache(self, path: str | None = None) -> None:
        """Forget resolved branch and tag names, so they are resolved again."""
        self._pool.forget_revisions()
        super().invalidate_cache(path)

    def close(self) -> None:
        """Close the cached commits (open files keep theirs until closed); drop cached chunks."""
        self._pool.close()

    # ---- reading -------------------------------------------------------------------------

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> XetFile:
        if mode != "rb":
            _read_only(f"open {path} with mode {mode!r}")
        url = parse_url(stringify_path(path))
        kwargs.pop("size", None)  # fsspec's reopen() passes it; the tree knows it anyway
        lease, attrs = self.acquire_path(url)
        try:
            if attrs.kind is NodeKind.DIR:
                raise IsADirectoryError(errno.EISDIR, f"xet: {redact(url.name())} is a directory")
            details = self._entry(lease, url, url.path, attrs)
            return XetFile(
                self,
                url,
                lease,
                attrs.ino,
                details,
                block_size=block_size or self._block_size,
                cache_type=kwargs.pop("cache_type", READAHEAD_CACHE),
                cache_options=cache_options,
                **kwargs,
            )
        except BaseException:
            self.release_lease(lease)
            raise

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        """Bytes ``[start, end)`` of a file (negative values count from its end)."""
        url = parse_url(stringify_path(path))
        lease, attrs = self.acquire_path(url)
        try:
            if attrs.kind is NodeKind.DIR:
                raise IsADirectoryError(errno.EISDIR, f"xet: {redact(url.name())} is a directory")
            s, e = _span(start, end, attrs.size)
            data: bytes = lease.value.fs.read(attrs.ino, s, e - s) if e > s else b""
            return data
        finally:
            self.release_lease(lease)

    def cat_ranges(
        self,
        paths: list[str],
        starts: int | list[int | None] | None,
        ends: int | list[int | None] | None,
        max_gap: int | None = None,
        on_error: str = "return",
        **kwargs: Any,
    ) -> list[bytes | Exception]:
        """Many ranges at once: each file is opened once, ranges closer than ``max_gap``
        (64 KiB by default) are merged into one read, and the reads run on a few threads."""
        if not isinstance(paths, list):
            raise TypeError("paths must be a list")
        n = len(paths)
        starts_l = starts if isinstance(starts, list) else [starts] * n
        ends_l = ends if isinstance(ends, list) else [ends] * n
        if len(starts_l) != n or len(ends_l) != n:
            raise ValueError("paths, starts and ends must have the same length")
        gap = DEFAULT_MAX_GAP if max_gap is None else max_gap
        out: list[bytes | Exception | None] = [None] * n
        by_path: dict[str, list[int]] = defaultdict(list)
        for i, p in enumerate(paths):
            by_path[stringify_path(p)].append(i)
        leases: list[Lease] = []
        reads: list[tuple[Lease, int, int, int, list[tuple[int, int, int]]]] = []
        try:
            for p, idxs in by_path.items():
                try:
                    url = parse_url(p)
                    lease, attrs = self.acquire_path(url)
                    leases.append(lease)
                    if attrs.kind is NodeKind.DIR:
                        raise IsADirectoryError(
                            errno.EISDIR, f"xet: {redact(url.name())} is a directory"
                        )
                except Exception as exc:
                    if on_error != "return":
                        raise
                    for i in idxs:
                        out[i] = exc
                    continue
                spans = sorted((*_span(starts_l[i], ends_l[i], attrs.size), i) for i in idxs)
                group: list[tuple[int, int, int]] = []
                lo = hi = 0
                for s, e, i in spans:
                    if group and s <= hi + gap:
                        hi = max(hi, e)
                    else:
                        if group:
                            reads.append((lease, attrs.ino, lo, hi, group))
                        group, lo, hi = [], s, e
                    group.append((s, e, i))
                if group:
                    reads.append((lease, attrs.ino, lo, hi, group))

            def run(read: tuple[Lease, int, int, int, list[tuple[int, int, int]]]) -> None:
                lease, ino, lo, hi, group = read
                try:
                    data = lease.value.fs.read(ino, lo, hi - lo) if hi > lo else b""
                except Exception as exc:
                    if on_error != "return":
                        raise
                    for _, _, i in group:
                        out[i] = exc
                    return
                for s, e, i in group:
                    out[i] = data[s - lo : e - lo]

            if len(reads) <= 1:
                for r in reads:
                    run(r)
            else:
                with ThreadPoolExecutor(min(_RANGE_WORKERS, len(reads))) as pool:
                    for fut in [pool.submit(run, r) for r in reads]:
                        fut.result()
        finally:
            for lease in leases:
                self.release_lease(lease)
        return [b"" if o is None else o for o in out]

    # ---- read-only -----------------------------------------------------------------------

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        _read_only(f"create directory {path}")

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        _read_only(f"create directory {path}")

    def rmdir(self, path: str) -> None:
        _read_only(f"remove {path}")

    def rm_file(self, path: str) -> None:
        _read_only(f"remove {path}")

    def _rm(self, path: str) -> None:
        _read_only(f"remove {path}")

    def rm(
        self, path: str | list[str], recursive: bool = False, maxdepth: int | None = None
    ) -> None:
        _read_only(f"remove {path}")

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        _read_only(f"write {path}")

    def put_file(self, lpath: str, rpath: str, callback: Any = None, **kwargs: Any) -> None:
        _read_only(f"write {rpath}")

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        _read_only(f"copy to {path2}")

    def mv(self, path1: str, path2: str, recursive: bool = False, **kwargs: Any) -> None:
        _read_only(f"move {path1}")

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        _read_only(f"touch {path}")
