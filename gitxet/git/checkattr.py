"""Attributes of paths as git sees them: one long-running ``git check-attr --stdin -z``.

git does not pass attributes to a filter, so the clean filter asks here whether a path is
marked ``xet=always`` (see :mod:`gitxet.git.attributes`); git matches the patterns, so the
answer is exactly git's. One process serves every question (git flushes after each path
when its output is a pipe): a round trip costs microseconds, not a process start.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from gitxet.errors import GitError
from gitxet.git._runner import PathArg, PipedGit

__all__ = ["AttrQuery"]

#: check-attr answers for an attribute no rule mentions.
UNSPECIFIED = "unspecified"


class AttrQuery:
    """Ask git for ``names`` of one path at a time; thread-safe; ``close()`` when done
    (a forgotten one is closed when collected or at exit)."""

    def __init__(self, cwd: PathArg, names: Sequence[str]) -> None:
        if not names or any(not n or n.startswith("-") or "\0" in n for n in names):
            raise GitError(f"invalid attribute names {list(names)!r}")
        self.names = list(names)
        self._lock = threading.Lock()
        self._git = PipedGit(["check-attr", "--stdin", "-z", *self.names], cwd)
        self._asked: bytes | None = None  # a prefetched path whose answer is unread

    def _field(self) -> bytes:
        out = bytearray()
        while True:
            c = self._git.stdout.read(1)
            if not c:
                raise self._git.died()
            if c == b"\0":
                return bytes(out)
            out += c
            if len(out) > 1 << 16:
                raise GitError("check-attr answered an oversized field")

    @staticmethod
    def _encode(path: str) -> bytes:
        encoded = path.encode("utf-8", "surrogateescape")
        if not encoded or b"\0" in encoded:
            raise GitError(f"invalid path {path!r}")
        return encoded

    def _ask(self, encoded: bytes) -> None:
        try:
            self._git.stdin.write(encoded + b"\0")
            self._git.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise self._git.died() from None

    def _answer(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for _ in self.names:
            self._field()  # the path, echoed
            name = self._field().decode("utf-8", "surrogateescape")
            out[name] = self._field().decode("utf-8", "surrogateescape")
        return out

    def _drain(self) -> None:
        """Read the answer to the question :meth:`prefetch` left outstanding, if any."""
        if self._asked is not None:
            self._asked = None
            self._answer()

    def prefetch(self, path: str) -> None:
        """Ask about ``path`` now without waiting: git answers while the caller does other
        work (the filter reads the file's content meanwhile), and :meth:`get` of the same
        path then only reads the answer. At most one question is outstanding."""
        encoded = self._encode(path)
        with self._lock:
            self._drain()
            self._ask(encoded)
            self._asked = encoded

    def get(self, path: str) -> dict[str, str]:
        """``name -> value`` for ``path`` (repository-relative): ``set``, ``unset``,
        ``unspecified`` or the value given."""
        encoded = self._encode(path)
        with self._lock:
            if self._asked != encoded:
                self._drain()
                self._ask(encoded)
            self._asked = None
            return self._answer()

    def close(self) -> None:
        """Stop the git process."""
        self._git.close()
