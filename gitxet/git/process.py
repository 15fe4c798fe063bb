"""Running the ``git`` binary: one-shot commands, streamed listings, and ``cat-file``.

Rules that hold for every function here:

* Paths that come from git are ``bytes`` (read with ``-z`` where git offers it), because git
  paths are bytes and need not be UTF-8. Object ids, ref names and config values are ``str``.
* A failing git raises :class:`~gitxet.errors.GitCommandError` carrying the first line of
  git's stderr; "not there" answers (missing config key, unknown object) are ``None`` or
  :class:`~gitxet.errors.GitObjectNotFoundError`, never a generic failure.
* Listings that can be huge (``ls-tree -r``, ``rev-list --objects``) are generators over a
  pipe, so memory stays flat on big repositories. stderr goes to a temp file, not a pipe:
  a chatty git can then never dead-lock against us while we read its stdout.
* Revisions given by callers must not start with ``-``, so that a ref name can never be
  read as an option.
* The environment is inherited untouched (only ``gitxet.cli`` reads it). Inside a hook or a
  filter that means git's own ``GIT_DIR`` applies, which is what those callers want.
"""

from __future__ import annotations

import io
import os
import subprocess
import tempfile
import threading
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal, NamedTuple

from gitxet.errors import GitCommandError, GitError, GitObjectNotFoundError
from gitxet.formats.pointer import MAX_POINTER_SIZE

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = [
    "BlobInfo",
    "CatFile",
    "CatFileStream",
    "ObjectInfo",
    "RevListObject",
    "Scope",
    "TreeEntry",
    "config_add",
    "config_get",
    "config_get_all",
    "config_get_regexp",
    "config_remove_empty_section",
    "config_set",
    "config_unset",
    "git_dir",
    "git_version",
    "iter_ls_tree",
    "list_remotes",
    "ls_tree",
    "remote_url",
    "rev_list_objects",
    "rev_parse",
    "run_git",
    "small_blobs",
    "toplevel",
]

PathArg = str | os.PathLike[str]
GitArg = str | bytes
#: Where a config key lives. ``None`` in readers means git's merged view.
Scope = Literal["local", "global", "system"]

_READ_CHUNK = 1 << 16


# ---- running git --------------------------------------------------------------------------


def _argv_text(args: Sequence[GitArg]) -> list[str]:
    return [os.fsdecode(a) for a in args]


def _first_line(stderr: bytes) -> str:
    for line in stderr.decode("utf-8", "replace").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _spawn_error(args: Sequence[GitArg], exc: OSError) -> GitError:
    if isinstance(exc, FileNotFoundError) and exc.filename in ("git", b"git", None):
        return GitError("the git executable was not found on PATH")
    return GitError(f"cannot run git {' '.join(_argv_text(args[:1]))}: {exc}")


class _Result(NamedTuple):
    returncode: int
    stdout: bytes
    stderr: bytes


def _run(args: Sequence[GitArg], cwd: PathArg | None, input: bytes | None) -> _Result:
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
        raise _spawn_error(args, exc) from exc
    return _Result(proc.returncode, proc.stdout, proc.stderr)


def _fail(args: Sequence[GitArg], result: _Result) -> GitCommandError:
    return GitCommandError(_argv_text(args), result.returncode, _first_line(result.stderr))


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
    result = _run(args, cwd, input)
    if check and result.returncode != 0:
        raise _fail(args, result)
    return result.stdout


def _no_option(value: str, what: str) -> str:
    if not value or value.startswith("-"):
        raise GitError(f"invalid {what} {value!r}")
    return value


def _one_line(out: bytes) -> bytes:
    return out[:-1] if out.endswith(b"\n") else out


def git_version() -> tuple[int, ...]:
    """The installed git's version as numbers, e.g. ``(2, 39, 5)``."""
    text = run_git(["--version"]).decode("ascii", "replace").split()
    if len(text) < 3:
        raise GitError(f"unexpected git --version output {' '.join(text)!r}")
    parts: list[int] = []
    for piece in text[2].split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def git_dir(cwd: PathArg) -> Path:
    """Absolute path of the repository's git directory (``.git`` or a bare repo)."""
    return Path(os.fsdecode(_one_line(run_git(["rev-parse", "--absolute-git-dir"], cwd))))


