"""Git workflow commands: install, init, track, add, push, clone, checkout, status, ..."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from typing import Annotated, Literal

import typer

from gitxet.cli import _json, hot, tracking
from gitxet.cli._progress import byte_progress
from gitxet.cli.completion import pointer_paths
from gitxet.util.shown import shown

ScopeOpt = Literal["local", "global", "system"]


def register(app: typer.Typer) -> None:
    app.command("install")(install_cmd)
    app.command("uninstall")(uninstall_cmd)
    app.command("init")(tracking.init_cmd)
    app.command("track")(tracking.track_cmd)
    app.command("untrack")(tracking.untrack_cmd)
    app.command("add")(add_cmd)
    app.command("fsck")(fsck_cmd)
    app.command("clone")(clone_cmd)
    app.command("checkout")(checkout_cmd)
    app.command("materialize", hidden=True, help="Same as 'git xet checkout'.")(checkout_cmd)
    app.command("dematerialize")(dematerialize_cmd)
    app.command("filter-process", hidden=True)(filter_process_cmd)
    app.command("clean", hidden=True)(clean_cmd)
    app.command("smudge", hidden=True)(smudge_cmd)
    app.command("pre-push", hidden=True)(pre_push_cmd)
    app.command("credential", hidden=True)(credential_cmd)
    app.command("pre-receive", hidden=True)(pre_receive_cmd)


def _program() -> str:
    return hot.program()


def _open_repo(path: str = ".", **kw: object):  # type: ignore[no-untyped-def]
    return hot.open_repo(path, **kw)


def _say(msg: str) -> None:
    typer.echo(msg, err=True)


# ---- install / init / track ------------------------------------------------------------------


def _repo_root_or_none() -> str | None:
    """The work tree we are in, or None outside a repository (fine for global installs)."""
    from gitxet.errors import GitError
    from gitxet.git import process

    try:
        return str(process.toplevel("."))
    except GitError:
        return None


def install_cmd(
    local: Annotated[bool, typer.Option("--local", help="Only this repository.")] = False,
    system: Annotated[
        bool, typer.Option("--system", help="For every user of this machine.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite foreign filter settings.")
    ] = False,
    skip_smudge: Annotated[
        bool,
        typer.Option(
            "--skip-smudge",
            help="Checkouts leave pointers (xet.lazy=true); 'git xet checkout' writes files.",
        ),
    ] = False,
) -> None:
    """Configure git's xet filter and credential helper (global by default) and, in a
    repository, its hooks.

    The credential helper lets plain git clone/fetch/push authenticate to gitxet servers
    with the token of 'git xet login' or GITXET_TOKEN; it answers nothing for other hosts.
    --skip-smudge sets xet.lazy=true in the same scope (GITXET_LAZY=1 does it for one
    command): git checkout, clone and pull then write pointers, not data; a plain install
    undoes it.
    """
    from gitxet.git import config

    scope: ScopeOpt = "local" if local else "system" if system else "global"
    repo = _repo_root_or_none()
    if scope == "local" and repo is None:
        raise typer.BadParameter("--local needs to run inside a git repository")
    program = _program()
    report = config.install(scope, repo, f"{program} filter-process", force=force)
    _say(
        f"git-xet: filter installed in the {scope} git config ({len(report.written)} keys written)"
    )
    # git's own clone/fetch/push then find the token of `git xet login` / GITXET_TOKEN
    from gitxet.git import process

    if skip_smudge:
        process.config_set(repo, "xet.lazy", "true", scope)
        _say(f"git-xet: xet.lazy=true in the {scope} git config: checkouts leave pointers")
    elif process.config_get(repo, "xet.lazy", scope) is not None:
        process.config_unset(repo, "xet.lazy", scope)  # a plain install smudges again
    if config.install_credential_helper(scope, repo, f"!{program} credential"):
        _say(f"git-xet: credential helper added to the {scope} git config")
    if repo is not None:
        _install_pre_push(repo, program)


def _install_pre_push(repo: str, program: str) -> None:
    """Install (or repair) the pre-push hook; a user hook is chained, never overwritten."""
    from gitxet.git import hooks, process

    (change,) = hooks.install_hooks(repo, names=("pre-push",), program=program, on_conflict="chain")
    marker = process.git_dir(repo) / "xet" / "hook-warning"
    marker.unlink(missing_ok=True)  # the filter warns again if the hook goes missing
    what = {"chained": "installed (your hook runs first)", "unchanged": "already installed"}
    _say(f"git-xet: pre-push hook {what.get(change.action, change.action)}: {change.path}")


def uninstall_cmd(
    local: Annotated[
        bool, typer.Option("--local", help="From this repository's config (install --local).")
    ] = False,
    system: Annotated[
        bool, typer.Option("--system", help="From the system config (install --system).")
    ] = False,
) -> None:
    """Remove exactly what install wrote."""
    from gitxet.git import config, hooks

    scope: ScopeOpt = "local" if local else "system" if system else "global"
    repo = _repo_root_or_none()
    from gitxet.git import process

    report = config.uninstall(scope, repo)
    lazy = process.config_get(repo, "xet.lazy", scope) is not None
    if lazy:
        process.config_unset(repo, "xet.lazy", scope)
    removed = len(report.removed) + lazy
    _say(f"git-xet: removed {removed} keys from the {scope} git config")
    if repo is not None:
        hooks.uninstall_hooks(repo)


# ---- filter plumbing --------------------------------------------------------------------------


def filter_process_cmd() -> None:
    """git's long-running filter process (configured by install)."""
    hot.filter_process()


