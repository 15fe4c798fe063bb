"""Running the ``git`` binary: one-shot commands, streamed listings, config, remotes.

``CatFile`` and ``batch_check`` live in :mod:`gitxet.git.catfile` and are re-exported here.

Rules that hold for every function here:

* Paths that come from git are ``bytes`` (read with ``-z`` where git offers it), because git
  paths are bytes and need not be UTF-8. Object ids, ref names and config values are ``str``.
* A failing git raises :class:`~gitxet.errors.GitCommandError` carrying the first line of
  git's stderr; "not there" answers (missing config key, unknown object) are ``None`` or
  :class:`~gitxet.errors.GitObjectNotFoundError`, never a generic failure.
* Listings that can be huge (``ls-tree -r``, ``rev-list --objects``) are generators over a
  pipe, so memory stays flat on big repositories. stderr goes to a temp file, not a pipe:
  a chatty git can then never dead-lock against us while we read its stdout.
* Revisions given by callers must not start with ``-``, so that a ref name can never be
  read as an option.
* The environment is inherited untouched (only ``gitxet.cli`` reads it). Inside a hook or a
  filter that means git's own ``GIT_DIR`` applies, which is what those callers want.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal, NamedTuple

from gitxet.errors import (
    AuthError,
    GitError,
    GitObjectNotFoundError,
    NotFoundError,
    RemoteError,
    UnreachableError,
)
from gitxet.formats.pointer import MAX_POINTER_SIZE
from gitxet.git._runner import (
    GitArg,
    PathArg,
    Result,
    fail,
    no_option,
    one_line,
    run,
    run_git,
    spawn_error,
    stream_records,
)
from gitxet.git.catfile import CatFile, CatFileStream, ObjectInfo, batch_check

__all__ = [
    "BlobInfo",
    "CatFile",
    "CatFileStream",
    "ObjectInfo",
    "PathArg",
    "RevListObject",
    "Scope",
    "TreeEntry",
    "batch_check",
    "blob_sizes",
    "changed_paths",
    "config_add",
    "config_get",
    "config_get_all",
    "config_get_regexp",
    "config_remove_empty_section",
    "config_set",
    "config_unset",
    "current_branch",
    "git_dir",
    "git_version",
    "index_files",
    "index_matches",
    "iter_ls_tree",
    "list_remotes",
    "locate",
    "ls_tree",
    "ref_dates",
    "ref_tips",
    "refresh_index",
    "remote_failure",
    "remote_refs_containing",
    "remote_url",
    "rev_list_objects",
    "rev_parse",
    "run_git",
    "small_blobs",
    "stat_changed",
    "toplevel",
]

#: Where a config key lives. ``None`` in readers means git's merged view.
Scope = Literal["local", "global", "system"]

READ_CHUNK = 1 << 16


# ---- repository paths and revisions ------------------------------------------------------


def git_version() -> tuple[int, ...]:
    """The installed git's version as numbers, e.g. ``(2, 39, 5)``."""
    text = run_git(["--version"]).decode("ascii", "replace").split()
    if len(text) < 3:
        raise GitError(f"unexpected git --version output {' '.join(text)!r}")
    parts: list[int] = []
    for piece in text[2].split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def common_git_dir(git_dir: str) -> str:
    """The git dir whose objects, refs and store ``git_dir`` shares: the main one of a
    linked work tree's (its ``commondir`` file names it), else ``git_dir``. No git run."""
    try:
        with open(os.path.join(git_dir, "commondir"), encoding="utf-8") as f:
            rel = f.read().strip()
    except OSError:
        return git_dir
    return os.path.normpath(os.path.join(git_dir, rel)) if rel else git_dir


def work_tree_git_dir(path: str) -> str | None:
    """The git dir of the work tree at ``path``: its ``.git`` directory or the one a ``.git``
    file names (a linked work tree, a submodule); None when it has neither. No git run."""
    dotgit = os.path.join(path, ".git")
    if os.path.isdir(dotgit):
        return dotgit
    try:
        with open(dotgit, encoding="utf-8") as f:
            line = f.readline(4096).strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not line.startswith("gitdir:"):
        return None
    named = os.path.join(path, line.removeprefix("gitdir:").strip())  # an absolute one stays
    return os.path.normpath(named) if os.path.isdir(named) else None


