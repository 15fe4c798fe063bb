"""NFSv3 (RFC 1813, program 100003 version 3) procedures over a ``ReadOnlyFS``.

This is translation only: decode arguments, ask the model, encode results. Every procedure
that would change the tree decodes its arguments in full (so malformed calls still get
GARBAGE_ARGS) and then answers NFS3ERR_ROFS with weak cache consistency data showing that
nothing changed. ``errno`` values raised by the model become ``nfsstat3`` codes here.
"""

from __future__ import annotations

import enum
import errno
import logging
import struct
from collections.abc import Callable
from typing import TypeVar

from gitxet.errors import GitxetError, XdrError
from gitxet.mount.nfs.handle import NFS3_FHSIZE, FileHandles, HandleError
from gitxet.mount.nfs.rpc import Handler, Program, RpcCall
from gitxet.mount.nfs.xdr import U32_MAX, Packer, Unpacker, opaque_size
from gitxet.util.lru import LRUCache
from gitxet.vfs.nodes import Attrs, FSStats, NodeKind, ReadOnlyFS

log = logging.getLogger(__name__)

T = TypeVar("T")

NFS_PROGRAM = 100003
NFS_V3 = 3

RTMAX = 1 << 20  # largest READ we answer (and advertise as rtmax/rtpref)
WTMAX = 64 << 10  # advertised write size; writes are refused, so keep their records small
DTPREF = 64 << 10  # preferred READDIR size
MAX_DIR_REPLY = 1 << 20  # cap on READDIR(PLUS) replies whatever the client asks for
MAX_NAME_ARG = 1024  # filename3 longer than this is garbage; above name_max is NAMETOOLONG
MAX_PATH_ARG = 4096  # nfspath3 (SYMLINK target)
MAX_WRITE_ARG = 4 << 20  # WRITE data we are willing to decode before refusing it
MAX_FILE_SIZE = 2**63 - 1


class Proc(enum.IntEnum):
    """NFSv3 procedure numbers."""

    NULL = 0
    GETATTR = 1
    SETATTR = 2
    LOOKUP = 3
    ACCESS = 4
    READLINK = 5
    READ = 6
    WRITE = 7
    CREATE = 8
    MKDIR = 9
    SYMLINK = 10
    MKNOD = 11
    REMOVE = 12
    RMDIR = 13
    RENAME = 14
    LINK = 15
    READDIR = 16
    READDIRPLUS = 17
    FSSTAT = 18
    FSINFO = 19
    PATHCONF = 20
    COMMIT = 21


class Status(enum.IntEnum):
    """nfsstat3."""

    OK = 0
    PERM = 1
    NOENT = 2
    IO = 5
    NXIO = 6
    ACCES = 13
    EXIST = 17
    XDEV = 18
    NODEV = 19
    NOTDIR = 20
    ISDIR = 21
    INVAL = 22
    FBIG = 27
    NOSPC = 28
    ROFS = 30
    MLINK = 31
    NAMETOOLONG = 63
    NOTEMPTY = 66
    DQUOT = 69
    STALE = 70
    REMOTE = 71
    BADHANDLE = 10001
    NOT_SYNC = 10002
    BAD_COOKIE = 10003
    NOTSUPP = 10004
    TOOSMALL = 10005
    SERVERFAULT = 10006
    BADTYPE = 10007
    JUKEBOX = 10008


class FType(enum.IntEnum):
    """ftype3."""

    REG = 1
    DIR = 2
    BLK = 3
    CHR = 4
    LNK = 5
    SOCK = 6
    FIFO = 7


ACCESS3_READ = 0x01
ACCESS3_LOOKUP = 0x02
ACCESS3_MODIFY = 0x04
ACCESS3_EXTEND = 0x08
ACCESS3_DELETE = 0x10
ACCESS3_EXECUTE = 0x20

FSF3_LINK = 0x01
FSF3_SYMLINK = 0x02
FSF3_HOMOGENEOUS = 0x08
FSF3_CANSETTIME = 0x10

