"""A minimal PORTMAP v2 (RFC 1833, program 100000) answering on the NFS server's own port.

It is not a system portmapper: it only knows the programs this server runs, refuses SET and
UNSET, and exists so that a client pointed at our port can ask where MOUNT and NFS live.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping

from gitxet.mount.nfs.rpc import Handler, Program, RpcCall
from gitxet.mount.nfs.xdr import Packer

PMAP_PROGRAM = 100000
PMAP_V2 = 2
IPPROTO_TCP = 6
IPPROTO_UDP = 17


class PmapProc(enum.IntEnum):
    """PORTMAP v2 procedure numbers (CALLIT is not offered)."""

    NULL = 0
    SET = 1
    UNSET = 2
    GETPORT = 3
    DUMP = 4


class PortmapService:
    """Answers GETPORT/DUMP from a live ``{(prog, vers): port}`` table (TCP only)."""

    def __init__(self, ports: Callable[[], Mapping[tuple[int, int], int]]) -> None:
        self._ports = ports

    def program(self) -> Program:
        """The RPC procedure table."""
        table: dict[int, Handler] = {
            PmapProc.NULL: self.null,
            PmapProc.SET: self.refuse,
            PmapProc.UNSET: self.refuse,
            PmapProc.GETPORT: self.getport,
            PmapProc.DUMP: self.dump,
        }
        return Program(PMAP_PROGRAM, PMAP_V2, table)

    def null(self, call: RpcCall) -> bytes:
        """NULL: ping."""
        call.args.done()
        return b""

    def refuse(self, call: RpcCall) -> bytes:
        """SET / UNSET: registrations are not accepted (answer FALSE)."""
        for _ in range(4):
            call.args.u32()
        call.args.done()
        p = Packer()
        p.boolean(False)
        return p.getvalue()

    def getport(self, call: RpcCall) -> bytes:
        """GETPORT: our port for (prog, vers) over TCP, else 0."""
        prog, vers, prot = call.args.u32(), call.args.u32(), call.args.u32()
        call.args.u32()  # port: ignored in queries
        call.args.done()
        port = self._ports().get((prog, vers), 0) if prot == IPPROTO_TCP else 0
        p = Packer()
        p.u32(port)
        return p.getvalue()

    def dump(self, call: RpcCall) -> bytes:
        """DUMP: every mapping we serve."""
        call.args.done()
        p = Packer()
        for (prog, vers), port in sorted(self._ports().items()):
            p.boolean(True)
            p.u32(prog)
            p.u32(vers)
            p.u32(IPPROTO_TCP)
            p.u32(port)
        p.boolean(False)
        return p.getvalue()
