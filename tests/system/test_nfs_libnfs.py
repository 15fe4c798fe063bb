"""The NFS server against a real client: libnfs's ``nfs-ls`` and ``nfs-cat``.

The kernel of the test machine has no NFS client, so libnfs (Debian ``libnfs-utils``) plays
the client: it runs MOUNT NULL/MNT/EXPORT, then NFS NULL/FSINFO/GETATTR/READDIRPLUS/READ
against the ports in the URL, with no portmapper.
"""

from __future__ import annotations

import hashlib
import logging
import os
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gitxet.mount.nfs.mountd import MOUNT_PROGRAM
from gitxet.mount.nfs.nfs3 import NFS_PROGRAM
from gitxet.mount.nfs.portmap import PMAP_PROGRAM, PmapProc
from gitxet.mount.nfs.rpc import MSG_REPLY, RecordReader, encode_call, frame_record
from gitxet.mount.nfs.server import NFSServer
from gitxet.mount.nfs.xdr import Packer, Unpacker
from tests.helpers.memfs import MemoryFS

pytestmark = [
    pytest.mark.nfs,
    pytest.mark.skipif(
        shutil.which("nfs-ls") is None or shutil.which("nfs-cat") is None,
        reason="nfs-ls/nfs-cat not installed (apt-get install libnfs-utils)",
    ),
]

TIMEOUT = 30
BIG = os.urandom(3 << 20)
MANY = 200


def tree() -> dict[str, object]:
    files: dict[str, object] = {
        "README.md": b"# dataset\n",
        "data/train/part-0.bin": BIG,
        "data/train/labels.csv": b"id,label\n1,cat\n",
        "data/test/deep/er/file.txt": b"deep\n",
        "empty.txt": b"",
        "emptydir": None,
        "latest": ("link", "data/train/part-0.bin"),
        "tools/run.sh": b"#!/bin/sh\necho hi\n",
    }
    files.update({f"many/item-{i:03d}.txt": f"{i}\n".encode() for i in range(MANY)})
    return files


@pytest.fixture(scope="module")
def server() -> Iterator[NFSServer]:
    srv = NFSServer(MemoryFS(tree()))
    srv.start()
    yield srv
    srv.stop()


def url(srv: NFSServer, path: str = "") -> str:
    return srv.url_for(path)


