"""The Xet CAS HTTP protocol: routes, header names, JSON models, CRC-64/NVME.

Shared by the client (``gitxet.remote.client``) and the server (``gitxet.server``), so the
two cannot drift apart. Everything here is pure: no I/O, no HTTP library.

JSON parsing is strict: a field of the wrong type, a negative or inverted range, or a hash
that is not Xet hex raises :class:`~gitxet.errors.RemoteError` naming the field, because a
malformed answer is the remote's fault, not ours. Ranges follow the protocol's
conventions (``docs/operations/server.md``, ``xet-protocol.md`` §6): chunk ranges are
end-exclusive, byte ranges (``url_range`` / ``bytes`` / HTTP ``Range``) end-inclusive.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gitxet.errors import RemoteError
from gitxet.hashing import from_hex_many, is_hex, merkle_root_of, to_hex

__all__ = [
    "CHUNK_PREFIXES",
    "DEFAULT_PREFIX",
    "Discovery",
    "FetchInfo",
    "Grant",
    "Reconstruction",
    "Term",
    "XorbLocation",
    "chunk_route",
    "crc64nvme",
    "format_range",
    "parse_decimal",
    "parse_range_header",
    "xorb_commit_route",
    "xorb_grant_route",
    "xorb_route",
]

# ---------------------------------------------------------------------------- routes

HEALTHZ = "/healthz"
TELEMETRY = "/v1/telemetry"
RECONSTRUCTION_V1 = "/v1/reconstructions/{file_id}"
RECONSTRUCTION_V2 = "/v2/reconstructions/{file_id}"
SHARDS_V1 = "/v1/shards"
SHARDS_V2 = "/v2/shards"
#: gitxet extension: a stored shard with the file's block and the CAS blocks of every xorb
#: its terms touch, so a client can verify ranged reads chunk by chunk. With
#: ``?xorbs=0`` the file's block alone: a reader takes each xorb's chunk list once, from its
#: location, instead of once per file (a xorb packing 1,000 small files would otherwise
#: send its chunk list 1,000 times).
FILE_SHARD = "/v1/file-shards/{file_id}"
FILE_SHARD_TERMS_ONLY = "xorbs=0"
#: gitxet extension: the blocks of many files in one answer (``POST`` a JSON list of file
#: hashes; the answer is one stored shard holding the block of each file the server knows,
#: without xorb blocks, as ``?xorbs=0`` for one file). A clone of 20,000 small files asks
#: for their descriptions in 20 requests instead of 20,000.
FILE_SHARDS = "/v1/file-shards"
#: Most file hashes in one ``POST /v1/file-shards`` (an answer stays under ~1 MB for files
#: of a few terms; a client sends larger lists in batches of this size).
MAX_FILE_SHARDS_BATCH = 1000
#: gitxet extension: where a whole xorb can be fetched, with its chunk layout.
XORB_LOCATION = "/v1/xorb-locations/{xorb}"
#: gitxet extension: which of a list of files the CAS cannot serve (one POST for many).
FILE_PRESENCE = "/v1/file-presence"
#: Most file hashes in one presence request.
MAX_PRESENCE_BATCH = 10_000
#: Path appended to a git repository URL to discover its CAS endpoint.
DISCOVERY_SUFFIX = "/info/xet"

#: The xorb namespace every client uses.
DEFAULT_PREFIX = "default"
#: Global-dedup prefixes: the spec's ``default-merkledb`` and hf_xet 1.8's ``default``.
CHUNK_PREFIXES = ("default", "default-merkledb")

SESSION_HEADER = "X-Xet-Session-Id"
NDJSON = "application/x-ndjson"
OCTET = "application/octet-stream"


def xorb_route(xorb_hex: str, prefix: str = DEFAULT_PREFIX) -> str:
    """``POST`` path for a plain xorb upload."""
    return f"/v1/xorbs/{prefix}/{xorb_hex}"


def xorb_grant_route(xorb_hex: str, prefix: str = DEFAULT_PREFIX) -> str:
    """``POST`` path that asks for an upload grant."""
    return f"/v1/xorb-grants/{prefix}/{xorb_hex}"


def xorb_commit_route(xorb_hex: str, grant_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """``POST`` path that commits a granted upload."""
    return f"/v1/xorb-commits/{prefix}/{xorb_hex}/grant/{grant_id}"


def chunk_route(chunk_hex: str, prefix: str = DEFAULT_PREFIX) -> str:
    """``GET`` path of the global-dedup query for one chunk."""
    return f"/v1/chunks/{prefix}/{chunk_hex}"


# ---------------------------------------------------------------------------- ranges

_RANGE_RE = re.compile(r"bytes=([0-9]{1,19})-([0-9]{0,19})")
_DECIMAL_RE = re.compile(r"[0-9]+")


def parse_decimal(text: str, max_digits: int = 19) -> int | None:
    """A non-negative decimal of ASCII digits only, or ``None``.

    ``str.isdigit`` and ``\\d`` accept other scripts' digits and marks such as ``²`` (which
    ``int`` then refuses or reads as a number), so untrusted fields go through this.
    """
    if len(text) > max_digits or not _DECIMAL_RE.fullmatch(text):
        return None
    return int(text)


def parse_range_header(value: str) -> tuple[int, int | None]:
    """Parse a single ``bytes=a-b`` or ``bytes=a-`` range; returns ``(a, b or None)``.

    Multi-range and suffix (``bytes=-n``) forms are not part of the CAS protocol.

    Raises:
        ValueError: anything else, or ``b < a``.
    """
    m = _RANGE_RE.fullmatch(value.strip())
    if m is None:
        raise ValueError(f"unsupported Range header {value[:60]!r}")
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) else None
    if b is not None and b < a:
        raise ValueError(f"inverted range {a}-{b}")
    return a, b


def format_range(start: int, end_inclusive: int) -> str:
    """An HTTP ``Range`` header value for ``[start, end_inclusive]``."""
    return f"bytes={start}-{end_inclusive}"


# ---------------------------------------------------------------------------- JSON helpers


def _bad(what: str, reason: str) -> RemoteError:
    return RemoteError(f"malformed server response: {what}: {reason}")


def _obj(v: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise _bad(what, "expected an object")
    return v


def _int(v: Any, what: str) -> int:
    # bool is an int subclass; a JSON true is not a number here.
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise _bad(what, "expected a non-negative integer")
    return v


def _ints(v: list[Any], what: str) -> list[int]:
    """A list of non-negative integers (checked in one pass: a xorb's offsets are
    thousands)."""
    # (type is int: a JSON true is a bool, not a number here)
    if not all(type(x) is int and x >= 0 for x in v):
        raise _bad(what, "expected non-negative integers")
    return v


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise _bad(what, "expected a string")
    return v


def _hex(v: Any, what: str) -> str:
    s = _str(v, what)
    if not is_hex(s):
        raise _bad(what, "expected a 64-digit Xet hex hash")
    return s


def _list(v: Any, what: str) -> list[Any]:
    if not isinstance(v, list):
        raise _bad(what, "expected a list")
    return v


def _chunk_range(v: Any, what: str) -> tuple[int, int]:
    o = _obj(v, what)
    s, e = _int(o.get("start"), f"{what}.start"), _int(o.get("end"), f"{what}.end")
    if not s < e:
        raise _bad(what, f"empty chunk range [{s}, {e})")
    return s, e


def _byte_range(v: Any, what: str) -> tuple[int, int]:
    o = _obj(v, what)
    s, e = _int(o.get("start"), f"{what}.start"), _int(o.get("end"), f"{what}.end")
    if e < s:
        raise _bad(what, f"inverted byte range {s}-{e}")
    return s, e


# ---------------------------------------------------------------------------- reconstruction


@dataclass(frozen=True)
class Term:
    """Chunks ``[chunk_start, chunk_end)`` of xorb ``xorb_hex``, ``unpacked_length`` bytes."""

    xorb_hex: str
    chunk_start: int
    chunk_end: int
    unpacked_length: int


@dataclass(frozen=True)
class FetchInfo:
    """Where chunks ``[chunk_start, chunk_end)`` of a xorb can be fetched.

    ``byte_start``/``byte_end`` are the inclusive offsets to put in the ``Range`` header.
    """

    chunk_start: int
    chunk_end: int
    url: str
    byte_start: int
    byte_end: int

    def covers(self, term: Term) -> bool:
        """Whether this entry's chunk range holds the whole of ``term``."""
        return self.chunk_start <= term.chunk_start and term.chunk_end <= self.chunk_end


