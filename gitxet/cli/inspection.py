"""Inspection commands: ``status``, ``ls-files``, ``pointer``, ``env``.

Each has a ``--json`` form whose schema is in :mod:`gitxet.cli._json`.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer

from gitxet.cli import _json
from gitxet.cli._progress import human_size, interactive
from gitxet.util.shown import shown


def register(app: typer.Typer) -> None:
    app.command("status")(status_cmd)
    app.command("ls-files")(ls_files_cmd)
    app.command("pointer")(pointer_cmd)
    app.command("env")(env_cmd)


def _open_repo(path: str = "."):  # type: ignore[no-untyped-def]
    from gitxet.cli.hot import open_repo

    return open_repo(path)


# ---- status ------------------------------------------------------------------------------


def _upstream(repo) -> tuple[str | None, str | None]:  # type: ignore[no-untyped-def]
    """(remote, remote-tracking ref) of the current branch: its upstream, else the default
    remote and its branch of the same name (as git-lfs compares with)."""
    from gitxet.git import process

    branch = process.current_branch(repo.cwd)
    remote = repo.default_remote()
    if branch:
        name = process.config_get(repo.cwd, f"branch.{branch}.remote")
        merge = process.config_get(repo.cwd, f"branch.{branch}.merge")
        if name and name != "." and merge and merge.startswith("refs/heads/"):
            return name, f"refs/remotes/{name}/{merge.removeprefix('refs/heads/')}"
        if remote:
            return remote, f"refs/remotes/{remote}/{branch}"
    return remote, None


def _remote_url_or_none(repo, remote: str) -> str | None:  # type: ignore[no-untyped-def]
    """The remote's URL without credentials; None when ``remote`` names no configured remote
    (xet.remote set to a name git does not know) and is not itself a URL or path."""
    from gitxet.git import process
    from gitxet.settings import strip_credentials

    if remote in process.list_remotes(repo.cwd) or "/" in remote or ":" in remote:
        return strip_credentials(repo.remote_url(remote) or "")
    return None


def _status(repo, *, locate: bool = False) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """What ``status`` shows; with ``locate``, also ``nowhere``: how many of HEAD's pointer
    files have their data in no store and not on the remote (None: the remote could not
    be asked), so the hint never sends the user to a checkout that cannot write them."""
    from gitxet.git import process

    head = process.head_commit(repo.cwd)
    # each listing is dropped once read (~0.6 KB a file each: at 100,000 files the index's,
    # HEAD's and the history's were all held at once, 322 MB)
    large = {f.path for f in repo.pointer_files(None)}
    tree = repo.pointer_files(head) if head else []
    large.update(f.path for f in tree)
    pointer_files = {
        "total": len(tree),
        "materialized": sum(1 for f in tree if f.materialized),
        "pointers": sum(1 for f in tree if not f.materialized),
    }
    pointers = [{"path": f.path, "size": f.pointer.size} for f in tree if not f.materialized]
    unwritten = [(f.path, f.pointer) for f in tree if not f.materialized] if locate else []
    del tree
    staged = {p: s for s, p in process.changed_paths(repo.cwd, staged=True) if p in large}
    unstaged = {p: s for s, p in process.changed_paths(repo.cwd, staged=False) if p in large}
    del large
    files = [
        {"path": p, "staged": staged.get(p), "unstaged": unstaged.get(p)}
        for p in sorted(staged.keys() | unstaged.keys())
    ]
    remote, tracking = _upstream(repo)
    to_push: list[str] = []
    if head and remote:
        from gitxet.errors import GitObjectNotFoundError

        try:
            base = [process.rev_parse(repo.cwd, tracking)] if tracking else []
        except GitObjectNotFoundError:
            base = []  # never pushed: everything is to be pushed
        found = repo.paths_to_push([head], base, remote)
        to_push = sorted({path for path, _ in found})
    nowhere: int | None = 0
    if unwritten:
        from gitxet.errors import ConfigError, RemoteError

        try:
            where = repo.locate(unwritten, remote, ask_remote=remote is not None)
            nowhere = sum(1 for d in where if not d.local and not d.remote)
        except (ConfigError, RemoteError):
            nowhere = None
    extra = {"nowhere": nowhere} if locate else {}
    return extra | {
        "branch": process.current_branch(repo.cwd),
        "commit": head,
        "remote": None
        if remote is None
        else {"name": remote, "url": _remote_url_or_none(repo, remote)},
        "pointer_files": pointer_files,
        "pointers": pointers,
        "changes": files,
        "to_push": to_push,
        "unpushed_data": repo.unpushed(remote) if remote else None,
    }


def status_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    porcelain: Annotated[
        bool,
        typer.Option("--porcelain", help="'XY path' per changed large file, as git status."),
    ] = False,
) -> None:
    """Large files: what is staged or modified, what a push would send, which are still
    pointers, and how many files' data the remote lacks.

    Only pointer files (large files) are listed; 'git status' shows everything. "To be
    pushed" are the files added by commits the branch's remote-tracking ref does not
    have; "data the remote lacks" counts the files of every branch whose data is here and
    not on a path remote ('git xet push --all' uploads it).
    """
    repo = _open_repo()
    st = _status(repo, locate=not as_json and not porcelain)
    if as_json:
        _json.emit("status", st)
        return
    if porcelain:
        for f in st["changes"]:
            typer.echo(f"{f['staged'] or ' '}{f['unstaged'] or ' '} {shown(f['path'])}")
        return
    remote = st["remote"]
    if remote is None:
        where = " (no remote)"
    elif remote["url"] is None:
        where = f" (remote {remote['name']}: no such remote; see 'git remote -v', xet.remote)"
    else:
        where = f" (remote {remote['name']}: {remote['url']})"
    typer.echo(f"On branch {st['branch'] or '(detached HEAD)'}{where}")
    if st["to_push"]:
        typer.echo(f"Large files to be pushed to {remote['name']}:")
        for p in st["to_push"]:
            typer.echo(f"\t{shown(p)}")
    staged = [f for f in st["changes"] if f["staged"]]
    if staged:
        typer.echo("Large files to be committed:")
        for f in staged:
            typer.echo(f"\t{_CHANGE[f['staged']]}{shown(f['path'])}")
    unstaged = [f for f in st["changes"] if f["unstaged"]]
    if unstaged:
        typer.echo("Large files not staged for commit:")
        for f in unstaged:
            typer.echo(f"\t{_CHANGE[f['unstaged']]}{shown(f['path'])}")
    pf = st["pointer_files"]
    hint = " ('git xet checkout' writes their data)" if pf["pointers"] else ""
    if st.get("nowhere"):
        hint = (
            f" (the data of {st['nowhere']} of them is in no store and not on "
            f"{remote['name'] if remote else 'any remote'}: 'git xet fsck' lists them; a "
            "clone that has the data uploads it: git xet push --all)"
        )
    typer.echo(
        f"pointer files in HEAD: {pf['total']} ({pf['materialized']} materialized, "
        f"{pf['pointers']} pointers){hint}"
    )
    for p in st["pointers"]:
        typer.echo(f"  pointer       {shown(p['path'])} ({p['size']:,} bytes)")
    if st["unpushed_data"] is not None:
        n = st["unpushed_data"]
        hint = " ('git xet push --all' uploads them)" if n else ""
        typer.echo(f"files whose data {remote['name']} lacks: {n}{hint}")


_CHANGE = {"A": "new file:   ", "M": "modified:   ", "D": "deleted:    ", "T": "typechange: "}


# ---- ls-files ----------------------------------------------------------------------------


def ls_files_cmd(
    rev: Annotated[str, typer.Argument(help="Revision (default HEAD).")] = "HEAD",
    all_refs: Annotated[
        bool,
        typer.Option("--all", "-a", help="Every pointer file in the history of all refs."),
    ] = False,
    deleted: Annotated[
        bool,
        typer.Option(
            "--deleted", "-d", help="Every pointer file in REV's history, deleted ones too."
        ),
    ] = False,
    size: Annotated[bool, typer.Option("--size", "-s", help="Show each file's size.")] = False,
    name_only: Annotated[bool, typer.Option("--name-only", "-n", help="Only the paths.")] = False,
    long: Annotated[bool, typer.Option("--long", "-l", help="The whole Xet hash.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per file (JSON Lines).")
    ] = False,
) -> None:
    """List the pointer files of a revision: Xet hash, '*' if materialized ('-' if a
    pointer), path.

    With --all or --deleted the history is listed (one line per file version, at the path
    it was first seen); a file not in REV's tree any more is marked deleted.
    """
    from gitxet.git import process

    repo = _open_repo()
    born = rev != "HEAD" or process.head_commit(repo.cwd) is not None
    if not born and not all_refs:
        return  # no commit yet: no pointer files (as git ls-files of an empty tree)
    current = repo.pointer_files(rev) if born else []
    rows: list[tuple[str, Any, bool | None, bool]] = [
        (f.path, f.pointer, f.materialized if rev == "HEAD" else None, False) for f in current
    ]
    if all_refs or deleted:
        revs = repo.ref_tips(True) if all_refs else [process.rev_parse(repo.cwd, rev)]
        here = {(f.path, f.pointer.xet_hash) for f in current}
        for path, ptr in repo.history_pointers(revs):
            if (path, ptr.xet_hash) not in here:
                rows.append((path, ptr, None, True))
    for path, ptr, materialized, gone in rows:
        if as_json:
            _json.emit(
                "ls-files",
                {
                    "path": path,
                    "size": ptr.size,
                    "xet_hash": ptr.xet_hash,
                    "sha256": ptr.sha256,
                    "materialized": materialized,
                    "deleted": gone,
                },
            )
        elif name_only:
            typer.echo(shown(path))
        else:
            flag = "D" if gone else "*" if materialized else "-"
            short = ptr.xet_hash if long else ptr.xet_hash[:12]
            extra = f" ({human_size(ptr.size)})" if size else ""
            typer.echo(f"{short} {flag} {shown(path)}{extra}")


# ---- pointer -----------------------------------------------------------------------------


def pointer_cmd(
    file: Annotated[
        str | None, typer.Option("--file", "-f", help="Build the pointer of this file.")
    ] = None,
    pointer: Annotated[
        str | None,
        typer.Option("--pointer", "-p", help="Read and check this pointer file ('-': stdin)."),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Only the exit status: 0 a valid pointer, 1 not.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Build the pointer of a file (--file), check a pointer (--pointer), or both: then
    they must match.

    Nothing is stored. A pointer that is not valid is named with its defect (exit 1).
    """
    from gitxet.formats.pointer import Pointer

    if file is None and pointer is None:
        raise typer.BadParameter("give --file, --pointer or both")
    built = parsed = None
    if file is not None:
        from gitxet.chunking.pipeline import ChunkStream
        from gitxet.hashing import to_hex

        if os.path.isdir(file):
            raise IsADirectoryError(21, "Is a directory", file)
        with open(file, "rb") as f:
            cs = ChunkStream(f, sha256=True)
            for _ in cs:
                pass
        built = Pointer(cs.sha256, cs.size, to_hex(cs.file_hash))
    if pointer is not None:
        if pointer == "-":
            data = sys.stdin.buffer.read(64 << 10)
        else:
            if os.path.isdir(pointer):
                raise IsADirectoryError(21, "Is a directory", pointer)
            with open(pointer, "rb") as f:
                data = f.read(64 << 10)
        if check:
            try:
                Pointer.decode(data)
            except Exception:
                raise typer.Exit(1) from None
            return
        parsed = Pointer.decode(data)  # a malformed pointer: one line naming the defect
    match = None if built is None or parsed is None else built == parsed
    ptr_out = built or parsed
    assert ptr_out is not None
    if as_json:
        _json.emit(
            "pointer",
            {
                "pointer": ptr_out.encode().decode("ascii"),
                "sha256": ptr_out.sha256,
                "size": ptr_out.size,
                "xet_hash": ptr_out.xet_hash,
                "matches": match,
            },
        )
    elif not check:
        typer.echo(ptr_out.encode().decode("ascii"), nl=False)
    if match is False:
        typer.echo(
            f"git-xet: {pointer} is not the pointer of {file} (it names another content)",
            err=True,
        )
        raise typer.Exit(1)


