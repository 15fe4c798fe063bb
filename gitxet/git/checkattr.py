"""Attributes of paths as git sees them: one long-running ``git check-attr --stdin -z``.

git does not pass attributes to a filter, so the clean filter asks here whether a path is
marked ``xet=always`` (see :mod:`gitxet.git.attributes`); git matches the patterns, so the
answer is exactly git's. One process serves every question (git flushes after each path
when its output is a pipe): a round trip costs microseconds, not a process start.

Questions may be asked ahead (:meth:`AttrQuery.prefetch`, :meth:`AttrQuery.ask_ahead`):
git answers in order while the asker does other work, and :meth:`AttrQuery.get` of such a
path reads the answers up to its own (keeping the others for later). What is asked and
unread stays under :data:`AHEAD_BYTES`, so git never blocks writing answers nobody reads
while we block writing questions.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence

from gitxet.errors import GitError
from gitxet.git._runner import PathArg, PipedGit, run_git

__all__ = ["AttrQuery", "xet_filtered"]

#: check-attr answers for an attribute no rule mentions.
UNSPECIFIED = "unspecified"
#: bound on the answers asked for and not read yet (estimated bytes; git's pipe holds 64 KiB)
AHEAD_BYTES = 16 << 10
#: answers read and kept for a later get, at most (the oldest are dropped)
KEPT_ANSWERS = 4096


def xet_filtered(cwd: PathArg, paths: Sequence[str]) -> set[str]:
    """Those of ``paths`` that git's checkout runs through the xet filter (their ``filter``
    attribute is ``xet``), as the index's ``.gitattributes`` decide (git reads those first
    when it checks files out): one ``git check-attr --cached`` for all of them. A pointer
    blob anywhere else is a plain file of pointer text to git."""
    if not paths:
        return set()
    names = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
    out = run_git(["check-attr", "--cached", "--stdin", "-z", "filter"], cwd, input=names)
    fields = out.split(b"\0")
    return {
        fields[i].decode("utf-8", "surrogateescape")
        for i in range(0, len(fields) - 2, 3)
        if fields[i + 2] == b"xet"
    }


class AttrQuery:
    """Ask git for ``names`` of paths; thread-safe; ``close()`` when done (a forgotten one
    is closed when collected or at exit)."""

    def __init__(self, cwd: PathArg, names: Sequence[str]) -> None:
        if not names or any(not n or n.startswith("-") or "\0" in n for n in names):
            raise GitError(f"invalid attribute names {list(names)!r}")
        self.names = list(names)
        self._lock = threading.Lock()
        self._git = PipedGit(["check-attr", "--stdin", "-z", *self.names], cwd)
        self._asked: deque[bytes] = deque()  # questions whose answers are unread, in order
        self._asked_set: set[bytes] = set()
        self._asked_bytes = 0
        self._kept: dict[bytes, dict[str, str]] = {}  # answers read, not asked for yet

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

    def _cost(self, encoded: bytes) -> int:
        """Estimated bytes of the answer about ``encoded``."""
        return len(self.names) * (len(encoded) + 64)

    def _ask(self, questions: list[bytes]) -> None:
        try:
            self._git.stdin.write(b"".join(q + b"\0" for q in questions))
            self._git.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise self._git.died() from None
        for q in questions:
            self._asked.append(q)
            self._asked_set.add(q)
            self._asked_bytes += self._cost(q)

    def _answer(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for _ in self.names:
            self._field()  # the path, echoed
            name = self._field().decode("utf-8", "surrogateescape")
            out[name] = self._field().decode("utf-8", "surrogateescape")
        return out

    def _read_one(self) -> None:
        """Read the oldest outstanding answer and keep it."""
        q = self._asked.popleft()
        self._asked_set.discard(q)
        self._asked_bytes -= self._cost(q)
        self._kept[q] = self._answer()
        if len(self._kept) > KEPT_ANSWERS:
            del self._kept[next(iter(self._kept))]

    def _known(self, encoded: bytes) -> bool:
        return encoded in self._kept or encoded in self._asked_set

    def prefetch(self, path: str) -> None:
        """Ask about ``path`` now without waiting: git answers while the caller does other
        work (the filter reads the file's content meanwhile), and :meth:`get` of the same
        path then only reads the answer."""
        encoded = self._encode(path)
        with self._lock:
            if self._known(encoded):
                return
            while self._asked and self._asked_bytes + self._cost(encoded) > AHEAD_BYTES:
                self._read_one()
            self._ask([encoded])

    def ask_ahead(self, paths: Iterable[str]) -> int:
        """Ask about ``paths`` (in the order :meth:`get` will want them) as far as the bound
        allows, without reading any answer; returns how many were asked."""
        with self._lock:
            new: list[bytes] = []
            room = AHEAD_BYTES - self._asked_bytes
            for path in paths:
                try:
                    encoded = self._encode(path)
                except GitError:
                    continue
                if self._known(encoded) or encoded in new:
                    continue
                room -= self._cost(encoded)
                if room < 0:
                    break
                new.append(encoded)
            if new:
                self._ask(new)
            return len(new)

    def get(self, path: str) -> dict[str, str]:
        """``name -> value`` for ``path`` (repository-relative): ``set``, ``unset``,
        ``unspecified`` or the value given."""
        encoded = self._encode(path)
        with self._lock:
            if not self._known(encoded):
                while self._asked and self._asked_bytes + self._cost(encoded) > AHEAD_BYTES:
                    self._read_one()
                self._ask([encoded])
            while encoded not in self._kept:
                self._read_one()
            return self._kept.pop(encoded)

    def close(self) -> None:
        """Stop the git process."""
        self._git.close()
