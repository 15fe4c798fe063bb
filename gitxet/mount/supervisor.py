"""FUSE failover: a small supervisor holds the FUSE connection; serving processes come and go.

A plain FUSE daemon owns its ``/dev/fuse`` descriptor: when it dies, the kernel aborts the
connection and every reader gets ENOTCONN until someone unmounts. Here the descriptor is
held by a supervisor that does nothing else (``python -m gitxet.mount.supervisor``):

1. it mounts through ``fusermount3``, which hands the descriptor back over a Unix socket
   (``_FUSE_COMMFD``, as libfuse does for unprivileged mounts), and reads the kernel's
   ``FUSE_INIT`` request itself;
2. it starts the serving process (any command; the CLI passes
   ``python -m gitxet mount-serve SPEC``) with the descriptor inherited and
   ``--fuse-takeover=FD:RESEND:INIT`` added to its command line (before its ``--``);
3. when the serving process dies (a crash, SIGKILL, an OOM kill) while the mount is still
   there, it starts a new one on the same connection; ``SIGUSR1`` replaces it on purpose
   (``git xet mount --upgrade``). It gives up after repeated quick deaths, leaving a dead
   mount that ``git xet mounts`` shows and ``git xet mount`` repairs.

The serving side (:class:`Takeover`) has to make libfuse serve a connection that is already
initialised. libfuse takes ``/dev/fd/N`` as mountpoint and serves descriptor N without
mounting, but it answers everything with EIO until it has processed an INIT. So N is first
one end of a socketpair whose other end holds the recorded INIT request; libfuse reads and
processes it, and from inside the INIT handler (:meth:`Takeover.on_init`) N is ``dup2``-ed
onto the real descriptor before any other request is read. libfuse's INIT reply then goes to
the kernel: the first serving process answers the real INIT; a later one's reply names a
request the kernel already finished and is dropped (ENOENT, which libfuse ignores). A later
one then sends ``FUSE_NOTIFY_RESEND`` (Linux 6.9+): the kernel puts back every request the
dead process had read but not answered, so readers see a pause, never an error. File and
directory handles hold no per-process state (``gitxet.mount.fuse``) and inode numbers are a
function of the path (``gitxet.vfs.model``), so the new process understands what the old
one handed out. On a kernel without resend the in-flight requests of the dead process would
wait forever: :meth:`Takeover.on_init` then logs it, and the supervisor is still worth having
for everything that was not in flight.

This module uses the standard library only: the supervisor stays small.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import errno
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence

log = logging.getLogger(__name__)

TAKEOVER_OPTION = "--fuse-takeover"  # FD:RESEND:INIT-HEX, put before the command's "--"

FUSE_INIT = 26
FUSE_NOTIFY_RESEND = 7
_IN_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
_OUT_HEADER = struct.Struct("<IiQ")  # len, error (notify code), unique (0: a notification)
_READ_BUFFER = (1 << 20) + 4096  # more than any request the kernel sends (>= 8 KiB needed)
QUICK_DEATH = 10.0  # a serving process that dies sooner than this after starting ...
MAX_QUICK_DEATHS = 5  # ... this many times in a row: give up (leave a dead mount)
_STOP_GRACE = 10.0  # seconds a serving process gets to exit after SIGTERM


class SupervisorError(Exception):
    """The supervisor cannot mount or cannot read the kernel's first request."""


# ---- the serving side ------------------------------------------------------------------------


