"""Tracking rules that travel with the repository: ``.xetconfig``, and the files never stored
as pointers.

``.xetconfig`` sits at the top of the work tree and is committed, like git-lfs's
``.lfsconfig``. It is git-config syntax, read with ``git config -f`` (``--blob`` for the
index's or HEAD's copy when the work tree lacks it; neither follows ``include.path``), and
gitxet reads only the keys it names here, so a cloned repository cannot configure anything
else through it. Today that is ``xet.threshold``: files at least this big become pointers.
Because the file is committed, every clone cleans files exactly as the origin did.

Where a setting comes from, first hit wins: ``.xetconfig`` of the work tree, else of the
index, else of HEAD; then git's own configuration (``git config xet.threshold``: the way
before ``.xetconfig``, and not seen by clones); then the default.

Files git itself reads (:data:`NEVER_POINTERS`, at any depth) are never stored as
pointers, whatever the threshold or the rules: a clone's git must be able to read them
before any filter has run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gitxet.git._runner import PathArg, fail, run, run_git

__all__ = [
    "NEVER_POINTERS",
    "THRESHOLD_KEY",
    "XETCONFIG",
    "Setting",
    "is_never_pointer",
    "read_setting",
    "shadowed_warning",
    "write_setting",
]

XETCONFIG = ".xetconfig"
THRESHOLD_KEY = "xet.threshold"
#: Base names of the files git reads itself (and gitxet's own): always plain blobs.
NEVER_POINTERS = frozenset(
    {".gitattributes", ".gitignore", ".gitmodules", ".mailmap", ".lfsconfig", XETCONFIG}
)


@dataclass(frozen=True, slots=True)
class Setting:
    """A value and where it was found (``.xetconfig``, ``.xetconfig (index)``,
    ``.xetconfig (HEAD)`` or ``git config``); ``shadowed`` is a different value git's own
    configuration holds for the key, which the repository's file overrides (a user who ran
    ``git config xet.threshold 0`` must be told it has no effect)."""

    value: str
    source: str
    shadowed: str | None = None


def is_never_pointer(path: str) -> bool:
    """Whether ``path`` (repository-relative, ``/``-separated) is a file git reads."""
    return path.rsplit("/", 1)[-1] in NEVER_POINTERS


def _get(cwd: PathArg, where: list[str], key: str) -> str | bool | None:
    """The value; None when the key is unset; False when the file or blob is not there."""
    args = ["config", *where, "--get", key]
    result = run(args, cwd, None)
    if result.returncode == 0:
        return result.stdout.decode("utf-8", "surrogateescape").rstrip("\n")
    if b"unable to resolve config blob" in result.stderr:
        return False  # (git exits 1 for it, as for an unset key)
    if result.returncode == 1 and not result.stderr.strip():
        return None
    raise fail(args, result)


def read_setting(cwd: PathArg, worktree: PathArg | None, key: str) -> Setting | None:
    """``key`` from the repository's ``.xetconfig``, else from git's configuration."""
    sources: list[tuple[list[str], str]] = []
    if worktree is not None and (Path(worktree) / XETCONFIG).is_file():
        sources.append((["--file", os.fspath(Path(worktree) / XETCONFIG)], XETCONFIG))
    else:
        sources.append((["--blob", f":{XETCONFIG}"], f"{XETCONFIG} (index)"))
        sources.append((["--blob", f"HEAD:{XETCONFIG}"], f"{XETCONFIG} (HEAD)"))
    for where, label in sources:
        value = _get(cwd, where, key)
        if isinstance(value, str):
            own = _get(cwd, [], key)
            shadowed = own if isinstance(own, str) and own != value else None
            return Setting(value, label, shadowed)
        if value is None:
            break  # the repository's file exists and leaves the key unset
    value = _get(cwd, [], key)
    return Setting(value, "git config") if isinstance(value, str) else None


def shadowed_warning(key: str, setting: Setting | None) -> str | None:
    """One line for a ``git config`` value the repository's ``.xetconfig`` overrides."""
    if setting is None or setting.shadowed is None:
        return None
    how = f" (change it with 'git xet track --threshold {setting.shadowed}')"
    return (
        f"git config {key} = {setting.shadowed} has no effect: the repository's "
        f"{setting.source} sets {setting.value} for every clone"
        + (how if key == THRESHOLD_KEY else "")
    )


def write_setting(worktree: PathArg, key: str, value: str) -> Path:
    """Set ``key`` in the work tree's ``.xetconfig`` (created if missing); its path."""
    path = Path(worktree) / XETCONFIG
    run_git(["config", "--file", os.fspath(path), key, value], worktree)
    return path