_FTYPE = {NodeKind.FILE: FType.REG, NodeKind.DIR: FType.DIR, NodeKind.SYMLINK: FType.LNK}

# Anything not listed is a server fault: the model promised only these.
_ERRNO_STATUS = {
    errno.ENOENT: Status.NOENT,
    errno.ENOTDIR: Status.NOTDIR,
    errno.EISDIR: Status.ISDIR,
    errno.EIO: Status.IO,
    errno.EINVAL: Status.INVAL,
    errno.EACCES: Status.ACCES,
    errno.EPERM: Status.PERM,
    errno.ENAMETOOLONG: Status.NAMETOOLONG,
    errno.EROFS: Status.ROFS,
    errno.ESTALE: Status.STALE,
    errno.EFBIG: Status.FBIG,
    errno.ENXIO: Status.NXIO,
}

FATTR3_SIZE = 84
POST_OP_ATTR_SIZE = 4 + FATTR3_SIZE
_NFSTIME = struct.Struct(">II")


class NfsStatusError(Exception):
    """Internal: abort a procedure with an ``nfsstat3`` other than OK."""

    def __init__(self, status: Status) -> None:
        super().__init__(status.name)
        self.status = status


def status_for_errno(code: int | None) -> Status:
    """The ``nfsstat3`` for an errno value (SERVERFAULT when there is no fitting one)."""
    return _ERRNO_STATUS.get(code or 0, Status.SERVERFAULT)


# --------------------------------------------------------------------------- encoders


def _nfstime(p: Packer, ns: int) -> None:
    secs, nsecs = divmod(max(ns, 0), 1_000_000_000)
    p.raw(_NFSTIME.pack(min(secs, U32_MAX), nsecs))


def pack_fattr3(p: Packer, a: Attrs, fsid: int) -> None:
    """fattr3 for ``a``: owner root, times all equal to the commit mtime."""
    p.u32(_FTYPE[a.kind])
    p.u32(a.mode & 0o7777)
    p.u32(min(a.nlink, U32_MAX))
    p.u32(0)  # uid
    p.u32(0)  # gid
    p.u64(a.size)
    p.u64(a.size)  # used
    p.u32(0)  # rdev.specdata1
    p.u32(0)  # rdev.specdata2
    p.u64(fsid)
    p.u64(a.ino)
    for _ in range(3):  # atime, mtime, ctime
        _nfstime(p, a.mtime_ns)


def pack_post_op_attr(p: Packer, a: Attrs | None, fsid: int) -> None:
    """post_op_attr: optional fattr3."""
    p.boolean(a is not None)
    if a is not None:
        pack_fattr3(p, a, fsid)


def pack_wcc_data(p: Packer, a: Attrs | None, fsid: int) -> None:
    """wcc_data with identical before and after: a read-only tree never changes."""
    p.boolean(a is not None)
    if a is not None:
        p.u64(a.size)
        _nfstime(p, a.mtime_ns)
        _nfstime(p, a.mtime_ns)
    pack_post_op_attr(p, a, fsid)


# --------------------------------------------------------------------------- decoders


def unpack_fh(u: Unpacker) -> bytes:
    """nfs_fh3."""
    return u.opaque(NFS3_FHSIZE)


def unpack_diropargs(u: Unpacker) -> tuple[bytes, bytes]:
    """diropargs3: (directory handle, name)."""
    return unpack_fh(u), u.string(MAX_NAME_ARG)


def _unpack_set_time(u: Unpacker) -> None:
    how = u.u32()
    if how == 2:  # SET_TO_CLIENT_TIME
        u.u32()
        u.u32()
    elif how > 2:
        raise_bad_enum(u, "time_how", how)


def raise_bad_enum(u: Unpacker, name: str, value: int) -> None:
    """Reject an out-of-range enum (or inconsistent) value as malformed input."""
    raise XdrError(u.what, f"bad {name} value {value}")


def unpack_sattr3(u: Unpacker) -> None:
    """sattr3, decoded for validity only (it is never applied)."""
    for _ in range(3):  # mode, uid, gid
        if u.boolean():
            u.u32()
    if u.boolean():  # size
        u.u64()
    _unpack_set_time(u)  # atime
    _unpack_set_time(u)  # mtime