# ---- env ---------------------------------------------------------------------------------


def _environment() -> dict[str, Any]:
    import gitxet
    from gitxet import chunking
    from gitxet.settings import TOKEN_ENV, VARIABLES, Settings, redact

    settings = Settings.load()
    variables: dict[str, str | None] = {}
    for name, _what, _default in VARIABLES:
        value = os.environ.get(name)
        if name == TOKEN_ENV and value is not None:
            value = "(set)"  # never the token
        variables[name] = None if value is None else redact(value)
    for name in ("GITXET_TRACEBACK", "GITXET_SKIP_PREPUSH"):
        variables[name] = os.environ.get(name)
    return {
        "version": gitxet.__version__,
        "chunker": chunking.IMPLEMENTATION,
        "python": sys.executable,
        "terminal_progress": interactive(),
        "cache_dir": settings.cache_dir,
        "cache_size": settings.cache_bytes,
        "state_dir": settings.state_dir,
        "variables": variables,
    }


def _repository(repo) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    from gitxet.dataset import cas_root
    from gitxet.git import process
    from gitxet.settings import Settings, strip_credentials

    setting = repo.threshold_setting()
    remotes = []
    settings = Settings.load()
    for name in repo.remotes.names():
        url = repo.remote_url(name) or ""
        server = url.startswith(("http://", "https://"))
        remotes.append(
            {
                "name": name,
                "url": strip_credentials(url),
                "cas": cas_root(url) or ("server" if server else None),
                # where the token comes from, never the token itself
                "token": (settings.token_source(url) or "none") if server else None,
            }
        )
    config = {}
    for key in CONFIG_KEYS:
        config[key] = process.config_get(repo.cwd, key)
    s = repo.cas.stats()
    return {
        "path": str(repo.worktree or repo.git_dir),
        "store": str(repo.cas.root),
        "threshold": repo.threshold,
        "threshold_source": setting.source if setting else "default",
        "lazy": repo.lazy,
        "default_remote": repo.default_remote(),
        "remotes": remotes,
        "config": config,
        "xorbs": s.xorbs,
        "xorb_bytes": s.xorb_bytes,
        "shards": s.shards,
    }


