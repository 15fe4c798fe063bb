"""NFS file handles: a fixed 20-byte, versioned encoding of (fsid, inode).

Layout (big-endian)::

    0  2  magic   b"GX"
    2  1  version 1
    3  1  zero
    4  8  fsid    the export's filesystem id (also reported in fattr3.fsid)
   12  8  ino     the model's inode number (never 0)

The model numbers inodes deterministically from commit and path, so a handle stays valid
across server restarts as long as the fsid is the same; a handle carrying another fsid comes
from a different export (or commit) and is answered with NFS3ERR_STALE, while bytes that are
not one of our handles at all get NFS3ERR_BADHANDLE.
"""

from __future__ import annotations

import hashlib
import struct

FH_MAGIC = b"GX"
FH_VERSION = 1
_FH = struct.Struct(">2sBBQQ")
FH_SIZE = _FH.size
NFS3_FHSIZE = 64  # RFC 1813 upper bound on a handle


class HandleError(Exception):
    """A file handle the server cannot use; ``stale`` distinguishes STALE from BADHANDLE."""

    def __init__(self, reason: str, *, stale: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.stale = stale


def fsid_for(name: str) -> int:
    """A stable 64-bit filesystem id derived from a name (for example a commit id)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


class FileHandles:
    """Encodes and decodes handles for one export."""

    def __init__(self, fsid: int) -> None:
        if not 0 <= fsid < 2**64:
            raise ValueError(f"fsid {fsid} does not fit in 64 bits")
        self.fsid = fsid

    def encode(self, ino: int) -> bytes:
        """The handle for inode ``ino``."""
        if not 0 < ino < 2**64:
            raise ValueError(f"inode {ino} cannot be put in a handle")
        return _FH.pack(FH_MAGIC, FH_VERSION, 0, self.fsid, ino)

    def decode(self, fh: bytes) -> int:
        """The inode named by ``fh``; raises ``HandleError`` for foreign or malformed handles."""
        if len(fh) != FH_SIZE:
            raise HandleError(f"handle is {len(fh)} bytes, expected {FH_SIZE}", stale=False)
        magic, version, zero, fsid, ino = _FH.unpack(fh)
        if magic != FH_MAGIC or zero != 0:
            raise HandleError("not a gitxet handle", stale=False)
        if version != FH_VERSION:
            raise HandleError(f"unsupported handle version {version}", stale=False)
        if ino == 0:
            raise HandleError("inode 0 is reserved", stale=False)
        if fsid != self.fsid:
            raise HandleError(f"handle from filesystem {fsid:#x}", stale=True)
        return int(ino)
