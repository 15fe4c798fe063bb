"""pkt-line framing on BytesIO: round trips, limits, and strict errors."""

from __future__ import annotations

import io

import pytest

from gitxet.errors import GitError, PktLineError
from gitxet.git.pktline import (
    MAX_PACKET_SIZE,
    MAX_PAYLOAD,
    PktReader,
    PktWriter,
    Special,
    read_packet,
    read_packet_or_eof,
    read_text,
    read_until_flush,
    write_delim,
    write_flush,
    write_packet,
    write_text,
    write_text_list,
)


class TrickleIO(io.RawIOBase):
    """A raw stream that returns at most ``step`` bytes per read, like a pipe under load."""

    def __init__(self, data: bytes, step: int = 3) -> None:
        super().__init__()
        self._data = data
        self._pos = 0
        self._step = step

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        n = min(len(b), self._step, len(self._data) - self._pos)
        b[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n


def test_known_encoding_matches_git() -> None:
    # The example from gitprotocol-common: "a\n" is 0006a\n and "foobar\n" is 000bfoobar\n.
    out = io.BytesIO()
    write_text(out, "a")
    write_text(out, "foobar")
    write_flush(out)
    write_delim(out)
    assert out.getvalue() == b"0006a\n000bfoobar\n00000001"


def test_text_round_trip_and_markers() -> None:
    out = io.BytesIO()
    write_text(out, "git-filter-client")
    write_packet(out, b"raw\x00bytes")
    write_text_list(out, ["version=2", b"pathname=\xff.bin"])
    write_delim(out)
    inp = io.BytesIO(out.getvalue())
    assert read_text(inp) == "git-filter-client"
    assert read_packet(inp) == b"raw\x00bytes"
    assert read_until_flush(inp) == [b"version=2", b"pathname=\xff.bin"]
    assert read_packet(inp) is Special.DELIM
    assert read_packet_or_eof(inp) is None
    with pytest.raises(PktLineError, match="EOF"):
        read_packet(inp)


def test_lengths_are_case_insensitive_hex_and_0002_is_response_end() -> None:
    inp = io.BytesIO(b"000Ahello\n0002")
    assert read_packet(inp) == b"hello\n"
    assert read_packet(inp) is Special.RESPONSE_END


def test_empty_data_packet_is_read_but_never_written() -> None:
    assert read_packet(io.BytesIO(b"0004")) == b""
    with pytest.raises(PktLineError, match="empty"):
        write_packet(io.BytesIO(), b"")


def test_max_payload_accepted_and_one_more_refused() -> None:
    out = io.BytesIO()
    write_packet(out, b"x" * MAX_PAYLOAD)
    assert out.getvalue()[:4] == b"fff0"
    assert read_packet(io.BytesIO(out.getvalue())) == b"x" * MAX_PAYLOAD
    with pytest.raises(PktLineError, match="exceeds"):
        write_packet(io.BytesIO(), b"x" * (MAX_PAYLOAD + 1))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"0003", "0003"),
        (b"fff1" + b"x" * 65517, "exceeds"),
        (b"zzzz", "invalid length"),
        (b"00 6a\n", "invalid length"),
        (b"+006", "invalid length"),
        (b"00", "EOF"),
        (b"0009abc", "EOF"),
    ],
)
def test_malformed_packets(data: bytes, reason: str) -> None:
    with pytest.raises(PktLineError, match=reason) as info:
        read_packet(io.BytesIO(data))
    assert isinstance(info.value, GitError)


def test_short_reads_are_reassembled() -> None:
    out = io.BytesIO()
    write_text_list(out, ["command=smudge", "pathname=a b"])
    assert read_until_flush(TrickleIO(out.getvalue())) == [b"command=smudge", b"pathname=a b"]  # type: ignore[arg-type]


def test_read_text_rejects_markers_and_bad_utf8() -> None:
    with pytest.raises(PktLineError, match="flush"):
        read_text(io.BytesIO(b"0000"))
    with pytest.raises(PktLineError, match="UTF-8"):
        read_text(io.BytesIO(b"0006\xff\n"))


