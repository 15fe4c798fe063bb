"""Installing and removing the ``filter.xet.*`` git configuration.

``install`` writes the filter driver keys and, next to them in the same config file, a
record of exactly which keys and values it wrote (multi-valued ``gitxet.installed``, one
``"<key> <value>"`` per entry). ``uninstall`` reads that record and removes a key only if it
still holds the value gitxet wrote. So a key the user set before installing, or changed
afterwards, is never deleted by gitxet, and installing twice is a no-op.

Installing refuses to overwrite a key the user set to something else (that usually means
another tool owns the name), unless ``force=True``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gitxet.errors import ConfigError
from gitxet.git.process import (
    PathArg,
    Scope,
    config_add,
    config_get_all,
    config_remove_empty_section,
    config_set,
    config_unset,
    config_unset_value,
)

__all__ = [
    "CREDENTIAL_KEY",
    "DEFAULT_FILTER_CMD",
    "FILTER_SECTION",
    "RECORD_KEY",
    "InstallReport",
    "UninstallReport",
    "filter_settings",
    "install",
    "install_credential_helper",
    "installed",
    "is_installed",
    "uninstall",
]

DEFAULT_FILTER_CMD = "git-xet filter-process"
FILTER_SECTION = "filter.xet"
#: Where ``install`` records what it wrote (same scope as the keys themselves).
RECORD_KEY = "gitxet.installed"
#: git's list of credential helpers (multi-valued: gitxet adds its own, keeps the others)
CREDENTIAL_KEY = "credential.helper"
_MULTI_VALUED = frozenset({CREDENTIAL_KEY})
_PROCESS_SUFFIX = " filter-process"


def filter_settings(
    filter_cmd: str = DEFAULT_FILTER_CMD,
    *,
    clean_cmd: str | None = None,
    smudge_cmd: str | None = None,
) -> dict[str, str]:
    """The keys ``install`` writes, in order.

    ``clean_cmd``/``smudge_cmd`` (the one-shot fallbacks git uses where it cannot run the
    process filter) default to the same program as ``filter_cmd``: for
    ``"python -m gitxet filter-process"`` that is ``"python -m gitxet clean -- %f"``.
    """
    program = (
        filter_cmd[: -len(_PROCESS_SUFFIX)] if filter_cmd.endswith(_PROCESS_SUFFIX) else "git-xet"
    )
    settings = {
        f"{FILTER_SECTION}.process": filter_cmd,
        f"{FILTER_SECTION}.required": "true",
        f"{FILTER_SECTION}.clean": clean_cmd or f"{program} clean -- %f",
        f"{FILTER_SECTION}.smudge": smudge_cmd or f"{program} smudge -- %f",
    }
    for key, value in settings.items():
        if not value.strip() or "\n" in value or "\0" in value:
            raise ConfigError(f"invalid command for {key}: {value!r}")
    return settings


@dataclass(frozen=True)
class InstallReport:
    """What ``install`` did: keys written now, and keys already in place with our value."""

    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class UninstallReport:
    """What ``uninstall`` did: keys removed, and recorded keys kept because they changed."""

    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def _require_repo(scope: Scope, repo: PathArg | None) -> None:
    if scope == "local" and repo is None:
        raise ConfigError("installing into the local scope needs a repository path")


def _read_record(scope: Scope, repo: PathArg | None) -> dict[str, str]:
    record: dict[str, str] = {}
    for entry in config_get_all(repo, RECORD_KEY, scope):
        key, sep, value = entry.partition(" ")
        if sep and key:
            record[key] = value  # a later entry for the same key wins
    return record


def _write_record(scope: Scope, repo: PathArg | None, record: Mapping[str, str]) -> None:
    config_unset(repo, RECORD_KEY, scope)
    for key, value in record.items():
        config_add(repo, RECORD_KEY, f"{key} {value}", scope)


def install(
    scope: Scope,
    repo: PathArg | None = None,
    filter_cmd: str = DEFAULT_FILTER_CMD,
    *,
    clean_cmd: str | None = None,
    smudge_cmd: str | None = None,
    force: bool = False,
) -> InstallReport:
    """Configure the ``xet`` filter driver in ``scope`` (``repo`` is needed for "local").

    Raises:
        ConfigError: a key is already set to a different value that gitxet did not write
            (nothing is changed then), unless ``force``.
    """
    _require_repo(scope, repo)
    wanted = filter_settings(filter_cmd, clean_cmd=clean_cmd, smudge_cmd=smudge_cmd)
    record = _read_record(scope, repo)

    to_write: list[str] = []
    unchanged: list[str] = []
    conflicts: list[str] = []
    for key, value in wanted.items():
        current = config_get_all(repo, key, scope)
        if current == [value]:
            unchanged.append(key)
        elif not current or key in record or force:
            # Unset, or ours from an earlier install (an upgrade), or the caller insists.
            to_write.append(key)
        else:
            conflicts.append(f"{key}={current[-1]!r}")
    if conflicts:
        raise ConfigError(
            f"already set in the {scope} git config by someone else: {', '.join(conflicts)}"
        )

    for key in to_write:
        if len(config_get_all(repo, key, scope)) > 1:
            config_unset(repo, key, scope)
        config_set(repo, key, wanted[key], scope)
        record[key] = wanted[key]
    if to_write:
        _write_record(scope, repo, record)
    return InstallReport(written=to_write, unchanged=unchanged)


def install_credential_helper(scope: Scope, repo: PathArg | None, helper: str) -> bool:
    """Add ``helper`` to ``credential.helper`` in ``scope``, after the helpers already there
    (they keep answering first); an older gitxet helper value is replaced. Returns whether
    anything changed. A value the user added themselves is left unrecorded (never removed).
    """
    _require_repo(scope, repo)
    if not helper.strip() or "\n" in helper or "\0" in helper:
        raise ConfigError(f"invalid credential helper: {helper!r}")
    record = _read_record(scope, repo)
    current = config_get_all(repo, CREDENTIAL_KEY, scope)
    ours = record.get(CREDENTIAL_KEY)
    if helper in current:
        return False
    if ours is not None and ours in current:
        config_unset_value(repo, CREDENTIAL_KEY, ours, scope)
    config_add(repo, CREDENTIAL_KEY, helper, scope)
    record[CREDENTIAL_KEY] = helper
    _write_record(scope, repo, record)
    return True


def _still_ours(repo: PathArg | None, scope: Scope, key: str, value: str) -> bool:
    current = config_get_all(repo, key, scope)
    return value in current if key in _MULTI_VALUED else current == [value]


def installed(scope: Scope, repo: PathArg | None = None) -> dict[str, str]:
    """Keys gitxet wrote in ``scope`` that still hold the value it wrote."""
    return {
        key: value
        for key, value in _read_record(scope, repo).items()
        if _still_ours(repo, scope, key, value)
    }


def is_installed(scope: Scope, repo: PathArg | None = None) -> bool:
    """Whether ``filter.xet.process`` is set in ``scope`` (by anyone)."""
    return bool(config_get_all(repo, f"{FILTER_SECTION}.process", scope))


def uninstall(scope: Scope, repo: PathArg | None = None) -> UninstallReport:
    """Remove what ``install`` wrote in ``scope``, and nothing else."""
    _require_repo(scope, repo)
    record = _read_record(scope, repo)
    removed: list[str] = []
    kept: list[str] = []
    for key, value in record.items():
        current = config_get_all(repo, key, scope)
        if key in _MULTI_VALUED and value in current:
            config_unset_value(repo, key, value, scope)  # only our value; others stay
            removed.append(key)
        elif current == [value]:
            config_unset(repo, key, scope)
            removed.append(key)
        elif current:  # changed since: the user's now
            kept.append(key)
    config_unset(repo, RECORD_KEY, scope)
    for section in (FILTER_SECTION, RECORD_KEY.rpartition(".")[0], "credential"):
        config_remove_empty_section(repo, section, scope)
    return UninstallReport(removed=removed, kept=kept)
