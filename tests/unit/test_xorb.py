"""Xorb format: golden vectors, round trips, strict rejection (docs/internals/formats.md)."""

from __future__ import annotations

import itertools
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gitxet.chunking import chunk_bytes
from gitxet.errors import IntegrityError, XorbFormatError
from gitxet.formats.xorb import (
    CHUNK_HEADER_SIZE,
    MAX_CHUNK_BYTES,
    MAX_PAYLOAD_BYTES,
    MAX_XORB_BYTES,
    MAX_XORB_CHUNKS,
    PROBE_EVERY,
    Scheme,
    bg4_regroup,
    bg4_split,
    build_footer,
    chunk_boundaries,
    compress_chunk,
    compress_chunks,
    decode_chunks,
    decompress_chunk,
    fits_in_xorb,
    footer_size,
    parse_footer,
    parse_xorb,
    serialize_xorb,
    serialized_size_bound,
    split_footer,
    verify_xorb,
)
from gitxet.hashing import chunk_hash, file_hash, merkle_root, to_hex
from tests.vectors import THREE_MIB, THREE_MIB_FIRST_SIZES, THREE_MIB_LAST_SIZE, THREE_MIB_XORB


def _header(clen: int, scheme: int, ulen: int) -> bytes:
    return bytes([0]) + clen.to_bytes(3, "little") + bytes([scheme]) + ulen.to_bytes(3, "little")


def _floats(seed: int, n: int) -> bytes:
    r = random.Random(seed)
    return struct.pack(f"<{n}f", *(r.uniform(-1.0, 1.0) for _ in range(n)))


RANDOM_64K = random.Random(11).randbytes(65536)
FLOATS_64K = _floats(12, 16384)
TEXT = b"".join(b"row %d, value %d, label=cat\n" % (i, i * 7 % 13) for i in range(3000))
ZEROS = bytes(MAX_CHUNK_BYTES)

# A small xorb touching every scheme, for the byte-by-byte tests.
SMALL_CHUNKS = [b"Hello World!", TEXT[:3000], FLOATS_64K[:4000], RANDOM_64K[:700]]


@pytest.fixture(scope="module")
def three_mib_chunks() -> list[bytes]:
    return chunk_bytes(THREE_MIB)


# --------------------------------------------------------------------------- golden vectors


def test_three_mib_xorb_vector(three_mib_chunks: list[bytes]) -> None:
    chunks = three_mib_chunks
    assert len(chunks) == 52
    assert [len(c) for c in chunks[:6]] == THREE_MIB_FIRST_SIZES
    assert len(chunks[-1]) == THREE_MIB_LAST_SIZE
    sx = serialize_xorb(chunks)
    assert to_hex(sx.hash) == THREE_MIB_XORB
    # Incompressible data: hf_xet's xorb is exactly headers + raw chunks (§12.2).
    assert sx.body == b"".join(_header(len(c), 0, len(c)) + c for c in chunks)
    assert sx.schemes == [Scheme.NONE] * 52
    assert len(sx.body) == len(THREE_MIB) + 8 * 52
    assert sx.byte_offsets[0] == 0 and sx.byte_offsets[-1] == len(sx.body)
    assert sx.chunk_sizes == [len(c) for c in chunks]
    assert sx.raw_size == len(THREE_MIB)


def test_precomputed_hashes_give_same_xorb(three_mib_chunks: list[bytes]) -> None:
    hashes = [chunk_hash(c) for c in three_mib_chunks]
    sx = serialize_xorb(three_mib_chunks, chunk_hashes=hashes)
    assert to_hex(sx.hash) == THREE_MIB_XORB
    assert sx.chunk_hashes == hashes


def test_three_mib_parse_round_trip(three_mib_chunks: list[bytes]) -> None:
    sx = serialize_xorb(three_mib_chunks)
    px = parse_xorb(sx.body)
    assert px.chunks == three_mib_chunks
    assert to_hex(px.hash) == THREE_MIB_XORB
    assert px.byte_offsets == sx.byte_offsets
    assert px.footer is None
    assert serialize_xorb(px.chunks).body == sx.body


