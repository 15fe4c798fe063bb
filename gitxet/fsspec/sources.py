"""Commits opened for fsspec: cached per (repository, commit), counted, safe across fork.

One :class:`CommitPool` per filesystem instance holds the repositories it opened, the
revisions it resolved, and a :class:`~gitxet.vfs.model.CommitFS` per commit. A commit is
immutable, so its ``CommitFS`` (parsed trees, pointer sizes, open readers) is reused by every
path and file of that commit; a branch name is resolved once and remembered until
:meth:`CommitPool.forget_revisions` (fsspec's ``invalidate_cache``).

The data is read exactly where the mount reads it (the one resolver, :mod:`gitxet.dataset`:
the repository's own store, then its remotes in search order), and one :class:`ChunkCache`
of decoded chunks is shared by all commits of the pool. :class:`CountingSource` sits between
the readers and the stores, so ``FetchStats`` counts what was really read from storage (cache
hits are free).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass

from gitxet.data.reconstruct import (
    DEFAULT_CHUNK_CACHE_BYTES,
    ChunkCache,
    ChunkSource,
    FetchSource,
    Layout,
    PartSource,
    Segment,
)
from gitxet.dataset import Dataset, HttpAccess, open_dataset
from gitxet.errors import AuthError, GitError, NotFoundError, RemoteError
from gitxet.formats.shard import FileInfo
from gitxet.settings import redact
from gitxet.util.lru import Lease as _Lease
from gitxet.util.lru import LeaseCache
from gitxet.vfs.model import CommitFS

DEFAULT_MAX_COMMITS = 8


@dataclass(frozen=True, slots=True)
class FetchStats:
    """What readers fetched from storage: decoded chunk bytes, chunks, and read calls."""

    bytes: int = 0
    chunks: int = 0
    requests: int = 0


class _Counter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = self._chunks = self._requests = 0

    def add(self, chunks: list[bytes]) -> None:
        n = sum(len(c) for c in chunks)
        with self._lock:
            self._bytes += n
            self._chunks += len(chunks)
            self._requests += 1

    def snapshot(self) -> FetchStats:
        with self._lock:
            return FetchStats(self._bytes, self._chunks, self._requests)

    def reset(self) -> None:
        with self._lock:
            self._bytes = self._chunks = self._requests = 0


class CountingSource:
    """A :class:`ChunkSource` that counts the chunk bytes it hands out."""

    def __init__(self, inner: ChunkSource, counter: _Counter) -> None:
        self.inner = inner
        self._counter = counter

    def file_info(self, file_hash: bytes) -> FileInfo | None:
        return self.inner.file_info(file_hash)

    def layout(self, xorb_hash: bytes) -> Layout:
        return self.inner.layout(xorb_hash)

    def read_chunks(self, xorb_hash: bytes, start: int, end: int) -> list[bytes]:
        chunks = self.inner.read_chunks(xorb_hash, start, end)
        self._counter.add(chunks)
        return chunks


class CountingFetchSource(CountingSource):
    """A :class:`CountingSource` over a source behind a network (an http(s) repository):
    its cache and fetching calls pass through, and the bytes fetched for readers count."""

    def __init__(self, inner: ChunkSource, counter: _Counter) -> None:
        super().__init__(inner, counter)
        self.remote: FetchSource = inner  # type: ignore[assignment]
        self.part: PartSource = inner  # type: ignore[assignment]
        self.initial_window = self.remote.initial_window
        self.max_window = self.remote.max_window

    def read_verified_part(self, xorb_hash: bytes, index: int, lo: int, hi: int) -> bytes | None:
        return self.part.read_verified_part(xorb_hash, index, lo, hi)

    def read_verified_range(self, xorb_hash: bytes, lo: int, hi: int) -> bytes | None:
        return self.part.read_verified_range(xorb_hash, lo, hi)

    def fetch_range(self, xorb_hash: bytes, lo: int, hi: int, *, sequential: bool) -> bytes:
        data = self.remote.fetch_range(xorb_hash, lo, hi, sequential=sequential)
        self._counter.add([data])
        return data

    def prefetch(self, xorb_hash: bytes, lo: int, hi: int) -> None:
        self.remote.prefetch(xorb_hash, lo, hi)

    def split_range(self, xorb_hash: bytes, lo: int, hi: int) -> list[tuple[int, int]]:
        return self.remote.split_range(xorb_hash, lo, hi)

    def stream_range(self, xorb_hash: bytes, lo: int, hi: int) -> Future[Segment]:
        return self.remote.stream_range(xorb_hash, lo, hi)

    def layouts_ahead(self, xorb_hashes: Sequence[bytes]) -> None:
        ahead = getattr(self.remote, "layouts_ahead", None)
        if ahead is not None:
            ahead(xorb_hashes)


def counting(inner: ChunkSource, counter: _Counter) -> CountingSource:
    """The counting wrapper that fits ``inner``."""
    if hasattr(inner, "fetch_range") and hasattr(inner, "read_verified_range"):
        return CountingFetchSource(inner, counter)
    return CountingSource(inner, counter)


@dataclass(frozen=True, slots=True)
class OpenCommit:
    """A commit's filesystem, opened by a :class:`CommitPool`."""

    key: tuple[str, str]  # (git dir, commit id)
    fs: CommitFS
    mtime: float

    def close(self) -> None:
        self.fs.close()


#: a commit in use (``lease.value``); :meth:`CommitPool.release` it when done
Lease = _Lease[OpenCommit]


