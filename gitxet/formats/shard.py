"""The Xet shard layout: file reconstructions and xorb chunk lists, in 48-byte records.

A shard is a header, a file-info section (one block per file: its terms, their
verification hashes, its SHA-256), a CAS-info section (one block per xorb: its chunks),
each section closed by a bookend record, then, in *stored* shards only, three lookup
tables and a 200-byte footer. *Upload* shards (what hf_xet POSTs) have neither.

Chunk hashes in a shard's CAS section are stored as they are keyed: when the footer
carries a non-zero HMAC key (a global-dedup response), they are the protected hashes
(``gitxet.hashing.protected_chunk_hash``) and the chunk lookup table is keyed by them.
The :class:`Shard` objects here hold hashes exactly as stored, so parsing and serializing
round-trip byte for byte; :func:`protect_xorbs` does the keying.

The parser is strict: bookends, counts, flags, reserved fields, footer offsets and every
lookup-table entry are checked, and every declared count is checked against the bytes
that remain before anything is allocated. Normative description:
``docs/internals/formats.md``.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from gitxet.errors import ShardFormatError
from gitxet.hashing import (
    HASH_LEN,
    ZERO_HASH,
    protected_chunk_hash,
    sha256_from_shard,
    sha256_to_shard,
    sort_key,
    truncated,
    verification_hash,
)

__all__ = [
    "CHUNK_FLAG_GLOBAL_DEDUP",
    "FILE_FLAG_METADATA_EXT",
    "FILE_FLAG_VERIFICATION",
    "FOOTER_SIZE",
    "HEADER_TAG",
    "MAX_SHARD_BYTES",
    "NEVER_EXPIRES",
    "RECORD_SIZE",
    "FileInfo",
    "FileTerm",
    "Shard",
    "ShardFooter",
    "XorbChunk",
    "XorbInfo",
    "collect_upload_shard",
    "dedup_response_shard",
    "make_file_info",
    "parse_shard",
    "protect_xorbs",
    "serialize_shard",
    "serialize_stored_shard",
    "sha256_from_stored",
    "sha256_to_stored",
    "shard_size",
    "split_shard",
    "upload_shard_for",
    "upload_shards_for",
]

#: The 32-byte magic at the start of every shard.
HEADER_TAG = b"HFRepoMetaData\x00" + bytes.fromhex("55696745 6a7b8157 83a5bdd9 5ccdd14a a9")
SHARD_VERSION = 2
FOOTER_VERSION = 1
RECORD_SIZE = 48
HEADER_SIZE = 48
FOOTER_SIZE = 200
#: Shards above this size are refused by the CAS server; split them (:func:`split_shard`).
MAX_SHARD_BYTES = 64 * 1024 * 1024
#: ``shard_key_expiry`` meaning "never".
NEVER_EXPIRES = 2**64 - 1

#: File flag: one verification entry per term follows the terms.
FILE_FLAG_VERIFICATION = 0x8000_0000
#: File flag: a metadata extension record (the SHA-256) closes the block.
FILE_FLAG_METADATA_EXT = 0x4000_0000
_FILE_FLAGS = FILE_FLAG_VERIFICATION | FILE_FLAG_METADATA_EXT
#: Chunk flag in stored shards: the chunk is eligible for global dedup queries.
CHUNK_FLAG_GLOBAL_DEDUP = 0x8000_0000
_BAD_CHUNK_FLAGS = ~CHUNK_FLAG_GLOBAL_DEDUP & 0xFFFF_FFFF

# Largest chunk a xorb may hold (mirrors gitxet.formats.xorb.MAX_CHUNK_BYTES) and most
# chunks per xorb; duplicated to keep the two format modules independent.
_MAX_CHUNK_BYTES = 128 * 1024
_MAX_XORB_CHUNKS = 8192

_SHARD_HEADER = struct.Struct("<32sQQ")
_FILE_HEADER = struct.Struct("<32sIIQ")  # file_hash, flags, num_entries, reserved
_FILE_ENTRY = struct.Struct("<32sIIII")  # xorb_hash, xorb_flags, unpacked, start, end
_HASH_RECORD = struct.Struct("<32s16s")  # verification entry / metadata ext
_XORB_HEADER = struct.Struct("<32sIIII")  # xorb_hash, flags, num_entries, in_xorb, on_disk
_CHUNK_ENTRY = struct.Struct("<32sIIII")  # chunk_hash, byte_start, size, flags, reserved
_FOOTER = struct.Struct("<9Q32s2Q48s4Q")
_HASH_LOOKUP = struct.Struct("<QI")  # file and xorb tables
_CHUNK_LOOKUP = struct.Struct("<QII")

_M32 = 0xFFFF_FFFF
_BOOKEND_HASH = b"\xff" * HASH_LEN
_BOOKEND = _BOOKEND_HASH + bytes(16)
_ZERO16 = bytes(16)
_ZERO48 = bytes(48)

assert len(HEADER_TAG) == 32 and _FOOTER.size == FOOTER_SIZE


# --------------------------------------------------------------------------- model

# FileTerm and XorbChunk are NamedTuples rather than dataclasses: a shard holds up to a
# million of them and a tuple is built about three times faster than a frozen dataclass.


class FileTerm(NamedTuple):
    """Chunks ``[chunk_start, chunk_end)`` of a xorb, ``unpacked_bytes`` long once decoded."""

    xorb_hash: bytes
    chunk_start: int
    chunk_end: int
    unpacked_bytes: int


@dataclass(frozen=True)
class FileInfo:
    """How to rebuild one file: its terms in order, plus optional verification and SHA-256.

    ``verification`` holds one range hash per term (``None``: flag clear, no entries).
    ``sha256`` is the 32 bytes *as stored*, each 8-byte word reversed relative to the
    digest; :attr:`sha256_hex` gives the familiar hex form.
    """

    file_hash: bytes
    terms: list[FileTerm]
    verification: list[bytes] | None = None
    sha256: bytes | None = None

    @property
    def flags(self) -> int:
        """The header flags this block serializes with."""
        return (FILE_FLAG_VERIFICATION if self.verification is not None else 0) | (
            FILE_FLAG_METADATA_EXT if self.sha256 is not None else 0
        )

    @property
    def size(self) -> int:
        """The file's length in bytes."""
        return sum(t.unpacked_bytes for t in self.terms)

    @property
    def sha256_hex(self) -> str | None:
        """The SHA-256 as normal lowercase hex, or ``None``."""
        return None if self.sha256 is None else sha256_from_stored(self.sha256)

    @property
    def num_records(self) -> int:
        """Number of 48-byte records this block occupies."""
        n = len(self.terms)
        return 1 + n + (n if self.verification is not None else 0) + (self.sha256 is not None)


