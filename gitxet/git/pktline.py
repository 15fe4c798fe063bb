"""pkt-line framing, as git uses it on its pipes (``gitprotocol-common(5)``).

A packet is a 4-digit hex length (which counts the 4 header bytes) followed by the payload.
Lengths 0000, 0001 and 0002 are the flush, delimiter and response-end markers; 0003 is
invalid; 0004 is an empty data packet, which git never sends but tolerates. The largest
packet is 65520 bytes, so a payload carries at most 65516 bytes.

Everything here works on blocking binary streams (``sys.stdin.buffer`` and friends, or
``io.BytesIO`` in tests). Reads are bounded: a peer can make us allocate at most one packet
at a time, or ``max_lines`` packets for a key=value list.
"""

from __future__ import annotations

import enum
import io
from collections.abc import Iterable
from typing import TYPE_CHECKING, BinaryIO

from gitxet.errors import PktLineError

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

__all__ = [
    "DEFAULT_MAX_LINES",
    "MAX_PACKET_SIZE",
    "MAX_PAYLOAD",
    "PktReader",
    "PktWriter",
    "Special",
    "read_packet",
    "read_packet_or_eof",
    "read_text",
    "read_until_flush",
    "write_delim",
    "write_flush",
    "write_packet",
    "write_text",
    "write_text_list",
]

MAX_PACKET_SIZE = 65520
MAX_PAYLOAD = MAX_PACKET_SIZE - 4
#: Default cap on the number of packets in one key=value list (requests are a handful).
DEFAULT_MAX_LINES = 1024


class Special(enum.Enum):
    """The non-data packets."""

    FLUSH = b"0000"
    DELIM = b"0001"
    RESPONSE_END = b"0002"


_SPECIAL_BY_LENGTH = {0: Special.FLUSH, 1: Special.DELIM, 2: Special.RESPONSE_END}
_HEXDIGITS = frozenset(b"0123456789abcdefABCDEF")


def _read_exact(inp: BinaryIO, n: int, what: str) -> bytes:
    """Read exactly ``n`` bytes; raw streams may return short reads, so loop."""
    data = inp.read(n)
    if data is None:  # non-blocking stream with nothing to read: a misuse, not EOF
        raise PktLineError(f"no data available while reading {what}")
    if len(data) == n:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = inp.read(n - got)
        if not more:
            raise PktLineError(f"unexpected EOF in {what}: got {got} of {n} bytes")
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _read_exact_into(inp: BinaryIO, view: memoryview, what: str) -> None:
    """Fill ``view`` from ``inp`` (no intermediate bytes object: payloads go straight to
    the consumer's buffer)."""
    readinto = getattr(inp, "readinto", None)
    if readinto is None:
        view[:] = _read_exact(inp, view.nbytes, what)
        return
    got = 0
    while got < view.nbytes:
        n = readinto(view[got:])
        if n is None:
            raise PktLineError(f"no data available while reading {what}")
        if not n:
            raise PktLineError(f"unexpected EOF in {what}: got {got} of {view.nbytes} bytes")
        got += n


def _parse_length(header: bytes) -> int:
    if len(header) != 4 or not _HEXDIGITS.issuperset(header):
        raise PktLineError(f"invalid length header {header!r}")
    length = int(header, 16)
    if length == 3:
        raise PktLineError("invalid length header b'0003'")
    if length > MAX_PACKET_SIZE:
        raise PktLineError(f"packet length {length} exceeds {MAX_PACKET_SIZE}")
    return length


def _read_header(inp: BinaryIO, eof_ok: bool) -> int | None:
    first = inp.read(4)
    if first is None:
        raise PktLineError("no data available while reading a length header")
    if not first:
        if eof_ok:
            return None
        raise PktLineError("unexpected EOF: expected a packet")
    header = first if len(first) == 4 else first + _read_exact(inp, 4 - len(first), "header")
    return _parse_length(header)


def read_packet_or_eof(inp: BinaryIO) -> bytes | Special | None:
    """Read one packet; ``None`` on a clean EOF before its first byte."""
    length = _read_header(inp, eof_ok=True)
    if length is None:
        return None
    special = _SPECIAL_BY_LENGTH.get(length)
    if special is not None:
        return special
    return _read_exact(inp, length - 4, "packet payload")


def read_packet(inp: BinaryIO) -> bytes | Special:
    """Read one packet: its payload, or a :class:`Special` marker. EOF is an error."""
    packet = read_packet_or_eof(inp)
    if packet is None:
        raise PktLineError("unexpected EOF: expected a packet")
    return packet


def _chomp(payload: bytes) -> bytes:
    return payload[:-1] if payload.endswith(b"\n") else payload


def read_text(inp: BinaryIO) -> str:
    """Read one data packet as UTF-8 text, dropping one trailing LF.

    A flush or other marker where text was expected is a :class:`PktLineError`.
    """
    packet = read_packet(inp)
    if isinstance(packet, Special):
        raise PktLineError(f"expected a text packet, got {packet.name.lower()}")
    try:
        return _chomp(packet).decode("utf-8")
    except UnicodeDecodeError:
        raise PktLineError(f"text packet is not UTF-8: {packet[:64]!r}") from None


def read_until_flush(
    inp: BinaryIO, *, max_lines: int = DEFAULT_MAX_LINES, eof_ok: bool = False
) -> list[bytes] | None:
    """Read data packets up to a flush and return their payloads without trailing LF.

    With ``eof_ok``, a clean EOF before the first packet returns ``None`` (the peer hung
    up between requests). EOF anywhere else, a delimiter, or more than ``max_lines``
    packets is a :class:`PktLineError`.
    """
    lines: list[bytes] = []
    while True:
        packet = read_packet_or_eof(inp) if (eof_ok and not lines) else read_packet(inp)
        if packet is None:
            return None
        if packet is Special.FLUSH:
            return lines
        if isinstance(packet, Special):
            raise PktLineError(f"unexpected {packet.name.lower()} packet in a list")
        if len(lines) >= max_lines:
            raise PktLineError(f"list longer than {max_lines} packets")
        lines.append(_chomp(packet))


