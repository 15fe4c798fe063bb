"""Process identity from ``/proc``: a pid alone may name another process once reused."""

from __future__ import annotations

import contextlib
import os

from gitxet.errors import FormatError


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of a process, or ``None`` if gone.

    Raises:
        FormatError: ``/proc/<pid>/stat`` cannot be parsed.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read(4096)
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
    close = data.rfind(b")")
    rest = data[close + 2 :].split(b" ") if close >= 0 else []
    if len(rest) < 20:
        raise FormatError(f"/proc/{pid}/stat", "too few fields")
    try:
        return rest[0].decode("ascii"), int(rest[19])
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormatError(f"/proc/{pid}/stat", "bad state or start time") from exc


def runs(pid: int, start_time: int) -> bool:
    """Whether ``pid`` still names the process that started at ``start_time`` and runs (a
    zombie has finished: it only waits for its parent to collect its status)."""
    st = proc_stat(pid)
    return st is not None and st[1] == start_time and st[0] not in ("Z", "X", "x")


def in_use(path: str) -> bool:
    """Whether a process (of those whose ``/proc`` entries this one may read) has ``path``
    or a file under it as its working directory or open. Unreadable processes count as
    not using it."""
    prefix = os.path.realpath(path).rstrip("/") + "/"
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return True  # no /proc: nothing can be told
    for pid in pids:
        links = [f"/proc/{pid}/cwd", f"/proc/{pid}/root"]
        with contextlib.suppress(OSError):
            links += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
        for link in links:
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if (target + "/").startswith(prefix):
                return True
    return False
