"""Moving xorbs and shards between the local store and a CAS remote (push and fetch).

A remote is anything implementing :class:`CASRemote`. The embedded default,
:class:`LocalDirRemote`, is a :class:`LocalCAS` that lives inside a path git remote
(``<remote>/xet``), so no server is needed; the HTTP remote implements the same interface.

Ordering is what keeps a remote consistent under failure: every xorb a shard references is
uploaded (and verified by the receiver) *before* the shard, so a push killed at any point
leaves at worst unreferenced xorbs, never a shard that points at missing data. A rerun
skips what is already there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass
from typing import Protocol

from gitxet.errors import FileNotFoundInCASError, GitxetError
from gitxet.formats import shard as shardfmt
from gitxet.formats.xorb import BytesLike
from gitxet.hashing import to_hex
from gitxet.store.cas import LocalCAS
from gitxet.util.atomic import fsync_dir

Progress = Callable[[int], None]
#: How long a failed or interrupted transfer waits for the copies already running.
ABANDON_AFTER = 2.0


class CASRemote(Protocol):
    """What push and fetch need from a remote CAS."""

    name: str

    def has_xorb(self, xorb_hash: bytes) -> bool: ...

    def upload_xorb(self, xorb_hash: bytes, body: bytes) -> bool: ...

    def upload_shard(self, data: bytes) -> None: ...

    def shards_for_file(self, file_hash: bytes) -> list[bytes]:
        """Serialized shards that describe ``file_hash`` (empty if unknown)."""
        ...

    def download_xorb(self, xorb_hash: bytes) -> BytesLike: ...


class LocalDirRemote:
    """The embedded remote: a :class:`LocalCAS` in a directory (``<git remote>/xet``)."""

    def __init__(self, root: str, *, durable: bool = True) -> None:
        self.name = root
        self.cas = LocalCAS(root, durable=durable)

    def has_xorb(self, xorb_hash: bytes) -> bool:
        return self.cas.has_xorb(xorb_hash)

    def upload_xorb(self, xorb_hash: bytes, body: bytes) -> bool:
        return self.cas.put_xorb(xorb_hash, body)

    def upload_shard(self, data: bytes) -> None:
        self.cas.put_shard(data)

    def upload_shards(self, datas: list[bytes]) -> None:
        """Many shards at once: one filesystem sync and one index transaction."""
        self.cas.put_shards(datas)

    def shards_for_file(self, file_hash: bytes) -> list[bytes]:
        return [self.cas.shard_bytes(n) for n in sorted(self.cas.shards_for_files([file_hash]))]

    def shard_names_for_files(self, file_hashes: list[bytes]) -> tuple[set[str], list[bytes]]:
        """Names of the shards describing ``file_hashes``, and the files none describes."""
        found = self.cas.file_shards(file_hashes)
        return set(found.values()), [fh for fh in file_hashes if fh not in found]

    def shard_bytes(self, name: str) -> bytes:
        return self.cas.shard_bytes(name)

    def has_file(self, file_hash: bytes) -> bool:
        return bool(self.cas.shards_for_files([file_hash]))

    def missing_files(self, file_hashes: Sequence[bytes]) -> set[bytes]:
        """Those of ``file_hashes`` no shard here describes (:meth:`has_file` in batches)."""
        found = self.cas.file_shards(file_hashes)
        return {h for h in file_hashes if h not in found}

    def has_shard(self, name: str) -> bool:
        return self.cas.has_shard(name)

    def download_xorb(self, xorb_hash: bytes) -> bytes:
        return self.cas.xorb_body(xorb_hash, verify=False)  # the receiver's put_xorb verifies

    def link_into(self, local: LocalCAS, xorb_hash: bytes) -> int | None:
        """Hard-link a stored xorb into ``local`` (same filesystem): no copy at all.

        Stored xorbs are immutable and replaced only by rename, so sharing the inode is
        safe. The footer is checked against the xorb's name here and every chunk is
        verified when read, so a damaged remote xorb is still never served. Returns the
        size, or None when linking is not possible (another filesystem, a bad footer).
        """
        n = _hard_link(self.cas.xorb_path(xorb_hash), local.xorb_path(xorb_hash))
        if n is None:
            return None
        try:
            local.layout(xorb_hash)
        except GitxetError:
            with contextlib.suppress(OSError):
                os.unlink(local.xorb_path(xorb_hash))
            return None
        return n

    def link_from(self, local: LocalCAS, xorb_hash: bytes) -> int | None:
        """The push side of :meth:`link_into`: hard-link a local xorb into this remote.

        The local footer must hash to the xorb's name first (else None: the copy path
        then re-hashes the xorb and names what is wrong); readers verify every chunk. With
        a durable remote the file and its directory entry are synced. None when linking
        is not possible (another filesystem, a bad footer).
        """
        try:
            local.layout(xorb_hash)
        except GitxetError:
            return None
        dst = self.cas.xorb_path(xorb_hash)
        n = _hard_link(local.xorb_path(xorb_hash), dst)
        if n is not None and self.cas.durable:
            fd = os.open(dst, os.O_RDONLY)
            try:
                os.fsync(fd)  # the local copy may have been written without a sync
            finally:
                os.close(fd)
            fsync_dir(os.path.dirname(dst))
        return n


def _hard_link(src: str, dst: str) -> int | None:
    """Link ``src`` at ``dst`` (kept if already there); its size, or None if impossible."""
    try:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.link(src, dst)
    except FileExistsError:
        return os.path.getsize(dst)
    except OSError:
        return None
    return os.path.getsize(dst)


@dataclass(frozen=True, slots=True)
class TransferSummary:
    """What a push or fetch moved."""

    files: int
    xorbs_sent: int
    xorbs_skipped: int
    shards_sent: int
    bytes_sent: int


def _shard_xorbs(shard: shardfmt.Shard) -> set[bytes]:
    return {t.xorb_hash for f in shard.files for t in f.terms} | {x.xorb_hash for x in shard.xorbs}


#: files :func:`push_files` looks up in the local index at once
_ASK_BATCH = 1000


def push_files(
    local: LocalCAS,
    remote: CASRemote,
    file_hashes: Iterable[bytes],
    *,
    progress: Progress | None = None,
    workers: int = 4,
) -> TransferSummary:
    """Upload the xorbs, then the shards, that describe ``file_hashes``.

    Raises:
        FileNotFoundInCASError: a file is described by no local shard (its data was
            never added here).
    """
    wanted = list(dict.fromkeys(file_hashes))
    shard_names: set[str] = set()
    for i in range(0, len(wanted), _ASK_BATCH):  # the index asked per batch, not per file
        part = wanted[i : i + _ASK_BATCH]
        found = local.file_shards(part)
        shard_names.update(found.values())
        for fhash in part:
            if fhash in found or fhash == bytes(32) or local.file_info(fhash) is not None:
                continue
            if remote.shards_for_file(fhash):
                continue  # uploaded by someone else (another clone, hf_xet): nothing to send
            raise FileNotFoundInCASError(to_hex(fhash))
    has_shard = getattr(remote, "has_shard", None)  # remotes that can tell cheaply
    if has_shard is not None:
        shard_names = {n for n in shard_names if not has_shard(n)}
    shards = {n: local.shard_bytes(n) for n in sorted(shard_names)}
    xorbs: set[bytes] = set()
    for data in shards.values():
        xorbs |= _shard_xorbs(shardfmt.parse_shard(data))
    todo = sorted(x for x in xorbs if not remote.has_xorb(x))

    link = getattr(remote, "link_from", None)  # an embedded remote: no copy at all

    def send(x: bytes) -> int:
        if link is not None:
            linked = link(local, x)
            if linked is not None:
                return int(linked)
        # the receiver re-hashes every xorb (put_xorb, or the server), so a corrupt local
        # xorb is refused there, naming it; hashing it here as well would double the cost
        body = local.xorb_body(x, verify=False)
        remote.upload_xorb(x, body)
        return len(body)

    upload_all = getattr(remote, "upload_shards", None)

    def upload(datas: list[bytes]) -> None:
        if upload_all is not None:
            upload_all(datas)
            return
        for data in datas:
            remote.upload_shard(data)

    moved = _move(todo, send, shards, upload, progress, workers, "push", _file_sizes(local))
    return TransferSummary(len(wanted), len(todo), len(xorbs) - len(todo), len(shards), moved)


#: files per shard :func:`fetch_files` builds from a server's batched descriptions
DESCRIBED_PER_SHARD = 10_000


def fetch_files(
    local: LocalCAS,
    remote: CASRemote,
    file_hashes: Iterable[bytes],
    *,
    progress: Progress | None = None,
    workers: int = 4,
) -> TransferSummary:
    """Make ``file_hashes`` reconstructible from ``local`` by copying from ``remote``.

    Every xorb is verified against its hash as it is stored; shards are stored last.

    Raises:
        FileNotFoundInCASError: the remote does not know a file.
        XorbNotFoundError: the remote lacks a xorb its shard references.
    """
    wanted = [fhash for fhash in dict.fromkeys(file_hashes) if fhash != bytes(32)]
    missing = [fhash for fhash in wanted if local.file_info(fhash) is None]
    shards: dict[str, bytes] = {}
    by_name = getattr(remote, "shard_names_for_files", None)
    if by_name is not None:  # a store that can say which shards: each one is read once
        names, unknown = by_name(missing)
        if unknown:
            raise FileNotFoundInCASError(to_hex(unknown[0]))
        shards = {n: remote.shard_bytes(n) for n in sorted(names)}  # type: ignore[attr-defined]
        missing = []
    described = _described_shards(remote, missing)
    if described is not None:
        shards.update(described)
        missing = []
    for fhash in missing:
        found = remote.shards_for_file(fhash)
        if not found:
            raise FileNotFoundInCASError(to_hex(fhash))
        for data in found:
            shards[to_hex(_name(data))] = data
    xorbs: set[bytes] = set()
    for data in shards.values():
        xorbs |= _shard_xorbs(shardfmt.parse_shard(data))
    for fhash in wanted:  # described here, but a xorb is gone (quarantined as damaged)
        info = local.file_info(fhash)
        if info is not None:
            xorbs |= {t.xorb_hash for t in info.terms if not local.has_xorb(t.xorb_hash)}
    todo = sorted(x for x in xorbs if not local.has_xorb(x))

    link = getattr(remote, "link_into", None)

    def get(x: bytes) -> int:
        if link is not None:
            linked = link(local, x)
            if linked is not None:
                return int(linked)
        body = remote.download_xorb(x)
        # re-hashed here (a corrupt remote xorb raises IntegrityError); not fsynced: a copy
        # can always be fetched again, and a torn one fails verification on read
        local.put_xorb(x, body, durable=False)
        return len(body)

    cas = getattr(remote, "cas", None)
    sizes = _file_sizes(cas) if isinstance(cas, LocalCAS) else None
    moved = _move(todo, get, shards, local.put_shards, progress, workers, "fetch", sizes)
    return TransferSummary(len(wanted), len(todo), len(xorbs) - len(todo), len(shards), moved)


def _described_shards(remote: CASRemote, file_hashes: list[bytes]) -> dict[str, bytes] | None:
    """From a CAS server (a remote with a ``chunk_source``): shards describing
    ``file_hashes``, built from their descriptions (asked for in batches) and each xorb's
    chunk list once (checked against the xorb hash), one shard per
    :data:`DESCRIBED_PER_SHARD` files; None from any other remote. The server's own shard
    of a file holds its xorb's whole chunk list: a request of 0.5 MB per file of 100,000
    small ones.

    Raises:
        FileNotFoundInCASError: the server does not know a file.
    """
    chunk_source = getattr(remote, "chunk_source", None)
    if chunk_source is None or not file_hashes:
        return None
    src = chunk_source()
    known = src.describe(file_hashes, keep=False)
    out: dict[str, bytes] = {}
    for i in range(0, len(file_hashes), DESCRIBED_PER_SHARD):
        infos: list[shardfmt.FileInfo] = []
        for fhash in file_hashes[i : i + DESCRIBED_PER_SHARD]:
            info = src.file_info(fhash) if fhash in known else None
            if info is None:
                raise FileNotFoundInCASError(to_hex(fhash))
            infos.append(info)
        xorbs = list(dict.fromkeys(t.xorb_hash for f in infos for t in f.terms))
        src.layouts_ahead(xorbs)
        blocks = []
        for x in xorbs:
            lay = src.layout(x)
            offs = lay.data_offsets
            sizes = [offs[k + 1] - offs[k] for k in range(len(offs) - 1)]
            blocks.append(shardfmt.XorbInfo.from_chunks(x, lay.chunk_hashes, sizes))
        data = shardfmt.serialize_shard(shardfmt.Shard(infos, blocks))
        out[to_hex(_name(data))] = data
    return out


def _move(
    xorbs: list[bytes],
    copy_xorb: Callable[[bytes], int],
    shards: dict[str, bytes],
    put_shards: Callable[[list[bytes]], object],
    progress: Progress | None,
    workers: int,
    what: str,
    size_of: Callable[[bytes], int] | None = None,
) -> int:
    """Copy xorbs in parallel, then (only then) the shards that reference them.

    With ``size_of`` (the bytes each xorb's copy will count), a ``progress`` that has an
    ``expect(total)`` method learns the total first, and counts in the same unit."""
    sizes = {x: size_of(x) for x in xorbs} if size_of is not None else {}
    expect = getattr(progress, "expect", None)
    if expect is not None and size_of is not None:
        expect(sum(sizes.values()))

    def one(x: bytes) -> int:
        n = copy_xorb(x)
        if progress is not None:
            progress(sizes.get(x, n))
        return n

    total = 0
    ex = ThreadPoolExecutor(max(1, workers), thread_name_prefix=f"gitxet-{what}")
    futures = [ex.submit(one, x) for x in xorbs]
    try:
        # in completion order: a failed copy ends the transfer at once, even while an
        # earlier-submitted one hangs on a silent server
        for fut in as_completed(futures):
            total += fut.result()
    except BaseException:
        # a failure, or an interrupt (Ctrl-C, SIGTERM): start nothing more; copies running
        # to a local disk get a moment to finish or remove their temp file, calls hanging
        # on a network are abandoned (the CLI then exits without joining their threads)
        ex.shutdown(wait=False, cancel_futures=True)
        wait([f for f in futures if f.running()], timeout=ABANDON_AFTER)
        raise
    ex.shutdown()
    put_shards(list(shards.values()))
    return total + sum(len(d) for d in shards.values())


def _file_sizes(cas: LocalCAS) -> Callable[[bytes], int]:
    def size(x: bytes) -> int:
        try:
            return os.path.getsize(cas.xorb_path(x))
        except OSError:
            return 0

    return size


def _name(data: bytes) -> bytes:
    from gitxet.hashing import chunk_hash

    return chunk_hash(data)