class XorbChunk(NamedTuple):
    """One chunk of a xorb: hash as stored, uncompressed start offset and size, flags."""

    hash: bytes
    byte_start: int
    size: int
    flags: int = 0


@dataclass(frozen=True)
class XorbInfo:
    """A xorb's chunk list. ``bytes_on_disk`` is the serialized size (hf_xet sends 0)."""

    xorb_hash: bytes
    chunks: list[XorbChunk]
    bytes_in_xorb: int
    bytes_on_disk: int = 0

    @classmethod
    def from_chunks(
        cls,
        xorb_hash: bytes,
        chunk_hashes: Sequence[bytes],
        chunk_sizes: Sequence[int],
        bytes_on_disk: int = 0,
        flags: Sequence[int] | None = None,
    ) -> XorbInfo:
        """Build the block for a xorb from its chunk hashes and sizes, in xorb order."""
        if len(chunk_hashes) != len(chunk_sizes) or (
            flags is not None and len(flags) != len(chunk_sizes)
        ):
            raise ValueError("chunk_hashes, chunk_sizes and flags differ in length")
        chunks = []
        pos = 0
        for i, (h, size) in enumerate(zip(chunk_hashes, chunk_sizes, strict=True)):
            chunks.append(XorbChunk(h, pos, size, 0 if flags is None else flags[i]))
            pos += size
        return cls(xorb_hash, chunks, pos, bytes_on_disk)

    @property
    def num_records(self) -> int:
        """Number of 48-byte records this block occupies."""
        return 1 + len(self.chunks)


@dataclass(frozen=True)
class ShardFooter:
    """The 200-byte footer of a stored shard (all offsets are from the shard's start)."""

    file_info_offset: int
    cas_info_offset: int
    file_lookup_offset: int
    file_lookup_num_entries: int
    xorb_lookup_offset: int
    xorb_lookup_num_entries: int
    chunk_lookup_offset: int
    chunk_lookup_num_entries: int
    chunk_hash_hmac_key: bytes
    shard_creation_timestamp: int
    shard_key_expiry: int
    stored_bytes_on_disk: int
    materialized_bytes: int
    stored_bytes: int
    footer_offset: int
    version: int = FOOTER_VERSION

    @property
    def protected(self) -> bool:
        """Whether the CAS section's chunk hashes are HMAC-protected."""
        return self.chunk_hash_hmac_key != ZERO_HASH


@dataclass(frozen=True)
class Shard:
    """A parsed or to-be-written shard. ``footer`` is ``None`` for the upload form."""

    files: list[FileInfo] = field(default_factory=list)
    xorbs: list[XorbInfo] = field(default_factory=list)
    footer: ShardFooter | None = None


