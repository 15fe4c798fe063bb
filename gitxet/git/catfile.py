"""Reading objects through long-lived ``git cat-file`` processes.

:class:`CatFile` keeps one ``--batch`` (content) and one ``--batch-check`` (type and size)
process per repository, so reading many small objects costs no process start each.
:func:`batch_check` answers a long list of names through a single process. Object names may
be anything ``cat-file`` accepts (ids, ``rev:path``) but no newline.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, NamedTuple, cast

from gitxet.errors import GitError, GitObjectNotFoundError
from gitxet.git._runner import READ_CHUNK, PathArg, PipedGit, Result, fail, spawn_error

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["CatFile", "CatFileStream", "Describer", "ObjectInfo", "batch_check", "batch_read"]


class ObjectInfo(NamedTuple):
    """What ``cat-file --batch-check`` says about an object."""

    oid: str
    type: str
    size: int


def batch_check(cwd: PathArg, names: Iterable[str]) -> Iterator[tuple[str, ObjectInfo | None]]:
    """``(name, info)`` for each object name, in order; ``info`` is None if it is missing.

    One ``cat-file --batch-check`` for any number of names: a thread feeds the names while
    answers are read, so neither side waits on the other and memory stays flat.
    """
    for name, info, _ in _batch(cwd, names, "--batch-check", 0):
        yield name, info


def batch_read(
    cwd: PathArg, names: Iterable[str], max_size: int
) -> Iterator[tuple[str, ObjectInfo | None, bytes | None]]:
    """``(name, info, content)`` for each object name, in order, through one pipelined
    ``cat-file --batch``; ``content`` is None for an object over ``max_size`` bytes (read
    past, not kept) and ``info`` is None for a missing one. For many small objects (pointer
    blobs): no round trip per object."""
    yield from _batch(cwd, names, "--batch", max_size)


def _batch(
    cwd: PathArg, names: Iterable[str], mode: str, max_size: int
) -> Iterator[tuple[str, ObjectInfo | None, bytes | None]]:
    args = ["cat-file", mode]
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                ["git", *args], cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err
            )
        except OSError as exc:
            raise spawn_error(args, exc) from exc
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout
        queue: deque[str] = deque()
        lock = threading.Lock()
        feed_error: list[BaseException] = []

        def feed() -> None:
            try:
                for name in names:
                    _check_name(name)
                    with lock:
                        queue.append(name)
                    stdin.write(name.encode("utf-8", "surrogateescape") + b"\n")
            except BrokenPipeError:
                pass  # git went away; the reader reports why
            except BaseException as exc:
                feed_error.append(exc)
            finally:
                with contextlib.suppress(OSError):
                    stdin.close()

        feeder = threading.Thread(target=feed, name="gitxet-batch", daemon=True)
        feeder.start()
        finished = False
        try:
            for line in stdout:
                with lock:
                    name = queue.popleft() if queue else None
                if name is None or not line.endswith(b"\n"):
                    raise GitError(f"unexpected cat-file output {line[:200]!r}")
                fields = line[:-1].split(b" ")
                if len(fields) >= 2 and fields[-1] in (b"missing", b"ambiguous"):
                    yield name, None, None
                    continue
                if len(fields) != 3 or not fields[2].isdigit():
                    raise GitError(f"unexpected cat-file output {line[:200]!r}")
                info = ObjectInfo(fields[0].decode("ascii"), fields[1].decode(), int(fields[2]))
                content: bytes | None = None
                if mode == "--batch":
                    content = _read_content(stdout, info.size, max_size)
                yield name, info, content
            feeder.join()
            returncode = proc.wait()
            finished = True
            if feed_error:
                raise feed_error[0]
            if returncode != 0:
                err.seek(0)
                raise fail(args, Result(returncode, b"", err.read(64 * 1024)))
        finally:
            if not finished:
                proc.kill()
                proc.wait()
                feeder.join(timeout=10)
            stdout.close()


def _read_content(stdout: IO[bytes], size: int, max_size: int) -> bytes | None:
    """An object's content and its trailing newline; None (skipped) when over max_size."""
    keep = size <= max_size
    parts: list[bytes] = []
    left = size + 1
    while left:
        b = stdout.read(min(left, 1 << 20))
        if not b:
            raise GitError("cat-file output ended inside an object")
        if keep:
            parts.append(b)
        left -= len(b)
    if not keep:
        return None
    data = b"".join(parts)
    if data[-1:] != b"\n":
        raise GitError("cat-file output lost its framing")
    return data[:-1]


