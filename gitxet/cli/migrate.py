"""``git xet migrate``: rewrite history so large files (git-lfs or plain) become pointers."""

from __future__ import annotations

from typing import Annotated

import typer

from gitxet.cli._progress import byte_progress


def register(app: typer.Typer) -> None:
    app.command("migrate")(migrate_cmd)


def _say(msg: str) -> None:
    typer.echo(msg, err=True)


def migrate_cmd(
    refs: Annotated[
        list[str] | None,
        typer.Argument(help="Branches or tags to rewrite (default: the current branch)."),
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
) -> None:
    """Rewrite history: git-lfs files and big plain files become Xet pointers.

    Needs a clean work tree and the LFS objects locally (git lfs fetch --all).

    Force-push the rewritten refs afterwards; the old commits stay in the reflog.
    """
    from gitxet import migrate
    from gitxet.cli.gitcmds import _open_repo, _program
    from gitxet.errors import LfsObjectMissingError
    from gitxet.git import config, hooks
    from gitxet.settings import parse_size

    size = parse_size(threshold) if threshold is not None else None
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