def git_dir(cwd: PathArg) -> Path:
    """Absolute path of the repository's git directory (``.git`` or a bare repo)."""
    return Path(os.fsdecode(one_line(run_git(["rev-parse", "--absolute-git-dir"], cwd))))


def toplevel(cwd: PathArg) -> Path:
    """Absolute path of the working tree's top directory (fails in a bare repository)."""
    return Path(os.fsdecode(one_line(run_git(["rev-parse", "--show-toplevel"], cwd))))


class Location(NamedTuple):
    """Where a repository is: its git directory, the directory its linked work trees share
    (``git_dir`` itself except in a ``git worktree add`` work tree) and its work tree."""

    git_dir: Path
    common_dir: Path
    worktree: Path | None


def locate(cwd: PathArg) -> Location:
    """:func:`git_dir`, the common git directory and :func:`toplevel` (None in a bare
    repository or inside ``.git``) from one git process: every gitxet command, hook and
    filter starts by asking them."""
    args: list[GitArg] = [
        "rev-parse",
        "--absolute-git-dir",
        "--git-common-dir",  # relative to cwd unless absolute (--path-format: git 2.31)
        "--show-toplevel",
    ]
    result = run(args, cwd, None)
    lines = result.stdout.splitlines()
    if len(lines) < 2:  # not a repository (or git failed before printing anything)
        raise fail(args, result, cwd)
    git_dir, common = (Path(os.fsdecode(line)) for line in lines[:2])
    common = Path(os.path.abspath(os.path.join(os.fsdecode(cwd), common)))
    # no work tree: git prints the git directories, then fails on --show-toplevel
    if result.returncode != 0 or len(lines) < 3:
        return Location(git_dir, common, None)
    return Location(git_dir, common, Path(os.fsdecode(lines[2])))


def rev_parse(cwd: PathArg, rev: str) -> str:
    """Resolve ``rev`` to a full object id.

    Raises:
        GitObjectNotFoundError: ``rev`` names nothing.
    """
    no_option(rev, "revision")
    result = run(["rev-parse", "--verify", "--quiet", rev], cwd, None)
    if result.returncode != 0:
        if result.stderr.strip():
            raise fail(["rev-parse", rev], result, cwd)
        raise GitObjectNotFoundError(rev)
    return one_line(result.stdout).decode("ascii")


def head_commit(cwd: PathArg) -> str | None:
    """HEAD's commit, or None before the first commit (an unborn branch)."""
    try:
        return rev_parse(cwd, "HEAD")
    except GitObjectNotFoundError:
        return None


# ---- streamed listings --------------------------------------------------------------------


class TreeEntry(NamedTuple):
    """One ``ls-tree`` line: octal ``mode`` as int, ``type`` (blob/tree/commit), ``oid``,
    ``size`` (None for trees and submodules), ``path`` relative to the repository root."""

    mode: int
    type: str
    oid: str
    size: int | None
    path: bytes


def _parse_tree_entry(record: bytes) -> TreeEntry:
    header, tab, path = record.partition(b"\t")
    fields = header.split()
    if not tab or len(fields) != 4 or not path:
        raise GitError(f"unexpected ls-tree output {record[:200]!r}")
    mode, kind, oid, size = fields
    try:
        return TreeEntry(
            int(mode, 8),
            kind.decode("ascii"),
            oid.decode("ascii"),
            None if size == b"-" else int(size),
            path,
        )
    except ValueError:
        raise GitError(f"unexpected ls-tree output {record[:200]!r}") from None


def iter_ls_tree(
    cwd: PathArg,
    treeish: str,
    paths: Sequence[bytes | str] = (),
    *,
    recursive: bool = True,
) -> Iterator[TreeEntry]:
    """Stream the entries of ``treeish`` (recursively by default), paths as bytes."""
    no_option(treeish, "tree-ish")
    args: list[GitArg] = ["ls-tree", "-z", "--long", "--full-tree"]
    if recursive:
        args.append("-r")
    args += [treeish, "--", *paths]
    for record in stream_records(args, cwd, b"\0"):
        yield _parse_tree_entry(record)


