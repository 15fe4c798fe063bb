"""A gitxet repository opened: its git directory and work tree, its local store and remotes,
and the parts that do the work (:mod:`gitxet.repo`), composed.

:class:`XetRepo` is also what git's filter process is handed (clean/smudge go to its
:class:`~gitxet.repo.filter.FilterHandler`), so ``git add`` and ``git checkout`` go through
the same code as ``git xet add`` and ``git xet checkout``.

The local store lives in ``<git dir>/xet``. Data the store lacks comes from the git remotes
(:mod:`gitxet.dataset` resolves them and decides the order they are asked in).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from gitxet.data.transfer import CASRemote, TransferSummary
from gitxet.dataset import (
    Remotes,
)
from gitxet.formats.pointer import Pointer
from gitxet.git import process
from gitxet.repo.content import Content, Progress
from gitxet.repo.pointers import (
    PointerFile,
    history_pointers,
    paths_in_history,
    pointer_files,
)
from gitxet.store.cas import LocalCAS

if TYPE_CHECKING:
    # the filter, checkout and history parts are imported when first used: a pre-push hook
    # (a new Python process on every push) needs none of them
    from gitxet.data.audit import DataLocation
    from gitxet.data.clean import IngestResult
    from gitxet.data.dedup import RemoteDedup
    from gitxet.data.staging import StagedIngest
    from gitxet.git.filter_protocol import SmudgeMeta
    from gitxet.git.xetconfig import Setting
    from gitxet.repo.filter import FilterHandler
    from gitxet.repo.history import History
    from gitxet.repo.materialize import MaterializedRecords, Materializer


def lazy_config(cwd: str) -> bool:
    """git config ``xet.lazy`` of the repository at ``cwd`` (unset: false).

    Raises:
        ConfigError: not a boolean.
    """
    from gitxet.settings import parse_bool

    return parse_bool(process.config_get(cwd, "xet.lazy") or "", "xet.lazy")


class XetRepo:
    """A git repository using gitxet; also the filter handler for git."""

    def __init__(
        self,
        path: str | os.PathLike[str] = ".",
        *,
        lazy: bool | None = None,
        stats_path: str | None = None,
        remote_factory: Callable[[str], CASRemote] | None = None,
    ) -> None:
        where = process.locate(path)
        self.git_dir = where.git_dir.resolve()
        self.worktree: Path | None = where.worktree.resolve() if where.worktree else None
        self.cwd = str(self.worktree or self.git_dir)
        # one store for all the work trees of a repository ('git worktree add' gives each
        # its own git dir, which keeps its index and what gitxet wrote into that work tree)
        self.cas = LocalCAS(str(where.common_dir.resolve() / "xet"))
        self._lazy = lazy
        self._stats_path = stats_path
        self.remotes = Remotes(self.cwd, remote_factory)
        self.content = Content(self.cas, self.remotes)

    @functools.cached_property
    def records(self) -> MaterializedRecords:
        """Which work-tree files gitxet wrote, from which pointer."""
        from gitxet.repo.materialize import MaterializedRecords

        return MaterializedRecords(self.cas, self.git_dir / "xet")

    @functools.cached_property
    def filter(self) -> FilterHandler:
        """git's clean and smudge for this repository."""
        from gitxet.repo.filter import FilterHandler

        lazy = self._lazy
        if lazy is None:
            lazy = lazy_config(self.cwd)
        return FilterHandler(
            self.cwd,
            self.worktree,
            self.content,
            self.records,
            lazy=lazy,
            stats_path=self._stats_path,
        )

    @functools.cached_property
    def materializer(self) -> Materializer:
        """Writes and unwrites file content in the work tree."""
        from gitxet.repo.materialize import Materializer

        return Materializer(self.git_dir, self.worktree, self.cwd, self.content, self.records)

    @functools.cached_property
    def history(self) -> History:
        """Where the data of history is."""
        from gitxet.repo.history import History

        return History(self.cwd, self.worktree, self.content)

    @property
    def threshold(self) -> int:
        """Files at least this big become pointers (:attr:`FilterHandler.threshold`)."""
        return self.filter.threshold

    @threshold.setter
    def threshold(self, value: int) -> None:
        self.filter.threshold = value

    def threshold_setting(self) -> Setting | None:
        """The configured threshold and where it comes from (None: the default)."""
        return self.filter.threshold_setting()

    @property
    def lazy(self) -> bool:
        """Whether checkouts leave pointer text (``xet.lazy``, or as opened)."""
        return self.filter.lazy

    # ---- remotes -------------------------------------------------------------------------

    def default_remote(self) -> str | None:
        """``xet.remote``, else ``origin``, else the only remote."""
        return self.remotes.default()

    def remote_url(self, name_or_url: str) -> str:
        return self.remotes.url(name_or_url)

    def remote(self, name_or_url: str | None = None) -> CASRemote:
        """The CAS of a git remote (name or URL; None: the default remote)."""
        return self.remotes.open(name_or_url)

    def search_order(
        self, remote: str | None = None, *, ref: str | None = None, commit: str | None = None
    ) -> list[str]:
        """The remotes asked for data this store lacks, in order (:mod:`gitxet.dataset`)."""
        return self.remotes.search_order(remote, ref=ref, commit=commit)

    # ---- filter handler (gitxet.repo.filter) --------------------------------------------

    def clean_stream(self, src: BinaryIO, path: str = "") -> tuple[bytes, IngestResult | None]:
        """What git stores for content ``src`` (:meth:`FilterHandler.clean_stream`)."""
        return self.filter.clean_stream(src, path)

    def dedup_for(self, path: str = "") -> RemoteDedup | None:
        """The dedup against the default remote (:meth:`FilterHandler.dedup_for`)."""
        return self.filter.dedup_for(path)

    def staging(self) -> contextlib.AbstractContextManager[StagedIngest]:
        """Batch the cleans done inside (:meth:`FilterHandler.staging`)."""
        return self.filter.staging()

    def recover_staged(self) -> int:
        """Store the data journaled by filter sessions that died; returns a file count."""
        return self.filter.recover_staged()

    def clean(self, pathname: str, src: BinaryIO, dst: BinaryIO) -> None:
        """git's clean (:meth:`FilterHandler.clean`)."""
        self.filter.clean(pathname, src, dst)

    def smudge(
        self, pathname: str, src: BinaryIO, dst: BinaryIO, meta: SmudgeMeta | None = None
    ) -> None:
        """git's smudge (:meth:`FilterHandler.smudge`)."""
        if meta is None:
            self.filter.smudge(pathname, src, dst)
        else:
            self.filter.smudge(pathname, src, dst, meta)

    def can_delay(self, pathname: str) -> bool:
        """Whether git may delay this smudge (:meth:`FilterHandler.can_delay`)."""
        return self.filter.can_delay(pathname)

    def starting(self, command: str, pathname: str) -> None:
        """A request's content is about to be read (:meth:`FilterHandler.starting`)."""
        self.filter.starting(command, pathname)

    def delayed(self, pathname: str, head: bytes, meta: SmudgeMeta | None = None) -> None:
        """A smudge git delayed (:meth:`FilterHandler.delayed`)."""
        if meta is None:
            self.filter.delayed(pathname, head)
        else:
            self.filter.delayed(pathname, head, meta)

    # ---- content (gitxet.repo.content) ---------------------------------------------------

    def ensure_local(
        self,
        pointers: Iterable[Pointer],
        remote: str | None = None,
        progress: Progress | None = None,
        *,
        commit: str | None = None,
        warm: bool = False,
    ) -> TransferSummary | None:
        """Fetch what the store lacks for ``pointers`` (:meth:`Content.ensure_local`)."""
        return self.content.ensure_local(pointers, remote, progress, commit=commit, warm=warm)

    def write_content(
        self,
        ptr: Pointer,
        dst: BinaryIO,
        remote: str | None = None,
        *,
        ref: str | None = None,
        commit: str | None = None,
        path: str | None = None,
    ) -> None:
        """Reconstruct a pointer's content into ``dst`` (:meth:`Content.write`)."""
        self.content.write(ptr, dst, remote, ref=ref, commit=commit, path=path)

    def push_data(
        self, remote: str, pointers: Iterable[Pointer], progress: Progress | None = None
    ) -> TransferSummary:
        """Upload the data behind ``pointers`` to ``remote``'s CAS (:meth:`Content.push`)."""
        return self.content.push(remote, pointers, progress)

    # ---- pointers in history -------------------------------------------------------------

    def pointers_to_push(
        self, revs: Sequence[str], exclude: Sequence[str] = (), remote: str | None = None
    ) -> list[Pointer]:
        """Pointers in commits ``revs`` that ``exclude`` and ``refs/remotes/<remote>`` lack."""
        return [ptr for _, ptr in self.paths_to_push(revs, exclude, remote)]

    def paths_to_push(
        self, revs: Sequence[str], exclude: Sequence[str] = (), remote: str | None = None
    ) -> list[tuple[str, Pointer]]:
        """:meth:`pointers_to_push` with the path each pointer was found at."""
        found = paths_in_history(self.cwd, revs, exclude, remote)
        for path, ptr in found:  # to name a file, not a hash, when its data is missing
            self.content.names.setdefault(ptr.xet_hash, path)
        return found

    def pointer_files(
        self, rev: str | None = "HEAD", paths: Sequence[str] = ()
    ) -> list[PointerFile]:
        """Pointer files of a revision (or of the index when ``rev`` is None)."""
        result = pointer_files(self.cwd, self.worktree, rev, paths)
        for f in result:
            self.content.names.setdefault(f.pointer.xet_hash, f.path)  # to name files in errors
        return result

    def unmatched_paths(self, paths: Sequence[str]) -> list[str]:
        """The pathspecs of ``paths`` (relative to the work tree's top) that match no file
        git's index names."""
        if not paths or process.index_matches(self.cwd, paths):
            return []
        return [p for p in paths if not process.index_matches(self.cwd, [p])]

    # ---- checkout ------------------------------------------------------------------------

    def checkout_without_pointers(self, only_missing: bool = False) -> list[PointerFile]:
        """For a work tree with nothing checked out yet, whose index git has just read from
        the commit (a clone made with ``--no-checkout``, then ``git read-tree HEAD``): git
        writes every entry that is not a pointer file (plain files, symlinks,
        ``.gitattributes``...), and the pointer files are returned, not written. Their
        content is then created in place (:meth:`materialize` with ``absent``): git never
        writes their pointer text first, only to have it replaced; those that cannot be
        written get it after all (:meth:`checkout_pointer_text`). With ``only_missing``
        (such a checkout killed half-way, run again) git writes only the entries not in
        the work tree yet."""
        files = pointer_files(self.cwd, None, None)  # from the index; the work tree is empty
        for f in files:
            self.content.names.setdefault(f.pointer.xet_hash, f.path)
        left_out = {f.path for f in files}
        paths = [p for p in process.index_paths(self.cwd) if p not in left_out]
        if only_missing:
            paths = [p for p in paths if not os.path.lexists(os.path.join(self.cwd, p))]
        process.checkout_index(self.cwd, paths)
        return files

    def checkout_pointer_text(self, paths: Sequence[str]) -> None:
        """git writes the pointer text of the pointer files ``paths`` (as its index names
        them) into the work tree, over whatever is there."""
        process.checkout_index(self.cwd, paths)

    def materialize(
        self,
        files: Sequence[PointerFile],
        remote: str | None = None,
        progress: Progress | None = None,
        workers: int | None = None,
        *,
        absent: bool = False,
    ) -> int:
        """Replace pointer text in the work tree by content (:meth:`Materializer.materialize`)."""
        return self.materializer.materialize(files, remote, progress, workers, absent=absent)

    def dematerialize(self, files: Sequence[PointerFile]) -> int:
        """Put pointer text back in the work tree (:meth:`Materializer.dematerialize`)."""
        return self.materializer.dematerialize(files)

    # ---- where the data of history is (gitxet.repo.history) --------------------------------

    def ref_tips(self, all_refs: bool) -> list[str]:
        """HEAD's commit, or every local branch's and tag's (:meth:`History.ref_tips`)."""
        return self.history.ref_tips(all_refs)

    def history_pointers(self, revs: Sequence[str]) -> list[tuple[str, Pointer]]:
        """(path, pointer) of every pointer blob reachable from ``revs``, one per file."""
        return history_pointers(self.cwd, revs)

    def locate(
        self, found: Sequence[tuple[str, Pointer]], remote: str | None, *, ask_remote: bool
    ) -> list[DataLocation]:
        """Where each file's data is (:meth:`History.locate`)."""
        return self.history.locate(found, remote, ask_remote=ask_remote)

    def repair_push(
        self, remote: str, revs: Sequence[str], progress: Progress | None = None
    ) -> tuple[TransferSummary, list[DataLocation]]:
        """Upload what ``revs``' history has here and not on ``remote``
        (:meth:`History.repair_push`)."""
        return self.history.repair_push(remote, revs, progress)

    def unpushed(self, remote: str | None = None) -> int | None:
        """Files whose data an embedded remote lacks (:meth:`History.unpushed`)."""
        return self.history.unpushed(remote)

    def recent_refs(self, days: float, now: float | None = None) -> list[str]:
        """Commits of recent branch tips and the stash (:meth:`History.recent_refs`)."""
        return self.history.recent_refs(days, now)

    def files_to_keep(
        self, recent_days: float, commits: Sequence[str] = ()
    ) -> dict[str, set[bytes]]:
        """The files whose data a prune must keep, by reason (:meth:`History.files_to_keep`)."""
        return self.history.files_to_keep(recent_days, commits)
