"""XDR codec and ONC RPC framing: round trips, exact encodings, truncation and limits."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gitxet.errors import FormatError, RpcRecordError, XdrError
from gitxet.mount.nfs import rpc
from gitxet.mount.nfs.rpc import (
    AcceptStat,
    AuthFlavor,
    AuthStat,
    AuthSys,
    OpaqueAuth,
    RecordReader,
    RpcDenied,
    encode_auth_sys,
    encode_call,
    frame_record,
    parse_auth_sys,
    parse_call,
)
from gitxet.mount.nfs.xdr import Packer, Unpacker, opaque_size, pad_len

# ---------------------------------------------------------------------------------- XDR


def test_integer_encodings_are_big_endian() -> None:
    p = Packer()
    p.u32(1)
    p.i32(-2)
    p.u64(0x0102030405060708)
    p.i64(-1)
    p.boolean(True)
    p.boolean(False)
    assert p.getvalue() == (
        b"\x00\x00\x00\x01"
        b"\xff\xff\xff\xfe"
        b"\x01\x02\x03\x04\x05\x06\x07\x08"
        b"\xff\xff\xff\xff\xff\xff\xff\xff"
        b"\x00\x00\x00\x01"
        b"\x00\x00\x00\x00"
    )


def test_opaque_and_string_are_padded_to_four_bytes() -> None:
    p = Packer()
    p.opaque(b"abcde")
    p.string("hi")
    p.fixed_opaque(b"xyz", 3)
    assert p.getvalue() == (
        b"\x00\x00\x00\x05abcde\x00\x00\x00" + b"\x00\x00\x00\x02hi\x00\x00" + b"xyz\x00"
    )
    assert [pad_len(n) for n in range(5)] == [0, 3, 2, 1, 0]
    assert opaque_size(5) == 12


def test_round_trip_of_every_kind() -> None:
    p = Packer()
    p.u32(0xFFFF_FFFF)
    p.i32(-(2**31))
    p.u64(2**64 - 1)
    p.i64(-(2**63))
    p.boolean(True)
    p.opaque(b"")
    p.opaque(b"\x00\x01\x02")
    p.string(b"name\xff")
    p.fixed_opaque(b"12345678", 8)
    p.optional(7, p.u32)
    p.optional(None, p.u32)
    p.array([1, 2, 3], p.u64)
    u = Unpacker(p.getvalue())
    assert u.u32() == 0xFFFF_FFFF
    assert u.i32() == -(2**31)
    assert u.u64() == 2**64 - 1
    assert u.i64() == -(2**63)
    assert u.boolean() is True
    assert u.opaque() == b""
    assert u.opaque() == b"\x00\x01\x02"
    assert u.string() == b"name\xff"
    assert u.fixed_opaque(8) == b"12345678"
    assert u.optional(u.u32) == 7
    assert u.optional(u.u32) is None
    assert u.array(u.u64) == [1, 2, 3]
    u.done()


@given(st.lists(st.binary(max_size=40), max_size=8), st.integers(0, 2**64 - 1))
def test_round_trip_property(blobs: list[bytes], n: int) -> None:
    p = Packer()
    p.array(blobs, p.opaque)
    p.u64(n)
    encoded = p.getvalue()
    assert len(encoded) % 4 == 0
    u = Unpacker(encoded)
    assert u.array(u.opaque) == blobs
    assert u.u64() == n
    u.done()


@pytest.mark.parametrize(
    ("method", "value"),
    [("u32", -1), ("u32", 2**32), ("i32", 2**31), ("u64", -1), ("u64", 2**64), ("i64", 2**63)],
)
def test_packer_rejects_out_of_range(method: str, value: int) -> None:
    with pytest.raises(XdrError):
        getattr(Packer(), method)(value)


def test_packer_rejects_wrong_fixed_size_and_overlong_opaque() -> None:
    with pytest.raises(XdrError, match="expected 8"):
        Packer().fixed_opaque(b"1234", 8)
    with pytest.raises(XdrError, match="limit"):
        Packer().opaque(b"x" * 65, max_len=64)
    with pytest.raises(XdrError, match="multiple of 4"):
        Packer().raw(b"abc")


def test_every_truncation_of_a_message_raises() -> None:
    p = Packer()
    p.u32(3)
    p.u64(9)
    p.opaque(b"hello")
    p.array([1, 2], p.u32)
    data = p.getvalue()
    for cut in range(len(data)):
        u = Unpacker(data[:cut])
        with pytest.raises(XdrError):
            u.u32()
            u.u64()
            u.opaque()
            u.array(u.u32)


def test_huge_declared_lengths_fail_before_allocating() -> None:
    # 4 GiB string, 1 G-element array: both must be refused from the length word alone.
    with pytest.raises(XdrError, match="exceeds the 4 bytes left"):
        Unpacker(b"\xff\xff\xff\xf0" + b"abcd").opaque()
    with pytest.raises(XdrError, match="cannot fit"):
        Unpacker(b"\x40\x00\x00\x00" + b"\x00" * 8).array(Unpacker(b"").u32)


def test_limits_on_opaque_and_array() -> None:
    with pytest.raises(XdrError, match="limit 2"):
        Unpacker(b"\x00\x00\x00\x03abc\x00").opaque(max_len=2)
    u = Unpacker(b"\x00\x00\x00\x03" + b"\x00" * 12)
    with pytest.raises(XdrError, match="limit 2"):
        u.array(u.u32, max_count=2)


def test_strictness_bool_padding_and_trailing_bytes() -> None:
    with pytest.raises(XdrError, match="bool"):
        Unpacker(b"\x00\x00\x00\x02").boolean()
    with pytest.raises(XdrError, match="padding"):
        Unpacker(b"\x00\x00\x00\x01a\x00\x01\x00").opaque()
    with pytest.raises(XdrError, match="padding"):
        Unpacker(b"ab\x00\x07").fixed_opaque(2)
    u = Unpacker(b"\x00\x00\x00\x01\x00\x00\x00\x02")
    u.u32()
    with pytest.raises(XdrError, match="trailing"):
        u.done()


def test_xdr_error_is_a_format_error_naming_the_object() -> None:
    with pytest.raises(FormatError) as info:
        Unpacker(b"\x00", "READ args").u32()
    assert info.value.what == "READ args"
    assert "truncated" in info.value.reason


# ---------------------------------------------------------------------- record marking


def _reader(data: bytes, max_record: int = 1 << 20, step: int = 3) -> RecordReader:
    stream = io.BytesIO(data)
    # Return data in small pieces to exercise reassembly of short reads.
    return RecordReader(lambda n: stream.read(min(n, step)), max_record)


def test_record_round_trip_and_clean_eof() -> None:
    r = _reader(frame_record(b"first") + frame_record(b"") + frame_record(b"x" * 1000))
    assert r.read() == b"first"
    assert r.read() == b""
    assert r.read() == b"x" * 1000
    assert r.read() is None


def test_multi_fragment_record_is_reassembled() -> None:
    data = (
        (3).to_bytes(4, "big")
        + b"abc"
        + (0).to_bytes(4, "big")
        + (0x8000_0002).to_bytes(4, "big")
        + b"de"
    )
    assert _reader(data).read() == b"abcde"


def test_record_marking_header_sets_last_fragment_bit() -> None:
    assert frame_record(b"ab") == b"\x80\x00\x00\x02ab"


@pytest.mark.parametrize(
    "data",
    [b"\x80\x00", b"\x80\x00\x00\x05abc", (3).to_bytes(4, "big") + b"abc"],
    ids=["short-header", "short-body", "missing-last-fragment"],
)
def test_truncated_stream_raises(data: bytes) -> None:
    with pytest.raises(RpcRecordError, match="short"):
        _reader(data).read()


def test_record_cap_is_checked_from_the_header() -> None:
    calls: list[int] = []

    def recv(n: int) -> bytes:
        calls.append(n)
        return b"\xff\xff\xff\xff" if len(calls) == 1 else b"\x00" * n

    with pytest.raises(RpcRecordError, match="exceeds 1024"):
        RecordReader(recv, 1024).read()
    assert calls == [4]  # nothing of the 2 GiB fragment was read
    # Fragments that are fine alone but too big together are refused as well.
    two = (600).to_bytes(4, "big") + b"a" * 600 + (0x8000_0000 | 600).to_bytes(4, "big")
    with pytest.raises(RpcRecordError, match="exceeds 1024"):
        _reader(two + b"b" * 600, max_record=1024).read()


# --------------------------------------------------------------------------- calls


def test_parse_call_with_auth_sys() -> None:
    cred = encode_auth_sys(AuthSys(7, b"client", 1000, 100, (4, 27)))
    record = encode_call(0x1234, 100003, 3, 6, b"\x00\x00\x00\x09", cred=cred)
    call = parse_call(record)
    assert call is not None
    assert (call.xid, call.prog, call.vers, call.proc) == (0x1234, 100003, 3, 6)
    assert call.auth_sys == AuthSys(7, b"client", 1000, 100, (4, 27))
    assert call.args.u32() == 9
    call.args.done()


def test_parse_call_with_auth_none() -> None:
    call = parse_call(encode_call(1, 100005, 3, 0))
    assert call is not None
    assert call.cred.flavor == AuthFlavor.NONE
    assert call.auth_sys is None


def test_replies_and_short_records_are_dropped() -> None:
    assert parse_call(b"\x00\x00\x00\x01") is None
    assert parse_call(b"\x00\x00\x00\x01\x00\x00\x00\x01" + b"\x00" * 16) is None


def _denied(record: bytes) -> Unpacker:
    with pytest.raises(RpcDenied) as info:
        parse_call(record)
    u = Unpacker(info.value.reply)
    assert u.u32() == 0x42
    assert u.u32() == rpc.MSG_REPLY
    assert u.u32() == rpc.REPLY_DENIED
    return u


def test_wrong_rpc_version_is_denied_with_mismatch() -> None:
    record = bytearray(encode_call(0x42, 100003, 3, 0))
    record[8:12] = (3).to_bytes(4, "big")
    u = _denied(bytes(record))
    assert u.u32() == rpc.RejectStat.RPC_MISMATCH
    assert (u.u32(), u.u32()) == (2, 2)
    u.done()


@pytest.mark.parametrize(
    ("cred", "verf", "why"),
    [
        (OpaqueAuth(6, b"gss"), rpc.NULL_AUTH, AuthStat.BADCRED),
        (OpaqueAuth(AuthFlavor.SYS, b"\x00\x00"), rpc.NULL_AUTH, AuthStat.BADCRED),
        (rpc.NULL_AUTH, OpaqueAuth(AuthFlavor.SYS, b""), AuthStat.BADVERF),
    ],
    ids=["unknown-flavor", "truncated-auth-sys", "non-null-verifier"],
)
def test_bad_credentials_are_denied(cred: OpaqueAuth, verf: OpaqueAuth, why: AuthStat) -> None:
    u = _denied(encode_call(0x42, 100003, 3, 0, cred=cred, verf=verf))
    assert u.u32() == rpc.RejectStat.AUTH_ERROR
    assert u.u32() == why
    u.done()


def test_auth_sys_limits() -> None:
    with pytest.raises(XdrError):
        parse_auth_sys(encode_auth_sys(AuthSys(0, b"m", 0, 0, tuple(range(17)))).body)
    with pytest.raises(XdrError):
        parse_auth_sys(encode_auth_sys(AuthSys(0, b"m" * 256, 0, 0, ())).body)


def test_oversized_credential_is_denied() -> None:
    p = Packer()
    for v in (0x42, rpc.MSG_CALL, 2, 100003, 3, 0, AuthFlavor.SYS):
        p.u32(v)
    p.opaque(b"\x00" * 404)
    p.u32(0)
    p.opaque(b"")
    u = _denied(p.getvalue())
    assert (u.u32(), u.u32()) == (rpc.RejectStat.AUTH_ERROR, AuthStat.BADCRED)


# ---------------------------------------------------------------------- dispatcher


def _accepted(reply: bytes | None, xid: int = 9) -> tuple[int, Unpacker]:
    assert reply is not None
    u = Unpacker(reply)
    assert (u.u32(), u.u32(), u.u32()) == (xid, rpc.MSG_REPLY, rpc.REPLY_ACCEPTED)
    assert (u.u32(), u.opaque()) == (AuthFlavor.NONE, b"")
    return u.u32(), u


def _echo(call: rpc.RpcCall) -> bytes:
    value = call.args.u32()
    call.args.done()
    p = Packer()
    p.u32(value + 1)
    return p.getvalue()


def _boom(call: rpc.RpcCall) -> bytes:
    raise RuntimeError("bug")


DISPATCHER = rpc.Dispatcher(
    [rpc.Program(400000, 2, {0: _echo, 1: _boom}), rpc.Program(400000, 4, {0: _echo})]
)


def test_dispatch_success() -> None:
    stat, u = _accepted(DISPATCHER.handle_record(encode_call(9, 400000, 2, 0, b"\0\0\0\x29")))
    assert stat == AcceptStat.SUCCESS
    assert u.u32() == 42
    u.done()


def test_dispatch_prog_unavail_and_mismatch_and_proc_unavail() -> None:
    stat, u = _accepted(DISPATCHER.handle_record(encode_call(9, 400001, 2, 0)))
    assert stat == AcceptStat.PROG_UNAVAIL
    u.done()
    stat, u = _accepted(DISPATCHER.handle_record(encode_call(9, 400000, 3, 0)))
    assert stat == AcceptStat.PROG_MISMATCH
    assert (u.u32(), u.u32()) == (2, 4)
    u.done()
    stat, u = _accepted(DISPATCHER.handle_record(encode_call(9, 400000, 2, 7)))
    assert stat == AcceptStat.PROC_UNAVAIL
    u.done()


def test_dispatch_garbage_args_and_system_err(caplog: pytest.LogCaptureFixture) -> None:
    for args in (b"", b"\0\0", b"\0\0\0\x01\0\0\0\x02"):  # short, truncated, trailing
        record = encode_call(9, 400000, 2, 0) + args
        stat, _ = _accepted(DISPATCHER.handle_record(record))
        assert stat == AcceptStat.GARBAGE_ARGS
    stat, _ = _accepted(DISPATCHER.handle_record(encode_call(9, 400000, 2, 1)))
    assert stat == AcceptStat.SYSTEM_ERR
    assert "failed" in caplog.text


def test_dispatch_drops_undecodable_records() -> None:
    assert DISPATCHER.handle_record(b"") is None
    truncated_header = encode_call(9, 400000, 2, 0)[:20]
    assert DISPATCHER.handle_record(truncated_header) is None