def test_read_until_flush_eof_handling() -> None:
    assert read_until_flush(io.BytesIO(b""), eof_ok=True) is None
    with pytest.raises(PktLineError, match="EOF"):
        read_until_flush(io.BytesIO(b""))
    # EOF after the first packet is never a clean hang-up.
    with pytest.raises(PktLineError, match="EOF"):
        read_until_flush(io.BytesIO(b"0006a\n"), eof_ok=True)
    assert read_until_flush(io.BytesIO(b"0000"), eof_ok=True) == []


def test_read_until_flush_limits() -> None:
    out = io.BytesIO()
    write_text_list(out, [f"k={i}" for i in range(5)])
    with pytest.raises(PktLineError, match="longer than 4"):
        read_until_flush(io.BytesIO(out.getvalue()), max_lines=4)
    with pytest.raises(PktLineError, match="delim"):
        read_until_flush(io.BytesIO(b"0006a\n0001"))


@pytest.mark.parametrize(
    "sizes",
    [[], [1], [MAX_PAYLOAD], [MAX_PAYLOAD + 1], [10, MAX_PAYLOAD * 2 + 5, 3], [MAX_PAYLOAD - 1, 1]],
)
def test_writer_frames_max_size_packets(sizes: list[int]) -> None:
    out = io.BytesIO()
    blob = bytes(range(256)) * ((sum(sizes) // 256) + 1)
    pos = 0
    with PktWriter(out) as writer:
        for size in sizes:
            assert writer.write(blob[pos : pos + size]) == size
            pos += size
    expected = blob[:pos]
    inp = io.BytesIO(out.getvalue())
    packets: list[bytes] = []
    while (p := read_packet(inp)) is not Special.FLUSH:
        assert isinstance(p, bytes)
        packets.append(p)
    assert b"".join(packets) == expected
    # Every packet but the last is full-size: no small packets from write boundaries.
    assert all(len(p) == MAX_PAYLOAD for p in packets[:-1])
    assert read_packet_or_eof(inp) is None


def test_writer_abandons_on_exception_and_gc() -> None:
    out = io.BytesIO()
    with pytest.raises(RuntimeError), PktWriter(out) as writer:
        writer.write(b"partial")
        raise RuntimeError("boom")
    assert out.getvalue() == b""
    out2 = io.BytesIO()
    w = PktWriter(out2)
    w.write(b"partial")
    del w
    assert out2.getvalue() == b""
    with pytest.raises(ValueError):
        writer.write(b"x")


def test_reader_streams_until_flush_and_leaves_rest() -> None:
    out = io.BytesIO()
    payload = bytes(range(256)) * 600  # spans three packets
    with PktWriter(out) as writer:
        writer.write(payload)
    write_text(out, "after")
    inp = io.BytesIO(out.getvalue())
    reader = PktReader(inp)
    got = bytearray()
    while chunk := reader.read(1000):
        assert len(chunk) <= 1000
        got += chunk
    assert bytes(got) == payload
    assert reader.done
    assert reader.read() == b""
    assert read_text(inp) == "after"


def test_reader_via_buffered_reader_and_drain() -> None:
    out = io.BytesIO()
    write_packet(out, b"abc")
    out.write(b"0004")  # an empty packet inside the content is skipped
    write_packet(out, b"def")
    write_flush(out)
    write_text(out, "next")
    inp = io.BytesIO(out.getvalue())
    src = io.BufferedReader(PktReader(inp))
    assert src.read(2) == b"ab"
    assert src.read() == b"cdef"
    assert read_text(inp) == "next"

    inp = io.BytesIO(out.getvalue())
    reader = PktReader(inp)
    assert reader.read(1) == b"a"
    assert reader.drain() == 5
    assert read_text(inp) == "next"


@pytest.mark.parametrize(
    ("data", "reason"),
    [(b"0007abc", "EOF"), (b"0006ab0001", "delim"), (b"0006abzzzz", "invalid length")],
)
def test_reader_marks_broken_framing(data: bytes, reason: str) -> None:
    reader = PktReader(io.BytesIO(data))
    with pytest.raises(PktLineError, match=reason):
        reader.drain()
    assert isinstance(reader.broken, PktLineError)
    with pytest.raises(PktLineError, match="broken"):
        reader.read(1)


def test_max_packet_constant() -> None:
    assert MAX_PACKET_SIZE == 65520 and MAX_PAYLOAD == 65516
