"""XDR (RFC 4506) encoding and decoding on ``struct``.

The stdlib ``xdrlib`` left Python in 3.13, and it was lenient anyway. This decoder is strict:
every length is checked against the bytes that remain *before* anything is sliced or
allocated, booleans must be 0 or 1 and padding must be zero, so a hostile peer can neither
make us allocate a declared 4 GiB string nor smuggle bytes through padding.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import TypeVar

from gitxet.errors import XdrError

T = TypeVar("T")

_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")

U32_MAX = 0xFFFF_FFFF
U64_MAX = 0xFFFF_FFFF_FFFF_FFFF


def pad_len(n: int) -> int:
    """Bytes of zero padding that follow ``n`` bytes of opaque data."""
    return -n % 4


def opaque_size(n: int) -> int:
    """Encoded size of a variable-length opaque or string of ``n`` bytes."""
    return 4 + n + pad_len(n)


class Packer:
    """Appends XDR items to a growing buffer; ``bytes()`` gives the encoding."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def __bytes__(self) -> bytes:
        return bytes(self._buf)

    def __len__(self) -> int:
        return len(self._buf)

    def getvalue(self) -> bytes:
        """The bytes packed so far."""
        return bytes(self._buf)

    def u32(self, value: int) -> None:
        """Unsigned 32-bit integer (also used for enums whose values are non-negative)."""
        if not 0 <= value <= U32_MAX:
            raise XdrError("u32", f"{value} out of range")
        self._buf += _U32.pack(value)

    def i32(self, value: int) -> None:
        """Signed 32-bit integer."""
        if not -(2**31) <= value < 2**31:
            raise XdrError("i32", f"{value} out of range")
        self._buf += _I32.pack(value)

    def u64(self, value: int) -> None:
        """Unsigned hyper."""
        if not 0 <= value <= U64_MAX:
            raise XdrError("u64", f"{value} out of range")
        self._buf += _U64.pack(value)

    def i64(self, value: int) -> None:
        """Signed hyper."""
        if not -(2**63) <= value < 2**63:
            raise XdrError("i64", f"{value} out of range")
        self._buf += _I64.pack(value)

    def boolean(self, value: bool) -> None:
        """XDR bool: a 4-byte 0 or 1."""
        self._buf += _U32.pack(1 if value else 0)

    def fixed_opaque(self, data: bytes, size: int) -> None:
        """Fixed-length opaque: exactly ``size`` bytes plus padding, no length word."""
        if len(data) != size:
            raise XdrError("fixed opaque", f"expected {size} bytes, got {len(data)}")
        self._buf += data
        self._buf += b"\0" * pad_len(size)

    def opaque(self, data: bytes, max_len: int = U32_MAX) -> None:
        """Variable-length opaque: length word, bytes, zero padding."""
        if len(data) > max_len:
            raise XdrError("opaque", f"{len(data)} bytes exceeds limit {max_len}")
        self._buf += _U32.pack(len(data))
        self._buf += data
        self._buf += b"\0" * pad_len(len(data))

    def string(self, data: bytes | str, max_len: int = U32_MAX) -> None:
        """XDR string; ``str`` is encoded as UTF-8 (NFS names are bytes on the wire)."""
        self.opaque(data.encode() if isinstance(data, str) else data, max_len)

    def optional(self, value: T | None, pack_item: Callable[[T], None]) -> None:
        """XDR optional-data (``*T``): a bool, then the item when present."""
        if value is None:
            self.boolean(False)
        else:
            self.boolean(True)
            pack_item(value)

    def array(self, items: Iterable[T], pack_item: Callable[[T], None]) -> None:
        """Variable-length array: count word, then each item."""
        seq = list(items)
        self.u32(len(seq))
        for item in seq:
            pack_item(item)

    def raw(self, data: bytes) -> None:
        """Append already-encoded XDR bytes (its length must be a multiple of 4)."""
        if len(data) % 4:
            raise XdrError("raw", f"{len(data)} bytes is not a multiple of 4")
        self._buf += data


