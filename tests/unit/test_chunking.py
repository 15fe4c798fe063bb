"""Chunk boundaries: native kernel == pure finder == the normative byte loop, any buffering."""

from __future__ import annotations

import io
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gitxet.chunking as chunking
from gitxet.chunking import Chunker, boundaries, chunk_bytes, iter_chunks, pure
from gitxet.chunking.params import MAX_CHUNK, MIN_CHUNK
from tests.helpers.ci import require_native
from tests.vectors import THREE_MIB, THREE_MIB_FIRST_SIZES, THREE_MIB_LAST_SIZE, R


def native_find() -> chunking.FindCandidates:
    require_native(chunking.NATIVE, "the native chunker (_cdc)")
    assert chunking._native_find is not None
    return chunking._native_find


FINDERS = {"native": native_find, "pure": lambda: pure.find_candidates}


@pytest.fixture(params=sorted(FINDERS))
def find(request: pytest.FixtureRequest) -> chunking.FindCandidates:
    return FINDERS[request.param]()  # type: ignore[no-untyped-call]


def test_native_is_in_use_in_ci() -> None:
    if os.environ.get("CI") or os.environ.get("GITXET_REQUIRE_NATIVE") == "1":
        assert chunking.NATIVE, "CI must build the C kernel"


def test_three_mib_vector_sizes(find: chunking.FindCandidates) -> None:
    ends = boundaries(THREE_MIB, find)
    sizes = [b - a for a, b in zip([0, *ends], ends, strict=False)]
    assert len(sizes) == 52
    assert sizes[:6] == THREE_MIB_FIRST_SIZES
    assert sizes[-1] == THREE_MIB_LAST_SIZE
    assert ends == pure.reference_boundaries(THREE_MIB)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", []),
        (b"x", [1]),
        (R(7, 8191), [8191]),
        (R(9, 131073), [47220, 47220 + 13260, 131073]),
        (bytes(MAX_CHUNK * 3 + 5), [MAX_CHUNK, 2 * MAX_CHUNK, 3 * MAX_CHUNK, 3 * MAX_CHUNK + 5]),
    ],
)
def test_edges(find: chunking.FindCandidates, data: bytes, expected: list[int]) -> None:
    assert boundaries(data, find) == expected


def test_candidates_agree_on_subranges() -> None:
    nf = native_find()
    data = R(11, 2_000_000)
    for start, end in [(0, len(data)), (1, 77), (63, 64), (64, 1_000_003), (999_999, 2_000_000)]:
        prev = b"" if start else R(12, 100)
        assert nf(data, start, end, prev) == pure.find_candidates(data, start, end, prev)


def test_candidate_range_is_checked(find: chunking.FindCandidates) -> None:
    with pytest.raises(ValueError):
        find(b"abc", 2, 1)
    with pytest.raises(ValueError):
        find(b"abc", 0, 4)


@pytest.mark.parametrize("block", [1, 63, 64, 65, 4096, MIN_CHUNK, 100_003, MAX_CHUNK, 1 << 20])
def test_streaming_is_independent_of_block_size(block: int) -> None:
    data = R(5, 700_000) + bytes(300_000) + R(5, 200_000)
    expected = pure.reference_boundaries(data)
    ch = Chunker()
    sizes: list[int] = []
    for i in range(0, len(data), block):
        sizes.extend(len(c) for c in ch.feed(data[i : i + block]))
    sizes.extend(len(c) for c in ch.finish())
    ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    assert ends == expected


def test_iter_chunks_parallel_matches_serial() -> None:
    from concurrent.futures import ThreadPoolExecutor

    data = R(6, 5_000_000)
    with ThreadPoolExecutor(2) as ex:
        got = [bytes(c) for c in iter_chunks(io.BytesIO(data), block_size=1_500_001, executor=ex)]
    assert b"".join(got) == data
    assert got == chunk_bytes(data)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    size=st.integers(0, 400_000),
    zeros=st.integers(0, 200_000),
    block=st.integers(1, 300_000),
)
def test_random_inputs_native_equals_reference(
    seed: int, size: int, zeros: int, block: int
) -> None:
    nf = native_find()
    rnd = random.Random(seed)
    data = rnd.randbytes(size // 2) + bytes(zeros) + rnd.randbytes(size - size // 2)
    expected = pure.reference_boundaries(data)
    ch = Chunker(nf)
    sizes = []
    for i in range(0, len(data), block):
        sizes.extend(len(c) for c in ch.feed(data[i : i + block]))
    sizes.extend(len(c) for c in ch.finish())
    assert [sum(sizes[: i + 1]) for i in range(len(sizes))] == expected
    assert all(MIN_CHUNK <= s <= MAX_CHUNK for s in sizes[:-1])
