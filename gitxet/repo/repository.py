"""Use cases of a gitxet repository: the one place where git, store, remotes and the engine meet.

:class:`XetRepo` is also the git filter's handler (clean/smudge), so ``git add`` and
``git checkout`` go through the same code as ``git xet add`` and ``git xet checkout``.

The local store lives in ``<git dir>/xet``. Data the store lacks comes from the git remotes
(:mod:`gitxet.dataset` resolves them and decides the order they are asked in).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import json
import os
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, cast

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
    MaterializeError,
    UnsafePathError,
)
from gitxet.formats.pointer import MAX_POINTER_SIZE, Pointer
from gitxet.git import process
from gitxet.git.checkattr import AttrQuery
from gitxet.git.filter_protocol import NO_META, SmudgeMeta
from gitxet.git.index import Restat, blob_id, restat_entries
from gitxet.git.paths import unsafe_path
from gitxet.git.worktree import WorkTree
from gitxet.git.xetconfig import THRESHOLD_KEY, Setting, is_never_pointer, read_setting
from gitxet.hashing import from_hex, to_hex
from gitxet.repo.content import Content, Progress
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
from gitxet.util.atomic import atomic_writer, remove_stale_temps
from gitxet.util.streams import Chained, read_up_to

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

DEFAULT_THRESHOLD = 256 * 1024


class _Counting(io.RawIOBase):
    """Writes through to ``out`` and reports each write's size to ``advance``."""

    def __init__(self, out: BinaryIO, advance: Callable[[int], None]) -> None:
        self._out = out
        self._advance = advance

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:  # type: ignore[override]
        n = self._out.write(data)
        self._advance(n)
        return n


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
        self._materialized: tuple[tuple[int, int, int], dict[str, list[object]]] | None = None

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
        known = self._materialized_pointer(path)
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
        """Replace pointer text in the work tree by content, atomically per file.

        Files are written in parallel straight from the local store (no pipe through git),
        then their index entries get the new stat data, so git sees them unchanged without
        reading them back through the filter. Every file that can be written is; if some
        cannot, :class:`MaterializeError` names them afterwards (they stay pointers).
        """
        if self.worktree is None:
            raise GitError("a bare repository has no work tree to check out into")
        todo = [f for f in files if not f.materialized]
        # a run killed between writing a file and recording its stat leaves git thinking it
        # modified (the index still has the pointer's size): let git check those again
        self._refresh(self._stat_dirty([f.path for f in files if f.materialized]))
        if not todo:
            return 0
        head = self._head()  # the remotes holding HEAD are asked first
        with contextlib.suppress(GitxetError):
            # one batch fetch; a file whose data cannot be had fails below, by name
            self.ensure_local([f.pointer for f in todo], remote, commit=head)
        lock = threading.Lock()

        def advance(n: int) -> None:
            if progress is not None:
                with lock:
                    progress(n)

        tmp_dir = self._worktree_tmp_dir()
        modes, failed = self._named_by_index(todo)
        wt = WorkTree(self.worktree)

        def write_one(f: PointerFile) -> tuple[str, os.stat_result]:
            mode = _keep_mode(wt, f.path, modes[f.path])
            with wt.replace(f.path, mode=mode, tmp_dir=tmp_dir) as (out, st):
                self.write_content(
                    f.pointer,
                    cast(BinaryIO, _Counting(out, advance)),
                    remote,
                    commit=head,
                    path=f.path,
                )
            return f.path, st[0]

        # file creation is syscall-bound (the GIL is released): more writers than cores pay off
        n_workers = workers or min(8, len(todo))
        done: dict[str, os.stat_result] = {}
        by_path = {f.path: f for f in todo}
        # in store order: the writers then read each xorb front to back, and it is read
        # ahead of them (8 threads reading parts of one file defeat the kernel's read-ahead)
        ordered, ahead = self._store_order([f for f in todo if f.path in modes])

        def collect(
            finished: Iterable[concurrent.futures.Future[tuple[str, os.stat_result]]],
        ) -> None:
            for fut in finished:
                try:
                    path, st = fut.result()
                except (GitxetError, OSError) as exc:
                    failed.append((futures.pop(fut), exc))
                else:
                    futures.pop(fut)
                    done[path] = st

        futures: dict[concurrent.futures.Future[tuple[str, os.stat_result]], str] = {}
        with wt, concurrent.futures.ThreadPoolExecutor(n_workers, "gitxet-materialize") as pool:
            for f in ahead.pace(ordered):  # a bounded window in flight: read-ahead keeps pace
                while len(futures) >= 4 * n_workers:
                    finished, _ = concurrent.futures.wait(
                        futures, return_when=concurrent.futures.FIRST_COMPLETED
                    )
                    collect(finished)
                futures[pool.submit(write_one, f)] = f.path
            collect(list(concurrent.futures.as_completed(list(futures))))
        written = {
            path: [st.st_size, st.st_mtime_ns, st.st_ino, by_path[path].pointer.encode().decode()]
            for path, st in done.items()
        }
        self._remember_materialized(written)
        self._restat({path: (by_path[path].pointer, st) for path, st in done.items()})
        if failed:
            raise MaterializeError(sorted(failed, key=lambda item: item[0]))
        return len(done)

    def _store_order(self, files: list[PointerFile]) -> tuple[list[PointerFile], _ReadAhead]:
        """``files`` sorted by where their data is in the local store (xorb, first chunk),
        and a pacer that reads each xorb's needed chunks ahead as the writers reach it."""
        keyed: list[tuple[bytes, int, PointerFile]] = []
        spans: dict[bytes, list[int]] = {}
        for f in files:
            info = self.cas.file_info(from_hex(f.pointer.xet_hash)) if f.pointer.size else None
            if info is None or not info.terms:
                keyed.append((b"", 0, f))
                continue
            for t in info.terms:
                span = spans.setdefault(t.xorb_hash, [t.chunk_start, t.chunk_end])
                span[0], span[1] = min(span[0], t.chunk_start), max(span[1], t.chunk_end)
            first = info.terms[0]
            keyed.append((first.xorb_hash, first.chunk_start, f))
        keyed.sort(key=lambda k: (k[0], k[1]))
        return [f for _, _, f in keyed], _ReadAhead(self.cas, [k[0] for k in keyed], spans)

    def _named_by_index(
        self, files: Sequence[PointerFile]
    ) -> tuple[dict[str, int], list[tuple[str, BaseException]]]:
        """Which of ``files`` may be written: those git's index names, as that very pointer
        blob, at a path the path rule accepts (path -> git mode); the others, refused."""
        index = process.index_files(self.cwd)
        fmt = process.object_format(self.cwd)
        modes: dict[str, int] = {}
        refused: list[tuple[str, BaseException]] = []
        for f in files:
            entry = index.get(f.path)
            reason = unsafe_path(os.fsencode(f.path))
            if reason is None and (
                entry is None or entry[1] != blob_id(f.pointer.encode(), fmt).hex()
            ):
                reason = "git's index does not name this pointer file there"
            if reason is not None or entry is None:
                refused.append((f.path, UnsafePathError(f.path, reason or "")))
            else:
                modes[f.path] = entry[0]
        return modes, refused

    def _head(self) -> str | None:
        try:
            return process.rev_parse(self.cwd, "HEAD")
        except GitError:
            return None

    def _worktree_tmp_dir(self) -> str | None:
        """Where files bound for the work tree are written before their rename: inside the
        git dir, so a killed checkout leaves no stray file in the work tree. Leftovers of
        killed runs are removed here. None when the git dir is on another filesystem."""
        tmp = self.git_dir / "xet" / "tmp"
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            if tmp.stat().st_dev != self.worktree.stat().st_dev:  # type: ignore[union-attr]
                return None
        except OSError:
            return None
        remove_stale_temps(tmp, older_than=600)  # a live writer keeps its temp file fresh
        return str(tmp)

    def _restat(self, files: dict[str, tuple[Pointer, os.stat_result]]) -> None:
        """Tell git's index the new stat of files whose cleaned content is their pointer."""
        if not files:
            return
        fmt = process.object_format(self.cwd)
        want = {
            os.fsencode(path): Restat(blob_id(ptr.encode(), fmt), st)
            for path, (ptr, st) in files.items()
        }
        patched = restat_entries(self.git_dir, want)
        # whatever could not be patched in place (a busy or unusual index), git re-checks
        self._refresh([os.fsdecode(p) for p in want if p not in patched])

    # Files written by materialize(), by path: [size, mtime_ns, inode, pointer text]. A
    # clean of such a file with the same stat returns the pointer without re-chunking.
    def _materialized_path(self) -> Path:
        return self.git_dir / "xet" / "materialized.json"

    def _remember_materialized(self, written: dict[str, list[object]]) -> None:
        if not written:
            return
        with self.cas.lock("materialized"):
            records = self._load_materialized()
            records.update(written)
            with atomic_writer(str(self._materialized_path()), durable=False) as f:
                f.write(json.dumps(records).encode())

    def _load_materialized(self) -> dict[str, list[object]]:
        try:
            with open(self._materialized_path(), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _materialized_records(self) -> dict[str, list[object]]:
        """The records, parsed again only when the file changed (the filter process asks
        for every file it cleans)."""
        try:
            st = os.stat(self._materialized_path())
        except OSError:
            return {}
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        cached = self._materialized
        if cached is not None and cached[0] == key:
            return cached[1]
        records = self._load_materialized()
        self._materialized = (key, records)
        return records

    def _materialized_pointer(self, path: str) -> bytes | None:
        if not path or self.worktree is None:
            return None
        rec = self._materialized_records().get(path)
        if not isinstance(rec, list) or len(rec) != 4:
            return None
        try:
            with WorkTree(self.worktree) as wt:
                st = wt.lstat(path)
        except (OSError, UnsafePathError):
            return None
        if st is None or [st.st_size, st.st_mtime_ns, st.st_ino] != rec[:3]:
            return None
        ptr = try_pointer(str(rec[3]).encode())
        return ptr.encode() if ptr is not None and ptr.size == st.st_size else None

    def dematerialize(self, files: Sequence[PointerFile]) -> int:
        """Put pointer text back in the work tree (the data stays in the local store)."""
        if self.worktree is None:
            raise GitError("a bare repository has no work tree")
        todo = [f for f in files if f.materialized]
        modes, failed = self._named_by_index(todo)
        tmp_dir = self._worktree_tmp_dir()
        done: list[str] = []
        with WorkTree(self.worktree) as wt:
            for f in todo:
                if f.path not in modes:
                    continue
                mode = _keep_mode(wt, f.path, modes[f.path])
                try:
                    with wt.replace(f.path, mode=mode, tmp_dir=tmp_dir) as (out, _st):
                        out.write(f.pointer.encode())
                except (GitxetError, OSError) as exc:
                    failed.append((f.path, exc))
                else:
                    done.append(f.path)
        self._refresh(done)
        if failed:
            raise MaterializeError(sorted(failed, key=lambda item: item[0]))
        return len(done)

    def _stat_dirty(self, paths: Sequence[str]) -> list[str]:
        """Those of ``paths`` whose index stat no longer matches the work tree (no reads)."""
        if not paths:
            return []
        dirty = process.stat_changed(self.cwd)
        return [p for p in paths if p in dirty]

    def _refresh(self, paths: Sequence[str]) -> None:
        # stat info changed but the cleaned content did not: let git re-check it
        process.refresh_index(self.cwd, paths)

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


def _keep_mode(wt: WorkTree, path: str, git_mode: int) -> int:
    """Permission bits for a rewritten file: the existing regular file's, else git's."""
    with contextlib.suppress(OSError, UnsafePathError):
        st = wt.lstat(path)
        if st is not None and stat.S_ISREG(st.st_mode):
            return st.st_mode & 0o777
    return 0o755 if git_mode & 0o100 else 0o644


class _ReadAhead:
    """Hands out files in order and asks the store to read ahead the xorbs the next ones
    need (``LocalCAS.readahead``), at most two xorbs (~128 MiB) ahead of the writers."""

    def __init__(self, cas: LocalCAS, xorbs: list[bytes], spans: dict[bytes, list[int]]) -> None:
        self._cas = cas
        self._xorbs = xorbs
        self._spans = spans
        self._advised: set[bytes] = set()

    def pace(self, files: list[PointerFile]) -> Iterator[PointerFile]:
        order = list(dict.fromkeys(x for x in self._xorbs if x))
        where = {x: i for i, x in enumerate(order)}
        for i, f in enumerate(files):
            x = self._xorbs[i]
            if x:
                for y in order[where[x] : where[x] + 2]:  # this xorb and the next one
                    if y not in self._advised:
                        self._advised.add(y)
                        lo, hi = self._spans[y]
                        self._cas.readahead(y, lo, hi)
            yield f