class _Answers:
    """The unread answers of one ``--batch-command`` exchange: ``buf[pos:]``, filled from
    the pipe in big blocks (``read1``)."""

    __slots__ = ("_proc", "_reader", "buf", "pos")

    def __init__(self, proc: _BatchProcess) -> None:
        self._proc = proc
        self._reader = cast(io.BufferedReader, proc.stdout)  # a pipe, default buffering
        self.buf = b""
        self.pos = 0

    def more(self, need: int) -> None:
        """Make ``buf[pos:]`` hold at least ``need`` bytes (``need`` < 0: one more block, a
        header's newline is not there yet)."""
        rest = self.buf[self.pos :]
        pieces = [rest]
        have = len(rest)
        while True:
            try:
                block = self._reader.read1(max(need - have, 1 << 16))
            except ValueError:
                raise self._proc.died() from None
            if not block:
                raise self._proc.died()
            pieces.append(block)
            have += len(block)
            if need < 0 or have >= need:
                break
        self.buf, self.pos = b"".join(pieces), 0


class _BatchProcess(PipedGit):
    """One long-lived ``git cat-file --batch[-check]``."""

    def __init__(self, cwd: PathArg, mode: str, *, buffer: bool = False) -> None:
        super().__init__(["cat-file", mode, *(["--buffer"] if buffer else [])], cwd)

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

    def _exchange(
        self, command: str, names: Sequence[str], answer: Callable[[_Answers, int, int], None]
    ) -> None:
        """``--batch-command`` with the format ``%(objecttype) %(objectsize)``: ``command``
        (``info`` or ``contents``) for each name, a window at a time, each window ended by
        ``flush``, the next window sent before the answers to the last are read (so git
        works while we parse). ``answer(answers, start, stop)`` parses the answers to
        ``names[start:stop]``."""
        prefix = command + " "
        joint = "\n" + prefix
        bounds = [(i, min(i + _WINDOW, len(names))) for i in range(0, len(names), _WINDOW)]

        def send(start: int, stop: int) -> None:
            # one encode per window, no bytes object per name
            text = prefix + joint.join(names[start:stop]) + "\nflush\n"
            try:
                self.stdin.write(text.encode("ascii"))
                self.stdin.flush()
            except (BrokenPipeError, ValueError):
                raise self.died() from None

        # at most two windows (~50 KB of commands) are ever unread by git: our writes
        # never block on a full pipe while git waits for us to read. Answers are parsed
        # out of big blocks (``read1``), not read one header and one object at a time:
        # a listing asks this about every file of every directory.
        answers = _Answers(self)
        if bounds:
            send(*bounds[0])
        for w, (start, stop) in enumerate(bounds):
            if w + 1 < len(bounds):
                send(*bounds[w + 1])
            answer(answers, start, stop)
        if answers.pos != len(answers.buf):
            raise GitError("cat-file answered more than it was asked")

    def sizes(self, names: Sequence[str], kind: str) -> list[int]:
        """``info`` of every name: its size, or -1 when it is missing or not a ``kind``."""
        out: list[int] = []
        tag = kind.encode("ascii") + b" "
        joint = b"\n" + tag
        kinds: dict[bytes, str] = {}

        def answer(answers: _Answers, start: int, stop: int) -> None:
            n = stop - start
            while answers.buf.count(b"\n", answers.pos) < n:  # every answer is one line
                if len(answers.buf) - answers.pos > n * 128:
                    raise self.died()
                answers.more(-1)
            buf, pos = answers.buf, answers.pos
            end = pos
            for _ in range(n):  # (C-speed scans; no object per answer)
                end = buf.index(b"\n", end) + 1
            answers.pos = end
            block = buf[pos:end]
            if block.startswith(tag) and block.count(tag) == n:
                # all of kind ``kind`` (a tag can start a line only): split in C
                out.extend(map(int, block[len(tag) : -1].split(joint)))
                return
            for header in block[:-1].split(b"\n"):
                found, size, _ = self._info(header, kinds)
                out.append(size if found == kind else -1)

        self._exchange("info", names, answer)
        return out

    def contents(self, names: Sequence[str], kind: str, sizes: Sequence[int]) -> list[bytes | None]:
        """``contents`` of every name (``sizes``: what :meth:`sizes` said, so each answer's
        header is known before it is read); None when it is missing or not a ``kind``."""
        out: list[bytes | None] = []
        kinds: dict[bytes, str] = {}
        tag = kind.encode("ascii") + b" "

        def answer(answers: _Answers, start: int, stop: int) -> None:
            more = answers.more
            heads = [b"%s%d\n" % (tag, size) for size in sizes[start:stop]]
            buf, pos = answers.buf, answers.pos
            for i, head in enumerate(heads, start):
                end = pos + len(head) + sizes[i]
                if end < len(buf) and buf[end] == 10 and buf.startswith(head, pos):
                    out.append(buf[end - sizes[i] : end])  # (all in the buffer: the common case)
                    pos = end + 1
                    continue
                answers.pos = pos
                if len(buf) - pos < len(head):
                    more(len(head))  # (any answer's first line is at least this long)
                    buf, pos = answers.buf, answers.pos
                if buf.startswith(head, pos):
                    size, keep = sizes[i], True
                    pos += len(head)
                else:  # not what the sizes said: read the header line
                    nl = buf.find(b"\n", pos)
                    while nl < 0:
                        if len(buf) - pos > len(names[i]) + 64:
                            raise self.died()
                        more(-1)
                        buf, pos = answers.buf, answers.pos
                        nl = buf.find(b"\n", pos)
                    found, size, _ = self._info(buf[pos:nl], kinds)
                    pos = nl + 1
                    if found is None:
                        out.append(None)
                        continue
                    keep = found == kind  # another type: read past it
                if len(buf) - pos < size + 1:
                    answers.pos = pos
                    more(size + 1)
                    buf, pos = answers.buf, answers.pos
                if buf[pos + size : pos + size + 1] != b"\n":
                    raise GitError("cat-file output lost its framing")
                out.append(buf[pos : pos + size] if keep else None)
                pos += size + 1
            answers.pos = pos

        self._exchange("contents", names, answer)
        return out

    @staticmethod
    def _info(header: bytes, kinds: dict[bytes, str]) -> tuple[str | None, int, None]:
        """``(type, size, None)`` of an answer's header line; ``(None, 0, None)`` when git
        says missing. ``kinds`` remembers the decoded type names."""
        kind, _, size_text = header.partition(b" ")
        if size_text in (b"missing", b"ambiguous"):
            return None, 0, None
        if not size_text.isdigit():
            raise GitError(f"unexpected cat-file output {header[:200]!r}")
        name = kinds.get(kind)
        if name is None:
            name = kinds[kind] = kind.decode("ascii", errors="replace")
        return name, int(size_text), None

    def read_exact(self, n: int) -> bytes:
        data = self.stdout.read(n)
        if len(data) != n:
            raise self.died()
        return data

    def skip(self, n: int) -> None:
        while n > 0:
            n -= len(self.read_exact(min(n, READ_CHUNK)))


