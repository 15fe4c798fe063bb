"""NFSv3, MOUNT and PORTMAP procedures fed raw RPC call bytes (no sockets).

Every call goes through the real dispatcher of an (unstarted) ``NFSServer``, so these tests
cover argument decoding, the procedure, result encoding and the RPC reply around it.
"""

from __future__ import annotations

import errno
import stat
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from gitxet.errors import IntegrityError
from gitxet.mount.nfs import nfs3
from gitxet.mount.nfs.handle import FH_SIZE, FileHandles, HandleError, fsid_for
from gitxet.mount.nfs.mountd import MOUNT_PROGRAM, MountProc, MountStat, normalize_export
from gitxet.mount.nfs.nfs3 import NFS_PROGRAM, FType, Proc, Status
from gitxet.mount.nfs.portmap import PMAP_PROGRAM, PmapProc, PortmapService
from gitxet.mount.nfs.rpc import (
    MSG_REPLY,
    NULL_AUTH,
    REPLY_ACCEPTED,
    AcceptStat,
    AuthSys,
    Dispatcher,
    OpaqueAuth,
    encode_auth_sys,
    encode_call,
)
from gitxet.mount.nfs.server import NFSServer
from gitxet.mount.nfs.xdr import Packer, Unpacker
from tests.helpers.memfs import MemoryFS

MTIME_NS = 1_700_000_000_123_456_789
BIG = bytes(range(256)) * (3 * 4096)  # 3 MiB
FSID = 0x1122334455667788
MANY = 200


def make_fs() -> MemoryFS:
    files: dict[str, object] = {
        "a.txt": b"hello world\n",
        "big.bin": BIG,
        "run.sh": b"#!/bin/sh\n",
        "dir/sub/deep.txt": b"deep",
        "link": ("link", "a.txt"),
        "empty": None,
        "zero": b"",
    }
    files.update({f"many/f{i:03d}": b"x" for i in range(MANY)})
    return MemoryFS(files, mtime_ns=MTIME_NS)