# --------------------------------------------------------------------------- builders


def make_file_info(
    file_hash: bytes,
    terms: Sequence[FileTerm],
    chunk_hashes_by_term: Sequence[Sequence[bytes]],
    sha256_hex: str | None,
) -> FileInfo:
    """A file block with verification entries computed from each term's chunk hashes.

    ``chunk_hashes_by_term[i]`` are the raw hashes of the chunks term ``i`` covers, in
    order. hf_xet quirk: an empty file (no terms, zero hash) stores 32 zero bytes as its
    SHA-256, whatever ``sha256_hex`` says; ``None`` omits the extension record.

    Raises:
        ValueError: mismatched lengths, or a non-zero hash for an empty file.
    """
    if len(chunk_hashes_by_term) != len(terms):
        raise ValueError(f"{len(chunk_hashes_by_term)} hash lists for {len(terms)} terms")
    for i, (t, hashes) in enumerate(zip(terms, chunk_hashes_by_term, strict=True)):
        if len(hashes) != t.chunk_end - t.chunk_start:
            n = t.chunk_end - t.chunk_start
            raise ValueError(f"term {i} covers {n} chunks, got {len(hashes)} hashes")
    if not terms and file_hash != ZERO_HASH:
        raise ValueError("an empty file's hash is all zeros")
    verification = [verification_hash(hashes) for hashes in chunk_hashes_by_term]
    sha: bytes | None = None
    if sha256_hex is not None:
        sha = sha256_to_shard(sha256_hex) if terms else ZERO_HASH
    return FileInfo(file_hash, list(terms), verification, sha)


def _sorted_unique_files(files: Iterable[FileInfo]) -> list[FileInfo]:
    seen: dict[bytes, FileInfo] = {}
    for f in files:
        seen.setdefault(f.file_hash, f)  # the first block for a hash wins, as in hf_xet
    return sorted(seen.values(), key=lambda f: sort_key(f.file_hash))


def collect_upload_shard(files: Iterable[FileInfo], new_xorbs: Iterable[XorbInfo]) -> Shard:
    """A session's upload shard: blocks sorted by hash (Xet order), duplicates dropped.

    hf_xet keeps both sections in hash order and keeps one block per hash (the first).
    List only the xorbs the session uploaded, not those it deduplicated against.
    """
    xorbs: dict[bytes, XorbInfo] = {}
    for x in new_xorbs:
        xorbs.setdefault(x.xorb_hash, x)
    return Shard(
        files=_sorted_unique_files(files),
        xorbs=sorted(xorbs.values(), key=lambda x: sort_key(x.xorb_hash)),
    )


def upload_shard_for(files: Iterable[FileInfo], new_xorbs: Iterable[XorbInfo]) -> bytes:
    """Serialized upload shard (see :func:`collect_upload_shard`) as hf_xet would send it.

    Raises:
        ValueError: the shard would exceed :data:`MAX_SHARD_BYTES`; use
            :func:`upload_shards_for`.
    """
    return serialize_shard(collect_upload_shard(files, new_xorbs))


def upload_shards_for(
    files: Iterable[FileInfo], new_xorbs: Iterable[XorbInfo], max_bytes: int = MAX_SHARD_BYTES
) -> list[bytes]:
    """Like :func:`upload_shard_for`, split into as many shards as ``max_bytes`` needs."""
    return [
        serialize_shard(s) for s in split_shard(collect_upload_shard(files, new_xorbs), max_bytes)
    ]


def sha256_to_stored(sha256_hex: str) -> bytes:
    """The 32 bytes a shard stores for a SHA-256 given as normal hex (words reversed)."""
    return sha256_to_shard(sha256_hex)


def sha256_from_stored(stored: bytes) -> str:
    """Normal lowercase hex of a SHA-256 stored in a shard."""
    return sha256_from_shard(stored)


def protect_xorbs(xorbs: Iterable[XorbInfo], hmac_key: bytes) -> list[XorbInfo]:
    """Copies of ``xorbs`` with every chunk hash replaced by its HMAC-protected form."""
    if len(hmac_key) != HASH_LEN:
        raise ValueError("the HMAC key must be 32 bytes")
    return [
        XorbInfo(
            x.xorb_hash,
            [
                XorbChunk(protected_chunk_hash(hmac_key, c.hash), c.byte_start, c.size, c.flags)
                for c in x.chunks
            ],
            x.bytes_in_xorb,
            x.bytes_on_disk,
        )
        for x in xorbs
    ]


def dedup_response_shard(
    xorbs: Iterable[XorbInfo], hmac_key: bytes, created: int, expiry: int
) -> bytes:
    """A global-dedup response: no files, the xorbs with protected chunk hashes, a footer.

    ``xorbs`` carry plain chunk hashes; ``expiry`` (unix seconds) should be in the future.
    """
    return serialize_stored_shard(
        Shard(xorbs=protect_xorbs(xorbs, hmac_key)),
        hmac_key=hmac_key,
        created=created,
        expiry=expiry,
    )


