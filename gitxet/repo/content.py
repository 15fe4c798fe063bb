"""The data behind pointers: fetched from whichever remote has it, reconstructed into a
stream, uploaded to a remote. The local store first; the remotes in the order
:mod:`gitxet.dataset` decides."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import BinaryIO, NoReturn

from gitxet.data.reconstruct import ChunkSource, FileReader
from gitxet.data.sources import LayeredSource, describe_files
from gitxet.data.staging import recover as recover_staged
from gitxet.data.transfer import TransferSummary, push_files
from gitxet.dataset import Remotes, Search, chunk_source_of, fetch_from_any, source_with
from gitxet.errors import (
    DataUnavailableError,
    FileNotFoundInCASError,
    GitxetError,
    IntegrityError,
    NotFoundError,
    XorbNotFoundError,
)
from gitxet.formats.pointer import Pointer
from gitxet.hashing import from_hex
from gitxet.remote.protocol import MAX_FILE_SHARDS_BATCH
from gitxet.store.cas import LocalCAS

__all__ = ["Content", "Progress"]

#: Called with a byte count as data moves.
Progress = Callable[[int], None]
#: files remembered as about to be written (:meth:`Content.expect`)
_MAX_EXPECTED = 10_000
#: seconds a write waits for a batch of descriptions holding its file (then asks alone)
_DESCRIBE_WAIT = 120.0
#: SHA-256 of no bytes: the ``oid`` of every empty file's pointer
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


class Content:
    """The data of a repository's pointer files: its local store ``cas`` and ``remotes``.

    ``names`` maps Xet hashes to a path the file was seen at, so that errors name a file,
    not a hash (callers listing pointers add to it).
    """

    def __init__(self, cas: LocalCAS, remotes: Remotes) -> None:
        self.cas = cas
        self.remotes = remotes
        self.names: dict[str, str] = {}
        self._lock = threading.Lock()
        self._expected: dict[bytes, None] = {}  # files about to be written (ordered set)
        self._asking: dict[bytes, threading.Event] = {}  # files whose description is coming
        # a checkout's pointers, listed when a first file must be described by a server
        self._listed: set[str] = set()
        self._to_list: Callable[[], Iterable[Pointer]] | None = None
        self._listing = threading.Lock()
        self._upcoming: deque[bytes] = deque()  # files of the listed checkout, in its order

    def expect(self, ptr: Pointer) -> None:
        """A pointer that is about to be written (a smudge git delayed): when one of these
        files must be read from a CAS server, the descriptions of all of them are asked
        for together (one request per 1,000 files, not one per file)."""
        if not ptr.size:
            return
        h = from_hex(ptr.xet_hash)
        if self.cas.file_info(h) is not None:
            return
        with self._lock:
            self._expected[h] = None
            while len(self._expected) > _MAX_EXPECTED:
                del self._expected[next(iter(self._expected))]

    def expect_checkout(self, commit: str, pointers: Callable[[], Iterable[Pointer]]) -> None:
        """A checkout of ``commit`` is writing pointers (git smudges them one by one, and
        delays at most a few): when a first one must be described by a CAS server,
        ``pointers()`` lists the commit's, and their descriptions are asked for in batches
        ahead of the writes (one request per 1,000 files, not one per file)."""
        with self._lock:
            if commit in self._listed:
                return
            self._listed.add(commit)
            self._to_list = pointers

    def _list_checkout(self) -> None:
        """The pointers :meth:`expect_checkout` was told of, listed once (the other writers
        wait for the list). Only a hint: a listing that fails lists nothing."""
        with self._listing:
            with self._lock:
                to_list, self._to_list = self._to_list, None
            if to_list is None:
                return
            try:
                hashes = [from_hex(p.xet_hash) for p in to_list() if p.size]
            except GitxetError:
                return
            with self._lock:
                self._upcoming.extend(dict.fromkeys(hashes))

    def _describe_with_expected(
        self, fhash: bytes, remote: str | None, ref: str | None, commit: str | None
    ) -> None:
        """Before a file is read from a server: its description and those of the files
        :meth:`expect` was told of, in one batch (a file whose description another batch
        is fetching waits for that one). Only a hint: failures are the read's to report."""
        with self._lock:
            coming = self._asking.get(fhash)
            if coming is None:
                batch = [fhash] + [h for h in self._expected if h != fhash]
                batch = [h for h in batch[:MAX_FILE_SHARDS_BATCH] if h not in self._asking]
                for h in batch:
                    self._expected.pop(h, None)
                upcoming = self._upcoming
                taken = set(batch)
                while upcoming and len(batch) < MAX_FILE_SHARDS_BATCH:
                    h = upcoming.popleft()
                    if h not in taken and h not in self._asking:
                        batch.append(h)
                        taken.add(h)
                done = threading.Event()
                self._asking.update(dict.fromkeys(batch, done))
        if coming is not None:
            coming.wait(_DESCRIBE_WAIT)
            return
        try:
            rest = batch
            for name in self.remotes.search_order(remote, ref=ref, commit=commit):
                if not rest:
                    break
                if not self.remotes.is_server(name):
                    continue
                with contextlib.suppress(GitxetError):
                    src = chunk_source_of(self.remotes.open(name))
                    if src is not None:
                        known = describe_files(src, rest, keep=False)
                        rest = [h for h in rest if h not in known]
        finally:
            with self._lock:
                for h in batch:
                    self._asking.pop(h, None)
            done.set()

    def ensure_local(
        self,
        pointers: Iterable[Pointer],
        remote: str | None = None,
        progress: Progress | None = None,
        *,
        commit: str | None = None,
        warm: bool = False,
    ) -> TransferSummary | None:
        """Fetch whatever the local store lacks to reconstruct ``pointers``, from whichever
        remote has it (``remote`` first, then the others; ``commit``: where they are from).

        From a CAS server nothing is copied into the store: the files' descriptions are
        fetched (a file no remote has fails now, by name) and their data streams from the
        server when the files are written (:meth:`write`); with ``warm`` the data is
        fetched into the shared node cache now (``git xet fetch``).

        Raises:
            DataUnavailableError: some file's data is on no remote (naming those tried).
        """
        missing = self.cas.lacking_data(from_hex(p.xet_hash) for p in pointers if p.size)
        if not missing:
            return None
        order = self.remotes.search_order(remote, commit=commit)
        return fetch_from_any(
            self.cas, self.remotes, order, missing, progress, self.names, warm=warm
        )

    def write(
        self,
        ptr: Pointer,
        dst: BinaryIO,
        remote: str | None = None,
        *,
        ref: str | None = None,
        commit: str | None = None,
        path: str | None = None,
    ) -> None:
        """Reconstruct a pointer's content into ``dst``, fetching it first if needed from
        whichever remote has it (``remote``, then the remote of ``ref``/``commit``, then
        the others). Every chunk is verified on the way.

        Raises:
            DataUnavailableError: no remote has the data (naming those tried).
            IntegrityError: the data found is not the size or the SHA-256 the pointer
                says (``dst`` then holds bytes the caller must throw away).
        """
        if ptr.size == 0:
            if ptr.sha256 != EMPTY_SHA256:
                raise IntegrityError(
                    "file", ptr.xet_hash, f"is empty, its pointer says sha256 {ptr.sha256}"
                )
            return
        fhash = from_hex(ptr.xet_hash)
        source: ChunkSource = self.cas
        info = self.cas.file_info(fhash)
        here = info is not None and self.cas.has_file_data(fhash)
        if info is not None and not here:
            # a xorb quarantined as damaged: fetched again from a path remote that has it
            with contextlib.suppress(GitxetError):
                if any(not self.remotes.is_server(n) for n in self.remotes.names()):
                    self.ensure_local([ptr], remote, commit=commit)
                    here = self.cas.has_file_data(fhash)
        if info is not None and not here:
            # added here against a server's data (dedup): the rest of its bytes are there
            source = self.with_servers(self.remotes.search_order(remote, ref=ref, commit=commit))
        elif info is None:
            if self._to_list is not None or self._listing.locked():
                # (a listing under way: waited for, or this file would be described alone;
                # 56 were in a plain git clone of 100,000 files, listed in a few seconds)
                self._list_checkout()
            if self._expected or self._asking or self._upcoming:  # descriptions in batches
                self._describe_with_expected(fhash, remote, ref, commit)
            search = Search([("this repository's store", "does not have it")], [])
            order = self.remotes.search_order(remote, ref=ref, commit=commit)
            found = source_with(self.cas, self.remotes, order, fhash, search)
            if found is None:
                raise search.error(ptr.xet_hash, path or self.names.get(ptr.xet_hash))
            source = found
        reader = FileReader(source, fhash, copy=True)  # its terms checked by the copy
        if reader.size != ptr.size:
            raise IntegrityError(
                "file", ptr.xet_hash, f"is {reader.size} bytes, pointer says {ptr.size}"
            )
        reader.copy_to(dst, sha256=ptr.sha256)  # the pointer's oid too, hashed as written

    def with_servers(self, order: Sequence[str]) -> ChunkSource:
        """The local store, then the CAS servers of the remotes ``order`` names (those that
        cannot be opened are left out), as one source."""
        layers: list[ChunkSource] = [self.cas]
        for name in order:
            if self.remotes.is_server(name):
                with contextlib.suppress(GitxetError):
                    src = chunk_source_of(self.remotes.open(name))
                    if src is not None:
                        layers.append(src)
        return LayeredSource(layers)

    def push(
        self, remote: str, pointers: Iterable[Pointer], progress: Progress | None = None
    ) -> TransferSummary:
        """Upload the data behind ``pointers`` to ``remote``'s CAS (what dead filter
        sessions journaled is stored first). Data this clone reads from another remote (a
        clone of a server streams its files from there) is copied here first.

        Raises:
            NotFoundError: a file's data is neither in the local store nor on another
                remote (named by path when known).
        """
        hashes = [from_hex(p.xet_hash) for p in pointers if p.size]
        recover_staged(self.cas)
        target = self.remotes.open(remote)
        try:
            return push_files(self.cas, target, hashes, progress=progress)
        except (FileNotFoundInCASError, XorbNotFoundError) as exc:
            got, failed = self._copy_from_others(remote, hashes)
            if not got:
                self._raise_missing(exc, failed)
        try:
            return push_files(self.cas, target, hashes, progress=progress)
        except (FileNotFoundInCASError, XorbNotFoundError) as exc:
            self._raise_missing(exc, failed)

    def copy_from_others(self, remote: str, hashes: Sequence[bytes]) -> set[bytes]:
        """Copy into the local store the files of ``hashes`` whose data it lacks, from the
        remotes other than ``remote`` (servers included: a push must send the xorbs);
        returns the files whose data is here now and was not before."""
        return self._copy_from_others(remote, hashes)[0]

    def _copy_from_others(
        self, remote: str, hashes: Sequence[bytes]
    ) -> tuple[set[bytes], DataUnavailableError | None]:
        """:meth:`copy_from_others`, and the error naming what some remote could not give."""
        lacking = [h for h in dict.fromkeys(hashes) if not self.cas.has_file_data(h)]
        target = self.remotes.url(remote)
        others = [n for n in self.remotes.search_order() if self.remotes.url(n) != target]
        if not lacking or not others:
            return set(), None
        failed = None
        try:
            fetch_from_any(
                self.cas, self.remotes, others, lacking, None, self.names, into_store=True
            )
        except DataUnavailableError as e:  # what no remote gave fails in the push
            failed = e
        return {h for h in lacking if self.cas.has_file_data(h)}, failed

    def _raise_missing(
        self, exc: NotFoundError, failed: DataUnavailableError | None = None
    ) -> NoReturn:
        """A push's missing data as one error naming the file (when its path is known);
        ``failed`` instead when a remote that may have it could not be asked (a refused
        token, a server down): its message names that remote and why."""
        if failed is not None and failed.causes:
            raise failed
        hx = getattr(exc, "file_hex", None)
        path = self.names.get(hx) if isinstance(hx, str) else None
        if path is None or not isinstance(hx, str):
            raise exc
        raise NotFoundError(
            f"{path}: its data is not in this repository's store (xet hash "
            f"{hx[:16]}...) nor on another remote: it was committed as a pointer without "
            "being added here; add the file's content again, or fetch it first"
        ) from None
