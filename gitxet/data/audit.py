"""Where a file's data is, and whether a store is sound: what ``fsck``, ``status`` and the
repairing ``push`` ask.

A file is *local* when the store has a shard describing it and every xorb its terms name;
it is on a remote when the remote knows a shard for it (a remote's shards are accepted only
once their xorbs are there, so that is enough). :func:`verify_store` re-reads a whole store:
every xorb's footer must hash to its name and every chunk to its footer entry, every shard
must parse, be named by its hash and name only xorbs that are present.
:func:`verify_pointers` reads the files pointers name and checks their ``oid sha256``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gitxet.data.reconstruct import FileReader
from gitxet.data.transfer import CASRemote
from gitxet.errors import FormatError, GitxetError
from gitxet.formats import shard as shardfmt
from gitxet.formats.pointer import Pointer
from gitxet.hashing import chunk_hash, from_hex, to_hex
from gitxet.store.cas import LocalCAS

__all__ = [
    "DataLocation",
    "PointerMismatch",
    "StoreProblem",
    "StoreReport",
    "count_unpushed",
    "first_dangling",
    "is_local",
    "local_files",
    "locate",
    "missing_files",
    "on_remote",
    "verify_pointers",
    "verify_store",
]


#: files located, then read, at once by :func:`verify_pointers`
_BATCH = 1000


@dataclass(frozen=True, slots=True)
class DataLocation:
    """Where the data of a pointer file is: the local store, the remote (None: not asked)."""

    path: str
    pointer: Pointer
    local: bool
    remote: bool | None


@dataclass(frozen=True, slots=True)
class StoreProblem:
    """One damaged or inconsistent object of a store."""

    kind: str  # "xorb" or "shard"
    name: str  # hex
    reason: str


@dataclass(frozen=True, slots=True)
class StoreReport:
    """What :func:`verify_store` looked at and found."""

    xorbs: int
    shards: int
    problems: tuple[StoreProblem, ...]


@dataclass(frozen=True, slots=True)
class PointerMismatch:
    """A pointer file whose ``oid sha256`` is not the SHA-256 of the data it names, or
    whose ``size`` is not that data's size."""

    path: str
    pointer: Pointer
    actual: str  # the data's SHA-256, hex
    actual_size: int  # the data's size


def is_local(
    cas: LocalCAS, file_hash: bytes, remote_has: Callable[[bytes], bool] | None = None
) -> bool:
    """Whether ``cas`` alone can reconstruct the file (the empty file always can); with
    ``remote_has`` (whether a remote has a xorb), ``cas`` with the xorbs that remote
    already has: a file added in a clone of a server reuses the server's chunks, which
    the clone streams and never stores, and a push sends only the new ones."""
    if file_hash == bytes(32):
        return True
    info = cas.file_info(file_hash)
    return info is not None and all(
        cas.has_xorb(t.xorb_hash) or (remote_has is not None and remote_has(t.xorb_hash))
        for t in info.terms
    )


def xorbs_of(remote: CASRemote) -> Callable[[bytes], bool]:
    """``remote.has_xorb``, asking once per xorb (for :func:`is_local`).

    Raises:
        RemoteError: the remote could not be asked (when the callable is called).
    """
    known: dict[bytes, bool] = {}

    def has(xorb_hash: bytes) -> bool:
        if xorb_hash not in known:
            known[xorb_hash] = remote.has_xorb(xorb_hash)
        return known[xorb_hash]

    return has


def local_files(cas: LocalCAS, file_hashes: Iterable[bytes]) -> set[bytes]:
    """Those of ``file_hashes`` that :func:`is_local` says yes for, asked in batches
    (:meth:`LocalCAS.lacking_data`: each xorb looked for once, not once per file)."""
    wanted = [h for h in dict.fromkeys(file_hashes) if h != bytes(32)]
    lacking = set(cas.lacking_data(wanted))
    return {h for h in wanted if h not in lacking} | {bytes(32)}


def on_remote(remote: CASRemote, file_hash: bytes) -> bool:
    """Whether ``remote`` can serve the file.

    Raises:
        RemoteError: the remote could not be asked.
    """
    if file_hash == bytes(32):
        return True
    has_file: Callable[[bytes], bool] | None = getattr(remote, "has_file", None)
    if has_file is not None:
        return has_file(file_hash)
    return bool(remote.shards_for_file(file_hash))


def locate(
    cas: LocalCAS, remote: CASRemote | None, found: Sequence[tuple[str, Pointer]]
) -> list[DataLocation]:
    """Where the data of each ``(path, pointer)`` is; ``remote`` is asked only about the
    files ``cas`` lacks (and not at all when None)."""
    here = local_files(cas, [from_hex(ptr.xet_hash) for _, ptr in found])
    local = {ptr.xet_hash: from_hex(ptr.xet_hash) in here for _, ptr in found}
    gone: set[bytes] = set()
    if remote is not None:  # one batched question for all the files not here
        gone = missing_files(remote, [from_hex(x) for x, here in local.items() if not here])
        has = xorbs_of(remote)  # what is not on it may be here, reusing its chunks
        for x in [x for x, here in local.items() if not here and from_hex(x) in gone]:
            local[x] = is_local(cas, from_hex(x), has)
    return [
        DataLocation(
            path,
            ptr,
            local[ptr.xet_hash],
            None if local[ptr.xet_hash] or remote is None else from_hex(ptr.xet_hash) not in gone,
        )
        for path, ptr in found
    ]


