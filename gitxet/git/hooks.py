"""Installing gitxet's git hooks, and reading what git feeds the pre-push hook.

The hook scripts are package data (``gitxet/git/hook_templates/``); each carries the line
``# gitxet hook``, which is how gitxet recognises its own hooks. A hook file without that
line belongs to the user and is never overwritten or deleted. Installing over one either
fails with :class:`~gitxet.errors.HookConflictError` (the default) or, with
``on_conflict="chain"``, moves it aside to ``<name>.gitxet-chained``, which gitxet's hook runs
first with the same arguments and input; uninstalling moves it back.

Hooks go where git looks for them (``git rev-parse --git-path hooks``), so
``core.hooksPath`` is respected.

:func:`ensure_hook` is what the filter runs in every repository it starts in (as git-lfs
installs its hooks from its filter commands): a repository obtained by any means (plain
``git clone``, a CI checkout) so gets the pre-push hook before its first push. It writes
only into the repository's own git directory: a ``core.hooksPath`` elsewhere (shared by
several repositories, or committed) is left to the user, and so is a user hook that cannot
be chained.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from gitxet.errors import ConfigError, GitError, HookConflictError
from gitxet.git.process import PathArg, run_git
from gitxet.util.atomic import atomic_write

__all__ = [
    "CHAINED_SUFFIX",
    "HOOK_MARKER",
    "HOOK_NAMES",
    "RECEIPTS",
    "RECEIVE_CAS_ENV",
    "RECEIVE_HOOK",
    "RECEIVE_TOKEN_ENV",
    "HookChange",
    "PushRef",
    "ReceiveRef",
    "ensure_hook",
    "hooks_dir",
    "install_hooks",
    "is_gitxet_hook",
    "parse_pre_push_input",
    "parse_pre_receive_input",
    "render_hook",
    "uninstall_hooks",
]

HOOK_MARKER = "# gitxet hook"
HOOK_NAMES = ("pre-push", "post-checkout", "post-merge")
#: The server-side hook (bare repositories gitxet serves or pushes into), installed on its
#: own: never part of a client's set above.
RECEIVE_HOOK = "pre-receive"
#: What ``git xet serve`` puts in its git processes' environment for the pre-receive hook:
#: the server's own CAS URL (loopback) and a per-process read token for it.
RECEIVE_CAS_ENV = "GITXET_RECEIVE_CAS"
RECEIVE_TOKEN_ENV = "GITXET_RECEIVE_TOKEN"
CHAINED_SUFFIX = ".gitxet-chained"
#: Where, relative to a bare repository on a path, gitxet's pre-push leaves a receipt (an
#: empty file named by the commit id) for each commit whose data it has just stored in that
#: repository's embedded store; gitxet's pre-receive hook takes a push whose every new tip
#: has one without starting a checker (anyone who can write there can write refs too).
RECEIPTS = "xet/receipts"
DEFAULT_PROGRAM = "git-xet"
# Enough to find the marker in any hook we wrote; user hooks may be bigger, we don't care.
_SNIFF_BYTES = 64 * 1024


HookAction = Literal[
    "created", "updated", "unchanged", "chained", "removed", "restored", "absent", "foreign"
]


@dataclass(frozen=True)
class HookChange:
    """What happened to one hook.

    ``action`` is one of: ``created``, ``updated``, ``unchanged``, ``chained`` (install);
    ``removed``, ``restored`` (ours removed and the chained user hook put back), ``absent``,
    ``foreign`` (a user hook, left alone) (uninstall).
    """

    name: str
    path: Path
    action: HookAction


def hooks_dir(repo: PathArg) -> Path:
    """The directory git runs hooks from for ``repo`` (honours ``core.hooksPath``)."""
    out = run_git(["rev-parse", "--git-path", "hooks"], repo).rstrip(b"\n")
    path = Path(os.fsdecode(out))
    return path if path.is_absolute() else Path(repo) / path


def _template(name: str) -> str:
    known = (*HOOK_NAMES, RECEIVE_HOOK)
    if name not in known:
        raise ConfigError(f"gitxet has no {name!r} hook (known: {', '.join(known)})")
    return (resources.files("gitxet.git") / "hook_templates" / name).read_text("utf-8")


def render_hook(name: str, program: str | Sequence[str] = DEFAULT_PROGRAM) -> str:
    """The script for hook ``name`` calling ``program``.

    ``program`` is either a command line, split the way a shell would
    (``"python -m gitxet"``, ``"'/opt/my tools/git-xet'"``), or a sequence of argv tokens
    used as they are (``[sys.executable, "-m", "gitxet"]``). Either way it is re-quoted for
    the script, so blanks and shell metacharacters in paths are safe.
    """
    if isinstance(program, str):
        try:
            tokens = shlex.split(program)
        except ValueError as exc:
            raise ConfigError(f"cannot parse hook program {program!r}: {exc}") from None
    else:
        tokens = list(program)
    if not tokens or any(not t or "\n" in t or "\0" in t for t in tokens):
        raise ConfigError(f"invalid hook program {program!r}")
    text = _template(name)
    text = text.replace("@GITXET_PROBE@", shlex.quote(tokens[0]))
    text = text.replace("@GITXET_NAME@", re.sub(r"[^\w./+-]", "?", tokens[0]))
    text = text.replace("@RECEIPTS@", RECEIPTS)
    return text.replace("@GITXET@", shlex.join(tokens))


def is_gitxet_hook(path: Path) -> bool:
    """Whether ``path`` is a hook file gitxet wrote (it carries ``HOOK_MARKER``)."""
    try:
        with path.open("rb") as f:
            head = f.read(_SNIFF_BYTES)
    except (FileNotFoundError, IsADirectoryError):
        return False
    except OSError as exc:
        raise GitError(f"cannot read hook {path}: {exc}") from exc
    return HOOK_MARKER.encode() in head.splitlines()


def install_hooks(
    repo: PathArg,
    names: Sequence[str] = HOOK_NAMES,
    program: str | Sequence[str] = DEFAULT_PROGRAM,
    on_conflict: Literal["refuse", "chain"] = "refuse",
    *,
    directory: Path | None = None,
) -> list[HookChange]:
    """Write gitxet's hooks into ``repo``; see the module docstring for user hooks.

    All conflicts are checked before anything is written, so a refusal changes nothing.
    ``directory`` is the hooks directory when the caller already knows it (a server
    asking git under its own, hermetic environment); by default git is asked.

    Raises:
        HookConflictError: a user hook is in the way (``refuse``), or one is in the way and
            an older chained hook already exists (``chain``).
    """
    directory = directory or hooks_dir(repo)
    scripts = {name: render_hook(name, program) for name in names}
    plan: list[tuple[str, Path, HookAction]] = []
    for name in names:
        path = directory / name
        chained = directory / (name + CHAINED_SUFFIX)
        if not path.exists() and not path.is_symlink():
            plan.append((name, path, "created"))
        elif is_gitxet_hook(path):
            unchanged = path.read_text("utf-8", "replace") == scripts[name]
            plan.append((name, path, "unchanged" if unchanged else "updated"))
        elif on_conflict == "chain" and not chained.exists():
            plan.append((name, path, "chained"))
        else:
            raise HookConflictError(name, str(path))

    changes: list[HookChange] = []
    for name, path, action in plan:
        if action == "chained":
            try:
                os.replace(path, directory / (name + CHAINED_SUFFIX))
            except OSError as exc:
                raise GitError(f"cannot move {path} aside: {exc}") from exc
        if action != "unchanged":
            try:
                atomic_write(path, scripts[name].encode("utf-8"), mode=0o755)
            except OSError as exc:
                raise GitError(f"cannot write {path}: {exc}") from exc
        changes.append(HookChange(name, path, action))
    return changes


def ensure_hook(
    repo: PathArg,
    name: str = "pre-push",
    program: str | Sequence[str] = DEFAULT_PROGRAM,
) -> HookChange:
    """Make sure gitxet's hook ``name`` runs in ``repo``, changing as little as possible.

    A gitxet hook already there is left as it is (``unchanged``). A missing one is
    ``created``; a user hook is ``chained`` (moved aside, run first by ours). The action is
    ``foreign`` (nothing written; the caller should warn) when a user hook is in the way
    and already has a chained one, or when git runs hooks from a directory outside the
    repository's git directory (``core.hooksPath``).
    """
    out = run_git(["rev-parse", "--git-path", "hooks", "--git-common-dir"], repo)
    lines = [Path(os.fsdecode(line)) for line in out.splitlines()]
    if len(lines) != 2:
        raise GitError(f"unexpected rev-parse output {out[:200]!r}")
    directory, common = (p if p.is_absolute() else Path(repo) / p for p in lines)
    path = directory / name
    if is_gitxet_hook(path):
        return HookChange(name, path, "unchanged")
    if not _inside(directory, common):
        return HookChange(name, path, "foreign")
    try:
        return install_hooks(repo, (name,), program, on_conflict="chain")[0]
    except HookConflictError:
        return HookChange(name, path, "foreign")


def _inside(path: Path, parent: Path) -> bool:
    try:
        path.resolve().relative_to(parent.resolve())
    except ValueError:
        return False
    return True


def uninstall_hooks(repo: PathArg, names: Sequence[str] = HOOK_NAMES) -> list[HookChange]:
    """Remove gitxet's hooks, restoring chained user hooks; user hooks are left alone."""
    directory = hooks_dir(repo)
    changes: list[HookChange] = []
    for name in names:
        action: HookAction
        path = directory / name
        chained = directory / (name + CHAINED_SUFFIX)
        if not path.exists() and not path.is_symlink():
            action = "absent"
            if chained.exists():  # ours was deleted by hand: still put the user's back
                try:
                    os.replace(chained, path)
                except OSError as exc:
                    raise GitError(f"cannot restore hook {chained}: {exc}") from exc
                action = "restored"
        elif not is_gitxet_hook(path):
            action = "foreign"
        else:
            try:
                if chained.exists():
                    os.replace(chained, path)
                    action = "restored"
                else:
                    path.unlink()
                    action = "removed"
            except OSError as exc:
                raise GitError(f"cannot remove hook {path}: {exc}") from exc
        changes.append(HookChange(name, path, action))
    return changes


