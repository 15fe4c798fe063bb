"""Moving data between repositories: ``fetch``, ``pull``, ``push`` (git-lfs's verbs)."""

from __future__ import annotations

import fnmatch
from typing import Annotated, Any

import typer

from gitxet.cli import _json
from gitxet.cli._progress import byte_progress, human_size
from gitxet.cli.completion import pointer_paths
from gitxet.util.shown import shown

IncludeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "-I",
        "--include",
        help="Only paths matching (glob; repeatable).",
        autocompletion=pointer_paths,
    ),
]
ExcludeOpt = Annotated[
    list[str] | None, typer.Option("-X", "--exclude", help="Skip paths matching (repeatable).")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Only errors.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="A JSON summary on stdout.")]


def register(app: typer.Typer) -> None:
    app.command("fetch")(fetch_cmd)
    app.command("pull")(pull_cmd)
    app.command("push")(push_cmd)


def _open_repo():  # type: ignore[no-untyped-def]
    from gitxet.cli.hot import open_repo

    return open_repo()


def _say(msg: str, quiet: bool = False) -> None:
    if not quiet:
        typer.echo(msg, err=True)


def _matching(
    found: list[tuple[str, Any]], include: list[str] | None, exclude: list[str] | None
) -> list[tuple[str, Any]]:
    """(path, pointer) pairs whose path matches an ``include`` pattern (all when none) and
    no ``exclude`` pattern (git-lfs's -I/-X: a glob, or a directory prefix)."""

    def hit(path: str, pattern: str) -> bool:
        pat = pattern.rstrip("/")
        return fnmatch.fnmatch(path, pattern) or path == pat or path.startswith(pat + "/")

    return [
        (p, ptr)
        for p, ptr in found
        if (not include or any(hit(p, i) for i in include))
        and not any(hit(p, x) for x in exclude or ())
    ]


# ---- fetch -------------------------------------------------------------------------------


