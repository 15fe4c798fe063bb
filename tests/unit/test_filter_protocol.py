"""The filter-process server driven by a scripted git over BytesIO (and pipes for delay)."""

from __future__ import annotations

import io
import os
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import pytest

from gitxet.errors import FilterAbortError, FilterProtocolError, PktLineError
from gitxet.git.filter_protocol import NO_META, FilterOptions, FilterServer, SmudgeMeta, serve
from gitxet.git.pktline import (
    MAX_PAYLOAD,
    PktWriter,
    Special,
    read_packet,
    read_packet_or_eof,
    read_until_flush,
    write_flush,
    write_packet,
    write_text_list,
)


class Handler:
    """clean = upper-case, smudge = lower-case, with hooks for failures and delay."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.metas: dict[str, SmudgeMeta] = {}
        self.fail_after: dict[str, int] = {}  # path -> raise after writing this many bytes
        self.abort_paths: set[str] = set()
        self.delay_paths: set[str] | None = set()  # None: delay everything
        self.read_limit: dict[str, int] = {}  # path -> read only this much input
        self.sleep = 0.0
        self.lock = threading.Lock()

    def _run(self, kind: str, pathname: str, src: BinaryIO, dst: BinaryIO) -> None:
        with self.lock:
            self.calls.append((kind, pathname))
        if self.sleep:
            time.sleep(random.uniform(0, self.sleep))
        if pathname in self.abort_paths:
            raise FilterAbortError("stop")
        data = src.read(self.read_limit.get(pathname, -1))
        out = data.upper() if kind == "clean" else data.lower()
        if pathname in self.fail_after:
            dst.write(out[: self.fail_after[pathname]])
            raise RuntimeError(f"{kind} failed for {pathname}")
        # Write in odd-sized pieces to exercise the spool.
        for i in range(0, len(out), 7777):
            dst.write(out[i : i + 7777])

    def clean(self, pathname: str, src: BinaryIO, dst: BinaryIO) -> None:
        self._run("clean", pathname, src, dst)

    def smudge(
        self, pathname: str, src: BinaryIO, dst: BinaryIO, meta: SmudgeMeta = NO_META
    ) -> None:
        self.metas[pathname] = meta
        self._run("smudge", pathname, src, dst)

    def can_delay(self, pathname: str) -> bool:
        if pathname == "broken-can-delay":
            raise ValueError("nope")
        return self.delay_paths is None or pathname in self.delay_paths


# ---- a scripted git -----------------------------------------------------------------------


def handshake(out: BinaryIO, caps: tuple[str, ...] = ("clean", "smudge", "delay")) -> None:
    write_text_list(out, ["git-filter-client", "version=2"])
    write_text_list(out, [f"capability={c}" for c in caps])


def request(
    out: BinaryIO,
    command: str,
    path: bytes | str,
    content: bytes = b"",
    *,
    delay: bool = False,
    meta: tuple[str, ...] = ("ref=refs/heads/main",),
) -> None:
    p = path if isinstance(path, bytes) else path.encode()
    lines: list[bytes | str] = [f"command={command}", b"pathname=" + p]
    if delay:
        lines.append("can-delay=1")
    lines.extend(meta)
    write_text_list(out, lines)
    with PktWriter(out) as w:
        w.write(content)


def run_server(
    script: bytes, handler: Handler | None = None, **opts: object
) -> tuple[io.BytesIO, Handler]:
    handler = handler or Handler()
    out = io.BytesIO()
    serve(handler, io.BytesIO(script), out, FilterOptions(**opts))  # type: ignore[arg-type]
    out.seek(0)
    return out, handler


def expect_handshake(resp: BinaryIO, caps: list[bytes] | None = None) -> None:
    assert read_until_flush(resp) == [b"git-filter-server", b"version=2"]
    assert read_until_flush(resp) == (
        caps
        if caps is not None
        else [b"capability=clean", b"capability=smudge", b"capability=delay"]
    )


def read_response(resp: BinaryIO) -> tuple[str, bytes | None]:
    """Read one filter response the way git does: (final status, content or None)."""
    status = read_until_flush(resp)
    assert status is not None and len(status) == 1, status
    first = status[0].decode()
    if first != "status=success":
        return first.removeprefix("status="), None
    content = bytearray()
    while (p := read_packet(resp)) is not Special.FLUSH:
        assert isinstance(p, bytes) and 0 < len(p) <= MAX_PAYLOAD
        content += p
    trailer = read_until_flush(resp)
    assert trailer is not None
    final = trailer[0].decode().removeprefix("status=") if trailer else "success"
    return final, bytes(content)


# ---- handshake ----------------------------------------------------------------------------


def test_handshake_answers_exact_bytes() -> None:
    script = io.BytesIO()
    handshake(script, ("clean", "smudge", "delay", "future-thing"))
    out, _ = run_server(script.getvalue())
    assert out.getvalue() == (
        b"0016git-filter-server\n000eversion=2\n0000"
        b"0015capability=clean\n0016capability=smudge\n0015capability=delay\n0000"
    )


def test_handshake_offers_only_configured_and_requested_capabilities() -> None:
    script = io.BytesIO()
    handshake(script, ("smudge", "clean"))
    out, _ = run_server(script.getvalue(), capabilities=frozenset({"clean", "delay"}))
    expect_handshake(out, [b"capability=clean"])


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        (["git-filter-server", "version=2"], "git-filter-client"),
        (["git-filter-client", "version=3"], "no supported version"),
        (["git-filter-client", "hello"], "unexpected line"),
        ([], "git-filter-client"),
    ],
)
def test_handshake_rejects_bad_welcome(lines: list[str], reason: str) -> None:
    script = io.BytesIO()
    write_text_list(script, lines)
    with pytest.raises(FilterProtocolError, match=reason):
        run_server(script.getvalue())


def test_handshake_rejects_bad_capability_line() -> None:
    script = io.BytesIO()
    write_text_list(script, ["git-filter-client", "version=2"])
    write_text_list(script, ["clean"])
    with pytest.raises(FilterProtocolError, match="capabilities"):
        run_server(script.getvalue())


def test_eof_during_handshake_is_an_error() -> None:
    with pytest.raises(PktLineError):
        run_server(b"")


# ---- clean / smudge -----------------------------------------------------------------------


def test_clean_and_smudge_round_trip_large_and_empty() -> None:
    big = bytes(random.Random(1).getrandbits(8) for _ in range(200_000))
    script = io.BytesIO()
    handshake(script)
    request(script, "clean", "big.bin", big)
    request(script, "smudge", "big.bin", big.upper())
    request(script, "clean", "empty", b"")
    out, handler = run_server(script.getvalue(), spool_memory=1024)
    expect_handshake(out)
    assert read_response(out) == ("success", big.upper())
    assert read_response(out) == ("success", big.upper().lower())
    assert read_response(out) == ("success", b"")
    assert read_packet_or_eof(out) is None
    assert handler.calls == [("clean", "big.bin"), ("smudge", "big.bin"), ("clean", "empty")]


def test_smudge_gets_what_git_says_about_the_checkout() -> None:
    sha = "1a173f3bb1b50590fe88699fc4b1f5375533c0d2"
    blob = "61780798228d17af2d34fce4cfbdf35556832472"
    full = ("ref=refs/remotes/upstream/main", f"treeish={sha}", f"blob={blob}")
    hostile = ("ref=--upload-pack=x", "treeish=-HEAD", "blob=zz", "future=1")
    script = io.BytesIO()
    handshake(script)
    request(script, "smudge", "inline", b"A" * 100_000, meta=full)  # spooled
    request(script, "smudge", "streamed", b"A", meta=full)
    request(script, "smudge", "delayed", b"A", meta=full, delay=True)
    request(script, "smudge", "none", b"A", meta=())
    request(script, "smudge", "hostile", b"A", meta=hostile)
    write_text_list(script, ["command=list_available_blobs"])
    request(script, "smudge", "delayed", meta=full, delay=True)
    handler = Handler()
    handler.delay_paths = {"delayed"}
    run_server(script.getvalue(), handler)
    want = SmudgeMeta("refs/remotes/upstream/main", sha, blob)
    assert handler.metas["inline"] == want
    assert handler.metas["streamed"] == want
    assert handler.metas["delayed"] == want
    assert handler.metas["none"] is NO_META
    assert handler.metas["hostile"] == NO_META


def test_empty_content_response_is_exactly_framed() -> None:
    script = io.BytesIO()
    handshake(script)
    request(script, "clean", "e", b"")
    out, _ = run_server(script.getvalue())
    expect_handshake(out)
    assert out.read() == b"0013status=success\n" + b"0000" + b"0000" + b"0000"


def test_handler_error_gives_status_error_and_no_partial_content() -> None:
    handler = Handler()
    handler.fail_after = {"bad": 100_000}  # fails after writing more than a packet
    script = io.BytesIO()
    handshake(script)
    request(script, "smudge", "bad", b"X" * 150_000)
    request(script, "smudge", "good", b"ABC")
    errors: list[tuple[str, str, str]] = []
    out = io.BytesIO()
    serve(
        handler,
        io.BytesIO(script.getvalue()),
        out,
        on_error=lambda c, p, e: errors.append((c, p, str(e))),
    )
    out.seek(0)
    expect_handshake(out)
    # The exact bytes: no packet of the 100 000 written bytes ever reaches git.
    assert read_until_flush(out) == [b"status=error"]
    assert read_response(out) == ("success", b"abc")
    assert errors == [("smudge", "bad", "smudge failed for bad")]


def test_handler_leaving_input_unread_keeps_the_stream_in_step() -> None:
    handler = Handler()
    handler.read_limit = {"partial": 10}
    script = io.BytesIO()
    handshake(script)
    request(script, "clean", "partial", b"a" * 100_000)
    request(script, "clean", "next", b"b")
    out, _ = run_server(script.getvalue(), handler)
    expect_handshake(out)
    assert read_response(out) == ("success", b"A" * 10)
    assert read_response(out) == ("success", b"B")


def test_abort_answers_abort_and_keeps_refusing_that_command() -> None:
    handler = Handler()
    handler.abort_paths = {"a"}
    script = io.BytesIO()
    handshake(script)
    request(script, "smudge", "a", b"x")
    request(script, "smudge", "b", b"y")
    request(script, "clean", "c", b"z")
    out, _ = run_server(script.getvalue(), handler)
    expect_handshake(out)
    assert read_response(out) == ("abort", None)
    assert read_response(out) == ("abort", None)
    assert read_response(out) == ("success", b"Z")
    assert handler.calls == [("smudge", "a"), ("clean", "c")]


def test_unknown_and_unnegotiated_commands_get_error() -> None:
    script = io.BytesIO()
    handshake(script, ("clean",))
    write_text_list(script, ["command=frobnicate", "pathname=x"])
    request(script, "smudge", "s", b"content")  # smudge was not negotiated
    request(script, "clean", "c", b"ok")
    out, handler = run_server(script.getvalue())
    expect_handshake(out, [b"capability=clean"])
    assert read_response(out) == ("error", None)
    assert read_response(out) == ("error", None)
    assert read_response(out) == ("success", b"OK")
    assert handler.calls == [("clean", "c")]


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        (["pathname=x"], "command="),
        (["command=clean"], "without a pathname"),
        (["command=clean", "pathname="], "without a pathname"),
        (["command=clean", "pathname=a", "pathname=b"], "two pathname"),
        (["command=clean", "pathname"], "malformed"),
    ],
)
def test_malformed_requests_end_the_server(lines: list[str], reason: str) -> None:
    script = io.BytesIO()
    handshake(script)
    write_text_list(script, lines)
    write_flush(script)
    with pytest.raises(FilterProtocolError, match=reason):
        run_server(script.getvalue())


def test_empty_request_header_is_a_protocol_error() -> None:
    script = io.BytesIO()
    handshake(script)
    write_flush(script)
    with pytest.raises(FilterProtocolError, match="empty request"):
        run_server(script.getvalue())


def test_eof_inside_content_is_fatal_not_a_file_error() -> None:
    script = io.BytesIO()
    handshake(script)
    write_text_list(script, ["command=clean", "pathname=cut"])
    write_packet(script, b"some bytes")  # and then git dies
    errors: list[str] = []
    with pytest.raises(PktLineError, match="EOF"):
        serve(
            Handler(),
            io.BytesIO(script.getvalue()),
            io.BytesIO(),
            on_error=lambda c, p, e: errors.append(p),
        )
    assert errors == []


def test_on_error_that_raises_does_not_kill_the_server() -> None:
    handler = Handler()
    handler.fail_after = {"x": 0}

    def bad_logger(command: str, path: str, exc: BaseException) -> None:
        raise OSError("log disk full")

    script = io.BytesIO()
    handshake(script)
    request(script, "clean", "x", b"1")
    request(script, "clean", "y", b"2")
    out = io.BytesIO()
    serve(handler, io.BytesIO(script.getvalue()), out, on_error=bad_logger)
    out.seek(0)
    expect_handshake(out)
    assert read_response(out) == ("error", None)
    assert read_response(out) == ("success", b"2")


def test_handler_closing_dst_is_an_error() -> None:
    class Closer(Handler):
        def clean(self, pathname: str, src: BinaryIO, dst: BinaryIO) -> None:
            src.read()
            dst.write(b"x")
            dst.close()

    script = io.BytesIO()
    handshake(script)
    request(script, "clean", "x", b"1")
    out, _ = run_server(script.getvalue(), Closer())
    expect_handshake(out)
    # streamed: the "x" already went out, and the trailing status=error makes git drop it
    assert read_response(out)[0] == "error"


def test_streamed_output_failing_midway_ends_with_status_error() -> None:
    class HalfWay(Handler):
        def smudge(
            self, pathname: str, src: BinaryIO, dst: BinaryIO, meta: SmudgeMeta = NO_META
        ) -> None:
            src.read()
            dst.write(b"partial")
            raise OSError("the data went away")

    script = io.BytesIO()
    handshake(script)
    request(script, "smudge", "x", b"pointer")
    request(script, "smudge", "y", b"pointer")
    out, _ = run_server(script.getvalue(), HalfWay())
    expect_handshake(out)
    assert read_response(out) == ("error", b"partial")
    assert read_response(out)[0] == "error"


# ---- delay over BytesIO (one delayed path: deterministic) ---------------------------------


def test_delayed_smudge_single_path_scripted() -> None:
    handler = Handler()
    path = b"dir/\xffd.txt"  # not UTF-8: must round-trip byte for byte
    handler.delay_paths = {os.fsdecode(path)}
    script = io.BytesIO()
    handshake(script)
    request(script, "smudge", path, b"DELAYED", delay=True)
    request(script, "smudge", "now.txt", b"NOW", delay=True)  # handler says no delay
    write_text_list(script, ["command=list_available_blobs"])
    request(script, "smudge", path, b"")  # git asks again, with empty content
    write_text_list(script, ["command=list_available_blobs"])
    out, _ = run_server(script.getvalue(), handler)
    expect_handshake(out)
    assert read_until_flush(out) == [b"status=delayed"]
    assert read_response(out) == ("success", b"now")
    assert read_until_flush(out) == [b"pathname=" + path]
    assert read_until_flush(out) == [b"status=success"]
    assert read_response(out) == ("success", b"delayed")
    assert read_until_flush(out) == []  # nothing left
    assert read_until_flush(out) == [b"status=success"]
    assert read_packet_or_eof(out) is None


def test_list_available_blobs_with_nothing_delayed_is_empty() -> None:
    script = io.BytesIO()
    handshake(script)
    write_text_list(script, ["command=list_available_blobs"])
    out, _ = run_server(script.getvalue())
    expect_handshake(out)
    assert out.read() == b"0000" + b"0013status=success\n0000"


def test_delay_not_offered_means_inline() -> None:
    handler = Handler()
    handler.delay_paths = None
    script = io.BytesIO()
    handshake(script, ("clean", "smudge"))
    request(script, "smudge", "a", b"A", delay=True)
    out, _ = run_server(script.getvalue(), handler)
    expect_handshake(out, [b"capability=clean", b"capability=smudge"])
    assert read_response(out) == ("success", b"a")


def test_broken_can_delay_and_big_input_are_served_inline() -> None:
    handler = Handler()
    handler.delay_paths = None
    script = io.BytesIO()
    handshake(script)
    request(script, "smudge", "broken-can-delay", b"A", delay=True)
    request(script, "smudge", "big", b"B" * 5000, delay=True)
    out, _ = run_server(script.getvalue(), handler, delayed_input_limit=4096)
    expect_handshake(out)
    assert read_response(out) == ("success", b"a")
    assert read_response(out) == ("success", b"b" * 5000)


# ---- delay with an interactive git over pipes ----------------------------------------------


@contextmanager
def live_server(handler: Handler, **opts: object) -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """Run the server in a thread; yield (to_server, from_server) as git would hold them."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    to_server = os.fdopen(w1, "wb")
    server_in = os.fdopen(r1, "rb")
    server_out = os.fdopen(w2, "wb")
    from_server = os.fdopen(r2, "rb")
    failure: list[BaseException] = []

    def run() -> None:
        try:
            serve(handler, server_in, server_out, FilterOptions(**opts))  # type: ignore[arg-type]
        except BaseException as exc:  # pragma: no cover - reported below
            failure.append(exc)
        finally:
            server_out.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield to_server, from_server
    finally:
        to_server.close()
        thread.join(timeout=30)
        from_server.close()
        server_in.close()
    assert not thread.is_alive()
    assert not failure, failure


