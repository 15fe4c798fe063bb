"""Mount lifecycle: start a mount daemon, wait until its mount is live, unmount, remember it.

The daemon is any command that mounts in the foreground and stays running while the mount is
served (the CLI passes ``python -m gitxet mount-serve ...``). This module never imports
the FUSE or NFS adapters, so it serves both kinds.

Readiness and mount state come from ``/proc/self/mountinfo`` rather than ``os.path.ismount``:
``stat`` on a mountpoint whose daemon is wedged blocks forever, while the mount table never
does. Once the mount shows up, one ``stat`` in a helper thread (bounded by the timeout)
proves the daemon answers.

A pid alone does not name a process for long (pids are recycled), so records keep the pid
together with the process start time from ``/proc/<pid>/stat``.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from gitxet.errors import FormatError, MountError
from gitxet.formats.record import check_record, load_json_object
from gitxet.util.procs import proc_stat, runs
from gitxet.util.records import RecordDir, record_name

MOUNTINFO = "/proc/self/mountinfo"
LOG_TAIL_LINES = 20
_LOG_TAIL_BYTES = 16 * 1024  # never read more than this of a daemon log for an error message
_RECORD_MAX_BYTES = 64 * 1024  # a registry record is a few hundred bytes; refuse anything huge
_RECORD_VERSION = 3  # 2 added subdir and metrics, 3 watch; versions 1 and 2 are still read
_KILL_GRACE = 3.0  # seconds between SIGTERM and SIGKILL
_HELPER_TIMEOUT = 10.0  # a fusermount3 / umount call that takes longer than this is stuck
_MOUNT_KINDS = ("fuse", "nfs")
_OCTAL_ESCAPE = re.compile(rb"\\([0-7]{3})")

# Daemons spawned by this process, by pid. Holding the Popen objects lets us reap them (no
# zombies in a long-lived parent such as the Docker plugin) and avoids Popen.__del__'s
# "still running" ResourceWarning.
_spawned: dict[int, _Child] = {}
# The daemon serving each mountpoint started by this process, for unmount() without a registry.
_by_mountpoint: dict[str, MountProcess] = {}
_spawn_lock = threading.Lock()


# ---- mount table -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MountTableEntry:
    """One line of the kernel's mount table."""

    mountpoint: str
    device: str  # "major:minor" of the mounted filesystem (names the FUSE connection's bdi)
    fstype: str  # e.g. "fuse.gitxet", "fuse", "nfs"
    source: str


def _unescape(field: bytes) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo octal escapes.
    raw = _OCTAL_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8)]), field)
    return os.fsdecode(raw)


