"""Use cases of a gitxet repository: the one place where git, store, remotes and the engine meet.

:class:`XetRepo` is also the git filter's handler (clean/smudge), so ``git add`` and
``git checkout`` go through the same code as ``git xet add`` and ``git xet checkout``.

The local store lives in ``<git dir>/xet``. Data the store lacks comes from the git remotes
(:mod:`gitxet.dataset` resolves them and decides the order they are asked in).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from gitxet.data.audit import DataLocation, count_unpushed, locate
from gitxet.data.clean import Ingestor, IngestResult
from gitxet.data.dedup import RemoteDedup
from gitxet.data.staging import StagedIngest
from gitxet.data.staging import recover as recover_staged
from gitxet.data.transfer import CASRemote, LocalDirRemote, TransferSummary
from gitxet.dataset import (
    Remotes,
    chunk_source_of,
)
from gitxet.errors import (
    ConfigError,
    GitError,
    GitObjectNotFoundError,
    GitxetError,
)
from gitxet.formats.pointer import MAX_POINTER_SIZE, Pointer
from gitxet.git import process
from gitxet.git.checkattr import AttrQuery
from gitxet.git.filter_protocol import NO_META, SmudgeMeta
from gitxet.git.xetconfig import THRESHOLD_KEY, Setting, is_never_pointer, read_setting
from gitxet.hashing import from_hex, to_hex
from gitxet.repo.content import Content, Progress
from gitxet.repo.materialize import MaterializedRecords, Materializer
from gitxet.repo.pointers import (
    PointerFile,
    history_pointers,
    paths_in_history,
    pointer_files,
    try_pointer,
)
from gitxet.settings import (
    parse_bool,
    parse_size,
)
from gitxet.store.cas import LocalCAS
from gitxet.util.streams import Chained, read_up_to

if TYPE_CHECKING:
    pass

DEFAULT_THRESHOLD = 256 * 1024


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
        self.git_dir = Path(process.git_dir(path)).resolve()
        try:
            self.worktree: Path | None = Path(process.toplevel(path)).resolve()
        except GitError:
            self.worktree = None  # bare
        self.cwd = str(self.worktree or self.git_dir)
        self.cas = LocalCAS(str(self.git_dir / "xet"))
        self._threshold: int | None = None
        self._attrs: AttrQuery | None = None
        if lazy is None:
            lazy = parse_bool(self._config("xet.lazy") or "", "xet.lazy")
        self.lazy = lazy
        self._stats_path = stats_path
        self._stats_lock = threading.Lock()
        self.remotes = Remotes(self.cwd, remote_factory)
        self._delay_ok: bool | None = None
        self.content = Content(self.cas, self.remotes)
        self._paths_by_hash = self.content.names
        self._staged: StagedIngest | None = None
        self._recovered = False  # dead sessions' journals stored by this process
        self._dedup: RemoteDedup | bool | None = None  # False: no CAS server to dedup with
        self.records = MaterializedRecords(self.cas)
        self.materializer = Materializer(
            self.git_dir, self.worktree, self.cwd, self.content, self.records
        )

    @property
    def threshold(self) -> int:
        """Files at least this big become pointers (``.xetconfig``, see
        :mod:`gitxet.git.xetconfig`; read on first use: a checkout never needs it)."""
        if self._threshold is None:
            found = self.threshold_setting()
            try:
                self._threshold = parse_size(found.value) if found else DEFAULT_THRESHOLD
            except ConfigError as exc:
                where = found.source if found else "the default"
                raise ConfigError(f"xet.threshold in {where}: {exc}") from None
        return self._threshold

    @threshold.setter
    def threshold(self, value: int) -> None:
        self._threshold = value

    def threshold_setting(self) -> Setting | None:
        """The configured threshold and where it comes from (None: the default)."""
        return read_setting(self.cwd, self.worktree, THRESHOLD_KEY)

    def _always_pointer(self, path: str) -> bool:
        """Whether git's attributes mark ``path`` ``xet=always`` (``git xet track``)."""
        if not path or self.worktree is None:
            return False
        with self._stats_lock:
            if self._attrs is None:
                self._attrs = AttrQuery(self.cwd, ["xet"])
            attrs = self._attrs
        return attrs.get(path).get("xet") == "always"

    def _config(self, key: str) -> str | None:
        return process.config_get(self.cwd, key)

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

    # ---- filter handler ------------------------------------------------------------------

    def _record(self, path: str, result: IngestResult) -> None:
        if self._stats_path is None:
            return
        line = json.dumps(
            {
                "path": path,
                "size": result.size,
                "new": result.new_bytes,
                "reused": result.reused_bytes,
            }
        )
        with self._stats_lock, open(self._stats_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def clean_stream(self, src: BinaryIO, path: str = "") -> tuple[bytes, IngestResult | None]:
        """What git stores for content ``src``: the content itself (small files, pointers)
        or a pointer to the ingested data."""
        if is_never_pointer(path):  # git reads these itself, in every clone
            return b"".join(iter(lambda: src.read(1 << 20), b"")), None
        known = self.records.pointer_for(self.worktree, path)
        if known is not None:
            # a file we wrote from this pointer and nobody touched since: its content is
            # the pointer's, so skip re-chunking it (git re-cleans it after a checkout)
            while src.read(8 << 20):
                pass
            return known, None
        head = read_up_to(src, max(self.threshold, MAX_POINTER_SIZE + 1))
        if len(head) <= MAX_POINTER_SIZE and try_pointer(head) is not None:
            return head, None  # an unmaterialized pointer stays a pointer
        if len(head) < self.threshold and not self._always_pointer(path):
            return head, None
        dedup = self.dedup_for(path)
        staged = self._staged
        if staged is not None:
            staged.dedup = dedup
            result = staged.add(src, head)
        else:
            if not self._recovered:
                # what a dead filter session journaled is stored first, so this file finds
                # those chunks (git re-cleans racily clean files with the one-shot filter)
                self.recover_staged()
            with Ingestor(self.cas, dedup=dedup) as ing:
                result = ing.add_stream(io.BufferedReader(Chained(head, src), 8 << 20))
                ing.flush()
        self._record(path, result)
        ptr = Pointer(sha256=result.sha256, size=result.size, xet_hash=to_hex(result.file_hash))
        return ptr.encode(), result

    def dedup_for(self, path: str = "") -> RemoteDedup | None:
        """Dedup against the default remote when it is a CAS server (None otherwise), having
        learned the chunks of the file ``path`` names in ``HEAD`` and in the index: the
        version an edit starts from (see :mod:`gitxet.data.dedup`)."""
        if self._dedup is None:
            self._dedup = False
            with contextlib.suppress(GitxetError):
                name = self.remotes.default()
                if name is not None and self.remotes.is_server(name):
                    src = chunk_source_of(self.remotes.open(name))
                    if src is not None and hasattr(src, "query_chunk"):
                        self._dedup = RemoteDedup(src)  # type: ignore[arg-type]
        dedup = self._dedup
        if not isinstance(dedup, RemoteDedup):
            return None
        if path:
            with process.CatFile(self.cwd) as cf:
                for spec in (f"HEAD:{path}", f":{path}"):
                    try:
                        kind, data = cf.read(spec, max_size=MAX_POINTER_SIZE)
                    except GitError:  # a new path, no HEAD yet, a blob too big to be a pointer
                        continue
                    ptr = try_pointer(data) if kind == "blob" else None
                    if ptr is not None and ptr.size:
                        dedup.add_file(from_hex(ptr.xet_hash))
        return dedup

    @contextlib.contextmanager
    def staging(self) -> Iterator[StagedIngest]:
        """Batch the cleans done inside: small files share xorbs and the store is written
        per batch, each staged file's bytes journaled first (see ``data.staging``). What a
        dead earlier session left is stored first."""
        self.recover_staged()
        with StagedIngest(self.cas) as staged:
            self._staged = staged
            try:
                yield staged
            finally:
                self._staged = None

    def recover_staged(self) -> int:
        """Store the data journaled by filter sessions that died; returns a file count."""
        n = recover_staged(self.cas)
        self._recovered = True
        return n

    def clean(self, pathname: str, src: BinaryIO, dst: BinaryIO) -> None:
        out, _ = self.clean_stream(src, pathname)
        dst.write(out)

    def smudge(
        self, pathname: str, src: BinaryIO, dst: BinaryIO, meta: SmudgeMeta = NO_META
    ) -> None:
        head = read_up_to(src, MAX_POINTER_SIZE + 1)
        ptr = try_pointer(head)
        if ptr is None:  # not ours: pass it through untouched
            dst.write(head)
            while chunk := src.read(1 << 20):
                dst.write(chunk)
            return
        if self.lazy:
            dst.write(head)
            return
        self.write_content(ptr, dst, ref=meta.ref, commit=meta.treeish, path=pathname)

    def can_delay(self, pathname: str) -> bool:
        # Delayed smudges run in parallel but are spooled; local data streams faster inline.
        # Only data behind a server (network-bound) is worth fetching in parallel.
        if self._delay_ok is None:
            self._delay_ok = any(self.remotes.is_server(n) for n in self.remotes.names())
        return self._delay_ok

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
            self._paths_by_hash.setdefault(ptr.xet_hash, path)
        return found

    def pointer_files(
        self, rev: str | None = "HEAD", paths: Sequence[str] = ()
    ) -> list[PointerFile]:
        """Pointer files of a revision (or of the index when ``rev`` is None)."""
        result = pointer_files(self.cwd, self.worktree, rev, paths)
        for f in result:
            self._paths_by_hash.setdefault(f.pointer.xet_hash, f.path)  # to name files in errors
        return result

    def unmatched_paths(self, paths: Sequence[str]) -> list[str]:
        """The pathspecs of ``paths`` (relative to the work tree's top) that match no file
        git's index names."""
        if not paths or process.index_matches(self.cwd, paths):
            return []
        return [p for p in paths if not process.index_matches(self.cwd, [p])]

    # ---- checkout ------------------------------------------------------------------------

    def materialize(
        self,
        files: Sequence[PointerFile],
        remote: str | None = None,
        progress: Progress | None = None,
        workers: int | None = None,
    ) -> int:
        """Replace pointer text in the work tree by content (:meth:`Materializer.materialize`)."""
        return self.materializer.materialize(files, remote, progress, workers)

    def dematerialize(self, files: Sequence[PointerFile]) -> int:
        """Put pointer text back in the work tree (:meth:`Materializer.dematerialize`)."""
        return self.materializer.dematerialize(files)

    # ---- where the data of history is (fsck, status, the repairing push) ---------------------

    def ref_tips(self, all_refs: bool) -> list[str]:
        """HEAD's commit, or (``all_refs``) that of every local branch and tag; [] if none."""
        if not all_refs:
            try:
                return [process.rev_parse(self.cwd, "HEAD")]
            except GitError:
                return []
        return process.ref_tips(self.cwd, ["refs/heads", "refs/tags"])

    def history_pointers(self, revs: Sequence[str]) -> list[tuple[str, Pointer]]:
        """(path, pointer) of every pointer blob reachable from ``revs``, one per file."""
        return history_pointers(self.cwd, revs)

    def locate(
        self, found: Sequence[tuple[str, Pointer]], remote: str | None, *, ask_remote: bool
    ) -> list[DataLocation]:
        """Where each file's data is (see :func:`gitxet.data.audit.locate`)."""
        return locate(self.cas, self.remote(remote) if ask_remote else None, found)

    def repair_push(
        self, remote: str, revs: Sequence[str], progress: Progress | None = None
    ) -> tuple[TransferSummary, list[DataLocation]]:
        """Upload every file of ``revs``' history whose data is here and not on ``remote``.

        Nothing is assumed from ``refs/remotes/*``: a ref pushed without its data (by a
        clone without the hook) is repaired. Returns what moved and the files whose data is
        neither here nor on the remote (nothing can upload those).
        """
        where = self.locate(self.history_pointers(revs), remote, ask_remote=True)
        missing = [d for d in where if not d.local and not d.remote]
        here = [d.pointer for d in where if d.local]
        return self.push_data(remote, here, progress=progress), missing

    def unpushed(self, remote: str | None = None) -> int | None:
        """Files of the local branches' history whose data is here and not on an embedded
        ``remote`` (what ``git xet push --all`` uploads); None for a server or no remote."""
        try:
            r = self.remote(remote)
        except ConfigError:
            return None
        if not isinstance(r, LocalDirRemote):
            return None
        return count_unpushed(self.cas, r, self.history_pointers(self.ref_tips(True)))

    def recent_refs(self, days: float, now: float | None = None) -> list[str]:
        """Commits of local and remote-tracking branches whose tip was committed in the last
        ``days`` days, and of ``refs/stash`` (git-lfs's "recent refs")."""
        import time

        cutoff = (time.time() if now is None else now) - days * 86400
        tips: list[str] = []
        for oid, when, ref in process.ref_dates(
            self.cwd, ["refs/heads", "refs/remotes", "refs/stash"]
        ):
            recent = when is not None and when >= cutoff
            if (recent or ref == "refs/stash") and not ref.endswith("/HEAD"):
                tips.append(oid)
        return list(dict.fromkeys(tips))

    def files_to_keep(
        self, recent_days: float, commits: Sequence[str] = ()
    ) -> dict[str, set[bytes]]:
        """The files (Xet hashes) whose data a prune must keep, by reason: ``checkout``
        (HEAD and the index), ``recent`` (trees of :meth:`recent_refs`), ``unpushed``
        (added by commits of local branches that no remote-tracking ref reaches: all of
        them without remotes), ``commits`` (the trees of ``commits``, e.g. mounted ones)."""

        def tree(rev: str | None) -> set[bytes]:
            return {from_hex(f.pointer.xet_hash) for f in self.pointer_files(rev)}

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
        unpushed = self.pointers_to_push(branches, (), "*") if branches else []
        keep["unpushed"] = {from_hex(p.xet_hash) for p in unpushed}
        keep["commits"] = trees(commits)
        return keep
