"""The commands git runs on every add, checkout and push, without typer or rich.

git starts ``git-xet filter-process`` for each command that touches tracked files and
``git-xet pre-push`` for each push; their start-up time is paid every time. These paths
import only what they use (no typer, no rich unless a progress bar is drawn), which
roughly halves the time to the first byte. ``gitxet.cli.entry`` dispatches here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

from gitxet.cli._errors import describe
from gitxet.cli._interrupt import exit_now, handle_signals, received


def program() -> str:
    """How git should call us back: ``git-xet`` if that is on PATH, else this interpreter."""
    import shutil

    return "git-xet" if shutil.which("git-xet") else f"{sys.executable} -m gitxet"


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
    from gitxet.repo import HttpAccess, XetRepo
    from gitxet.settings import Settings, lazy_default

    if "remote_factory" not in kw:
        kw["remote_factory"] = HttpAccess.from_settings(Settings.load()).remote_factory
    return XetRepo(path, lazy=lazy_default(), stats_path=os.environ.get("GITXET_STATS_FILE"), **kw)


def filter_process() -> None:
    """git's long-running filter process (configured by install)."""
    from gitxet.git.filter_protocol import serve

    repo = open_repo()
    ensure_hooks(repo)

    def on_error(command: str, path: str, exc: BaseException) -> None:
        msg, _ = describe(exc)
        print(f"git-xet: {command} {path}: {msg}", file=sys.stderr, flush=True)

    serve(repo, sys.stdin.buffer, sys.stdout.buffer, on_error=on_error)


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


def _has_object(cwd: str, oid: str) -> bool:
    r = subprocess.run(["git", "cat-file", "-e", oid], cwd=cwd, capture_output=True, check=False)
    return r.returncode == 0


def pre_push(remote: str, url: str = "") -> None:
    """pre-push hook: upload the data of the pushed commits before git updates refs."""
    from gitxet.git import process
    from gitxet.git.hooks import parse_pre_push_input

    if os.environ.get("GITXET_SKIP_PREPUSH") == "1":
        sys.stdin.buffer.read()
        return
    refs = parse_pre_push_input(sys.stdin.buffer.read())
    revs = [r.local_oid for r in refs if not r.is_delete]
    if not revs:
        return
    repo = open_repo()
    exclude = [r.remote_oid for r in refs if not r.is_new and _has_object(repo.cwd, r.remote_oid)]
    known_remote = remote if remote in process.list_remotes(repo.cwd) else None
    pointers = repo.pointers_to_push(revs, exclude, known_remote)
    if not pointers:
        return
    total = sum(p.size for p in pointers)
    if sys.stderr.isatty():
        from gitxet.cli._progress import byte_progress

        with byte_progress("uploading", None) as advance:
            summary = repo.push_data(url or remote, pointers, progress=advance)
    else:
        summary = repo.push_data(url or remote, pointers)
    print(
        f"git-xet: {summary.files} files ({total:,} bytes): sent {summary.xorbs_sent} xorbs, "
        f"{summary.xorbs_skipped} already on the remote",
        file=sys.stderr,
    )


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
        elif name == "credential":
            from gitxet.cli.credential import run as credential

            if len(args) != 1:
                return _usage("usage: git-xet credential get|store|erase (git runs it)")
            return credential(args[0])
        elif name in ("post-checkout", "post-merge"):
            pass  # the filter already wrote (or deliberately left) every file
        else:
            return _usage(f"not a hot command: {name}")
    except KeyboardInterrupt:
        exit_now(received() or signal.SIGINT)
    except BrokenPipeError:
        return 141
    except Exception as e:  # the CLI boundary: one line, never a traceback
        msg, code = describe(e)
        print(f"git-xet: {msg}", file=sys.stderr)
        return code
    return 0


HOT = frozenset(
    {"filter-process", "clean", "smudge", "pre-push", "post-checkout", "post-merge", "credential"}
)
