"""ONC RPC v2 (RFC 5531): TCP record marking, CALL parsing, REPLY encoding, dispatch.

Only what a server needs: it reads CALLs, answers with accepted or denied REPLYs, and never
sends CALLs itself. AUTH_NONE and AUTH_SYS credentials are accepted (the export is
read-only and world-readable, so the credential only gets parsed, never trusted).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gitxet.errors import RpcRecordError, XdrError
from gitxet.mount.nfs.xdr import Packer, Unpacker

log = logging.getLogger(__name__)

RPC_VERSION = 2
MSG_CALL = 0
MSG_REPLY = 1
REPLY_ACCEPTED = 0
REPLY_DENIED = 1

LAST_FRAGMENT = 0x8000_0000
FRAGMENT_LEN_MASK = 0x7FFF_FFFF
MAX_AUTH_BYTES = 400  # RFC 5531: opaque_auth body is at most 400 bytes
MAX_MACHINE_NAME = 255
MAX_AUTH_GIDS = 16


class AuthFlavor(enum.IntEnum):
    """Credential / verifier flavors we recognise."""

    NONE = 0
    SYS = 1  # a.k.a. AUTH_UNIX
    SHORT = 2


class AcceptStat(enum.IntEnum):
    """Status of an accepted call."""

    SUCCESS = 0
    PROG_UNAVAIL = 1
    PROG_MISMATCH = 2
    PROC_UNAVAIL = 3
    GARBAGE_ARGS = 4
    SYSTEM_ERR = 5


class RejectStat(enum.IntEnum):
    """Why a call was denied."""

    RPC_MISMATCH = 0
    AUTH_ERROR = 1


class AuthStat(enum.IntEnum):
    """Detail of an AUTH_ERROR denial."""

    OK = 0
    BADCRED = 1
    REJECTEDCRED = 2
    BADVERF = 3
    REJECTEDVERF = 4
    TOOWEAK = 5


@dataclass(frozen=True, slots=True)
class OpaqueAuth:
    """A credential or verifier as sent: flavor plus opaque body."""

    flavor: int
    body: bytes = b""


NULL_AUTH = OpaqueAuth(AuthFlavor.NONE)


@dataclass(frozen=True, slots=True)
class AuthSys:
    """The parsed body of an AUTH_SYS credential."""

    stamp: int
    machine: bytes
    uid: int
    gid: int
    gids: tuple[int, ...]


@dataclass(slots=True)
class RpcCall:
    """One decoded CALL; ``args`` is positioned at the procedure arguments."""

    xid: int
    prog: int
    vers: int
    proc: int
    cred: OpaqueAuth
    verf: OpaqueAuth
    args: Unpacker
    auth_sys: AuthSys | None = None
    peer: str = ""


class RpcDenied(Exception):
    """Raised while parsing a CALL that must be answered with a denied reply."""

    def __init__(self, reply: bytes) -> None:
        super().__init__("rpc call denied")
        self.reply = reply


# --------------------------------------------------------------------------- record marking


def frame_record(payload: bytes) -> bytes:
    """Wrap one RPC message in record marking; split only if over the 2 GiB fragment limit."""
    if len(payload) <= FRAGMENT_LEN_MASK:
        return (LAST_FRAGMENT | len(payload)).to_bytes(4, "big") + payload
    parts: list[bytes] = []
    for start in range(0, len(payload), FRAGMENT_LEN_MASK):
        frag = payload[start : start + FRAGMENT_LEN_MASK]
        last = start + FRAGMENT_LEN_MASK >= len(payload)
        parts.append(((LAST_FRAGMENT if last else 0) | len(frag)).to_bytes(4, "big") + frag)
    return b"".join(parts)


class RecordReader:
    """Reassembles records from a byte stream (``recv(n)`` returns ``b""`` at EOF).

    ``max_record`` caps the reassembled size; a fragment header that would exceed it raises
    before any of that fragment is buffered, so a peer cannot make us allocate a 2 GiB record.
    """

    def __init__(self, recv: Callable[[int], bytes], max_record: int) -> None:
        self._recv = recv
        self.max_record = max_record

    def _exact(self, n: int, *, at_boundary: bool) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._recv(min(n - len(buf), 1 << 16))
            if not chunk:
                if at_boundary and not buf:
                    return None
                raise RpcRecordError("rpc record", f"stream ended {n - len(buf)} bytes short")
            buf += chunk
        return bytes(buf)

    def read(self) -> bytes | None:
        """The next complete record, or ``None`` on a clean end of stream."""
        record = bytearray()
        first = True
        while True:
            header = self._exact(4, at_boundary=first)
            if header is None:
                return None
            word = int.from_bytes(header, "big")
            length = word & FRAGMENT_LEN_MASK
            if len(record) + length > self.max_record:
                raise RpcRecordError(
                    "rpc record", f"record exceeds {self.max_record} bytes (fragment of {length})"
                )
            if length:
                frag = self._exact(length, at_boundary=False)
                assert frag is not None
                record += frag
            first = False
            if word & LAST_FRAGMENT:
                return bytes(record)


# --------------------------------------------------------------------------- replies


def _reply_head(xid: int, stat: int) -> Packer:
    p = Packer()
    p.u32(xid)
    p.u32(MSG_REPLY)
    p.u32(stat)
    return p


def accepted_reply(xid: int, stat: AcceptStat, body: bytes = b"") -> bytes:
    """An accepted REPLY with a null verifier; ``body`` is results or mismatch info."""
    p = _reply_head(xid, REPLY_ACCEPTED)
    p.u32(NULL_AUTH.flavor)
    p.opaque(NULL_AUTH.body)
    p.u32(stat)
    p.raw(body)
    return p.getvalue()


def success_reply(xid: int, results: bytes) -> bytes:
    """SUCCESS with encoded procedure results."""
    return accepted_reply(xid, AcceptStat.SUCCESS, results)


def prog_mismatch_reply(xid: int, low: int, high: int) -> bytes:
    """PROG_MISMATCH naming the versions we do support."""
    p = Packer()
    p.u32(low)
    p.u32(high)
    return accepted_reply(xid, AcceptStat.PROG_MISMATCH, p.getvalue())


def rpc_mismatch_reply(xid: int) -> bytes:
    """Denied: the caller does not speak RPC version 2."""
    p = _reply_head(xid, REPLY_DENIED)
    p.u32(RejectStat.RPC_MISMATCH)
    p.u32(RPC_VERSION)
    p.u32(RPC_VERSION)
    return p.getvalue()


def auth_error_reply(xid: int, why: AuthStat) -> bytes:
    """Denied: the credential or verifier is unacceptable."""
    p = _reply_head(xid, REPLY_DENIED)
    p.u32(RejectStat.AUTH_ERROR)
    p.u32(why)
    return p.getvalue()


# --------------------------------------------------------------------------- calls


def encode_call(
    xid: int,
    prog: int,
    vers: int,
    proc: int,
    args: bytes = b"",
    cred: OpaqueAuth = NULL_AUTH,
    verf: OpaqueAuth = NULL_AUTH,
) -> bytes:
    """Encode a CALL message (used by tests and by nothing on the serving path)."""
    p = Packer()
    p.u32(xid)
    p.u32(MSG_CALL)
    p.u32(RPC_VERSION)
    p.u32(prog)
    p.u32(vers)
    p.u32(proc)
    for auth in (cred, verf):
        p.u32(auth.flavor)
        p.opaque(auth.body, MAX_AUTH_BYTES)
    p.raw(args)
    return p.getvalue()


def encode_auth_sys(cred: AuthSys) -> OpaqueAuth:
    """An AUTH_SYS credential carrying ``cred``."""
    p = Packer()
    p.u32(cred.stamp)
    p.string(cred.machine, MAX_MACHINE_NAME)
    p.u32(cred.uid)
    p.u32(cred.gid)
    p.array(cred.gids, p.u32)
    return OpaqueAuth(AuthFlavor.SYS, p.getvalue())


def parse_auth_sys(body: bytes) -> AuthSys:
    """Decode an AUTH_SYS credential body strictly."""
    u = Unpacker(body, "auth_sys")
    stamp = u.u32()
    machine = u.string(MAX_MACHINE_NAME)
    uid = u.u32()
    gid = u.u32()
    gids = tuple(u.array(u.u32, MAX_AUTH_GIDS))
    u.done()
    return AuthSys(stamp, machine, uid, gid, gids)


def _opaque_auth(u: Unpacker) -> OpaqueAuth:
    flavor = u.u32()
    return OpaqueAuth(flavor, u.opaque(MAX_AUTH_BYTES))


def parse_call(record: bytes) -> RpcCall | None:
    """Decode a CALL header.

    Returns ``None`` for messages a server must drop silently (a REPLY, or bytes too short to
    hold an xid). Raises ``RpcDenied`` with a ready reply for a wrong RPC version or a bad
    credential, and ``XdrError`` when the header after the xid is malformed.
    """
    u = Unpacker(record, "rpc call")
    if u.remaining < 8:
        return None
    xid = u.u32()
    if u.u32() != MSG_CALL:
        return None
    if u.u32() != RPC_VERSION:
        raise RpcDenied(rpc_mismatch_reply(xid))
    prog, vers, proc = u.u32(), u.u32(), u.u32()
    try:
        cred = _opaque_auth(u)
        verf = _opaque_auth(u)
    except XdrError:
        raise RpcDenied(auth_error_reply(xid, AuthStat.BADCRED)) from None
    auth_sys = None
    if cred.flavor == AuthFlavor.SYS:
        try:
            auth_sys = parse_auth_sys(cred.body)
        except XdrError:
            raise RpcDenied(auth_error_reply(xid, AuthStat.BADCRED)) from None
    elif cred.flavor != AuthFlavor.NONE:
        raise RpcDenied(auth_error_reply(xid, AuthStat.BADCRED))
    if verf.flavor != AuthFlavor.NONE:
        raise RpcDenied(auth_error_reply(xid, AuthStat.BADVERF))
    args = Unpacker(u.rest(), f"args of prog {prog} proc {proc}")
    return RpcCall(xid, prog, vers, proc, cred, verf, args, auth_sys)


# --------------------------------------------------------------------------- dispatch

Handler = Callable[[RpcCall], bytes]


@dataclass(frozen=True)
class Program:
    """One RPC program version and its procedure table (proc number -> handler).

    A handler reads ``call.args`` (raising ``XdrError`` on bad input, which becomes
    GARBAGE_ARGS) and returns the encoded results.
    """

    prog: int
    vers: int
    procs: Mapping[int, Handler] = field(default_factory=dict)


class Dispatcher:
    """Routes decoded CALLs to programs and turns every failure into the right REPLY."""

    def __init__(self, programs: Iterable[Program]) -> None:
        self._programs: dict[int, dict[int, Program]] = {}
        for program in programs:
            self._programs.setdefault(program.prog, {})[program.vers] = program

    def handle_record(self, record: bytes, peer: str = "") -> bytes | None:
        """Answer one RPC record; ``None`` means send nothing (undecodable or not a CALL)."""
        try:
            call = parse_call(record)
        except RpcDenied as denied:
            return denied.reply
        except XdrError as exc:
            log.debug("dropping malformed rpc record from %s: %s", peer or "?", exc)
            return None
        if call is None:
            return None
        call.peer = peer
        return self.handle_call(call)

    def handle_call(self, call: RpcCall) -> bytes:
        """Run the procedure named by ``call`` and encode the reply."""
        log.debug(
            "call prog=%d vers=%d proc=%d xid=%#x from %s",
            call.prog,
            call.vers,
            call.proc,
            call.xid,
            call.peer or "?",
        )
        versions = self._programs.get(call.prog)
        if versions is None:
            return accepted_reply(call.xid, AcceptStat.PROG_UNAVAIL)
        program = versions.get(call.vers)
        if program is None:
            return prog_mismatch_reply(call.xid, min(versions), max(versions))
        handler = program.procs.get(call.proc)
        if handler is None:
            return accepted_reply(call.xid, AcceptStat.PROC_UNAVAIL)
        try:
            results = handler(call)
        except XdrError as exc:
            log.debug("garbage args for prog %d proc %d: %s", call.prog, call.proc, exc)
            return accepted_reply(call.xid, AcceptStat.GARBAGE_ARGS)
        except Exception:
            # A bug in a handler must not kill the connection; the client sees SYSTEM_ERR.
            log.exception("prog %d proc %d failed", call.prog, call.proc)
            return accepted_reply(call.xid, AcceptStat.SYSTEM_ERR)
        return success_reply(call.xid, results)