def run(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(args, capture_output=True, timeout=TIMEOUT, check=False)


def ls(target: str, *flags: str) -> dict[str, tuple[str, int]]:
    """``nfs-ls`` output as {name: (mode string, size)}."""
    result = run("nfs-ls", *flags, target)
    assert result.returncode == 0, result.stderr.decode()
    out: dict[str, tuple[str, int]] = {}
    for line in result.stdout.decode().splitlines():
        if not line.strip():
            continue
        mode, _nlink, _uid, _gid, size, name = line.split(maxsplit=5)
        out[name] = (mode, int(size))
    return out


def cat(target: str) -> bytes:
    result = run("nfs-cat", target)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_url_names_both_ports(server: NFSServer) -> None:
    assert server.nfs_port and server.mount_port and server.nfs_port != server.mount_port
    query = f"nfsport={server.nfs_port}&mountport={server.mount_port}"
    assert server.url == f"nfs://127.0.0.1/?{query}"
    assert server.url_for("/a/b/") == f"nfs://127.0.0.1//a/b?{query}"


def test_ls_root(server: NFSServer) -> None:
    assert ls(server.url) == {
        "README.md": ("-rw-r--r--", 10),
        "data": ("drwxr-xr-x", 0),
        "empty.txt": ("-rw-r--r--", 0),
        "emptydir": ("drwxr-xr-x", 0),
        "latest": ("lrwxrwxrwx", len("data/train/part-0.bin")),
        "many": ("drwxr-xr-x", 0),
        "tools": ("drwxr-xr-x", 0),
    }


def test_ls_recursive_sees_every_path(server: NFSServer) -> None:
    listing = ls(server.url, "-R")
    files = {p for p, v in tree().items() if v is not None}
    assert files <= set(listing)
    assert listing["data/train/part-0.bin"] == ("-rw-r--r--", len(BIG))
    assert listing["tools/run.sh"][0] == "-rwxr-xr-x"
    assert "data/test/deep/er" in listing


def test_ls_big_directory_pages(server: NFSServer) -> None:
    listing = ls(url(server, "many"))
    assert sorted(listing) == [f"item-{i:03d}.txt" for i in range(MANY)]
    assert listing["item-150.txt"] == ("-rw-r--r--", 4)


def test_ls_empty_dir(server: NFSServer) -> None:
    assert ls(url(server, "emptydir")) == {}


def test_cat_big_file_is_byte_identical(server: NFSServer) -> None:
    assert sha(cat(url(server, "data/train/part-0.bin"))) == sha(BIG)


def test_cat_small_nested_and_empty_files(server: NFSServer) -> None:
    assert cat(url(server, "README.md")) == b"# dataset\n"
    assert cat(url(server, "data/test/deep/er/file.txt")) == b"deep\n"
    assert cat(url(server, "empty.txt")) == b""


def test_cat_missing_file_fails(server: NFSServer) -> None:
    result = run("nfs-cat", url(server, "data/nope.bin"))
    assert result.returncode != 0


def test_named_export_and_shared_port() -> None:
    fs = MemoryFS(tree())
    with NFSServer(fs, export="/datasets/v1", mount_port=None) as srv:
        assert srv.nfs_port == srv.mount_port
        assert srv.url.startswith("nfs://127.0.0.1/datasets/v1?")
        assert "labels.csv" in ls(url(srv, "data/train"))
        assert cat(url(srv, "data/train/labels.csv")) == b"id,label\n1,cat\n"
        assert sha(cat(url(srv, "data/train/part-0.bin"))) == sha(BIG)
        wrong = srv.url.replace("/datasets/v1?", "/other?")
        assert run("nfs-ls", wrong).returncode != 0


def test_io_error_is_reported_promptly(caplog: pytest.LogCaptureFixture) -> None:
    fs = MemoryFS(tree())
    fs.fail_reads = True
    with NFSServer(fs) as srv:
        started = time.monotonic()
        result = run("nfs-cat", url(srv, "README.md"))
        elapsed = time.monotonic() - started
        assert result.returncode != 0
        assert elapsed < 10
        # The listing path does not read data, so it still works.
        assert "README.md" in ls(srv.url)
    assert any(r.levelno == logging.WARNING and "READ" in r.getMessage() for r in caplog.records)


class GatedFS(MemoryFS):
    """Reads of ``gated`` block until ``gate`` is set; ``waiting`` is set once one does."""

    def __init__(self, files: dict[str, object]) -> None:
        super().__init__(files)
        self.gate = threading.Event()
        self.waiting = threading.Event()
        self.gated = self.lookup(self.root_ino, b"README.md").ino

    def read(self, ino: int, offset: int, size: int) -> bytes:
        if ino == self.gated:
            self.waiting.set()
            self.gate.wait(TIMEOUT)
        return super().read(ino, offset, size)


def test_slow_read_does_not_block_other_clients() -> None:
    fs = GatedFS(tree())
    with (
        NFSServer(fs) as srv,
        subprocess.Popen(
            ["nfs-cat", url(srv, "README.md")], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as slow,
    ):
        try:
            assert fs.waiting.wait(TIMEOUT), "the slow read never reached the model"
            started = time.monotonic()
            assert sha(cat(url(srv, "data/train/part-0.bin"))) == sha(BIG)
            assert "many" in ls(srv.url)
            assert time.monotonic() - started < 10
            assert slow.poll() is None  # still held at the gate
            fs.gate.set()
            out, err = slow.communicate(timeout=TIMEOUT)
            assert slow.returncode == 0, err.decode()
            assert out == b"# dataset\n"
        finally:
            fs.gate.set()
            if slow.poll() is None:
                slow.kill()


def server_threads(srv: NFSServer) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(srv.thread_prefix + "-")]


def test_stop_joins_every_thread() -> None:
    srv = NFSServer(MemoryFS(tree()), max_workers=3)
    srv.start()
    # An idle open connection must not keep stop() waiting.
    idle = socket.create_connection(("127.0.0.1", srv.nfs_port), timeout=TIMEOUT)
    try:
        assert "README.md" in ls(srv.url)
        assert len(server_threads(srv)) >= 4
        started = time.monotonic()
        srv.stop()
        assert time.monotonic() - started < 15  # waiting on the idle one: 30 s
        assert not server_threads(srv)
        assert idle.recv(1) == b""  # the server closed it
    finally:
        idle.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.nfs_port), timeout=1).close()


