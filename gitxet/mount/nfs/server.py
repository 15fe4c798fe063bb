"""The NFSv3 + MOUNT server: listeners, connections, a bounded worker pool, lifecycle.

Threads (all named ``gitxet-nfs-<nfs port>-*``):

* one acceptor, waiting on every listening socket plus a wake-up socket pair;
* one reader per connection (at most ``max_connections``), which only reassembles records
  and queues them, so a slow procedure never stops a connection from being read;
* ``max_workers`` workers that run procedures and write replies. Replies on one connection
  may leave out of order, which ONC RPC allows (the client matches them by xid). Each
  connection has at most ``max_inflight`` queued or running calls, which bounds memory.

``stop()`` stops the acceptor, closes the listeners, shuts every connection down (waking
its reader), lets the workers finish the call they hold (queued calls of closed connections
are skipped) and joins every thread within one overall timeout.
"""

from __future__ import annotations

import errno
import functools
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType

from gitxet.errors import RpcRecordError
from gitxet.mount.nfs.handle import FileHandles, fsid_for
from gitxet.mount.nfs.mountd import MOUNT_PROGRAM, MOUNT_V3, MountService, normalize_export
from gitxet.mount.nfs.nfs3 import NFS_PROGRAM, NFS_V3, RTMAX, NFS3Service
from gitxet.mount.nfs.portmap import PMAP_PROGRAM, PMAP_V2, PortmapService
from gitxet.mount.nfs.rpc import Dispatcher, RecordReader, frame_record
from gitxet.vfs.nodes import ReadOnlyFS

log = logging.getLogger(__name__)

#: accept() errors that mean "no descriptor (or memory) for the connection now"
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_ACCEPT_BACKOFF = 0.05  # seconds between tries while out of descriptors
_FD_WARNING_INTERVAL = 10.0  # seconds between two warnings about it

# The largest call we accept: a READ call is tiny, but a client may send a WRITE of up to
# the advertised wtmax before learning the tree is read-only; keep generous headroom.
MAX_RECORD = RTMAX + (64 << 10)


class _Connection:
    """One accepted TCP connection: its socket, reply lock and in-flight budget."""

    def __init__(self, sock: socket.socket, peer: str, max_inflight: int) -> None:
        self.sock = sock
        self.peer = peer
        self.send_lock = threading.Lock()
        self.inflight = threading.BoundedSemaphore(max_inflight)
        self.closed = threading.Event()
        self.thread: threading.Thread | None = None
        self.last_call = time.monotonic()  # when its last whole call arrived (or it connected)
        self.pending = 0  # calls queued or running (changed under the server's _conns_lock)

    def send(self, payload: bytes) -> None:
        if self.closed.is_set():
            return
        try:
            with self.send_lock:
                self.sock.sendall(frame_record(payload))
        except OSError as exc:
            log.debug("send to %s failed: %s", self.peer, exc)
            self.shutdown()

    def recv(self, n: int) -> bytes:
        """``recv`` that waits through socket timeouts (they are meant for sends only)."""
        while True:
            try:
                return self.sock.recv(n)
            except TimeoutError:
                if self.closed.is_set():
                    return b""

    def shutdown(self) -> None:
        """Wake the reader (its recv returns EOF) and refuse further sends."""
        self.closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already disconnected