#: requests written before their answers are read (~50-byte commands: ~25 KB, below a pipe's
#: 64 KiB, so git never waits on us reading while we wait on it reading)
_WINDOW = 512


class Describer:
    """Sizes of many objects, and the content of the small ones asked for, from one
    long-lived ``git cat-file --batch-command --buffer`` (git 2.36+): commands go out a
    window at a time with one ``flush`` each, so there is no round trip per object and git
    writes its answers in big blocks. Thread-safe (one exchange at a time)."""

    def __init__(self, cwd: PathArg) -> None:
        self._cwd = cwd
        self._lock = threading.Lock()
        self._proc: _BatchProcess | None = None
        self._closed = False

    def describe(
        self, names: Sequence[str], kind: str, small: tuple[int, int]
    ) -> tuple[list[int], dict[int, bytes]]:
        """The size of every name (-1: missing, or not of type ``kind``), and the content
        of those whose size is within ``small`` (inclusive; keep it small: they are held in
        memory), by index into ``names``.

        Raises:
            GitError: git failed, or is too old for ``--batch-command``.
        """
        _check_names(names)
        lo, hi = small
        with self._lock:
            if self._closed:
                raise GitError("cat-file was closed")
            if self._proc is None:
                self._proc = _BatchProcess(
                    self._cwd, "--batch-command=%(objecttype) %(objectsize)", buffer=True
                )
            proc = self._proc
            sizes = proc.sizes(names, kind)
            wanted = [i for i, size in enumerate(sizes) if lo <= size <= hi]
            contents: dict[int, bytes] = {}
            if wanted:
                got = proc.contents([names[i] for i in wanted], kind, [sizes[i] for i in wanted])
                for i, data in zip(wanted, got, strict=True):
                    if data is None:
                        sizes[i] = -1
                    else:
                        contents[i] = data
            return sizes, contents

    def close(self) -> None:
        with self._lock:
            self._closed = True
            proc, self._proc = self._proc, None
        if proc is not None:
            proc.close()


def _check_name(name: str) -> None:
    if not name or "\n" in name or "\0" in name:
        raise GitError(f"invalid object name {name!r}")


def _check_names(names: Sequence[str]) -> None:
    """:func:`_check_name` of many names, in C unless one is bad."""
    text = "\n".join(names)
    if "\0" in text or text.count("\n") != max(len(names) - 1, 0) or not all(names):
        for name in names:
            _check_name(name)


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
