"""Assert that a token went nowhere it should not: process arguments, records, listings, logs.

Call :func:`assert_tokens_nowhere` after every system test that uses a token. It checks every
``/proc/*/cmdline`` of the machine (argv is world-readable), each file under the given
directories (mount records, daemon logs, caches, git configs), ``git xet mounts --json`` and
``git xet env`` run in the test's environment, and any extra text (captured output, error
messages).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

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


def _cli_outputs(
    argvs: list[list[str]], env: Mapping[str, str] | None, cwd: str | None
) -> list[str]:
    """The stdout + stderr of ``git xet ARGS`` for each of ``argvs``, run side by side."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "gitxet", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=None if env is None else dict(env),
            cwd=cwd,
        )
        for args in argvs
    ]
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=60)
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def assert_tokens_nowhere(
    tokens: Sequence[str],
    *,
    paths: Iterable[str | os.PathLike[str]] = (),
    texts: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    check_cli: bool = True,
) -> None:
    """Fail naming the place if any of ``tokens`` appears in any process's argv, in a file
    under ``paths``, in ``texts``, or in ``git xet mounts --json`` / ``git xet env`` (run
    with ``env`` in ``cwd``). One look at each place serves every token."""
    assert tokens and all(tokens), "no token to look for"
    needles = [t.encode() for t in tokens]
    for pid, cmdline in _cmdlines():
        for i, needle in enumerate(needles):
            assert needle not in cmdline, f"token #{i} in the argv of pid {pid}: {cmdline[:200]!r}"
    for path in _files(paths):
        try:
            if path.is_symlink() or path.stat().st_size > _MAX_FILE:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        for i, needle in enumerate(needles):
            assert needle not in data, f"token #{i} in {path}"
    checked = list(texts)
    if check_cli:
        where = None if cwd is None else os.fspath(cwd)
        argvs = [["mounts", "--json"], ["env"]]
        for args, out in zip(argvs, _cli_outputs(argvs, env, where), strict=True):
            for i, token in enumerate(tokens):
                assert token not in out, f"token #{i} in `git xet {' '.join(args)}`: {out[:300]!r}"
    for n, text in enumerate(checked):
        for i, token in enumerate(tokens):
            assert token not in text, f"token #{i} in output #{n}: {text[:300]!r}"


def assert_token_nowhere(token: str, **where: Any) -> None:
    """:func:`assert_tokens_nowhere` for one token."""
    assert_tokens_nowhere([token], **where)