# ---------------------------------------------------------------- raw RPC over TCP


def rpc_call(sock: socket.socket, xid: int, prog: int, vers: int, proc: int, args: bytes) -> bytes:
    sock.sendall(frame_record(encode_call(xid, prog, vers, proc, args)))
    record = RecordReader(sock.recv, 1 << 20).read()
    assert record is not None
    u = Unpacker(record)
    assert (u.u32(), u.u32(), u.u32()) == (xid, MSG_REPLY, 0)
    u.u32()
    u.opaque()
    assert u.u32() == 0  # SUCCESS
    return u.rest()


def test_portmap_getport_on_the_nfs_port(server: NFSServer) -> None:
    with socket.create_connection(("127.0.0.1", server.nfs_port), timeout=TIMEOUT) as sock:
        for prog, expected in ((NFS_PROGRAM, server.nfs_port), (MOUNT_PROGRAM, server.mount_port)):
            p = Packer()
            for v in (prog, 3, 6, 0):
                p.u32(v)
            reply = rpc_call(sock, 7, PMAP_PROGRAM, 2, PmapProc.GETPORT, p.getvalue())
            assert Unpacker(reply).u32() == expected


def test_oversized_record_closes_only_that_connection(server: NFSServer) -> None:
    with socket.create_connection(("127.0.0.1", server.nfs_port), timeout=TIMEOUT) as bad:
        bad.sendall((0xFFFF_FFFF).to_bytes(4, "big"))
        assert bad.recv(1) == b""
    with socket.create_connection(("127.0.0.1", server.nfs_port), timeout=TIMEOUT) as good:
        assert rpc_call(good, 8, NFS_PROGRAM, 3, 0, b"") == b""


def test_replies_on_one_connection_do_not_wait_for_a_slow_read() -> None:
    fs = GatedFS(tree())
    with (
        NFSServer(fs, fsid=5) as srv,
        socket.create_connection(("127.0.0.1", srv.nfs_port), timeout=TIMEOUT) as sock,
    ):
        p = Packer()
        p.opaque(srv.handles.encode(fs.gated))
        p.u64(0)
        p.u32(100)
        sock.sendall(frame_record(encode_call(1, NFS_PROGRAM, 3, 6, p.getvalue())))
        assert fs.waiting.wait(TIMEOUT)
        # The NULL call was sent second but is answered first (RPC matches replies by xid).
        assert rpc_call(sock, 2, NFS_PROGRAM, 3, 0, b"") == b""
        fs.gate.set()
        record = RecordReader(sock.recv, 1 << 20).read()
        assert record is not None and Unpacker(record).u32() == 1


