"""A trivial long-running filter for integration tests: clean and smudge are both rot13.

Run by git as ``filter.<name>.process``: ``python rot13_filter.py LOGFILE``. Paths under
``delay/`` may be delayed; paths ending in ``fail.txt`` fail to clean and ``fail-smudge``
paths fail to smudge. Every call is appended to LOGFILE.
"""

from __future__ import annotations

import random
import sys
import time
from typing import BinaryIO

from gitxet.git.filter_protocol import NO_META, FilterOptions, SmudgeMeta, serve

_LOWER = b"abcdefghijklmnopqrstuvwxyz"
_UPPER = _LOWER.upper()
ROT13 = bytes.maketrans(_LOWER + _UPPER, _LOWER[13:] + _LOWER[:13] + _UPPER[13:] + _UPPER[:13])


def rot13(data: bytes) -> bytes:
    return data.translate(ROT13)


class Rot13:
    def __init__(self, log: BinaryIO) -> None:
        self.log = log

    def _note(self, line: str) -> None:
        self.log.write(line.encode() + b"\n")
        self.log.flush()

    def _stream(self, src: BinaryIO, dst: BinaryIO) -> None:
        while chunk := src.read(1 << 16):  # bounded memory, however big the file
            dst.write(rot13(chunk))

    def clean(self, pathname: str, src: BinaryIO, dst: BinaryIO) -> None:
        self._note(f"clean {pathname}")
        if pathname.endswith("fail.txt"):
            raise RuntimeError("refusing to clean")
        self._stream(src, dst)

    def smudge(
        self, pathname: str, src: BinaryIO, dst: BinaryIO, meta: SmudgeMeta = NO_META
    ) -> None:
        self._note(f"smudge {pathname}")
        if pathname.startswith("delay/"):
            time.sleep(random.uniform(0, 0.02))
        if "fail-smudge" in pathname:
            dst.write(b"half")
            raise RuntimeError("refusing to smudge")
        self._stream(src, dst)

    def can_delay(self, pathname: str) -> bool:
        return pathname.startswith("delay/")


def main() -> None:
    with open(sys.argv[1], "ab") as log:
        serve(Rot13(log), sys.stdin.buffer, sys.stdout.buffer, FilterOptions(workers=3))


if __name__ == "__main__":
    main()