@dataclass(frozen=True)
class Reconstruction:
    """A file (or byte range) as terms plus fetch locations; the V1/V2 JSON normalised.

    ``offset_into_first_range`` decoded bytes are dropped from the first term; the caller
    truncates the tail to the length it asked for.
    """

    terms: list[Term]
    fetch: dict[str, list[FetchInfo]] = field(default_factory=dict)
    offset_into_first_range: int = 0

    def fetch_for(self, term: Term) -> FetchInfo:
        """The first fetch entry covering ``term``.

        Raises:
            RemoteError: the response has no entry for it.
        """
        for fi in self.fetch.get(term.xorb_hex, ()):
            if fi.covers(term):
                return fi
        raise _bad(
            "fetch info",
            f"no entry covers chunks {term.chunk_start}..{term.chunk_end} of {term.xorb_hex}",
        )

    # -- serialisation (server side) --------------------------------------------------

    def _terms_json(self) -> list[dict[str, Any]]:
        return [
            {
                "hash": t.xorb_hex,
                "unpacked_length": t.unpacked_length,
                "range": {"start": t.chunk_start, "end": t.chunk_end},
            }
            for t in self.terms
        ]

    def to_v1(self) -> dict[str, Any]:
        """The V1 JSON (``fetch_info``)."""
        return {
            "offset_into_first_range": self.offset_into_first_range,
            "terms": self._terms_json(),
            "fetch_info": {
                x: [
                    {
                        "range": {"start": f.chunk_start, "end": f.chunk_end},
                        "url": f.url,
                        "url_range": {"start": f.byte_start, "end": f.byte_end},
                    }
                    for f in fis
                ]
                for x, fis in self.fetch.items()
            },
        }

    def to_v2(self) -> dict[str, Any]:
        """The V2 JSON (``xorbs``): entries sharing a URL are grouped into one range list."""
        xorbs: dict[str, list[dict[str, Any]]] = {}
        for x, fis in self.fetch.items():
            by_url: dict[str, list[dict[str, Any]]] = {}
            for f in fis:
                by_url.setdefault(f.url, []).append(
                    {
                        "chunks": {"start": f.chunk_start, "end": f.chunk_end},
                        "bytes": {"start": f.byte_start, "end": f.byte_end},
                    }
                )
            xorbs[x] = [{"url": u, "ranges": r} for u, r in by_url.items()]
        return {
            "offset_into_first_range": self.offset_into_first_range,
            "terms": self._terms_json(),
            "xorbs": xorbs,
        }

    # -- parsing (client side) ----------------------------------------------------------

    @classmethod
    def _parse_common(cls, doc: Any) -> tuple[Mapping[str, Any], list[Term], int]:
        o = _obj(doc, "reconstruction")
        offset = _int(o.get("offset_into_first_range", 0), "offset_into_first_range")
        terms: list[Term] = []
        for i, t in enumerate(_list(o.get("terms"), "terms")):
            w = f"terms[{i}]"
            to = _obj(t, w)
            s, e = _chunk_range(to.get("range"), f"{w}.range")
            length = _int(to.get("unpacked_length"), f"{w}.unpacked_length")
            if length == 0:
                raise _bad(w, "zero unpacked_length")
            terms.append(Term(_hex(to.get("hash"), f"{w}.hash"), s, e, length))
        if terms and offset >= terms[0].unpacked_length:
            raise _bad("offset_into_first_range", "not inside the first term")
        return o, terms, offset

    @classmethod
    def from_v1(cls, doc: Any) -> Reconstruction:
        """Parse V1 JSON.

        Raises:
            RemoteError: malformed document.
        """
        o, terms, offset = cls._parse_common(doc)
        fetch: dict[str, list[FetchInfo]] = {}
        for x, entries in _obj(o.get("fetch_info", {}), "fetch_info").items():
            xh = _hex(x, "fetch_info key")
            out = fetch.setdefault(xh, [])
            for i, e in enumerate(_list(entries, f"fetch_info[{xh}]")):
                w = f"fetch_info[{xh}][{i}]"
                eo = _obj(e, w)
                cs, ce = _chunk_range(eo.get("range"), f"{w}.range")
                bs, be = _byte_range(eo.get("url_range"), f"{w}.url_range")
                out.append(FetchInfo(cs, ce, _str(eo.get("url"), f"{w}.url"), bs, be))
        return cls(terms, fetch, offset)

    @classmethod
    def from_v2(cls, doc: Any) -> Reconstruction:
        """Parse V2 JSON (each range of a URL becomes one :class:`FetchInfo`).

        Raises:
            RemoteError: malformed document.
        """
        o, terms, offset = cls._parse_common(doc)
        fetch: dict[str, list[FetchInfo]] = {}
        for x, entries in _obj(o.get("xorbs", {}), "xorbs").items():
            xh = _hex(x, "xorbs key")
            out = fetch.setdefault(xh, [])
            for i, e in enumerate(_list(entries, f"xorbs[{xh}]")):
                w = f"xorbs[{xh}][{i}]"
                eo = _obj(e, w)
                url = _str(eo.get("url"), f"{w}.url")
                for j, r in enumerate(_list(eo.get("ranges"), f"{w}.ranges")):
                    ro = _obj(r, f"{w}.ranges[{j}]")
                    cs, ce = _chunk_range(ro.get("chunks"), f"{w}.ranges[{j}].chunks")
                    bs, be = _byte_range(ro.get("bytes"), f"{w}.ranges[{j}].bytes")
                    out.append(FetchInfo(cs, ce, url, bs, be))
        return cls(terms, fetch, offset)


