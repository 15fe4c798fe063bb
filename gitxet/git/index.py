"""Record new stat data for index entries whose files gitxet rewrote with the same content.

When gitxet materializes a file, the blob git tracks (the pointer) does not change, but the
index still holds the stat data of the pointer text that was checked out. Git would then
send every byte of each file through the clean filter to find it unchanged (what
``git update-index --refresh`` does). Instead, :func:`restat_entries` rewrites just the stat
fields of those entries in place: every other byte (other entries, flags, extensions) stays
as git wrote it, and the trailing checksum is recomputed.

It works like any git command that writes the index: it takes ``index.lock`` (and gives up
if another process holds it), checks the current index's checksum, and renames the new
index into place. Anything it does not fully understand (an unknown version, a split index,
a checksum that does not verify) makes it patch nothing; callers then fall back to
``git update-index --refresh``. Index format: git's ``Documentation/gitformat-index.txt``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_HEADER = struct.Struct(">4sII")
_STAT = struct.Struct(">10I")  # ctime s/ns, mtime s/ns, dev, ino, mode, uid, gid, size
_STAT_SIZE = _STAT.size
_FLAG_EXTENDED = 0x4000
_NAME_MASK = 0x0FFF
_STAGE_MASK = 0x3000
_U32 = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class Restat:
    """A file gitxet rewrote: the blob its index entry must still name, and its new stat."""

    blob_id: bytes  # raw object id (20 bytes for SHA-1 repositories, 32 for SHA-256)
    stat: os.stat_result


def blob_id(data: bytes, object_format: str = "sha1") -> bytes:
    """The raw object id git gives a blob holding ``data`` (``sha1`` or ``sha256``)."""
    h = hashlib.new(object_format)
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.digest()


def _stat_fields(st: os.stat_result, mode: int) -> bytes:
    # git keeps the low 32 bits of every field (sizes of 4 GiB and more wrap, as in git)
    return _STAT.pack(
        (st.st_ctime_ns // 1_000_000_000) & _U32,  # not the float: x.9999999 rounds up
        st.st_ctime_ns % 1_000_000_000,
        (st.st_mtime_ns // 1_000_000_000) & _U32,
        st.st_mtime_ns % 1_000_000_000,
        st.st_dev & _U32,
        st.st_ino & _U32,
        mode,
        st.st_uid & _U32,
        st.st_gid & _U32,
        st.st_size & _U32,
    )


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """git's offset varint (index v4 path prefixes)."""
    c = data[pos]
    pos += 1
    value = c & 0x7F
    while c & 0x80:
        c = data[pos]
        pos += 1
        value = ((value + 1) << 7) | (c & 0x7F)
    return value, pos


def _checksum_len(data: bytes) -> int | None:
    """Length of the trailing checksum when it verifies as SHA-1 or SHA-256, else None (an
    all-zero trailer written under ``index.skipHash`` included: such an index is left to git)."""
    if hashlib.sha1(data[:-20]).digest() == data[-20:]:
        return 20
    if len(data) > 44 and hashlib.sha256(data[:-32]).digest() == data[-32:]:
        return 32
    return None


def _entry_offsets(data: bytes, hash_len: int) -> dict[bytes, tuple[int, int]] | None:
    """``path -> (offset of the entry, offset of its object id)`` for stage-0 entries."""
    sig, version, count = _HEADER.unpack_from(data, 0)
    if sig != b"DIRC" or version not in (2, 3, 4):
        return None
    pos = _HEADER.size
    end = len(data) - hash_len
    out: dict[bytes, tuple[int, int]] = {}
    prev = b""
    for _ in range(count):
        start = pos
        id_at = pos + _STAT_SIZE
        pos = id_at + hash_len
        if pos + 2 > end:
            return None
        (flags,) = struct.unpack_from(">H", data, pos)
        pos += 2
        if flags & _FLAG_EXTENDED:
            if version < 3:
                return None
            pos += 2
        if version == 4:
            strip, pos = _varint(data, pos)
            nul = data.index(b"\0", pos, end)
            if strip > len(prev):
                return None
            path = prev[: len(prev) - strip] + data[pos:nul]
            pos = nul + 1
        else:
            nul = data.index(b"\0", pos, end)
            path = data[pos:nul]
            # entries are NUL-padded to a multiple of 8 bytes
            pos = start + ((pos - start + len(path) + 8) & ~7)
        if len(path) != (flags & _NAME_MASK) and (flags & _NAME_MASK) != _NAME_MASK:
            return None
        if not flags & _STAGE_MASK:
            out[path] = (start, id_at)
        prev = path
    # a split index keeps entries in another file: not something to patch here
    while pos + 8 <= end:
        sig, size = struct.unpack_from(">4sI", data, pos)
        if sig == b"link":
            return None
        pos += 8 + size
    return out if pos == end else None


def restat_entries(git_dir: str | os.PathLike[str], files: Mapping[bytes, Restat]) -> set[bytes]:
    """Give the index entries of ``files`` (paths from the work tree root) their new stat.

    Only stage-0 entries that still name ``blob_id`` are changed. Returns the paths
    changed; the others must be refreshed by git. Never raises for a busy or unexpected
    index; an I/O error while writing leaves the old index in place.
    """
    if not files:
        return set()
    index = Path(git_dir) / "index"
    lock = Path(git_dir) / "index.lock"
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError:
        return set()  # another git process holds the index, or no such directory
    done: set[bytes] = set()
    replaced = False
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                data = index.read_bytes()
            except OSError:
                return set()
            hash_len = _checksum_len(data) if len(data) > _HEADER.size + 20 else None
            try:
                offsets = _entry_offsets(data, hash_len) if hash_len else None
            except (ValueError, IndexError, struct.error):
                offsets = None  # malformed: git will say so itself
            if not offsets or not hash_len:
                return set()
            buf = bytearray(data)
            for path, want in files.items():
                where = offsets.get(path)
                if where is None:
                    continue
                start, id_at = where
                if data[id_at : id_at + hash_len] != want.blob_id:
                    continue  # the entry moved on: not ours to touch
                (mode,) = struct.unpack_from(">I", data, start + 24)
                buf[start : start + _STAT_SIZE] = _stat_fields(want.stat, mode)
                done.add(path)
            if not done:
                return set()
            algo = hashlib.sha1 if hash_len == 20 else hashlib.sha256
            buf[-hash_len:] = algo(memoryview(buf)[:-hash_len]).digest()
            out.write(buf)
        os.replace(lock, index)
        replaced = True
        return done
    except OSError:
        return set()
    finally:
        if not replaced:
            with contextlib.suppress(OSError):
                lock.unlink()