class Unpacker:
    """Reads XDR items from a buffer; every read is bounds-checked first."""

    __slots__ = ("_data", "_pos", "what")

    def __init__(self, data: bytes | bytearray | memoryview, what: str = "xdr") -> None:
        self._data = bytes(data)
        self._pos = 0
        self.what = what

    @property
    def pos(self) -> int:
        """Offset of the next unread byte."""
        return self._pos

    @property
    def remaining(self) -> int:
        """Bytes not yet read."""
        return len(self._data) - self._pos

    def _take(self, n: int, item: str) -> bytes:
        if n > self.remaining:
            raise XdrError(self.what, f"truncated {item}: need {n} bytes, {self.remaining} left")
        chunk = self._data[self._pos : self._pos + n]
        self._pos += n
        return chunk

    def u32(self) -> int:
        """Unsigned 32-bit integer."""
        (value,) = _U32.unpack(self._take(4, "u32"))
        return int(value)

    def i32(self) -> int:
        """Signed 32-bit integer."""
        (value,) = _I32.unpack(self._take(4, "i32"))
        return int(value)

    def u64(self) -> int:
        """Unsigned hyper."""
        (value,) = _U64.unpack(self._take(8, "u64"))
        return int(value)

    def i64(self) -> int:
        """Signed hyper."""
        (value,) = _I64.unpack(self._take(8, "i64"))
        return int(value)

    def boolean(self) -> bool:
        """XDR bool; anything but 0 or 1 is malformed."""
        value = self.u32()
        if value > 1:
            raise XdrError(self.what, f"bool must be 0 or 1, got {value}")
        return value == 1

    def _padding(self, n: int) -> None:
        pad = self._take(pad_len(n), "padding")
        if pad.strip(b"\0"):
            raise XdrError(self.what, "non-zero padding")

    def fixed_opaque(self, size: int) -> bytes:
        """Fixed-length opaque of ``size`` bytes (plus padding)."""
        if size + pad_len(size) > self.remaining:
            raise XdrError(self.what, f"truncated fixed opaque of {size} bytes")
        data = self._take(size, "fixed opaque")
        self._padding(size)
        return data

    def opaque(self, max_len: int = U32_MAX) -> bytes:
        """Variable-length opaque, at most ``max_len`` bytes."""
        n = self.u32()
        if n > max_len:
            raise XdrError(self.what, f"opaque length {n} exceeds limit {max_len}")
        # Checked before slicing: a declared length beyond the buffer must not allocate.
        if n + pad_len(n) > self.remaining:
            raise XdrError(self.what, f"opaque length {n} exceeds the {self.remaining} bytes left")
        data = self._take(n, "opaque")
        self._padding(n)
        return data

    def string(self, max_len: int = U32_MAX) -> bytes:
        """XDR string as raw bytes (no decoding: NFS names need not be UTF-8)."""
        return self.opaque(max_len)

    def optional(self, unpack_item: Callable[[], T]) -> T | None:
        """XDR optional-data: ``None`` when the leading bool is false."""
        return unpack_item() if self.boolean() else None

    def array(self, unpack_item: Callable[[], T], max_count: int = U32_MAX) -> list[T]:
        """Variable-length array of at most ``max_count`` items."""
        n = self.u32()
        if n > max_count:
            raise XdrError(self.what, f"array of {n} items exceeds limit {max_count}")
        # Every XDR item takes at least 4 bytes, so this bounds the list before building it.
        if n * 4 > self.remaining:
            raise XdrError(self.what, f"array of {n} items cannot fit in {self.remaining} bytes")
        return [unpack_item() for _ in range(n)]

    def rest(self) -> bytes:
        """All unread bytes (consumes them)."""
        return self._take(self.remaining, "rest")

    def done(self) -> None:
        """Raise unless every byte has been consumed."""
        if self.remaining:
            raise XdrError(self.what, f"{self.remaining} unexpected trailing bytes")
