"""The low-level git runner shared by the git edge's modules (not public API).

``run_git`` is re-exported by :mod:`gitxet.git.process`, which is where callers get it.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tempfile
from collections.abc import Generator, Sequence
from typing import IO, NamedTuple

from gitxet.errors import GitCommandError, GitError, GitObjectNotFoundError, NotARepositoryError

__all__ = [
    "READ_CHUNK",
    "GitArg",
    "PathArg",
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