class NFSServer:
    """Serve a ``ReadOnlyFS`` over NFSv3 (with MOUNT v3 and a tiny PORTMAP) on TCP.

    ``mount_port`` 0 picks a separate free port for MOUNT; ``None`` (or the same non-zero
    port as ``nfs_port``) serves MOUNT on the NFS port. ``fsid`` identifies the export in
    handles and attributes: pass one derived from the commit id (see ``handle.fsid_for``) so
    handles survive restarts and are rejected by a server of another commit. The default
    derives it from the export name and the root's inode and mtime.

    Concurrency: ``max_workers`` threads run procedures; one connection may have at most
    ``max_inflight`` calls queued or running, so keep it below ``max_workers`` to leave room
    for other clients. ``max_record`` caps one incoming call; ``send_timeout`` drops a client
    that stops reading its replies.
    """

    def __init__(
        self,
        fs: ReadOnlyFS,
        host: str = "127.0.0.1",
        nfs_port: int = 0,
        mount_port: int | None = 0,
        export: str = "/",
        *,
        fsid: int | None = None,
        max_workers: int = 16,
        max_connections: int = 64,
        max_inflight: int = 8,
        max_record: int = MAX_RECORD,
        send_timeout: float = 60.0,
    ) -> None:
        if max_workers < 1 or max_connections < 1 or max_inflight < 1:
            raise ValueError("max_workers, max_connections and max_inflight must be positive")
        self.fs = fs
        self.host = host
        self.export = normalize_export(export)
        if fsid is None:
            root = fs.getattr(fs.root_ino)
            fsid = fsid_for(f"{self.export}\0{root.ino}\0{root.mtime_ns}")
        self.handles = FileHandles(fsid)
        self.max_workers = max_workers
        self.max_connections = max_connections
        self.max_inflight = max_inflight
        self.max_record = max_record
        self.send_timeout = send_timeout
        self._want_nfs_port = nfs_port
        self._shared = mount_port is None or (mount_port == nfs_port and nfs_port != 0)
        self._want_mount_port = nfs_port if mount_port is None else mount_port
        self.nfs = NFS3Service(fs, self.handles)
        self.mountd = MountService(fs, self.handles, self.export)
        self.portmap = PortmapService(self._port_table)
        self.dispatcher = Dispatcher(
            [self.nfs.program(), self.mountd.program(), self.portmap.program()]
        )
        self._listeners: list[socket.socket] = []
        self._next_fd_warning = 0.0
        self._ports: tuple[int, int] = (0, 0)
        self._threads: list[threading.Thread] = []
        self._conns: set[_Connection] = set()
        self._conns_lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._started = False

    # ---- public surface

    @property
    def nfs_port(self) -> int:
        """TCP port of the NFS program (0 before ``start``)."""
        return self._ports[0]

    @property
    def mount_port(self) -> int:
        """TCP port of the MOUNT program (0 before ``start``)."""
        return self._ports[1]

    @property
    def thread_prefix(self) -> str:
        """Every thread of this server is named ``<prefix>-...`` (for logs and leak checks)."""
        return f"gitxet-nfs-{self.nfs_port}"

    @property
    def url(self) -> str:
        """A libnfs URL for the export, with both ports so no portmapper is needed."""
        return self.url_for("")

    def url_for(self, path: str) -> str:
        """A libnfs URL for ``path`` inside the export (``nfs-cat``, ``nfs-ls``).

        libnfs mounts everything before the last slash and then looks up the rest, so the
        export is always followed by a slash: for the ``/`` export a top-level file becomes
        ``nfs://host//file``, because libnfs cannot mount an empty export path.
        """
        host = self.host
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host == "::":
            host = "[::1]"
        elif ":" in host:
            host = f"[{host}]"
        where = self.export
        if path.strip("/"):
            where = f"{self.export}/{path.strip('/')}"
        query = f"nfsport={self.nfs_port}&mountport={self.mount_port}"
        return f"nfs://{host}{where}?{query}"

    def start(self) -> None:
        """Bind, listen and start the threads; returns once the ports are known."""
        if self._started:
            raise RuntimeError("NFSServer already started")
        self._started = True
        try:
            nfs_sock = self._listen(self._want_nfs_port)
            mount_sock = nfs_sock if self._shared else self._listen(self._want_mount_port)
        except OSError:
            self._close_listeners()
            raise
        self._ports = (nfs_sock.getsockname()[1], mount_sock.getsockname()[1])
        self._wake_r, self._wake_w = socket.socketpair()
        for i in range(self.max_workers):
            self._spawn(self._worker, f"{self.thread_prefix}-worker-{i}")
        self._spawn(self._accept_loop, f"{self.thread_prefix}-acceptor")
        log.info("NFS server for %s on %s", self.export, self.url)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving and join every thread, waiting at most ``timeout`` s in total.

        A thread still inside a model call when the time is up is left behind (it is a
        daemon thread) and logged; nothing else can interrupt a blocking read.
        """
        if not self._started or self._stopping.is_set():
            return
        deadline = time.monotonic() + timeout
        self._stopping.set()
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass
        # The acceptor goes first, so no connection can appear after the snapshot below.
        acceptors = [t for t in self._threads if t.name.endswith("-acceptor")]
        self._join(acceptors, deadline)
        self._close_listeners()
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            conn.shutdown()
        self._join([c.thread for c in conns if c.thread is not None], deadline)
        # Readers are gone, so nothing is queued after these sentinels.
        for _ in range(self.max_workers):
            self._jobs.put(None)
        self._join([t for t in self._threads if t not in acceptors], deadline)
        for s in (self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        log.info("NFS server for %s stopped", self.export)

    @staticmethod
    def _join(threads: list[threading.Thread], deadline: float) -> None:
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("%s is still running after stop()", thread.name)

    def __enter__(self) -> NFSServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---- internals

    def _port_table(self) -> dict[tuple[int, int], int]:
        return {
            (NFS_PROGRAM, NFS_V3): self.nfs_port,
            (MOUNT_PROGRAM, MOUNT_V3): self.mount_port,
            (PMAP_PROGRAM, PMAP_V2): self.nfs_port,
        }

    def _listen(self, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, port))
            sock.listen(64)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._listeners.append(sock)
        return sock

    def _close_listeners(self) -> None:
        for sock in self._listeners:
            sock.close()
        self._listeners.clear()

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def _accept_loop(self) -> None:
        assert self._wake_r is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._wake_r, selectors.EVENT_READ)
            for sock in self._listeners:
                sel.register(sock, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r or self._stopping.is_set():
                        return
                    listener = key.fileobj
                    assert isinstance(listener, socket.socket)
                    self._accept(listener)

    def _accept(self, listener: socket.socket) -> None:
        try:
            sock, addr = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno in _OUT_OF_DESCRIPTORS:
                self._out_of_descriptors(exc)
            else:
                log.warning("accept failed: %s", exc)
            return
        peer = f"{addr[0]}:{addr[1]}"
        with self._conns_lock:
            if len(self._conns) >= self.max_connections and not self._evict_idle():
                log.warning("refusing %s: %d connections open, all busy", peer, len(self._conns))
                sock.close()
                return
            # The timeout bounds how long a worker can be stuck sending to a client that
            # stopped reading; idle connections are kept (see _Connection.recv).
            sock.settimeout(self.send_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(sock, peer, self.max_inflight)
            conn.thread = threading.Thread(
                target=self._read_loop,
                args=(conn,),
                name=f"{self.thread_prefix}-conn-{peer}",
                daemon=True,
            )
            self._conns.add(conn)
        log.debug("connection from %s", peer)
        conn.thread.start()

    def _out_of_descriptors(self, exc: OSError) -> None:
        """``accept`` failed for want of a descriptor (``ulimit -n`` below what the clients
        open): the connection stays queued and the listener readable, so retrying at once
        spun a core and logged a warning per try. Close the connection idle longest to
        make room, as for ``max_connections``, and wait a moment before the next try."""
        now = time.monotonic()
        if now >= self._next_fd_warning:
            self._next_fd_warning = now + _FD_WARNING_INTERVAL
            log.warning(
                "accept failed: %s (%d connections open): raise the open files limit "
                "(ulimit -n) or lower --max-connections",
                exc,
                len(self._conns),
            )
        with self._conns_lock:
            self._evict_idle()
        self._stopping.wait(_ACCEPT_BACKOFF)

    def _evict_idle(self) -> bool:
        """Close the connection idle longest (no call in flight), as knfsd does when over its
        limit: clients that connect and never send (or stall mid-call) must not lock every
        other client out. An NFS client whose connection closes connects again. Called under
        ``_conns_lock``; False when every connection has a call in flight."""
        idle = [c for c in self._conns if not c.pending]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.last_call)
        log.info(
            "closing %s, idle for %.0f s: too many connections",
            oldest.peer,
            time.monotonic() - oldest.last_call,
        )
        oldest.shutdown()
        self._conns.discard(oldest)
        return True

    def _read_loop(self, conn: _Connection) -> None:
        reader = RecordReader(conn.recv, self.max_record)
        try:
            while not conn.closed.is_set():
                record = reader.read()
                if record is None:
                    break
                # Wait for a free in-flight slot, but notice a shutdown meanwhile.
                with self._conns_lock:
                    conn.last_call = time.monotonic()
                    conn.pending += 1
                while not conn.inflight.acquire(timeout=0.2):
                    if conn.closed.is_set():
                        return
                self._jobs.put(functools.partial(self._serve, conn, record))
        except RpcRecordError as exc:
            log.warning("closing %s: %s", conn.peer, exc)
        except OSError as exc:
            log.debug("connection %s: %s", conn.peer, exc)
        finally:
            conn.shutdown()
            with conn.send_lock:
                conn.sock.close()  # a late reply now fails with EBADF, which send() absorbs
            with self._conns_lock:
                self._conns.discard(conn)
            log.debug("connection from %s closed", conn.peer)

    def _serve(self, conn: _Connection, record: bytes) -> None:
        try:
            if conn.closed.is_set():
                return  # nobody is left to read the answer
            reply = self.dispatcher.handle_record(record, conn.peer)
            if reply is not None:
                conn.send(reply)
        finally:
            conn.inflight.release()
            with self._conns_lock:
                conn.pending -= 1

    def _worker(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception:
                log.exception("NFS worker job failed")