def write_packet(out: BinaryIO, payload: ReadableBuffer) -> None:
    """Write one data packet. Empty payloads are refused (git says never send 0004)."""
    size = memoryview(payload).nbytes
    if size == 0:
        raise PktLineError("refusing to write an empty data packet")
    if size > MAX_PAYLOAD:
        raise PktLineError(f"payload of {size} bytes exceeds {MAX_PAYLOAD}")
    out.write(b"%04x" % (size + 4))
    out.write(payload)


def write_flush(out: BinaryIO) -> None:
    """Write a flush packet (0000)."""
    out.write(Special.FLUSH.value)


def write_delim(out: BinaryIO) -> None:
    """Write a delimiter packet (0001)."""
    out.write(Special.DELIM.value)


def write_text(out: BinaryIO, text: str | bytes) -> None:
    """Write one text packet; a trailing LF is added, as git does."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    write_packet(out, data + b"\n")


def write_text_list(out: BinaryIO, lines: Iterable[str | bytes]) -> None:
    """Write text packets followed by a flush."""
    for line in lines:
        write_text(out, line)
    write_flush(out)


class PktReader(io.RawIOBase):
    """A readable stream over the data packets of ``inp`` up to the next flush.

    Memory stays bounded: it never holds more than what the caller asked for. After
    ``read()`` returns ``b""`` the flush has been consumed and ``inp`` is positioned at the
    next packet. If the framing breaks (EOF, bad header, delimiter) the error is raised and
    remembered in :attr:`broken`, so a caller can tell a protocol failure from a failure of
    whoever was consuming the stream. Closing the reader does not close ``inp``.
    """

    def __init__(self, inp: BinaryIO) -> None:
        super().__init__()
        self._inp = inp
        self._remaining = 0  # payload bytes of the current packet still unread
        self._done = False
        self.broken: BaseException | None = None

    @property
    def done(self) -> bool:
        """True once the terminating flush has been read."""
        return self._done

    def readable(self) -> bool:
        return True

    def _next_packet(self) -> None:
        # Skip empty packets so they never look like EOF to the consumer.
        while self._remaining == 0 and not self._done:
            length = _read_header(self._inp, eof_ok=False)
            assert length is not None
            special = _SPECIAL_BY_LENGTH.get(length)
            if special is Special.FLUSH:
                self._done = True
            elif special is not None:
                raise PktLineError(f"unexpected {special.name.lower()} packet in content")
            else:
                self._remaining = length - 4

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        if self.broken is not None:
            raise PktLineError(f"stream already broken: {self.broken}")
        if not view.nbytes:
            return 0
        try:
            self._next_packet()
            if self._done:
                return 0
            n = min(view.nbytes, self._remaining)
            _read_exact_into(self._inp, view[:n], "packet payload")
        except (PktLineError, OSError) as exc:
            self.broken = exc
            raise
        self._remaining -= n
        return n

    def drain(self) -> int:
        """Consume and discard everything up to and including the flush; return the count."""
        total = 0
        chunk = bytearray(MAX_PAYLOAD)
        while True:
            n = self.readinto(chunk)
            if n == 0:
                return total
            total += n


class PktWriter(io.RawIOBase):
    """A writable stream that frames what it is given as maximum-size data packets.

    Only the current partial packet is buffered (at most 65516 bytes), so arbitrarily large
    payloads stream through. :meth:`close` sends the partial packet and then a flush packet,
    which is how git ends a content section; it does not close ``out``. :meth:`flush` only
    flushes ``out``: it never emits a short packet early. Leaving a ``with`` block through an
    exception, or garbage collection, abandons the section instead of finishing it.
    """

    def __init__(self, out: BinaryIO) -> None:
        super().__init__()
        self._out = out
        self._buf = bytearray()
        self._finish_on_close = True

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:
        if self.closed:
            raise ValueError("write to a closed PktWriter")
        view = memoryview(data).cast("B")
        size = view.nbytes
        pos = 0
        if self._buf:
            take = min(MAX_PAYLOAD - len(self._buf), size)
            self._buf += view[:take]
            pos = take
            if len(self._buf) == MAX_PAYLOAD:
                write_packet(self._out, self._buf)
                self._buf.clear()
        # Whole packets straight from the caller's buffer, no copy.
        while size - pos >= MAX_PAYLOAD:
            write_packet(self._out, view[pos : pos + MAX_PAYLOAD])
            pos += MAX_PAYLOAD
        if pos < size:
            self._buf += view[pos:]
        return size

    def flush(self) -> None:
        if not self.closed:
            self._out.flush()

    def abandon(self) -> None:
        """Close without sending the partial packet or the flush (the caller reports failure)."""
        self._finish_on_close = False
        self._buf.clear()
        super().close()

    def __exit__(self, *exc_info: object) -> None:
        # Leaving a ``with`` block by exception must not make a partial section look complete.
        if exc_info[0] is not None:
            self.abandon()
        else:
            self.close()

    def __del__(self) -> None:
        # Never emit packets from the garbage collector.
        self._finish_on_close = False
        super().__del__()

    def close(self) -> None:
        if self.closed:
            return
        if not self._finish_on_close:
            super().close()
            return
        try:
            if self._buf:
                write_packet(self._out, self._buf)
                self._buf.clear()
            write_flush(self._out)
            self._out.flush()
        finally:
            super().close()
