"""Chunk sources layered in order: the first that knows a file or holds a xorb serves it.

A mount of a working repository reads from its own store first and from the remote's
(embedded) store second, so nothing is copied: chunks are read lazily where they live.
"""

from __future__ import annotations

from collections.abc import Sequence

from gitxet.data.reconstruct import Layout
from gitxet.errors import XorbNotFoundError
from gitxet.formats.shard import FileInfo
from gitxet.hashing import to_hex
from gitxet.store.cas import LocalCAS
from gitxet.util.lru import LRUCache


class LayeredSource:
    """A :class:`ChunkSource` over several local stores, tried in order."""

    is_local = True

    def __init__(self, stores: Sequence[LocalCAS]) -> None:
        self.stores = list(stores)
        # xorbs are immutable: once found, known (bounded: looked up again after eviction)
        self._where: LRUCache[bytes, LocalCAS] = LRUCache(1 << 16)

    def file_info(self, file_hash: bytes) -> FileInfo | None:
        for s in self.stores:
            info = s.file_info(file_hash)
            if info is not None:
                return info
        return None

    def _holder(self, xorb_hash: bytes) -> LocalCAS:
        store = self._where.get(xorb_hash)
        if store is not None:
            return store
        for s in self.stores:
            if s.has_xorb(xorb_hash):
                self._where.put(xorb_hash, s)
                return s
        raise XorbNotFoundError(to_hex(xorb_hash))

    def layout(self, xorb_hash: bytes) -> Layout:
        return self._holder(xorb_hash).layout(xorb_hash)

    def read_chunks(self, xorb_hash: bytes, start: int, end: int) -> list[bytes]:
        return self._holder(xorb_hash).read_chunks(xorb_hash, start, end)

    def read_verified_part(self, xorb_hash: bytes, index: int, lo: int, hi: int) -> bytes | None:
        return self._holder(xorb_hash).read_verified_part(xorb_hash, index, lo, hi)

    def read_verified_range(self, xorb_hash: bytes, lo: int, hi: int) -> bytes | None:
        return self._holder(xorb_hash).read_verified_range(xorb_hash, lo, hi)