def ls_tree(
    cwd: PathArg,
    treeish: str,
    paths: Sequence[bytes | str] = (),
    *,
    recursive: bool = True,
) -> list[TreeEntry]:
    """All entries of ``treeish``; see :func:`iter_ls_tree` for the streamed form."""
    return list(iter_ls_tree(cwd, treeish, paths, recursive=recursive))


class RevListObject(NamedTuple):
    """An object reachable from the listed revisions; ``path`` is None for commits.

    git cuts a path at its first newline here (rev-list has no ``-z`` in older gits), so
    treat ``path`` as a hint for messages, not as an exact name.
    """

    oid: str
    path: bytes | None


def _rev_list_args(
    revs: Sequence[str],
    exclude: Sequence[str],
    exclude_remote: str | None,
    exclude_refs: bool = False,
    ignore_missing: bool = False,
) -> list[GitArg]:
    if not revs:
        raise GitError("rev-list needs at least one revision")
    args: list[GitArg] = ["rev-list", "--objects"]
    if ignore_missing:
        args.append("--ignore-missing")
    args += [no_option(r, "revision") for r in revs]
    if exclude or exclude_remote is not None or exclude_refs:
        args.append("--not")
        args += [no_option(r, "revision") for r in exclude]
        if exclude_remote is not None:
            args.append(f"--remotes={no_option(exclude_remote, 'remote name')}")
        if exclude_refs:
            args.append("--all")
    return args


def rev_list_objects(
    cwd: PathArg,
    revs: Sequence[str],
    exclude: Sequence[str] = (),
    exclude_remote: str | None = None,
) -> Iterator[RevListObject]:
    """Objects reachable from ``revs`` but not from ``exclude`` nor ``refs/remotes/<remote>/*``.

    This is the pre-push question "what would this push send that the remote does not
    already have": ``git rev-list --objects <revs> --not <exclude> --remotes=<remote>``.
    """
    for record in stream_records(_rev_list_args(revs, exclude, exclude_remote), cwd, b"\n"):
        oid, sep, path = record.partition(b" ")
        yield RevListObject(oid.decode("ascii"), path if sep else None)


class BlobInfo(NamedTuple):
    """A blob small enough to be a pointer: its id, size and (hint) path."""

    oid: str
    size: int
    path: bytes