def test_stop_is_bounded_when_a_model_call_hangs(caplog: pytest.LogCaptureFixture) -> None:
    fs = GatedFS(tree())
    srv = NFSServer(fs)
    srv.start()
    try:
        with subprocess.Popen(
            ["nfs-cat", url(srv, "README.md")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        ) as slow:
            assert fs.waiting.wait(TIMEOUT)
            started = time.monotonic()
            srv.stop(timeout=1)
            assert time.monotonic() - started < 15  # unbounded: until the gate opens
            assert "still running after stop()" in caplog.text
            slow.kill()
    finally:
        fs.gate.set()
    deadline = time.monotonic() + TIMEOUT
    while server_threads(srv) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server_threads(srv)  # the stuck worker ends once the model returns


def test_idle_connections_do_not_lock_other_clients_out() -> None:
    """Clients that connect and send nothing (or stall inside a call) hold every connection
    slot: a real client still gets in, the idle ones are closed oldest first (they were
    kept for good, and every later client was refused)."""
    with NFSServer(MemoryFS(tree()), max_connections=3) as srv:
        idle = [socket.create_connection(("127.0.0.1", srv.nfs_port), timeout=TIMEOUT)]
        idle[0].sendall(b"\x80\x00")  # half a record mark, then nothing
        idle += [
            socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
            for port in (srv.nfs_port, srv.mount_port)
        ]
        try:
            deadline = time.monotonic() + TIMEOUT
            while len(srv._conns) < 3:  # accepted (the accept loop runs on its own)
                assert time.monotonic() < deadline, "the server never accepted them"
                time.sleep(0.01)
            assert "README.md" in ls(srv.url)
            assert cat(url(srv, "README.md")) == b"# dataset\n"
            assert idle[0].recv(1) == b""  # the oldest idle one was closed
        finally:
            for sock in idle:
                sock.close()


# Connects N sockets to PORT once it reads a line, then holds them until its stdin closes.
_CLIENTS = """
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
sys.stdin.readline()
socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(n)]
print("connected", len(socks), flush=True)
sys.stdin.read()
"""


def test_out_of_descriptors_the_server_neither_spins_nor_floods_its_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``ulimit -n`` below what the clients open: every accept failed with EMFILE, the
    listener stayed readable, and the accept loop retried at once, a core busy and a
    warning logged per try (thousands a second), until clients went away."""
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    with (
        NFSServer(MemoryFS(tree()), max_connections=10_000) as srv,
        subprocess.Popen(
            [sys.executable, "-c", _CLIENTS, str(srv.nfs_port), "40"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as clients,
    ):
        assert clients.stdin is not None and clients.stdout is not None
        caplog.set_level(logging.WARNING, logger="gitxet.mount.nfs.server")
        try:
            # room for a few more descriptors only: the server runs out after ~3 accepts
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 3, limits[1])
            )
            clients.stdin.write("go\n")
            clients.stdin.flush()
            assert clients.stdout.readline().strip() == "connected 40"  # queued by the kernel

            def failures() -> int:
                return sum("accept failed" in r.getMessage() for r in caplog.records)

            deadline = time.monotonic() + TIMEOUT
            while failures() == 0:
                assert time.monotonic() < deadline, "the server never ran out of descriptors"
                time.sleep(0.01)
            cpu = time.process_time()
            time.sleep(1.0)  # a window to count the tries in, not a synchronisation
            cpu = time.process_time() - cpu
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
            clients.stdin.close()
        assert failures() == 1, f"{failures()} warnings in about a second"
        assert cpu < 0.5, f"{cpu:.2f} s of CPU in a second while out of descriptors"
        clients.wait(TIMEOUT)
        assert "README.md" in ls(srv.url)  # and it serves again once descriptors are free


class CountingFS(MemoryFS):
    """A MemoryFS that counts its directory listings."""

    listings = 0

    def readdir(self, ino: int) -> list[tuple[bytes, Any]]:
        self.listings += 1
        return super().readdir(ino)


def test_a_big_directory_is_listed_once_for_all_its_pages() -> None:
    """Each READDIR(PLUS) page listed the whole directory again: paging through a big one
    was quadratic (100,000 entries through nfs-ls: 137 s, 1.2 s as 100 directories)."""
    names = {f"big/f{i:05d}": b"" for i in range(5000)}
    fs = CountingFS(names)
    with NFSServer(fs) as srv:
        got = ls(srv.url_for("big"))
        assert sorted(got) == sorted(n.removeprefix("big/") for n in names)
        assert fs.listings <= 2, f"{fs.listings} listings for one nfs-ls"  # READDIR(PLUS)