# --------------------------------------------------------------------------- serialize


def _trunc_keys(hashes: list[bytes]) -> list[int]:
    """``truncated(h)`` of each hash, decoded in one struct call."""
    if any(len(h) != HASH_LEN for h in hashes):
        raise ValueError("hashes must be 32 raw bytes")
    words = struct.unpack(f"<{4 * len(hashes)}Q", b"".join(hashes))
    return list(words[::4])


def _check_hash(h: bytes, what: str) -> None:
    if len(h) != HASH_LEN:
        raise ValueError(f"{what} must be 32 raw bytes, got {len(h)}")
    if h == _BOOKEND_HASH:
        raise ValueError(f"{what} of all 0xFF bytes would read as a bookend")


def _pack_file(f: FileInfo, out: list[bytes]) -> None:
    _check_hash(f.file_hash, "file hash")
    n = len(f.terms)
    out.append(_FILE_HEADER.pack(f.file_hash, f.flags, n, 0))
    for t in f.terms:
        _check_hash(t.xorb_hash, "term xorb hash")
        out.append(_FILE_ENTRY.pack(t.xorb_hash, 0, t.unpacked_bytes, t.chunk_start, t.chunk_end))
    if f.verification is not None:
        if len(f.verification) != n:
            raise ValueError(f"{len(f.verification)} verification hashes for {n} terms")
        for v in f.verification:
            if len(v) != HASH_LEN:
                raise ValueError("verification hashes must be 32 raw bytes")
            out.append(v + _ZERO16)
    if f.sha256 is not None:
        if len(f.sha256) != HASH_LEN:
            raise ValueError("the stored sha256 must be 32 raw bytes")
        out.append(f.sha256 + _ZERO16)


def _pack_xorb(x: XorbInfo, out: list[bytes]) -> None:
    _check_hash(x.xorb_hash, "xorb hash")
    out.append(_XORB_HEADER.pack(x.xorb_hash, 0, len(x.chunks), x.bytes_in_xorb, x.bytes_on_disk))
    for c in x.chunks:
        if len(c.hash) != HASH_LEN:
            raise ValueError("chunk hashes must be 32 raw bytes")
        out.append(_CHUNK_ENTRY.pack(c.hash, c.byte_start, c.size, c.flags, 0))


def _pack_sections(shard: Shard, footer_size: int) -> list[bytes]:
    out = [_SHARD_HEADER.pack(HEADER_TAG, SHARD_VERSION, footer_size)]
    try:
        for f in shard.files:
            _pack_file(f, out)
        out.append(_BOOKEND)
        for x in shard.xorbs:
            _pack_xorb(x, out)
        out.append(_BOOKEND)
    except struct.error as e:
        raise ValueError(f"shard field out of range: {e}") from None
    return out


def shard_size(shard: Shard, *, stored: bool = False) -> int:
    """Serialized size of ``shard`` in the upload form, or the stored form if ``stored``."""
    records = sum(f.num_records for f in shard.files) + sum(x.num_records for x in shard.xorbs)
    size = HEADER_SIZE + RECORD_SIZE * (records + 2)
    if stored:
        size += (
            _HASH_LOOKUP.size * (len(shard.files) + len(shard.xorbs))
            + _CHUNK_LOOKUP.size * sum(len(x.chunks) for x in shard.xorbs)
            + FOOTER_SIZE
        )
    return size


def serialize_shard(shard: Shard) -> bytes:
    """The upload form: header with ``footer_size`` 0, the two sections, no tables.

    ``shard.footer`` is ignored. Sections are written in the given order; build the
    shard with :func:`collect_upload_shard` to get hf_xet's order.

    Raises:
        ValueError: a field out of range, or a result over :data:`MAX_SHARD_BYTES`
            (use :func:`split_shard`).
    """
    size = shard_size(shard)
    if size > MAX_SHARD_BYTES:
        raise ValueError(f"shard of {size} bytes exceeds {MAX_SHARD_BYTES}; split it")
    return b"".join(_pack_sections(shard, 0))