def fetch_cmd(
    remote: Annotated[
        str | None, typer.Argument(help="Remote to ask first (then every other remote).")
    ] = None,
    refs: Annotated[
        list[str] | None,
        typer.Argument(help="Branches, tags or commits whose files to fetch (default: HEAD)."),
    ] = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    all_refs: Annotated[
        bool, typer.Option("--all", help="Every file of the history of every branch and tag.")
    ] = False,
    recent: Annotated[
        bool,
        typer.Option(
            "--recent",
            help="Also the files of branches committed to recently (xet.recentRefsDays).",
        ),
    ] = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Download file data into the local store (or the shared cache, for a server); no
    checkout: 'git xet checkout' then writes the files.

    Without REFS: the files of the index (what is checked out). With REFS: the files of
    each ref's tree. --all: every version of every file in the history of all branches and
    tags. --recent adds the branches committed to in the last xet.recentRefsDays days (7).
    Data this repository lacks is asked of REMOTE first, then of the remotes holding the
    commit, then of every other remote; if none has a file, the error names what each one
    answered.
    """
    from gitxet.cli.prune import _recent_days
    from gitxet.git import process
    from gitxet.hashing import from_hex

    repo = _open_repo()
    if remote is not None:
        repo.remotes.require(remote)
    revs = [process.rev_parse(repo.cwd, r) for r in refs or ()]
    found: list[tuple[str, Any]] = []
    if all_refs:  # every branch and tag, remote-tracking ones too
        out = process.run_git(
            ["for-each-ref", "--format=%(objectname)", "refs/heads", "refs/tags", "refs/remotes"],
            repo.cwd,
        )
        found += repo.history_pointers(list(dict.fromkeys(out.decode().split())))
    elif revs:
        for rev in revs:
            found += [(f.path, f.pointer) for f in repo.pointer_files(rev)]
    else:
        found += [(f.path, f.pointer) for f in repo.pointer_files(None)]
    if recent:
        for rev in repo.recent_refs(_recent_days(repo, None)):
            found += [(f.path, f.pointer) for f in repo.pointer_files(rev)]
    found = _matching(found, include, exclude)
    pointers = list({ptr.xet_hash: ptr for _, ptr in found}.values())
    absent = [p for p in pointers if p.size and repo.cas.file_info(from_hex(p.xet_hash)) is None]
    total = sum(p.size for p in pointers)
    commit = revs[0] if revs else (repo.ref_tips(False) or [None])[0]
    with byte_progress("fetching", sum(p.size for p in absent) or None) as bar:
        summary = repo.ensure_local(pointers, remote, progress=bar, commit=commit, warm=True)
    fetched = summary.files if summary else 0
    xorbs = summary.xorbs_sent if summary else 0
    moved = summary.bytes_sent if summary else 0
    if as_json:
        _json.emit(
            "fetch",
            {
                "files": len(pointers),
                "bytes": total,
                "already_local": len(pointers) - len(absent),
                "fetched_files": fetched,
                "xorbs_fetched": xorbs,
                "bytes_fetched": moved,
            },
        )
        return
    _say(
        f"git-xet: {len(pointers)} file(s), {human_size(total)}: {len(pointers) - len(absent)} "
        f"already here, {fetched} fetched ({xorbs} xorb(s), {human_size(moved)})",
        quiet,
    )


# ---- pull --------------------------------------------------------------------------------


def pull_cmd(
    remote: Annotated[
        str | None, typer.Argument(help="Remote to pull from (and to ask for data first).")
    ] = None,
    branch: Annotated[str | None, typer.Argument(help="Its branch (default: upstream).")] = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    rebase: Annotated[bool, typer.Option("--rebase", "-r", help="git pull --rebase.")] = False,
    ff_only: Annotated[bool, typer.Option("--ff-only", help="git pull --ff-only.")] = False,
    quiet: QuietOpt = False,
) -> None:
    """git pull, with the data of the new commits fetched in parallel first.

    With -I/-X only the matching files are fetched and written (in a lazy clone too); the
    others are left as pointers ('git xet checkout PATH' writes them later), as git lfs
    pull does.
    """
    from gitxet.errors import GitError
    from gitxet.git import process

    repo = _open_repo()
    name = remote or repo.default_remote() or "origin"
    repo.remotes.require(name)
    flags = (["--rebase"] if rebase else []) + (["--ff-only"] if ff_only else [])
    flags += ["-q"] if quiet else []
    _git(["fetch", *(["-q"] if quiet else []), name] + ([branch] if branch else []), repo.cwd)
    upstream = f"{name}/{branch}" if branch else "@{upstream}"
    filtered = bool(include or exclude)
    try:
        rev = process.rev_parse(repo.cwd, upstream)
        found = [(f.path, f.pointer) for f in repo.pointer_files(rev)]
        ptrs = [ptr for _, ptr in _matching(found, include, exclude)]
        if filtered or not repo.lazy:  # -I/-X name files to write, in a lazy clone too
            with byte_progress("fetching", sum(p.size for p in ptrs) or None) as bar:
                repo.ensure_local(ptrs, name, commit=rev, progress=bar)
    except GitError:
        pass  # no upstream: git pull says so
    lazy = ["-c", "xet.lazy=true"] if filtered else []
    _git([*lazy, "pull", *flags, name] + ([branch] if branch else []), repo.cwd)
    if filtered:
        from gitxet.cli.gitcmds import _select

        files = _select(repo, None, include, exclude)
        n = repo.materialize(files)
        _say(f"git-xet: materialized {n} file(s) matching -I/-X; the others are pointers", quiet)


def _git(
    args: list[str], cwd: str, env: dict[str, str] | None = None, *, json_out: bool = False
) -> None:
    from gitxet.cli.gitcmds import _git as run

    run(args, cwd=cwd, env=env, stdout_to_stderr=json_out)


# ---- push --------------------------------------------------------------------------------


class _Missing:
    """A file whose data is neither here nor on the remote (as audit's DataLocation)."""

    def __init__(self, path: str) -> None:
        self.path = path


def push_cmd(
    remote: Annotated[str | None, typer.Argument(help="Remote (default: origin).")] = None,
    refspecs: Annotated[
        list[str] | None, typer.Argument(help="What to push (default: current branch).")
    ] = None,
    all_refs: Annotated[
        bool,
        typer.Option("--all", help="Also the data of every local branch and tag."),
    ] = False,
    set_upstream: Annotated[
        bool, typer.Option("--set-upstream", "-u", help="git push --set-upstream.")
    ] = False,
    force: Annotated[bool, typer.Option("--force", "-f", help="git push --force.")] = False,
    tags: Annotated[
        bool, typer.Option("--tags", help="git push --tags (and the data of every tag).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", "-n", help="Check and say what would move; move nothing.")
    ] = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Upload every file's data the remote lacks in the history being pushed, then git push.

    Unlike the pre-push hook, which sends only what the pushed commits add, this checks the
    whole history of the refs against the remote's CAS: it repairs commits that reached the
    remote without their data (pushed from a clone that had no hook). Data that is neither
    in the local store nor on the remote is named, and nothing is pushed then. -u, --force,
    --tags, --dry-run and -q are passed to git push.
    """
    from gitxet.git import process

    repo = _open_repo()
    name = remote or repo.default_remote()
    if name is None:
        raise typer.BadParameter("no remote to push to (add one: git remote add origin URL)")
    repo.remotes.require(name)
    revs = repo.ref_tips(all_refs=True) if all_refs else []
    if tags:
        out = process.run_git(["for-each-ref", "--format=%(objectname)", "refs/tags"], repo.cwd)
        revs += out.decode().split()
    for s in refspecs or ([] if all_refs else ["HEAD"]):
        src = s.split(":", 1)[0].lstrip("+") or "HEAD"
        revs.append(process.rev_parse(repo.cwd, src))
    if dry_run:
        from gitxet.data.audit import is_local, local_files, missing_files, xorbs_of
        from gitxet.hashing import from_hex

        found = repo.history_pointers(revs)
        target = repo.remote(name)
        absent = missing_files(target, [from_hex(p.xet_hash) for _, p in found])
        lacking = [(path, p) for path, p in found if from_hex(p.xet_hash) in absent]
        ours = local_files(repo.cas, [from_hex(p.xet_hash) for _, p in lacking])
        has = xorbs_of(target)  # (a file here may reuse the remote's chunks)
        here = {
            p.xet_hash
            for _, p in lacking
            if from_hex(p.xet_hash) in ours or is_local(repo.cas, from_hex(p.xet_hash), has)
        }
        to_send = [path for path, p in lacking if p.xet_hash in here]
        missing = [_Missing(path) for path, p in lacking if p.xet_hash not in here]
        _say(f"git-xet: would upload the data of {len(to_send)} file(s) to {name}", quiet)
        summary = None
    else:
        with byte_progress("uploading", None) as bar:
            summary, missing = repo.repair_push(name, revs, progress=bar)
    if as_json:
        _json.emit(
            "push",
            {
                "remote": name,
                "dry_run": dry_run,
                "files": summary.files if summary else len(to_send),
                "xorbs_uploaded": summary.xorbs_sent if summary else 0,
                "shards_uploaded": summary.shards_sent if summary else 0,
                "bytes_uploaded": summary.bytes_sent if summary else 0,
                "xorbs_already_there": summary.xorbs_skipped if summary else 0,
                "missing": [d.path for d in missing],
            },
        )
    elif summary is not None:
        _say(
            f"git-xet: data of {summary.files} file(s) checked against {name}: "
            f"{summary.xorbs_sent} xorb(s) and {summary.shards_sent} shard(s) uploaded "
            f"({human_size(summary.bytes_sent)}), {summary.xorbs_skipped} xorb(s) already there",
            quiet,
        )
    for d in missing:
        _say(f"git-xet: {shown(d.path)}: data neither in the local store nor on {name}")
    if missing:
        _say("git-xet: nothing pushed: add those files again, or fetch their data first")
        raise typer.Exit(4)
    flags = ["--set-upstream"] if set_upstream else []
    flags += (["--force"] if force else []) + (["--tags"] if tags else [])
    flags += (["--dry-run"] if dry_run else []) + (["-q"] if quiet else [])
    targets = list(refspecs or ())
    branch = process.current_branch(repo.cwd)
    upstream = branch and process.config_get(repo.cwd, f"branch.{branch}.merge")
    if not targets and not all_refs and branch and not upstream:
        targets = ["HEAD"]  # no upstream yet: the branch, to the same name (git lfs push)
    env = {"GITXET_SKIP_PREPUSH": "1"}
    _git(["push", *flags, name, *targets], repo.cwd, env, json_out=as_json)
