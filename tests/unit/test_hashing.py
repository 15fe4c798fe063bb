"""Xet hashes against the protocol reference's vectors."""

from __future__ import annotations

import io
import random

import blake3
import pytest

from gitxet import hashing
from gitxet.chunking import chunk_bytes
from gitxet.chunking.pipeline import ChunkStream, digest_stream
from tests.vectors import (
    FILE_VECTORS,
    THREE_MIB,
    THREE_MIB_FIRST_CHUNK,
    THREE_MIB_VERIFICATION,
    THREE_MIB_XORB,
)


def test_hex_form_is_word_swapped() -> None:
    raw = bytes(range(32))
    s = "07060504030201000f0e0d0c0b0a090817161514131211101f1e1d1c1b1a1918"
    assert hashing.to_hex(raw) == s
    assert hashing.from_hex(s) == raw
    for bad in ["", "0" * 63, "G" * 64, "A" * 64, "0" * 65]:
        with pytest.raises(ValueError):
            hashing.from_hex(bad)


def test_chunk_hash_hello() -> None:
    h = hashing.chunk_hash(b"Hello World!")
    assert h.hex().startswith("a29cfb08e608d4d8")
    assert hashing.to_hex(h) == "d8d408e608fb9ca213b9909a65d86d725f2de4d8d540324be8a363e7a6e228cb"
    # a one-chunk xorb hashes to its chunk hash
    assert hashing.xorb_hash([(h, 12)]) == h


def test_internal_node_and_verification_draft_vectors() -> None:
    a = hashing.from_hex("c28f58387a60d4aa200c311cda7c7f77f686614864f5869eadebf765d0a14a69")
    b = hashing.from_hex("6e4e3263e073ce2c0e78cc770c361e2778db3b054b98ab65e277fc084fa70f22")
    assert (
        hashing.to_hex(hashing.merkle_root([(a, 100), (b, 200)]))
        == "be64c7003ccd3cf4357364750e04c9592b3c36705dee76a71590c011766b6c14"
    )
    assert (
        hashing.to_hex(hashing.verification_hash([a, b]))
        == "eb06a8ad81d588ac05d1d9a079232d9c1e7d0b07232fa58091caa7bf333a2768"
    )


@pytest.mark.parametrize(
    ("name", "data", "expected", "nchunks"), FILE_VECTORS, ids=[v[0] for v in FILE_VECTORS]
)
def test_file_vectors(name: str, data: bytes, expected: str, nchunks: int | None) -> None:
    d = digest_stream(io.BytesIO(data))
    assert hashing.to_hex(d.hash) == expected
    assert d.size == len(data)
    if nchunks is not None:
        assert d.chunks == nchunks


def test_three_mib_xorb_and_verification() -> None:
    chunks = chunk_bytes(THREE_MIB)
    hashes = [hashing.chunk_hash(c) for c in chunks]
    assert hashing.to_hex(hashes[0]) == THREE_MIB_FIRST_CHUNK
    assert (
        hashing.to_hex(
            hashing.xorb_hash([(h, len(c)) for h, c in zip(hashes, chunks, strict=True)])
        )
        == THREE_MIB_XORB
    )
    assert hashing.to_hex(hashing.verification_hash(hashes)) == THREE_MIB_VERIFICATION


def test_sha256_shard_form() -> None:
    import hashlib

    hx = hashlib.sha256(b"Hello World!").hexdigest()
    assert (
        hashing.sha256_to_shard(hx).hex()
        == "53fcf17f65b1837f5dd6a14881c12db92877d6a31f4b2dfc69906d1200d2dd4a"
    )
    assert hashing.sha256_from_shard(hashing.sha256_to_shard(hx)) == hx


def test_chunkstream_sha256_and_guard() -> None:
    import hashlib

    cs = ChunkStream(io.BytesIO(THREE_MIB), sha256=True, block_size=1 << 20)
    with pytest.raises(RuntimeError):
        _ = cs.file_hash
    n = sum(len(b.chunks) for b in cs)
    assert n == 52
    assert cs.sha256 == hashlib.sha256(THREE_MIB).hexdigest()


def test_dedup_eligibility() -> None:
    assert hashing.is_global_dedup_eligible(bytes(32), first_in_file=False)
    h = (1).to_bytes(8, "little") * 4
    assert not hashing.is_global_dedup_eligible(h, first_in_file=False)
    assert hashing.is_global_dedup_eligible(h, first_in_file=True)


def _reference_root(entries: list[tuple[bytes, int]]) -> bytes:
    """The Xet Merkle aggregation written plainly (one ``to_hex`` per node)."""
    nodes = list(entries)
    if not nodes:
        return hashing.ZERO_HASH
    while len(nodes) > 1:
        merged = []
        i = 0
        while i < len(nodes):
            m = len(nodes) - i
            k = m if m <= 2 else min(9, m)
            if m > 2:
                for j in range(2, min(9, m)):
                    if hashing.last_word(nodes[i + j][0]) % 4 == 0:
                        k = j + 1
                        break
            group = nodes[i : i + k]
            text = "".join(f"{hashing.to_hex(h)} : {s}\n" for h, s in group)
            h = blake3.blake3(text.encode(), key=hashing.INTERNAL_NODE_KEY).digest()
            merged.append((h, sum(s for _, s in group)))
            i += k
        nodes = merged
    return nodes[0][0]


def test_merkle_root_matches_the_plain_aggregation() -> None:
    rnd = random.Random(11)
    for n in [*range(0, 40), 81, 82, 730, 4096]:
        entries = [(rnd.randbytes(32), rnd.randint(1, 1 << 17)) for _ in range(n)]
        assert hashing.merkle_root(entries) == _reference_root(entries), n
        hashes, sizes = [h for h, _ in entries], [s for _, s in entries]
        assert hashing.merkle_root_of(hashes, sizes) == _reference_root(entries), n
        assert hashing.file_hash_of(hashes, sizes) == hashing.file_hash(entries), n


def test_merkle_root_of_refuses_lists_that_do_not_pair() -> None:
    h = bytes(range(32))
    with pytest.raises(ValueError, match="2 hashes and 1 sizes"):
        hashing.merkle_root_of([h, h], [5])
    with pytest.raises(ValueError, match="not 2 x 32"):
        hashing.merkle_root_of([h, h[:24]], [5, 6])
    with pytest.raises(ValueError, match="1 hashes and 0 sizes"):
        hashing.file_hash_of([h], [])


def test_from_hex_many_parses_like_from_hex_and_refuses_what_it_refuses() -> None:
    rnd = random.Random(12)
    raw = [rnd.randbytes(32) for _ in range(300)]
    texts = [hashing.to_hex(h) for h in raw]
    assert hashing.from_hex_many(texts) == [hashing.from_hex(t) for t in texts] == raw
    assert hashing.from_hex_many([]) == []
    good = texts[0]
    for bad in ("A" * 64, "0" * 63, "0" * 65, "g" * 64, " " + good[1:], 7, None):
        with pytest.raises(ValueError):
            hashing.from_hex_many([good, bad])  # type: ignore[list-item]
