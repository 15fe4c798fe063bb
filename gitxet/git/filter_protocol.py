"""Server side of git's long-running filter process protocol (``gitattributes(5)``).

git starts ``filter.<driver>.process`` once per command and talks pkt-lines over its stdin
and stdout: a handshake, a capability negotiation, then one request per file. This module
owns only that conversation. What clean and smudge *do* is a :class:`FilterHandler`'s job,
and the handler sees plain binary streams, never packets.

Design choices, all about never giving git a half-truth:

* **Input streams, output spools.** The handler reads its input straight off the pipe
  (bounded memory, so a multi-GB ``git add`` is fine), but writes into a spool (in memory up
  to a cap, then an unnamed temp file). Only when the handler has returned is the result
  sent. A handler that fails halfway therefore yields ``status=error`` rather than a
  truncated file that git would happily store or check out.
* **Handler failures are per file.** Any ``Exception`` from the handler becomes
  ``status=error`` for that path and the loop goes on; :class:`~gitxet.errors.FilterAbortError`
  becomes ``status=abort`` (git stops sending that command). Only a broken pipe or broken
  framing ends the server, because then the conversation itself is lost.
* **Delay.** When git allows it (``can-delay=1``, only sent for checkouts) and the handler
  agrees, the request is answered ``status=delayed`` at once and run on a small thread pool.
  ``list_available_blobs`` blocks until at least one delayed path is ready, and git then asks
  for each path again with empty content. The number of delayed paths is capped, and so is
  the memory each one may hold; requests beyond the cap are simply served inline. A
  handler with a ``delayed(pathname, head, meta)`` method is told of each request it
  delayed (``head``: the first :data:`DELAYED_HEAD` bytes of its content) before it runs,
  so it can prepare the batch (gitxet asks a server for many files' descriptions at once).
* **Head start.** A handler with a ``starting(command, pathname)`` method is told of each
  clean or smudge request before its content is read, so it can start work that does not
  need the content (gitxet asks git for the path's attributes) while git sends it. Only a
  hint: its failures are ignored.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import io
import re
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, BinaryIO, Protocol, cast

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

from gitxet.errors import FilterAbortError, FilterProtocolError
from gitxet.git.pktline import (
    MAX_PAYLOAD,
    PktReader,
    PktWriter,
    read_until_flush,
    write_flush,
    write_text_list,
)

__all__ = [
    "CAPABILITIES",
    "NO_META",
    "FilterHandler",
    "FilterOptions",
    "FilterServer",
    "OnError",
    "SmudgeMeta",
    "serve",
]

#: Capabilities this server knows, in the order git documents them.
CAPABILITIES = ("clean", "smudge", "delay")
_FILTER_COMMANDS = ("clean", "smudge")
_OBJECT_ID = re.compile(rb"[0-9a-f]{40}|[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class SmudgeMeta:
    """What git says about a smudge's checkout (git >= 2.27), each part when it knows it:
    the ref being checked out (``refs/remotes/upstream/main``), the commit or tree
    (``treeish``), and the blob id. Handlers may use it to find where the data came from."""

    ref: str | None = None
    treeish: str | None = None
    blob: str | None = None


NO_META = SmudgeMeta()


class FilterHandler(Protocol):
    """What the filter server calls. Paths are git's (repository-relative, ``/``-separated).

    ``pathname`` is decoded as UTF-8 with ``surrogateescape`` (``os.fsencode`` gives the
    exact bytes back). ``src`` ends at the end of the file's content; ``dst`` receives the
    result. When delay is used, ``smudge``/``clean`` run on worker threads, so a handler that
    returns True from ``can_delay`` must be thread-safe.
    """

    def clean(self, pathname: str, src: BinaryIO, dst: BinaryIO) -> None:
        """Turn working-tree content into what git stores."""
        ...

    def smudge(
        self, pathname: str, src: BinaryIO, dst: BinaryIO, meta: SmudgeMeta = NO_META
    ) -> None:
        """Turn what git stores into working-tree content."""
        ...

    def can_delay(self, pathname: str) -> bool:
        """Whether this path may be filtered later, in the background."""
        ...


#: Bytes of a delayed request's content a handler's ``delayed`` hook is shown (a pointer
#: is at most 1,024).
DELAYED_HEAD = 1024

#: ``on_error(command, pathname, exc)``: told about every handler failure (from any thread).
OnError = Callable[[str, str, BaseException], None]


@dataclass(frozen=True)
class FilterOptions:
    """Tuning knobs. Defaults keep memory to a few tens of MiB whatever git sends."""

    #: Capabilities to offer (intersected with what git offers).
    capabilities: frozenset[str] = frozenset(CAPABILITIES)
    #: Threads running delayed requests.
    workers: int = 4
    #: Most delayed requests outstanding at once; more are served inline.
    max_delayed: int = 128
    #: Output held in memory before a spool spills to disk (inline requests).
    spool_memory: int = 8 * 1024 * 1024
    #: Same, for each delayed request (there may be ``max_delayed`` of them).
    delayed_spool_memory: int = 64 * 1024
    #: Delayed requests must have input at most this big; bigger ones are served inline.
    delayed_input_limit: int = 64 * 1024
    #: Directory for spilled spools (None: the system temp directory).
    spool_dir: str | None = None
    #: Inline requests whose whole input fits in this many bytes stream their output to git
    #: as it is produced (no spool). An error after content started is reported with a
    #: trailing ``status=error``, which makes git discard what it got. 0 disables this.
    stream_input_limit: int = 64 * 1024

    def __post_init__(self) -> None:
        unknown = set(self.capabilities) - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"unknown filter capabilities: {sorted(unknown)}")
        if self.workers < 1 or self.max_delayed < 0:
            raise ValueError("workers must be >= 1 and max_delayed >= 0")
        if min(self.spool_memory, self.delayed_spool_memory, self.delayed_input_limit) < 0:
            raise ValueError("spool sizes must be >= 0")


class _Outcome(enum.Enum):
    SUCCESS = "success"
    ERROR = "error"
    ABORT = "abort"
    DELAYED = "delayed"


@dataclass(frozen=True)
class _Request:
    command: str
    pathname: bytes
    can_delay: bool
    meta: SmudgeMeta = NO_META


@dataclass(eq=False)
class _Delayed:
    command: str
    pathname: bytes
    src: IO[bytes]
    meta: SmudgeMeta = NO_META
    done: bool = False
    listed: bool = False
    outcome: _Outcome = _Outcome.ERROR
    result: IO[bytes] | None = None


def _decode_path(path: bytes) -> str:
    return path.decode("utf-8", "surrogateescape")


class FilterServer:
    """One filter-process conversation between git (``inp``/``out``) and a handler.

    Call :meth:`serve` (or :func:`serve`). It returns when git closes the pipe between
    requests and raises :class:`~gitxet.errors.PktLineError` or
    :class:`~gitxet.errors.FilterProtocolError` if the conversation breaks.
    """

    def __init__(
        self,
        handler: FilterHandler,
        inp: BinaryIO,
        out: BinaryIO,
        options: FilterOptions | None = None,
        on_error: OnError | None = None,
    ) -> None:
        self._handler = handler
        self._inp = inp
        self._out = out
        self._opts = options or FilterOptions()
        self._on_error = on_error
        self._caps: frozenset[str] = frozenset()
        self._aborted: set[str] = set()
        self._delayed: dict[bytes, _Delayed] = {}
        self._cond = threading.Condition()
        self._pool: ThreadPoolExecutor | None = None

    @property
    def capabilities(self) -> frozenset[str]:
        """Capabilities agreed with git (empty before the handshake)."""
        return self._caps

    # ---- conversation -------------------------------------------------------------------

    def serve(self) -> None:
        """Handshake, then answer requests until git hangs up; always cleans up."""
        try:
            self.handshake()
            while self.serve_one():
                pass
        finally:
            self.close()

    def handshake(self) -> None:
        """Version and capability negotiation."""
        welcome = read_until_flush(self._inp)
        assert welcome is not None
        if not welcome or welcome[0] != b"git-filter-client":
            raise FilterProtocolError(f"expected git-filter-client, got {welcome[:1]!r}")
        versions = welcome[1:]
        for line in versions:
            if not line.startswith(b"version="):
                raise FilterProtocolError(f"unexpected line in handshake: {line!r}")
        if b"version=2" not in versions:
            raise FilterProtocolError(f"git offers no supported version: {versions!r}")
        write_text_list(self._out, ["git-filter-server", "version=2"])
        self._out.flush()

        offered = read_until_flush(self._inp)
        assert offered is not None
        names: set[str] = set()
        for line in offered:
            key, sep, value = line.partition(b"=")
            if key != b"capability" or not sep:
                raise FilterProtocolError(f"unexpected line in capabilities: {line!r}")
            names.add(value.decode("utf-8", "replace"))
        agreed = [c for c in CAPABILITIES if c in names and c in self._opts.capabilities]
        self._caps = frozenset(agreed)
        write_text_list(self._out, [f"capability={c}" for c in agreed])
        self._out.flush()

    def serve_one(self) -> bool:
        """Answer one request; False when git closed the pipe between requests."""
        header = read_until_flush(self._inp, eof_ok=True)
        if header is None:
            return False
        if not header:
            raise FilterProtocolError("empty request header")
        key, _, command_b = header[0].partition(b"=")
        if key != b"command":
            raise FilterProtocolError(f"request does not start with command=: {header[0]!r}")
        command = command_b.decode("utf-8", "replace")
        if command == "list_available_blobs":
            self._list_available()
        elif command in _FILTER_COMMANDS:
            self._filter(self._parse_request(command, header[1:]))
        else:
            # git never sends commands it did not negotiate; those that exist carry no content
            # besides clean/smudge, so answering without reading keeps us in step.
            self._send_status(_Outcome.ERROR)
        return True

    @staticmethod
    def _parse_request(command: str, lines: list[bytes]) -> _Request:
        pathname: bytes | None = None
        can_delay = False
        meta: dict[str, str] = {}
        for line in lines:
            key, sep, value = line.partition(b"=")
            if not sep:
                raise FilterProtocolError(f"malformed request line {line!r}")
            if key == b"pathname":
                if pathname is not None:
                    raise FilterProtocolError("request has two pathname lines")
                pathname = value
            elif key == b"can-delay":
                can_delay = value == b"1"
            elif key in (b"treeish", b"blob") and _OBJECT_ID.fullmatch(value):
                meta[key.decode()] = value.decode("ascii")  # where a checkout comes from
            elif key == b"ref" and value.startswith(b"refs/"):
                meta["ref"] = value.decode("utf-8", "surrogateescape")
            # anything else (malformed values, future keys) is informational: ignored
        if not pathname:
            raise FilterProtocolError(f"{command} request without a pathname")
        return _Request(command, pathname, can_delay, SmudgeMeta(**meta) if meta else NO_META)

    # ---- clean / smudge -------------------------------------------------------------------

    def _filter(self, req: _Request) -> None:
        reader = PktReader(self._inp)
        if req.command not in self._caps or req.command in self._aborted:
            reader.drain()
            aborted = req.command in self._aborted
            self._send_status(_Outcome.ABORT if aborted else _Outcome.ERROR)
            return
        starting = getattr(self._handler, "starting", None)
        if starting is not None:
            with contextlib.suppress(Exception):  # a hint: the request reports failures
                starting(req.command, _decode_path(req.pathname))

        with self._cond:
            earlier = self._delayed.get(req.pathname)
        if (
            earlier is not None
            and earlier.command == req.command
            and (not req.can_delay or earlier.listed)
        ):
            # git coming back for a blob we delayed; its content section is empty.
            reader.drain()
            self._send_delayed(earlier)
            return

        src: IO[bytes]
        if req.can_delay and earlier is None and self._may_delay(req):
            spooled = self._spool(self._opts.delayed_input_limit)
            try:
                size = _copy(reader, spooled)
                spooled.seek(0)
            except BaseException:
                spooled.close()
                raise
            if size <= self._opts.delayed_input_limit:
                self._start_delayed(req, spooled)
                self._send_status(_Outcome.DELAYED)
                return
            src = spooled  # too big to park: serve it now
        else:
            head = _read_at_most(reader, self._opts.stream_input_limit + 1)
            if len(head) <= self._opts.stream_input_limit and reader.done:
                # The whole input is here, so git is waiting for our answer (no deadlock
                # writing while it writes): stream the output instead of spooling it.
                reader.drain()
                self._run_streaming(req, io.BytesIO(head))
                return
            src = io.BufferedReader(_Prefixed(head, reader), MAX_PAYLOAD)

        try:
            outcome, result = self._run(req, src, self._opts.spool_memory)
            try:
                # Whatever the handler left unread is still on the pipe; the next request
                # starts after it. Raises if the framing broke under the handler.
                reader.drain()
            except BaseException:
                if result is not None:
                    result.close()
                raise
        finally:
            src.close()
        self._send_result(req.command, outcome, result)

    def _may_delay(self, req: _Request) -> bool:
        if "delay" not in self._caps:
            return False
        with self._cond:
            if len(self._delayed) >= self._opts.max_delayed:
                return False
        try:
            return bool(self._handler.can_delay(_decode_path(req.pathname)))
        except Exception as exc:  # a broken can_delay just means "no"
            self._report(req.command, req.pathname, exc)
            return False

    def _call(self, req: _Request | _Delayed, src: IO[bytes], dst: IO[bytes]) -> None:
        path = _decode_path(req.pathname)
        if req.command == "clean":
            self._handler.clean(path, cast(BinaryIO, src), cast(BinaryIO, dst))
        else:
            self._handler.smudge(path, cast(BinaryIO, src), cast(BinaryIO, dst), req.meta)

    def _run(
        self, req: _Request | _Delayed, src: IO[bytes], memory: int
    ) -> tuple[_Outcome, IO[bytes] | None]:
        """Run the handler into a fresh spool; never raises for handler failures."""
        command, pathname = req.command, req.pathname
        dst = self._spool(memory)
        try:
            self._call(req, src, dst)
            dst.seek(0)
        except FilterAbortError as exc:
            dst.close()
            self._report(command, pathname, exc)
            return _Outcome.ABORT, None
        except Exception as exc:
            dst.close()
            if isinstance(src, io.BufferedReader):
                raw = src.raw
                if isinstance(raw, PktReader) and raw.broken is not None:
                    raise raw.broken from exc  # the pipe broke, not the handler
            self._report(command, pathname, exc)
            return _Outcome.ERROR, None
        return _Outcome.SUCCESS, dst

    def _run_streaming(self, req: _Request, src: IO[bytes]) -> None:
        """Run the handler with its output going straight to git (see stream_input_limit)."""
        out = _StreamingResult(self._out)
        try:
            self._call(req, src, cast(IO[bytes], out))
        except FilterAbortError as exc:
            self._report(req.command, req.pathname, exc)
            if out.started:
                out.fail()
            else:
                self._aborted.add(req.command)
                self._send_status(_Outcome.ABORT)
            return
        except Exception as exc:
            self._report(req.command, req.pathname, exc)
            if out.started:
                out.fail()
            else:
                self._send_status(_Outcome.ERROR)
            return
        if out.closed:  # the handler closed its output: we cannot know it finished
            self._report(req.command, req.pathname, ValueError("handler closed its output"))
            if out.started:
                out.fail()
            else:
                self._send_status(_Outcome.ERROR)
            return
        out.finish()

    def _spool(self, memory: int) -> IO[bytes]:
        return tempfile.SpooledTemporaryFile(max_size=memory, dir=self._opts.spool_dir)

    def _report(self, command: str, pathname: bytes, exc: BaseException) -> None:
        if self._on_error is None:
            return
        try:
            self._on_error(command, _decode_path(pathname), exc)
        except Exception:  # a faulty logger must not take the filter down
            pass

    # ---- responses ------------------------------------------------------------------------

    def _send_status(self, outcome: _Outcome) -> None:
        write_text_list(self._out, [f"status={outcome.value}"])
        self._out.flush()

    def _send_result(self, command: str, outcome: _Outcome, result: IO[bytes] | None) -> None:
        if outcome is not _Outcome.SUCCESS or result is None:
            if outcome is _Outcome.ABORT:
                self._aborted.add(command)
            self._send_status(outcome)
            return
        try:
            write_text_list(self._out, ["status=success"])
            writer = PktWriter(self._out)
            try:
                while chunk := result.read(MAX_PAYLOAD):
                    writer.write(chunk)
            except OSError:
                # The spool (a disk file) failed under us after content started: end the
                # content section and take the success back, as the protocol allows.
                writer.close()
                self._send_status(_Outcome.ERROR)
                return
            writer.close()
            write_flush(self._out)  # empty list: "status=success" stands
            self._out.flush()
        finally:
            result.close()

    # ---- delay ----------------------------------------------------------------------------

    def _start_delayed(self, req: _Request, src: IO[bytes]) -> None:
        item = _Delayed(req.command, req.pathname, src, req.meta)
        note = getattr(self._handler, "delayed", None)
        if note is not None:
            head = src.read(DELAYED_HEAD)
            src.seek(0)
            try:
                note(_decode_path(req.pathname), head, req.meta)
            except Exception as exc:  # only a hint: the request itself reports failures
                if self._on_error is not None:
                    self._on_error(req.command, _decode_path(req.pathname), exc)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self._opts.workers, thread_name_prefix="gitxet-filter"
            )
        with self._cond:
            self._delayed[req.pathname] = item
        self._pool.submit(self._run_delayed, item)

    def _run_delayed(self, item: _Delayed) -> None:
        outcome, result = _Outcome.ERROR, None
        try:
            outcome, result = self._run(item, item.src, self._opts.delayed_spool_memory)
        finally:
            item.src.close()
            with self._cond:
                item.outcome, item.result, item.done = outcome, result, True
                self._cond.notify_all()

    def _list_available(self) -> None:
        with self._cond:
            while True:
                ready = [d for d in self._delayed.values() if d.done and not d.listed]
                pending = any(not d.done for d in self._delayed.values())
                if ready or not pending:
                    break
                self._cond.wait()
            for item in ready:
                item.listed = True
        write_text_list(self._out, [b"pathname=" + item.pathname for item in ready])
        write_text_list(self._out, ["status=success"])
        self._out.flush()

    def _send_delayed(self, item: _Delayed) -> None:
        with self._cond:
            while not item.done:
                self._cond.wait()
            del self._delayed[item.pathname]
        self._send_result(item.command, item.outcome, item.result)

    def close(self) -> None:
        """Stop the workers (waiting for running ones) and drop undelivered results."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        with self._cond:
            items = list(self._delayed.values())
            self._delayed.clear()
        for item in items:
            item.src.close()
            if item.result is not None:
                item.result.close()


