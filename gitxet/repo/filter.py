"""git's clean/smudge filter: what git stores for a file's content (the content itself, or
a pointer to the data ingested into the local store) and what it checks out for a pointer.

``git add`` and ``git checkout`` run it (through :mod:`gitxet.git.filter_protocol`), and so
do ``git xet add`` and ``git xet checkout``: one code path for both.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import BinaryIO

from gitxet.data.clean import Hashed, Ingestor, IngestResult, hash_small
from gitxet.data.dedup import RemoteDedup
from gitxet.data.staging import STAGE_MAX, StagedIngest
from gitxet.data.staging import recover as recover_staged
from gitxet.dataset import chunk_source_of
from gitxet.errors import ConfigError, GitError, GitxetError
from gitxet.formats.pointer import MAX_POINTER_SIZE, Pointer
from gitxet.git import process
from gitxet.git.checkattr import AttrQuery
from gitxet.git.filter_protocol import NO_META, SmudgeMeta
from gitxet.git.readahead import CleanReadahead
from gitxet.git.xetconfig import THRESHOLD_KEY, Setting, is_never_pointer, read_setting
from gitxet.hashing import from_hex, to_hex
from gitxet.repo.content import Content
from gitxet.repo.materialize import MaterializedRecords
from gitxet.repo.pointers import pointer_files, try_pointer
from gitxet.settings import parse_size
from gitxet.util.streams import Chained, read_up_to

__all__ = ["DEFAULT_THRESHOLD", "FilterHandler"]

#: Files at least this big become pointers when ``xet.threshold`` is not configured.
DEFAULT_THRESHOLD = 256 * 1024


class FilterHandler:
    """The clean/smudge handler of the repository whose git commands run in ``cwd``
    (``worktree``: its work tree, None when bare), storing into ``content``'s store.

    ``lazy``: smudge leaves pointer text (``xet.lazy``). ``stats_path``: a file each clean
    appends a JSON line to (size, new and reused bytes), for benchmarks.
    """

    def __init__(
        self,
        cwd: str,
        worktree: Path | None,
        content: Content,
        records: MaterializedRecords,
        *,
        lazy: bool = False,
        stats_path: str | None = None,
    ) -> None:
        self.cwd = cwd
        self.worktree = worktree
        self.content = content
        self.cas = content.cas
        self.records = records
        self.lazy = lazy
        self._stats_path = stats_path
        self._lock = threading.Lock()
        self._threshold: int | None = None
        self._attrs: AttrQuery | None = None
        self._delay_ok: bool | None = None
        self._staged: StagedIngest | None = None
        self._readahead: CleanReadahead[Hashed] | None = None
        self._recovered = False  # dead sessions' journals stored by this process
        self._dedup: RemoteDedup | bool | None = None  # False: no CAS server to dedup with
        # what the versions of paths are read with during :meth:`staging` (a ``git add``:
        # the paths' pointers in HEAD and the index only hint dedup, so git's index being
        # read once, when the session starts, is fine)
        self._catfile: process.CatFile | None = None

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

    def _attr_query(self) -> AttrQuery:
        with self._lock:
            if self._attrs is None:
                self._attrs = AttrQuery(self.cwd, ["xet"])
            return self._attrs

    def _always_pointer(self, path: str) -> bool:
        """Whether git's attributes mark ``path`` ``xet=always`` (``git xet track``)."""
        if not path or self.worktree is None:
            return False
        return self._attr_query().get(path).get("xet") == "always"

    def starting(self, command: str, pathname: str) -> None:
        """git is about to send ``pathname``'s content to clean: ask git for its attributes
        now, so the answer comes while the content streams in (a round trip to ``git
        check-attr`` per file was ~10% of a small-file ``git add``)."""
        if command != "clean" or self.worktree is None or not pathname:
            return
        if self._readahead is not None:
            self._readahead.saw(pathname)
        if is_never_pointer(pathname) or self.threshold <= 0:
            return  # no attribute question will be asked
        self._attr_query().prefetch(pathname)

    def _attrs_ahead(self, files: list[tuple[str, int]]) -> None:
        """Ask git about the attributes of files read ahead (those below the threshold, the
        only ones asked about), so a clean finds the answer there."""
        threshold = self.threshold
        if threshold > 0:
            paths = (p for p, n in files if n < threshold and not is_never_pointer(p))
            self._attr_query().ask_ahead(paths)

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
        with self._lock, open(self._stats_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def clean_stream(self, src: BinaryIO, path: str = "") -> tuple[bytes, IngestResult | None]:
        """What git stores for content ``src``: the content itself (small files, pointers)
        or a pointer to the ingested data (and what the ingest stored)."""
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
        if not head:
            # an empty file is its own pointer, as in git-lfs: git never runs the clean
            # filter on an empty work-tree file when it diffs, so a pointer for one shows
            # as a change in `git diff` forever after
            return b"", None
        if len(head) <= MAX_POINTER_SIZE and try_pointer(head) is not None:
            return head, None  # an unmaterialized pointer stays a pointer
        if len(head) < self.threshold and not self._always_pointer(path):
            return head, None
        dedup = self.dedup_for(path)
        staged = self._staged
        if staged is not None:
            staged.dedup = dedup
            ra = self._readahead
            hashed = None if ra is None or not path else partial(ra.take, path)
            result = staged.add(src, head, hashed)
        else:
            if not self._recovered:
                # what a dead filter session journaled is stored first, so this file finds
                # those chunks (git re-cleans racily clean files with the one-shot filter)
                self.recover_staged()
            if len(head) <= STAGE_MAX:  # in memory: an unchanged file is known by its hash
                head += read_up_to(src, STAGE_MAX + 1 - len(head))
            with Ingestor(self.cas, dedup=dedup) as ing:
                if len(head) <= STAGE_MAX:
                    result = ing.add_bytes(head)
                else:
                    result = ing.add_stream(io.BufferedReader(Chained(head, src), 8 << 20))
                ing.flush()
        self._record(path, result)
        ptr = Pointer(sha256=result.sha256, size=result.size, xet_hash=to_hex(result.file_hash))
        return ptr.encode(), result

    def dedup_for(self, path: str = "") -> RemoteDedup | None:
        """Dedup against the default remote when it is a CAS server (None otherwise), having
        told of the files ``path`` names in ``HEAD`` and in the index: the version an edit
        starts from, whose chunks it learns when the content differs (see
        :mod:`gitxet.data.dedup`)."""
        remotes = self.content.remotes
        if self._dedup is None:
            self._dedup = False
            with contextlib.suppress(GitxetError):
                name = remotes.default()
                if name is not None and remotes.is_server(name):
                    src = chunk_source_of(remotes.open(name))
                    if src is not None and hasattr(src, "query_chunk"):
                        self._dedup = RemoteDedup(src)  # type: ignore[arg-type]
        dedup = self._dedup
        if not isinstance(dedup, RemoteDedup):
            return None
        versions: list[bytes] = []
        if path:
            session = self._catfile  # a filter session's (a process per file: ~3 ms each)
            with contextlib.nullcontext(session) if session else process.CatFile(self.cwd) as cf:
                for spec in (f"HEAD:{path}", f":{path}"):
                    try:
                        kind, data = cf.read(spec, max_size=MAX_POINTER_SIZE)
                    except GitError:  # a new path, no HEAD yet, a blob too big to be a pointer
                        continue
                    ptr = try_pointer(data) if kind == "blob" else None
                    if ptr is not None and ptr.size:
                        versions.append(from_hex(ptr.xet_hash))
        dedup.versions(versions)  # asked for when an edit needs them, not for a same file
        return dedup

    @contextlib.contextmanager
    def staging(self) -> Iterator[StagedIngest]:
        """Batch the cleans done inside: small files share xorbs and the store is written
        per batch, each staged file's bytes journaled first (see ``data.staging``), and the
        work-tree files git will clean next are read ahead, the first few of them chunked
        and hashed ahead on another core (``git.readahead``). What a
        dead earlier session left is stored first."""
        self.recover_staged()
        if self.worktree is not None:
            self._readahead = CleanReadahead(
                self.worktree, prepare=hash_small, told=self._attrs_ahead
            )
        self._catfile = process.CatFile(self.cwd)
        try:
            with StagedIngest(self.cas) as staged:
                self._staged = staged
                try:
                    yield staged
                finally:
                    self._staged = None
        finally:
            ra, self._readahead = self._readahead, None
            if ra is not None:
                ra.close()
            cf, self._catfile = self._catfile, None
            if cf is not None:
                cf.close()

    def recover_staged(self) -> int:
        """Store the data journaled by filter sessions that died; returns a file count."""
        n = recover_staged(self.cas)
        self._recovered = True
        return n

    def clean(self, pathname: str, src: BinaryIO, dst: BinaryIO) -> None:
        """git's clean: ``src`` (the work tree's content) to ``dst`` (what git stores)."""
        out, _ = self.clean_stream(src, pathname)
        dst.write(out)

    def smudge(
        self, pathname: str, src: BinaryIO, dst: BinaryIO, meta: SmudgeMeta = NO_META
    ) -> None:
        """git's smudge: a pointer blob to its content (pointer text when ``lazy``);
        anything else passes through untouched."""
        head = read_up_to(src, MAX_POINTER_SIZE + 1)
        # a file git reads itself is never content (a hostile '.gitmodules filter=xet')
        ptr = None if is_never_pointer(pathname) else try_pointer(head)
        if ptr is None:  # not ours: pass it through untouched
            dst.write(head)
            while chunk := src.read(1 << 20):
                dst.write(chunk)
            return
        if self.lazy:
            dst.write(head)
            return
        if meta.treeish and self.can_delay(pathname):
            # a checkout from a server (a clone): more files than git delays are coming
            self.content.expect_checkout(meta.treeish, partial(self._pointers_of, meta.treeish))
        self.content.write(ptr, dst, ref=meta.ref, commit=meta.treeish, path=pathname)

    def _pointers_of(self, treeish: str) -> list[Pointer]:
        """The pointers of a commit's tree, in git's order (what its checkout writes)."""
        return [f.pointer for f in pointer_files(self.cwd, None, treeish)]

    def delayed(self, pathname: str, head: bytes, meta: SmudgeMeta = NO_META) -> None:
        """A smudge git agreed to delay: its pointer's description is asked for with those
        of the others (:meth:`Content.expect`), one request for many."""
        ptr = try_pointer(head)
        if ptr is not None and not self.lazy:
            self.content.expect(ptr)

    def can_delay(self, pathname: str) -> bool:
        """Whether git may delay this smudge (fetched in parallel, spooled): only when
        some remote is a server (network-bound); local data streams faster inline."""
        remotes = self.content.remotes
        if self._delay_ok is None:
            self._delay_ok = any(remotes.is_server(n) for n in remotes.names())
        return self._delay_ok