class Client:
    """Encodes calls, runs them through a dispatcher and checks the RPC reply header."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.xid = 100

    def raw(
        self, prog: int, proc: int, args: bytes, vers: int = 3, cred: OpaqueAuth = NULL_AUTH
    ) -> Unpacker:
        self.xid += 1
        reply = self.dispatcher.handle_record(encode_call(self.xid, prog, vers, proc, args, cred))
        assert reply is not None
        u = Unpacker(reply)
        assert (u.u32(), u.u32(), u.u32()) == (self.xid, MSG_REPLY, REPLY_ACCEPTED)
        u.u32()
        u.opaque()
        self.accept_stat = u.u32()
        return u

    def call(self, prog: int, proc: int, build: Callable[[Packer], None] | None = None) -> Unpacker:
        p = Packer()
        if build is not None:
            build(p)
        u = self.raw(prog, proc, p.getvalue(), vers=2 if prog == PMAP_PROGRAM else 3)
        assert self.accept_stat == AcceptStat.SUCCESS
        return u

    def nfs(self, proc: Proc, *items: int | bytes | tuple[str, int]) -> Unpacker:
        """Call with simple arguments: bytes are opaque, ints u32, ("u64", n) a hyper."""

        def build(p: Packer) -> None:
            for item in items:
                if isinstance(item, bytes):
                    p.opaque(item)
                elif isinstance(item, tuple):
                    p.u64(item[1])
                else:
                    p.u32(item)

        return self.call(NFS_PROGRAM, proc, build)


@dataclass
class Fattr:
    type: int
    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    used: int
    fsid: int
    fileid: int
    mtime: tuple[int, int]


def read_fattr(u: Unpacker) -> Fattr:
    ftype, mode, nlink, uid, gid = (u.u32() for _ in range(5))
    size, used = u.u64(), u.u64()
    u.u32(), u.u32()
    fsid, fileid = u.u64(), u.u64()
    atime, mtime, ctime = ((u.u32(), u.u32()) for _ in range(3))
    assert atime == mtime == ctime
    return Fattr(ftype, mode, nlink, uid, gid, size, used, fsid, fileid, mtime)


def read_post_op(u: Unpacker) -> Fattr | None:
    return read_fattr(u) if u.boolean() else None


def read_wcc(u: Unpacker) -> tuple[tuple[int, tuple[int, int]] | None, Fattr | None]:
    pre = None
    if u.boolean():
        size = u.u64()
        mtime = (u.u32(), u.u32())
        assert (u.u32(), u.u32()) == mtime
        pre = (size, mtime)
    return pre, read_post_op(u)


@pytest.fixture
def fs() -> MemoryFS:
    return make_fs()


@pytest.fixture
def server(fs: MemoryFS) -> NFSServer:
    return NFSServer(fs, fsid=FSID)


@pytest.fixture
def client(server: NFSServer) -> Client:
    return Client(server.dispatcher)


def raw_args(data: bytes) -> Callable[[Packer], None]:
    """A builder that appends already encoded arguments."""
    return lambda p: p.raw(data)


def fh_of(fs: MemoryFS, path: str) -> bytes:
    ino = fs.root_ino
    for part in path.split("/"):
        if part:
            ino = fs.lookup(ino, part.encode()).ino
    return FileHandles(FSID).encode(ino)


# ------------------------------------------------------------------------------ handles


def test_handle_round_trip_and_rejections() -> None:
    handles = FileHandles(FSID)
    fh = handles.encode(42)
    assert len(fh) == FH_SIZE == 20
    assert handles.decode(fh) == 42
    with pytest.raises(HandleError) as info:
        FileHandles(FSID + 1).decode(fh)
    assert info.value.stale
    for bad in (fh[:-1], b"XX" + fh[2:], fh[:2] + b"\x02" + fh[3:], fh[:3] + b"\x01" + fh[4:]):
        with pytest.raises(HandleError) as info:
            handles.decode(bad)
        assert not info.value.stale
    with pytest.raises(HandleError, match="reserved"):
        handles.decode(fh[:-8] + bytes(8))
    assert fsid_for("commit-a") == fsid_for("commit-a") != fsid_for("commit-b")


def test_default_fsid_is_stable_across_restarts() -> None:
    assert NFSServer(make_fs()).handles.fsid == NFSServer(make_fs()).handles.fsid
    assert NFSServer(make_fs()).handles.fsid != NFSServer(make_fs(), export="/x").handles.fsid


# ------------------------------------------------------------------------------- MOUNT


def mnt(client: Client, path: bytes, cred: OpaqueAuth = NULL_AUTH) -> tuple[int, bytes, list[int]]:
    p = Packer()
    p.string(path)
    u = client.raw(MOUNT_PROGRAM, MountProc.MNT, p.getvalue(), cred=cred)
    assert client.accept_stat == AcceptStat.SUCCESS
    status = u.u32()
    if status != MountStat.OK:
        u.done()
        return status, b"", []
    fh = u.opaque()
    flavors = u.array(u.u32)
    u.done()
    return status, fh, flavors


def test_mount_null_and_mnt_root(client: Client, fs: MemoryFS) -> None:
    client.call(MOUNT_PROGRAM, MountProc.NULL).done()
    status, fh, flavors = mnt(client, b"/")
    assert status == MountStat.OK
    assert fh == fh_of(fs, "")
    assert flavors == [1, 0]  # AUTH_UNIX, AUTH_NONE
    assert mnt(client, b"")[1] == fh  # libnfs asks for "" for files right under "/"


def test_mnt_subdirectory_and_errors(client: Client, fs: MemoryFS) -> None:
    assert mnt(client, b"/dir/sub/")[1] == fh_of(fs, "dir/sub")
    assert mnt(client, b"/a.txt")[0] == MountStat.NOTDIR
    assert mnt(client, b"/missing")[0] == MountStat.NOENT
    assert mnt(client, b"/dir/../dir")[0] == MountStat.INVAL
    assert mnt(client, b"relative")[0] == MountStat.INVAL


def test_named_export(fs: MemoryFS) -> None:
    client = Client(NFSServer(fs, export="/data/", fsid=FSID).dispatcher)
    assert mnt(client, b"/data")[1] == fh_of(fs, "")
    assert mnt(client, b"/data/dir")[1] == fh_of(fs, "dir")
    assert mnt(client, b"/")[0] == MountStat.ACCES
    assert mnt(client, b"/other")[0] == MountStat.ACCES
    u = client.call(MOUNT_PROGRAM, MountProc.EXPORT)
    assert u.boolean()
    assert u.string() == b"/data"
    assert not u.boolean()  # no group restriction
    assert not u.boolean()
    u.done()


def test_normalize_export() -> None:
    assert normalize_export("/") == "/"
    assert normalize_export("//a//b/") == "/a/b"
    for bad in ("a", "/a/../b", "/./a"):
        with pytest.raises(ValueError):
            normalize_export(bad)


def read_dump(client: Client) -> list[tuple[bytes, bytes]]:
    u = client.call(MOUNT_PROGRAM, MountProc.DUMP)
    out = []
    while u.boolean():
        out.append((u.string(), u.string()))
    u.done()
    return out


def test_dump_umnt_umntall(client: Client) -> None:
    cred = encode_auth_sys(AuthSys(1, b"host-a", 0, 0, ()))
    mnt(client, b"/", cred=cred)
    mnt(client, b"/dir", cred=cred)
    mnt(client, b"/")  # AUTH_NONE: recorded under the peer address
    assert read_dump(client) == [(b"host-a", b"/"), (b"host-a", b"/dir"), (b"unknown", b"/")]
    p = Packer()
    p.string(b"/dir")
    client.raw(MOUNT_PROGRAM, MountProc.UMNT, p.getvalue(), cred=cred).done()
    assert read_dump(client) == [(b"host-a", b"/"), (b"unknown", b"/")]
    client.raw(MOUNT_PROGRAM, MountProc.UMNTALL, b"", cred=cred).done()
    assert read_dump(client) == [(b"unknown", b"/")]


def test_mount_v1_is_a_program_mismatch(client: Client) -> None:
    u = client.raw(MOUNT_PROGRAM, MountProc.NULL, b"", vers=1)
    assert client.accept_stat == AcceptStat.PROG_MISMATCH
    assert (u.u32(), u.u32()) == (3, 3)


# ----------------------------------------------------------------------------- GETATTR


def test_getattr_root_and_file(client: Client, fs: MemoryFS) -> None:
    u = client.nfs(Proc.GETATTR, fh_of(fs, ""))
    assert u.u32() == Status.OK
    a = read_fattr(u)
    u.done()
    assert (a.type, a.mode, a.uid, a.gid, a.fsid) == (FType.DIR, 0o755, 0, 0, FSID)
    assert a.fileid == fs.root_ino
    assert a.mtime == (1_700_000_000, 123_456_789)
    u = client.nfs(Proc.GETATTR, fh_of(fs, "big.bin"))
    assert u.u32() == Status.OK
    a = read_fattr(u)
    assert (a.type, a.mode, a.size, a.nlink) == (FType.REG, 0o644, len(BIG), 1)
    u = client.nfs(Proc.GETATTR, fh_of(fs, "link"))
    assert u.u32() == Status.OK
    assert read_fattr(u).type == FType.LNK


def stale_handles(fs: MemoryFS) -> list[tuple[bytes, Status]]:
    good = fh_of(fs, "a.txt")
    return [
        (FileHandles(FSID ^ 1).encode(fs.root_ino), Status.STALE),  # another export
        (FileHandles(FSID).encode(99_999), Status.STALE),  # inode the model does not know
        (good[:-1], Status.BADHANDLE),
        (b"\x00" * FH_SIZE, Status.BADHANDLE),
        (b"", Status.BADHANDLE),
    ]


def test_stale_and_bad_handles(client: Client, fs: MemoryFS) -> None:
    for fh, expected in stale_handles(fs):
        u = client.nfs(Proc.GETATTR, fh)
        assert u.u32() == expected
        u.done()
        u = client.nfs(Proc.READ, fh, ("u64", 0), 10)
        assert u.u32() == expected
        assert read_post_op(u) is None
        u.done()
        u = client.nfs(Proc.READDIRPLUS, fh, ("u64", 0), ("u64", 0), 1000, 4000)
        assert u.u32() == expected
        assert read_post_op(u) is None
        u.done()


def test_oversized_handle_is_garbage(client: Client) -> None:
    client.raw(NFS_PROGRAM, Proc.GETATTR, Packer().getvalue())
    assert client.accept_stat == AcceptStat.GARBAGE_ARGS
    p = Packer()
    p.opaque(b"x" * 65)
    client.raw(NFS_PROGRAM, Proc.GETATTR, p.getvalue())
    assert client.accept_stat == AcceptStat.GARBAGE_ARGS


# ------------------------------------------------------------------------------ LOOKUP


def lookup(client: Client, dir_fh: bytes, name: bytes) -> tuple[int, bytes, Fattr | None]:
    u = client.nfs(Proc.LOOKUP, dir_fh, name)
    status = u.u32()
    if status != Status.OK:
        dir_attrs = read_post_op(u)
        u.done()
        return status, b"", dir_attrs
    fh = u.opaque()
    attrs = read_post_op(u)
    assert read_post_op(u) is not None  # directory attributes
    u.done()
    return status, fh, attrs


def test_lookup(client: Client, fs: MemoryFS) -> None:
    status, fh, attrs = lookup(client, fh_of(fs, "dir"), b"sub")
    assert status == Status.OK
    assert fh == fh_of(fs, "dir/sub")
    assert attrs is not None and attrs.type == FType.DIR
    assert lookup(client, fh_of(fs, "dir/sub"), b"..")[1] == fh_of(fs, "dir")
    assert lookup(client, fh_of(fs, ""), b"..")[1] == fh_of(fs, "")
    assert lookup(client, fh_of(fs, "dir"), b".")[1] == fh_of(fs, "dir")


def test_lookup_errors(client: Client, fs: MemoryFS) -> None:
    status, _, dir_attrs = lookup(client, fh_of(fs, ""), b"nope")
    assert status == Status.NOENT
    assert dir_attrs is not None and dir_attrs.fileid == fs.root_ino
    assert lookup(client, fh_of(fs, "a.txt"), b"x")[0] == Status.NOTDIR
    assert lookup(client, fh_of(fs, ""), b"n" * 256)[0] == Status.NAMETOOLONG
    assert lookup(client, fh_of(fs, ""), b"dir/sub")[0] == Status.INVAL
    assert lookup(client, fh_of(fs, ""), b"")[0] == Status.NOENT


# ---------------------------------------------------------------------- ACCESS, READLINK


@pytest.mark.parametrize(
    ("path", "granted"),
    [("", 0x01 | 0x02 | 0x20), ("a.txt", 0x01), ("run.sh", 0x01 | 0x20), ("link", 0x01)],
)
def test_access_grants_reading_only(client: Client, fs: MemoryFS, path: str, granted: int) -> None:
    u = client.nfs(Proc.ACCESS, fh_of(fs, path), 0x3F)
    assert u.u32() == Status.OK
    assert read_post_op(u) is not None
    assert u.u32() == granted
    u.done()
    u = client.nfs(Proc.ACCESS, fh_of(fs, path), 0x04 | 0x08 | 0x10)  # modify/extend/delete
    assert u.u32() == Status.OK
    read_post_op(u)
    assert u.u32() == 0


def test_readlink(client: Client, fs: MemoryFS) -> None:
    u = client.nfs(Proc.READLINK, fh_of(fs, "link"))
    assert u.u32() == Status.OK
    assert read_post_op(u) is not None
    assert u.string() == b"a.txt"
    u.done()
    u = client.nfs(Proc.READLINK, fh_of(fs, "a.txt"))
    assert u.u32() == Status.INVAL
    assert read_post_op(u) is not None
    u.done()


# -------------------------------------------------------------------------------- READ


def read(client: Client, fh: bytes, offset: int, count: int) -> tuple[int, bytes, bool]:
    u = client.nfs(Proc.READ, fh, ("u64", offset), count)
    status = u.u32()
    attrs = read_post_op(u)
    if status != Status.OK:
        u.done()
        return status, b"", False
    assert attrs is not None
    n = u.u32()
    eof = u.boolean()
    data = u.opaque()
    u.done()
    assert n == len(data)
    return status, data, eof


def test_read_ranges_and_eof(client: Client, fs: MemoryFS) -> None:
    fh = fh_of(fs, "a.txt")
    assert read(client, fh, 0, 100) == (Status.OK, b"hello world\n", True)
    assert read(client, fh, 0, 5) == (Status.OK, b"hello", False)
    assert read(client, fh, 6, 6) == (Status.OK, b"world\n", True)  # ends exactly at EOF
    assert read(client, fh, 12, 10) == (Status.OK, b"", True)
    assert read(client, fh, 2**63, 10) == (Status.OK, b"", True)
    assert read(client, fh, 3, 0) == (Status.OK, b"", False)
    assert read(client, fh_of(fs, "zero"), 0, 10) == (Status.OK, b"", True)


def test_read_is_capped_at_rtmax(client: Client, fs: MemoryFS) -> None:
    status, data, eof = read(client, fh_of(fs, "big.bin"), 4096, 2**32 - 1)
    assert status == Status.OK
    assert data == BIG[4096 : 4096 + nfs3.RTMAX]
    assert not eof


def test_read_wrong_types(client: Client, fs: MemoryFS) -> None:
    assert read(client, fh_of(fs, "dir"), 0, 10)[0] == Status.ISDIR
    assert read(client, fh_of(fs, "link"), 0, 10)[0] == Status.INVAL


def test_read_io_error_is_logged(
    client: Client, fs: MemoryFS, caplog: pytest.LogCaptureFixture
) -> None:
    fs.fail_reads = True
    assert read(client, fh_of(fs, "a.txt"), 0, 10)[0] == Status.IO
    assert any("READ" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)


class FaultyFS(MemoryFS):
    """Raises a chosen exception from ``read``."""

    error: BaseException = OSError(errno.EXDEV, "cross-device")

    def read(self, ino: int, offset: int, size: int) -> bytes:
        raise self.error


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (FileNotFoundError(errno.ENOENT, "gone"), Status.NOENT),
        (NotADirectoryError(errno.ENOTDIR, "x"), Status.NOTDIR),
        (IsADirectoryError(errno.EISDIR, "x"), Status.ISDIR),
        (OSError(errno.EIO, "x"), Status.IO),
        (OSError(errno.EINVAL, "x"), Status.INVAL),
        (OSError(errno.EXDEV, "x"), Status.SERVERFAULT),
        (OSError("no errno"), Status.SERVERFAULT),
        (IntegrityError("xorb", "ab", "bad hash"), Status.IO),
        (RuntimeError("bug"), Status.SERVERFAULT),
    ],
)
def test_errno_mapping(error: BaseException, status: Status) -> None:
    fs = FaultyFS({"f": b"data"})
    fs.error = error
    client = Client(NFSServer(fs, fsid=FSID).dispatcher)
    fh = FileHandles(FSID).encode(fs.lookup(fs.root_ino, b"f").ino)
    assert read(client, fh, 0, 4)[0] == status


def test_status_for_errno_table() -> None:
    assert nfs3.status_for_errno(errno.ENOENT) is Status.NOENT
    assert nfs3.status_for_errno(None) is Status.SERVERFAULT
    assert nfs3.status_for_errno(errno.ENOSPC) is Status.SERVERFAULT


# ------------------------------------------------------------------ write procedures


def sattr(p: Packer) -> None:
    p.boolean(True)  # mode
    p.u32(0o600)
    p.boolean(False)  # uid
    p.boolean(False)  # gid
    p.boolean(True)  # size
    p.u64(0)
    p.u32(1)  # atime: SET_TO_SERVER_TIME
    p.u32(2)  # mtime: SET_TO_CLIENT_TIME
    p.u32(5)
    p.u32(6)


def dirop(p: Packer, fh: bytes, name: bytes = b"new") -> None:
    p.opaque(fh)
    p.string(name)


def write_calls(file_fh: bytes, dir_fh: bytes) -> dict[str, tuple[Proc, Callable[[Packer], None]]]:
    def setattr_(p: Packer) -> None:
        p.opaque(file_fh)
        sattr(p)
        p.boolean(True)  # guard
        p.u32(1)
        p.u32(2)

    def write(p: Packer) -> None:
        p.opaque(file_fh)
        p.u64(0)
        p.u32(3)
        p.u32(2)  # FILE_SYNC
        p.opaque(b"abc")

    def create(mode: int) -> Callable[[Packer], None]:
        def build(p: Packer) -> None:
            dirop(p, dir_fh)
            p.u32(mode)
            if mode == 2:
                p.fixed_opaque(b"verifier", 8)
            else:
                sattr(p)

        return build

    def mkdir(p: Packer) -> None:
        dirop(p, dir_fh)
        sattr(p)

    def symlink(p: Packer) -> None:
        dirop(p, dir_fh)
        sattr(p)
        p.string(b"target")

    def mknod(kind: FType) -> Callable[[Packer], None]:
        def build(p: Packer) -> None:
            dirop(p, dir_fh)
            p.u32(kind)
            if kind in (FType.CHR, FType.BLK):
                sattr(p)
                p.u32(1)
                p.u32(3)
            elif kind in (FType.SOCK, FType.FIFO):
                sattr(p)

        return build

    def rename(p: Packer) -> None:
        dirop(p, dir_fh, b"a.txt")
        dirop(p, dir_fh, b"b.txt")

    def link(p: Packer) -> None:
        p.opaque(file_fh)
        dirop(p, dir_fh)

    def commit(p: Packer) -> None:
        p.opaque(file_fh)
        p.u64(0)
        p.u32(0)

    return {
        "setattr": (Proc.SETATTR, setattr_),
        "write": (Proc.WRITE, write),
        "create-unchecked": (Proc.CREATE, create(0)),
        "create-guarded": (Proc.CREATE, create(1)),
        "create-exclusive": (Proc.CREATE, create(2)),
        "mkdir": (Proc.MKDIR, mkdir),
        "symlink": (Proc.SYMLINK, symlink),
        "mknod-chr": (Proc.MKNOD, mknod(FType.CHR)),
        "mknod-fifo": (Proc.MKNOD, mknod(FType.FIFO)),
        "mknod-reg": (Proc.MKNOD, mknod(FType.REG)),
        "remove": (Proc.REMOVE, lambda p: dirop(p, dir_fh, b"a.txt")),
        "rmdir": (Proc.RMDIR, lambda p: dirop(p, dir_fh, b"dir")),
        "rename": (Proc.RENAME, rename),
        "link": (Proc.LINK, link),
        "commit": (Proc.COMMIT, commit),
    }


WRITE_CASES = list(write_calls(b"", b""))


def check_write_result(name: str, u: Unpacker, expect_attrs: bool) -> None:
    if name == "link":
        assert (read_post_op(u) is not None) == expect_attrs
        pre, post = read_wcc(u)
        assert (pre is not None, post is not None) == (expect_attrs, expect_attrs)
    else:
        for _ in range(2 if name == "rename" else 1):
            pre, post = read_wcc(u)
            assert (pre is not None, post is not None) == (expect_attrs, expect_attrs)
            if pre is not None and post is not None:
                assert pre == (post.size, post.mtime)  # nothing changed
    u.done()


@pytest.mark.parametrize("name", WRITE_CASES)
def test_every_write_procedure_is_rofs(client: Client, fs: MemoryFS, name: str) -> None:
    proc, build = write_calls(fh_of(fs, "a.txt"), fh_of(fs, ""))[name]
    u = client.call(NFS_PROGRAM, proc, build)
    assert u.u32() == Status.ROFS
    check_write_result(name, u, expect_attrs=True)
    assert fs.lookup(fs.root_ino, b"a.txt").size == 12


@pytest.mark.parametrize("name", WRITE_CASES)
def test_write_procedure_with_stale_handle(client: Client, fs: MemoryFS, name: str) -> None:
    stale = FileHandles(FSID ^ 1).encode(fs.root_ino)
    proc, build = write_calls(stale, stale)[name]
    u = client.call(NFS_PROGRAM, proc, build)
    assert u.u32() == Status.STALE
    check_write_result(name, u, expect_attrs=False)


@pytest.mark.parametrize("name", WRITE_CASES)
def test_write_procedure_truncated_args_are_garbage(
    client: Client, fs: MemoryFS, name: str
) -> None:
    proc, build = write_calls(fh_of(fs, "a.txt"), fh_of(fs, ""))[name]
    p = Packer()
    build(p)
    client.raw(NFS_PROGRAM, proc, p.getvalue()[:-4])
    assert client.accept_stat == AcceptStat.GARBAGE_ARGS


def test_bad_enums_are_garbage(client: Client, fs: MemoryFS) -> None:
    def create_bad(p: Packer) -> None:
        dirop(p, fh_of(fs, ""))
        p.u32(3)

    def write_bad_count(p: Packer) -> None:
        p.opaque(fh_of(fs, "a.txt"))
        p.u64(0)
        p.u32(4)
        p.u32(0)
        p.opaque(b"abc")

    for build in (create_bad, write_bad_count):
        p = Packer()
        build(p)
        client.raw(NFS_PROGRAM, Proc.CREATE if build is create_bad else Proc.WRITE, p.getvalue())
        assert client.accept_stat == AcceptStat.GARBAGE_ARGS


# ------------------------------------------------------------------- READDIR(PLUS)


def readdir_all(client: Client, fh: bytes, count: int) -> tuple[list[tuple[int, bytes]], int]:
    names: list[tuple[int, bytes]] = []
    cookie, verf, pages = 0, bytes(8), 0
    while True:
        p = Packer()
        p.opaque(fh)
        p.u64(cookie)
        p.fixed_opaque(verf, 8)
        p.u32(count)
        u = client.call(NFS_PROGRAM, Proc.READDIR, raw_args(p.getvalue()))
        assert u.u32() == Status.OK
        assert read_post_op(u) is not None
        verf = u.fixed_opaque(8)
        start = u.pos
        pages += 1
        while u.boolean():
            fileid, name, cookie = u.u64(), u.string(), u.u64()
            names.append((fileid, name))
        eof = u.boolean()
        u.done()
        assert u.pos - start + 4 + 88 + 8 + 4 <= count
        if eof:
            return names, pages


def test_readdir_pages_through_a_big_directory(client: Client, fs: MemoryFS) -> None:
    entries, pages = readdir_all(client, fh_of(fs, "many"), 1024)
    many = fs.lookup(fs.root_ino, b"many").ino
    expected = [(many, b"."), (fs.root_ino, b"..")]
    expected += [(a.ino, n) for n, a in fs.readdir(many)]
    assert entries == expected
    assert len(entries) == MANY + 2
    assert pages > 5
    whole, pages = readdir_all(client, fh_of(fs, "many"), 1 << 20)
    assert whole == expected and pages == 1


def readdir_status(client: Client, fh: bytes, cookie: int, verf: bytes, count: int) -> int:
    p = Packer()
    p.opaque(fh)
    p.u64(cookie)
    p.fixed_opaque(verf, 8)
    p.u32(count)
    u = client.call(NFS_PROGRAM, Proc.READDIR, raw_args(p.getvalue()))
    return u.u32()


def test_readdir_errors(client: Client, fs: MemoryFS) -> None:
    server_verf = FSID.to_bytes(8, "big")
    many = fh_of(fs, "many")
    assert readdir_status(client, many, 0, bytes(8), 100) == Status.TOOSMALL
    assert readdir_status(client, many, MANY + 3, server_verf, 4096) == Status.BAD_COOKIE
    assert readdir_status(client, many, 5, b"wrongvrf", 4096) == Status.BAD_COOKIE
    assert readdir_status(client, many, MANY + 2, server_verf, 4096) == Status.OK
    assert readdir_status(client, fh_of(fs, "a.txt"), 0, bytes(8), 4096) == Status.NOTDIR


def test_readdirplus_pages_with_attributes_and_handles(client: Client, fs: MemoryFS) -> None:
    many_fh = fh_of(fs, "many")
    seen: list[bytes] = []
    cookie, verf, pages = 0, bytes(8), 0
    dircount, maxcount = 512, 4096
    while True:
        p = Packer()
        p.opaque(many_fh)
        p.u64(cookie)
        p.fixed_opaque(verf, 8)
        p.u32(dircount)
        p.u32(maxcount)
        u = client.call(NFS_PROGRAM, Proc.READDIRPLUS, raw_args(p.getvalue()))
        start = u.pos
        assert u.u32() == Status.OK
        assert read_post_op(u) is not None
        verf = u.fixed_opaque(8)
        names_bytes = 0
        pages += 1
        while u.boolean():
            fileid, name, cookie = u.u64(), u.string(), u.u64()
            names_bytes += 8 + 4 + len(name) + (-len(name) % 4) + 8
            attrs = read_post_op(u)
            assert attrs is not None and attrs.fileid == fileid
            assert u.boolean()
            fh = u.opaque()
            assert FileHandles(FSID).decode(fh) == fileid
            seen.append(name)
        eof = u.boolean()
        u.done()
        assert u.pos - start <= maxcount
        assert names_bytes <= dircount
        if eof:
            break
    assert seen == [b".", b".."] + [f"f{i:03d}".encode() for i in range(MANY)]
    assert pages >= MANY * 150 // maxcount


def test_readdirplus_on_empty_dir_and_tiny_maxcount(client: Client, fs: MemoryFS) -> None:
    p = Packer()
    p.opaque(fh_of(fs, "empty"))
    p.u64(0)
    p.fixed_opaque(bytes(8), 8)
    p.u32(0)  # dircount 0: one entry is still returned per call
    p.u32(8192)
    u = client.call(NFS_PROGRAM, Proc.READDIRPLUS, raw_args(p.getvalue()))
    assert u.u32() == Status.OK
    read_post_op(u)
    u.fixed_opaque(8)
    assert u.boolean()
    assert (u.u64(), u.string(), u.u64()) == (fs.lookup(fs.root_ino, b"empty").ino, b".", 1)
    read_post_op(u)
    assert u.boolean()
    u.opaque()
    assert not u.boolean()
    assert not u.boolean()  # not eof: ".." follows
    p = Packer()
    p.opaque(fh_of(fs, "empty"))
    p.u64(0)
    p.fixed_opaque(bytes(8), 8)
    p.u32(4096)
    p.u32(150)
    u = client.call(NFS_PROGRAM, Proc.READDIRPLUS, raw_args(p.getvalue()))
    assert u.u32() == Status.TOOSMALL


# ------------------------------------------------------------------ FSSTAT/FSINFO/...


def test_fsinfo(client: Client, fs: MemoryFS) -> None:
    u = client.nfs(Proc.FSINFO, fh_of(fs, ""))
    assert u.u32() == Status.OK
    assert read_post_op(u) is not None
    rtmax, rtpref, rtmult, wtmax, wtpref, wtmult, dtpref = (u.u32() for _ in range(7))
    assert rtmax == rtpref == 1 << 20
    assert rtmult == wtmult == 4096 and wtmax >= wtpref > 0 and dtpref > 0
    assert u.u64() == 2**63 - 1
    assert (u.u32(), u.u32()) == (0, 1)
    props = u.u32()
    assert props == nfs3.FSF3_SYMLINK | nfs3.FSF3_HOMOGENEOUS | nfs3.FSF3_CANSETTIME
    u.done()


def test_fsstat(client: Client, fs: MemoryFS) -> None:
    u = client.nfs(Proc.FSSTAT, fh_of(fs, ""))
    assert u.u32() == Status.OK
    assert read_post_op(u) is not None
    tbytes, fbytes, abytes, tfiles, ffiles, afiles = (u.u64() for _ in range(6))
    stats = fs.statfs()
    assert (tbytes, tfiles) == (stats.total_bytes, stats.files)
    assert fbytes == abytes == ffiles == afiles == 0
    u.u32()
    u.done()


def test_pathconf(client: Client, fs: MemoryFS) -> None:
    u = client.nfs(Proc.PATHCONF, fh_of(fs, "a.txt"))
    assert u.u32() == Status.OK
    assert read_post_op(u) is not None
    u.u32()
    assert u.u32() == 255
    assert [u.boolean() for _ in range(4)] == [True, True, False, True]
    u.done()


def test_nfs_null_and_unknown_proc(client: Client) -> None:
    client.call(NFS_PROGRAM, Proc.NULL).done()
    client.raw(NFS_PROGRAM, 22, b"")
    assert client.accept_stat == AcceptStat.PROC_UNAVAIL
    client.raw(NFS_PROGRAM, Proc.NULL, b"", vers=4)
    assert client.accept_stat == AcceptStat.PROG_MISMATCH


# ------------------------------------------------------------------------------ PORTMAP


def test_portmap_getport_and_dump() -> None:
    table = {(NFS_PROGRAM, 3): 2049, (MOUNT_PROGRAM, 3): 20048}
    client = Client(Dispatcher([PortmapService(lambda: table).program()]))

    def getport(prog: int, prot: int) -> int:
        def build(p: Packer) -> None:
            for v in (prog, 3, prot, 0):
                p.u32(v)

        u = client.call(PMAP_PROGRAM, PmapProc.GETPORT, build)
        port = u.u32()
        u.done()
        return port

    assert getport(NFS_PROGRAM, 6) == 2049
    assert getport(MOUNT_PROGRAM, 6) == 20048
    assert getport(NFS_PROGRAM, 17) == 0  # no UDP
    assert getport(100021, 6) == 0  # no lock manager
    u = client.call(PMAP_PROGRAM, PmapProc.DUMP)
    rows = []
    while u.boolean():
        rows.append(tuple(u.u32() for _ in range(4)))
    assert sorted(rows) == [(NFS_PROGRAM, 3, 6, 2049), (MOUNT_PROGRAM, 3, 6, 20048)]


def test_mode_bits_survive(client: Client, fs: MemoryFS) -> None:
    u = client.nfs(Proc.GETATTR, fh_of(fs, "run.sh"))
    assert u.u32() == Status.OK
    assert stat.S_IMODE(read_fattr(u).mode) == 0o755