def repo_key(repo: str) -> str:
    """The cache key of a repository spec: an absolute path, or the URL as written."""
    if "://" in repo:
        return repo
    return os.path.normpath(os.path.abspath(os.path.expanduser(repo)))


class CommitPool:
    """Repositories, revisions and commits opened by one filesystem instance; thread-safe."""

    def __init__(
        self,
        cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES,
        max_commits: int = DEFAULT_MAX_COMMITS,
        access: HttpAccess | None = None,
    ) -> None:
        if cache_bytes < 0 or max_commits < 1:
            raise ValueError("cache_bytes must be >= 0 and max_commits >= 1")
        self.cache_bytes = cache_bytes
        self.max_commits = max_commits
        self.access = access  # how to reach http(s) repositories (None: local ones only)
        self._counter = _Counter()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()  # guards the dicts; never held during I/O
        self._open_lock = threading.Lock()  # serializes opening repos and commits (rare, slow)
        self._cache = ChunkCache(self.cache_bytes)
        self._datasets: dict[str, tuple[Dataset, CountingSource]] = {}
        self._revs: dict[tuple[str, str], str] = {}
        # evicted commits are closed by their last user (an open file holds its lease)
        self._commits: LeaseCache[tuple[str, str], OpenCommit] = LeaseCache(
            self.max_commits, OpenCommit.close
        )

    def _check_fork(self) -> None:
        # A forked child (a DataLoader worker) must not share the parent's sqlite connections
        # and git handles: start afresh, and leave the parent's objects alone (no close).
        if os.getpid() != self._pid:
            self._reset()

    @property
    def stats(self) -> FetchStats:
        return self._counter.snapshot()

    def reset_stats(self) -> None:
        self._counter.reset()

    def _dataset(self, repo: str) -> tuple[Dataset, CountingSource]:
        key = repo_key(repo)
        with self._lock:
            found = self._datasets.get(key)
        if found is not None:
            return found
        try:
            ds = open_dataset(key, self.access)
        except NotFoundError as exc:
            raise FileNotFoundError(errno.ENOENT, f"xet: repository {redact(repo)}: {exc}") from exc
        except GitError as exc:
            raise FileNotFoundError(errno.ENOENT, f"xet: repository {redact(repo)}: {exc}") from exc
        except AuthError as exc:  # no token, or one the server refuses: like the CLI's exit 5
            raise PermissionError(errno.EACCES, f"xet: repository {redact(repo)}: {exc}") from exc
        except RemoteError as exc:  # the server cannot be reached or failed
            raise OSError(errno.EIO, f"xet: repository {redact(repo)}: {exc}") from exc
        source = counting(ds.chunk_source(), self._counter)
        with self._lock:
            return self._datasets.setdefault(key, (ds, source))

    def resolve(self, repo: str, rev: str) -> str:
        """Full commit id of ``rev`` in ``repo`` (remembered until :meth:`forget_revisions`).

        Raises:
            FileNotFoundError: no such repository or revision (the message says which).
        """
        self._check_fork()
        key = (repo_key(repo), rev)
        with self._lock:
            sha = self._revs.get(key)
        if sha is not None:
            return sha
        with self._open_lock:
            ds, _ = self._dataset(repo)
            try:
                sha = ds.resolve(rev)
            except NotFoundError as exc:
                raise FileNotFoundError(
                    errno.ENOENT, f"xet: no revision {rev!r} in repository {redact(repo)}"
                ) from exc
        with self._lock:
            self._revs[key] = sha
        return sha

    def forget_revisions(self) -> None:
        """Resolve branch and tag names again on next use (commits stay cached)."""
        with self._lock:
            self._revs.clear()

    def acquire(self, repo: str, rev: str) -> Lease:
        """The filesystem of ``rev``; the caller must :meth:`release` it."""
        sha = self.resolve(repo, rev)
        ds, source = self._dataset(repo)
        key = (ds.git_dir, sha)
        lease = self._commits.get(key)
        if lease is not None:
            return lease
        with self._open_lock:
            lease = self._commits.get(key)
            if lease is not None:
                return lease
            try:
                fs = ds.open_commit(sha, source=source, cache=self._cache)
            except GitError as exc:
                raise FileNotFoundError(
                    errno.ENOENT, f"xet: cannot open commit {sha} of {redact(repo)}: {exc}"
                ) from exc
            return self._commits.add(key, OpenCommit(key, fs, fs.mtime_ns / 1e9))

    def release(self, lease: Lease) -> None:
        """Done with a lease; a commit evicted meanwhile is closed by its last user."""
        lease.release()

    def open_commits(self) -> list[tuple[str, str]]:
        """Keys (git dir, commit) of the commits cached now, least recently used first."""
        return self._commits.keys()

    @contextmanager
    def lease(self, repo: str, rev: str) -> Iterator[Lease]:
        lease = self.acquire(repo, rev)
        try:
            yield lease
        finally:
            self.release(lease)

    def close(self) -> None:
        """Close every commit not in use now (those in use close when released) and start a
        new, empty chunk cache."""
        with self._lock:
            self._cache = ChunkCache(self.cache_bytes)
        self._commits.clear()

    def shutdown(self) -> None:
        """At the end of the process (or of the pool's use): :meth:`close`, then close every
        repository's server connections; nothing read through the pool works afterwards."""
        if os.getpid() != self._pid:
            return  # a forked child: the parent's connections are the parent's to close
        self.close()
        with self._lock:
            datasets, self._datasets = list(self._datasets.values()), {}
        for ds, _ in datasets:
            ds.close()