def checkout_like_git(
    to_server: BinaryIO, from_server: BinaryIO, files: dict[str, bytes]
) -> tuple[dict[str, tuple[str, bytes | None]], set[str], int]:
    """Smudge every file with can-delay=1, then collect delayed ones like git's checkout."""
    results: dict[str, tuple[str, bytes | None]] = {}
    delayed: set[str] = set()
    for path, content in files.items():
        request(to_server, "smudge", path, content, delay=True)
        to_server.flush()
        status = read_until_flush(from_server)
        if status == [b"status=delayed"]:
            delayed.add(path)
            continue
        # Not delayed: put the status back in front of the rest of the response.
        assert status is not None
        results[path] = _finish_response(status, from_server)
    rounds = 0
    outstanding = set(delayed)
    while True:
        rounds += 1
        write_text_list(to_server, ["command=list_available_blobs"])
        to_server.flush()
        listed = read_until_flush(from_server)
        assert read_until_flush(from_server) == [b"status=success"]
        assert listed is not None
        if not listed:
            break
        for line in listed:
            path = line.removeprefix(b"pathname=").decode()
            assert path in outstanding, f"{path} listed twice or never delayed"
            outstanding.discard(path)
            request(to_server, "smudge", path, b"")
            to_server.flush()
            results[path] = read_response(from_server)
    assert not outstanding
    return results, delayed, rounds


