"""The one record store: a directory of JSON records, one file per key, written atomically.

Long-running parts (the mount registry, the plugins' mounter, the CSI node, the Docker
volume driver) keep their state as one small record per key, so concurrent writers of
different keys never rewrite each other's files and a crash loses at most the write in
flight. A record's file is ``<sha256(key)[:32]>.json``: any key (a path, a name) becomes a
safe, fixed-length file name. Records are read back strictly: the caller's ``load`` parses
them (``gitxet.formats.record.parse_record`` does the generic checks) and a record whose
key is not the one it is filed under is refused, so a hand-copied file cannot stand in for
another.
"""

from __future__ import annotations

import builtins
import hashlib
import os
from collections.abc import Callable
from typing import Generic, TypeVar

from gitxet.errors import FormatError
from gitxet.util.atomic import atomic_write

__all__ = ["RecordDir", "record_name"]

T = TypeVar("T")

SUFFIX = ".json"


def record_name(key: str) -> str:
    """The file stem of ``key``'s record (32 hex digits; also used to name per-key logs)."""
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32]


class RecordDir(Generic[T]):
    """Records of type ``T`` under ``directory``, one per key.

    Args:
        directory: where the records live (created 0700 on the first write).
        key: the key a record is filed under.
        load: parses a record's bytes (``what`` names the file in errors); raises
            :class:`FormatError`.
        dump: a record's bytes.
        max_bytes: a larger file is refused unread.
        durable: fsync each write (state that must survive a power loss).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        key: Callable[[T], str],
        load: Callable[[bytes, str], T],
        dump: Callable[[T], bytes],
        max_bytes: int = 64 * 1024,
        durable: bool = True,
    ) -> None:
        self.directory = os.path.abspath(directory)
        self._key = key
        self._load = load
        self._dump = dump
        self.max_bytes = max_bytes
        self.durable = durable

    def path(self, key: str) -> str:
        """The file of ``key``'s record."""
        return os.path.join(self.directory, record_name(key) + SUFFIX)

    def _read(self, path: str) -> T | None:
        try:
            with open(path, "rb") as f:
                data = f.read(self.max_bytes + 1)
        except FileNotFoundError:
            return None
        if len(data) > self.max_bytes:
            raise FormatError(path, f"larger than {self.max_bytes} bytes")
        rec = self._load(data, path)
        if os.path.basename(path) != record_name(self._key(rec)) + SUFFIX:
            raise FormatError(path, "the record names another key than its file")
        return rec

    def get(self, key: str) -> T | None:
        """The record of ``key``, or ``None``; a malformed one raises :class:`FormatError`."""
        return self._read(self.path(key))

    def put(self, rec: T) -> None:
        """Store (or replace) ``rec`` atomically (mode 0600)."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        atomic_write(self.path(self._key(rec)), self._dump(rec), mode=0o600, durable=self.durable)

    def remove(self, key: str) -> bool:
        """Forget ``key``; returns whether there was a record."""
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            return False
        return True

    def list(self) -> builtins.list[T]:
        """Every record, sorted by key; a malformed one raises :class:`FormatError`."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(SUFFIX))
        except FileNotFoundError:
            return []
        out: builtins.list[T] = []
        for name in names:
            rec = self._read(os.path.join(self.directory, name))
            if rec is not None:  # None: removed meanwhile
                out.append(rec)
        out.sort(key=self._key)
        return out