def mount_table(path: str = MOUNTINFO) -> builtins.list[MountTableEntry]:
    """Parse ``/proc/self/mountinfo`` (order kept: later lines are mounted on top)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise MountError(path, f"cannot read the mount table: {exc}") from exc
    return _parse_mountinfo(data, path)


def _parse_mountinfo(data: bytes, path: str) -> builtins.list[MountTableEntry]:
    out: builtins.list[MountTableEntry] = []
    for line in data.splitlines():
        fields = line.split(b" ")
        try:
            sep = fields.index(b"-", 6)
            out.append(
                MountTableEntry(
                    mountpoint=_unescape(fields[4]),
                    device=fields[2].decode("ascii"),
                    fstype=_unescape(fields[sep + 1]),
                    source=_unescape(fields[sep + 2]),
                )
            )
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            raise FormatError(path, f"malformed mountinfo line {line[:200]!r}") from exc
    return out


def mounted_elsewhere(mountpoint: str) -> bool | None:
    """Whether another mount namespace (a container's) has the filesystem mounted at
    ``mountpoint`` here mounted anywhere: a container that uses a volume keeps a bind mount
    of it in its own namespace.

    ``None`` when that cannot be told: nothing is mounted there, no other namespace can be
    seen (a plugin in a PID namespace of its own sees none), or a process's mount table
    cannot be read. Only ``False`` says for sure that no container uses it.
    """
    mnt = normalize_mountpoint(mountpoint)
    try:
        with open(MOUNTINFO, "rb") as f:
            mine = f.read()
        device = next(
            (e.device for e in reversed(_parse_mountinfo(mine, MOUNTINFO)) if e.mountpoint == mnt),
            None,
        )
        seen = {os.readlink("/proc/self/ns/mnt")}
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except (OSError, FormatError):
        return None
    if device is None:
        return None
    others = 0
    for pid in pids:
        ns: str | None
        try:
            ns = os.readlink(f"/proc/{pid}/ns/mnt")
        except FileNotFoundError:
            continue  # ended meanwhile (or a zombie: no namespace any more)
        except PermissionError:
            ns = None  # a process with more privileges than ours: its mount table tells
        if ns is not None and ns in seen:
            continue
        path = f"/proc/{pid}/mountinfo"
        try:
            with open(path, "rb") as f:
                data = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        except OSError:
            return None  # a mount table we may not read: cannot tell
        if not data or data == mine:
            continue  # exiting, or our own namespace
        try:
            table = _parse_mountinfo(data, path)
        except FormatError:
            return None
        if ns is not None:
            seen.add(ns)
        others += 1
        if any(e.device == device for e in table):
            return True
    return False if others else None


def normalize_mountpoint(mountpoint: str) -> str:
    """Absolute, symlink-free path of a mountpoint, as the mount table spells it.

    Only the parent is resolved: resolving the mountpoint itself would ``lstat`` it, and that
    blocks when the mount's daemon hangs.
    """
    absolute = os.path.abspath(mountpoint)
    head, tail = os.path.split(absolute)
    if not tail:  # "/" itself
        return absolute
    return os.path.join(os.path.realpath(head), tail)


def log_path_for(logs_dir: str, mountpoint: str) -> str:
    """Where the daemon of ``mountpoint`` logs, under ``logs_dir``: one file per mountpoint.

    The name keeps the mountpoint's last component (readable in a listing) and adds a hash
    of the whole normalized path, so ``/a_b`` and ``/a/b`` never share a log.
    """
    mnt = normalize_mountpoint(mountpoint)
    base = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(mnt))[:64] or "root"
    return os.path.join(logs_dir, f"{base}-{record_name(mnt)[:16]}.log")


_FORBIDDEN_OPTIONS = ("max_read",)  # aborts libfuse under pyfuse3 on this platform


def mount_options(
    fsname: str = "gitxet", options: Iterable[str] = (), *, allow_other: bool = False
) -> set[str]:
    """The FUSE mount options for a read-only gitxet mount.

    ``fsname`` is shown in the mount table; characters libfuse cannot take there (commas,
    whitespace, non-ASCII) become ``_``. Extra ``options`` must be ASCII without commas, and
    ``max_read`` is refused (it aborts libfuse under pyfuse3).
    """
    safe = "".join(c if c.isascii() and c.isprintable() and c not in ", " else "_" for c in fsname)
    opts = {"ro", "default_permissions", f"fsname={safe or 'gitxet'}", "subtype=gitxet"}
    for opt in options:
        if not opt or not opt.isascii() or "," in opt or not opt.isprintable():
            raise MountError(fsname, f"bad FUSE mount option {opt!r}")
        if opt.split("=", 1)[0] in _FORBIDDEN_OPTIONS:
            raise MountError(fsname, f"mount option {opt!r} is not supported")
        opts.add(opt)
    if allow_other:
        opts.add("allow_other")
    return opts


def metrics_file_for(log_path: str) -> str:
    """Where the daemon logging to ``log_path`` writes its metrics (``gitxet.mount.metrics``)."""
    base, _ = os.path.splitext(log_path)
    return base + ".prom"


def find_mount(
    mountpoint: str, table: Sequence[MountTableEntry] | None = None
) -> MountTableEntry | None:
    """The topmost mount at ``mountpoint``, or ``None``."""
    mnt = normalize_mountpoint(mountpoint)
    rows = mount_table() if table is None else table
    found = None
    for row in rows:
        if row.mountpoint == mnt:
            found = row
    return found


def is_mounted(mountpoint: str) -> bool:
    """Whether something is mounted at ``mountpoint`` (never touches the mount itself)."""
    return find_mount(mountpoint) is not None


# ---- process identity ------------------------------------------------------------------------


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or ``None`` if there is no such process."""
    st = proc_stat(pid)
    return None if st is None else st[1]


def serving_pid(supervisor_pid: int) -> int | None:
    """The serving process of a FUSE supervisor (``gitxet.mount.supervisor``): its one live
    child, or ``None``."""
    try:
        with open(f"/proc/{supervisor_pid}/task/{supervisor_pid}/children", "rb") as f:
            kids = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return None
    for pid in kids:
        st = proc_stat(pid)
        if st is not None and st[0] not in ("Z", "X", "x"):
            return pid
    return None


def _reap(pid: int) -> None:
    proc = _spawned.get(pid)
    if proc is not None and proc.poll() is not None:
        with _spawn_lock:
            _spawned.pop(pid, None)


def process_alive(pid: int, start_time: int) -> bool:
    """Whether ``pid`` still names the process that started at ``start_time`` and runs."""
    _reap(pid)
    return runs(pid, start_time)


def _wait_gone(pid: int, start_time: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    delay = 0.01
    while process_alive(pid, start_time):
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.02)  # readiness is what callers wait for: notice it soon
    return True


def _signal(pid: int, start_time: int, signum: int) -> None:
    if not process_alive(pid, start_time):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def stop_process(pid: int, start_time: int, *, timeout: float = _KILL_GRACE) -> bool:
    """SIGTERM the process, SIGKILL it if it has not exited within ``timeout``.

    Returns whether the process is gone. Only signals the process if pid and start time still
    match, so a recycled pid is never hit.
    """
    _signal(pid, start_time, signal.SIGTERM)
    if _wait_gone(pid, start_time, timeout):
        return True
    _signal(pid, start_time, signal.SIGKILL)
    return _wait_gone(pid, start_time, _KILL_GRACE)


# ---- background start ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MountProcess:
    """A running mount daemon: which process serves which mountpoint, and where it logs."""

    pid: int
    start_time: int
    mountpoint: str
    log_path: str
    started_at: float
    log_offset: int = 0  # where this daemon's output starts in ``log_path``

    def alive(self) -> bool:
        """Whether the daemon is still running."""
        return process_alive(self.pid, self.start_time)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The daemon's last output lines (best effort: empty when the log is unreadable)."""
        return read_log_tail(self.log_path, lines, start=self.log_offset)


def read_log_tail(path: str, lines: int = LOG_TAIL_LINES, *, start: int = 0) -> str:
    """The last ``lines`` lines of a log file at or after byte ``start``, bounded in size."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            begin = max(start, end - _LOG_TAIL_BYTES)
            f.seek(begin)
            data = f.read(end - begin)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _open_log(log_path: str | None) -> tuple[int, str, int]:
    if log_path is None:
        fd, path = tempfile.mkstemp(prefix="gitxet-mount-", suffix=".log")
        return fd, path, 0
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    return fd, log_path, os.lseek(fd, 0, os.SEEK_END)


def _stat_answers(mountpoint: str, timeout: float) -> str | None:
    """``None`` when ``stat(mountpoint)`` returns within ``timeout``, else why it did not."""
    outcome = _stat_outcome(mountpoint, timeout)
    if outcome is _NO_ANSWER:
        return "the mount does not answer stat()"
    return None if outcome is None else f"stat failed: {outcome}"


_NO_ANSWER = OSError(errno.ETIMEDOUT, "no answer")
_DEAD_ERRNOS = (errno.ENOTCONN, errno.ECONNABORTED)  # nobody serves the FUSE connection


def _stat_outcome(mountpoint: str, timeout: float) -> OSError | None:
    """``None`` when ``stat(mountpoint)`` answers within ``timeout``, else its error
    (``_NO_ANSWER`` when it did not return in time)."""
    outcome: builtins.list[OSError | None] = []

    def probe() -> None:
        # stat() alone is not enough: the kernel answers it from cached attributes without
        # asking the daemon; opening the directory always asks (FUSE_OPENDIR)
        try:
            os.stat(mountpoint)
            os.close(os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY))
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    # A daemon thread: if the mount hangs, the thread is stuck until the daemon is killed,
    # which aborts the FUSE connection and releases it.
    t = threading.Thread(target=probe, name="gitxet-mount-probe", daemon=True)
    t.start()
    t.join(max(timeout, 0.1))
    return outcome[0] if outcome else _NO_ANSWER


#: health of a mountpoint, as :func:`mount_health` reports it
HEALTH_OK = "ok"  # mounted and answering
HEALTH_DEAD = "dead"  # mounted, but nothing serves it ("Transport endpoint is not connected")
HEALTH_HUNG = "hung"  # mounted, but stat() did not answer in time (a wedged daemon)
HEALTH_ABSENT = "absent"  # nothing is mounted there
HEALTH_ORPHAN = "orphan"  # answers, but its supervisor is gone (no failover any more)


def mount_health(mountpoint: str, timeout: float = 2.0) -> str:
    """Whether the mount at ``mountpoint`` serves: one of the ``HEALTH_*`` values.

    The mount table is read first (never blocks); then one ``stat`` in a helper thread,
    bounded by ``timeout``. A mount whose FUSE connection has no daemon any more answers
    ENOTCONN (or ECONNABORTED after an abort): that is a dead mount.
    """
    mnt = normalize_mountpoint(mountpoint)
    if not is_mounted(mnt):
        return HEALTH_ABSENT
    outcome = _stat_outcome(mnt, timeout)
    if outcome is None:
        return HEALTH_OK
    if outcome is _NO_ANSWER:
        return HEALTH_HUNG
    return HEALTH_DEAD if outcome.errno in _DEAD_ERRNOS else HEALTH_OK


def detach_dead(mountpoint: str) -> None:
    """Lazily detach a dead mount (``fusermount3 -uz``): open files on it keep failing, new
    lookups of the path see the directory under it again."""
    _run_unmount(normalize_mountpoint(mountpoint), lazy=True)


class _Child(Protocol):
    """What the runner needs of a daemon process (``subprocess.Popen`` or a fork)."""

    pid: int

    def poll(self) -> int | None: ...


class _ForkedDaemon:
    """A daemon forked from this process (no second interpreter start-up)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _fork_daemon(target: Callable[[], int], log_fd: int, cwd: str | None) -> _ForkedDaemon:
    pid = os.fork()
    if pid:
        return _ForkedDaemon(pid)
    # the child: a new session, stdio to /dev/null and the log, then serve until unmounted
    code = 1
    try:
        os.setsid()
        if cwd is not None:
            os.chdir(cwd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        code = target()
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def start_background(
    argv: Sequence[str] | Callable[[], int],
    mountpoint: str,
    *,
    timeout: float = 30.0,
    log_path: str | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
) -> MountProcess:
    """Spawn a detached mount daemon running ``argv`` and wait until ``mountpoint`` is live.

    The daemon gets its own session (no controlling terminal, so it outlives the caller's
    terminal), stdin from ``/dev/null`` and stdout/stderr appended to ``log_path`` (a new temp
    file when ``None``). Raises :class:`MountError` carrying the log tail when the daemon exits
    first, or when nothing answers within ``timeout`` seconds (the daemon is then killed and
    any half-made mount is detached).
    """
    mnt = normalize_mountpoint(mountpoint)
    if is_mounted(mnt):
        raise MountError(mnt, "something is already mounted there")
    if not os.path.isdir(mnt):
        raise MountError(mnt, "mountpoint is not a directory")
    log_fd, log_file, offset = _open_log(log_path)
    proc: _Child
    try:
        if callable(argv):
            # fork instead of exec: the caller already paid for interpreter start-up and
            # imports, which is most of the time to a ready mount
            proc = _fork_daemon(argv, log_fd, cwd)
        else:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                cwd=cwd,
                env=None if env is None else dict(env),
            )
    except OSError as exc:
        what = "a forked daemon" if callable(argv) else repr(argv[0])
        raise MountError(mnt, f"cannot start the mount daemon {what}: {exc}") from exc
    finally:
        os.close(log_fd)
    with _spawn_lock:
        _spawned[proc.pid] = proc
    started = process_start_time(proc.pid)
    if started is None:  # exited and was reaped already: impossible while we hold the Popen
        started = 0
    handle = MountProcess(proc.pid, started, mnt, log_file, time.time(), offset)

    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        rc = proc.poll()
        if rc is not None:
            with _spawn_lock:
                _spawned.pop(proc.pid, None)
            if is_mounted(mnt):  # died after mounting: do not leave a dead mount behind
                _detach_quietly(mnt)
            raise MountError(
                mnt,
                f"the mount daemon exited with status {rc} before the mount was ready",
                log_tail=handle.log_tail(),
                returncode=rc,
            )
        if is_mounted(mnt):
            problem = _stat_answers(mnt, deadline - time.monotonic())
            if problem is None:
                with _spawn_lock:
                    _by_mountpoint[mnt] = handle
                return handle
            _abort(handle)
            raise MountError(mnt, problem, log_tail=handle.log_tail())
        if time.monotonic() >= deadline:
            _abort(handle)
            raise MountError(
                mnt,
                f"the mount did not appear within {timeout:g} s",
                log_tail=handle.log_tail(),
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.02)  # readiness is what callers wait for: notice it soon


def _abort(handle: MountProcess) -> None:
    """Kill a daemon that failed to come up and detach whatever it mounted."""
    stop_process(handle.pid, handle.start_time)
    _reap(handle.pid)
    if is_mounted(handle.mountpoint):
        _detach_quietly(handle.mountpoint)


def _detach_quietly(mnt: str) -> None:
    with contextlib.suppress(MountError):
        _run_unmount(mnt, lazy=True)


# ---- unmount ---------------------------------------------------------------------------------


#: why an unmount (not lazy) failed while a process uses the mount; the mount keeps serving
BUSY = (
    "unmount failed: busy (a process has a file or its working directory there); it keeps "
    "serving until they are closed, or unmount it lazily"
)


def _unmount_commands(mnt: str, fstype: str, lazy: bool) -> builtins.list[builtins.list[str]]:
    fuse = ["fusermount3", "-u", "-q", *(["-z"] if lazy else []), mnt]
    plain = ["umount", *(["-l"] if lazy else []), mnt]
    # fusermount3 works for unprivileged users too; umount is the fallback (root, or NFS).
    return [fuse, plain] if fstype.startswith("fuse") else [plain]


def _run_unmount(mnt: str, *, lazy: bool) -> None:
    """Unmount with the first helper that works; raise MountError with every helper's error."""
    info = find_mount(mnt)
    if info is None:
        return
    errors: builtins.list[str] = []
    for cmd in _unmount_commands(mnt, info.fstype, lazy):
        try:
            res = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=_HELPER_TIMEOUT,
                check=False,
            )
        except FileNotFoundError:
            errors.append(f"{cmd[0]}: not installed")
            continue
        except subprocess.TimeoutExpired:
            errors.append(f"{cmd[0]}: no answer within {_HELPER_TIMEOUT:g} s")
            continue
        if res.returncode == 0 or not is_mounted(mnt):
            return
        msg = res.stderr.decode("utf-8", errors="replace").strip() or f"status {res.returncode}"
        if not lazy and "busy" in msg.lower():
            raise MountError(mnt, BUSY)
        errors.append(f"{cmd[0]}: {msg}")
    raise MountError(mnt, "unmount failed: " + "; ".join(errors))