class Takeover:
    """Lets libfuse serve an already-mounted FUSE connection (see the module docstring).

    ``session_path`` is what to give libfuse as mountpoint; :meth:`on_init` must run inside
    libfuse's INIT handler (pyfuse3's ``Operations.init``).
    """

    def __init__(self, fuse_fd: int, init_request: bytes, *, resend: bool) -> None:
        if len(init_request) < _IN_HEADER.size + 8:
            raise SupervisorError("the recorded FUSE_INIT request is truncated")
        length, opcode = _IN_HEADER.unpack_from(init_request)[:2]
        if opcode != FUSE_INIT or length != len(init_request):
            raise SupervisorError("the recorded request is not a FUSE_INIT")
        os.fstat(fuse_fd)  # EBADF now rather than a confusing libfuse error later
        self.fuse_fd = fuse_fd
        self.resend = resend
        a, self._feeder = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.session_fd = a.detach()  # replaced by the real descriptor in on_init
        self._feeder.send(init_request)
        self.taken = False

    @property
    def session_path(self) -> str:
        """The mountpoint argument that makes libfuse serve ``session_fd`` without mounting."""
        return f"/dev/fd/{self.session_fd}"

    def on_init(self) -> None:
        """Swap the real connection in; ask for a re-send of requests left unanswered."""
        if self.taken:
            return
        os.dup2(self.fuse_fd, self.session_fd)
        self.taken = True
        self._feeder.close()
        if self.fuse_fd != self.session_fd:
            os.close(self.fuse_fd)
        if self.resend:
            try:
                os.write(self.session_fd, _OUT_HEADER.pack(_OUT_HEADER.size, FUSE_NOTIFY_RESEND, 0))
            except OSError as exc:
                # before Linux 6.9: requests the previous process had read stay unanswered
                log.error("the kernel cannot re-send in-flight FUSE requests: %s", exc)
            else:
                log.info("took over the FUSE connection; in-flight requests re-sent")

    def close(self) -> None:
        """Release what :meth:`on_init` did not (a serving process that never started)."""
        with contextlib.suppress(OSError):
            self._feeder.close()
        if not self.taken:
            with contextlib.suppress(OSError):
                os.close(self.session_fd)


def parse_takeover(value: str) -> Takeover:
    """The :class:`Takeover` a ``--fuse-takeover=FD:RESEND:INIT-HEX`` argument describes."""
    try:
        fd, resend, init = value.split(":", 2)
        return Takeover(int(fd), bytes.fromhex(init), resend=resend == "1")
    except (ValueError, OSError) as exc:
        raise SupervisorError(f"bad {TAKEOVER_OPTION} value from the supervisor: {exc}") from None


def with_takeover(command: Sequence[str], fd: int, init: bytes, *, resend: bool) -> list[str]:
    """``command`` with the takeover option inserted before its first ``--`` (or appended)."""
    arg = f"{TAKEOVER_OPTION}={fd}:{int(resend)}:{init.hex()}"
    cmd = list(command)
    at = cmd.index("--") if "--" in cmd else len(cmd)
    return [*cmd[:at], arg, *cmd[at:]]


# ---- the supervisor --------------------------------------------------------------------------