class _StreamingResult(io.RawIOBase):
    """Content for git, sent as written: ``status=success`` goes out with the first byte."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._writer: PktWriter | None = None

    @property
    def started(self) -> bool:
        return self._writer is not None

    def writable(self) -> bool:
        return True

    def _start(self) -> PktWriter:
        if self._writer is None:
            write_text_list(self._out, ["status=success"])
            self._writer = PktWriter(self._out)
        return self._writer

    def write(self, data: ReadableBuffer) -> int:  # type: ignore[override]
        if self.closed:
            raise ValueError("write to a closed filter output")
        if not memoryview(data).nbytes:
            return 0
        return self._start().write(data)

    def finish(self) -> None:
        self._start().close()  # the rest of the content and its flush
        write_flush(self._out)  # empty list: "status=success" stands
        self._out.flush()

    def fail(self) -> None:
        assert self._writer is not None
        self._writer.close()
        write_text_list(self._out, ["status=error"])  # git drops what it received
        self._out.flush()


class _Prefixed(io.RawIOBase):
    """``head`` and then the rest of a packet stream."""

    def __init__(self, head: bytes, rest: PktReader) -> None:
        self._head = memoryview(head)
        self.raw = rest  # so a broken pipe under the handler is still recognized

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        if self._head.nbytes:
            n = min(view.nbytes, self._head.nbytes)
            view[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        return self.raw.readinto(view)


def _read_at_most(reader: PktReader, n: int) -> bytes:
    """Up to ``n`` bytes of a packet stream (fewer only at its end)."""
    parts: list[bytes] = []
    left = n
    while left > 0:
        b = reader.read(min(left, MAX_PAYLOAD))
        if not b:
            break
        parts.append(b)
        left -= len(b)
    return b"".join(parts)


def _copy(src: io.RawIOBase, dst: IO[bytes]) -> int:
    total = 0
    buf = bytearray(MAX_PAYLOAD)
    view = memoryview(buf)
    while n := src.readinto(buf):
        dst.write(view[:n])
        total += n
    return total


#: pipe capacity asked for on the filter's stdin and stdout (Linux's default limit for
#: unprivileged processes, /proc/sys/fs/pipe-max-size)
PIPE_BYTES = 1 << 20


def wide_pipes(inp_fd: int, out_fd: int) -> tuple[BinaryIO, BinaryIO]:
    """Streams for a filter process talking to git over ``inp_fd``/``out_fd``, with both
    pipes widened to :data:`PIPE_BYTES`: git writes file content in 64 KiB packets, and in a
    64 KiB pipe every packet is a wake-up of each side and a read that gives up the GIL, which
    the chunking threads then hold for up to a switch interval (measured: 'git add' of 394 MB
    ~15% faster). Not a pipe, or a kernel that refuses: the streams work as before."""
    for fd in (inp_fd, out_fd):
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    inp = io.BufferedReader(io.FileIO(inp_fd, "rb", closefd=False), PIPE_BYTES)
    out = io.BufferedWriter(io.FileIO(out_fd, "wb", closefd=False), PIPE_BYTES)
    return inp, out


def serve(
    handler: FilterHandler,
    inp: BinaryIO,
    out: BinaryIO,
    options: FilterOptions | None = None,
    on_error: OnError | None = None,
) -> None:
    """Run a filter-process server on ``inp``/``out`` until git hangs up."""
    FilterServer(handler, inp, out, options, on_error).serve()