def test_hf_xet_agrees_with_our_parsed_xorb(tmp_path, three_mib_chunks: list[bytes]) -> None:  # type: ignore[no-untyped-def]
    hf_xet = pytest.importorskip("hf_xet")
    sx = serialize_xorb(three_mib_chunks)
    # hf_xet uploaded exactly headers + raw chunks for this input (§12.1); its file hash
    # must equal the one derived from what our parser reads back out of those bytes.
    expected_body = b"".join(_header(len(c), 0, len(c)) + c for c in three_mib_chunks)
    assert sx.body == expected_body
    px = parse_xorb(expected_body)
    path = tmp_path / "three_mib.bin"
    path.write_bytes(b"".join(px.chunks))
    (info,) = hf_xet.hash_files([str(path)])
    assert info.hash == to_hex(file_hash(list(zip(px.chunk_hashes, px.chunk_sizes, strict=True))))


def test_single_chunk_xorb_hash_is_chunk_hash() -> None:
    sx = serialize_xorb([b"Hello World!"])
    assert to_hex(sx.hash) == "d8d408e608fb9ca213b9909a65d86d725f2de4d8d540324be8a363e7a6e228cb"


# --------------------------------------------------------------------------- schemes


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (RANDOM_64K, Scheme.NONE),
        (ZEROS, Scheme.LZ4),
        (TEXT[:60000], Scheme.LZ4),
        (FLOATS_64K, Scheme.BG4_LZ4),
        (FLOATS_64K[:8000], Scheme.BG4_LZ4),  # below the probe size: both tried in full
    ],
    ids=["random", "zeros", "text", "float32", "float32-small"],
)
def test_auto_scheme_choice(data: bytes, expected: Scheme) -> None:
    scheme, payload = compress_chunk(data)
    assert scheme is expected
    if expected is Scheme.NONE:
        assert payload == data
    else:
        assert len(payload) < len(data)
    assert decompress_chunk(scheme, payload, len(data)) == data


def test_auto_picks_the_smallest_encoding() -> None:
    for data in (FLOATS_64K, TEXT[:50000], ZEROS[:9000]):
        scheme, payload = compress_chunk(data)
        sizes = {s: len(compress_chunk(data, s)[1]) for s in Scheme}
        assert len(payload) == min(sizes.values())
        assert sizes[scheme] == len(payload)


def test_compress_chunks_probes_one_chunk_in_n_and_follows_it() -> None:
    # a run of float chunks, then random ones, then text: each probed chunk decides for
    # the chunks after it; every payload decodes and is never bigger than the raw chunk
    floats = [FLOATS_64K] * PROBE_EVERY
    randoms = [RANDOM_64K] * PROBE_EVERY
    texts = [TEXT[:60000]] * PROBE_EVERY
    chunks = floats + randoms + texts
    out = compress_chunks(chunks)
    assert [s for s, _ in out] == (
        [Scheme.BG4_LZ4] * PROBE_EVERY + [Scheme.NONE] * PROBE_EVERY + [Scheme.LZ4] * PROBE_EVERY
    )
    for data, (scheme, payload) in zip(chunks, out, strict=True):
        assert decompress_chunk(scheme, payload, len(data)) == data
        assert len(payload) <= len(data)


def test_compress_chunks_keeps_raw_what_the_decision_does_not_shrink() -> None:
    # the probed chunk compresses, the next is random: LZ4 would grow it, so it stays raw
    out = compress_chunks([TEXT[:60000], RANDOM_64K, ZEROS])
    assert [s for s, _ in out] == [Scheme.LZ4, Scheme.NONE, Scheme.LZ4]
    assert out[1][1] == RANDOM_64K
    # small chunks are always decided one by one (the probe is the whole chunk)
    small = compress_chunks([RANDOM_64K, FLOATS_64K[:8000]])
    assert [s for s, _ in small] == [Scheme.NONE, Scheme.BG4_LZ4]


def test_serialized_parts_are_the_body() -> None:
    sx = serialize_xorb([TEXT[:60000], RANDOM_64K, b"x"])
    assert b"".join(sx.parts) == sx.body
    assert sx.byte_offsets[-1] == len(sx.body)


def test_compressed_payload_is_an_lz4_frame() -> None:
    _, payload = compress_chunk(ZEROS, Scheme.LZ4)
    assert payload[:4] == b"\x04\x22\x4d\x18"


