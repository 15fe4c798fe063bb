"""The commands git runs on every add, checkout and push, without typer or rich.

git starts ``git-xet filter-process`` for each command that touches tracked files and
``git-xet pre-push`` for each push; their start-up time is paid every time. These paths
import only what they use (no typer, no rich unless a progress bar is drawn), which
roughly halves the time to the first byte. ``gitxet.cli.entry`` dispatches here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
from typing import Any

from gitxet.cli._errors import describe
from gitxet.cli._interrupt import exit_now, handle_signals, received
from gitxet.util.shown import shown


def program() -> str:
    """How git should call us back: ``git-xet`` if that is on PATH, else this interpreter."""
    import shutil

    return "git-xet" if shutil.which("git-xet") else f"{sys.executable} -m gitxet"


def run_git(
    args: list[str],
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    *,
    stdout_to_stderr: bool = False,
) -> int:
    """Run a git command the user asked for through us (git prints its own messages);
    returns the exit status to give: git's failures (128 for "fatal") are 1, as
    documented; a git killed by a signal is 128 + the signal, like a shell would say."""
    import subprocess

    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    out = sys.stderr if stdout_to_stderr else None  # keeps stdout for our JSON
    r = subprocess.run(["git", *args], cwd=cwd, env=full_env, check=False, stdout=out)
    if r.returncode < 0:
        return 128 - r.returncode
    return 1 if r.returncode else 0


def ensure_hooks(repo: Any) -> None:
    """Give a repository the filter runs in gitxet's pre-push hook if it lacks one.

    git-lfs does the same from its filter: whatever made the repository (plain ``git
    clone``, a CI checkout), the filter ran in it before any push of its pointers can
    happen. A hook that cannot be installed (a user hook already chaining another, a shared
    ``core.hooksPath``) is reported once per repository, never overwritten.
    """
    from gitxet.errors import GitxetError
    from gitxet.git.hooks import ensure_hook

    if repo.worktree is None:
        return
    try:
        change = ensure_hook(repo.cwd, "pre-push", program())
    except GitxetError as exc:
        reason = describe(exc)[0]
    else:
        if change.action != "foreign":
            return
        reason = f"{change.path} is not gitxet's hook"
    marker = repo.git_dir / "xet" / "hook-warning"
    if marker.exists():
        return
    try:
        marker.write_text(reason + "\n", encoding="utf-8")
    except OSError:
        pass
    print(
        f"git-xet: warning: pre-push hook not installed ({reason}); a push will not upload "
        "file data: run 'git xet install' here, or call 'git xet pre-push' from your hook",
        file=sys.stderr,
        flush=True,
    )


def open_repo(path: str = ".", **kw: Any) -> Any:
    """The repository at ``path``, configured from the environment (the CLI's job)."""
    from gitxet.dataset import HttpAccess
    from gitxet.repo.repository import XetRepo
    from gitxet.settings import Settings, lazy_default

    if "remote_factory" not in kw:
        kw["remote_factory"] = HttpAccess.from_settings(Settings.load()).remote_factory
    return XetRepo(path, lazy=lazy_default(), stats_path=os.environ.get("GITXET_STATS_FILE"), **kw)


def filter_process() -> None:
    """git's long-running filter process (configured by install)."""
    from gitxet.git.filter_protocol import serve, wide_pipes

    repo = open_repo()
    ensure_hooks(repo)

    def on_error(command: str, path: str, exc: BaseException) -> None:
        from gitxet.cli._errlog import record

        msg, _ = describe(exc)
        print(f"git-xet: {command} {shown(path)}: {msg}", file=sys.stderr, flush=True)
        record(f"{command} {shown(path)}", msg, exc)  # git xet logs

    # one ingest session for the whole conversation: small files share xorbs, and the
    # store is written per batch (each staged file journaled first), not per file
    sys.stdout.flush()
    inp, out = wide_pipes(sys.stdin.fileno(), sys.stdout.fileno())
    try:
        with repo.staging():
            serve(repo, inp, out, on_error=on_error)
    finally:
        with contextlib.suppress(OSError):
            out.flush()


def clean(path: str = "") -> None:
    """One-shot clean filter (stdin -> stdout)."""
    repo = open_repo()
    ensure_hooks(repo)
    repo.clean(path, sys.stdin.buffer, sys.stdout.buffer)


def smudge(path: str = "") -> None:
    """One-shot smudge filter (stdin -> stdout); spooled so git never gets half a file."""
    repo = open_repo()
    ensure_hooks(repo)
    with tempfile.SpooledTemporaryFile(64 << 20) as buf:
        repo.smudge(path, sys.stdin.buffer, buf)
        buf.seek(0)
        out = sys.stdout.buffer
        while chunk := buf.read(1 << 20):
            out.write(chunk)


def guard_embedded_remote(remote_url: str) -> None:
    """Give a path/``file://`` remote that is a git repository gitxet's pre-receive hook,
    so a later push of pointers without their data (a clone without the pre-push hook) is
    refused there. A gitxet hook already there is kept; a user hook is chained; anything
    in the way is left alone (the remote is not ours to force)."""
    from pathlib import Path

    from gitxet.dataset import cas_root
    from gitxet.errors import GitxetError
    from gitxet.git import hooks, process

    root = cas_root(remote_url)
    if root is None:
        return
    git_dir = os.path.dirname(root)
    if not os.path.isfile(os.path.join(git_dir, "HEAD")):
        return
    try:
        # --git-dir: a hook inherits GIT_DIR, which would name the pushing repository
        out = process.run_git(["--git-dir", git_dir, "rev-parse", "--git-path", "hooks"], git_dir)
        directory = Path(git_dir) / os.fsdecode(out.strip())  # an absolute path stays one
        if hooks.is_gitxet_hook(directory / hooks.RECEIVE_HOOK):
            return
        hooks.install_hooks(git_dir, (hooks.RECEIVE_HOOK,), program(), "chain", directory=directory)
    except GitxetError:
        pass


def pre_push(remote: str, url: str = "") -> None:
    """pre-push hook: upload the data of the pushed commits before git updates refs."""
    from gitxet.git.hooks import parse_pre_push_input

    if os.environ.get("GITXET_SKIP_PREPUSH") == "1":
        sys.stdin.buffer.read()
        return
    refs = parse_pre_push_input(sys.stdin.buffer.read())
    revs = [r.local_oid for r in refs if not r.is_delete]
    if not revs:
        return
    repo = open_repo()
    guard_embedded_remote(repo.remote_url(url or remote))
    # the remote's tips: those this clone lacks are skipped by the listing (no git per ref)
    exclude = [r.remote_oid for r in refs if not r.is_new]
    known_remote = remote if remote in repo.remotes.names() else None
    pointers = repo.pointers_to_push(revs, exclude, known_remote)
    if pointers:
        total = sum(p.size for p in pointers)
        from gitxet.cli._progress import byte_progress  # rich only on a terminal

        with byte_progress("uploading", None) as bar:
            summary = repo.push_data(url or remote, pointers, progress=bar)
        moved = (
            f"sent {summary.xorbs_sent} xorbs, {summary.xorbs_skipped} already on the remote"
            if summary.xorbs_sent or summary.shards_sent
            else "all already on the remote"  # (described there: no xorb was even looked at)
        )
        print(f"git-xet: {summary.files} files ({total:,} bytes): {moved}", file=sys.stderr)
    leave_receipts(repo.remote_url(url or remote), revs)


def leave_receipts(remote_url: str, commits: list[str]) -> None:
    """Tell a path remote's pre-receive hook (gitxet's) that the data of ``commits`` is in
    its store now, so it starts no checker for them (``hooks.RECEIPTS``). Best effort: a
    receipt that cannot be written only means the hook checks."""
    from gitxet.dataset import cas_root
    from gitxet.git.hooks import RECEIPTS

    root = cas_root(remote_url)
    if root is None:
        return
    git_dir = os.path.dirname(root)
    if not os.path.isfile(os.path.join(git_dir, "HEAD")):
        return
    directory = os.path.join(git_dir, RECEIPTS)
    with contextlib.suppress(OSError):
        os.makedirs(directory, exist_ok=True)
        for oid in commits:
            with open(os.path.join(directory, oid), "wb"):
                pass


def _receive_remote(git_dir: str) -> Any:
    """The store a push into ``git_dir`` must find its data in, or None if there is none:
    the server's CAS (``git xet serve`` says where), else the embedded ``<git dir>/xet``."""
    from gitxet.git.hooks import RECEIVE_CAS_ENV, RECEIVE_TOKEN_ENV

    url = os.environ.get(RECEIVE_CAS_ENV)
    if url:
        from gitxet.remote.client import CASClient

        return CASClient(url, os.environ.get(RECEIVE_TOKEN_ENV), timeout=60.0)
    store = os.path.join(git_dir, "xet")
    if os.path.isdir(os.path.join(store, "shards")):
        from gitxet.data.transfer import LocalDirRemote

        return LocalDirRemote(store)
    return None


def pre_receive() -> int:
    """pre-receive hook: refuse a push whose new commits hold pointers to data the
    repository's store lacks, naming the first such file; git then moves no ref."""
    from gitxet.data.audit import first_dangling
    from gitxet.git.hooks import parse_pre_receive_input
    from gitxet.repo.pointers import received_pointers

    refs = parse_pre_receive_input(sys.stdin.buffer.read())
    tips = [r.new_oid for r in refs if not r.is_delete]
    git_dir = os.path.abspath(os.environ.get("GIT_DIR") or ".")
    remote = _receive_remote(git_dir) if tips else None
    if remote is None:
        return 0
    found = received_pointers(git_dir, tips)
    bad = first_dangling(remote, found) if found else None
    if bad is None:
        return 0
    path, ptr = bad
    print(
        f"git-xet: push refused: {shown(path)} is a pointer to file data this repository's store "
        f"does not have (xet hash {ptr.xet_hash[:16]}..., {ptr.size:,} bytes). Upload the "
        "data first: 'git xet push' from a clone that has it, then push again.",
        file=sys.stderr,
    )
    return 1


def _usage(msg: str) -> int:
    print(f"git-xet: {msg}", file=sys.stderr)
    return 2


def run(argv: list[str]) -> int:
    """Run one hot command; ``argv`` starts with its name. Returns the exit status."""
    name, args = argv[0], argv[1:]
    handle_signals()
    if args[:1] == ["--"]:
        args = args[1:]
    try:
        if name == "filter-process":
            filter_process()
        elif name == "clean":
            clean(*args[:1])
        elif name == "smudge":
            smudge(*args[:1])
        elif name == "pre-push":
            if not args:
                return _usage("pre-push needs the remote name (git passes it)")
            pre_push(args[0], args[1] if len(args) > 1 else "")
        elif name == "clone":
            from gitxet.cli import clone

            opts = clone.parse_argv(args)
            if opts is None:
                return _usage(
                    "usage: git-xet clone [--lazy] [-q] [-b BRANCH] [--depth N] [--cas-url URL]"
                    " SRC [DIR]"
                )
            return clone.run(**opts)
        elif name == "credential":
            from gitxet.cli.credential import run as credential

            if len(args) != 1:
                return _usage("usage: git-xet credential get|store|erase (git runs it)")
            return credential(args[0])
        elif name == "pre-receive":
            return pre_receive()
        elif name == "mount-serve":
            from gitxet.cli._mountd import serve_main

            return serve_main(args)
        elif name in ("post-checkout", "post-merge"):
            pass  # the filter already wrote (or deliberately left) every file
        else:
            return _usage(f"not a hot command: {name}")
    except KeyboardInterrupt:
        exit_now(received() or signal.SIGINT)
    except BrokenPipeError:
        return 141
    except Exception as e:  # the CLI boundary: one line, never a traceback
        from gitxet.cli._errlog import record

        msg, code = describe(e)
        print(f"git-xet: {msg}", file=sys.stderr)
        if record(name, msg, e) is not None:
            print("hint: details in 'git xet logs last'", file=sys.stderr)
        return code
    return 0


HOT = frozenset(
    {
        "filter-process",
        "clean",
        "smudge",
        "pre-push",
        "pre-receive",
        "post-checkout",
        "post-merge",
        "credential",
        "mount-serve",
    }
)