#: git config keys gitxet reads (documented in docs/cli.md "Configuration")
CONFIG_KEYS = ("xet.lazy", "xet.remote", "xet.recentRefsDays", "filter.xet.process")


def env_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Show gitxet's view of this machine and repository: version, cache and state
    directories, the GITXET_* variables set, the repository's store, threshold, config keys
    and remotes (and where each server's token comes from; never a token)."""
    from gitxet.errors import GitxetError

    env = _environment()
    try:
        repo_info: dict[str, Any] | None = _repository(_open_repo())
        reason = None
    except GitxetError as e:
        from gitxet.cli._errors import describe

        repo_info, reason = None, describe(e)[0]
    if as_json:
        _json.emit("env", env | {"repository": repo_info})
        return
    typer.echo(f"git-xet {env['version']}")
    typer.echo(f"chunker: {env['chunker']}")
    typer.echo(f"python: {env['python']}")
    typer.echo(f"terminal progress: {'yes' if env['terminal_progress'] else 'no'}")
    typer.echo(f"cache: {env['cache_dir']} (cap {env['cache_size']:,} bytes)")
    typer.echo(f"state: {env['state_dir']}")
    for name, value in env["variables"].items():
        typer.echo(f"{name}={value if value is not None else ''}")
    if repo_info is None:
        typer.echo(f"repository: none ({reason})")
        return
    r = repo_info
    typer.echo(f"repository: {r['path']}")
    typer.echo(f"local store: {r['store']}")
    typer.echo(f"threshold: {r['threshold']:,} bytes ({r['threshold_source']})")
    typer.echo(f"lazy checkout: {r['lazy']}")
    for key, value in r["config"].items():
        typer.echo(f"{key}={value if value is not None else ''}")
    for rem in r["remotes"]:
        token = f", token: {rem['token']}" if rem["token"] else ""
        typer.echo(f"remote: {rem['name']} {rem['url']} (CAS: {rem['cas'] or 'none'}{token})")
    typer.echo(f"store: {r['xorbs']} xorbs ({r['xorb_bytes']:,} bytes), {r['shards']} shards")