def serialize_stored_shard(
    shard: Shard,
    *,
    hmac_key: bytes | None = None,
    created: int | None = None,
    expiry: int | None = None,
) -> bytes:
    """The stored form: sections, lookup tables sorted by key, and the 200-byte footer.

    Chunk hashes are written as they are in ``shard`` and the chunk table is keyed by
    them; with a non-zero ``hmac_key`` they must already be protected (see
    :func:`protect_xorbs`). Unset arguments come from ``shard.footer`` when there is one,
    else: key all zeros, ``created`` now, ``expiry`` :data:`NEVER_EXPIRES`.

    Raises:
        ValueError: a field out of range or a key that is not 32 bytes.
    """
    old = shard.footer
    if hmac_key is None:
        hmac_key = old.chunk_hash_hmac_key if old else ZERO_HASH
    if created is None:
        created = old.shard_creation_timestamp if old else int(time.time())
    if expiry is None:
        expiry = old.shard_key_expiry if old else NEVER_EXPIRES
    if len(hmac_key) != HASH_LEN:
        raise ValueError("the HMAC key must be 32 bytes")

    out = _pack_sections(shard, FOOTER_SIZE)
    # Each entry is folded into one int (key, then index fields) so that sorting compares
    # ints, not tuples; ties fall in index order, which makes the output deterministic.
    file_table: list[int] = []
    record = 0
    for key, f in zip(_trunc_keys([f.file_hash for f in shard.files]), shard.files, strict=True):
        file_table.append(key << 32 | record)
        record += f.num_records
    xorb_table: list[int] = []
    chunk_table: list[int] = []
    record = 0
    for key, x in zip(_trunc_keys([x.xorb_hash for x in shard.xorbs]), shard.xorbs, strict=True):
        xorb_table.append(key << 32 | record)
        base = record << 32
        chunk_table.extend(
            k << 64 | base | i for i, k in enumerate(_trunc_keys([c.hash for c in x.chunks]))
        )
        record += x.num_records
    file_table.sort()
    xorb_table.sort()
    chunk_table.sort()

    cas_info_offset = HEADER_SIZE + RECORD_SIZE * (1 + sum(f.num_records for f in shard.files))
    file_lookup_offset = cas_info_offset + RECORD_SIZE * (
        1 + sum(x.num_records for x in shard.xorbs)
    )
    xorb_lookup_offset = file_lookup_offset + _HASH_LOOKUP.size * len(file_table)
    chunk_lookup_offset = xorb_lookup_offset + _HASH_LOOKUP.size * len(xorb_table)
    footer_offset = chunk_lookup_offset + _CHUNK_LOOKUP.size * len(chunk_table)
    pack_hash, pack_chunk = _HASH_LOOKUP.pack, _CHUNK_LOOKUP.pack
    out.extend([pack_hash(e >> 32, e & _M32) for e in file_table])
    out.extend([pack_hash(e >> 32, e & _M32) for e in xorb_table])
    out.extend([pack_chunk(e >> 64, e >> 32 & _M32, e & _M32) for e in chunk_table])
    try:
        out.append(
            _FOOTER.pack(
                FOOTER_VERSION,
                HEADER_SIZE,
                cas_info_offset,
                file_lookup_offset,
                len(file_table),
                xorb_lookup_offset,
                len(xorb_table),
                chunk_lookup_offset,
                len(chunk_table),
                hmac_key,
                created,
                expiry,
                _ZERO48,
                sum(x.bytes_on_disk for x in shard.xorbs),
                sum(f.size for f in shard.files),
                sum(x.bytes_in_xorb for x in shard.xorbs),
                footer_offset,
            )
        )
    except struct.error as e:
        raise ValueError(f"shard footer field out of range: {e}") from None
    return b"".join(out)


def split_shard(shard: Shard, max_bytes: int = MAX_SHARD_BYTES) -> list[Shard]:
    """Split an upload shard into shards of at most ``max_bytes`` each, order kept.

    A file's terms may name xorbs whose blocks land in another part: the server checks
    terms against xorbs already uploaded, not against the same shard.

    Raises:
        ValueError: a single block does not fit in ``max_bytes`` on its own.
    """
    overhead = HEADER_SIZE + 2 * RECORD_SIZE
    parts: list[Shard] = []
    files: list[FileInfo] = []
    xorbs: list[XorbInfo] = []
    used = overhead
    blocks: list[FileInfo | XorbInfo] = [*shard.files, *shard.xorbs]
    for block in blocks:
        size = RECORD_SIZE * block.num_records
        if overhead + size > max_bytes:
            raise ValueError(f"a block of {size} bytes cannot fit in a {max_bytes}-byte shard")
        if used + size > max_bytes:
            parts.append(Shard(files, xorbs))
            files, xorbs, used = [], [], overhead
        if isinstance(block, FileInfo):
            files.append(block)
        else:
            xorbs.append(block)
        used += size
    if files or xorbs or not parts:
        parts.append(Shard(files, xorbs))
    return parts


# --------------------------------------------------------------------------- parse


def _fail(what: str, reason: str) -> ShardFormatError:
    return ShardFormatError(what, reason)