def unmount(
    mountpoint: str,
    *,
    timeout: float = 10.0,
    lazy: bool = False,
    registry: MountRegistry | None = None,
) -> None:
    """Unmount ``mountpoint`` and wait for the daemon that served it to exit.

    The daemon is found in ``registry`` (when given) or among the daemons this process
    started. A mount whose daemon is dead ("Transport endpoint is not connected") is detached
    lazily even without ``lazy``; a busy mount raises :class:`MountError` unless ``lazy`` is
    set. A daemon still running ``timeout`` seconds after the unmount is stopped with SIGTERM
    and then SIGKILL. Unmounting something that is not mounted only cleans up the records.
    """
    mnt = normalize_mountpoint(mountpoint)
    owner: tuple[int, int] | None = None
    rec = registry.get(mnt) if registry is not None else None
    if rec is not None:
        owner = (rec.pid, rec.start_time)
    elif mnt in _by_mountpoint:
        proc = _by_mountpoint[mnt]
        owner = (proc.pid, proc.start_time)
    daemon_dead = owner is not None and not process_alive(*owner)

    if is_mounted(mnt):
        try:
            _run_unmount(mnt, lazy=lazy or daemon_dead)
        except MountError as exc:
            if lazy or "not connected" not in exc.reason:
                raise
            _run_unmount(mnt, lazy=True)

    if owner is not None:
        # The mount is gone, so a daemon still running after the timeout serves nothing.
        if not _wait_gone(*owner, timeout) and not stop_process(*owner):
            raise MountError(mnt, f"the mount daemon (pid {owner[0]}) does not exit")
        _reap(owner[0])
    with _spawn_lock:
        _by_mountpoint.pop(mnt, None)
    if registry is not None:
        registry.remove(mnt)


