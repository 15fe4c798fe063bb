"""The gitxet pointer file: the small text blob git stores instead of a large file.

The normative spec is ``docs/internals/pointer.md``. The format has exactly one valid
encoding per pointer, so the parser is deliberately unforgiving: a lenient parser turns a
damaged pointer into a file silently checked out as pointer text, and two encodings of the
same pointer make git see changes where there are none. Every rejection says what is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gitxet.errors import PointerFormatError

__all__ = [
    "MAX_POINTER_SIZE",
    "MAX_SIZE_VALUE",
    "MIN_POINTER_SIZE",
    "POINTER_SIZES",
    "VERSION_LINE",
    "VERSION_URL",
    "Pointer",
    "looks_like_pointer",
]

VERSION_URL = "https://gitxet.dev/spec/v1"
#: The exact first line of every version 1 pointer, LF included.
VERSION_LINE = f"version {VERSION_URL}\n".encode("ascii")
#: No pointer is longer than this; lets readers decide with one bounded read.
MAX_POINTER_SIZE = 1024
#: No pointer is shorter: the version line, a 64-digit oid, a size and a 64-digit xet-hash.
MIN_POINTER_SIZE = 192
#: Largest ``size`` a pointer may carry (a signed 64-bit file size, as in git-lfs).
MAX_SIZE_VALUE = 2**63 - 1
#: Every size a valid pointer can have: its one encoding is fixed but for the 1 to 19
#: digits of ``size``, so a blob of any other size is certainly not a pointer (a listing
#: that knows the sizes reads no other blob).
POINTER_SIZES = range(MIN_POINTER_SIZE, MIN_POINTER_SIZE + len(str(MAX_SIZE_VALUE)))

# Keys after ``version``, in the one allowed (sorted) order.
_KEYS = ("oid", "size", "xet-hash")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_OID = re.compile(r"sha256:([0-9a-f]{64})")
# No sign, no leading zeros except for the value 0, at most 19 digits (2**63 - 1 has 19).
_SIZE = re.compile(r"0|[1-9][0-9]{0,18}")

_WHAT = "pointer"


def _fail(reason: str) -> PointerFormatError:
    return PointerFormatError(_WHAT, reason)


@dataclass(frozen=True, slots=True)
class Pointer:
    """A parsed pointer: the content's SHA-256 (hex), its size, and its Xet file hash.

    ``xet_hash`` is in Xet hex form (the file id a CAS server knows). Construction checks
    every field, so any ``Pointer`` instance encodes to a valid pointer.
    """

    sha256: str
    size: int
    xet_hash: str

    def __post_init__(self) -> None:
        if not isinstance(self.sha256, str) or not _HEX64.fullmatch(self.sha256):
            raise _fail(f"sha256 must be 64 lowercase hex digits, got {self.sha256!r}")
        # bool is an int subclass; True as a size is always a bug.
        if not isinstance(self.size, int) or isinstance(self.size, bool):
            raise _fail(f"size must be an int, got {type(self.size).__name__}")
        if not 0 <= self.size <= MAX_SIZE_VALUE:
            raise _fail(f"size {self.size} is outside 0..2**63-1")
        if not isinstance(self.xet_hash, str) or not _HEX64.fullmatch(self.xet_hash):
            raise _fail(f"xet-hash must be 64 lowercase hex digits, got {self.xet_hash!r}")

    def encode(self) -> bytes:
        """Return the one canonical encoding of this pointer."""
        text = (
            f"version {VERSION_URL}\n"
            f"oid sha256:{self.sha256}\n"
            f"size {self.size}\n"
            f"xet-hash {self.xet_hash}\n"
        )
        return text.encode("ascii")

    @classmethod
    def decode(cls, data: bytes) -> Pointer:
        """Parse a pointer, accepting only its canonical encoding.

        Raises:
            PointerFormatError: with ``reason`` naming the line and the defect.
        """
        if len(data) > MAX_POINTER_SIZE:
            raise _fail(f"too long: {len(data)} bytes, the limit is {MAX_POINTER_SIZE}")
        if not data:
            raise _fail("empty input")
        if b"\r" in data:
            raise _fail("contains CR; lines must end with LF only")
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError as exc:
            raise _fail(f"non-ASCII byte at offset {exc.start}") from None
        if not text.endswith("\n"):
            raise _fail("the last line does not end with LF")

        lines = text[:-1].split("\n")
        if lines[0] + "\n" != VERSION_LINE.decode("ascii"):
            if lines[0].startswith("version "):
                raise _fail(f"line 1: unsupported version {lines[0][8:]!r}")
            raise _fail(f"line 1: expected {VERSION_LINE.decode('ascii')[:-1]!r}")

        values: dict[str, str] = {}
        for index, line in enumerate(lines[1:]):
            lineno = index + 2
            if index >= len(_KEYS):
                raise _fail(f"line {lineno}: unexpected data after the last key")
            expected = _KEYS[index]
            if not line:
                raise _fail(f"line {lineno}: empty line, expected key {expected!r}")
            key, sep, value = line.partition(" ")
            if not sep:
                raise _fail(f"line {lineno}: no space between key and value in {line!r}")
            if key != expected:
                if key in _KEYS:
                    if key in values:
                        raise _fail(f"line {lineno}: duplicate key {key!r}")
                    raise _fail(f"line {lineno}: key {key!r} out of order, expected {expected!r}")
                raise _fail(f"line {lineno}: unknown key {key!r}, expected {expected!r}")
            values[key] = value
        if len(values) < len(_KEYS):
            missing = _KEYS[len(values)]
            raise _fail(f"missing key {missing!r}")

        oid = _OID.fullmatch(values["oid"])
        if oid is None:
            raise _fail(
                f"line 2: oid must be 'sha256:' and 64 lowercase hex digits, got {values['oid']!r}"
            )
        size_text = values["size"]
        if not _SIZE.fullmatch(size_text):
            raise _fail(
                f"line 3: size must be decimal without sign or leading zeros, got {size_text!r}"
            )
        size = int(size_text)
        if size > MAX_SIZE_VALUE:
            raise _fail(f"line 3: size {size} exceeds 2**63-1")
        xet_hash = values["xet-hash"]
        if not _HEX64.fullmatch(xet_hash):
            raise _fail(f"line 4: xet-hash must be 64 lowercase hex digits, got {xet_hash!r}")

        pointer = cls(sha256=oid.group(1), size=size, xet_hash=xet_hash)
        # The checks above admit exactly the canonical form; keep that an invariant.
        if pointer.encode() != data:  # pragma: no cover - guarded by the checks above
            raise _fail("not in canonical form")
        return pointer


def looks_like_pointer(prefix: bytes) -> bool:
    """Cheap test on the first bytes of a blob: does it start with the pointer version line?

    Pass at least ``len(VERSION_LINE)`` bytes (reading ``MAX_POINTER_SIZE + 1`` bytes lets
    the caller also rule out over-long blobs). A ``True`` answer only means "parse it with
    ``Pointer.decode``"; a ``False`` answer means the blob is certainly not a pointer.
    """
    return prefix.startswith(VERSION_LINE)