def missing_files(remote: CASRemote, file_hashes: Sequence[bytes]) -> set[bytes]:
    """The files of ``file_hashes`` that ``remote`` cannot serve.

    One batched question when the remote has ``missing_files`` (the CAS client), else one
    :func:`on_remote` per file (the embedded store: an index lookup each).

    Raises:
        RemoteError: the remote could not be asked.
    """
    wanted = [h for h in dict.fromkeys(file_hashes) if h != bytes(32)]
    batch: Callable[[Sequence[bytes]], set[bytes]] | None = getattr(remote, "missing_files", None)
    if batch is not None:
        return batch(wanted)
    return {h for h in wanted if not on_remote(remote, h)}


def first_dangling(
    remote: CASRemote, found: Sequence[tuple[str, Pointer]]
) -> tuple[str, Pointer] | None:
    """The first ``(path, pointer)`` whose data ``remote`` does not have, else None."""
    gone = missing_files(remote, [from_hex(p.xet_hash) for _, p in found])
    return next(((path, p) for path, p in found if from_hex(p.xet_hash) in gone), None)


def count_unpushed(cas: LocalCAS, remote: CASRemote, found: Sequence[tuple[str, Pointer]]) -> int:
    """How many of the files have their data in ``cas`` but not on ``remote`` (asked
    :data:`_BATCH` files at a time: nothing held for all of them)."""
    count = 0
    for i in range(0, len(found), _BATCH):
        hashes = [from_hex(p.xet_hash) for _, p in found[i : i + _BATCH]]
        ours = local_files(cas, hashes)
        here = [h for h in hashes if h in ours]
        gone = missing_files(remote, here)
        count += sum(1 for h in here if h in gone)
    return count


def verify_store(cas: LocalCAS, progress: Callable[[int], None] | None = None) -> StoreReport:
    """Read and check every xorb and shard of ``cas``; ``progress`` gets bytes read."""
    problems: list[StoreProblem] = []
    xorbs = 0
    for x in cas.xorb_hashes():
        xorbs += 1
        try:
            body = cas.xorb_body(x, verify=True)
        except GitxetError as exc:
            problems.append(StoreProblem("xorb", to_hex(x), _reason(exc)))
            continue
        if progress is not None:
            progress(len(body))
    shards = 0
    for name in cas.shard_names():
        shards += 1
        problem = _check_shard(cas, name)
        if problem is not None:
            problems.append(StoreProblem("shard", name, problem))
    return StoreReport(xorbs, shards, tuple(problems))


def verify_pointers(
    cas: LocalCAS,
    found: Sequence[tuple[str, Pointer]],
    progress: Callable[[int], None] | None = None,
) -> list[PointerMismatch]:
    """The pointers of ``found`` whose ``oid sha256`` or ``size`` is not that of their
    data: each file the store holds is read once (however many pointers name it) and
    hashed; files not here, or whose data is damaged (:func:`verify_store` reports that),
    are skipped."""
    by_file: dict[str, list[tuple[str, Pointer]]] = {}
    for path, ptr in found:
        by_file.setdefault(ptr.xet_hash, []).append((path, ptr))
    out: list[PointerMismatch] = []
    todo = list(by_file.items())
    for i in range(0, len(todo), _BATCH):  # located then read batch by batch: see local_files
        batch = todo[i : i + _BATCH]
        here = local_files(cas, [from_hex(x) for x, named in batch if named[0][1].size])
        for xet_hex, named in batch:
            out.extend(_check_pointers(cas, xet_hex, named, here, progress))
    return out


def _check_pointers(
    cas: LocalCAS,
    xet_hex: str,
    named: list[tuple[str, Pointer]],
    here: set[bytes],
    progress: Callable[[int], None] | None,
) -> list[PointerMismatch]:
    """The pointers of ``named`` (all naming the file ``xet_hex``) its data belies."""
    fhash = from_hex(xet_hex)
    size = 0
    if named[0][1].size == 0:
        actual = hashlib.sha256().hexdigest()
    elif fhash not in here:
        return []
    else:
        try:
            sha = hashlib.sha256()
            for block in FileReader(cas, fhash).iter_blocks():
                sha.update(block)
                size += len(block)
                if progress is not None:
                    progress(len(block))
        except GitxetError:  # damaged or gone: verify_store says so
            return []
        actual = sha.hexdigest()
    return [
        PointerMismatch(p, ptr, actual, size)
        for p, ptr in named
        if ptr.sha256 != actual or ptr.size != size
    ]


def _check_shard(cas: LocalCAS, name: str) -> str | None:
    try:
        data = cas.shard_bytes(name)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if to_hex(chunk_hash(data)) != name:
        return "content does not match its name"
    try:
        shard = shardfmt.parse_shard(data)
    except FormatError as exc:
        return _reason(exc)
    missing = _missing_xorbs(cas, shard)
    for x in missing:
        kept = cas.quarantined(x)
        if kept is not None:
            return (
                f"names xorb {to_hex(x)}, which was found corrupt and set aside in {kept}; "
                "get it again with 'git xet fetch' (or 'git xet checkout') from a remote that "
                "has it, or upload it there first with 'git xet push' from a clone that has it"
            )
    if missing:
        return f"names xorb {to_hex(missing[0])}, which is not in the store"
    return None


def _missing_xorbs(cas: LocalCAS, shard: shardfmt.Shard) -> list[bytes]:
    """The xorbs the shard brought into the store that are not there.

    Only its CAS blocks count: a xorb made here is listed in the CAS block of the shard
    that stored it (and checked with that shard); a term naming a xorb no local CAS block
    lists points into a CAS server's data (dedup against the server: ``data.dedup``)."""
    named: Iterable[bytes] = {x.xorb_hash for x in shard.xorbs}
    return sorted(x for x in named if not cas.has_xorb(x))


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
