"""MOUNT protocol v3 (RFC 1813 appendix I, program 100005): hands out the root handle.

One export is served. MNT also accepts a directory *below* the export (``/export/sub``)
and returns that directory's handle, because libnfs splits a URL such as
``nfs://host/export/dir/file`` into a mount path and a file name at the last slash.
"""

from __future__ import annotations

import enum
import errno
import logging
import threading

from gitxet.mount.nfs.handle import NFS3_FHSIZE, FileHandles
from gitxet.mount.nfs.rpc import AuthFlavor, Handler, Program, RpcCall
from gitxet.mount.nfs.xdr import Packer
from gitxet.vfs.nodes import NodeKind, ReadOnlyFS

log = logging.getLogger(__name__)

MOUNT_PROGRAM = 100005
MOUNT_V3 = 3
MNTPATHLEN = 1024
MNTNAMLEN = 255
MAX_MOUNT_RECORDS = 1024  # DUMP bookkeeping is advisory; never let it grow without bound


class MountProc(enum.IntEnum):
    """MOUNT v3 procedure numbers."""

    NULL = 0
    MNT = 1
    DUMP = 2
    UMNT = 3
    UMNTALL = 4
    EXPORT = 5


class MountStat(enum.IntEnum):
    """mountstat3."""

    OK = 0
    PERM = 1
    NOENT = 2
    IO = 5
    ACCES = 13
    NOTDIR = 20
    INVAL = 22
    NAMETOOLONG = 63
    NOTSUPP = 10004
    SERVERFAULT = 10006


_ERRNO_MOUNTSTAT = {
    errno.ENOENT: MountStat.NOENT,
    errno.ENOTDIR: MountStat.NOTDIR,
    errno.EIO: MountStat.IO,
    errno.EACCES: MountStat.ACCES,
    errno.EINVAL: MountStat.INVAL,
    errno.ENAMETOOLONG: MountStat.NAMETOOLONG,
}


def normalize_export(path: str) -> str:
    """Canonical export path: leading slash, no empty, ``.`` or ``..`` parts, no trailing slash."""
    if not path.startswith("/"):
        raise ValueError(f"export path must be absolute: {path!r}")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"export path must not contain '.' or '..': {path!r}")
    return "/" + "/".join(parts)


class _MountError(Exception):
    def __init__(self, status: MountStat) -> None:
        super().__init__(status.name)
        self.status = status


class MountService:
    """The MOUNT v3 program for one export of one ``ReadOnlyFS``."""

    def __init__(self, fs: ReadOnlyFS, handles: FileHandles, export: str = "/") -> None:
        self.fs = fs
        self.handles = handles
        self.export = normalize_export(export)
        self._export_parts = [p.encode() for p in self.export.split("/") if p]
        self._lock = threading.Lock()
        # (client host, mounted path) pairs, for DUMP; insertion-ordered.
        self._mounts: dict[tuple[bytes, bytes], None] = {}

    def program(self) -> Program:
        """The RPC procedure table."""
        table: dict[int, Handler] = {
            MountProc.NULL: self.null,
            MountProc.MNT: self.mnt,
            MountProc.DUMP: self.dump,
            MountProc.UMNT: self.umnt,
            MountProc.UMNTALL: self.umntall,
            MountProc.EXPORT: self.exports,
        }
        return Program(MOUNT_PROGRAM, MOUNT_V3, table)

    @staticmethod
    def _client(call: RpcCall) -> bytes:
        if call.auth_sys is not None and call.auth_sys.machine:
            return call.auth_sys.machine[:MNTNAMLEN]
        return (call.peer.rsplit(":", 1)[0] or "unknown").encode()[:MNTNAMLEN]

    def _inside(self, path: bytes) -> list[bytes]:
        """Components of ``path`` below the export; ACCES when it is not under the export."""
        if not path:
            # libnfs asks for "" when a URL names a file directly under "/".
            path = b"/"
        parts = [p for p in path.split(b"/") if p]
        if not path.startswith(b"/") or any(p in (b".", b"..") for p in parts):
            raise _MountError(MountStat.INVAL)
        n = len(self._export_parts)
        if parts[:n] != self._export_parts:
            raise _MountError(MountStat.ACCES)
        return parts[n:]

    def resolve(self, path: bytes) -> int:
        """Inode of the directory a MNT path names."""
        rest = self._inside(path)
        try:
            attrs = self.fs.getattr(self.fs.root_ino)
            for name in rest:
                if len(name) > MNTNAMLEN:
                    raise _MountError(MountStat.NAMETOOLONG)
                attrs = self.fs.lookup(attrs.ino, name)
        except OSError as exc:
            status = _ERRNO_MOUNTSTAT.get(exc.errno or 0, MountStat.SERVERFAULT)
            if status in (MountStat.IO, MountStat.SERVERFAULT):
                log.warning("MOUNT %r failed: %s", path, exc)
            raise _MountError(status) from exc
        if attrs.kind is not NodeKind.DIR:
            raise _MountError(MountStat.NOTDIR)
        return attrs.ino

    def null(self, call: RpcCall) -> bytes:
        """NULL: ping."""
        call.args.done()
        return b""

    def mnt(self, call: RpcCall) -> bytes:
        """MNT: the handle of the export (or a directory inside it)."""
        path = call.args.string(MNTPATHLEN)
        call.args.done()
        p = Packer()
        try:
            ino = self.resolve(path)
        except _MountError as exc:
            log.info("refused MNT %r from %s: %s", path, call.peer or "?", exc.status.name)
            p.u32(exc.status)
            return p.getvalue()
        with self._lock:
            if len(self._mounts) >= MAX_MOUNT_RECORDS:
                self._mounts.pop(next(iter(self._mounts)))
            self._mounts[(self._client(call), path)] = None
        p.u32(MountStat.OK)
        p.opaque(self.handles.encode(ino), NFS3_FHSIZE)
        p.array([AuthFlavor.SYS, AuthFlavor.NONE], p.u32)
        return p.getvalue()

    def dump(self, call: RpcCall) -> bytes:
        """DUMP: the (host, path) pairs that mounted and did not unmount."""
        call.args.done()
        with self._lock:
            mounts = list(self._mounts)
        p = Packer()
        for host, path in mounts:
            p.boolean(True)
            p.string(host, MNTNAMLEN)
            p.string(path, MNTPATHLEN)
        p.boolean(False)
        return p.getvalue()

    def umnt(self, call: RpcCall) -> bytes:
        """UMNT: forget one mount record."""
        path = call.args.string(MNTPATHLEN)
        call.args.done()
        with self._lock:
            self._mounts.pop((self._client(call), path), None)
        return b""

    def umntall(self, call: RpcCall) -> bytes:
        """UMNTALL: forget every record of the calling host."""
        call.args.done()
        host = self._client(call)
        with self._lock:
            for key in [k for k in self._mounts if k[0] == host]:
                del self._mounts[key]
        return b""

    def exports(self, call: RpcCall) -> bytes:
        """EXPORT: the single export, open to every client (empty group list)."""
        call.args.done()
        p = Packer()
        p.boolean(True)
        p.string(self.export, MNTPATHLEN)
        p.boolean(False)  # no groups: everyone
        p.boolean(False)  # end of export list
        return p.getvalue()
