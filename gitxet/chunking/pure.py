"""Pure-Python Xet chunking: the normative reference, the test oracle and the fallback.

``reference_boundaries`` is the byte-at-a-time algorithm exactly as the protocol states
it; it is kept forever so the native kernel can always be checked against it.
``find_candidates`` mirrors the C kernel's API for machines without the extension.
"""

from __future__ import annotations

from array import array

from gitxet.chunking.params import GEAR, M64, MASK, MAX_CHUNK, MIN_CHUNK, WINDOW


def reference_boundaries(data: bytes | bytearray | memoryview) -> list[int]:
    """Chunk end offsets (exclusive) of ``data``, by the normative byte loop."""
    cuts: list[int] = []
    h = 0
    start = 0
    gear = GEAR
    n = len(data)
    for i in range(n):
        h = ((h << 1) + gear[data[i]]) & M64
        length = i + 1 - start
        if length >= MIN_CHUNK and ((h & MASK) == 0 or length >= MAX_CHUNK):
            cuts.append(i + 1)
            start = i + 1
            h = 0
    if start < n:
        cuts.append(n)
    return cuts


def find_candidates(
    buf: bytes | bytearray | memoryview,
    start: int,
    end: int,
    prev: bytes | bytearray | memoryview = b"",
) -> bytes:
    """Same contract as the C ``_cdc.find_candidates`` (native-endian u64 positions)."""
    if start < 0 or end < start or end > len(buf):
        raise ValueError("find_candidates: range out of bounds")
    gear = GEAR
    h = 0
    if start < WINDOW:
        for b in bytes(prev[-(WINDOW - start) :]):
            h = ((h << 1) + gear[b]) & M64
    for w in range(max(0, start - WINDOW), start):
        h = ((h << 1) + gear[buf[w]]) & M64
    found = array("Q")
    for i in range(start, end):
        h = ((h << 1) + gear[buf[i]]) & M64
        if not h & MASK:
            found.append(i)
    return found.tobytes()