def small_blobs(
    cwd: PathArg,
    revs: Sequence[str],
    exclude: Sequence[str] = (),
    exclude_remote: str | None = None,
    max_size: int = MAX_POINTER_SIZE,
    *,
    exclude_refs: bool = False,
    ignore_missing: bool = False,
) -> Iterator[BlobInfo]:
    """Blobs from :func:`rev_list_objects` whose size is at most ``max_size``.

    Only these can be pointer files, so a pre-push scan reads just them. rev-list's output
    is piped straight into ``cat-file --batch-check`` (no Python in between), so even a
    history with millions of objects costs one pass and flat memory. ``exclude_refs`` also
    leaves out what any ref reaches (``--not --all``): in a pre-receive hook, what a push
    adds. ``ignore_missing``: revisions this repository lacks are skipped, not an error.
    """
    args = _rev_list_args(revs, exclude, exclude_remote, exclude_refs, ignore_missing)
    with tempfile.TemporaryFile() as err:
        try:
            producer = subprocess.Popen(
                ["git", *args],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        except OSError as exc:
            raise spawn_error(args, exc) from exc
        done = False
        check = ["cat-file", "--batch-check=%(objectname) %(objecttype) %(objectsize) %(rest)"]
        assert producer.stdout is not None
        records = stream_records(check, cwd, b"\n", stdin=producer.stdout)
        try:
            for record in records:
                fields = record.split(b" ", 3)
                if len(fields) < 3 or fields[1] == b"missing":
                    raise GitError(f"unexpected cat-file output {record[:200]!r}")
                if fields[1] != b"blob":
                    continue
                size = int(fields[2])
                if size <= max_size:
                    path = fields[3] if len(fields) == 4 else b""
                    yield BlobInfo(fields[0].decode("ascii"), size, path)
            returncode = producer.wait()
            done = True
            if returncode != 0:
                err.seek(0)
                raise fail(args, Result(returncode, b"", err.read(64 * 1024)))
        finally:
            records.close()  # stops cat-file now, not whenever the generator is collected
            if not done:
                producer.kill()
                producer.wait()
            producer.stdout.close()


# ---- config -------------------------------------------------------------------------------


def _scope_args(scope: Scope | None) -> list[GitArg]:
    if scope is None:
        return []
    if scope not in ("local", "global", "system"):
        raise GitError(f"unknown config scope {scope!r}")
    return [f"--{scope}"]


def _config_key(key: str) -> str:
    return no_option(key, "config key")


def config_get(cwd: PathArg | None, key: str, scope: Scope | None = None) -> str | None:
    """The value of ``key`` (the last one if multi-valued), or None if unset."""
    values = config_get_all(cwd, key, scope)
    return values[-1] if values else None


def config_get_all(cwd: PathArg | None, key: str, scope: Scope | None = None) -> list[str]:
    """Every value of ``key`` in order; empty if unset."""
    args = ["config", *_scope_args(scope), "-z", "--get-all", _config_key(key)]
    result = run(args, cwd, None)
    if result.returncode == 1:
        return []
    if result.returncode != 0:
        raise fail(args, result)
    return [v.decode("utf-8", "surrogateescape") for v in result.stdout.split(b"\0")[:-1]]


def config_get_regexp(
    cwd: PathArg | None, pattern: str, scope: Scope | None = None
) -> list[tuple[str, str]]:
    """``(key, value)`` pairs whose key matches the regular expression ``pattern``."""
    args = ["config", *_scope_args(scope), "-z", "--get-regexp", no_option(pattern, "pattern")]
    result = run(args, cwd, None)
    if result.returncode == 1:
        return []
    if result.returncode != 0:
        raise fail(args, result)
    pairs: list[tuple[str, str]] = []
    for record in result.stdout.split(b"\0")[:-1]:
        key, _, value = record.partition(b"\n")
        pairs.append(
            (key.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        )
    return pairs


def config_set(cwd: PathArg | None, key: str, value: str, scope: Scope = "local") -> None:
    """Set ``key`` to ``value``, replacing a single existing value."""
    run_git(["config", *_scope_args(scope), _config_key(key), value], cwd)


def config_add(cwd: PathArg | None, key: str, value: str, scope: Scope = "local") -> None:
    """Add one more value to a multi-valued ``key``."""
    run_git(["config", *_scope_args(scope), "--add", _config_key(key), value], cwd)


def config_unset(cwd: PathArg | None, key: str, scope: Scope = "local") -> bool:
    """Remove every value of ``key``; False if it was not set."""
    args = ["config", *_scope_args(scope), "--unset-all", _config_key(key)]
    result = run(args, cwd, None)
    if result.returncode == 5:  # git: "you try to unset an option which does not exist"
        return False
    if result.returncode != 0:
        raise fail(args, result)
    return True


def config_unset_value(cwd: PathArg | None, key: str, value: str, scope: Scope = "local") -> bool:
    """Remove the values of a multi-valued ``key`` equal to ``value``; False if none was."""
    args = ["config", *_scope_args(scope), "--fixed-value", "--unset-all", _config_key(key)]
    result = run([*args, value], cwd, None)
    if result.returncode == 5:
        return False
    if result.returncode != 0:
        raise fail(args, result)
    return True


def config_remove_empty_section(cwd: PathArg | None, section: str, scope: Scope = "local") -> bool:
    """Drop a left-over empty ``[section]`` header (e.g. ``filter.xet``).

    Recent gits drop the header themselves when its last key goes; older ones leave it.
    Returns False, touching nothing, if the section still holds keys.
    """
    escaped = section.replace(".", r"\.")
    if config_get_regexp(cwd, f"^{escaped}\\.", scope):
        return False
    args = ["config", *_scope_args(scope), "--remove-section", no_option(section, "section")]
    run(args, cwd, None)  # fails harmlessly when there is no such header
    return True


def object_format(cwd: PathArg) -> str:
    """The repository's object hash: ``sha1`` or ``sha256``."""
    fmt = config_get(cwd, "extensions.objectformat")
    return (fmt or "sha1").lower()


def changed_paths(cwd: PathArg, staged: bool) -> list[tuple[str, str]]:
    """(status letter, path) of what differs between HEAD and the index (``staged``), or
    the index and the work tree: ``git diff --name-status``; renames are not detected (a
    rename is D + A). Before the first commit everything in the index is added."""
    args: list[GitArg] = ["diff", "--name-status", "--no-renames", "-z"]
    if staged:  # without a commit to compare with, git compares with the empty tree
        args.append("--cached")
    fields = run_git(args, cwd).split(b"\0")
    out: list[tuple[str, str]] = []
    for status, path in zip(fields[::2], fields[1::2], strict=False):
        if status and path:
            out.append((status.decode("ascii")[:1], os.fsdecode(path)))
    return out


def index_matches(cwd: PathArg, pathspecs: Sequence[str]) -> bool:
    """Whether every pathspec names at least one file in the index."""
    args = ["ls-files", "-z", "--error-unmatch", "--", *pathspecs]
    return run(args, cwd, None).returncode == 0


def index_files(cwd: PathArg, paths: Sequence[str] = ()) -> dict[str, tuple[int, str]]:
    """Regular files the index names and git checks out (merged entries only, not those a
    sparse checkout leaves out: skip-worktree), limited to the pathspecs ``paths``:
    path -> (git mode, blob id)."""
    out = run_git(["ls-files", "-s", "-t", "-z", "--", *paths], cwd)
    files: dict[str, tuple[int, str]] = {}
    for rec in out.split(b"\0"):
        meta, _, path = rec.partition(b"\t")
        fields = meta.split(b" ")  # tag ('S': skip-worktree), mode, blob id, stage
        if (
            len(fields) == 4
            and fields[0] != b"S"
            and fields[1] in (b"100644", b"100755")
            and fields[3] == b"0"
        ):
            files[os.fsdecode(path)] = (int(fields[1], 8), fields[2].decode("ascii"))
    return files


def index_paths(cwd: PathArg) -> list[str]:
    """Every path the index names (files, symlinks, submodules; each once)."""
    out = run_git(["ls-files", "-z"], cwd)
    return list(dict.fromkeys(os.fsdecode(p) for p in out.split(b"\0") if p))


#: ``git -c`` settings that switch the xet filter off for one command: git then writes a
#: pointer blob as it is (what a lazy smudge would give) without starting the filter
NO_XET_FILTER = (
    "-c", "filter.xet.process=", "-c", "filter.xet.smudge=", "-c", "filter.xet.required=false",
)  # fmt: skip


def checkout_index(cwd: PathArg, paths: Sequence[str]) -> None:
    """git writes the index entries ``paths`` into the work tree as they are (the xet filter
    off: a pointer blob as its pointer text), over whatever is there, and records their
    stat data in the index (``checkout-index -f``)."""
    if not paths:
        return
    names = b"".join(os.fsencode(p) + b"\0" for p in paths)
    run_git([*NO_XET_FILTER, "checkout-index", "-f", "-u", "-q", "-z", "--stdin"], cwd, input=names)


def stat_changed(cwd: PathArg) -> set[str]:
    """Paths whose index stat data no longer matches the work tree (``diff-files``: git
    compares stat data only and reads no file); empty when git cannot tell."""
    out = run_git(["diff-files", "--name-only", "-z"], cwd, check=False)
    return {os.fsdecode(p) for p in out.split(b"\0") if p}


def refresh_index(cwd: PathArg, paths: Sequence[str]) -> None:
    """Let git re-check the stat data of ``paths`` (``update-index --refresh``): files
    whose stat changed while their cleaned content did not. Failures are git's to report
    later (``git status``), not errors here."""
    for i in range(0, len(paths), 1000):  # stay far below the argument-size limit
        run_git(["update-index", "-q", "--refresh", "--", *paths[i : i + 1000]], cwd, check=False)


def blob_sizes(cwd: PathArg, oids: Sequence[str]) -> dict[str, int]:
    """Object id -> size of those of ``oids`` the repository has (one ``--batch-check``)."""
    if not oids:
        return {}
    out = run_git(
        ["cat-file", "--batch-check=%(objectname) %(objectsize)"],
        cwd,
        input=("\n".join(oids) + "\n").encode(),
    )
    sizes: dict[str, int] = {}
    for line in out.decode().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            sizes[parts[0]] = int(parts[1])
    return sizes


def ref_tips(cwd: PathArg, prefixes: Sequence[str]) -> list[str]:
    """The commits the refs under ``prefixes`` (``refs/heads``...) point at, once each."""
    out = run_git(["for-each-ref", "--format=%(objectname)", *prefixes], cwd)
    return list(dict.fromkeys(out.decode().split()))


def ref_dates(cwd: PathArg, prefixes: Sequence[str]) -> list[tuple[str, int | None, str]]:
    """``(commit, committer time or None, ref name)`` of each ref under ``prefixes``."""
    out = run_git(
        ["for-each-ref", "--format=%(objectname) %(committerdate:unix) %(refname)", *prefixes],
        cwd,
    )
    refs: list[tuple[str, int | None, str]] = []
    for line in out.decode("utf-8", "replace").splitlines():
        oid, when, ref = [*line.split(" ", 2), "", ""][:3]
        refs.append((oid, int(when) if when.isdigit() else None, ref))
    return refs


def remote_failure(url: str, message: str) -> GitError | NotFoundError | RemoteError:
    """The typed error for git's last stderr line about fetching from ``url`` (shown
    without credentials): unreachable, refused credentials, no such repository, or else
    a :class:`GitError` with git's words."""
    text = message.removeprefix("fatal: ").strip()
    low = text.lower()
    if "failed to connect" in low or "couldn't connect" in low or "connection refused" in low:
        return UnreachableError("git", url, "connection refused")
    if "could not resolve host" in low:
        return UnreachableError("git", url, "unknown host")
    if "timed out" in low:
        return UnreachableError("git", url, "timed out")
    if "could not read username" in low:  # git had no credentials to offer at all
        return AuthError(
            f"{url}: the server asks for credentials and none were given "
            f"(git xet login {url}, or set GITXET_TOKEN)"
        )
    if "authentication failed" in low or " 403" in low:
        return AuthError(f"{url}: the server refused the credentials (git xet login {url})")
    if ("repository" in low and "not found" in low) or "does not appear to be a git" in low:
        return NotFoundError(f"no repository at {url}")
    return GitError(f"{url}: {text}")


# ---- remotes ------------------------------------------------------------------------------


def list_remotes(cwd: PathArg) -> list[str]:
    """Names of the configured remotes."""
    return run_git(["remote"], cwd).decode("utf-8", "surrogateescape").split()


def remote_url(cwd: PathArg, name: str) -> str | None:
    """The fetch URL of remote ``name`` (with ``insteadOf`` applied), or None if unknown."""
    args = ["remote", "get-url", no_option(name, "remote name")]
    result = run(args, cwd, None)
    if result.returncode != 0:
        if name not in list_remotes(cwd):
            return None
        raise fail(args, result)
    return one_line(result.stdout).decode("utf-8", "surrogateescape")


def current_branch(cwd: PathArg) -> str | None:
    """The branch HEAD points at (``main``), or None when HEAD is detached."""
    result = run(["symbolic-ref", "-q", "HEAD"], cwd, None)
    if result.returncode != 0:
        return None
    ref = one_line(result.stdout).decode("utf-8", "surrogateescape")
    return ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else None


def remote_refs_containing(cwd: PathArg, commit: str) -> list[str]:
    """Remote-tracking refs (``refs/remotes/...``) whose history contains ``commit``.

    Empty when ``commit`` is not a commit this repository knows (a tree id, say).
    """
    args = [
        "for-each-ref",
        "--format=%(refname)",
        "--contains",
        no_option(commit, "commit"),
        "refs/remotes/",
    ]
    result = run(args, cwd, None)
    if result.returncode != 0:
        return []
    return result.stdout.decode("utf-8", "surrogateescape").split()
