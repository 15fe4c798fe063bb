"""Running commands in tests: a bounded time, output captured, a failure shown in full."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


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
