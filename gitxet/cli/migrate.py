"""``git xet migrate``: rewrite history so large files (git-lfs or plain) become pointers."""

from __future__ import annotations

from typing import Annotated

import typer

from gitxet.cli._progress import byte_progress


def register(app: typer.Typer) -> None:
    app.command("migrate")(migrate_cmd)


def _say(msg: str) -> None:
    typer.echo(msg, err=True)


MODES = ("import", "info", "export")


def migrate_cmd(
    refs: Annotated[
        list[str] | None,
        typer.Argument(
            help="[import|info|export] then branches or tags (default: import, the current branch)."
        ),
    ] = None,
    everything: Annotated[
        bool, typer.Option("--everything", help="Rewrite every local branch and tag.")
    ] = False,
    include: Annotated[
        list[str] | None,
        typer.Option(
            "-I", "--include", help="Only convert paths matching (gitattributes pattern)."
        ),
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("-X", "--exclude", help="Never convert paths matching.")
    ] = None,
    threshold: Annotated[
        str | None,
        typer.Option(
            help="Plain files at least this big become pointers (default: xet.threshold)."
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what import would convert; change nothing.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="info/--dry-run: a JSON summary on stdout.")
    ] = False,
) -> None:
    """Rewrite history: git-lfs files and big plain files become Xet pointers.

    'git xet migrate [import] REFS' rewrites; 'git xet migrate info REFS' (or import
    --dry-run) only reports, per file extension, how many git-lfs files and plain files of
    at least the threshold the history holds, and how many LFS objects are not here.
    'git xet migrate export REFS' goes back: Xet pointers (at the -I/-X paths) become the
    files' content again, and gitxet's .gitattributes lines and .xetconfig go.

    Needs a clean work tree and the LFS objects locally (git lfs fetch --all).

    Force-push the rewritten refs afterwards; the old commits stay in the reflog.
    """
    from gitxet import migrate
    from gitxet.cli.gitcmds import _open_repo, _program
    from gitxet.errors import LfsObjectMissingError
    from gitxet.git import config, hooks
    from gitxet.settings import parse_size

    size = parse_size(threshold) if threshold is not None else None
    names = list(refs or ())
    mode = names.pop(0) if names and names[0] in MODES else "import"
    if mode == "info" or dry_run:
        _info(
            migrate.MigrateOptions(
                tuple(names), everything, tuple(include or ()), tuple(exclude or ()), size
            ),
            as_json,
            dry_run and mode == "import",
        )
        return
    if mode == "export":
        _export(
            migrate.MigrateOptions(
                tuple(names), everything, tuple(include or ()), tuple(exclude or ()), size
            )
        )
        return
    refs = names
    repo = _open_repo()
    migrate.check_clean(repo)  # before touching any configuration
    where = str(repo.worktree or repo.git_dir)
    program = _program()
    config.install("local", where, f"{program} filter-process", force=True)
    hooks.install_hooks(where, names=("pre-push",), program=program, on_conflict="chain")
    options = migrate.MigrateOptions(
        refs=tuple(refs or ()),
        everything=everything,
        include=tuple(include or ()),
        exclude=tuple(exclude or ()),
        threshold=size,
    )
    try:
        with byte_progress("migrating", None) as advance:
            result = migrate.migrate(repo, options, progress=advance)
    except LfsObjectMissingError as exc:
        raise typer.BadParameter(
            f"{exc} (fetch it first: git lfs fetch --all, or --exclude that path)"
        ) from None
    converted = result.lfs_files + result.plain_files
    _say(
        f"git-xet: rewrote {result.commits} commit(s) on {len(result.refs)} ref(s); "
        f"{converted} file version(s) became Xet pointers ({result.lfs_files} from git-lfs, "
        f"{result.plain_files} plain), {result.bytes_converted:,} bytes: "
        f"{result.new_bytes:,} new, {result.reused_bytes:,} deduplicated"
    )
    if result.lfs_left:
        _say(
            f"git-xet: {result.lfs_left} git-lfs pointer(s) at unselected paths stay git-lfs "
            "pointers"
        )
    _say("git-xet: push the rewritten refs with 'git push --force' (old commits: git reflog)")


def _info(options, as_json: bool, dry_run: bool) -> None:  # type: ignore[no-untyped-def]
    """``migrate info`` and ``migrate --dry-run``: what an import would convert."""
    from gitxet import migrate
    from gitxet.cli import _json
    from gitxet.cli._progress import human_size
    from gitxet.cli.gitcmds import _open_repo

    found = migrate.survey(_open_repo(), options)
    rows = sorted(found.extensions.items(), key=lambda kv: -(kv[1][1] + kv[1][3]))
    if as_json:
        _json.emit(
            "migrate-info",
            {
                "refs": found.refs,
                "commits": found.commits,
                "threshold": found.threshold,
                "extensions": [
                    {
                        "extension": ext,
                        "lfs_files": r[0],
                        "lfs_bytes": r[1],
                        "plain_files": r[2],
                        "plain_bytes": r[3],
                    }
                    for ext, r in rows
                ],
                "lfs_missing": found.lfs_missing,
            },
        )
        return
    lfs = sum(r[0] for _, r in rows)
    plain = sum(r[2] for _, r in rows)
    total = sum(r[1] + r[3] for _, r in rows)
    verb = "would rewrite" if dry_run else "history of"
    typer.echo(
        f"{verb} {found.commits} commit(s) on {len(found.refs)} ref(s): {lfs + plain} file "
        f"version(s) would become Xet pointers ({lfs} from git-lfs, {plain} plain files of at "
        f"least {human_size(found.threshold)}), {human_size(total)}"
    )
    if rows:
        typer.echo(f"{'extension':<16}{'git-lfs files':>24}{'plain files':>24}")
    for ext, r in rows:
        typer.echo(
            f"{ext:<16}{f'{r[0]} ({human_size(r[1])})':>24}{f'{r[2]} ({human_size(r[3])})':>24}"
        )
    if found.lfs_missing:
        _say(
            f"git-xet: {found.lfs_missing} git-lfs object(s) are not in the local LFS store: "
            "'git lfs fetch --all' first (or --exclude their paths)"
        )


def _export(options) -> None:  # type: ignore[no-untyped-def]
    """``migrate export``: pointers back to plain blobs."""
    from gitxet.cli.gitcmds import _open_repo
    from gitxet.migrate.export import export

    repo = _open_repo()
    with byte_progress("exporting", None) as bar:
        result = export(repo, options, progress=bar)
    _say(
        f"git-xet: rewrote {result.commits} commit(s) on {len(result.refs)} ref(s); "
        f"{result.plain_files} file version(s) are plain git blobs again "
        f"({result.bytes_converted:,} bytes)"
    )
    _say(
        "git-xet: push the rewritten refs with 'git push --force'; 'git xet uninstall "
        "--local' removes the filter from this repository"
    )
