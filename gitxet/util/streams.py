"""Two stream helpers: read exactly up to ``n`` bytes, and a head put back before a stream."""

from __future__ import annotations

import io
from typing import BinaryIO


def read_up_to(src: BinaryIO, n: int) -> bytes:
    """``n`` bytes of ``src``, fewer only at its end (however short its reads are)."""
    parts: list[bytes] = []
    left = n
    while left > 0:
        b = src.read(left)
        if not b:
            break
        parts.append(b)
        left -= len(b)
    return b"".join(parts)


class Chained(io.RawIOBase):
    """``head`` followed by the rest of ``src``, as one raw stream (wrap it in a
    ``BufferedReader``)."""

    def __init__(self, head: bytes, src: BinaryIO) -> None:
        self._head = memoryview(head)
        self._src = src

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._src.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