def _finish_response(status: list[bytes], resp: BinaryIO) -> tuple[str, bytes | None]:
    if status != [b"status=success"]:
        return status[0].decode().removeprefix("status="), None
    buf = io.BytesIO()
    write_text_list(buf, ["status=success"])
    rest = bytearray()
    while (p := read_packet(resp)) is not Special.FLUSH:
        assert isinstance(p, bytes)
        rest += p
    trailer = read_until_flush(resp)
    assert trailer is not None
    return (trailer[0].decode().removeprefix("status=") if trailer else "success"), bytes(rest)


def test_delayed_checkout_of_many_files_with_errors() -> None:
    handler = Handler()
    handler.delay_paths = None
    handler.sleep = 0.01
    handler.fail_after = {"f07": 3, "f13": 0}
    files = {f"f{i:02d}": f"CONTENT {i} ".encode() * (i * 50) for i in range(40)}
    with live_server(handler, workers=3, max_delayed=25, delayed_spool_memory=512) as (w, r):
        handshake(w)
        w.flush()
        expect_handshake(r)
        results, delayed, rounds = checkout_like_git(w, r, files)
    assert len(delayed) == 25  # the cap: the rest was served inline
    assert rounds >= 2
    for path, content in files.items():
        if path in handler.fail_after:
            assert results[path] == ("error", None)
        else:
            assert results[path] == ("success", content.lower()), path
    assert sorted(p for _, p in handler.calls) == sorted(files)