def clean_cmd(path: Annotated[str, typer.Argument()] = "") -> None:
    """One-shot clean filter (stdin -> stdout)."""
    hot.clean(path)


def smudge_cmd(path: Annotated[str, typer.Argument()] = "") -> None:
    """One-shot smudge filter (stdin -> stdout)."""
    hot.smudge(path)


def credential_cmd(
    action: Annotated[str, typer.Argument(help="get, store or erase (git passes it).")],
) -> None:
    """git's credential helper (registered by install): tokens for gitxet servers."""
    from gitxet.cli.credential import run

    raise typer.Exit(run(action))


def pre_push_cmd(
    remote: Annotated[str, typer.Argument(help="Remote name (from git).")],
    url: Annotated[str, typer.Argument(help="Remote URL (from git).")] = "",
) -> None:
    """pre-push hook: upload the data of the pushed commits before git updates refs."""
    hot.pre_push(remote, url)


def pre_receive_cmd() -> None:
    """pre-receive hook (bare repositories): refuse pushes of pointers to missing data."""
    code = hot.pre_receive()
    if code:
        raise typer.Exit(code)


def _remotes(cwd: str) -> list[str]:
    from gitxet.git import process

    return process.list_remotes(cwd)


# ---- porcelain ---------------------------------------------------------------------------------


def _git(
    args: list[str],
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    *,
    stdout_to_stderr: bool = False,
) -> None:
    """Run a git command the user asked for through us; git prints its own messages.

    git's failures (128 for "fatal") exit 1, as documented; a git killed by a signal
    exits 128 + the signal, like a shell would say.
    """
    code = hot.run_git(args, cwd, env, stdout_to_stderr=stdout_to_stderr)
    if code:
        raise typer.Exit(code)


def _configure_filter_here(root: str) -> None:
    """Configure git's xet filter in the repository at ``root`` (its local config, as
    ``git xet clone`` does) when no scope configures it, saying so: without it git sees
    every materialized file as modified, and a ``git commit -a`` stores it whole in git."""
    from gitxet.git import config, process

    if process.config_get(root, "filter.xet.process"):
        return
    config.install("local", root, f"{_program()} filter-process")
    _say(
        "git-xet: configured git's xet filter in this repository ('git xet install' does it "
        "for every repository)"
    )


