"""What becomes a pointer, kept in the repository: ``init``, ``track``, ``untrack``.

The rules are committed files, so every clone cleans files exactly as the origin did:
``.gitattributes`` says which paths go through the filter (``*``: by size; ``xet=always``:
a pointer whatever the size) and ``.xetconfig`` holds the size threshold. Each command
stages the files it changes.
"""

from __future__ import annotations

from typing import Annotated

import typer

from gitxet.cli._progress import human_size

DRY_RUN_HELP = "Say what would change, and change nothing."


def _say(msg: str) -> None:
    typer.echo(msg, err=True)


def _stage(root: str, names: list[str]) -> None:
    from gitxet.git import process

    if names:
        process.run_git(["add", "--", *names], cwd=root)


def init_cmd(
    threshold: Annotated[
        str, typer.Option(help="Files at least this big become pointers (e.g. 256k, 1m, 0).")
    ] = "256k",
) -> None:
    """Set this repository up: local filter + hooks, and auto-tracking of big files.

    Writes '* filter=xet ...' to .gitattributes and the threshold to .xetconfig, and stages
    both: the first commit carries the rules, so every clone stores files the same way.
    A repository that uses git-lfs is refused (nothing changes): 'git xet migrate'
    converts it.
    """
    from gitxet.cli.gitcmds import _install_pre_push, _program
    from gitxet.git import attributes, config, process, xetconfig
    from gitxet.migrate import lfs_evidence
    from gitxet.settings import parse_size

    parse_size(threshold)
    root = str(process.toplevel("."))
    lfs = lfs_evidence(root)
    if lfs is not None:  # before anything changes: LFS files would turn into pointer text
        _say(
            f"git-xet: this repository uses git-lfs ({lfs}): convert it with "
            "'git xet migrate' (docs/migrate.md); nothing was changed"
        )
        raise typer.Exit(1)
    program = _program()
    config.install("local", root, f"{program} filter-process", force=True)
    _install_pre_push(root, program)
    xetconfig.write_setting(root, xetconfig.THRESHOLD_KEY, threshold)
    attributes.track(root, ["*"])
    _stage(root, [".gitattributes", xetconfig.XETCONFIG])
    _say(
        f"git-xet: initialized {root} (files >= {threshold} are stored as Xet pointers; "
        ".gitattributes and .xetconfig are staged: commit them)"
    )


def track_cmd(
    patterns: Annotated[
        list[str] | None,
        typer.Argument(help="Path patterns (gitattributes syntax); none: list the rules."),
    ] = None,
    threshold: Annotated[
        str | None,
        typer.Option(help="Also set the size from which every file is a pointer (.xetconfig)."),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help=DRY_RUN_HELP)] = False,
) -> None:
    """Make files matching PATTERN pointers whatever their size; alone, list the rules.

    Each pattern becomes a line of .gitattributes ending in xet=always (git's patterns:
    'data/**' for every file under data/, as 'data/' matches nothing); --threshold goes to
    .xetconfig. The changed files are staged: commit them, and every clone stores files
    as this repository does. Files git reads itself (.gitattributes, .gitignore,
    .gitmodules, .mailmap, .lfsconfig, .xetconfig) are never pointers.
    """
    from gitxet.git import attributes, process, xetconfig
    from gitxet.settings import parse_size

    root = str(process.toplevel("."))
    if not patterns and threshold is None:
        _list_rules(root)
        return
    staged: list[str] = []
    if threshold is not None:
        size = parse_size(threshold)
        if dry_run:
            _say(f"would set xet.threshold = {threshold} ({human_size(size)}) in .xetconfig")
        else:
            xetconfig.write_setting(root, xetconfig.THRESHOLD_KEY, threshold)
            staged.append(xetconfig.XETCONFIG)
            _say(f"files >= {human_size(size)} are pointers (.xetconfig)")
    changed = attributes.track(root, patterns or [], always=True, dry_run=dry_run)
    for p in patterns or []:
        if p not in changed:
            _say(f"{p!r} is already tracked (always a pointer)")
        else:
            _say(f"{'would track' if dry_run else 'tracking'} {p!r}: always a pointer")
    if changed and not dry_run:
        staged.append(".gitattributes")
    _stage(root, staged)
    if staged:
        _say(
            "git-xet: staged "
            + " and ".join(staged)
            + "; files already committed change form when re-added: git add --renormalize ."
        )


def untrack_cmd(
    patterns: Annotated[list[str], typer.Argument(help="Patterns given to track.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help=DRY_RUN_HELP)] = False,
) -> None:
    """Undo 'git xet track PATTERN': remove the pattern's line from .gitattributes.

    Files matching it then follow the other rules (usually: by size). A pattern that is
    not a rule of .gitattributes changes nothing and makes the command fail; 'git xet
    track' lists the rules.
    """
    from gitxet.git import attributes, process

    root = str(process.toplevel("."))
    removed = attributes.untrack(root, patterns, dry_run=dry_run)
    for p in patterns:
        if p in removed:
            _say(f"{'would untrack' if dry_run else 'untracked'} {p!r}")
        else:
            _say(f"git-xet: {p!r} is not a rule of .gitattributes: nothing changed for it")
    if removed and not dry_run:
        _stage(root, [".gitattributes"])
    if len(removed) < len(set(patterns)):
        raise typer.Exit(1)


def _list_rules(root: str) -> None:
    from gitxet.cli.hot import open_repo
    from gitxet.git import attributes, process, xetconfig

    listed = process.run_git(
        ["ls-files", "-z", "--", ".gitattributes", "*/.gitattributes"], cwd=root
    )
    files = sorted({".gitattributes", *(p.decode() for p in listed.split(b"\0") if p)})
    info = process.git_dir(root) / "info" / "attributes"
    if info.is_file():
        files.append(str(info))
    found = attributes.rules(root, files)
    what = {"always": "always a pointer", "size": "a pointer by size", "off": "never (plain git)"}
    width = max((len(r.pattern) for r in found), default=0)
    for r in found:
        typer.echo(f"{r.pattern:<{width}}  {what[r.kind]:<18}  {r.source}")
    if not found:
        typer.echo("no rules: no file goes through gitxet ('git xet init' or 'track')")
    repo = open_repo(root)
    setting = repo.threshold_setting()
    where = setting.source if setting else "default"
    typer.echo(f"threshold: {human_size(repo.threshold)} ({where})")
    shadowed = xetconfig.shadowed_warning(xetconfig.THRESHOLD_KEY, setting)
    if shadowed:
        typer.echo(f"  ({shadowed})")
    if setting is not None and setting.source == "git config":
        typer.echo(
            "  (git config is not committed: clones use their own; "
            "'git xet track --threshold SIZE' writes .xetconfig)"
        )
    never = " ".join(sorted(xetconfig.NEVER_POINTERS))
    typer.echo(f"never pointers (git reads them): {never}")