@pytest.mark.parametrize("scheme", list(Scheme))
@pytest.mark.parametrize(
    "data",
    [RANDOM_64K, ZEROS, TEXT[:70000], FLOATS_64K, b"x", b"abcde"],
    ids=["random", "zeros", "text", "float32", "1byte", "5bytes"],
)
def test_forced_scheme_round_trip(scheme: Scheme, data: bytes) -> None:
    used, payload = compress_chunk(data, scheme)
    assert used is scheme
    assert decompress_chunk(scheme, payload, len(data)) == data
    sx = serialize_xorb([data, data[::-1]], scheme=scheme)
    assert sx.schemes == [scheme, scheme]
    px = parse_xorb(sx.body)
    assert px.chunks == [data, data[::-1]]
    assert px.schemes == [scheme, scheme]
    assert serialize_xorb(px.chunks, scheme=scheme).body == sx.body


@pytest.mark.parametrize(
    "chunks",
    [
        [RANDOM_64K, RANDOM_64K[:1000]],
        [ZEROS, ZEROS[:8192], ZEROS[:5]],
        [FLOATS_64K, FLOATS_64K[:40001]],
        [TEXT[:50000], TEXT[1000:9000]],
        SMALL_CHUNKS,
    ],
    ids=["incompressible", "zeros", "float32", "text", "mixed"],
)
def test_serialize_parse_serialize_is_byte_identical(chunks: list[bytes]) -> None:
    sx = serialize_xorb(chunks)
    px = parse_xorb(sx.body)
    assert px.chunks == chunks
    assert px.hash == sx.hash == merkle_root([(chunk_hash(c), len(c)) for c in chunks])
    assert px.chunk_hashes == sx.chunk_hashes
    assert px.schemes == sx.schemes
    again = serialize_xorb(px.chunks, chunk_hashes=px.chunk_hashes)
    assert again.body == sx.body
    assert again.hash == sx.hash


def test_memoryview_and_bytearray_chunks() -> None:
    chunks = [memoryview(FLOATS_64K)[:9000], bytearray(TEXT[:5000]), RANDOM_64K[:100]]
    sx = serialize_xorb(chunks)
    assert sx.body == serialize_xorb([bytes(c) for c in chunks]).body
    assert parse_xorb(memoryview(sx.body)).chunks == [bytes(c) for c in chunks]


@pytest.mark.parametrize("n", range(10))
def test_bg4_split_layout_and_inverse(n: int) -> None:
    data = bytes(range(n))
    grouped = bg4_split(data)
    assert grouped == bytes(i for g in range(4) for i in range(g, n, 4))
    assert bg4_regroup(grouped) == data


def test_bg4_payload_groups_bytes() -> None:
    import lz4.frame

    _, payload = compress_chunk(b"abcdABCD1", Scheme.BG4_LZ4)
    assert lz4.frame.decompress(payload) == b"aA1bBcCdD"


# --------------------------------------------------------------------------- ranges & layout


def test_decode_chunks_on_every_range() -> None:
    sx = serialize_xorb(SMALL_CHUNKS)
    n = len(SMALL_CHUNKS)
    for a in range(n):
        for b in range(a + 1, n + 1):
            piece = sx.body[sx.byte_offsets[a] : sx.byte_offsets[b]]
            assert decode_chunks(piece, expected_count=b - a) == SMALL_CHUNKS[a:b]
    assert decode_chunks(b"") == []
    with pytest.raises(XorbFormatError, match="expected 3"):
        decode_chunks(sx.body[: sx.byte_offsets[2]], expected_count=3)


def test_chunk_boundaries_without_decoding() -> None:
    sx = serialize_xorb(SMALL_CHUNKS)
    byte_offsets, unpacked = chunk_boundaries(sx.body)
    assert byte_offsets == sx.byte_offsets
    ends = [sum(sx.chunk_sizes[: i + 1]) for i in range(len(SMALL_CHUNKS))]
    assert unpacked == [0, *ends]


def test_size_limits_helpers() -> None:
    assert serialized_size_bound(100, 3) == 124
    assert fits_in_xorb(MAX_XORB_BYTES - 8 * 1024, 1024)
    assert not fits_in_xorb(MAX_XORB_BYTES, 1)  # headers would push it over
    assert not fits_in_xorb(10, MAX_XORB_CHUNKS + 1)
    assert fits_in_xorb(MAX_XORB_CHUNKS, MAX_XORB_CHUNKS)


