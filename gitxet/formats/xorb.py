"""The Xet xorb layout: compressed chunk records and the optional CasObjectInfo footer.

A xorb body is its chunks back to back, each an 8-byte header followed by a payload that
is the raw chunk, an LZ4 frame, or an LZ4 frame of the byte-grouped chunk. The xorb hash
covers only the chunk hashes and sizes (``gitxet.hashing.xorb_hash``), never the payload
bytes, so writers are free to pick any scheme per chunk and any valid LZ4 encoding.

Stored xorbs may end with a CasObjectInfo V1 footer that lists the chunk hashes and the
chunk end offsets; the local store appends one for O(1) range lookups and strips it before
uploads. The normative description, with the quirks, is ``docs/internals/formats.md``.

Readers are strict: every length is checked against the bytes that remain before anything
is decoded, decoded sizes must equal the header, and every defect raises
:class:`~gitxet.errors.XorbFormatError` naming the chunk and the byte offset.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property

import lz4.frame

from gitxet.errors import IntegrityError, XorbFormatError
from gitxet.hashing import HASH_LEN, chunk_hash, merkle_root_of, to_hex

__all__ = [
    "CHUNK_HEADER_SIZE",
    "CHUNK_SCHEME_OFFSET",
    "FOOTER_BUFFER_SIZE",
    "MAX_CHUNK_BYTES",
    "MAX_PAYLOAD_BYTES",
    "MAX_XORB_BYTES",
    "MAX_XORB_CHUNKS",
    "MAX_XORB_READ_BYTES",
    "PROBE_EVERY",
    "BytesLike",
    "ParsedXorb",
    "Scheme",
    "SerializedXorb",
    "XorbFooter",
    "bg4_regroup",
    "bg4_split",
    "build_footer",
    "chunk_boundaries",
    "compress_chunk",
    "compress_chunks",
    "decode_chunks",
    "decompress_chunk",
    "fits_in_xorb",
    "footer_size",
    "frame_plain",
    "parse_footer",
    "parse_xorb",
    "plain_offsets",
    "serialize_xorb",
    "serialized_size_bound",
    "split_footer",
    "verify_xorb",
]

BytesLike = bytes | bytearray | memoryview

#: Size of the record header in front of every chunk payload.
CHUNK_HEADER_SIZE = 8
CHUNK_SCHEME_OFFSET = 4  # where a chunk header keeps its compression scheme byte
#: Largest uncompressed chunk a reader accepts (the chunker's forced cut, 128 KiB).
MAX_CHUNK_BYTES = 128 * 1024
#: Largest payload a reader accepts (xet-core's limit; LZ4 may expand slightly).
MAX_PAYLOAD_BYTES = 256 * 1024
#: Largest serialized xorb body a writer produces (the CAS server's upload limit).
MAX_XORB_BYTES = 64 * 1024 * 1024
#: Most chunks in one xorb.
MAX_XORB_CHUNKS = 8192
#: Largest body a reader accepts. hf_xet cuts xorbs on 64 MiB of *raw* bytes, so a body of
#: incompressible chunks can exceed 64 MiB by its headers; readers must not refuse those.
MAX_XORB_READ_BYTES = MAX_XORB_BYTES + CHUNK_HEADER_SIZE * MAX_XORB_CHUNKS
#: Size of the opaque buffer at the end of a footer (a nonce may sit in its first 4 bytes).
FOOTER_BUFFER_SIZE = 16


class Scheme(IntEnum):
    """Per-chunk compression scheme byte."""

    NONE = 0
    LZ4 = 1
    BG4_LZ4 = 2


_HEADER = struct.Struct("<II")  # (version | compressed_len << 8, scheme | uncompressed_len << 8)
_U32 = struct.Struct("<I")
_U24_MAX = (1 << 24) - 1
_SCHEMES = frozenset(int(s) for s in Scheme)

# Footer (CasObjectInfo V1) constants.
_IDENT = b"XETBLOB"
_IDENT_HASHES = b"XBLBHSH"
_IDENT_BOUNDS = b"XBLBBND"
_FOOTER_VERSION = 1
_HASHES_VERSION = 0
_BOUNDS_VERSION = 1
_FOOTER_FIXED = 92  # footer bytes with zero chunks, info_length excluded
_FOOTER_PER_CHUNK = 40  # 32-byte hash + two u32 offsets
_TRAILER = struct.Struct("<III")  # num_chunks, hashes_offset_from_end, bounds_offset_from_end

# Chunks at most this long are compressed both ways; for longer ones a prefix of this size
# is compressed both ways to decide whether byte grouping is worth a full attempt. It is a
# direct measurement of what hf_xet's popcount predictor estimates, and costs ~15 us per
# chunk instead of ~85 us for always trying BG4 (a popcount histogram is slower still in
# pure Python).
_BG4_PROBE_BYTES = 16 * 1024
# A probe LZ4 does not shrink below this fraction marks the chunk as incompressible.
_INCOMPRESSIBLE = 0.98


# --------------------------------------------------------------------------- compression


def _lz4(data: bytes) -> bytes:
    # One independent block per chunk, no checksums, no content size: the framing hf_xet
    # (lz4_flex) uses. The block bytes themselves differ between encoders, harmlessly.
    return lz4.frame.compress(  # type: ignore[no-any-return]
        data,
        block_size=lz4.frame.BLOCKSIZE_MAX256KB,
        block_linked=False,
        content_checksum=False,
        store_size=False,
    )


def bg4_split(data: bytes) -> bytes:
    """Byte grouping: bytes at positions 0, 4, 8, … then 1, 5, 9, … then 2… then 3…."""
    return b"".join((data[0::4], data[1::4], data[2::4], data[3::4]))


def bg4_regroup(grouped: bytes | bytearray | memoryview) -> bytes:
    """Inverse of :func:`bg4_split` (the first ``len % 4`` groups are one byte longer)."""
    n = len(grouped)
    q, r = divmod(n, 4)
    out = bytearray(n)
    pos = 0
    for g in range(4):
        size = q + (1 if g < r else 0)
        out[g::4] = grouped[pos : pos + size]
        pos += size
    return bytes(out)


def _as_bytes(data: BytesLike) -> bytes:
    # Strided slicing of a memoryview is ~10x slower than of bytes; copy once.
    return data if isinstance(data, bytes) else bytes(data)


def compress_chunk(data: BytesLike, scheme: Scheme | None = None) -> tuple[Scheme, bytes]:
    """Encode one chunk; returns ``(scheme, payload)``.

    With ``scheme=None`` a chunk over 16 KiB is compressed once, the way its first 16 KiB
    compress best (BG4+LZ4 or LZ4; not at all when LZ4 does not shrink them), smaller
    chunks both ways; the raw bytes (``Scheme.NONE``) are kept unless the compressed form
    is strictly smaller, as hf_xet does. An explicit ``scheme`` is used as given, even if larger.

    Raises:
        ValueError: if the chunk is empty or longer than :data:`MAX_CHUNK_BYTES`.
    """
    raw = _as_bytes(data)
    n = len(raw)
    if not 0 < n <= MAX_CHUNK_BYTES:
        raise ValueError(f"chunk length {n} outside 1..{MAX_CHUNK_BYTES}")
    if scheme is not None:
        scheme = Scheme(scheme)
        if scheme is Scheme.NONE:
            return scheme, raw
        if scheme is Scheme.LZ4:
            return scheme, _lz4(raw)
        return scheme, _lz4(bg4_split(raw))

    best_scheme, best = Scheme.NONE, raw
    if n <= _BG4_PROBE_BYTES:
        lz: bytes | None = _lz4(raw)
        bg: bytes | None = _lz4(bg4_split(raw))
    else:
        # the probe decides which full compressions are worth running: BG4 when it beats
        # LZ4 on the probe, else LZ4 unless the probe did not shrink at all (random or
        # already compressed data: stored raw, as a full attempt would end anyway)
        probe = raw[:_BG4_PROBE_BYTES]
        lz_probe = len(_lz4(probe))
        bg_probe = len(_lz4(bg4_split(probe)))
        bg = _lz4(bg4_split(raw)) if bg_probe < lz_probe else None
        lz = _lz4(raw) if bg is None and lz_probe < _INCOMPRESSIBLE * len(probe) else None
    if lz is not None and len(lz) < len(best):
        best_scheme, best = Scheme.LZ4, lz
    if bg is not None and len(bg) < len(best):
        best_scheme, best = Scheme.BG4_LZ4, bg
    return best_scheme, best


#: :func:`compress_chunks` probes one chunk in this many; the others reuse its decision
PROBE_EVERY = 16


def compress_chunks(chunks: Sequence[BytesLike]) -> list[tuple[Scheme, bytes]]:
    """:func:`compress_chunk` for consecutive chunks of one stream, with fewer probes.

    Neighbouring chunks of a file compress alike (a CSV, an array, random bytes), so the
    scheme :func:`compress_chunk` picks for one chunk in :data:`PROBE_EVERY` is used for
    those after it without probing: a chunk is then compressed once that way (the raw bytes
    kept when that does not shrink it), and raw chunks are not compressed at all. The xorb
    hash never depends on the payloads, only the compressed size can; probing was ~40% of
    the compression time of a CSV (two 16 KiB attempts per 64 KiB chunk).
    """
    out: list[tuple[Scheme, bytes]] = []
    decided = Scheme.NONE
    for i, chunk in enumerate(chunks):
        raw = _as_bytes(chunk)
        if i % PROBE_EVERY == 0 or len(raw) <= _BG4_PROBE_BYTES:
            used, payload = compress_chunk(raw)
            if i % PROBE_EVERY == 0:
                decided = used
        elif decided is Scheme.NONE:
            used, payload = Scheme.NONE, raw
        else:
            used, payload = compress_chunk(raw, decided)
            if len(payload) >= len(raw):
                used, payload = Scheme.NONE, raw
        out.append((used, payload))
    return out


def _lz4_decode(payload: BytesLike, size: int, what: str) -> bytes:
    decoder = lz4.frame.LZ4FrameDecompressor()
    try:
        # The output cap makes a hostile frame unable to allocate more than size + 1 bytes.
        out: bytes = decoder.decompress(payload, max_length=size + 1)
    except (RuntimeError, ValueError, OverflowError) as e:
        raise XorbFormatError(what, f"invalid LZ4 frame ({e})") from None
    if len(out) > size:
        raise XorbFormatError(what, f"payload decodes to more than the header's {size} bytes")
    if not decoder.eof:
        raise XorbFormatError(what, "LZ4 frame is truncated (no end mark)")
    if decoder.unused_data:
        raise XorbFormatError(what, f"{len(decoder.unused_data)} bytes after the LZ4 frame")
    if len(out) != size:
        raise XorbFormatError(what, f"payload decodes to {len(out)} bytes, header says {size}")
    return out


def _decompress(scheme: int, payload: BytesLike, size: int, what: str) -> bytes:
    if not 0 < size <= MAX_CHUNK_BYTES:
        raise XorbFormatError(what, f"uncompressed length {size} outside 1..{MAX_CHUNK_BYTES}")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise XorbFormatError(what, f"payload length {len(payload)} > {MAX_PAYLOAD_BYTES}")
    if scheme == Scheme.NONE:
        if len(payload) != size:
            raise XorbFormatError(
                what, f"uncompressed payload is {len(payload)} bytes, header says {size}"
            )
        return bytes(payload)
    if scheme == Scheme.LZ4:
        return _lz4_decode(payload, size, what)
    if scheme == Scheme.BG4_LZ4:
        return bg4_regroup(_lz4_decode(payload, size, what))
    raise XorbFormatError(what, f"unknown compression scheme {scheme}")


def decompress_chunk(scheme: int, payload: BytesLike, uncompressed_len: int) -> bytes:
    """Decode one chunk payload and check it against the header's uncompressed length.

    Raises:
        XorbFormatError: unknown scheme, a limit exceeded, a bad LZ4 frame, or a size
            other than ``uncompressed_len``.
    """
    return _decompress(scheme, payload, uncompressed_len, "xorb chunk")


# --------------------------------------------------------------------------- body


def _chunk_what(what: str, index: int, pos: int) -> str:
    return f"{what} chunk {index} at byte {pos}"


def _records(mv: memoryview, what: str) -> Iterator[tuple[int, int, int, int]]:
    """Yield ``(payload_start, scheme, compressed_len, uncompressed_len)`` per chunk.

    Checks each header and that its payload lies within ``mv`` before yielding it.
    """
    end = len(mv)
    pos = 0
    index = 0
    while pos < end:
        cw = _chunk_what(what, index, pos)
        if index >= MAX_XORB_CHUNKS:
            raise XorbFormatError(cw, f"more than {MAX_XORB_CHUNKS} chunks")
        if end - pos < CHUNK_HEADER_SIZE:
            raise XorbFormatError(cw, f"truncated header ({end - pos} of 8 bytes)")
        if mv[pos : pos + len(_IDENT)] == _IDENT:
            raise XorbFormatError(cw, "a footer appears where a chunk header is expected")
        w0, w1 = _HEADER.unpack_from(mv, pos)
        version, clen = w0 & 0xFF, w0 >> 8
        scheme, ulen = w1 & 0xFF, w1 >> 8
        if version != 0:
            raise XorbFormatError(cw, f"chunk header version {version}, expected 0")
        if scheme not in _SCHEMES:
            raise XorbFormatError(cw, f"unknown compression scheme {scheme}")
        if not 0 < ulen <= MAX_CHUNK_BYTES:
            raise XorbFormatError(cw, f"uncompressed length {ulen} outside 1..{MAX_CHUNK_BYTES}")
        if clen > MAX_PAYLOAD_BYTES:
            raise XorbFormatError(cw, f"payload length {clen} > {MAX_PAYLOAD_BYTES}")
        if scheme == Scheme.NONE and clen != ulen:
            raise XorbFormatError(cw, f"uncompressed chunk with lengths {clen} != {ulen}")
        start = pos + CHUNK_HEADER_SIZE
        if clen > end - start:
            raise XorbFormatError(cw, f"payload truncated ({end - start} of {clen} bytes)")
        yield start, scheme, clen, ulen
        pos = start + clen
        index += 1


def _check_size(n: int, what: str) -> None:
    if n > MAX_XORB_READ_BYTES:
        raise XorbFormatError(what, f"{n} bytes exceeds the {MAX_XORB_READ_BYTES}-byte limit")


def decode_chunks(data: BytesLike, expected_count: int | None = None) -> list[bytes]:
    """Decode a run of consecutive whole chunks, e.g. a ranged GET of a xorb.

    ``data`` must start at a chunk header and end exactly after a payload; it must not
    contain a footer.

    Raises:
        XorbFormatError: malformed or truncated input, or a chunk count other than
            ``expected_count``.
    """
    mv = memoryview(data).cast("B")
    _check_size(len(mv), "xorb range")
    out = [
        _decompress(scheme, mv[start : start + clen], ulen, "xorb range")
        for start, scheme, clen, ulen in _records(mv, "xorb range")
    ]
    if expected_count is not None and len(out) != expected_count:
        raise XorbFormatError("xorb range", f"{len(out)} chunks, expected {expected_count}")
    return out


def decode_chunk_views(
    data: BytesLike, expected_count: int | None = None
) -> list[memoryview | bytes]:
    """Like :func:`decode_chunks`, but chunks stored uncompressed are views into ``data``
    (no copy); the caller keeps ``data`` alive and unchanged while it uses them.

    Raises:
        XorbFormatError: as :func:`decode_chunks`.
    """
    mv = memoryview(data).cast("B")
    _check_size(len(mv), "xorb range")
    out: list[memoryview | bytes] = []
    for start, scheme, clen, ulen in _records(mv, "xorb range"):
        payload = mv[start : start + clen]
        out.append(
            payload if scheme == Scheme.NONE else _decompress(scheme, payload, ulen, "xorb range")
        )
    if expected_count is not None and len(out) != expected_count:
        raise XorbFormatError("xorb range", f"{len(out)} chunks, expected {expected_count}")
    return out


def chunk_boundaries(body: BytesLike) -> tuple[list[int], list[int]]:
    """Walk the chunk headers without decoding payloads.

    Returns ``(byte_offsets, uncompressed_offsets)``, each with ``n + 1`` entries: where
    each serialized chunk starts in ``body`` (the last is ``len(body)``), and where each
    chunk starts in the concatenated uncompressed data (the last is the total).

    Raises:
        XorbFormatError: malformed or truncated headers, or a footer in ``body``.
    """
    mv = memoryview(body).cast("B")
    _check_size(len(mv), "xorb")
    byte_offsets = [0]
    unpacked = [0]
    for start, _scheme, clen, ulen in _records(mv, "xorb"):
        byte_offsets.append(start + clen)
        unpacked.append(unpacked[-1] + ulen)
    return byte_offsets, unpacked


def plain_offsets(data_offsets: Sequence[int]) -> tuple[int, ...]:
    """Where each chunk starts in the xorb's *plain* serialization (every chunk stored with
    scheme NONE), from where it starts in the decoded data: ``n + 1`` offsets."""
    return tuple(off + CHUNK_HEADER_SIZE * i for i, off in enumerate(data_offsets))


def frame_plain(chunks: Sequence[BytesLike]) -> list[BytesLike]:
    """Decoded chunks as the pieces (header, payload, header, ...) of their plain
    serialization: what a cache tier sends for a range it holds decoded (the payloads are
    not copied). The chunk hashes do not depend on the framing, so the xorb hash is the same.

    Raises:
        ValueError: an empty or oversized chunk.
    """
    out: list[BytesLike] = []
    pack = _HEADER.pack
    for c in chunks:
        n = len(c)
        if not 0 < n <= MAX_CHUNK_BYTES:
            raise ValueError(f"chunk length {n} outside 1..{MAX_CHUNK_BYTES}")
        out.append(pack(n << 8, int(Scheme.NONE) | n << 8))
        out.append(c)
    return out


def serialized_size_bound(raw_bytes: int, num_chunks: int) -> int:
    """Largest body a xorb of these totals can serialize to (the NONE fallback caps it)."""
    return raw_bytes + CHUNK_HEADER_SIZE * num_chunks


def fits_in_xorb(raw_bytes: int, num_chunks: int) -> bool:
    """Whether a xorb with these totals is sure to stay within the limits.

    Cut a xorb *before* adding the chunk for which this turns false; that satisfies both
    hf_xet's rule (64 MiB raw, 8192 chunks) and the server's 64 MiB serialized limit.
    """
    return (
        num_chunks <= MAX_XORB_CHUNKS
        and serialized_size_bound(raw_bytes, num_chunks) <= MAX_XORB_BYTES
    )


@dataclass(frozen=True)
class SerializedXorb:
    """A xorb ready for upload: ``body`` plus what shards and footers need about it.

    The body is kept as its ``parts`` (chunk headers and payloads, in order): a store writes
    them with one ``writev`` per batch instead of copying 64 MiB into one ``bytes`` first."""

    parts: list[bytes]
    hash: bytes
    chunk_hashes: list[bytes]
    chunk_sizes: list[int]
    #: ``n + 1`` offsets of each serialized chunk in ``body``; the last is ``len(body)``.
    byte_offsets: list[int]
    schemes: list[Scheme]

    @cached_property
    def body(self) -> bytes:
        """The serialized chunks as one buffer (joined on first use)."""
        return b"".join(self.parts)

    @property
    def raw_size(self) -> int:
        """Total uncompressed bytes."""
        return sum(self.chunk_sizes)

    def footer(self, buffer: bytes = bytes(FOOTER_BUFFER_SIZE)) -> bytes:
        """The CasObjectInfo V1 footer (with its length word) to append for storage."""
        ends: list[int] = []
        total = 0
        for size in self.chunk_sizes:
            total += size
            ends.append(total)
        return build_footer(self.hash, self.chunk_hashes, self.byte_offsets[1:], ends, buffer)


def serialize_xorb(
    chunks: Sequence[BytesLike],
    chunk_hashes: Sequence[bytes] | None = None,
    *,
    scheme: Scheme | None = None,
) -> SerializedXorb:
    """Compress and frame ``chunks`` into a xorb body (no footer) and compute its hash.

    Pass ``chunk_hashes`` when already known (the ingest path has them) to skip rehashing;
    they are trusted. ``scheme`` forces one scheme for every chunk (see
    :func:`compress_chunk`).

    Raises:
        ValueError: no chunks, more than :data:`MAX_XORB_CHUNKS`, an empty or oversized
            chunk, a hash that is not 32 bytes, or a body over :data:`MAX_XORB_BYTES`.
    """
    n = len(chunks)
    if n == 0:
        raise ValueError("a xorb needs at least one chunk")
    if n > MAX_XORB_CHUNKS:
        raise ValueError(f"{n} chunks exceeds the {MAX_XORB_CHUNKS}-chunk limit")
    if chunk_hashes is None:
        hashes = [chunk_hash(memoryview(c)) for c in chunks]
    else:
        hashes = list(chunk_hashes)
        if len(hashes) != n:
            raise ValueError(f"{len(hashes)} chunk hashes for {n} chunks")
        if any(len(h) != HASH_LEN for h in hashes):
            raise ValueError("chunk hashes must be 32 raw bytes")
    return frame_xorb([compress_chunk(c, scheme) for c in chunks], [len(c) for c in chunks], hashes)


def frame_xorb(
    compressed: Sequence[tuple[Scheme, bytes]], sizes: Sequence[int], chunk_hashes: Sequence[bytes]
) -> SerializedXorb:
    """Frame already-compressed chunks (from :func:`compress_chunk`) into a xorb body.

    This is :func:`serialize_xorb` without the compression step, so callers can compress
    chunks on several threads as they arrive. ``sizes`` are the uncompressed lengths and
    ``chunk_hashes`` are trusted.

    Raises:
        ValueError: inconsistent lengths, an oversized payload, or a body over
            :data:`MAX_XORB_BYTES`.
    """
    n = len(compressed)
    if not 0 < n <= MAX_XORB_CHUNKS or len(sizes) != n or len(chunk_hashes) != n:
        raise ValueError(f"{n} chunks, {len(sizes)} sizes, {len(chunk_hashes)} hashes")
    parts: list[bytes] = []
    offsets = [0]
    schemes: list[Scheme] = []
    pos = 0
    pack = _HEADER.pack
    for (used, payload), size in zip(compressed, sizes, strict=True):
        plen = len(payload)
        if plen > MAX_PAYLOAD_BYTES:  # only reachable with a forced scheme
            raise ValueError(f"payload of {plen} bytes exceeds {MAX_PAYLOAD_BYTES}")
        if not 0 < size <= MAX_CHUNK_BYTES:
            raise ValueError(f"chunk length {size} outside 1..{MAX_CHUNK_BYTES}")
        parts.append(pack(plen << 8, int(used) | size << 8))
        parts.append(payload)
        pos += CHUNK_HEADER_SIZE + plen
        offsets.append(pos)
        schemes.append(used)
    if pos > MAX_XORB_BYTES:
        raise ValueError(f"serialized xorb of {pos} bytes exceeds {MAX_XORB_BYTES}")
    hashes = list(chunk_hashes)
    return SerializedXorb(
        parts=parts,
        hash=merkle_root_of(hashes, sizes),
        chunk_hashes=hashes,
        chunk_sizes=list(sizes),
        byte_offsets=offsets,
        schemes=schemes,
    )


@dataclass(frozen=True)
class ParsedXorb:
    """A decoded xorb: chunks, recomputed hashes, layout, and the footer if one was there."""

    chunks: list[bytes]
    chunk_hashes: list[bytes]
    chunk_sizes: list[int]
    #: ``n + 1`` offsets of each serialized chunk in the body; the last is the body length.
    byte_offsets: list[int]
    schemes: list[Scheme]
    hash: bytes
    footer: XorbFooter | None


def parse_xorb(data: BytesLike, *, what: str = "xorb", keep_chunks: bool = True) -> ParsedXorb:
    """Decode a whole xorb, with or without footer, and recompute every hash.

    When a footer is present it must agree with the body exactly (hashes and offsets).
    ``what`` names the object in error messages. Without ``keep_chunks`` each chunk is
    dropped once hashed (``chunks`` is empty): a check holds one chunk at a time, not a
    second copy of up to 64 MiB.

    Raises:
        XorbFormatError: malformed, truncated, empty, oversized, or an inconsistent footer.
    """
    mv = memoryview(data).cast("B")
    end, footer = _find_footer(mv, what)
    body = mv[:end]
    _check_size(len(body), what)
    chunks: list[bytes] = []
    hashes: list[bytes] = []
    sizes: list[int] = []
    offsets = [0]
    schemes: list[Scheme] = []
    for start, scheme, clen, ulen in _records(body, what):
        cw = _chunk_what(what, len(hashes), start - CHUNK_HEADER_SIZE)
        chunk = _decompress(scheme, body[start : start + clen], ulen, cw)
        hashes.append(chunk_hash(chunk))
        sizes.append(len(chunk))
        if keep_chunks:
            chunks.append(chunk)
        offsets.append(start + clen)
        schemes.append(Scheme(scheme))
    if not hashes:
        raise XorbFormatError(what, "no chunks")
    xhash = merkle_root_of(hashes, sizes)
    if footer is not None:
        _check_footer_matches(footer, xhash, hashes, sizes, offsets, what)
    return ParsedXorb(chunks, hashes, sizes, offsets, schemes, xhash, footer)


def verify_xorb(body: BytesLike, expected_hash: bytes, *, keep_chunks: bool = True) -> ParsedXorb:
    """Parse ``body`` and check that its chunks hash to ``expected_hash`` (``keep_chunks``:
    as :func:`parse_xorb`).

    Raises:
        XorbFormatError: the bytes are not a valid xorb.
        IntegrityError: a valid xorb, but a different one.
    """
    name = to_hex(expected_hash)
    parsed = parse_xorb(body, what=f"xorb {name}", keep_chunks=keep_chunks)
    if parsed.hash != expected_hash:
        raise IntegrityError("xorb", name, f"chunks hash to {to_hex(parsed.hash)}")
    return parsed


# --------------------------------------------------------------------------- footer


@dataclass(frozen=True)
class XorbFooter:
    """A CasObjectInfo V1 footer: per-chunk hashes and end offsets of a stored xorb."""

    xorb_hash: bytes
    chunk_hashes: list[bytes]
    #: End offset of each serialized chunk (header included) in the body.
    byte_ends: list[int]
    #: End offset of each chunk in the concatenated uncompressed data.
    uncompressed_ends: list[int]
    #: Opaque 16 bytes (hf_xet may put a nonce in the first 4); not part of the hash.
    buffer: bytes = bytes(FOOTER_BUFFER_SIZE)

    @property
    def num_chunks(self) -> int:
        """Number of chunks in the xorb."""
        return len(self.chunk_hashes)

    def byte_range(self, start: int, end: int) -> tuple[int, int]:
        """Body byte range ``[a, b)`` holding chunks ``[start, end)``, headers included.

        Raises:
            IndexError: if ``0 <= start < end <= num_chunks`` does not hold.
        """
        if not 0 <= start < end <= len(self.byte_ends):
            raise IndexError(f"chunk range [{start}, {end}) not in [0, {len(self.byte_ends)})")
        return (self.byte_ends[start - 1] if start else 0), self.byte_ends[end - 1]

    def chunk_size(self, index: int) -> int:
        """Uncompressed size of chunk ``index``."""
        ends = self.uncompressed_ends
        return ends[index] - (ends[index - 1] if index else 0)


def footer_size(num_chunks: int) -> int:
    """Bytes a footer for ``num_chunks`` chunks adds, its 4-byte length word included."""
    return _FOOTER_FIXED + _FOOTER_PER_CHUNK * num_chunks + 4


def build_footer(
    xorb_hash: bytes,
    chunk_hashes: Sequence[bytes],
    byte_ends: Sequence[int],
    uncompressed_ends: Sequence[int],
    buffer: bytes = bytes(FOOTER_BUFFER_SIZE),
) -> bytes:
    """Serialize a CasObjectInfo V1 footer followed by its u32 ``info_length``.

    Raises:
        ValueError: mismatched list lengths, a hash or buffer of the wrong size, or an
            offset that does not fit in a u32.
    """
    n = len(chunk_hashes)
    if len(byte_ends) != n or len(uncompressed_ends) != n:
        raise ValueError("chunk_hashes, byte_ends and uncompressed_ends differ in length")
    if len(xorb_hash) != HASH_LEN or any(len(h) != HASH_LEN for h in chunk_hashes):
        raise ValueError("hashes must be 32 raw bytes")
    if len(buffer) != FOOTER_BUFFER_SIZE:
        raise ValueError(f"footer buffer must be {FOOTER_BUFFER_SIZE} bytes")
    try:
        ends = struct.pack(f"<{n}I{n}I", *byte_ends, *uncompressed_ends)
    except struct.error as e:
        raise ValueError(f"footer offset out of u32 range: {e}") from None
    info_length = _FOOTER_FIXED + _FOOTER_PER_CHUNK * n
    return b"".join(
        (
            _IDENT,
            bytes((_FOOTER_VERSION,)),
            xorb_hash,
            _IDENT_HASHES,
            bytes((_HASHES_VERSION,)),
            _U32.pack(n),
            *chunk_hashes,
            _IDENT_BOUNDS,
            bytes((_BOUNDS_VERSION,)),
            _U32.pack(n),
            ends,
            # Offsets from the end of the footer back to each section's ident.
            _TRAILER.pack(n, 52 + 40 * n, 40 + 8 * n),
            buffer,
            _U32.pack(info_length),
        )
    )


def _strictly_increasing(values: Sequence[int], first_min: int) -> bool:
    prev = first_min - 1
    for v in values:
        if v <= prev:
            return False
        prev = v
    return True


def _parse_footer_at(mv: memoryview, start: int, what: str) -> XorbFooter:
    """Parse the footer occupying ``mv[start:-4]``; the body is ``mv[:start]``."""
    fw = f"{what} footer"
    end = len(mv) - 4
    length = end - start
    pos = start + len(_IDENT)
    version = mv[pos]
    if version != _FOOTER_VERSION:
        raise XorbFormatError(fw, f"version {version} not supported (only V1)")
    pos += 1
    xorb_hash = bytes(mv[pos : pos + HASH_LEN])
    pos += HASH_LEN
    if mv[pos : pos + 7] != _IDENT_HASHES or mv[pos + 7] != _HASHES_VERSION:
        raise XorbFormatError(fw, "bad hash-section ident or version")
    (n,) = _U32.unpack_from(mv, pos + 8)
    pos += 12
    # Check the declared count against the real length before reading any array.
    if n == 0 or n > MAX_XORB_CHUNKS:
        raise XorbFormatError(fw, f"chunk count {n} outside 1..{MAX_XORB_CHUNKS}")
    if length != _FOOTER_FIXED + _FOOTER_PER_CHUNK * n:
        raise XorbFormatError(fw, f"length {length} does not fit {n} chunks")
    hashes = [bytes(mv[p : p + HASH_LEN]) for p in range(pos, pos + HASH_LEN * n, HASH_LEN)]
    pos += HASH_LEN * n
    if mv[pos : pos + 7] != _IDENT_BOUNDS or mv[pos + 7] != _BOUNDS_VERSION:
        raise XorbFormatError(fw, "bad boundary-section ident or version")
    (n2,) = _U32.unpack_from(mv, pos + 8)
    pos += 12
    if n2 != n:
        raise XorbFormatError(fw, f"boundary section counts {n2} chunks, hash section {n}")
    byte_ends = list(struct.unpack_from(f"<{n}I", mv, pos))
    pos += 4 * n
    unpacked_ends = list(struct.unpack_from(f"<{n}I", mv, pos))
    pos += 4 * n
    n3, hashes_off, bounds_off = _TRAILER.unpack_from(mv, pos)
    pos += _TRAILER.size
    if n3 != n:
        raise XorbFormatError(fw, f"trailer counts {n3} chunks, hash section {n}")
    if hashes_off != 52 + 40 * n or bounds_off != 40 + 8 * n:
        raise XorbFormatError(fw, "section offsets do not match the layout")
    buffer = bytes(mv[pos : pos + FOOTER_BUFFER_SIZE])
    if not _strictly_increasing(byte_ends, CHUNK_HEADER_SIZE + 1) or byte_ends[-1] != start:
        raise XorbFormatError(fw, "chunk byte ends are not increasing up to the body length")
    if not _strictly_increasing(unpacked_ends, 1):
        raise XorbFormatError(fw, "uncompressed ends are not increasing")
    return XorbFooter(xorb_hash, hashes, byte_ends, unpacked_ends, buffer)


def _find_footer(mv: memoryview, what: str) -> tuple[int, XorbFooter | None]:
    """``(body_length, footer)``; ``(len(mv), None)`` when there is no footer."""
    n = len(mv)
    if n < 4 + _FOOTER_FIXED:
        return n, None
    (info_length,) = _U32.unpack_from(mv, n - 4)
    start = n - 4 - info_length
    # A footer is present when the trailing length points at its ident. A footerless body
    # cannot be mistaken for one by parse_xorb: a footer can only start where a chunk
    # header would, and a header's version byte is 0, not "X".
    if info_length < _FOOTER_FIXED or start < 0 or mv[start : start + len(_IDENT)] != _IDENT:
        return n, None
    return start, _parse_footer_at(mv, start, what)


def split_footer(data: BytesLike) -> tuple[memoryview, XorbFooter | None]:
    """Separate a stored xorb into its body and footer, if it has one.

    Only the trailer is read, so this is O(footer); it does not walk the body. The body
    is a zero-copy view of ``data``: while it lives, ``data`` stays exported (an mmap
    cannot be closed), so use :func:`parse_footer` when only the footer is wanted.

    Raises:
        XorbFormatError: a footer is present but malformed.
    """
    mv = memoryview(data).cast("B")
    end, footer = _find_footer(mv, "xorb")
    return mv[:end], footer


def parse_footer(data: BytesLike) -> XorbFooter | None:
    """The footer at the end of a stored xorb, or ``None`` if there is none.

    Keeps no reference to ``data`` (safe on an mmap that is closed right after).

    Raises:
        XorbFormatError: a footer is present but malformed.
    """
    with memoryview(data) as raw, raw.cast("B") as mv:
        return _find_footer(mv, "xorb")[1]


def _check_footer_matches(
    footer: XorbFooter,
    xhash: bytes,
    hashes: list[bytes],
    sizes: list[int],
    offsets: list[int],
    what: str,
) -> None:
    fw = f"{what} footer"
    if footer.num_chunks != len(hashes):
        raise XorbFormatError(fw, f"lists {footer.num_chunks} chunks, body has {len(hashes)}")
    if footer.xorb_hash != xhash:
        raise XorbFormatError(fw, f"names xorb {to_hex(footer.xorb_hash)}, body is {to_hex(xhash)}")
    if footer.chunk_hashes != hashes:
        raise XorbFormatError(fw, "chunk hashes differ from the body's")
    if footer.byte_ends != offsets[1:]:
        raise XorbFormatError(fw, "chunk byte ends differ from the body's")
    total = 0
    for i, size in enumerate(sizes):
        total += size
        if footer.uncompressed_ends[i] != total:
            raise XorbFormatError(fw, f"uncompressed end of chunk {i} differs from the body's")