# ---- pre-push input -----------------------------------------------------------------------

_OID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


@dataclass(frozen=True)
class PushRef:
    """One line of pre-push input: what git is about to do to one remote ref."""

    local_ref: str
    local_oid: str
    remote_ref: str
    remote_oid: str

    @property
    def is_delete(self) -> bool:
        """The push deletes ``remote_ref`` (nothing to upload)."""
        return set(self.local_oid) == {"0"}

    @property
    def is_new(self) -> bool:
        """``remote_ref`` does not exist on the remote yet."""
        return set(self.remote_oid) == {"0"}


def parse_pre_push_input(data: bytes) -> list[PushRef]:
    """Parse the lines git writes to a pre-push hook's stdin.

    Each is ``<local ref> SP <local oid> SP <remote ref> SP <remote oid> LF``.

    Raises:
        GitError: a line that does not have that shape.
    """
    refs: list[PushRef] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw:
            continue
        line = raw.decode("utf-8", "surrogateescape")
        fields = line.split(" ")
        if len(fields) != 4 or not all(fields):
            raise GitError(f"pre-push input line {number} is malformed: {line[:200]!r}")
        local_ref, local_oid, remote_ref, remote_oid = fields
        if not (_OID.fullmatch(local_oid) and _OID.fullmatch(remote_oid)):
            raise GitError(f"pre-push input line {number} has a bad object id: {line[:200]!r}")
        refs.append(PushRef(local_ref, local_oid, remote_ref, remote_oid))
    return refs


@dataclass(frozen=True)
class ReceiveRef:
    """One line of pre-receive input: a ref a push is about to change."""

    old_oid: str
    new_oid: str
    ref: str

    @property
    def is_delete(self) -> bool:
        """The push deletes ``ref``."""
        return set(self.new_oid) == {"0"}


def parse_pre_receive_input(data: bytes) -> list[ReceiveRef]:
    """Parse the lines git writes to a pre-receive hook's stdin.

    Each is ``<old oid> SP <new oid> SP <ref name> LF``.

    Raises:
        GitError: a line that does not have that shape.
    """
    refs: list[ReceiveRef] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw:
            continue
        line = raw.decode("utf-8", "surrogateescape")
        fields = line.split(" ")
        if len(fields) != 3 or not all(fields):
            raise GitError(f"pre-receive input line {number} is malformed: {line[:200]!r}")
        old, new, ref = fields
        if not (_OID.fullmatch(old) and _OID.fullmatch(new)):
            raise GitError(f"pre-receive input line {number} has a bad object id: {line[:200]!r}")
        refs.append(ReceiveRef(old, new, ref))
    return refs
