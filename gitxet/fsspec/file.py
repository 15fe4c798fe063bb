"""The file object of ``XetFileSystem.open``: seekable, read-only, with adaptive read-ahead.

fsspec's own ``readahead`` cache reads a whole block (5 MiB by default) past every request,
so a Parquet reader that jumps between column chunks would fetch most of the file to get a
column. :class:`AdaptiveReadahead` (``cache_type="xet-readahead"``, the default here) reads
ahead only while reads are sequential: the window starts at 0, opens at 128 KiB on the
second consecutive read and doubles up to the block size; any jump closes it again. So
sequential scans make few large fetches and random reads fetch only what they ask for
(rounded to whole chunks below, where the decoded-chunk cache keeps them). A read of a
whole block or more passes through unbuffered (the chunk source reads ahead of it already).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from fsspec.caching import BaseCache, Fetcher
from fsspec.spec import AbstractBufferedFile

if TYPE_CHECKING:
    from gitxet.fsspec.filesystem import XetFileSystem
    from gitxet.fsspec.sources import Lease
    from gitxet.fsspec.url import XetURL

READAHEAD_CACHE = "xet-readahead"
DEFAULT_BLOCK_SIZE = 8 << 20  # the largest read-ahead window
MIN_WINDOW = 128 << 10  # the first read-ahead: about two average chunks


class AdaptiveReadahead(BaseCache):  # type: ignore[misc]
    """One buffered window that grows while reads are sequential (see the module doc)."""

    name = READAHEAD_CACHE

    def __init__(self, blocksize: int, fetcher: Fetcher, size: int) -> None:
        super().__init__(blocksize, fetcher, size)
        self.cache = b""
        self.start = 0
        self.end = 0
        self.window = 0
        self._last_stop = -1

    def _fetch(self, start: int | None, stop: int | None) -> bytes:
        start = 0 if start is None else start
        stop = self.size if stop is None else min(stop, self.size)
        if start >= self.size or start >= stop:
            return b""
        sequential = start == self._last_stop
        self._last_stop = stop
        if self.start <= start and stop <= self.end:
            self.hit_count += 1
            return self.cache[start - self.start : stop - self.start]
        self.miss_count += 1
        if stop - start >= self.blocksize:
            # a read of a whole block or more is passed through: buffering it would copy
            # every byte twice more (the chunk source reads ahead of sequential readers)
            self.cache = b""
            self.start = self.end = 0
            self.window = 0
            self.total_requested_bytes += stop - start
            whole: bytes = self.fetcher(start, stop)
            return whole
        if sequential:
            self.window = min(max(2 * self.window, MIN_WINDOW), max(self.blocksize, MIN_WINDOW))
        else:
            self.window = 0
        if self.start <= start < self.end:  # the head is buffered already
            head = self.cache[start - self.start :]
            fetch_from = self.end
        else:
            head = b""
            fetch_from = start
        fetch_to = min(self.size, stop + self.window)
        data = self.fetcher(fetch_from, fetch_to)
        self.total_requested_bytes += fetch_to - fetch_from
        self.cache = head + data if head else data
        self.start = start
        self.end = start + len(self.cache)
        return self.cache[: stop - start]


class XetFile(AbstractBufferedFile):  # type: ignore[misc]
    """A read-only file of a commit; reads go to ``CommitFS.read`` (verified data only)."""

    DEFAULT_BLOCK_SIZE = DEFAULT_BLOCK_SIZE

    def __init__(
        self,
        fs: XetFileSystem,
        url: XetURL,
        lease: Lease,
        ino: int,
        details: dict[str, Any],
        *,
        block_size: int | None = None,
        cache_type: str = READAHEAD_CACHE,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._url = url
        self._lease: Lease | None = lease
        self._ino = ino
        self._pid = os.getpid()
        own_cache = cache_type == READAHEAD_CACHE
        super().__init__(
            fs,
            url.name(),
            mode="rb",
            block_size=block_size,
            cache_type="none" if own_cache else cache_type,
            cache_options=cache_options,
            size=details["size"],
            **kwargs,
        )
        self._details = details
        if own_cache:
            if cache_options:
                raise TypeError(f"{READAHEAD_CACHE} takes no cache_options: {cache_options}")
            self.cache = AdaptiveReadahead(self.blocksize, self._fetch_range, self.size)

    def _fetch_range(self, start: int, end: int) -> bytes:
        lease = self._lease
        if lease is None:
            raise ValueError("I/O operation on closed file.")
        if os.getpid() != self._pid:
            # Forked (a DataLoader worker): the parent's git handles are not ours to use, nor
            # to close. Open the commit afresh in this process.
            self._pid = os.getpid()
            self._lease = None
            lease, attrs = self.fs.acquire_path(self._url)
            self._lease, self._ino = lease, attrs.ino
        data: bytes = lease.value.fs.read(self._ino, start, end - start)
        return data

    def close(self) -> None:
        try:
            super().close()
        finally:
            lease, self._lease = getattr(self, "_lease", None), None
            if lease is not None:
                self.fs.release_lease(lease)
