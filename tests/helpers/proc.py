"""Running commands in tests: a bounded time, output captured, a failure shown in full."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run(
    *args: str,
    cwd: Path,
    check: bool = True,
    env: dict[str, str] | None = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    """Run ``args`` in ``cwd`` (``env`` on top of this process's environment); with
    ``check``, a non-zero exit fails the test with the command's stdout and stderr."""
    r = subprocess.run(
        list(args),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and r.returncode != 0:
        raise AssertionError(f"{args} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def git(*args: str, cwd: Path) -> str:
    """``git *args`` in ``cwd``; its stdout, stripped."""
    return run("git", *args, cwd=cwd).stdout.strip()


def interpreter_path() -> str:
    """``$PATH`` with this interpreter's directory first (its ``git-xet``)."""
    return os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]


def git_env(tmp: Path) -> dict[str, str]:
    """An environment for a module-scoped fixture, which runs before the per-test sealing
    (tests/conftest.py): this interpreter's ``git-xet`` first on PATH, a private HOME
    (``tmp/home``) whose global git config holds the test identity and ``main`` as the
    default branch."""
    home = tmp / "home"
    home.mkdir()
    config = home / ".gitconfig"
    config.write_text(
        "[user]\n\tname = t\n\temail = t@t\n[init]\n\tdefaultBranch = main\n", encoding="utf-8"
    )
    return dict(
        os.environ,
        PATH=interpreter_path(),
        HOME=str(home),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=str(config),
    )


def use_interpreter(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """For one test: this interpreter's ``git-xet`` first on PATH, gitxet's state (mount
    records, logs) under ``tmp_path/state``."""
    monkeypatch.setenv("PATH", interpreter_path())
    monkeypatch.setenv("GITXET_STATE_DIR", str(tmp_path / "state"))


def remote_and_work(
    tmp: Path, env: dict[str, str], remote: str = "remote.git"
) -> tuple[Path, Path]:
    """A bare repository ``tmp/remote`` and a gitxet work tree ``tmp/work`` whose origin it is."""
    bare, work = tmp / remote, tmp / "work"
    run("git", "init", "-q", "--bare", str(bare), cwd=tmp, env=env)
    run("git", "init", "-q", str(work), cwd=tmp, env=env)
    run("git", "remote", "add", "origin", str(bare), cwd=work, env=env)
    run("git-xet", "init", cwd=work, env=env)
    return bare, work