# ---- registry --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MountRecord:
    """What the registry remembers about one live mount."""

    mountpoint: str
    pid: int
    start_time: int
    kind: str  # "fuse" or "nfs"
    repo: str
    commit: str
    cache_dir: str
    started_at: float
    log_path: str = ""
    subdir: str = ""  # the directory of the commit served as the root ("" for the whole tree)
    metrics: str = ""  # host:port of the daemon's Prometheus endpoint ("" when off)
    watch: str = ""  # the branch a watched mount follows ("" when it serves one commit)

    @classmethod
    def for_process(
        cls,
        proc: MountProcess,
        *,
        kind: str,
        repo: str,
        commit: str,
        cache_dir: str,
        subdir: str = "",
        metrics: str = "",
        watch: str = "",
    ) -> MountRecord:
        """The record of a daemon returned by :func:`start_background`."""
        return cls(
            mountpoint=proc.mountpoint,
            pid=proc.pid,
            start_time=proc.start_time,
            kind=kind,
            repo=repo,
            commit=commit,
            cache_dir=cache_dir,
            started_at=proc.started_at,
            log_path=proc.log_path,
            subdir=subdir,
            metrics=metrics,
            watch=watch,
        )

    def to_json(self) -> bytes:
        """Canonical JSON bytes of the record."""
        body: dict[str, Any] = {"version": _RECORD_VERSION, **asdict(self)}
        return json.dumps(body, sort_keys=True, indent=1).encode("utf-8") + b"\n"

    @classmethod
    def from_json(cls, data: bytes, *, what: str = "mount record") -> MountRecord:
        """Parse a record strictly; :class:`FormatError` names the defect."""
        types: dict[str, tuple[type, ...]] = {
            "mountpoint": (str,),
            "pid": (int,),
            "start_time": (int,),
            "kind": (str,),
            "repo": (str,),
            "commit": (str,),
            "cache_dir": (str,),
            "started_at": (float, int),
            "log_path": (str,),
        }
        raw = load_json_object(data, what, max_bytes=_RECORD_MAX_BYTES)
        version = raw.get("version")
        if version != 1:  # version 1: written before subdir and metrics were recorded
            types.update(subdir=(str,), metrics=(str,))
        if version not in (1, 2):  # version 2: before watch
            types.update(watch=(str,))
        known = version if version in (1, 2) else _RECORD_VERSION
        body = check_record(raw, what, version=known, types=types)
        if body["kind"] not in _MOUNT_KINDS:
            raise FormatError(what, f"unknown mount kind {body['kind']!r}")
        if body["pid"] <= 0 or body["start_time"] < 0:
            raise FormatError(what, "bad pid or start time")
        if not os.path.isabs(body["mountpoint"]):
            raise FormatError(what, "mountpoint is not an absolute path")
        return cls(
            mountpoint=body["mountpoint"],
            pid=body["pid"],
            start_time=body["start_time"],
            kind=body["kind"],
            repo=body["repo"],
            commit=body["commit"],
            cache_dir=body["cache_dir"],
            started_at=float(body["started_at"]),
            log_path=body["log_path"],
            subdir=body.get("subdir", ""),
            metrics=body.get("metrics", ""),
            watch=body.get("watch", ""),
        )