def test_delayed_abort_is_reported_on_the_second_request() -> None:
    handler = Handler()
    handler.delay_paths = None
    handler.abort_paths = {"x"}
    with live_server(handler) as (w, r):
        handshake(w)
        w.flush()
        expect_handshake(r)
        results, delayed, _ = checkout_like_git(w, r, {"x": b"1", "y": b"2"})
        # smudge is now aborted for good; a fresh request gets abort at once.
        request(w, "smudge", "z", b"3")
        w.flush()
        assert read_response(r) == ("abort", None)
    assert results["x"] == ("abort", None)
    assert delayed == {"x", "y"}


def test_close_drops_undelivered_delayed_results() -> None:
    handler = Handler()
    handler.delay_paths = None
    script = io.BytesIO()
    handshake(script)
    request(script, "smudge", "a", b"A", delay=True)
    # git dies before asking for it: serve() must still return and clean up.
    out, _ = run_server(script.getvalue(), handler)
    expect_handshake(out)
    assert read_until_flush(out) == [b"status=delayed"]
    assert handler.calls == [("smudge", "a")]


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="unknown"):
        FilterOptions(capabilities=frozenset({"clean", "teleport"}))
    with pytest.raises(ValueError):
        FilterOptions(workers=0)


def test_server_reports_capabilities() -> None:
    script = io.BytesIO()
    handshake(script, ("smudge",))
    server = FilterServer(Handler(), io.BytesIO(script.getvalue()), io.BytesIO())
    assert server.capabilities == frozenset()
    server.handshake()
    assert server.capabilities == frozenset({"smudge"})
    server.close()