# ---------------------------------------------------------------------------- xorb locations


@dataclass(frozen=True)
class XorbLocation:
    """A signed data URL for one xorb and where each of its chunks is (gitxet extension).

    ``byte_offsets`` (n + 1 entries) locate each serialized chunk in the body,
    ``data_offsets`` (n + 1) in the decoded data; ``chunk_hashes`` are raw. A client checks
    the layout against the xorb hash (:meth:`verify`) before trusting it.
    """

    xorb_hex: str
    url: str
    chunk_hashes: tuple[bytes, ...]
    byte_offsets: tuple[int, ...]
    data_offsets: tuple[int, ...]

    @property
    def num_chunks(self) -> int:
        """Number of chunks in the xorb."""
        return len(self.chunk_hashes)

    def verify(self) -> bool:
        """Whether the chunk hashes and sizes Merkle-hash to the xorb's name."""
        sizes = [b - a for a, b in itertools.pairwise(self.data_offsets)]
        return (
            len(sizes) == len(self.chunk_hashes)
            and to_hex(merkle_root_of(self.chunk_hashes, sizes)) == self.xorb_hex
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON document of the route."""
        return {
            "hash": self.xorb_hex,
            "url": self.url,
            "chunk_hashes": [to_hex(h) for h in self.chunk_hashes],
            "byte_offsets": list(self.byte_offsets),
            "data_offsets": list(self.data_offsets),
        }

    @classmethod
    def from_json(cls, doc: Any) -> XorbLocation:
        """Parse (shape only; call :meth:`verify` for the content).

        Raises:
            RemoteError: malformed document.
        """
        o = _obj(doc, "xorb location")
        try:
            hashes = from_hex_many(_list(o.get("chunk_hashes"), "chunk_hashes"))
        except ValueError:
            raise _bad("chunk_hashes[]", "expected 64-digit Xet hex hashes") from None
        byte_offsets = _ints(_list(o.get("byte_offsets"), "byte_offsets"), "byte_offsets[]")
        data_offsets = _ints(_list(o.get("data_offsets"), "data_offsets"), "data_offsets[]")
        n = len(hashes)
        if n == 0 or len(byte_offsets) != n + 1 or len(data_offsets) != n + 1:
            raise _bad("xorb location", "offset lists do not match the chunk count")
        for name, offs in (("byte_offsets", byte_offsets), ("data_offsets", data_offsets)):
            if offs[0] != 0 or any(b <= a for a, b in itertools.pairwise(offs)):
                raise _bad(name, "not strictly increasing from 0")
        return cls(
            _hex(o.get("hash"), "hash"),
            _str(o.get("url"), "url"),
            tuple(hashes),
            tuple(byte_offsets),
            tuple(data_offsets),
        )


# ---------------------------------------------------------------------------- grants


@dataclass(frozen=True)
class Grant:
    """A server's permission to send one xorb to ``url`` without the bearer token."""

    id: str
    method: str
    url: str
    headers: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        """The 201 body of a grant request."""
        return {"id": self.id, "method": self.method, "url": self.url, "headers": self.headers}

    @classmethod
    def from_json(cls, doc: Any) -> Grant:
        """Parse a grant.

        Raises:
            RemoteError: malformed document.
        """
        o = _obj(doc, "grant")
        gid = _str(o.get("id"), "grant.id")
        if not re.fullmatch(r"[A-Za-z0-9_.~-]{1,128}", gid):
            raise _bad("grant.id", "not a URL-safe identifier")
        method = _str(o.get("method", "PUT"), "grant.method").upper()
        if method not in ("PUT", "POST"):
            raise _bad("grant.method", f"unsupported method {method}")
        headers = {
            _str(k, "grant.headers key"): _str(v, f"grant.headers[{k}]")
            for k, v in _obj(o.get("headers", {}), "grant.headers").items()
        }
        return cls(gid, method, _str(o.get("url"), "grant.url"), headers)


def grant_request(length: int, checksum: int) -> dict[str, Any]:
    """Body of a grant request: the xorb's length and CRC-64/NVME (decimal string)."""
    return {"length": length, "checksum": {"algo": "crc64nvme", "value": str(checksum)}}


def parse_grant_request(doc: Any) -> tuple[int, int | None]:
    """``(length, crc64nvme or None)`` from a grant request body.

    Raises:
        RemoteError: malformed document (the server answers 400).
    """
    o = _obj(doc, "grant request")
    length = _int(o.get("length"), "length")
    cs = o.get("checksum")
    if cs is None:
        return length, None
    co = _obj(cs, "checksum")
    algo = _str(co.get("algo"), "checksum.algo")
    if algo.lower() != "crc64nvme":
        return length, None
    value = _str(co.get("value"), "checksum.value")
    crc = parse_decimal(value, 20)
    if crc is None or crc >= 1 << 64:
        raise _bad("checksum.value", "not a decimal u64")
    return length, crc


# ---------------------------------------------------------------------------- file presence


def presence_request(file_hexes: list[str]) -> dict[str, Any]:
    """Body of a ``POST /v1/file-presence``: the files to ask about."""
    return {"files": file_hexes}


def parse_presence_request(doc: Any, limit: int = MAX_PRESENCE_BATCH) -> list[str]:
    """The file hashes of a presence (or ``POST /v1/file-shards``) request, server side:
    ``{"files": [hex, ...]}`` with at most ``limit`` hashes.

    Raises:
        RemoteError: malformed, or more than ``limit`` hashes.
    """
    files = _list(_obj(doc, "files request").get("files"), "files")
    if len(files) > limit:
        raise _bad("files", f"more than {limit} hashes")
    return [_hex(f, "files[]") for f in files]


def parse_presence_response(doc: Any, asked: set[str]) -> set[str]:
    """The missing files of a presence answer: ``{"missing": [hex, ...]}``, a subset of
    ``asked``.

    Raises:
        RemoteError: malformed, or naming a file that was not asked about.
    """
    missing = {_hex(f, "missing[]") for f in _list(_obj(doc, "presence").get("missing"), "missing")}
    if not missing <= asked:
        raise _bad("missing", "names a file that was not asked about")
    return missing


# ---------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class Discovery:
    """What ``<repo-url>/info/xet`` tells a client: the CAS endpoint and how to authenticate.

    ``token_hint`` is ``"git-credential"`` when the git credential's password is the CAS
    bearer token (gitxet servers). ``access_token``/``expires`` are present when the
    request was authenticated (the Hub's token-refresh shape, usable by hf_xet).
    """

    cas_url: str
    token_hint: str = "git-credential"
    access_token: str | None = None
    expires: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The discovery document."""
        doc: dict[str, Any] = {"casUrl": self.cas_url, "tokenHint": self.token_hint}
        if self.access_token is not None:
            doc["accessToken"] = self.access_token
        if self.expires is not None:
            doc["exp"] = self.expires
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> Discovery:
        """Parse a discovery document.

        Raises:
            RemoteError: malformed document.
        """
        o = _obj(doc, "discovery")
        url = _str(o.get("casUrl"), "casUrl")
        if not url.startswith(("http://", "https://")):
            raise _bad("casUrl", "not an http(s) URL")
        token = o.get("accessToken")
        exp = o.get("exp")
        return cls(
            url.rstrip("/"),
            _str(o.get("tokenHint", "git-credential"), "tokenHint"),
            None if token is None else _str(token, "accessToken"),
            None if exp is None else _int(exp, "exp"),
        )


# ---------------------------------------------------------------------------- CRC-64/NVME

_CRC64_POLY_REFLECTED = 0x9A6C9329AC4BC9B5  # 0xAD93D23594C93659 bit-reversed


def _crc64_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _CRC64_POLY_REFLECTED if c & 1 else c >> 1
        table.append(c)
    return table


_CRC64_TABLE = _crc64_table()


def _crc64nvme_py(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    c = crc ^ 0xFFFF_FFFF_FFFF_FFFF
    t = _CRC64_TABLE
    for b in bytes(data):
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFF_FFFF_FFFF_FFFF


def crc64nvme(data: bytes | bytearray | memoryview) -> int:
    """CRC-64/NVME of ``data`` (check value of ``b"123456789"``: ``0xae8b14860a799888``).

    Uses awscrt's native implementation (GB/s) when installed; the pure-Python table
    version (~10 MB/s) is the fallback and the test oracle.
    """
    native = _native_crc()
    if native is not None:
        return int(native(bytes(data) if isinstance(data, memoryview) else data))
    return _crc64nvme_py(data)


@functools.cache
def _native_crc() -> Callable[[bytes | bytearray], int] | None:
    """awscrt's CRC-64/NVME, loaded on first use: awscrt's library takes 40-150 ms to load,
    which every start of this module (each pre-push hook, each filter) would otherwise pay
    whether or not it uploads over HTTP."""
    try:
        mod = importlib.import_module("awscrt.checksums")
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    fn: Callable[[bytes | bytearray], int] | None = getattr(mod, "crc64nvme", None)
    return fn


def native_crc() -> bool:
    """Whether :func:`crc64nvme` runs at native speed (awscrt installed)."""
    return _native_crc() is not None