# --------------------------------------------------------------------------- the service


#: directory entries of listings kept for the pages after the first (all directories)
LISTINGS_KEPT = 1 << 18
#: a listing longer than this is kept: it takes more than one page to send
LISTING_PAGED = 64


class NFS3Service:
    """The NFSv3 program: one handler per procedure, all over one ``ReadOnlyFS``."""

    def __init__(self, fs: ReadOnlyFS, handles: FileHandles) -> None:
        self.fs = fs
        self.handles = handles
        self.fsid = handles.fsid
        # Directories never change, so one verifier is valid for every listing we hand out.
        self.cookieverf = struct.pack(">Q", handles.fsid)
        self._name_max_cache: int | None = None
        # listings being paged through (READDIR(PLUS) with a cookie), by directory inode:
        # listing a directory again for every page made a big one quadratic (100,000
        # entries: 137 s through libnfs); bounded by the entries held
        self._listings: LRUCache[int, list[tuple[bytes, Attrs]]] = LRUCache(
            LISTINGS_KEPT, weigher=len
        )

    def program(self) -> Program:
        """The RPC procedure table."""
        table: dict[int, Handler] = {
            Proc.NULL: self.null,
            Proc.GETATTR: self.getattr,
            Proc.SETATTR: self.setattr,
            Proc.LOOKUP: self.lookup,
            Proc.ACCESS: self.access,
            Proc.READLINK: self.readlink,
            Proc.READ: self.read,
            Proc.WRITE: self.write,
            Proc.CREATE: self.create,
            Proc.MKDIR: self.mkdir,
            Proc.SYMLINK: self.symlink,
            Proc.MKNOD: self.mknod,
            Proc.REMOVE: self.remove,
            Proc.RMDIR: self.remove,  # same arguments and result shape as REMOVE
            Proc.RENAME: self.rename,
            Proc.LINK: self.link,
            Proc.READDIR: self.readdir,
            Proc.READDIRPLUS: self.readdirplus,
            Proc.FSSTAT: self.fsstat,
            Proc.FSINFO: self.fsinfo,
            Proc.PATHCONF: self.pathconf,
            Proc.COMMIT: self.commit,
        }
        return Program(NFS_PROGRAM, NFS_V3, table)

    # ---- model access with errno translation

    def _model(self, what: str, fn: Callable[..., T], *args: object) -> T:
        try:
            return fn(*args)
        except OSError as exc:
            status = status_for_errno(exc.errno)
            if status in (Status.IO, Status.SERVERFAULT):
                log.warning("NFS %s%r failed: %s", what, args, exc)
            raise NfsStatusError(status) from exc
        except GitxetError as exc:
            log.warning("NFS %s%r failed: %s", what, args, exc)
            raise NfsStatusError(Status.IO) from exc
        except Exception as exc:
            log.exception("NFS %s%r raised unexpectedly", what, args)
            raise NfsStatusError(Status.SERVERFAULT) from exc

    def _resolve(self, fh: bytes) -> Attrs:
        """Attributes of the node a handle names; BADHANDLE or STALE when it names none."""
        try:
            ino = self.handles.decode(fh)
        except HandleError as exc:
            raise NfsStatusError(Status.STALE if exc.stale else Status.BADHANDLE) from exc
        try:
            return self._model("GETATTR", self.fs.getattr, ino)
        except NfsStatusError as exc:
            # The model forgets nothing for a live commit, so an unknown inode is stale.
            if exc.status is Status.NOENT:
                raise NfsStatusError(Status.STALE) from exc
            raise

    def _attrs_quiet(self, fh: bytes) -> Attrs | None:
        """Attributes for an optional post_op_attr; ``None`` rather than an error."""
        try:
            return self._resolve(fh)
        except NfsStatusError:
            return None

    def _name(self, name: bytes) -> bytes:
        if len(name) > self._name_max():
            raise NfsStatusError(Status.NAMETOOLONG)
        if not name or b"/" in name or b"\0" in name:
            raise NfsStatusError(Status.NOENT if not name else Status.INVAL)
        return name

    def _statfs(self) -> FSStats:
        """The model's totals without waiting for a walk of the whole tree, when it can."""
        nowait = getattr(self.fs, "statfs_nowait", None)
        return nowait() if nowait is not None else self.fs.statfs()  # type: ignore[no-any-return]

    def _name_max(self) -> int:
        if self._name_max_cache is None:
            self._name_max_cache = self._model("FSSTAT", self._statfs).name_max
        return self._name_max_cache

    # ---- procedures that read

    def null(self, call: RpcCall) -> bytes:
        """NULL: ping."""
        call.args.done()
        return b""

    def getattr(self, call: RpcCall) -> bytes:
        """GETATTR."""
        fh = unpack_fh(call.args)
        call.args.done()
        p = Packer()
        try:
            attrs = self._resolve(fh)
        except NfsStatusError as exc:
            p.u32(exc.status)
            return p.getvalue()
        p.u32(Status.OK)
        pack_fattr3(p, attrs, self.fsid)
        return p.getvalue()

    def lookup(self, call: RpcCall) -> bytes:
        """LOOKUP: one name in one directory."""
        fh, name = unpack_diropargs(call.args)
        call.args.done()
        p = Packer()
        dir_attrs: Attrs | None = None
        try:
            dir_attrs = self._resolve(fh)
            if dir_attrs.kind is not NodeKind.DIR:
                raise NfsStatusError(Status.NOTDIR)
            child = self._model("LOOKUP", self.fs.lookup, dir_attrs.ino, self._name(name))
        except NfsStatusError as exc:
            return self._failed(exc.status, dir_attrs)
        p.u32(Status.OK)
        p.opaque(self.handles.encode(child.ino))
        pack_post_op_attr(p, child, self.fsid)
        pack_post_op_attr(p, dir_attrs, self.fsid)
        return p.getvalue()

    def access(self, call: RpcCall) -> bytes:
        """ACCESS: reading is allowed, changing never is."""
        fh = unpack_fh(call.args)
        requested = call.args.u32()
        call.args.done()
        try:
            attrs = self._resolve(fh)
        except NfsStatusError as exc:
            return self._failed(exc.status, None)
        if attrs.kind is NodeKind.DIR:
            granted = ACCESS3_READ | ACCESS3_LOOKUP | ACCESS3_EXECUTE
        elif attrs.kind is NodeKind.FILE:
            # Like a local root user: execute only if some execute bit is set.
            granted = ACCESS3_READ | (ACCESS3_EXECUTE if attrs.mode & 0o111 else 0)
        else:
            granted = ACCESS3_READ
        p = self._ok(attrs)
        p.u32(requested & granted)
        return p.getvalue()

    def readlink(self, call: RpcCall) -> bytes:
        """READLINK."""
        fh = unpack_fh(call.args)
        call.args.done()
        attrs: Attrs | None = None
        try:
            attrs = self._resolve(fh)
            if attrs.kind is not NodeKind.SYMLINK:
                raise NfsStatusError(Status.INVAL)
            target = self._model("READLINK", self.fs.readlink, attrs.ino)
        except NfsStatusError as exc:
            return self._failed(exc.status, attrs)
        p = self._ok(attrs)
        p.string(target)
        return p.getvalue()

    def read(self, call: RpcCall) -> bytes:
        """READ: up to ``min(count, RTMAX)`` bytes, ``eof`` when the data reaches the end."""
        u = call.args
        fh = unpack_fh(u)
        offset = u.u64()
        count = min(u.u32(), RTMAX)
        u.done()
        attrs: Attrs | None = None
        try:
            attrs = self._resolve(fh)
            if attrs.kind is NodeKind.DIR:
                raise NfsStatusError(Status.ISDIR)
            if attrs.kind is not NodeKind.FILE:
                raise NfsStatusError(Status.INVAL)
            if offset >= attrs.size or count == 0:
                data = b""
            else:
                data = self._model("READ", self.fs.read, attrs.ino, offset, count)
                if len(data) > count:
                    log.warning("model returned %d bytes for a read of %d", len(data), count)
                    data = data[:count]
        except NfsStatusError as exc:
            return self._failed(exc.status, attrs)
        p = self._ok(attrs)
        p.u32(len(data))
        p.boolean(offset + len(data) >= attrs.size)
        p.opaque(data)
        return p.getvalue()

    def _listing(
        self, fh: bytes, cookie: int, verf: bytes
    ) -> tuple[Attrs, list[tuple[bytes, Attrs]]]:
        """The directory, and its entries with ``.`` and ``..`` first; cookie ``i`` resumes
        after the ``i``-th entry, so cookies are positions in this fixed, sorted order."""
        attrs = self._resolve(fh)
        if attrs.kind is not NodeKind.DIR:
            raise NfsStatusError(Status.NOTDIR)
        if cookie and verf != self.cookieverf and verf != bytes(8):
            raise NfsStatusError(Status.BAD_COOKIE)
        entries = self._listings.get(attrs.ino) if cookie else None
        if entries is None:  # the first page lists afresh; the next pages use that listing
            parent = self._model("LOOKUP", self.fs.lookup, attrs.ino, b"..")
            children = self._model("READDIR", self.fs.readdir, attrs.ino)
            entries = [(b".", attrs), (b"..", parent), *children]
            if len(entries) > LISTING_PAGED:
                self._listings.put(attrs.ino, entries)
        if cookie > len(entries):
            raise NfsStatusError(Status.BAD_COOKIE)
        return attrs, entries

    def _failed(self, status: int, attrs: Attrs | None) -> bytes:
        """A failed reply: ``status`` and the post-op attributes of the object, if known."""
        p = Packer()
        p.u32(status)
        pack_post_op_attr(p, attrs, self.fsid)
        return p.getvalue()

    def _ok(self, attrs: Attrs | None) -> Packer:
        """A reply started: status OK and the post-op attributes of the object."""
        p = Packer()
        p.u32(Status.OK)
        pack_post_op_attr(p, attrs, self.fsid)
        return p

    def _dir_reply(self, attrs: Attrs, body: Packer, cookie: int, index: int, total: int) -> bytes:
        """A READDIR(PLUS) reply: the entries packed in ``body`` (those from ``cookie`` up to
        ``index`` of ``total``); TOOSMALL when not even the first one fitted."""
        if index == cookie and index < total:
            return self._failed(Status.TOOSMALL, attrs)
        p = self._ok(attrs)
        p.fixed_opaque(self.cookieverf, 8)
        p.raw(body.getvalue())
        p.boolean(False)
        p.boolean(index >= total)
        return p.getvalue()

    def readdir(self, call: RpcCall) -> bytes:
        """READDIR: names and fileids, paged so the reply fits in ``count`` bytes."""
        u = call.args
        fh = unpack_fh(u)
        cookie = u.u64()
        verf = u.fixed_opaque(8)
        count = min(u.u32(), MAX_DIR_REPLY)
        u.done()
        try:
            attrs, entries = self._listing(fh, cookie, verf)
        except NfsStatusError as exc:
            return self._failed(exc.status, self._attrs_quiet(fh))
        # status, dir attributes, verifier, end-of-list bool, eof bool
        used = 4 + POST_OP_ATTR_SIZE + 8 + 4 + 4
        body = Packer()
        index = cookie
        while index < len(entries):
            name, child = entries[index]
            size = 4 + 8 + opaque_size(len(name)) + 8
            if used + size > count:
                break
            used += size
            index += 1
            body.boolean(True)
            body.u64(child.ino)
            body.string(name)
            body.u64(index)
        return self._dir_reply(attrs, body, cookie, index, len(entries))

    def readdirplus(self, call: RpcCall) -> bytes:
        """READDIRPLUS: entries with attributes and handles, within ``dircount``/``maxcount``."""
        u = call.args
        fh = unpack_fh(u)
        cookie = u.u64()
        verf = u.fixed_opaque(8)
        dircount = u.u32()
        maxcount = min(u.u32(), MAX_DIR_REPLY)
        u.done()
        try:
            attrs, entries = self._listing(fh, cookie, verf)
        except NfsStatusError as exc:
            return self._failed(exc.status, self._attrs_quiet(fh))
        used = 4 + POST_OP_ATTR_SIZE + 8 + 4 + 4
        dir_used = 0
        handle_size = 4 + opaque_size(len(self.handles.encode(attrs.ino)))
        body = Packer()
        index = cookie
        while index < len(entries):
            name, child = entries[index]
            dir_size = 8 + opaque_size(len(name)) + 8
            size = 4 + dir_size + POST_OP_ATTR_SIZE + handle_size
            if used + size > maxcount:
                break
            # dircount bounds only the name part; the first entry is always allowed so a
            # client that sends a tiny dircount still makes progress.
            if index > cookie and dir_used + dir_size > dircount:
                break
            used += size
            dir_used += dir_size
            index += 1
            body.boolean(True)
            body.u64(child.ino)
            body.string(name)
            body.u64(index)
            pack_post_op_attr(body, child, self.fsid)
            body.boolean(True)
            body.opaque(self.handles.encode(child.ino))
        return self._dir_reply(attrs, body, cookie, index, len(entries))

    def fsstat(self, call: RpcCall) -> bytes:
        """FSSTAT: totals from the model; nothing is free, the tree never changes."""
        fh = unpack_fh(call.args)
        call.args.done()
        try:
            attrs = self._resolve(fh)
            stats = self._model("FSSTAT", self._statfs)
        except NfsStatusError as exc:
            return self._failed(exc.status, None)
        p = self._ok(attrs)
        p.u64(stats.total_bytes)
        p.u64(0)  # fbytes
        p.u64(0)  # abytes
        p.u64(stats.files)
        p.u64(0)  # ffiles
        p.u64(0)  # afiles
        p.u32(U32_MAX)  # invarsec: a commit does not change
        return p.getvalue()

    def fsinfo(self, call: RpcCall) -> bytes:
        """FSINFO: transfer sizes and properties."""
        fh = unpack_fh(call.args)
        call.args.done()
        try:
            attrs = self._resolve(fh)
        except NfsStatusError as exc:
            return self._failed(exc.status, None)
        p = self._ok(attrs)
        p.u32(RTMAX)  # rtmax
        p.u32(RTMAX)  # rtpref
        p.u32(4096)  # rtmult
        p.u32(WTMAX)  # wtmax
        p.u32(WTMAX)  # wtpref
        p.u32(4096)  # wtmult
        p.u32(DTPREF)  # dtpref
        p.u64(MAX_FILE_SIZE)
        p.u32(0)  # time_delta: nanosecond timestamps
        p.u32(1)
        p.u32(FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME)
        return p.getvalue()

    def pathconf(self, call: RpcCall) -> bytes:
        """PATHCONF."""
        fh = unpack_fh(call.args)
        call.args.done()
        try:
            attrs = self._resolve(fh)
            name_max = self._name_max()
        except NfsStatusError as exc:
            return self._failed(exc.status, None)
        p = self._ok(attrs)
        p.u32(32767)  # linkmax
        p.u32(name_max)
        p.boolean(True)  # no_trunc
        p.boolean(True)  # chown_restricted
        p.boolean(False)  # case_insensitive
        p.boolean(True)  # case_preserving
        return p.getvalue()

    # ---- procedures that would write: all NFS3ERR_ROFS once the handles check out

    def _refuse(self, p: Packer, *fhs: bytes) -> list[Attrs]:
        """Status ROFS when every handle is ours and live, else BADHANDLE/STALE."""
        try:
            attrs = [self._resolve(fh) for fh in fhs]
        except NfsStatusError as exc:
            p.u32(exc.status)
            return []
        p.u32(Status.ROFS)
        return attrs

    def _refuse_wcc(self, fh: bytes) -> bytes:
        p = Packer()
        attrs = self._refuse(p, fh)
        pack_wcc_data(p, attrs[0] if attrs else None, self.fsid)
        return p.getvalue()

    def setattr(self, call: RpcCall) -> bytes:
        """SETATTR: refused."""
        u = call.args
        fh = unpack_fh(u)
        unpack_sattr3(u)
        if u.boolean():  # guard ctime
            u.u32()
            u.u32()
        u.done()
        return self._refuse_wcc(fh)

    def write(self, call: RpcCall) -> bytes:
        """WRITE: refused."""
        u = call.args
        fh = unpack_fh(u)
        u.u64()  # offset
        count = u.u32()
        how = u.u32()
        if how > 2:
            raise_bad_enum(u, "stable_how", how)
        data = u.opaque(MAX_WRITE_ARG)
        if count != len(data):
            raise_bad_enum(u, "write count", count)
        u.done()
        return self._refuse_wcc(fh)

    def create(self, call: RpcCall) -> bytes:
        """CREATE: refused."""
        u = call.args
        fh, _ = unpack_diropargs(u)
        mode = u.u32()
        if mode in (0, 1):  # UNCHECKED, GUARDED
            unpack_sattr3(u)
        elif mode == 2:  # EXCLUSIVE
            u.fixed_opaque(8)
        else:
            raise_bad_enum(u, "createmode3", mode)
        u.done()
        return self._refuse_wcc(fh)

    def mkdir(self, call: RpcCall) -> bytes:
        """MKDIR: refused."""
        u = call.args
        fh, _ = unpack_diropargs(u)
        unpack_sattr3(u)
        u.done()
        return self._refuse_wcc(fh)

    def symlink(self, call: RpcCall) -> bytes:
        """SYMLINK: refused."""
        u = call.args
        fh, _ = unpack_diropargs(u)
        unpack_sattr3(u)
        u.string(MAX_PATH_ARG)
        u.done()
        return self._refuse_wcc(fh)

    def mknod(self, call: RpcCall) -> bytes:
        """MKNOD: refused."""
        u = call.args
        fh, _ = unpack_diropargs(u)
        kind = u.u32()
        if kind in (FType.CHR, FType.BLK):
            unpack_sattr3(u)
            u.u32()
            u.u32()
        elif kind in (FType.SOCK, FType.FIFO):
            unpack_sattr3(u)
        elif kind not in (FType.REG, FType.DIR, FType.LNK):
            raise_bad_enum(u, "ftype3", kind)
        u.done()
        return self._refuse_wcc(fh)

    def remove(self, call: RpcCall) -> bytes:
        """REMOVE and RMDIR: refused."""
        fh, _ = unpack_diropargs(call.args)
        call.args.done()
        return self._refuse_wcc(fh)

    def rename(self, call: RpcCall) -> bytes:
        """RENAME: refused, with wcc data for both directories."""
        from_fh, _ = unpack_diropargs(call.args)
        to_fh, _ = unpack_diropargs(call.args)
        call.args.done()
        p = Packer()
        attrs = self._refuse(p, from_fh, to_fh)
        pack_wcc_data(p, attrs[0] if attrs else None, self.fsid)
        pack_wcc_data(p, attrs[1] if attrs else None, self.fsid)
        return p.getvalue()

    def link(self, call: RpcCall) -> bytes:
        """LINK: refused."""
        file_fh = unpack_fh(call.args)
        dir_fh, _ = unpack_diropargs(call.args)
        call.args.done()
        p = Packer()
        attrs = self._refuse(p, file_fh, dir_fh)
        pack_post_op_attr(p, attrs[0] if attrs else None, self.fsid)
        pack_wcc_data(p, attrs[1] if attrs else None, self.fsid)
        return p.getvalue()

    def commit(self, call: RpcCall) -> bytes:
        """COMMIT: refused (nothing was ever written)."""
        u = call.args
        fh = unpack_fh(u)
        u.u64()
        u.u32()
        u.done()
        return self._refuse_wcc(fh)
