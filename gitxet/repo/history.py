"""Where the data of history is: the refs that matter, which files' data is here or on a
remote (fsck, status), the repairing push, and what a prune must keep."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from gitxet.data.audit import DataLocation, count_unpushed, locate
from gitxet.data.transfer import LocalDirRemote, TransferSummary
from gitxet.errors import ConfigError, GitError, GitObjectNotFoundError
from gitxet.formats.pointer import Pointer
from gitxet.git import process
from gitxet.hashing import from_hex
from gitxet.repo.content import Content, Progress
from gitxet.repo.pointers import history_pointers, paths_in_history, pointer_files

__all__ = ["History"]


class History:
    """The history of the repository whose git commands run in ``cwd`` (``worktree``: its
    work tree, None when bare) against ``content``'s store and remotes."""

    def __init__(self, cwd: str, worktree: Path | None, content: Content) -> None:
        self.cwd = cwd
        self.worktree = worktree
        self.content = content

    def ref_tips(self, all_refs: bool) -> list[str]:
        """HEAD's commit, or (``all_refs``) that of every local branch and tag; [] if none."""
        if not all_refs:
            try:
                return [process.rev_parse(self.cwd, "HEAD")]
            except GitError:
                return []
        return process.ref_tips(self.cwd, ["refs/heads", "refs/tags"])

    def recent_refs(self, days: float, now: float | None = None) -> list[str]:
        """Commits of local and remote-tracking branches whose tip was committed in the last
        ``days`` days, and of ``refs/stash`` (git-lfs's "recent refs")."""
        cutoff = (time.time() if now is None else now) - days * 86400
        tips: list[str] = []
        for oid, when, ref in process.ref_dates(
            self.cwd, ["refs/heads", "refs/remotes", "refs/stash"]
        ):
            recent = when is not None and when >= cutoff
            if (recent or ref == "refs/stash") and not ref.endswith("/HEAD"):
                tips.append(oid)
        return list(dict.fromkeys(tips))

    def locate(
        self, found: Sequence[tuple[str, Pointer]], remote: str | None, *, ask_remote: bool
    ) -> list[DataLocation]:
        """Where each file's data is (see :func:`gitxet.data.audit.locate`)."""
        there = self.content.remotes.open(remote) if ask_remote else None
        return locate(self.content.cas, there, found)

    def repair_push(
        self, remote: str, revs: Sequence[str], progress: Progress | None = None
    ) -> tuple[TransferSummary, list[DataLocation]]:
        """Upload every file of ``revs``' history whose data is not on ``remote``: from here,
        or copied here first from another remote that has it.

        Nothing is assumed from ``refs/remotes/*``: a ref pushed without its data (by a
        clone without the hook) is repaired. Returns what moved and the files whose data is
        on no remote and not here (nothing can upload those).
        """
        where = self.locate(history_pointers(self.cwd, revs), remote, ask_remote=True)
        missing = [d for d in where if not d.local and not d.remote]
        here = [d.pointer for d in where if d.local]
        if missing:  # data this clone streams from another remote (a server clone's)
            got = self.content.copy_from_others(
                remote, [from_hex(d.pointer.xet_hash) for d in missing]
            )
            here += [d.pointer for d in missing if from_hex(d.pointer.xet_hash) in got]
            missing = [d for d in missing if from_hex(d.pointer.xet_hash) not in got]
        return self.content.push(remote, here, progress=progress), missing

    def unpushed(self, remote: str | None = None) -> int | None:
        """Files of the local branches' history whose data is here and not on an embedded
        ``remote`` (what ``git xet push --all`` uploads); None for a server or no remote."""
        try:
            r = self.content.remotes.open(remote)
        except ConfigError:
            return None
        if not isinstance(r, LocalDirRemote):
            return None
        found = history_pointers(self.cwd, self.ref_tips(True))
        return count_unpushed(self.content.cas, r, found)

    def files_to_keep(
        self, recent_days: float, commits: Sequence[str] = ()
    ) -> dict[str, set[bytes]]:
        """The files (Xet hashes) whose data a prune must keep, by reason: ``checkout``
        (HEAD and the index), ``recent`` (trees of :meth:`recent_refs`), ``unpushed``
        (added by commits of local branches that no remote-tracking ref reaches: all of
        them without remotes), ``commits`` (the trees of ``commits``, e.g. mounted ones)."""

        def tree(rev: str | None) -> set[bytes]:
            found = pointer_files(self.cwd, None, rev)
            return {from_hex(f.pointer.xet_hash) for f in found}

        def trees(revs: Iterable[str]) -> set[bytes]:
            out: set[bytes] = set()
            for rev in revs:
                with contextlib.suppress(GitObjectNotFoundError):  # not in this repository
                    out |= tree(rev)
            return out

        keep = {"checkout": tree(None) if self.worktree is not None else set()}
        keep["checkout"] |= trees(self.ref_tips(False))
        keep["recent"] = trees(self.recent_refs(recent_days))
        branches = self.ref_tips(True)
        unpushed = paths_in_history(self.cwd, branches, (), "*") if branches else []
        keep["unpushed"] = {from_hex(p.xet_hash) for _, p in unpushed}
        keep["commits"] = trees(commits)
        return keep
