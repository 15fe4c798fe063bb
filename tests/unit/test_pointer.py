"""Pointer format: canonical round trip and strict rejection (docs/internals/pointer.md)."""

from __future__ import annotations

import hashlib

import pytest

from gitxet.errors import FormatError, PointerFormatError
from gitxet.formats.pointer import (
    MAX_POINTER_SIZE,
    MAX_SIZE_VALUE,
    MIN_POINTER_SIZE,
    POINTER_SIZES,
    VERSION_LINE,
    Pointer,
    looks_like_pointer,
)

SHA_HELLO = hashlib.sha256(b"hello\n").hexdigest()
XET = "d8d408e608fb9ca213b9909a65d86d725f2de4d8d540324be8a363e7a6e228cb"
SHA_EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

# Golden vectors: these exact bytes are the format. Never edit them to make a test pass.
GOLDEN = [
    (
        b"version https://gitxet.dev/spec/v1\n"
        b"oid sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03\n"
        b"size 6\n"
        b"xet-hash d8d408e608fb9ca213b9909a65d86d725f2de4d8d540324be8a363e7a6e228cb\n",
        Pointer(SHA_HELLO, 6, XET),
    ),
    (
        b"version https://gitxet.dev/spec/v1\n"
        b"oid sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
        b"size 0\n"
        b"xet-hash 0000000000000000000000000000000000000000000000000000000000000000\n",
        Pointer(SHA_EMPTY, 0, "0" * 64),
    ),
    (
        b"version https://gitxet.dev/spec/v1\n"
        b"oid sha256:" + b"f" * 64 + b"\n"
        b"size 9223372036854775807\n"
        b"xet-hash " + b"a" * 64 + b"\n",
        Pointer("f" * 64, MAX_SIZE_VALUE, "a" * 64),
    ),
]

VALID = GOLDEN[0][0]


@pytest.mark.parametrize(("data", "pointer"), GOLDEN)
def test_golden_vectors_round_trip(data: bytes, pointer: Pointer) -> None:
    assert Pointer.decode(data) == pointer
    assert pointer.encode() == data
    assert Pointer.decode(data).encode() == data
    assert looks_like_pointer(data)
    assert len(data) <= MAX_POINTER_SIZE


def test_sha256_of_golden_content() -> None:
    assert SHA_HELLO == "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"


def _swap(old: bytes, new: bytes) -> bytes:
    assert old in VALID
    return VALID.replace(old, new, 1)


