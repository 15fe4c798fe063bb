"""Xet hashing: chunk, xorb (Merkle), file, verification and dedup-HMAC hashes.

Every hash is 32 raw bytes. The "Xet hex" string form prints each 8-byte word as a
little-endian u64, so it is *not* ``bytes.hex()``; see docs/internals/formats.md §1.
"""

from __future__ import annotations

import array
import struct
from collections.abc import Iterable, Sequence

import blake3

HASH_LEN = 32
ZERO_HASH = bytes(HASH_LEN)

DATA_KEY = bytes(
    [102, 151, 245, 119, 91, 149, 80, 222, 49, 53, 203, 172, 165, 151, 24, 28,
     157, 228, 33, 16, 155, 235, 43, 88, 180, 208, 176, 75, 147, 173, 242, 41]
)  # fmt: skip
INTERNAL_NODE_KEY = bytes(
    [1, 126, 197, 199, 165, 71, 41, 150, 253, 148, 102, 102, 180, 138, 2, 230,
     93, 221, 83, 111, 55, 199, 109, 210, 248, 99, 82, 230, 74, 83, 113, 63]
)  # fmt: skip
VERIFICATION_KEY = bytes(
    [127, 24, 87, 214, 206, 86, 237, 102, 18, 127, 249, 19, 231, 165, 195, 243,
     164, 205, 38, 213, 181, 219, 73, 230, 65, 36, 152, 127, 40, 251, 148, 195]
)  # fmt: skip
FILE_SALT = ZERO_HASH

_WORDS = struct.Struct("<4Q")
_BE_WORDS = struct.Struct(">4Q")  # the same four words as their hex digits read
_HEX_DIGITS = frozenset("0123456789abcdef")


def to_hex(h: bytes) -> str:
    """Xet hex form of a raw 32-byte hash."""
    a, b, c, d = _WORDS.unpack(h)
    return f"{a:016x}{b:016x}{c:016x}{d:016x}"


def from_hex(s: str) -> bytes:
    """Parse a Xet hex string (64 lowercase hex digits) into raw bytes.

    Raises:
        ValueError: if ``s`` is not exactly 64 lowercase hex digits.
    """
    if len(s) != 64 or not _HEX_DIGITS.issuperset(s):
        raise ValueError(f"not a 64-digit lowercase hex hash: {s[:80]!r}")
    return _WORDS.pack(*_BE_WORDS.unpack(bytes.fromhex(s)))


def from_hex_many(items: Sequence[str]) -> list[bytes]:
    """:func:`from_hex` of every string of ``items``, parsed in one pass (a xorb's layout
    names a thousand chunk hashes or more).

    Raises:
        ValueError: if any item is not a string of exactly 64 lowercase hex digits.
    """
    if not all(isinstance(s, str) and len(s) == 64 for s in items):
        raise ValueError("not a list of 64-digit lowercase hex hashes")
    joined = "".join(items)
    if not _HEX_DIGITS.issuperset(joined):
        raise ValueError("not a list of 64-digit lowercase hex hashes")
    words = array.array("Q", bytes.fromhex(joined))
    words.byteswap()  # each word was printed as a little-endian u64, most significant first
    raw = words.tobytes()
    return [raw[i : i + HASH_LEN] for i in range(0, len(raw), HASH_LEN)]


def is_hex(s: str) -> bool:
    """True when ``s`` is a well-formed Xet hex hash."""
    return len(s) == 64 and _HEX_DIGITS.issuperset(s)


def last_word(h: bytes) -> int:
    """The last 8 bytes as a LE u64: what modulo tests on a hash read."""
    return int.from_bytes(h[24:32], "little")


def truncated(h: bytes) -> int:
    """The first 8 bytes as a LE u64: the shard lookup-table key."""
    return int.from_bytes(h[0:8], "little")


def sort_key(h: bytes) -> tuple[int, int, int, int]:
    """xet-core's hash order (word tuple), which equals the order of Xet hex strings."""
    return _WORDS.unpack(h)  # type: ignore[no-any-return]


def chunk_hash(data: bytes | memoryview) -> bytes:
    """Keyed BLAKE3 of a chunk's bytes."""
    return blake3.blake3(data, key=DATA_KEY).digest()


