"""What the bench/ scripts share: the shared benchmark tools, loopback servers, the page cache.

The scripts run as ``python bench/NAME.py``, which puts this directory first on
``sys.path``: they ``import benchlib``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_ENV = "GITXET_BENCH_SHARED"  # the directory holding bench/fuse_passthrough.py & co


def shared_dirs() -> list[Path]:
    """Where the shared benchmark tools (``shared/bench/...``) are looked for, in order:
    ``$GITXET_BENCH_SHARED``, then a ``shared`` directory beside the checkout or beside any
    directory above it (a worktree under ``/work/wt/NAME`` finds ``/work/shared``)."""
    dirs = [Path(os.environ[SHARED_ENV])] if os.environ.get(SHARED_ENV) else []
    return dirs + [parent / "shared" for parent in ROOT.parents]


def shared_file(relative: str) -> Path | None:
    """The first ``<shared>/relative`` of :func:`shared_dirs` that exists, else ``None``."""
    for d in shared_dirs():
        if (d / relative).is_file():
            return d / relative
    return None


def not_found(relative: str, option: str) -> str:
    """One line saying where ``relative`` was looked for and how to name it."""
    looked = ", ".join(str(d) for d in shared_dirs()[:3])
    return f"{relative} not found (looked in {looked}, ...): pass {option} or set {SHARED_ENV}"


def work_env(work: Path, **extra: str) -> dict[str, str]:
    """This environment with a private HOME (``work/home``, made here) and gitxet's state
    under ``work/state``, this interpreter's ``git-xet`` first on PATH, and ``extra``."""
    env = dict(
        os.environ,
        HOME=str(work / "home"),
        GIT_CONFIG_NOSYSTEM="1",
        GITXET_STATE_DIR=str(work / "state"),
        **extra,
    )
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    (work / "home").mkdir(parents=True, exist_ok=True)
    return env


def sealed_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment without git's and gitxet's variables, with a private HOME (made
    here) whose git config holds only the bench identity, this interpreter's ``git-xet``
    first on PATH, and ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GIT_", "GITXET_")) and k not in ("EMAIL", "XDG_CONFIG_DIRS")
    }
    home.mkdir(parents=True, exist_ok=True)
    (home / ".gitconfig").write_text(
        "[user]\n\tname = Bench\n\temail = bench@gitxet.invalid\n"
        "[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n"
        '[core]\n\tautocrlf = false\n[protocol "file"]\n\tallow = always\n',
        encoding="utf-8",
    )
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0",
        LC_ALL="C",
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        **extra,
    )
    return env


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(
    port: int, proc: subprocess.Popen[bytes] | None = None, timeout: float = 30, what: str = ""
) -> None:
    """Wait until something accepts on 127.0.0.1:``port``; exit the script if ``proc`` ends
    first or nothing listens within ``timeout`` seconds."""
    what = what or "a server"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            sys.exit(f"{what} exited early with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not start: nothing listens on {port}")


def byte_compile() -> None:
    """Compile gitxet's modules, as installing a package does. A timed gitxet process
    imports them at its start (every clone, filter, hook, mount), and a module whose
    ``.pyc`` is stale (an edited checkout under ``PYTHONDONTWRITEBYTECODE=1``, set on the
    shared VM) is compiled again in each one: ~18 ms of a ~115 ms pre-push hook, and 22
    modules of a ``git xet clone`` after a rebase."""
    import compileall

    import gitxet

    compileall.compile_dir(os.path.dirname(gitxet.__file__), quiet=1)


def drop_caches(*, quiet: bool = False) -> None:
    """Write back and drop the page cache (root only; says so otherwise unless ``quiet``)."""
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        if not quiet:
            print("(cannot drop the page cache: not root; cold numbers are warm-ish)")


def peak_rss_kb(pid: int) -> int:
    """The peak resident set (VmHWM, KiB) of a live process; 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0