class _LazyGit(io.RawIOBase):
    """git's side of a conversation, generated on the fly: one smudge of ``size`` bytes."""

    def __init__(self, size: int) -> None:
        super().__init__()
        head = io.BytesIO()
        handshake(head)
        write_text_list(head, ["command=smudge", "pathname=huge.bin"])
        self._parts: Iterator[bytes] = self._generate(head.getvalue(), size)
        self._buf = b""

    @staticmethod
    def _generate(head: bytes, size: int) -> Iterator[bytes]:
        yield head
        block = (bytes(range(256)) * 256)[:MAX_PAYLOAD]
        left = size
        while left:
            n = min(left, MAX_PAYLOAD)
            yield b"%04x" % (n + 4) + block[:n]
            left -= n
        yield b"0000"

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        while not self._buf:
            self._buf = next(self._parts, b"")
            if not self._buf:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


class _CountingSink(io.RawIOBase):
    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.head = b""
        self.tail = b""

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        data = bytes(b)
        if len(self.head) < 200:
            self.head += data[:200]
        self.tail = (self.tail + data)[-8:]
        self.total += len(data)
        return len(data)


class StreamingHandler(Handler):
    def smudge(
        self, pathname: str, src: BinaryIO, dst: BinaryIO, meta: SmudgeMeta = NO_META
    ) -> None:
        while chunk := src.read(100_000):
            dst.write(chunk)


