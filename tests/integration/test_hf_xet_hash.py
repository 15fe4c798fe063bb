"""`git xet hash` equals the real hf_xet.hash_files: protocol vectors and random inputs."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.vectors import FILE_VECTORS

hf_xet = pytest.importorskip(
    "hf_xet", reason="hf_xet is a test dependency (pip install -e .[test])"
)


def git_xet_hash(paths: list[Path]) -> list[str]:
    r = subprocess.run(
        [sys.executable, "-m", "gitxet", "hash", "--json", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return [json.loads(line)["hash"] for line in r.stdout.splitlines()]


def hf_hash(paths: list[Path]) -> list[str]:
    return [str(r.hash) for r in hf_xet.hash_files([str(p) for p in paths])]


def test_protocol_vectors_match_hf_xet(tmp_path: Path) -> None:
    paths = []
    for name, data, _expected, _ in FILE_VECTORS:
        p = tmp_path / name
        p.write_bytes(data)
        paths.append(p)
    ours = git_xet_hash(paths)
    assert ours == [v[2] for v in FILE_VECTORS]
    assert ours == hf_hash(paths)


SIZES = st.one_of(
    st.integers(0, 3 << 20),
    st.sampled_from([0, 1, 8191, 8192, 8193, 131071, 131072, 131073, 3 << 20]),
)


def make(kind: str, size: int, seed: int) -> bytes:
    rnd = random.Random(seed)
    if kind == "random":
        return rnd.randbytes(size)
    if kind == "zeros":  # runs of zeros between random stretches
        out = bytearray()
        while len(out) < size:
            out += rnd.randbytes(rnd.randrange(1, 200_000)) + bytes(rnd.randrange(1, 300_000))
        return bytes(out[:size])
    block = rnd.randbytes(rnd.choice([4096, 65536, 100_000]))  # repeated blocks
    return (block * (size // len(block) + 1))[:size]


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    specs=st.lists(
        st.tuples(st.sampled_from(["random", "zeros", "repeat"]), SIZES, st.integers(0, 10**9)),
        min_size=1,
        max_size=6,
    )
)
def test_random_inputs_match_hf_xet(
    tmp_path_factory: pytest.TempPathFactory, specs: list[tuple[str, int, int]]
) -> None:
    d = tmp_path_factory.mktemp("h")
    paths = []
    for i, (kind, size, seed) in enumerate(specs):
        p = d / f"f{i}"
        p.write_bytes(make(kind, size, seed))
        paths.append(p)
    assert git_xet_hash(paths) == hf_hash(paths)
