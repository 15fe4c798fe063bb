"""Error logs of the commands git runs (filter, hooks): written here, read by ``git xet logs``.

git shows a filter's or hook's stderr only in passing (and a GUI or CI may not show it at
all), so each failure of ``filter-process``, ``smudge``, ``clean``, ``pre-push`` and
``pre-receive`` also writes one file ``<git dir>/xet/logs/<time>-<pid>.log`` with the
message, the command line and the traceback (credentials removed, as everywhere), like
``git lfs logs``. Outside a repository they go to ``$GITXET_STATE_DIR/logs/errors``. No
typer here: the filter and hooks import this.
"""

from __future__ import annotations

import os
import sys
import time

KEEP = 100  # most recent logs kept per directory


def logs_dir() -> str:
    """Where this process's repository keeps error logs (state dir outside one)."""
    import subprocess

    git_dir = os.environ.get("GIT_DIR")
    if not git_dir:
        r = subprocess.run(
            ["git", "rev-parse", "--absolute-git-dir"], capture_output=True, text=True, check=False
        )
        git_dir = r.stdout.strip() if r.returncode == 0 else ""
    if git_dir:
        return os.path.join(os.path.abspath(git_dir), "xet", "logs")
    from gitxet.settings import state_root

    return os.path.join(state_root(), "logs", "errors")


def record(command: str, message: str, exc: BaseException) -> str | None:
    """Write the error log of a failed ``command``; its path, or None if it cannot be
    written (logging never makes a failure worse)."""
    import traceback

    from gitxet.settings import redact

    try:
        where = logs_dir()
        os.makedirs(where, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = os.path.join(where, f"{stamp}-{os.getpid()}.log")
        import gitxet

        text = (
            f"git-xet {gitxet.__version__}: {command} failed at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}\n"
            f"message: {message}\n"
            f"argv: {' '.join(sys.argv)}\n"
            f"cwd: {os.getcwd()}\n\n" + "".join(traceback.format_exception(exc))
        )
        with open(path, "a", encoding="utf-8") as f:
            f.write(redact(text) + "\n")
        _trim(where)
        return path
    except OSError:
        return None


def _trim(where: str) -> None:
    names = sorted(n for n in os.listdir(where) if n.endswith(".log"))
    for name in names[:-KEEP]:
        try:
            os.unlink(os.path.join(where, name))
        except OSError:
            pass