def toplevel(cwd: PathArg) -> Path:
    """Absolute path of the working tree's top directory (fails in a bare repository)."""
    return Path(os.fsdecode(_one_line(run_git(["rev-parse", "--show-toplevel"], cwd))))


def rev_parse(cwd: PathArg, rev: str) -> str:
    """Resolve ``rev`` to a full object id.

    Raises:
        GitObjectNotFoundError: ``rev`` names nothing.
    """
    _no_option(rev, "revision")
    result = _run(["rev-parse", "--verify", "--quiet", rev], cwd, None)
    if result.returncode != 0:
        if result.stderr.strip():
            raise _fail(["rev-parse", rev], result)
        raise GitObjectNotFoundError(rev)
    return _one_line(result.stdout).decode("ascii")


# ---- streamed listings --------------------------------------------------------------------


def _stream_records(
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
            raise _spawn_error(args, exc) from exc
        finished = False
        try:
            assert proc.stdout is not None
            out = proc.stdout
            assert isinstance(out, io.BufferedReader)
            pending = b""
            while chunk := out.read1(_READ_CHUNK):
                pending += chunk
                *records, pending = pending.split(sep)
                yield from records
            if pending:
                yield pending  # a last record without terminator
            returncode = proc.wait()
            finished = True
            if returncode != 0:
                err.seek(0)
                raise _fail(args, _Result(returncode, b"", err.read(64 * 1024)))
        finally:
            if not finished:  # the consumer stopped early, or we failed: don't leak git
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


class TreeEntry(NamedTuple):
    """One ``ls-tree`` line: octal ``mode`` as int, ``type`` (blob/tree/commit), ``oid``,
    ``size`` (None for trees and submodules), ``path`` relative to the repository root."""

    mode: int
    type: str
    oid: str
    size: int | None
    path: bytes


def _parse_tree_entry(record: bytes) -> TreeEntry:
    header, tab, path = record.partition(b"\t")
    fields = header.split()
    if not tab or len(fields) != 4 or not path:
        raise GitError(f"unexpected ls-tree output {record[:200]!r}")
    mode, kind, oid, size = fields
    try:
        return TreeEntry(
            int(mode, 8),
            kind.decode("ascii"),
            oid.decode("ascii"),
            None if size == b"-" else int(size),
            path,
        )
    except ValueError:
        raise GitError(f"unexpected ls-tree output {record[:200]!r}") from None


def iter_ls_tree(
    cwd: PathArg,
    treeish: str,
    paths: Sequence[bytes | str] = (),
    *,
    recursive: bool = True,
) -> Iterator[TreeEntry]:
    """Stream the entries of ``treeish`` (recursively by default), paths as bytes."""
    _no_option(treeish, "tree-ish")
    args: list[GitArg] = ["ls-tree", "-z", "--long", "--full-tree"]
    if recursive:
        args.append("-r")
    args += [treeish, "--", *paths]
    for record in _stream_records(args, cwd, b"\0"):
        yield _parse_tree_entry(record)


def ls_tree(
    cwd: PathArg,
    treeish: str,
    paths: Sequence[bytes | str] = (),
    *,
    recursive: bool = True,
) -> list[TreeEntry]:
    """All entries of ``treeish``; see :func:`iter_ls_tree` for the streamed form."""
    return list(iter_ls_tree(cwd, treeish, paths, recursive=recursive))


class RevListObject(NamedTuple):
    """An object reachable from the listed revisions; ``path`` is None for commits.

    git cuts a path at its first newline here (rev-list has no ``-z`` in older gits), so
    treat ``path`` as a hint for messages, not as an exact name.
    """

    oid: str
    path: bytes | None


def _rev_list_args(
    revs: Sequence[str], exclude: Sequence[str], exclude_remote: str | None
) -> list[GitArg]:
    if not revs:
        raise GitError("rev-list needs at least one revision")
    args: list[GitArg] = ["rev-list", "--objects"]
    args += [_no_option(r, "revision") for r in revs]
    if exclude or exclude_remote is not None:
        args.append("--not")
        args += [_no_option(r, "revision") for r in exclude]
        if exclude_remote is not None:
            args.append(f"--remotes={_no_option(exclude_remote, 'remote name')}")
    return args


def rev_list_objects(
    cwd: PathArg,
    revs: Sequence[str],
    exclude: Sequence[str] = (),
    exclude_remote: str | None = None,
) -> Iterator[RevListObject]:
    """Objects reachable from ``revs`` but not from ``exclude`` nor ``refs/remotes/<remote>/*``.

    This is the pre-push question "what would this push send that the remote does not
    already have": ``git rev-list --objects <revs> --not <exclude> --remotes=<remote>``.
    """
    for record in _stream_records(_rev_list_args(revs, exclude, exclude_remote), cwd, b"\n"):
        oid, sep, path = record.partition(b" ")
        yield RevListObject(oid.decode("ascii"), path if sep else None)


class BlobInfo(NamedTuple):
    """A blob small enough to be a pointer: its id, size and (hint) path."""

    oid: str
    size: int
    path: bytes


def small_blobs(
    cwd: PathArg,
    revs: Sequence[str],
    exclude: Sequence[str] = (),
    exclude_remote: str | None = None,
    max_size: int = MAX_POINTER_SIZE,
) -> Iterator[BlobInfo]:
    """Blobs from :func:`rev_list_objects` whose size is at most ``max_size``.

    Only these can be pointer files, so a pre-push scan reads just them. rev-list's output
    is piped straight into ``cat-file --batch-check`` (no Python in between), so even a
    history with millions of objects costs one pass and flat memory.
    """
    args = _rev_list_args(revs, exclude, exclude_remote)
    with tempfile.TemporaryFile() as err:
        try:
            producer = subprocess.Popen(
                ["git", *args],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        except OSError as exc:
            raise _spawn_error(args, exc) from exc
        done = False
        check = ["cat-file", "--batch-check=%(objectname) %(objecttype) %(objectsize) %(rest)"]
        assert producer.stdout is not None
        records = _stream_records(check, cwd, b"\n", stdin=producer.stdout)
        try:
            for record in records:
                fields = record.split(b" ", 3)
                if len(fields) < 3 or fields[1] == b"missing":
                    raise GitError(f"unexpected cat-file output {record[:200]!r}")
                if fields[1] != b"blob":
                    continue
                size = int(fields[2])
                if size <= max_size:
                    path = fields[3] if len(fields) == 4 else b""
                    yield BlobInfo(fields[0].decode("ascii"), size, path)
            returncode = producer.wait()
            done = True
            if returncode != 0:
                err.seek(0)
                raise _fail(args, _Result(returncode, b"", err.read(64 * 1024)))
        finally:
            records.close()  # stops cat-file now, not whenever the generator is collected
            if not done:
                producer.kill()
                producer.wait()
            producer.stdout.close()


# ---- cat-file --batch ---------------------------------------------------------------------


class ObjectInfo(NamedTuple):
    """What ``cat-file --batch-check`` says about an object."""

    oid: str
    type: str
    size: int


class _BatchProcess:
    """One long-lived ``git cat-file --batch[-check]`` with stderr kept in a temp file."""

    def __init__(self, cwd: PathArg, mode: str) -> None:
        # Lives as long as the process; closed in close().
        self._err = tempfile.TemporaryFile()  # noqa: SIM115
        self._args = ["cat-file", mode]
        try:
            self.proc = subprocess.Popen(
                ["git", *self._args],
                cwd=cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._err,
            )
        except OSError as exc:
            self._err.close()
            raise _spawn_error(self._args, exc) from exc
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[bytes] = self.proc.stdin
        self.stdout: IO[bytes] = self.proc.stdout

    def died(self) -> GitError:
        self.proc.poll()
        self._err.seek(0)
        stderr = self._err.read(64 * 1024)
        code = self.proc.returncode
        return GitCommandError(self._args, -1 if code is None else code, _first_line(stderr))

    def ask(self, name: str) -> ObjectInfo | None:
        """Send one request; parse the header. ``None`` when git says missing/ambiguous."""
        try:
            encoded = name.encode("utf-8", "surrogateescape")
            self.stdin.write(encoded + b"\n")
            self.stdin.flush()
            # "<name> missing" echoes the name, so allow for it; otherwise bounded.
            header = self.stdout.readline(len(encoded) + 128)
        except (BrokenPipeError, ValueError):
            raise self.died() from None
        if not header.endswith(b"\n"):
            raise self.died()
        fields = header[:-1].split(b" ")
        if len(fields) == 2 and fields[1] in (b"missing", b"ambiguous"):
            return None
        if len(fields) != 3 or not fields[2].isdigit():
            raise GitError(f"unexpected cat-file output {header[:200]!r}")
        return ObjectInfo(fields[0].decode("ascii"), fields[1].decode("ascii"), int(fields[2]))

    def read_exact(self, n: int) -> bytes:
        data = self.stdout.read(n)
        if len(data) != n:
            raise self.died()
        return data

    def skip(self, n: int) -> None:
        while n > 0:
            n -= len(self.read_exact(min(n, _READ_CHUNK)))

    def close(self) -> None:
        try:
            self.stdin.close()
        except OSError:  # git already gone
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stdout.close()
        self._err.close()


def _check_name(name: str) -> None:
    if not name or "\n" in name or "\0" in name:
        raise GitError(f"invalid object name {name!r}")


class CatFileStream(io.RawIOBase):
    """The content of one object, read straight from ``cat-file --batch``.

    Close it (or use ``with``) before the next :class:`CatFile` request; closing skips what
    was not read, so the batch stays in step.
    """

    def __init__(self, owner: CatFile, batch: _BatchProcess, info: ObjectInfo) -> None:
        super().__init__()
        self._owner = owner
        self._batch = batch
        self.info = info
        self._left = info.size

    @property
    def oid(self) -> str:
        return self.info.oid

    @property
    def type(self) -> str:
        return self.info.type

    @property
    def size(self) -> int:
        return self.info.size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        n = min(view.nbytes, self._left)
        if n == 0:
            return 0
        data = self._batch.read_exact(n)
        view[:n] = data
        self._left -= n
        return n

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._batch.skip(self._left)
            self._left = 0
            if self._batch.read_exact(1) != b"\n":
                raise GitError("cat-file content is not followed by LF")
        finally:
            super().close()
            self._owner._release()


class CatFile:
    """A long-lived ``git cat-file --batch`` (and ``--batch-check``) for one repository.

    Use as a context manager. Requests are serialized by a lock; an open stream holds it
    until closed. Object names may be anything ``cat-file`` accepts (ids, ``rev:path``).
    """

    def __init__(self, cwd: PathArg) -> None:
        self._cwd = cwd
        self._lock = threading.Lock()
        self._streaming_thread: int | None = None
        self._batch: _BatchProcess | None = None
        self._check: _BatchProcess | None = None

    def __enter__(self) -> CatFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _get_batch(self) -> _BatchProcess:
        if self._batch is None:
            self._batch = _BatchProcess(self._cwd, "--batch")
        return self._batch

    def _acquire(self) -> None:
        if self._streaming_thread == threading.get_ident():
            # Waiting would dead-lock: this very thread holds the open stream.
            raise GitError("a CatFile stream is still open; close it before the next request")
        self._lock.acquire()

    def _release(self) -> None:
        self._streaming_thread = None
        self._lock.release()

    def info(self, name: str) -> ObjectInfo:
        """Type and size of an object, without reading it.

        Raises:
            GitObjectNotFoundError: no such object.
        """
        _check_name(name)
        self._acquire()
        try:
            if self._check is None:
                self._check = _BatchProcess(self._cwd, "--batch-check")
            info = self._check.ask(name)
        finally:
            self._lock.release()
        if info is None:
            raise GitObjectNotFoundError(name)
        return info

    def read(self, name: str, max_size: int | None = None) -> tuple[str, bytes]:
        """Return ``(type, content)`` of an object.

        Args:
            max_size: refuse objects bigger than this (the content is skipped, not loaded).

        Raises:
            GitObjectNotFoundError: no such object.
            GitError: the object is bigger than ``max_size``.
        """
        with self.stream(name) as stream:
            if max_size is not None and stream.size > max_size:
                raise GitError(f"object {name} has {stream.size} bytes, over {max_size}")
            return stream.type, stream.read(stream.size) if stream.size else b""

    def stream(self, name: str) -> CatFileStream:
        """Open an object for streaming reads (for big blobs); close it when done.

        Raises:
            GitObjectNotFoundError: no such object.
        """
        _check_name(name)
        self._acquire()
        try:
            batch = self._get_batch()
            info = batch.ask(name)
            if info is None:
                raise GitObjectNotFoundError(name)
            stream = CatFileStream(self, batch, info)
        except BaseException:
            self._lock.release()
            raise
        self._streaming_thread = threading.get_ident()
        return stream

    def close(self) -> None:
        """Stop the git processes."""
        for proc in (self._batch, self._check):
            if proc is not None:
                proc.close()
        self._batch = self._check = None


# ---- config -------------------------------------------------------------------------------


def _scope_args(scope: Scope | None) -> list[GitArg]:
    if scope is None:
        return []
    if scope not in ("local", "global", "system"):
        raise GitError(f"unknown config scope {scope!r}")
    return [f"--{scope}"]


def _config_key(key: str) -> str:
    return _no_option(key, "config key")


def config_get(cwd: PathArg | None, key: str, scope: Scope | None = None) -> str | None:
    """The value of ``key`` (the last one if multi-valued), or None if unset."""
    values = config_get_all(cwd, key, scope)
    return values[-1] if values else None


def config_get_all(cwd: PathArg | None, key: str, scope: Scope | None = None) -> list[str]:
    """Every value of ``key`` in order; empty if unset."""
    args = ["config", *_scope_args(scope), "-z", "--get-all", _config_key(key)]
    result = _run(args, cwd, None)
    if result.returncode == 1:
        return []
    if result.returncode != 0:
        raise _fail(args, result)
    return [v.decode("utf-8", "surrogateescape") for v in result.stdout.split(b"\0")[:-1]]


def config_get_regexp(
    cwd: PathArg | None, pattern: str, scope: Scope | None = None
) -> list[tuple[str, str]]:
    """``(key, value)`` pairs whose key matches the regular expression ``pattern``."""
    args = ["config", *_scope_args(scope), "-z", "--get-regexp", _no_option(pattern, "pattern")]
    result = _run(args, cwd, None)
    if result.returncode == 1:
        return []
    if result.returncode != 0:
        raise _fail(args, result)
    pairs: list[tuple[str, str]] = []
    for record in result.stdout.split(b"\0")[:-1]:
        key, _, value = record.partition(b"\n")
        pairs.append(
            (key.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        )
    return pairs


def config_set(cwd: PathArg | None, key: str, value: str, scope: Scope = "local") -> None:
    """Set ``key`` to ``value``, replacing a single existing value."""
    run_git(["config", *_scope_args(scope), _config_key(key), value], cwd)


def config_add(cwd: PathArg | None, key: str, value: str, scope: Scope = "local") -> None:
    """Add one more value to a multi-valued ``key``."""
    run_git(["config", *_scope_args(scope), "--add", _config_key(key), value], cwd)


def config_unset(cwd: PathArg | None, key: str, scope: Scope = "local") -> bool:
    """Remove every value of ``key``; False if it was not set."""
    args = ["config", *_scope_args(scope), "--unset-all", _config_key(key)]
    result = _run(args, cwd, None)
    if result.returncode == 5:  # git: "you try to unset an option which does not exist"
        return False
    if result.returncode != 0:
        raise _fail(args, result)
    return True


def config_remove_empty_section(cwd: PathArg | None, section: str, scope: Scope = "local") -> bool:
    """Drop a left-over empty ``[section]`` header (e.g. ``filter.xet``).

    Recent gits drop the header themselves when its last key goes; older ones leave it.
    Returns False, touching nothing, if the section still holds keys.
    """
    escaped = section.replace(".", r"\.")
    if config_get_regexp(cwd, f"^{escaped}\\.", scope):
        return False
    args = ["config", *_scope_args(scope), "--remove-section", _no_option(section, "section")]
    _run(args, cwd, None)  # fails harmlessly when there is no such header
    return True


# ---- remotes ------------------------------------------------------------------------------


def list_remotes(cwd: PathArg) -> list[str]:
    """Names of the configured remotes."""
    return run_git(["remote"], cwd).decode("utf-8", "surrogateescape").split()


def remote_url(cwd: PathArg, name: str) -> str | None:
    """The fetch URL of remote ``name`` (with ``insteadOf`` applied), or None if unknown."""
    args = ["remote", "get-url", _no_option(name, "remote name")]
    result = _run(args, cwd, None)
    if result.returncode != 0:
        if name not in list_remotes(cwd):
            return None
        raise _fail(args, result)
    return _one_line(result.stdout).decode("utf-8", "surrogateescape")