BAD = {
    "empty": (b"", "empty"),
    "crlf": (VALID.replace(b"\n", b"\r\n"), "CR"),
    "cr at end only": (VALID[:-1] + b"\r\n", "CR"),
    "no final lf": (VALID[:-1], "does not end with LF"),
    "trailing data": (VALID + b"extra\n", "unexpected data after the last key"),
    "trailing blank line": (VALID + b"\n", "unexpected data after the last key"),
    "trailing bytes no lf": (VALID + b"x", "does not end with LF"),
    "other version": (
        _swap(b"spec/v1", b"spec/v2"),
        "unsupported version",
    ),
    "lfs version": (
        _swap(b"https://gitxet.dev/spec/v1", b"https://git-lfs.github.com/spec/v1"),
        "unsupported version",
    ),
    "no version": (VALID[len(VERSION_LINE) :], "line 1"),
    "leading space": (b" " + VALID, "line 1"),
    "double space after key": (_swap(b"size 6", b"size  6"), "size must be decimal"),
    "tab separator": (_swap(b"size 6", b"size\t6"), "no space"),
    "trailing space": (_swap(b"size 6\n", b"size 6 \n"), "size must be decimal"),
    "trailing space on hash": (_swap(XET.encode() + b"\n", XET.encode() + b" \n"), "xet-hash"),
    "empty line inside": (_swap(b"size 6\n", b"\nsize 6\n"), "empty line"),
    "reordered keys": (
        _swap(
            b"size 6\nxet-hash " + XET.encode(),
            b"xet-hash " + XET.encode() + b"\nsize 6",
        ),
        "out of order",
    ),
    "oid after size": (
        b"version https://gitxet.dev/spec/v1\nsize 6\noid sha256:"
        + SHA_HELLO.encode()
        + b"\nxet-hash "
        + XET.encode()
        + b"\n",
        "out of order",
    ),
    "duplicate key": (_swap(b"size 6\n", b"size 6\nsize 6\n"), "duplicate key"),
    "unknown key": (_swap(b"size 6\n", b"size 6\next 1\n"), "unknown key"),
    "missing xet-hash": (VALID[: VALID.index(b"xet-hash")], "missing key 'xet-hash'"),
    "missing size": (_swap(b"size 6\n", b""), "out of order"),
    "only version": (VERSION_LINE, "missing key 'oid'"),
    "uppercase oid hex": (_swap(SHA_HELLO.encode(), SHA_HELLO.upper().encode()), "oid"),
    "uppercase xet hex": (_swap(XET.encode(), XET.upper().encode()), "xet-hash"),
    "short oid": (_swap(SHA_HELLO.encode(), SHA_HELLO[:-1].encode()), "oid"),
    "long xet": (_swap(XET.encode(), XET.encode() + b"0"), "xet-hash"),
    "oid without algo": (_swap(b"sha256:", b""), "oid"),
    "oid other algo": (_swap(b"sha256:", b"sha512:"), "oid"),
    "leading zero size": (_swap(b"size 6", b"size 06"), "leading zeros"),
    "double zero": (_swap(b"size 6", b"size 00"), "leading zeros"),
    "plus sign": (_swap(b"size 6", b"size +6"), "size"),
    "negative": (_swap(b"size 6", b"size -6"), "size"),
    "hex size": (_swap(b"size 6", b"size 0x6"), "size"),
    "unicode digit": (_swap(b"size 6", "size \u0666".encode()), "non-ASCII"),
    "size too big": (_swap(b"size 6", b"size 9223372036854775808"), "exceeds"),
    "size 20 digits": (_swap(b"size 6", b"size 10000000000000000000"), "size"),
    "too long": (VALID + b"#" * MAX_POINTER_SIZE, "too long"),
    "key uppercase": (_swap(b"size 6", b"Size 6"), "unknown key"),
    "nul byte": (_swap(b"size 6", b"size 6\x00"), "size"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_non_canonical_input_is_rejected(name: str) -> None:
    data, reason = BAD[name]
    with pytest.raises(PointerFormatError) as info:
        Pointer.decode(data)
    assert reason in info.value.reason
    assert info.value.what == "pointer"
    assert isinstance(info.value, FormatError)


def test_every_single_byte_mutation_is_rejected_or_canonical() -> None:
    # Flipping any byte must never yield a pointer whose encoding differs from the input.
    for i in range(len(VALID)):
        for repl in (b" ", b"\n", b"0", b"A", b"\r"):
            data = VALID[:i] + repl + VALID[i + 1 :]
            try:
                p = Pointer.decode(data)
            except PointerFormatError:
                continue
            assert p.encode() == data


def test_deleting_any_byte_is_rejected() -> None:
    for i in range(len(VALID)):
        data = VALID[:i] + VALID[i + 1 :]
        with pytest.raises(PointerFormatError):
            Pointer.decode(data)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"sha256": SHA_HELLO.upper()}, "sha256"),
        ({"sha256": "abc"}, "sha256"),
        ({"size": -1}, "outside"),
        ({"size": MAX_SIZE_VALUE + 1}, "outside"),
        ({"size": True}, "int"),
        ({"size": 6.0}, "int"),
        ({"xet_hash": "g" * 64}, "xet-hash"),
    ],
)
def test_constructor_validates_fields(kwargs: dict[str, object], reason: str) -> None:
    fields: dict[str, object] = {"sha256": SHA_HELLO, "size": 6, "xet_hash": XET}
    fields.update(kwargs)
    with pytest.raises(PointerFormatError, match=reason):
        Pointer(**fields)  # type: ignore[arg-type]


def test_pointer_is_frozen_and_hashable() -> None:
    p = Pointer(SHA_HELLO, 6, XET)
    with pytest.raises(AttributeError):
        p.size = 7  # type: ignore[misc]
    assert {p: 1}[Pointer(SHA_HELLO, 6, XET)] == 1


def test_looks_like_pointer() -> None:
    assert looks_like_pointer(VERSION_LINE)
    assert looks_like_pointer(VALID[:100])
    assert not looks_like_pointer(VERSION_LINE[:-1])  # too short to tell: not a pointer yet
    assert not looks_like_pointer(b"")
    assert not looks_like_pointer(b"\x89PNG\r\n")
    assert not looks_like_pointer(b"version https://git-lfs.github.com/spec/v1\n")
    assert not looks_like_pointer(VERSION_LINE[:-1] + b"\r\n")


def test_pointer_sizes_are_every_length_a_valid_pointer_can_have() -> None:
    lengths = {len(Pointer(SHA_HELLO, 10**d - 1, XET).encode()) for d in range(1, 19)}
    lengths.add(len(Pointer(SHA_HELLO, MAX_SIZE_VALUE, XET).encode()))
    assert sorted(lengths) == list(POINTER_SIZES)
    assert POINTER_SIZES[0] == MIN_POINTER_SIZE and POINTER_SIZES[-1] < MAX_POINTER_SIZE
    with pytest.raises(PointerFormatError):  # one byte more (a blank line) is not one
        Pointer.decode(Pointer(SHA_HELLO, 6, XET).encode() + b"\n")


def test_a_pointer_has_no_instance_dict() -> None:
    """Listings hold a Pointer per file (a push, status, fsck: 100,000 at once): without a
    ``__dict__`` one decoded pointer is 318 bytes with its strings, 358 with one."""
    p = Pointer.decode(Pointer(hashlib.sha256(b"a").hexdigest(), 7, "ab" * 32).encode())
    assert not hasattr(p, "__dict__")
    assert p == Pointer(p.sha256, 7, p.xet_hash) and len({p, Pointer(p.sha256, 7, p.xet_hash)}) == 1
