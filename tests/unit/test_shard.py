"""Shard format: golden vectors, both forms' round trips, strict rejection."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gitxet.chunking import chunk_bytes
from gitxet.errors import ShardFormatError
from gitxet.formats.shard import (
    CHUNK_FLAG_GLOBAL_DEDUP,
    FILE_FLAG_METADATA_EXT,
    FILE_FLAG_VERIFICATION,
    FOOTER_SIZE,
    HEADER_TAG,
    NEVER_EXPIRES,
    FileInfo,
    FileTerm,
    Shard,
    XorbChunk,
    XorbInfo,
    collect_upload_shard,
    dedup_response_shard,
    make_file_info,
    parse_shard,
    protect_xorbs,
    serialize_shard,
    serialize_stored_shard,
    sha256_from_stored,
    sha256_to_stored,
    shard_size,
    split_shard,
    upload_shard_for,
    upload_shards_for,
)
from gitxet.formats.xorb import serialize_xorb
from gitxet.hashing import (
    ZERO_HASH,
    chunk_hash,
    file_hash,
    protected_chunk_hash,
    sort_key,
    to_hex,
    truncated,
    verification_hash,
)
from tests.vectors import THREE_MIB, THREE_MIB_VERIFICATION, THREE_MIB_XORB

SHA_EMPTY = hashlib.sha256(b"").hexdigest()
KEY = bytes(range(1, 33))


def _h(i: int) -> bytes:
    """A distinct, deterministic 32-byte hash."""
    return hashlib.sha256(i.to_bytes(4, "little")).digest()


def _file(i: int, xorb: XorbInfo, start: int = 0, end: int | None = None) -> FileInfo:
    end = len(xorb.chunks) if end is None else end
    chunks = xorb.chunks[start:end]
    term = FileTerm(xorb.xorb_hash, start, end, sum(c.size for c in chunks))
    return make_file_info(_h(1000 + i), [term], [[c.hash for c in chunks]], SHA_EMPTY)


def _xorb(i: int, sizes: list[int]) -> XorbInfo:
    return XorbInfo.from_chunks(_h(i), [_h(100 * i + k) for k in range(len(sizes))], sizes)


@pytest.fixture(scope="module")
def three_mib_shard() -> tuple[Shard, bytes]:
    chunks = chunk_bytes(THREE_MIB)
    sx = serialize_xorb(chunks)
    fh = file_hash(list(zip(sx.chunk_hashes, sx.chunk_sizes, strict=True)))
    term = FileTerm(sx.hash, 0, len(chunks), len(THREE_MIB))
    info = make_file_info(fh, [term], [sx.chunk_hashes], hashlib.sha256(THREE_MIB).hexdigest())
    xorb = XorbInfo.from_chunks(sx.hash, sx.chunk_hashes, sx.chunk_sizes)
    shard = collect_upload_shard([info], [xorb])
    return shard, serialize_shard(shard)


@pytest.fixture()
def small_shard() -> Shard:
    x1 = _xorb(1, [100, 2000, 3])
    x2 = _xorb(2, [131072])
    files = [
        _file(1, x1),
        _file(2, x1, 1, 3),
        _file(3, x2),
        make_file_info(ZERO_HASH, [], [], SHA_EMPTY),
    ]
    return collect_upload_shard(files, [x1, x2])


# --------------------------------------------------------------------------- golden vectors


def test_three_mib_upload_shard_vector(three_mib_shard: tuple[Shard, bytes]) -> None:
    shard, data = three_mib_shard
    assert len(data) == 2880
    assert data[:32] == HEADER_TAG
    assert struct.unpack_from("<QQ", data, 32) == (2, 0)
    (info,) = shard.files
    assert info.verification is not None
    assert to_hex(info.verification[0]) == THREE_MIB_VERIFICATION
    assert to_hex(shard.xorbs[0].xorb_hash) == THREE_MIB_XORB
    assert info.sha256_hex == hashlib.sha256(THREE_MIB).hexdigest()
    # file header: flags 0xC0000000, one entry
    assert struct.unpack_from("<II", data, 48 + 32) == (0xC000_0000, 1)
    # the single term, then the CAS header counting 52 chunks of 3 MiB, on_disk 0
    assert struct.unpack_from("<IIII", data, 96 + 32) == (0, len(THREE_MIB), 0, 52)
    assert struct.unpack_from("<IIII", data, 288 + 32) == (0, 52, len(THREE_MIB), 0)
    assert data[-48:] == b"\xff" * 32 + bytes(16)
    parsed = parse_shard(data)
    assert parsed == shard
    assert serialize_shard(parsed) == data


def test_hello_world_sha256_stored_bytes() -> None:
    digest = hashlib.sha256(b"Hello World!").hexdigest()
    assert digest.startswith("7f83b165") and digest.endswith("9069")
    stored = sha256_to_stored(digest)
    assert stored.hex() == "53fcf17f65b1837f5dd6a14881c12db92877d6a31f4b2dfc69906d1200d2dd4a"
    assert sha256_from_stored(stored) == digest
    info = make_file_info(_h(1), [FileTerm(_h(2), 0, 1, 12)], [[_h(3)]], digest)
    assert info.sha256 == stored and info.sha256_hex == digest


def test_empty_file_quirk() -> None:
    info = make_file_info(ZERO_HASH, [], [], SHA_EMPTY)
    assert info.flags == 0xC000_0000
    assert info.sha256 == ZERO_HASH  # not sha256(""): hf_xet writes zeros
    data = serialize_shard(collect_upload_shard([info], []))
    assert data[48:96] == ZERO_HASH + struct.pack("<IIQ", 0xC000_0000, 0, 0)
    assert data[96:144] == bytes(48)
    assert len(data) == 48 + 48 * 4
    assert parse_shard(data).files == [info]


def test_make_file_info_verification_entries() -> None:
    hashes = [_h(k) for k in range(5)]
    terms = [FileTerm(_h(50), 0, 2, 10), FileTerm(_h(51), 4, 7, 30)]
    info = make_file_info(_h(9), terms, [hashes[:2], hashes[2:]], None)
    assert info.verification == [verification_hash(hashes[:2]), verification_hash(hashes[2:])]
    assert info.sha256 is None and info.flags == FILE_FLAG_VERIFICATION
    assert info.size == 40
    with pytest.raises(ValueError):
        make_file_info(_h(9), terms, [hashes[:2]], None)
    with pytest.raises(ValueError):
        make_file_info(_h(9), terms, [hashes[:3], hashes[3:]], None)
    with pytest.raises(ValueError):
        make_file_info(_h(9), [], [], None)  # an empty file's hash is zero


def test_from_chunks_offsets() -> None:
    x = XorbInfo.from_chunks(
        _h(1), [_h(2), _h(3), _h(4)], [5, 7, 9], 33, [0, CHUNK_FLAG_GLOBAL_DEDUP, 0]
    )
    assert [c.byte_start for c in x.chunks] == [0, 5, 12]
    assert x.bytes_in_xorb == 21 and x.bytes_on_disk == 33
    assert x.chunks[1].flags == CHUNK_FLAG_GLOBAL_DEDUP
    with pytest.raises(ValueError):
        XorbInfo.from_chunks(_h(1), [_h(2)], [5, 6])


# --------------------------------------------------------------------------- upload form


def test_upload_shard_sorts_and_collapses() -> None:
    x1, x2, x3 = _xorb(1, [10]), _xorb(2, [20]), _xorb(3, [30])
    f1, f2, f3 = _file(1, x1), _file(2, x2), _file(3, x3)
    dup = FileInfo(f2.file_hash, [FileTerm(x3.xorb_hash, 0, 1, 30)], None, None)
    shard = collect_upload_shard([f3, f2, f1, dup], [x3, x1, x2, x1])
    assert [f.file_hash for f in shard.files] == sorted(
        (f.file_hash for f in (f1, f2, f3)), key=sort_key
    )
    assert next(f for f in shard.files if f.file_hash == f2.file_hash) == f2  # first wins
    assert [x.xorb_hash for x in shard.xorbs] == sorted(
        (x1.xorb_hash, x2.xorb_hash, x3.xorb_hash), key=sort_key
    )
    data = upload_shard_for([f3, f2, f1, dup], [x3, x1, x2, x1])
    assert data == serialize_shard(shard)
    assert upload_shards_for([f3, f2, f1, dup], [x3, x1, x2, x1]) == [data]


def test_xet_sort_order_is_not_byte_order() -> None:
    # Word-tuple order compares each 8-byte word as a little-endian integer.
    a = bytes([2]) + bytes(31)  # word 0 == 2
    b = bytes([1, 1]) + bytes(30)  # word 0 == 257
    assert a > b and sort_key(a) < sort_key(b)
    fa = FileInfo(a, [FileTerm(_h(1), 0, 1, 1)])
    fb = FileInfo(b, [FileTerm(_h(1), 0, 1, 1)])
    assert [f.file_hash for f in collect_upload_shard([fb, fa], []).files] == [a, b]


def test_upload_round_trip(small_shard: Shard) -> None:
    data = serialize_shard(small_shard)
    assert len(data) == shard_size(small_shard)
    parsed = parse_shard(data)
    assert parsed == small_shard and parsed.footer is None
    assert serialize_shard(parsed) == data


def test_split_shard(small_shard: Shard) -> None:
    limit = 48 + 2 * 48 + 48 * 5
    parts = split_shard(small_shard, limit)
    assert len(parts) > 1
    assert all(len(serialize_shard(p)) <= limit for p in parts)
    assert [f for p in parts for f in p.files] == small_shard.files
    assert [x for p in parts for x in p.xorbs] == small_shard.xorbs
    assert split_shard(small_shard) == [small_shard]
    assert split_shard(Shard()) == [Shard()]
    with pytest.raises(ValueError):
        split_shard(small_shard, 48 + 2 * 48 + 48)  # the 2-record xorb block cannot fit
    datas = upload_shards_for(small_shard.files, small_shard.xorbs, limit)
    assert [parse_shard(d) for d in datas] == parts


# --------------------------------------------------------------------------- stored form


def test_stored_round_trip_and_tables(small_shard: Shard) -> None:
    data = serialize_stored_shard(small_shard, created=1_700_000_000)
    assert len(data) == shard_size(small_shard, stored=True)
    assert struct.unpack_from("<QQ", data, 32) == (2, FOOTER_SIZE)
    parsed = parse_shard(data)
    assert parsed.files == small_shard.files and parsed.xorbs == small_shard.xorbs
    f = parsed.footer
    assert f is not None
    assert (f.shard_creation_timestamp, f.shard_key_expiry) == (1_700_000_000, NEVER_EXPIRES)
    assert f.chunk_hash_hmac_key == ZERO_HASH and not f.protected
    assert f.file_info_offset == 48 and f.footer_offset == len(data) - FOOTER_SIZE
    assert f.file_lookup_num_entries == 4 and f.xorb_lookup_num_entries == 2
    assert f.chunk_lookup_num_entries == 4
    assert f.materialized_bytes == sum(fi.size for fi in small_shard.files)
    assert f.stored_bytes == 2103 + 131072 and f.stored_bytes_on_disk == 0
    # tables are sorted by truncated hash
    table = data[f.chunk_lookup_offset : f.footer_offset]
    keys = [k for k, _, _ in struct.iter_unpack("<QII", table)]
    assert keys == sorted(keys)
    expected = sorted(truncated(c.hash) for x in small_shard.xorbs for c in x.chunks)
    assert keys == expected
    # serialize(parse(b)) == b, taking key and times from the parsed footer
    assert serialize_stored_shard(parsed) == data
    assert serialize_shard(parsed) == serialize_shard(small_shard)


def test_keyed_dedup_response_shard() -> None:
    x = _xorb(7, [1000, 2000, 3000])
    data = dedup_response_shard([x], KEY, created=100, expiry=200)
    parsed = parse_shard(data)
    assert parsed.files == []
    assert parsed.footer is not None and parsed.footer.protected
    assert parsed.footer.chunk_hash_hmac_key == KEY
    assert (parsed.footer.shard_creation_timestamp, parsed.footer.shard_key_expiry) == (100, 200)
    (px,) = parsed.xorbs
    assert [c.hash for c in px.chunks] == [protected_chunk_hash(KEY, c.hash) for c in x.chunks]
    assert [c.byte_start for c in px.chunks] == [0, 1000, 3000]
    f = parsed.footer
    keys = [
        k for k, _, _ in struct.iter_unpack("<QII", data[f.chunk_lookup_offset : f.footer_offset])
    ]
    assert sorted(keys) == keys == sorted(truncated(c.hash) for c in px.chunks)
    assert serialize_stored_shard(parsed) == data  # hashes stay as stored: no double keying
    assert protect_xorbs([x], ZERO_HASH) == [x]


def test_stored_shard_with_empty_sections() -> None:
    data = serialize_stored_shard(Shard(), created=0)
    assert len(data) == 48 + 96 + 200
    parsed = parse_shard(data)
    assert parsed.files == [] and parsed.xorbs == []
    assert serialize_stored_shard(parsed) == data


# --------------------------------------------------------------------------- strictness


def test_every_truncation_raises_the_typed_error(small_shard: Shard) -> None:
    for data in (serialize_shard(small_shard), serialize_stored_shard(small_shard, created=5)):
        for i in range(len(data)):
            with pytest.raises(ShardFormatError):
                parse_shard(data[:i])


def _patch(data: bytes, offset: int, fmt: str, *values: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, *values)
    return bytes(out)


def test_corrupt_upload_fields_raise() -> None:
    x = _xorb(1, [100, 200])
    info = _file(1, x)
    data = serialize_shard(collect_upload_shard([info], [x]))
    file_hdr = 48
    term = 96
    ver = 144
    ext = 192
    file_bookend = 240
    xorb_hdr = 288
    chunk0 = 336
    cases = {
        "magic": (_patch(data, 0, "<B", ord("X")), "magic"),
        "version": (_patch(data, 32, "<Q", 3), "version 3"),
        "footer size": (_patch(data, 40, "<Q", 100), "footer_size 100"),
        "unknown file flag": (_patch(data, file_hdr + 32, "<I", 0xC000_0001), "unknown flags"),
        "file reserved": (_patch(data, file_hdr + 40, "<Q", 1), "reserved header"),
        "huge entry count": (_patch(data, file_hdr + 36, "<I", 0xFFFF_FFFF), "declares 4294967295"),
        "one extra entry": (_patch(data, file_hdr + 36, "<I", 2), "term 1"),
        "term xorb flags": (_patch(data, term + 32, "<I", 1), "xorb flags"),
        "term zero bytes": (_patch(data, term + 36, "<I", 0), "zero unpacked"),
        "term empty range": (_patch(data, term + 40, "<II", 2, 2), "empty chunk range"),
        "verification padding": (_patch(data, ver + 40, "<B", 1), "verification entry"),
        "ext padding": (_patch(data, ext + 47, "<B", 1), "metadata extension"),
        "file bookend tail": (_patch(data, file_bookend + 40, "<B", 1), "bookend"),
        "xorb flags": (_patch(data, xorb_hdr + 32, "<I", 4), "xorb flags"),
        "zero chunks": (_patch(data, xorb_hdr + 36, "<I", 0), "chunk count 0"),
        "huge chunk count": (
            _patch(data, xorb_hdr + 36, "<I", 0xFFFF_FFFF),
            "chunk count 4294967295",
        ),
        "chunk reserved": (_patch(data, chunk0 + 44, "<I", 1), "reserved field"),
        "chunk flag": (_patch(data, chunk0 + 40, "<I", 1), "unknown flags"),
        "chunk size zero": (_patch(data, chunk0 + 36, "<I", 0), "size 0"),
        "chunk size too big": (_patch(data, chunk0 + 36, "<I", 131073), "size 131073"),
        "chunks overlap": (_patch(data, chunk0 + 48 + 32, "<I", 50), "inside the previous"),
        "chunks past xorb": (_patch(data, xorb_hdr + 40, "<I", 299), "past the xorb"),
        "cas bookend tail": (_patch(data, len(data) - 1, "<B", 1), "bookend"),
        "trailing bytes": (data + bytes(48), "after the CAS section"),
    }
    for name, (bad, reason) in cases.items():
        with pytest.raises(ShardFormatError, match=reason):
            parse_shard(bad)
        assert name


def test_corrupt_stored_fields_raise() -> None:
    x = _xorb(1, [100, 200])
    data = serialize_stored_shard(
        collect_upload_shard([_file(1, x), _file(2, x, 1)], [x]), created=1
    )
    foot = len(data) - FOOTER_SIZE
    f = parse_shard(data).footer
    assert f is not None
    cases = {
        "footer version": (_patch(data, foot, "<Q", 2), "version 2"),
        "file_info_offset": (_patch(data, foot + 8, "<Q", 96), "section offsets"),
        "cas_info_offset": (_patch(data, foot + 16, "<Q", 48), "section offsets"),
        "file lookup offset": (
            _patch(data, foot + 24, "<Q", f.file_lookup_offset + 12),
            "lookup table offsets",
        ),
        "file lookup count": (_patch(data, foot + 32, "<Q", 2**63), "lookup table offsets"),
        "chunk lookup count": (_patch(data, foot + 64, "<Q", 1), "lookup table offsets"),
        "reserved": (_patch(data, foot + 120, "<B", 1), "reserved bytes"),
        "footer_offset": (_patch(data, foot + 192, "<Q", 0), "footer_offset 0"),
        "file key wrong": (_patch(data, f.file_lookup_offset, "<Q", 12345), "key does not match"),
        "file index not a header": (
            _patch(data, f.file_lookup_offset + 8, "<I", 1),
            "not a file header",
        ),
        "xorb index not a header": (
            _patch(data, f.xorb_lookup_offset + 8, "<I", 1),
            "not a xorb header",
        ),
        "chunk index out of range": (
            _patch(data, f.chunk_lookup_offset + 12, "<I", 2),
            "not a chunk",
        ),
        "unsorted chunk table": (_swap16(data, f.chunk_lookup_offset), "out of order"),
        "footer size zero": (_patch(data, 40, "<Q", 0), "after the CAS section"),
    }
    for name, (bad, reason) in cases.items():
        with pytest.raises(ShardFormatError, match=reason):
            parse_shard(bad)
        assert name


def _swap16(data: bytes, offset: int) -> bytes:
    a, b = data[offset : offset + 16], data[offset + 16 : offset + 32]
    assert a != b
    return data[:offset] + b + a + data[offset + 32 :]


def test_serializer_rejects_bad_objects() -> None:
    good = _xorb(1, [10])
    with pytest.raises(ValueError):
        serialize_shard(Shard([FileInfo(bytes(31), [])], []))
    with pytest.raises(ValueError):
        serialize_shard(Shard([FileInfo(b"\xff" * 32, [])], []))
    with pytest.raises(ValueError):
        serialize_shard(Shard([FileInfo(_h(1), [FileTerm(_h(2), 0, 1, 1)], [])], []))
    with pytest.raises(ValueError):
        serialize_shard(Shard([FileInfo(_h(1), [FileTerm(_h(2), 0, 1, 2**32)])], []))
    with pytest.raises(ValueError):
        serialize_shard(Shard([], [XorbInfo(_h(1), [XorbChunk(bytes(5), 0, 1)], 1)]))
    with pytest.raises(ValueError):
        serialize_stored_shard(Shard([], [good]), hmac_key=bytes(3))


# --------------------------------------------------------------------------- properties

_hash = st.binary(min_size=32, max_size=32).filter(lambda h: h != b"\xff" * 32)


@st.composite
def _xorbs(draw: st.DrawFn) -> XorbInfo:
    sizes = draw(st.lists(st.integers(1, 131072), min_size=1, max_size=5))
    hashes = draw(st.lists(_hash, min_size=len(sizes), max_size=len(sizes)))
    flags = draw(
        st.lists(
            st.sampled_from([0, CHUNK_FLAG_GLOBAL_DEDUP]), min_size=len(sizes), max_size=len(sizes)
        )
    )
    return XorbInfo.from_chunks(draw(_hash), hashes, sizes, draw(st.integers(0, 2**32 - 1)), flags)


@st.composite
def _files(draw: st.DrawFn) -> FileInfo:
    n = draw(st.integers(0, 4))
    terms = []
    for _ in range(n):
        start = draw(st.integers(0, 100))
        terms.append(
            FileTerm(
                draw(_hash),
                start,
                start + draw(st.integers(1, 10)),
                draw(st.integers(1, 2**32 - 1)),
            )
        )
    verification = draw(st.one_of(st.none(), st.lists(_hash, min_size=n, max_size=n)))
    sha = draw(st.one_of(st.none(), _hash))
    return FileInfo(draw(_hash), terms, verification, sha)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_files(), max_size=4), st.lists(_xorbs(), max_size=3), _hash, st.integers(0, 2**64 - 1)
)
def test_round_trip_property(
    files: list[FileInfo], xorbs: list[XorbInfo], key: bytes, t: int
) -> None:
    shard = Shard(files, xorbs)
    upload = serialize_shard(shard)
    assert parse_shard(upload) == shard
    assert serialize_shard(parse_shard(upload)) == upload
    stored = serialize_stored_shard(shard, hmac_key=key, created=t, expiry=t)
    parsed = parse_shard(stored)
    assert (parsed.files, parsed.xorbs) == (files, xorbs)
    assert parsed.footer is not None and parsed.footer.chunk_hash_hmac_key == key
    assert serialize_stored_shard(parsed) == stored
    assert len(stored) == shard_size(shard, stored=True)


def test_flags_constants() -> None:
    assert FILE_FLAG_VERIFICATION | FILE_FLAG_METADATA_EXT == 0xC000_0000
    assert chunk_hash(b"Hello World!") != ZERO_HASH
