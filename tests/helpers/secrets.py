"""Assert that a token went nowhere it should not: process arguments, records, listings, logs.

Call :func:`assert_token_nowhere` after every system test that uses a token. It checks every
``/proc/*/cmdline`` of the machine (argv is world-readable), each file under the given
directories (mount records, daemon logs, caches, git configs), ``git xet mounts --json`` and
``git xet env`` run in the test's environment, and any extra text (captured output, error
messages).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

_MAX_FILE = 8 << 20  # larger files (chunk data) cannot hold a token of ours by accident


def _cmdlines() -> Iterable[tuple[int, bytes]]:
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                yield int(name), f.read()
        except OSError:
            continue  # exited meanwhile, or not ours to read


def _files(roots: Iterable[str | os.PathLike[str]]) -> Iterable[Path]:
    for root in roots:
        p = Path(root)
        if p.is_file():
            yield p
            continue
        for dirpath, _, names in os.walk(p):
            for n in names:
                yield Path(dirpath) / n


def _cli(args: list[str], env: Mapping[str, str] | None, cwd: str | None) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "gitxet", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=None if env is None else dict(env),
        cwd=cwd,
        check=False,
    )
    return r.stdout + r.stderr


def assert_token_nowhere(
    token: str,
    *,
    paths: Iterable[str | os.PathLike[str]] = (),
    texts: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    check_cli: bool = True,
) -> None:
    """Fail naming the place if ``token`` appears in any process's argv, in a file under
    ``paths``, in ``texts``, or in ``git xet mounts --json`` / ``git xet env`` (run with
    ``env`` in ``cwd``)."""
    assert token, "no token to look for"
    needle = token.encode()
    for pid, cmdline in _cmdlines():
        assert needle not in cmdline, f"token in the argv of pid {pid}: {cmdline[:200]!r}"
    for path in _files(paths):
        try:
            if path.is_symlink() or path.stat().st_size > _MAX_FILE:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        assert needle not in data, f"token in {path}"
    for i, text in enumerate(texts):
        assert token not in text, f"token in output #{i}: {text[:300]!r}"
    if check_cli:
        where = None if cwd is None else os.fspath(cwd)
        for args in (["mounts", "--json"], ["env"]):
            out = _cli(args, env, where)
            assert token not in out, f"token in `git xet {' '.join(args)}`: {out[:300]!r}"
