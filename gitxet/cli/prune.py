"""``git xet prune``: free the local store of data nothing here needs (git lfs prune)."""

from __future__ import annotations

from typing import Annotated

import typer

from gitxet.cli import _json
from gitxet.cli._progress import human_size

RECENT_DAYS_KEY = "xet.recentRefsDays"
DEFAULT_RECENT_DAYS = 7


def register(app: typer.Typer) -> None:
    app.command("prune")(prune_cmd)


def _recent_days(repo, option: float | None) -> float:  # type: ignore[no-untyped-def]
    from gitxet.git import process

    if option is not None:
        if option < 0:
            raise typer.BadParameter("must be 0 or more", param_hint="--recent-days")
        return option
    text = process.config_get(repo.cwd, RECENT_DAYS_KEY)
    if text is None:
        return DEFAULT_RECENT_DAYS
    from gitxet.errors import ConfigError

    try:
        days = float(text)
    except ValueError:
        raise ConfigError(f"{RECENT_DAYS_KEY}: not a number of days: {text!r}") from None
    if not days >= 0:  # negative (nothing recent: prune would keep no branch) or nan
        raise ConfigError(f"{RECENT_DAYS_KEY}: not a number of days (0 or more): {text!r}")
    return days


def _mounted_commits() -> list[str]:
    """Commits served by this user's gitxet mounts (kept: a mount reads them lazily)."""
    from gitxet.cli.mountcmds import _registry

    return [rec.commit for rec in _registry().list()]


def prune_cmd(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", "-d", help="Say what would be removed; remove nothing.")
    ] = False,
    verify_remote: Annotated[
        bool,
        typer.Option(
            "--verify-remote",
            "-c",
            help="Remove only data the remote has (ask it); keep the rest.",
        ),
    ] = False,
    remote: Annotated[
        str | None, typer.Option("--remote", help="Remote for --verify-remote (default: origin).")
    ] = None,
    recent_days: Annotated[
        float | None,
        typer.Option(
            "--recent-days",
            help=f"Keep the files of branches committed to in this many days "
            f"({RECENT_DAYS_KEY}, default {DEFAULT_RECENT_DAYS}).",
        ),
    ] = None,
    grace: Annotated[
        float,
        typer.Option(
            "--grace", help="Never remove data written in the last SECONDS (git may be adding it)."
        ),
    ] = 3600.0,
    cache: Annotated[
        bool,
        typer.Option(
            "--cache",
            help="Also trim the shared chunk cache of http(s) repositories (GITXET_CACHE_DIR).",
        ),
    ] = False,
    cache_keep: Annotated[
        str, typer.Option("--cache-keep", help="With --cache: the bytes to keep (LRU), e.g. 1g.")
    ] = "0",
    as_json: Annotated[bool, typer.Option("--json", help="A JSON summary on stdout.")] = False,
) -> None:
    """Delete data from the local store (.git/xet) that this repository does not need.

    Kept: the files of HEAD and of the index; of every branch (local or remote-tracking)
    committed to in the last --recent-days days, and of the stash; every file added by a
    commit that no remote-tracking ref reaches (not pushed yet: all of them without a
    remote); the files of commits your gitxet mounts serve; anything written in the last
    --grace seconds. Everything else (older versions, data of deleted branches) is removed
    and fetched again from a remote when needed. With --verify-remote, data the remote does
    not have is kept too.

    --cache also evicts the least recently used ranges of the shared chunk cache (mounts,
    xet:// and checkouts of servers) down to --cache-keep bytes; this works outside a
    repository too. A mount reading an evicted range fetches it again.
    """
    from gitxet.cli.gitcmds import _open_repo
    from gitxet.data.prune import apply_prune, plan_prune
    from gitxet.errors import NotARepositoryError

    trimmed = _trim_cache(cache_keep, dry_run) if cache else None
    try:
        repo = _open_repo()
    except NotARepositoryError:
        if trimmed is None:
            raise
        _report_cache(trimmed, dry_run, as_json)
        return
    days = _recent_days(repo, recent_days)
    keep = repo.files_to_keep(days, _mounted_commits())
    all_kept = set().union(*keep.values())
    plan = plan_prune(repo.cas, all_kept, grace)
    not_on_remote: int | None = None
    if verify_remote and plan.files:
        from gitxet.data.audit import missing_files

        name = remote or repo.default_remote()
        if name is None:
            raise typer.BadParameter("no remote to verify against", param_hint="--verify-remote")
        repo.remotes.require(name)
        absent = missing_files(repo.remote(name), sorted(plan.files))
        not_on_remote = len(absent)
        if absent:
            plan = plan_prune(repo.cas, all_kept | absent, grace)
    elif verify_remote:
        not_on_remote = 0
    if not dry_run and (plan.shards or plan.xorbs):
        apply_prune(repo.cas, plan)
    if as_json:
        _json.emit(
            "prune",
            {
                "dry_run": dry_run,
                "shards_removed": len(plan.shards),
                "xorbs_removed": len(plan.xorbs),
                "bytes_removed": plan.size,
                "files_removed": len(plan.files),
                "shards_kept": plan.kept_shards,
                "xorbs_kept": plan.kept_xorbs,
                "bytes_kept": plan.kept_bytes,
                "kept_files": {
                    "checkout": len(keep["checkout"]),
                    "recent": len(keep["recent"]),
                    "unpushed": len(keep["unpushed"]),
                    "mounted": len(keep["commits"]),
                },
                "not_on_remote": not_on_remote,
                "cache_ranges_removed": trimmed[0] if trimmed else None,
                "cache_bytes_removed": trimmed[1] if trimmed else None,
            },
        )
        return
    verb = "would remove" if dry_run else "removed"
    typer.echo(
        f"git-xet: {verb} {len(plan.xorbs)} xorb(s) and {len(plan.shards)} shard(s) "
        f"({human_size(plan.size)}) holding {len(plan.files)} file(s) nothing here needs; "
        f"kept {human_size(plan.kept_bytes)}: the files of HEAD and the index "
        f"({len(keep['checkout'])}), recent refs ({len(keep['recent'])}), unpushed commits "
        f"({len(keep['unpushed'])}), mounts ({len(keep['commits'])})",
        err=True,
    )
    if not_on_remote:
        typer.echo(
            f"git-xet: kept {not_on_remote} file(s) the remote does not have "
            "('git xet push --all' uploads them)",
            err=True,
        )
    if trimmed is not None:
        _report_cache(trimmed, dry_run, False)


def _trim_cache(keep: str, dry_run: bool) -> tuple[int, int]:
    """Evict the shared chunk cache down to ``keep`` bytes: (ranges, bytes) removed (with
    ``dry_run``: (0, the bytes that would go))."""
    from gitxet.cli._env import settings
    from gitxet.data.remote_source import node_cache_bytes, open_node_cache
    from gitxet.settings import parse_size

    s = settings()
    keep_bytes = parse_size(keep)
    if dry_run:
        return 0, max(0, node_cache_bytes(s.cache_dir) - keep_bytes)
    return open_node_cache(s.cache_dir, s.cache_bytes).trim(keep_bytes)


def _report_cache(trimmed: tuple[int, int], dry_run: bool, as_json: bool) -> None:
    ranges, freed = trimmed
    if as_json:
        _json.emit("prune-cache", {"dry_run": dry_run, "ranges": ranges, "bytes": freed})
        return
    verb = "would free" if dry_run else f"removed {ranges} range(s),"
    typer.echo(f"git-xet: chunk cache: {verb} {human_size(freed)}", err=True)