def add_cmd(
    paths: Annotated[list[str], typer.Argument(help="Files or directories to add.")],
    as_json: Annotated[bool, typer.Option("--json", help="A JSON summary on stdout.")] = False,
) -> None:
    """git add through the filter, then a one-line dedup summary."""
    from gitxet.cli._env import check_environment
    from gitxet.git import process, xetconfig
    from gitxet.repo.repository import lazy_config

    check_environment()
    root = str(process.toplevel("."))
    lazy_config(root)  # malformed: one line now, not the filter's and then git's
    if not process.config_get(root, "filter.xet.process"):
        raise typer.BadParameter("the xet filter is not configured here: run 'git xet init' first")
    gone = [p for p in paths if not os.path.lexists(p) and not any(c in p for c in "*?[")]
    if gone:
        rel = [os.path.relpath(os.path.abspath(p), root) for p in gone]
        absent = [p for p, r in zip(gone, rel, strict=True) if not process.index_matches(root, [r])]
        if absent:
            from gitxet.errors import NotFoundError

            raise NotFoundError(f"no such file: {', '.join(absent[:3])}")
    shadowed = xetconfig.shadowed_warning(
        xetconfig.THRESHOLD_KEY,
        xetconfig.read_setting(root, root, xetconfig.THRESHOLD_KEY),
    )
    if shadowed:
        typer.echo(f"git-xet: warning: {shadowed}", err=True)
    fd, stats = tempfile.mkstemp(prefix="gitxet-add-", suffix=".jsonl")
    os.close(fd)
    try:
        total = _size_of(paths)
        env = dict(os.environ, GITXET_STATS_FILE=stats)
        with byte_progress("adding", total or None) as advance:
            proc = subprocess.Popen(["git", "add", "--", *paths], env=env)
            seen = 0
            while proc.poll() is None:
                time.sleep(0.1)
                seen = _advance_from(stats, seen, advance)
            _advance_from(stats, seen, advance)
        if proc.returncode < 0:  # killed: 128 + the signal, as a shell says
            raise typer.Exit(128 - proc.returncode)
        if proc.returncode != 0:  # git said why; its failures exit 1, as documented
            lock = process.git_dir(root) / "index.lock"
            if lock.exists():  # git's words do not say that a killed add leaves it
                _say(
                    f"git-xet: {shown(str(lock))} is in the way: another git command is "
                    "running here, or one was killed (a killed 'git xet add' leaves it); "
                    "if none is running, remove that file and add again"
                )
            raise typer.Exit(1)
        files = new = reused = 0
        with open(stats, encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                files += 1
                new += rec["new"]
                reused += rec["reused"]
        if as_json:
            _json.emit("add", {"files": files, "new_bytes": new, "reused_bytes": reused})
        elif files:
            pct = 100.0 * reused / (new + reused) if new + reused else 0.0
            typer.echo(
                f"{files} file(s) stored as Xet pointers: {new:,} new bytes, "
                f"{reused:,} reused bytes ({pct:.1f}% deduplicated)"
            )
        else:
            typer.echo("no large files changed (small files are stored as plain git blobs)")
    finally:
        os.unlink(stats)


def _size_of(paths: list[str]) -> int:
    total = 0
    for p in paths:
        if os.path.isdir(p):
            for dirpath, dirnames, filenames in os.walk(p):
                dirnames[:] = [d for d in dirnames if d != ".git"]
                for f in filenames:
                    try:
                        total += os.lstat(os.path.join(dirpath, f)).st_size
                    except OSError:
                        pass
        elif os.path.exists(p):
            total += os.path.getsize(p)
    return total


def _advance_from(stats: str, seen: int, advance) -> int:  # type: ignore[no-untyped-def]
    try:
        with open(stats, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError:
        return seen
    for line in lines[seen:]:
        try:
            advance(json.loads(line)["size"])
        except (ValueError, KeyError):
            return seen
    return len(lines)


def fsck_cmd(
    all_refs: Annotated[
        bool, typer.Option("--all", help="Every pointer in the history of all branches and tags.")
    ] = False,
    remote: Annotated[
        str | None, typer.Option("--remote", help="Remote to ask (default: origin).")
    ] = None,
) -> None:
    """Verify the local store, and say where the data of HEAD's pointer files is.

    Every xorb in the local store is re-hashed and every shard checked. Each pointer file of
    HEAD (with --all: of the whole history of every branch and tag) is then found in the
    local store or, failing that, on the remote, and the data the store holds is checked
    against the pointer's oid (SHA-256). Exits 3 when the store or a pointer is damaged, 4
    when some file's data is nowhere to be had, 1 (5: a refused token) when it is not here
    and the remote could not be asked.
    """
    from gitxet.cli._errors import describe
    from gitxet.cli._progress import human_size
    from gitxet.data.audit import verify_pointers, verify_store
    from gitxet.errors import ConfigError, GitxetError, RemoteError
    from gitxet.git import process
    from gitxet.server.githttp import served_root

    server = served_root(str(process.git_dir(".")))
    if server is not None:  # nothing of its data is in there: say so, create no store
        raise ConfigError(
            f"this is a repository of 'git xet serve --root {shown(server)}': its file data "
            "is in the server's store, not here; run 'git xet fsck' in a clone of it"
        )
    repo = _open_repo()
    total = repo.cas.stats().xorb_bytes
    with byte_progress("verifying", total or None) as advance:
        report = verify_store(repo.cas, advance)
    for p in report.problems:
        typer.echo(f"damaged  {p.kind} {p.name}: {p.reason}")
    typer.echo(
        f"local store: {report.xorbs} xorb(s) ({human_size(total)}), {report.shards} shard(s), "
        f"{len(report.problems)} damaged"
    )
    if all_refs:
        found, scope = repo.history_pointers(repo.ref_tips(all_refs=True)), "all branches and tags"
    else:
        born = process.head_commit(repo.cwd) is not None  # before the first commit: nothing to find
        found = [(f.path, f.pointer) for f in repo.pointer_files("HEAD")] if born else []
        scope = "HEAD"
    name = remote or repo.default_remote()
    unasked: GitxetError | None = None  # why the remote could not be asked
    try:
        where = repo.locate(found, name, ask_remote=name is not None)
        asked = name
    except (ConfigError, RemoteError) as exc:
        typer.echo(f"remote not asked: {exc}")
        where, asked, unasked = repo.locate(found, None, ask_remote=False), None, exc
    sizes = {ptr.xet_hash: ptr.size for _, ptr in found}
    with byte_progress("checking pointers", sum(sizes.values()) or None) as advance:
        liars = verify_pointers(repo.cas, found, advance)
    for m in liars:
        if m.pointer.sha256 != m.actual:
            lie = (
                f"oid sha256:{m.pointer.sha256[:16]}... is not the SHA-256 of its data "
                f"({m.actual[:16]}...)"
            )
        else:
            lie = f"size {m.pointer.size:,} is not the size of its data ({m.actual_size:,})"
        typer.echo(f"damaged  pointer {shown(m.path)}: {lie}; the pointer was altered")
    local = sum(d.local for d in where)
    remote_only = [d for d in where if not d.local and d.remote]
    missing = [d for d in where if not d.local and not d.remote]
    for d in missing:
        elsewhere = (
            f"not on {asked}"
            if asked
            else f"{name} not asked"
            if unasked is not None and name
            else "no remote asked"
        )
        typer.echo(
            f"missing  {shown(d.path)}: not in the local store, {elsewhere} "
            f"(xet {d.pointer.xet_hash[:16]}, {d.pointer.size:,} bytes)"
        )
    gone = f"{len(missing)} missing"
    if isinstance(unasked, RemoteError):
        gone = f"{len(missing)} not here ({name} not asked)"
    typer.echo(
        f"pointer files in {scope}: {len(where)}: {local} in the local store, "
        f"{len(remote_only)} only on {asked or 'the remote'}, {gone}"
    )
    if report.problems or liars:
        what = []
        if report.problems:
            what.append(f"{len(report.problems)} damaged object(s) in the local store")
        if liars:
            what.append(f"{len(liars)} pointer file(s) that do not match their data")
        _say(f"git-xet: integrity error: {'; '.join(what)}")
        raise typer.Exit(3)
    if missing and isinstance(unasked, RemoteError):
        # the data may well be there: not "nowhere", and the exit says why it was not asked
        _say(
            f"git-xet: the data of {len(missing)} file(s) is not here and {name} could not be "
            f"asked: {describe(unasked)[0]}"
        )
        raise typer.Exit(describe(unasked)[1])
    if missing:
        _say(f"git-xet: not found: the data of {len(missing)} file(s) is nowhere to be had")
        raise typer.Exit(4)


def clone_cmd(
    src: Annotated[str, typer.Argument(help="Repository to clone.")],
    directory: Annotated[str | None, typer.Argument(help="Target directory.")] = None,
    lazy: Annotated[
        bool, typer.Option("--lazy", help="Leave pointers; fetch data on checkout.")
    ] = False,
    branch: Annotated[str | None, typer.Option("--branch", "-b", help="Branch or tag.")] = None,
    cas_url: Annotated[
        str | None,
        typer.Option(
            "--cas-url",
            help="Read file data through this cache tier (git xet serve --upstream); git "
            "still clones from SRC (GITXET_CAS_URL).",
        ),
    ] = None,
    depth: Annotated[
        int | None,
        typer.Option("--depth", min=1, help="Only the last DEPTH commits (git clone --depth)."),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Only errors (git's and gitxet's).")
    ] = False,
) -> None:
    """Clone a repository and materialize its large files (or leave pointers with --lazy).

    A clone stopped before its last file was written (killed, out of space) is finished by
    the same command run again (or 'git xet checkout' in it); until then 'git status'
    lists the files not written yet as deleted.
    """
    from gitxet.cli.clone import run

    code = run(src, directory, lazy=lazy, branch=branch, cas_url=cas_url, depth=depth, quiet=quiet)
    if code:
        raise typer.Exit(code)


def _repo_paths(repo, paths: list[str] | None) -> list[str]:  # type: ignore[no-untyped-def]
    """Paths (or pathspecs) as the user typed them, relative to the current directory,
    made relative to the work tree's top (where gitxet runs git)."""
    if not paths or repo.worktree is None:
        return list(paths or ())
    top = str(repo.worktree)
    out = []
    for p in paths:
        rel = os.path.relpath(os.path.abspath(p), top)
        out.append("." if rel == os.curdir else rel)
    return out


def _select(  # type: ignore[no-untyped-def]
    repo,
    paths: list[str] | None,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
):  # type: ignore[no-untyped-def]
    """The pointer files git's index names under ``paths`` (all: none given), filtered by
    ``include``/``exclude`` patterns. A path that names no file of the index is an error."""
    import fnmatch

    from gitxet.errors import NotFoundError

    wanted = _repo_paths(repo, paths)
    if wanted:
        unmatched = repo.unmatched_paths(wanted)
        if unmatched:
            shown = ", ".join(unmatched[:3]) + (", ..." if len(unmatched) > 3 else "")
            raise NotFoundError(f"no file in the index matches {shown}")
    files = repo.pointer_files(None, wanted)  # the index: only what git checked out
    if include:
        files = [f for f in files if any(fnmatch.fnmatch(f.path, p) for p in include)]
    if exclude:
        files = [f for f in files if not any(fnmatch.fnmatch(f.path, p) for p in exclude)]
    return files


def checkout_cmd(
    paths: Annotated[
        list[str] | None,
        typer.Argument(help="Files or directories (default: all).", autocompletion=pointer_paths),
    ] = None,
) -> None:
    """Materialize pointer files in the work tree (fetching their data from whichever
    remote has it: those holding HEAD first, then every other remote).

    Only files git's index names are written, never through a symlink; a path git would
    refuse (such as one inside a '.git' directory) fails with its name, and the other files
    are still written. A file holding changes of the user's own (neither its pointer nor
    its data) is never written over: it is named, and kept. In a plain 'git clone' made
    without 'git xet install', it also
    configures git's xet filter in the repository (else git would call the files modified).
    After a killed 'git xet clone', run it (or the clone) again in the clone: it writes the
    files not written yet (until then 'git status' lists them as deleted). After a killed
    checkout, run it again: it writes the files still pointers and tells git's index about
    those already written (until then 'git status' lists them as modified, with no diff).
    """
    from gitxet.cli import clone

    repo = _open_repo()
    if not paths and repo.worktree is not None and clone.unfinished(str(repo.worktree)):
        from gitxet.settings import Settings

        _say(f"git-xet: finishing the interrupted clone in {shown(str(repo.worktree))}")
        code = clone.finish(str(repo.worktree), Settings.load(), None, resuming=True)
        if code:
            raise typer.Exit(code)
        return
    files = _select(repo, paths)  # materialize() skips (and settles) the materialized ones
    total = sum(f.pointer.size for f in files if not f.materialized)
    with byte_progress("materializing", total) as advance:
        n = repo.materialize(files, progress=advance)
    _say(f"git-xet: materialized {n} file(s), {total:,} bytes")
    if repo.worktree is not None:
        _configure_filter_here(str(repo.worktree))


def dematerialize_cmd(
    paths: Annotated[
        list[str] | None,
        typer.Argument(help="Files or directories (default: all).", autocompletion=pointer_paths),
    ] = None,
) -> None:
    """Turn materialized files back into pointers (data stays in the local store)."""
    repo = _open_repo()
    n = repo.dematerialize(_select(repo, paths))
    _say(f"git-xet: {n} file(s) are pointers again")