# --------------------------------------------------------------------------- footer


def test_footer_layout_single_chunk() -> None:
    sx = serialize_xorb([b"Hello World!"])
    footer = sx.footer()
    assert len(footer) == footer_size(1) == 92 + 40 + 4
    assert footer[:7] == b"XETBLOB" and footer[7] == 1 and footer[8:40] == sx.hash
    assert footer[40:48] == b"XBLBHSH\x00"
    assert footer[84:92] == b"XBLBBND\x01"
    # byte end, uncompressed end, num_chunks, hashes offset, boundary offset (from the end)
    assert struct.unpack_from("<5I", footer, 96) == (len(sx.body), 12, 1, 92, 48)
    assert footer[116:132] == bytes(16)
    assert struct.unpack_from("<I", footer, 132) == (132,)


def test_footer_round_trip_and_split() -> None:
    sx = serialize_xorb(SMALL_CHUNKS)
    stored = sx.body + sx.footer(buffer=b"\x01\x02\x03\x04" + bytes(12))
    body, footer = split_footer(stored)
    assert bytes(body) == sx.body
    assert footer is not None
    assert footer == parse_footer(stored)
    assert footer.xorb_hash == sx.hash
    assert footer.chunk_hashes == sx.chunk_hashes
    assert footer.byte_ends == sx.byte_offsets[1:]
    assert footer.buffer[:4] == b"\x01\x02\x03\x04"
    assert [footer.chunk_size(i) for i in range(4)] == sx.chunk_sizes
    assert footer.byte_range(1, 3) == (sx.byte_offsets[1], sx.byte_offsets[3])
    assert footer.byte_range(0, 4) == (0, len(sx.body))
    with pytest.raises(IndexError):
        footer.byte_range(2, 2)
    rebuilt = build_footer(
        footer.xorb_hash,
        footer.chunk_hashes,
        footer.byte_ends,
        footer.uncompressed_ends,
        footer.buffer,
    )
    assert sx.body + rebuilt == stored
    px = parse_xorb(stored)
    assert px.footer == footer and px.chunks == SMALL_CHUNKS
    assert split_footer(sx.body)[1] is None and parse_footer(sx.body) is None


