"""The low-level git runner shared by the git edge's modules (not public API).

``run_git`` is re-exported by :mod:`gitxet.git.process`, which is where callers get it.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import tempfile
import weakref
from collections.abc import Generator, Sequence
from typing import IO, NamedTuple

from gitxet.errors import GitCommandError, GitError, GitObjectNotFoundError, NotARepositoryError

__all__ = [
    "READ_CHUNK",
    "GitArg",
    "PathArg",
    "PipedGit",
    "Result",
    "fail",
    "first_line",
    "no_option",
    "one_line",
    "run",
    "run_git",
    "spawn_error",
    "stream_records",
]

#: A directory to run git in.
PathArg = str | os.PathLike[str]
#: One argv element; bytes for git paths that need not be UTF-8.
GitArg = str | bytes

READ_CHUNK = 1 << 16


def argv_text(args: Sequence[GitArg]) -> list[str]:
    return [os.fsdecode(a) for a in args]


def first_line(stderr: bytes) -> str:
    for line in stderr.decode("utf-8", "replace").splitlines():
        if line.strip():
            return line.strip()
    return ""


def spawn_error(args: Sequence[GitArg], exc: OSError) -> GitError:
    if isinstance(exc, FileNotFoundError) and exc.filename in ("git", b"git", None):
        return GitError("the git executable was not found on PATH")
    return GitError(f"cannot run git {' '.join(argv_text(args[:1]))}: {exc}")


class Result(NamedTuple):
    returncode: int
    stdout: bytes
    stderr: bytes


def run(args: Sequence[GitArg], cwd: PathArg | None, input: bytes | None) -> Result:
    try:
        proc = subprocess.run(
            ["git", *args],
            cwd=cwd,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
    except OSError as exc:
        raise spawn_error(args, exc) from exc
    return Result(proc.returncode, proc.stdout, proc.stderr)


# git's words for "that revision/object does not exist" (LC_ALL=C or English)
_UNKNOWN_NAME = (
    re.compile(r"^fatal: Not a valid object name (.+)$"),
    re.compile(r"^fatal: ambiguous argument '(.+)': unknown revision"),
    re.compile(r"^fatal: bad revision '(.+)'$"),
    re.compile(r"^fatal: invalid object name '(.+)'\.?$"),
)


def fail(args: Sequence[GitArg], result: Result, cwd: PathArg | None = None) -> GitError:
    """The error of a failed git command: an unknown revision or object is
    :class:`GitObjectNotFoundError`, no repository :class:`NotARepositoryError`, anything
    else :class:`GitCommandError` with git's first line of stderr."""
    line = first_line(result.stderr)
    if line.startswith("fatal: not a git repository"):
        return NotARepositoryError(os.path.abspath(os.fsdecode(cwd)) if cwd else os.getcwd())
    for pattern in _UNKNOWN_NAME:
        m = pattern.match(line)
        if m:
            return GitObjectNotFoundError(m.group(1))
    return GitCommandError(argv_text(args), result.returncode, line)


def run_git(
    args: Sequence[GitArg],
    cwd: PathArg | None = None,
    input: bytes | None = None,
    check: bool = True,
) -> bytes:
    """Run ``git *args`` in ``cwd`` and return its stdout.

    Raises:
        GitCommandError: git exited non-zero (only when ``check``).
        GitError: git could not be started.
    """
    result = run(args, cwd, input)
    if check and result.returncode != 0:
        raise fail(args, result, cwd)
    return result.stdout


def _stop(proc: subprocess.Popen[bytes], err: IO[bytes]) -> None:
    with contextlib.suppress(OSError, ValueError):
        if proc.stdin is not None:
            proc.stdin.close()  # git ends when its input does
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for f in (proc.stdout, err):
        with contextlib.suppress(OSError, ValueError):
            if f is not None:
                f.close()


class PipedGit:
    """One long-lived ``git *args`` fed on ``stdin`` and read on ``stdout``, its stderr kept
    in a temp file (a pipe nobody reads could fill and stall git) for the error message.
    ``close()`` stops it; one forgotten is stopped when collected or at exit."""

    def __init__(self, args: Sequence[str], cwd: PathArg | None) -> None:
        self.args = list(args)
        err = tempfile.TemporaryFile()  # noqa: SIM115 - closed by _stop
        try:
            self.proc = subprocess.Popen(
                ["git", *self.args],
                cwd=cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        except OSError as exc:
            err.close()
            raise spawn_error(self.args, exc) from exc
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[bytes] = self.proc.stdin
        self.stdout: IO[bytes] = self.proc.stdout
        self._err = err
        self._stop = weakref.finalize(self, _stop, self.proc, err)

    def died(self) -> GitError:
        """The error to raise when git stopped answering: its exit code and first line."""
        self.proc.poll()
        self._err.seek(0)
        code = self.proc.returncode
        return GitCommandError(
            self.args, -1 if code is None else code, first_line(self._err.read(64 * 1024))
        )

    def close(self) -> None:
        """Stop the git process (end its input, wait, kill if it does not end)."""
        self._stop()


def no_option(value: str, what: str) -> str:
    if not value or value.startswith("-"):
        raise GitError(f"invalid {what} {value!r}")
    return value


def one_line(out: bytes) -> bytes:
    return out[:-1] if out.endswith(b"\n") else out


def stream_records(
    args: Sequence[GitArg], cwd: PathArg | None, sep: bytes, stdin: IO[bytes] | None = None
) -> Generator[bytes, None, None]:
    """Yield ``sep``-terminated records from git's stdout as they arrive."""
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                ["git", *args],
                cwd=cwd,
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        except OSError as exc:
            raise spawn_error(args, exc) from exc
        finished = False
        try:
            assert proc.stdout is not None
            out = proc.stdout
            assert isinstance(out, io.BufferedReader)
            pending = b""
            while chunk := out.read1(READ_CHUNK):
                pending += chunk
                *records, pending = pending.split(sep)
                yield from records
            if pending:
                yield pending  # a last record without terminator
            returncode = proc.wait()
            finished = True
            if returncode != 0:
                err.seek(0)
                raise fail(args, Result(returncode, b"", err.read(64 * 1024)), cwd)
        finally:
            if not finished:  # the consumer stopped early, or we failed: don't leak git
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