def test_memory_stays_bounded_for_large_files() -> None:
    import tracemalloc

    size = 48 * 1024 * 1024
    sink = _CountingSink()
    tracemalloc.start()
    try:
        serve(
            StreamingHandler(),
            io.BufferedReader(_LazyGit(size)),
            sink,  # type: ignore[arg-type]
            FilterOptions(spool_memory=1024 * 1024),
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    packets = -(-size // MAX_PAYLOAD)
    assert b"status=success" in sink.head
    assert sink.tail == b"00000000"  # end of content, then the empty status list
    handshake_bytes = len(b"0016git-filter-server\n000eversion=2\n0000") + len(
        b"0015capability=clean\n0016capability=smudge\n0015capability=delay\n0000"
    )
    assert sink.total == handshake_bytes + len(b"0013status=success\n0000") + size + 4 * packets + 8
    assert peak < 8 * 1024 * 1024, peak  # the file is 48 MiB; we hold a few packets


def test_listed_path_requested_again_with_can_delay_gets_its_result() -> None:
    handler = Handler()
    handler.delay_paths = None
    script = io.BytesIO()
    handshake(script)
    request(script, "smudge", "p", b"PTR", delay=True)
    write_text_list(script, ["command=list_available_blobs"])
    request(script, "smudge", "p", b"", delay=True)  # not what git does, but be safe
    out, _ = run_server(script.getvalue(), handler)
    expect_handshake(out)
    assert read_until_flush(out) == [b"status=delayed"]
    assert read_until_flush(out) == [b"pathname=p"]
    assert read_until_flush(out) == [b"status=success"]
    assert read_response(out) == ("success", b"ptr")
    assert handler.calls == [("smudge", "p")]


def test_handler_closing_src_early_keeps_the_stream_in_step() -> None:
    class EarlyCloser(Handler):
        def clean(self, pathname: str, src: BinaryIO, dst: BinaryIO) -> None:
            src.read(3)
            src.close()
            dst.write(b"ok")

    script = io.BytesIO()
    handshake(script)
    request(script, "clean", "a", b"x" * 200_000)
    request(script, "clean", "b", b"y" * 10)
    out, _ = run_server(script.getvalue(), EarlyCloser())
    expect_handshake(out)
    assert read_response(out) == ("success", b"ok")
    assert read_response(out) == ("success", b"ok")


def test_handler_swallowing_a_broken_pipe_still_ends_the_server() -> None:
    class Swallower(Handler):
        def clean(self, pathname: str, src: BinaryIO, dst: BinaryIO) -> None:
            try:
                src.read()
            except PktLineError:
                pass
            dst.write(b"pretend all is well")

    script = io.BytesIO()
    handshake(script)
    write_text_list(script, ["command=clean", "pathname=cut"])
    write_packet(script, b"partial")
    out = io.BytesIO()
    with pytest.raises(PktLineError):
        serve(Swallower(), io.BytesIO(script.getvalue()), out)
    assert b"pretend" not in out.getvalue()


def test_wide_pipes_widen_git_pipes_and_leave_other_files_alone(tmp_path: Path) -> None:
    import fcntl

    from gitxet.git.filter_protocol import PIPE_BYTES, wide_pipes

    r, w = os.pipe()
    try:
        inp, out = wide_pipes(r, w)
        assert fcntl.fcntl(r, fcntl.F_GETPIPE_SZ) == PIPE_BYTES
        write_packet(out, b"x" * 1000)
        write_flush(out)
        out.flush()
        assert read_until_flush(inp) == [b"x" * 1000]
    finally:
        os.close(r)
        os.close(w)
    with open(tmp_path / "f", "w+b") as f:  # not a pipe: plain buffered streams
        inp, out = wide_pipes(f.fileno(), f.fileno())
        out.write(b"abc")
        out.flush()
        os.lseek(f.fileno(), 0, os.SEEK_SET)
        assert inp.read() == b"abc"


def test_a_handler_is_told_of_each_request_before_its_content_is_read() -> None:
    """``starting(command, pathname)`` comes before the handler reads the content (a hint:
    one that raises changes nothing)."""

    class Starting(Handler):
        def starting(self, command: str, pathname: str) -> None:
            with self.lock:
                self.calls.append(("starting " + command, pathname))
            if pathname == "bad":
                raise RuntimeError("hint failed")

    script = io.BytesIO()
    handshake(script)
    request(script, "clean", "a", b"abc")
    request(script, "clean", "bad", b"def")
    request(script, "smudge", "c", b"GHI")
    resp, h = run_server(script.getvalue(), Starting())
    expect_handshake(resp)
    assert [read_response(resp) for _ in range(3)] == [
        ("success", b"ABC"),
        ("success", b"DEF"),
        ("success", b"ghi"),
    ]
    assert h.calls == [
        ("starting clean", "a"),
        ("clean", "a"),
        ("starting clean", "bad"),
        ("clean", "bad"),
        ("starting smudge", "c"),
        ("smudge", "c"),
    ]