def _group_ends(last_bytes: bytes) -> list[int]:
    """Where each group of a Merkle level ends, given the first byte of each node's last
    word (a node whose last word is 0 mod 4 closes its group; groups have 2 to 9 nodes)."""
    ends: list[int] = []
    n = len(last_bytes)
    i = 0
    while i < n:
        m = n - i
        if m <= 2:
            k = m
        else:
            top = min(9, m)
            k = top
            for j in range(2, top):
                if not last_bytes[i + j] & 3:
                    k = j + 1
                    break
        i += k
        ends.append(i)
    return ends


def merkle_root(entries: Sequence[tuple[bytes, int]]) -> bytes:
    """Xet Merkle aggregation of (hash, size) pairs; the xorb hash of a xorb's chunks."""
    return merkle_root_of([h for h, _ in entries], [s for _, s in entries])


def merkle_root_of(hashes: Sequence[bytes], sizes: Sequence[int]) -> bytes:
    """:func:`merkle_root` of the pairs of ``hashes`` and ``sizes`` (equal lengths), given
    as two lists: a caller that holds them so builds no pair per chunk (a reader checks
    the 16,000 chunks of a 1 GiB file before its first byte).

    Each internal node is the keyed BLAKE3 of its children's ``"<xet hex> : <size>\\n"``
    lines. A level's hex forms are made in one pass (every 8-byte word byte-swapped, then
    ``bytes.hex``): a file's 16,000 chunks are hashed in about a third of the time of one
    ``to_hex`` per node.

    Raises:
        ValueError: ``hashes`` and ``sizes`` differ in length, or the hashes are not 32 bytes each.
    """
    if len(hashes) != len(sizes):
        raise ValueError(f"{len(hashes)} hashes and {len(sizes)} sizes")
    if not hashes:
        return ZERO_HASH
    while len(hashes) > 1:
        joined = b"".join(hashes)
        if len(joined) != HASH_LEN * len(hashes):
            raise ValueError(f"hashes of {len(joined)} bytes in all, not {len(hashes)} x 32")
        words = array.array("Q", joined)
        words.byteswap()  # each little-endian u64 word, printed most significant first
        digits = words.tobytes().hex()
        lines = [f"{digits[64 * i : 64 * i + 64]} : {s}\n" for i, s in enumerate(sizes)]
        last = joined[24::HASH_LEN]  # last_word(h) % 4 == h[24] % 4
        merged: list[bytes] = []
        merged_sizes: list[int] = []
        start = 0
        for end in _group_ends(last):
            text = "".join(lines[start:end])
            merged.append(blake3.blake3(text.encode("ascii"), key=INTERNAL_NODE_KEY).digest())
            merged_sizes.append(sum(sizes[start:end]))
            start = end
        hashes, sizes = merged, merged_sizes
    return hashes[0]


xorb_hash = merkle_root


def file_hash(entries: Sequence[tuple[bytes, int]], salt: bytes = FILE_SALT) -> bytes:
    """File hash over its chunks' (hash, size) pairs; all zeros for an empty file."""
    return file_hash_of([h for h, _ in entries], [s for _, s in entries], salt)


def file_hash_of(hashes: Sequence[bytes], sizes: Sequence[int], salt: bytes = FILE_SALT) -> bytes:
    """:func:`file_hash` of the chunk hashes and sizes given as two lists (see
    :func:`merkle_root_of`).

    Raises:
        ValueError: ``hashes`` and ``sizes`` differ in length, or the hashes are not 32 bytes each.
    """
    if not hashes and not sizes:
        return ZERO_HASH
    return blake3.blake3(merkle_root_of(hashes, sizes), key=salt).digest()


def verification_hash(chunk_hashes: Iterable[bytes]) -> bytes:
    """Term verification ("range") hash over the raw chunk hashes of a term."""
    return blake3.blake3(b"".join(chunk_hashes), key=VERIFICATION_KEY).digest()


def protected_chunk_hash(key: bytes, h: bytes) -> bytes:
    """Global-dedup HMAC of a chunk hash; an all-zero key means unprotected."""
    if key == ZERO_HASH:
        return h
    return blake3.blake3(h, key=key).digest()


def sha256_to_shard(sha256_hex: str) -> bytes:
    """Stored form of a SHA-256 in a shard's metadata ext (each 8-byte word reversed)."""
    return from_hex(sha256_hex)


def sha256_from_shard(raw: bytes) -> str:
    """Inverse of :func:`sha256_to_shard`: the familiar lowercase sha256 hex."""
    return to_hex(raw)


def is_global_dedup_eligible(h: bytes, first_in_file: bool) -> bool:
    """Whether a chunk may be queried against the server's global dedup."""
    return first_in_file or last_word(h) % 1024 == 0