def mount_fuse(mountpoint: str, options: str) -> int:
    """Mount a FUSE filesystem at ``mountpoint`` with ``fusermount3``; returns the descriptor.

    fusermount3 opens ``/dev/fuse``, mounts, and sends the descriptor over the socket named
    by ``_FUSE_COMMFD`` (libfuse's protocol; works unprivileged too).
    """
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            proc = subprocess.Popen(
                ["fusermount3", "-o", options, "--", mountpoint],
                env={"_FUSE_COMMFD": str(child.fileno())},  # fusermount3 needs nothing else
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        except FileNotFoundError:
            raise SupervisorError("fusermount3 is not installed (package fuse3)") from None
        child.close()
        fds = array.array("i")
        _msg, anc, _flags, _addr = parent.recvmsg(1, socket.CMSG_SPACE(fds.itemsize))
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        _, err = proc.communicate(timeout=30)
        if proc.returncode != 0 or not fds:
            for fd in fds:
                os.close(fd)
            why = err.decode("utf-8", "replace").strip() or f"status {proc.returncode}"
            raise SupervisorError(f"fusermount3 failed: {why}")
        for extra in fds[1:]:
            os.close(extra)
        return fds[0]
    finally:
        parent.close()
        child.close()


def read_init(fd: int) -> bytes:
    """The kernel's first request on a fresh connection: FUSE_INIT."""
    data = os.read(fd, _READ_BUFFER)
    if len(data) < _IN_HEADER.size or _IN_HEADER.unpack_from(data)[1] != FUSE_INIT:
        raise SupervisorError("the first FUSE request is not INIT")
    return data


def connection_gone(fd: int) -> bool:
    """Whether the FUSE connection behind ``fd`` ended (unmounted or aborted)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))


class Supervisor:
    """Keeps one serving process on a FUSE connection (see the module docstring)."""

    def __init__(self, mountpoint: str, fuse_fd: int, init: bytes, command: Sequence[str]):
        self.mountpoint = mountpoint
        self.fd = fuse_fd
        self.init = init
        self.command = list(command)
        self.child: subprocess.Popen[bytes] | None = None
        self.generation = 0
        self._upgrade = False
        self._stop = False

    def _spawn(self) -> None:
        # generation 0 answers the kernel's real INIT: nothing else is in flight yet (a
        # re-send would re-queue that very INIT)
        cmd = with_takeover(self.command, self.fd, self.init, resend=self.generation > 0)
        self.child = subprocess.Popen(cmd, pass_fds=(self.fd,))
        log.info("serving process %d started (generation %d)", self.child.pid, self.generation)
        self.generation += 1

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGUSR1:
            self._upgrade = True
        else:
            self._stop = True

    def run(self) -> int:
        """Serve until the mount goes away; returns the exit status."""
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(s, self._on_signal)
        quick = 0
        while True:
            started = time.monotonic()
            self._spawn()
            assert self.child is not None
            code = self._wait_child()
            if self._stop:
                return self._shutdown()
            if connection_gone(self.fd):
                log.info("the mount is gone; exiting")
                return 0
            if self._upgrade:
                self._upgrade = False
                quick = 0
                continue
            quick = quick + 1 if time.monotonic() - started < QUICK_DEATH else 0
            log.warning("serving process %d died (status %s)", self.child.pid, code)
            if quick >= MAX_QUICK_DEATHS:
                log.error(
                    "serving processes keep dying; giving up (the mount is left dead: "
                    "'git xet mount' onto it repairs it, 'git xet unmount' removes it)"
                )
                return 1

    def _wait_child(self) -> int:
        assert self.child is not None
        while True:
            try:
                return self.child.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            if self._stop:
                return self._terminate_child()
            if self._upgrade:
                log.info("replacing serving process %d", self.child.pid)
                return self._terminate_child()

    def _terminate_child(self) -> int:
        assert self.child is not None
        self.child.terminate()
        try:
            return self.child.wait(timeout=_STOP_GRACE)
        except subprocess.TimeoutExpired:
            self.child.kill()
            return self.child.wait()

    def _shutdown(self) -> int:
        """Stopped by a signal: unmount (lazily if busy) and let the connection end."""
        log.info("signal received: unmounting %s", self.mountpoint)
        for lazy in ([], ["-z"]):
            cmd = ["fusermount3", "-u", "-q", *lazy, self.mountpoint]
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                if subprocess.run(cmd, timeout=10, check=False).returncode == 0:
                    break
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gitxet.mount.supervisor --mountpoint M --options O -- COMMAND...``"""
    parser = argparse.ArgumentParser(prog="gitxet.mount.supervisor")
    parser.add_argument("--mountpoint", required=True)
    parser.add_argument("--options", required=True, help="FUSE mount options, comma-separated")
    parser.add_argument("command", nargs="+", help="the serving process's command line")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s gitxet-supervisor[%(process)d] %(message)s"
    )
    # SIGTERM before the first serving process runs must still unmount, not kill us
    stop = {"now": False}
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        fd = mount_fuse(args.mountpoint, args.options)
        init = read_init(fd)
    except (SupervisorError, OSError) as exc:
        print(f"gitxet-supervisor: {exc}", file=sys.stderr, flush=True)
        return 1
    signal.signal(signal.SIGTERM, previous)
    sup = Supervisor(args.mountpoint, fd, init, args.command)
    sup._stop = stop["now"]
    try:
        return sup.run()
    except OSError as exc:
        if exc.errno == errno.EINTR:
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