def test_parse_footer_keeps_no_view_of_an_mmap(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import mmap

    sx = serialize_xorb(SMALL_CHUNKS)
    path = tmp_path / "x"
    path.write_bytes(sx.body + sx.footer())
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        footer = parse_footer(m)
    assert footer is not None and footer.num_chunks == 4


def test_inconsistent_footer_is_rejected() -> None:
    sx = serialize_xorb(SMALL_CHUNKS)
    other = serialize_xorb(SMALL_CHUNKS[:3])
    with pytest.raises(XorbFormatError):
        parse_xorb(sx.body + other.footer())  # footer for another (shorter) xorb
    f = parse_footer(sx.body + sx.footer())
    assert f is not None
    wrong_hash = build_footer(bytes(32), f.chunk_hashes, f.byte_ends, f.uncompressed_ends)
    with pytest.raises(XorbFormatError, match="names xorb"):
        parse_xorb(sx.body + wrong_hash)
    swapped = [f.chunk_hashes[1], f.chunk_hashes[0], *f.chunk_hashes[2:]]
    with pytest.raises(XorbFormatError, match="chunk hashes"):
        parse_xorb(sx.body + build_footer(f.xorb_hash, swapped, f.byte_ends, f.uncompressed_ends))
    bad_ends = [f.uncompressed_ends[0] + 1, *f.uncompressed_ends[1:]]
    with pytest.raises(XorbFormatError, match="uncompressed end"):
        parse_xorb(sx.body + build_footer(f.xorb_hash, f.chunk_hashes, f.byte_ends, bad_ends))


@pytest.mark.parametrize(
    ("offset", "value", "reason"),
    [
        (7, 0, "version 0"),  # legacy V0 footer
        (7, 2, "version 2"),
        (40, ord("Y"), "hash-section"),
        (47, 1, "hash-section"),
        (84, ord("Y"), "boundary-section"),
        (91, 0, "boundary-section"),
        (104, 2, "trailer counts"),
        (108, 0, "section offsets"),
    ],
)
def test_malformed_footer_is_rejected(offset: int, value: int, reason: str) -> None:
    sx = serialize_xorb([b"Hello World!"])
    footer = bytearray(sx.footer())
    footer[offset] = value
    with pytest.raises(XorbFormatError, match=reason):
        split_footer(sx.body + bytes(footer))
    with pytest.raises(XorbFormatError):
        parse_xorb(sx.body + bytes(footer))


def test_footer_with_absurd_count_is_rejected_before_reading() -> None:
    sx = serialize_xorb([b"Hello World!"])
    footer = bytearray(sx.footer())
    footer[48:52] = (0xFFFFFFFF).to_bytes(4, "little")
    with pytest.raises(XorbFormatError, match="chunk count"):
        split_footer(sx.body + bytes(footer))
    footer[48:52] = (2).to_bytes(4, "little")
    with pytest.raises(XorbFormatError, match="does not fit"):
        split_footer(sx.body + bytes(footer))


def test_build_footer_validates() -> None:
    with pytest.raises(ValueError):
        build_footer(bytes(32), [bytes(32)], [1, 2], [1])
    with pytest.raises(ValueError):
        build_footer(bytes(31), [bytes(32)], [9], [1])
    with pytest.raises(ValueError):
        build_footer(bytes(32), [bytes(32)], [2**32], [1])


# --------------------------------------------------------------------------- strictness


def test_truncation_at_every_offset_raises_the_typed_error() -> None:
    sx = serialize_xorb(SMALL_CHUNKS)
    boundaries = set(sx.byte_offsets)
    for i in range(len(sx.body)):
        piece = sx.body[:i]
        if i in boundaries and i > 0:
            # A prefix ending on a chunk boundary is a valid, shorter xorb.
            assert parse_xorb(piece).chunks == SMALL_CHUNKS[: sx.byte_offsets.index(i)]
            continue
        with pytest.raises(XorbFormatError):
            parse_xorb(piece)
        if i:
            with pytest.raises(XorbFormatError):
                decode_chunks(piece)


def test_truncating_a_stored_xorb_footer_raises() -> None:
    sx = serialize_xorb(SMALL_CHUNKS)
    stored = sx.body + sx.footer()
    for i in range(len(sx.body) + 1, len(stored)):
        with pytest.raises(XorbFormatError):
            parse_xorb(stored[:i])


def _corrupt(body: bytes, offset: int, value: bytes) -> bytes:
    return body[:offset] + value + body[offset + len(value) :]


def test_corrupt_header_fields_raise() -> None:
    sx = serialize_xorb([TEXT[:5000], b"Hello World!"])
    body = sx.body
    second = sx.byte_offsets[1]
    cases = {
        "version": _corrupt(body, 0, b"\x01"),
        "scheme": _corrupt(body, 4, b"\x07"),
        "uncompressed length too big": _corrupt(
            body, 5, (MAX_CHUNK_BYTES + 1).to_bytes(3, "little")
        ),
        "zero length": _corrupt(body, 5, b"\x00\x00\x00"),
        "payload too big": _corrupt(body, 1, (MAX_PAYLOAD_BYTES + 1).to_bytes(3, "little")),
        "lengths differ for NONE": _corrupt(body, second + 5, (13).to_bytes(3, "little")),
        "LZ4 decodes short": _corrupt(body, 5, (5001).to_bytes(3, "little")),
        "LZ4 decodes long": _corrupt(body, 5, (4999).to_bytes(3, "little")),
        "bad LZ4 magic": _corrupt(body, 8, b"\x05"),
        "NONE declared as LZ4": _corrupt(body, second + 4, b"\x01"),
        "footer ident mid-body": _corrupt(body, second, b"XETBLOB\x01"),
    }
    for name, bad in cases.items():
        with pytest.raises(XorbFormatError):
            parse_xorb(bad)
        assert name  # keeps the case name visible in a failing traceback


def test_lz4_frame_with_trailing_bytes_or_missing_end_mark() -> None:
    _, frame = compress_chunk(TEXT[:5000], Scheme.LZ4)
    with pytest.raises(XorbFormatError, match="after the LZ4 frame"):
        decompress_chunk(Scheme.LZ4, frame + b"\x00", 5000)
    with pytest.raises(XorbFormatError, match="truncated"):
        decompress_chunk(Scheme.LZ4, frame[:-4], 5000)
    with pytest.raises(XorbFormatError, match="more than"):
        decompress_chunk(Scheme.LZ4, frame, 10)


def test_decompress_chunk_limits() -> None:
    with pytest.raises(XorbFormatError, match="scheme"):
        decompress_chunk(9, b"abc", 3)
    with pytest.raises(XorbFormatError, match="uncompressed length"):
        decompress_chunk(Scheme.NONE, b"", 0)
    with pytest.raises(XorbFormatError, match="uncompressed length"):
        decompress_chunk(Scheme.NONE, b"a", MAX_CHUNK_BYTES + 1)
    with pytest.raises(XorbFormatError, match="payload length"):
        decompress_chunk(Scheme.LZ4, bytes(MAX_PAYLOAD_BYTES + 1), 100)
    with pytest.raises(XorbFormatError):
        decompress_chunk(Scheme.NONE, b"ab", 3)


def test_empty_xorb_is_rejected() -> None:
    with pytest.raises(XorbFormatError, match="no chunks"):
        parse_xorb(b"")
    with pytest.raises(ValueError):
        serialize_xorb([])


def test_serialize_validates_inputs() -> None:
    with pytest.raises(ValueError):
        compress_chunk(b"")
    with pytest.raises(ValueError):
        compress_chunk(bytes(MAX_CHUNK_BYTES + 1))
    with pytest.raises(ValueError, match="chunk hashes"):
        serialize_xorb([b"a", b"b"], chunk_hashes=[bytes(32)])
    with pytest.raises(ValueError, match="32 raw bytes"):
        serialize_xorb([b"a"], chunk_hashes=[bytes(31)])
    with pytest.raises(ValueError, match="chunk limit"):
        serialize_xorb([b"a"] * (MAX_XORB_CHUNKS + 1))


def test_too_many_chunks_in_a_body_is_rejected() -> None:
    record = _header(1, 0, 1) + b"x"
    assert len(parse_xorb(record * MAX_XORB_CHUNKS).chunks) == MAX_XORB_CHUNKS
    with pytest.raises(XorbFormatError, match="more than"):
        parse_xorb(record * (MAX_XORB_CHUNKS + 1))


def test_verify_xorb() -> None:
    sx = serialize_xorb(SMALL_CHUNKS)
    assert verify_xorb(sx.body, sx.hash).chunks == SMALL_CHUNKS
    lean = verify_xorb(sx.body, sx.hash, keep_chunks=False)  # (each chunk dropped once hashed)
    assert lean.chunks == [] and lean.chunk_hashes == sx.chunk_hashes
    assert lean.chunk_sizes == [len(c) for c in SMALL_CHUNKS]
    with pytest.raises(IntegrityError) as e:
        verify_xorb(sx.body, bytes(32))
    assert e.value.kind == "xorb" and e.value.name == "0" * 64
    with pytest.raises(XorbFormatError) as fe:
        verify_xorb(sx.body[:-1], sx.hash)
    assert to_hex(sx.hash) in fe.value.what


# --------------------------------------------------------------------------- properties

_chunk = st.one_of(
    st.binary(min_size=1, max_size=3000),
    st.builds(lambda b, n: (b * n)[:4000], st.binary(min_size=1, max_size=9), st.integers(1, 900)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_chunk, min_size=1, max_size=6))
def test_round_trip_property(chunks: list[bytes]) -> None:
    sx = serialize_xorb(chunks)
    px = parse_xorb(sx.body)
    assert px.chunks == chunks
    assert px.hash == sx.hash == merkle_root([(chunk_hash(c), len(c)) for c in chunks])
    assert serialize_xorb(px.chunks).body == sx.body
    assert parse_xorb(sx.body + sx.footer()).chunks == chunks
    assert len(sx.body) <= serialized_size_bound(sum(map(len, chunks)), len(chunks))
    assert sx.byte_offsets[-1] == len(sx.body)
    assert all(b - a > CHUNK_HEADER_SIZE for a, b in itertools.pairwise(sx.byte_offsets))


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=64))
def test_bg4_inverse_property(data: bytes) -> None:
    assert bg4_regroup(bg4_split(data)) == data