class MountRegistry:
    """JSON records of live mounts, one file per mountpoint under ``state_dir``.

    One file per mount (a :class:`~gitxet.util.records.RecordDir`) means concurrent CLI
    invocations never rewrite each other's records; each write is atomic.
    """

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.state_dir = os.fspath(state_dir)
        self._records: RecordDir[MountRecord] = RecordDir(
            self.state_dir,
            key=lambda r: r.mountpoint,
            load=lambda data, what: MountRecord.from_json(data, what=what),
            dump=MountRecord.to_json,
            max_bytes=_RECORD_MAX_BYTES,
            # a record describes running processes, which a power loss ends too: an fsync
            # would only make every 'git xet mount' wait on the disk
            durable=False,
        )

    def record(self, rec: MountRecord) -> None:
        """Store (or replace) the record for ``rec.mountpoint``."""
        if rec.kind not in _MOUNT_KINDS:
            raise ValueError(f"unknown mount kind {rec.kind!r}")
        self._records.put(_replace_mountpoint(rec, normalize_mountpoint(rec.mountpoint)))

    def get(self, mountpoint: str) -> MountRecord | None:
        """The record for ``mountpoint`` (live or not), or ``None``."""
        return self._records.get(normalize_mountpoint(mountpoint))

    def remove(self, mountpoint: str) -> bool:
        """Forget ``mountpoint``; returns whether there was a record."""
        return self._records.remove(normalize_mountpoint(mountpoint))

    def list(self) -> builtins.list[MountRecord]:
        """Records of live mounts (daemon running), by mountpoint; see :meth:`statuses`."""
        return [st.record for st in self.statuses(probe=False) if st.state == HEALTH_OK]

    def statuses(self, *, probe: bool = True, timeout: float = 2.0) -> builtins.list[MountStatus]:
        """Every recorded mount that is still in the mount table, with its health.

        Records of mounts that are gone from the table are pruned. A mount whose daemon
        died stays (``dead``: it needs ``unmount`` or a repairing ``mount``). With ``probe``,
        a mount whose daemon runs is also asked one ``stat`` (``dead`` when its FUSE
        connection is gone, ``hung`` when it does not answer within ``timeout``).
        """
        records = self._records.list()
        if not records:
            return []
        mounted = {row.mountpoint for row in mount_table()}
        out: builtins.list[MountStatus] = []
        for rec in records:
            if rec.mountpoint not in mounted:
                self._records.remove(rec.mountpoint)
                continue
            if not process_alive(rec.pid, rec.start_time):
                # a supervisor killed on its own leaves its serving process serving
                alive = probe and mount_health(rec.mountpoint, timeout) == HEALTH_OK
                state = HEALTH_ORPHAN if alive else HEALTH_DEAD
            elif probe:
                state = mount_health(rec.mountpoint, timeout)
            else:
                state = HEALTH_OK
            out.append(MountStatus(rec, state))
        return out


@dataclass(frozen=True, slots=True)
class MountStatus:
    """A recorded mount and its health (a ``HEALTH_*`` value)."""

    record: MountRecord
    state: str


def unrecorded_gitxet_mounts(known: Sequence[str]) -> builtins.list[MountTableEntry]:
    """gitxet FUSE mounts in the mount table whose mountpoint is not in ``known``."""
    seen = set(known)
    return [
        row for row in mount_table() if row.fstype == "fuse.gitxet" and row.mountpoint not in seen
    ]


def _replace_mountpoint(rec: MountRecord, mountpoint: str) -> MountRecord:
    if rec.mountpoint == mountpoint:
        return rec
    fields = asdict(rec)
    fields["mountpoint"] = mountpoint
    return MountRecord(**fields)
