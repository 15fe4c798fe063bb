"""Attributes of paths as git sees them: one long-running ``git check-attr --stdin -z``.

git does not pass attributes to a filter, so the clean filter asks here whether a path is
marked ``xet=always`` (see :mod:`gitxet.git.attributes`); git matches the patterns, so the
answer is exactly git's. One process serves every question (git flushes after each path
when its output is a pipe): a round trip costs microseconds, not a process start.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Sequence
from typing import IO

from gitxet.errors import GitCommandError, GitError
from gitxet.git._runner import PathArg, first_line, spawn_error

__all__ = ["AttrQuery"]

#: check-attr answers for an attribute no rule mentions.
UNSPECIFIED = "unspecified"


def _shutdown(proc: subprocess.Popen[bytes], err: IO[bytes]) -> None:
    with contextlib.suppress(OSError, ValueError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for f in (proc.stdout, err):
        with contextlib.suppress(OSError, ValueError):
            if f is not None:
                f.close()


class AttrQuery:
    """Ask git for ``names`` of one path at a time; thread-safe; ``close()`` when done
    (a forgotten one is closed when collected or at exit)."""

    def __init__(self, cwd: PathArg, names: Sequence[str]) -> None:
        if not names or any(not n or n.startswith("-") or "\0" in n for n in names):
            raise GitError(f"invalid attribute names {list(names)!r}")
        self.names = list(names)
        self._args = ["check-attr", "--stdin", "-z", *self.names]
        self._lock = threading.Lock()
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 - closed by _shutdown
        try:
            self._proc = subprocess.Popen(
                ["git", *self._args],
                cwd=cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._err,
            )
        except OSError as exc:
            self._err.close()
            raise spawn_error(self._args, exc) from exc
        self._close = weakref.finalize(self, _shutdown, self._proc, self._err)

    def _died(self) -> GitError:
        self._proc.poll()
        self._err.seek(0)
        code = self._proc.returncode
        return GitCommandError(
            self._args, -1 if code is None else code, first_line(self._err.read(64 * 1024))
        )

    def _field(self) -> bytes:
        assert self._proc.stdout is not None
        out = bytearray()
        while True:
            c = self._proc.stdout.read(1)
            if not c:
                raise self._died()
            if c == b"\0":
                return bytes(out)
            out += c
            if len(out) > 1 << 16:
                raise GitError("check-attr answered an oversized field")

    def get(self, path: str) -> dict[str, str]:
        """``name -> value`` for ``path`` (repository-relative): ``set``, ``unset``,
        ``unspecified`` or the value given."""
        encoded = path.encode("utf-8", "surrogateescape")
        if not encoded or b"\0" in encoded:
            raise GitError(f"invalid path {path!r}")
        with self._lock:
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write(encoded + b"\0")
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                raise self._died() from None
            out: dict[str, str] = {}
            for _ in self.names:
                self._field()  # the path, echoed
                name = self._field().decode("utf-8", "surrogateescape")
                out[name] = self._field().decode("utf-8", "surrogateescape")
        return out

    def close(self) -> None:
        """Stop the git process."""
        self._close()