def _parse_files(
    mv: memoryview, pos: int, limit: int
) -> tuple[list[FileInfo], int, dict[int, bytes]]:
    """Parse the file section from ``pos``; returns files, end, and {record index: hash}."""
    files: list[FileInfo] = []
    index: dict[int, bytes] = {}
    start = pos
    while True:
        what = f"shard file block {len(files)} at byte {pos}"
        if limit - pos < RECORD_SIZE:
            raise _fail(what, "truncated: the file section has no bookend")
        if mv[pos : pos + HASH_LEN] == _BOOKEND_HASH:
            if mv[pos + HASH_LEN : pos + RECORD_SIZE] != _ZERO16:
                raise _fail(what, "bookend with non-zero fields")
            return files, pos + RECORD_SIZE, index
        # the declared count is bounded by the bytes present, keeping room for a bookend
        info, end = _parse_file_block(mv, pos, limit - RECORD_SIZE, what)
        index[(pos - start) // RECORD_SIZE] = info.file_hash
        files.append(info)
        pos = end


def _parse_file_block(mv: memoryview, pos: int, limit: int, what: str) -> tuple[FileInfo, int]:
    """One file block at ``pos`` (not a bookend) that must end by ``limit``."""
    if limit - pos < RECORD_SIZE:
        raise _fail(what, "truncated file block header")
    file_hash, flags, num, reserved = _FILE_HEADER.unpack_from(mv, pos)
    if flags & ~_FILE_FLAGS:
        raise _fail(what, f"unknown flags {flags:#010x}")
    if reserved:
        raise _fail(what, "reserved header field is not zero")
    has_ver = bool(flags & FILE_FLAG_VERIFICATION)
    has_ext = bool(flags & FILE_FLAG_METADATA_EXT)
    records = num * (2 if has_ver else 1) + has_ext
    body = pos + RECORD_SIZE
    # Bound the declared count by the bytes present before reading.
    if RECORD_SIZE * records > limit - body:
        raise _fail(what, f"declares {num} terms, only {limit - body} bytes remain")
    terms: list[FileTerm] = []
    for i, (xh, xflags, unpacked, cstart, cend) in enumerate(
        _FILE_ENTRY.iter_unpack(mv[body : body + RECORD_SIZE * num])
    ):
        if xflags:
            raise _fail(what, f"term {i}: xorb flags {xflags:#x} are not zero")
        if not cstart < cend:
            raise _fail(what, f"term {i}: empty chunk range [{cstart}, {cend})")
        if unpacked == 0:
            raise _fail(what, f"term {i}: zero unpacked bytes")
        terms.append(FileTerm(xh, cstart, cend, unpacked))
    p = body + RECORD_SIZE * num
    verification: list[bytes] | None = None
    if has_ver:
        verification = []
        for i, (vh, pad) in enumerate(_HASH_RECORD.iter_unpack(mv[p : p + RECORD_SIZE * num])):
            if pad != _ZERO16:
                raise _fail(what, f"verification entry {i} has non-zero padding")
            verification.append(vh)
        p += RECORD_SIZE * num
    sha: bytes | None = None
    if has_ext:
        sha, pad = _HASH_RECORD.unpack_from(mv, p)
        if pad != _ZERO16:
            raise _fail(what, "metadata extension has non-zero padding")
        p += RECORD_SIZE
    return FileInfo(file_hash, terms, verification, sha), p


def file_block_size(header: bytes) -> int:
    """Bytes of the file block that starts with this 48-byte header (for reading one block
    of a stored shard; see :func:`parse_file_block`)."""
    if len(header) < RECORD_SIZE:
        raise _fail("shard file block", "truncated header")
    _, flags, num, _ = _FILE_HEADER.unpack_from(header, 0)
    has_ver = bool(flags & FILE_FLAG_VERIFICATION)
    has_ext = bool(flags & FILE_FLAG_METADATA_EXT)
    return RECORD_SIZE * (1 + int(num) * (2 if has_ver else 1) + has_ext)


def parse_file_block(data: bytes | memoryview, what: str = "shard file block") -> FileInfo:
    """One file block, exactly (as read at an offset :func:`file_block_offsets` gave).

    Raises:
        ShardFormatError: malformed, truncated, a bookend, or followed by extra bytes.
    """
    mv = memoryview(data).cast("B")
    if mv[:HASH_LEN] == _BOOKEND_HASH:
        raise _fail(what, "is a bookend, not a file block")
    info, end = _parse_file_block(mv, 0, len(mv), what)
    if end != len(mv):
        raise _fail(what, f"{len(mv) - end} bytes after the block")
    return info


def file_block_offsets(files: Iterable[FileInfo]) -> list[int]:
    """Byte offset of each file's block in a shard holding ``files`` in this order."""
    out: list[int] = []
    pos = HEADER_SIZE
    for f in files:
        out.append(pos)
        pos += RECORD_SIZE * f.num_records
    return out


def _chunk_defect(i: int, start: int, size: int, flags: int, reserved: int) -> str:
    if reserved:
        return f"chunk {i}: reserved field is not zero"
    if flags & _BAD_CHUNK_FLAGS:
        return f"chunk {i}: unknown flags {flags:#010x}"
    if not 0 < size <= _MAX_CHUNK_BYTES:
        return f"chunk {i}: size {size} outside 1..{_MAX_CHUNK_BYTES}"
    return f"chunk {i}: starts at {start}, inside the previous chunk"


def _parse_xorbs(
    mv: memoryview, pos: int, limit: int
) -> tuple[list[XorbInfo], int, dict[int, XorbInfo]]:
    """Parse the CAS section from ``pos``; returns xorbs, end, and {record index: xorb}."""
    xorbs: list[XorbInfo] = []
    index: dict[int, XorbInfo] = {}
    start = pos
    while True:
        what = f"shard xorb block {len(xorbs)} at byte {pos}"
        if limit - pos < RECORD_SIZE:
            raise _fail(what, "truncated: the CAS section has no bookend")
        xorb_hash, flags, num, in_xorb, on_disk = _XORB_HEADER.unpack_from(mv, pos)
        if xorb_hash == _BOOKEND_HASH:
            if mv[pos + HASH_LEN : pos + RECORD_SIZE] != _ZERO16:
                raise _fail(what, "bookend with non-zero fields")
            return xorbs, pos + RECORD_SIZE, index
        if flags:
            raise _fail(what, f"xorb flags {flags:#x} are not zero")
        if not 0 < num <= _MAX_XORB_CHUNKS:
            raise _fail(what, f"chunk count {num} outside 1..{_MAX_XORB_CHUNKS}")
        body = pos + RECORD_SIZE
        if RECORD_SIZE * (num + 1) > limit - body:
            raise _fail(what, f"declares {num} chunks, only {limit - body} bytes remain")
        chunks: list[XorbChunk] = []
        append = chunks.append
        end = 0
        for i, (ch, cstart, size, cflags, reserved) in enumerate(
            _CHUNK_ENTRY.iter_unpack(mv[body : body + RECORD_SIZE * num])
        ):
            # One combined test on the hot path; the message is worked out only on failure.
            if (
                reserved
                or cflags & _BAD_CHUNK_FLAGS
                or not 0 < size <= _MAX_CHUNK_BYTES
                or cstart < end
            ):
                raise _fail(what, _chunk_defect(i, cstart, size, cflags, reserved))
            end = cstart + size
            append(XorbChunk(ch, cstart, size, cflags))
        if end > in_xorb:
            raise _fail(what, f"chunks end at {end}, past the xorb's {in_xorb} bytes")
        info = XorbInfo(xorb_hash, chunks, in_xorb, on_disk)
        index[(pos - start) // RECORD_SIZE] = info
        xorbs.append(info)
        pos = body + RECORD_SIZE * num


def _check_tables(
    mv: memoryview,
    footer: ShardFooter,
    file_index: dict[int, bytes],
    xorb_index: dict[int, XorbInfo],
) -> None:
    """Every lookup entry must point at a block header whose hash it keys, in key order."""
    what = "shard file lookup table"
    pos = footer.file_lookup_offset
    prev = 0
    for i, (key, rec) in enumerate(
        _HASH_LOOKUP.iter_unpack(mv[pos : pos + _HASH_LOOKUP.size * footer.file_lookup_num_entries])
    ):
        h = file_index.get(rec)
        if h is None:
            raise _fail(what, f"entry {i} points at record {rec}, not a file header")
        if key != truncated(h) or key < prev:
            raise _fail(what, f"entry {i}: key does not match its file or is out of order")
        prev = key
    what = "shard xorb lookup table"
    pos = footer.xorb_lookup_offset
    prev = 0
    for i, (key, rec) in enumerate(
        _HASH_LOOKUP.iter_unpack(mv[pos : pos + _HASH_LOOKUP.size * footer.xorb_lookup_num_entries])
    ):
        x = xorb_index.get(rec)
        if x is None:
            raise _fail(what, f"entry {i} points at record {rec}, not a xorb header")
        if key != truncated(x.xorb_hash) or key < prev:
            raise _fail(what, f"entry {i}: key does not match its xorb or is out of order")
        prev = key
    what = "shard chunk lookup table"
    count = footer.chunk_lookup_num_entries
    if not count:
        return
    keys_by_rec = {rec: _trunc_keys([c.hash for c in x.chunks]) for rec, x in xorb_index.items()}
    pos = footer.chunk_lookup_offset
    prev = 0
    for i, (key, rec, ci) in enumerate(
        _CHUNK_LOOKUP.iter_unpack(mv[pos : pos + _CHUNK_LOOKUP.size * count])
    ):
        keys = keys_by_rec.get(rec)
        if keys is None or ci >= len(keys):
            raise _fail(what, f"entry {i} points at ({rec}, {ci}), not a chunk")
        if keys[ci] != key or key < prev:
            raise _fail(what, f"entry {i}: key does not match its chunk or is out of order")
        prev = key


def _parse_footer(mv: memoryview, cas_start: int, cas_end: int) -> ShardFooter:
    what = "shard footer"
    n = len(mv)
    (
        version,
        file_info_offset,
        cas_info_offset,
        file_lookup_offset,
        file_lookup_n,
        xorb_lookup_offset,
        xorb_lookup_n,
        chunk_lookup_offset,
        chunk_lookup_n,
        key,
        created,
        expiry,
        reserved,
        on_disk,
        materialized,
        stored,
        footer_offset,
    ) = _FOOTER.unpack_from(mv, n - FOOTER_SIZE)
    if version != FOOTER_VERSION:
        raise _fail(what, f"version {version}, expected {FOOTER_VERSION}")
    if reserved != _ZERO48:
        raise _fail(what, "reserved bytes are not zero")
    if footer_offset != n - FOOTER_SIZE:
        raise _fail(what, f"footer_offset {footer_offset}, but the footer is at {n - FOOTER_SIZE}")
    if file_info_offset != HEADER_SIZE or cas_info_offset != cas_start:
        raise _fail(what, "section offsets do not match the sections")
    # The tables must tile the space between the CAS section and the footer exactly. The
    # comparisons are on Python ints, so absurd counts cannot overflow into a match.
    if (
        file_lookup_offset != cas_end
        or xorb_lookup_offset != file_lookup_offset + _HASH_LOOKUP.size * file_lookup_n
        or chunk_lookup_offset != xorb_lookup_offset + _HASH_LOOKUP.size * xorb_lookup_n
        or footer_offset != chunk_lookup_offset + _CHUNK_LOOKUP.size * chunk_lookup_n
    ):
        raise _fail(what, "lookup table offsets and counts do not fit between sections and footer")
    return ShardFooter(
        file_info_offset=file_info_offset,
        cas_info_offset=cas_info_offset,
        file_lookup_offset=file_lookup_offset,
        file_lookup_num_entries=file_lookup_n,
        xorb_lookup_offset=xorb_lookup_offset,
        xorb_lookup_num_entries=xorb_lookup_n,
        chunk_lookup_offset=chunk_lookup_offset,
        chunk_lookup_num_entries=chunk_lookup_n,
        chunk_hash_hmac_key=key,
        shard_creation_timestamp=created,
        shard_key_expiry=expiry,
        stored_bytes_on_disk=on_disk,
        materialized_bytes=materialized,
        stored_bytes=stored,
        footer_offset=footer_offset,
        version=version,
    )


def parse_shard(data: bytes | bytearray | memoryview) -> Shard:
    """Parse an upload or stored shard, strictly.

    The footer's byte totals (``stored_bytes`` and friends) are informational and not
    checked against the sections; everything structural is.

    Raises:
        ShardFormatError: anything malformed or truncated, naming the block and offset.
    """
    mv = memoryview(data).cast("B")
    n = len(mv)
    if n < HEADER_SIZE:
        raise _fail("shard header", f"truncated ({n} of {HEADER_SIZE} bytes)")
    tag, version, footer_size = _SHARD_HEADER.unpack_from(mv, 0)
    if tag != HEADER_TAG:
        raise _fail("shard header", "not a shard (bad magic tag)")
    if version != SHARD_VERSION:
        raise _fail("shard header", f"version {version}, expected {SHARD_VERSION}")
    if footer_size not in (0, FOOTER_SIZE):
        raise _fail("shard header", f"footer_size {footer_size}, expected 0 or {FOOTER_SIZE}")
    limit = n - footer_size
    if limit < HEADER_SIZE + 2 * RECORD_SIZE:
        raise _fail("shard", f"truncated ({n} bytes cannot hold both sections)")
    files, pos, file_index = _parse_files(mv, HEADER_SIZE, limit)
    cas_start = pos
    xorbs, pos, xorb_index = _parse_xorbs(mv, pos, limit)
    if footer_size == 0:
        if pos != n:
            raise _fail("shard", f"{n - pos} bytes after the CAS section of an upload shard")
        return Shard(files, xorbs, None)
    footer = _parse_footer(mv, cas_start, pos)
    _check_tables(mv, footer, file_index, xorb_index)
    return Shard(files, xorbs, footer)
