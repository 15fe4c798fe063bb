"""CasService and CasIndex on a local backend: validation, reconstruction ranges, dedup, refresh."""

from __future__ import annotations

import hashlib
import os
import random
import time
from collections.abc import Hashable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gitxet.errors import (
    FileNotFoundInCASError,
    IntegrityError,
    RangeNotSatisfiableError,
    RequestRejectedError,
)
from gitxet.formats.shard import (
    FileInfo,
    FileTerm,
    XorbInfo,
    make_file_info,
    parse_shard,
    serialize_shard,
    upload_shard_for,
)
from gitxet.hashing import ZERO_HASH, file_hash, protected_chunk_hash, to_hex
from gitxet.server.backends import LocalBackend
from gitxet.server.index import CasIndex, shard_key, xorb_key
from gitxet.server.service import CasService
from tests.helpers.server_env import Upload, build_upload, chunk


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(str(tmp_path / "cas"), durable=False)


@pytest.fixture
def service(backend: LocalBackend) -> CasService:
    return CasService(backend)


@pytest.fixture(scope="module")
def up() -> Upload:
    return build_upload(random.Random(5).randbytes(400_000))


def url_for(hx: str) -> str:
    return f"http://h/xorb-data/default/{hx}?sig"


def stored(backend: LocalBackend, prefix: str) -> list[str]:
    return list(backend.list(prefix))


def test_xorb_round_trip_and_idempotence(
    service: CasService, up: Upload, backend: LocalBackend
) -> None:
    assert service.put_xorb(up.xorb.hash, up.xorb.body) is True
    assert service.put_xorb(up.xorb.hash, up.xorb.body) is False
    lay = service.layout(up.xorb.hash)
    assert lay.chunk_hashes == tuple(up.xorb.chunk_hashes)
    assert lay.body_size == len(up.xorb.body)
    # A fresh index (another process) reads the layout from the stored footer.
    assert CasIndex(backend).layout(up.xorb.hash) == lay
    data, a, b = service.read_xorb_range(up.xorb.hash, 10, 10**9)
    assert (a, b) == (10, len(up.xorb.body) - 1) and data == up.xorb.body[10:]


def test_xorb_hash_mismatch_and_garbage_store_nothing(
    service: CasService, up: Upload, backend: LocalBackend
) -> None:
    with pytest.raises(RequestRejectedError, match="hash mismatch"):
        service.put_xorb(b"\x01" * 32, up.xorb.body)
    with pytest.raises(RequestRejectedError, match="xorb"):
        service.put_xorb(up.xorb.hash, up.xorb.body[:-5])
    with pytest.raises(RequestRejectedError):
        service.put_xorb(up.xorb.hash, b"")
    assert stored(backend, "xorbs/") == []


def test_shard_validation(service: CasService, up: Upload, backend: LocalBackend) -> None:
    with pytest.raises(RequestRejectedError, match="not stored"):
        service.put_shard(up.shard)
    service.put_xorb(up.xorb.hash, up.xorb.body)
    n = len(up.xorb.chunk_hashes)
    good = parse_shard(up.shard).files[0]

    def shard_with(info: FileInfo, xorbs: list[XorbInfo] | None = None) -> bytes:
        return upload_shard_for([info], xorbs or [])

    bad_ver = FileInfo(good.file_hash, good.terms, [b"\x00" * 32], good.sha256)
    with pytest.raises(RequestRejectedError, match="verification"):
        service.put_shard(shard_with(bad_ver))
    bad_hash = make_file_info(b"\x05" * 32, good.terms, [up.xorb.chunk_hashes], None)
    with pytest.raises(RequestRejectedError, match="do not hash to the file hash"):
        service.put_shard(shard_with(bad_hash))
    past_end = FileInfo(good.file_hash, [FileTerm(up.xorb.hash, 0, n + 1, len(up.data))])
    with pytest.raises(RequestRejectedError, match="past the xorb"):
        service.put_shard(shard_with(past_end))
    wrong_len = FileInfo(good.file_hash, [FileTerm(up.xorb.hash, 0, n, len(up.data) + 1)])
    with pytest.raises(RequestRejectedError, match="length"):
        service.put_shard(shard_with(wrong_len))
    lying_cas = XorbInfo.from_chunks(up.xorb.hash, up.xorb.chunk_hashes[::-1], up.xorb.chunk_sizes)
    with pytest.raises(RequestRejectedError, match="chunk list differs"):
        service.put_shard(shard_with(good, [lying_cas]))
    with pytest.raises(RequestRejectedError, match="shard"):
        service.put_shard(up.shard[:-7])
    assert stored(backend, "shards/") == []

    assert service.put_shard(up.shard) is True
    assert service.put_shard(up.shard) is False
    assert len(stored(backend, "shards/")) == 1
    assert service.file_info(up.file_hash).terms == good.terms


def test_empty_file_shard(service: CasService) -> None:
    empty = make_file_info(ZERO_HASH, [], [], hashlib.sha256(b"").hexdigest())
    assert service.put_shard(upload_shard_for([empty], [])) is True
    assert service.reconstruct(ZERO_HASH, None, url_for).terms == []
    bogus = FileInfo(b"\x09" * 32, [])
    with pytest.raises(RequestRejectedError, match="empty-file"):
        service.put_shard(serialize_shard_of(bogus))


def serialize_shard_of(info: FileInfo) -> bytes:
    from gitxet.formats.shard import Shard

    return serialize_shard(Shard([info], []))


@pytest.fixture
def multi(service: CasService) -> tuple[CasService, bytes, list[bytes], list[int]]:
    """A file of two terms in two xorbs: [xorb A chunks 0..n) + [xorb B chunks 1..m)."""
    a = chunk(random.Random(1).randbytes(300_000))
    b = chunk(random.Random(2).randbytes(300_000))
    from gitxet.formats.xorb import serialize_xorb

    xa, xb = serialize_xorb(a), serialize_xorb(b)
    service.put_xorb(xa.hash, xa.body)
    service.put_xorb(xb.hash, xb.body)
    terms = [
        FileTerm(xa.hash, 0, len(a), sum(map(len, a))),
        FileTerm(xb.hash, 1, len(b), sum(map(len, b[1:]))),
    ]
    chunks = a + b[1:]
    fh = file_hash(
        [
            (h, s)
            for h, s in zip(xa.chunk_hashes + xb.chunk_hashes[1:], map(len, chunks), strict=True)
        ]
    )
    info = make_file_info(fh, terms, [xa.chunk_hashes, xb.chunk_hashes[1:]], None)
    service.put_shard(upload_shard_for([info], []))
    return service, fh, chunks, [len(c) for c in chunks]


def materialize(service: CasService, fh: bytes, rng: tuple[int, int | None] | None) -> bytes:
    """Play the client: fetch each term's chunks from the backend and apply the offset."""
    from gitxet.formats.xorb import decode_chunks
    from gitxet.hashing import from_hex

    r = service.reconstruct(fh, rng, url_for)
    out = bytearray()
    for t in r.terms:
        fi = r.fetch_for(t)
        raw, _, _ = service.read_xorb_range(from_hex(t.xorb_hex), fi.byte_start, fi.byte_end)
        cs = decode_chunks(raw, expected_count=fi.chunk_end - fi.chunk_start)
        part = b"".join(cs[t.chunk_start - fi.chunk_start : t.chunk_end - fi.chunk_start])
        assert len(part) == t.unpacked_length
        out += part
    return bytes(out[r.offset_into_first_range :])


def test_reconstruct_ranges(multi: tuple[CasService, bytes, list[bytes], list[int]]) -> None:
    service, fh, chunks, sizes = multi
    data = b"".join(chunks)
    size = len(data)
    full = service.reconstruct(fh, None, url_for)
    assert full.offset_into_first_range == 0 and len(full.terms) == 2
    assert materialize(service, fh, None) == data
    for a, b in [
        (0, 0),
        (1, 100),
        (sizes[0] - 1, sizes[0]),
        (250_000, 350_000),
        (size - 1, None),
        (17, 10**12),
    ]:
        want = data[a : (size if b is None else min(b, size - 1)) + 1]
        got = materialize(service, fh, (a, b))
        assert got[: len(want)] == want, (a, b)
    # Trimming: a range inside one chunk of the second term yields one one-chunk term.
    inner = sum(sizes[:-2]) + 5
    r = service.reconstruct(fh, (inner, inner + 10), url_for)
    assert len(r.terms) == 1 and r.terms[0].chunk_end - r.terms[0].chunk_start == 1
    assert r.offset_into_first_range == 5
    with pytest.raises(RangeNotSatisfiableError) as ei:
        service.reconstruct(fh, (size, None), url_for)
    assert ei.value.size == size
    with pytest.raises(FileNotFoundInCASError):
        service.reconstruct(b"\x04" * 32, None, url_for)


def test_fetch_entries_merge_per_xorb(service: CasService, up: Upload) -> None:
    service.put_xorb(up.xorb.hash, up.xorb.body)
    n = len(up.xorb.chunk_hashes)
    assert n >= 4
    hs = up.xorb.chunk_hashes
    sizes = up.xorb.chunk_sizes
    terms = [
        FileTerm(up.xorb.hash, 0, 2, sum(sizes[0:2])),
        FileTerm(up.xorb.hash, 1, 3, sum(sizes[1:3])),
    ]
    fh = file_hash([(hs[i], sizes[i]) for i in (0, 1, 1, 2)])
    service.put_shard(upload_shard_for([make_file_info(fh, terms, [hs[0:2], hs[1:3]], None)], []))
    r = service.reconstruct(fh, None, url_for)
    fis = r.fetch[to_hex(up.xorb.hash)]
    assert [(f.chunk_start, f.chunk_end) for f in fis] == [(0, 3)]
    assert fis[0].byte_start == 0 and fis[0].byte_end == up.xorb.byte_offsets[3] - 1


def test_dedup_shard(service: CasService, up: Upload) -> None:
    service.put_xorb(up.xorb.hash, up.xorb.body)
    service.put_shard(up.shard)
    first = up.xorb.chunk_hashes[0]  # first chunk of a file: always eligible
    data = service.dedup_shard(first, now=1000)
    assert data is not None
    s = parse_shard(data)
    assert s.footer is not None and s.footer.shard_key_expiry > 1000 and s.files == []
    key = s.footer.chunk_hash_hmac_key
    assert s.xorbs[0].chunks[0].hash == protected_chunk_hash(key, first)
    assert service.dedup_shard(b"\x08" * 32) is None


def test_second_index_finds_uploads_of_another_process(backend: LocalBackend, up: Upload) -> None:
    a = CasService(backend)
    b = CasService(backend, CasIndex(backend, refresh_interval=0.0))
    b.index.refresh(force=True)  # starts before the upload
    a.put_xorb(up.xorb.hash, up.xorb.body)
    a.put_shard(up.shard)
    assert b.file_info(up.file_hash).file_hash == up.file_hash
    assert b.dedup_shard(up.xorb.chunk_hashes[0]) is not None
    c = CasIndex(backend)
    assert c.rebuild() == 1


def test_missing_files_asks_the_backend_once(backend: LocalBackend, up: Upload) -> None:
    a = CasService(backend)
    b = CasService(backend, CasIndex(backend, refresh_interval=3600))
    b.index.refresh(force=True)
    unknown = [bytes([i]) * 32 for i in range(1, 50)]
    assert b.missing_files([ZERO_HASH, *unknown]) == unknown
    a.put_xorb(up.xorb.hash, up.xorb.body)
    a.put_shard(up.shard)  # through "another replica": b learns it from one refresh
    assert b.missing_files([up.file_hash, *unknown]) == unknown


class CountingBackend(LocalBackend):
    """A local backend that counts listings (and can hide its directory versions)."""

    def __init__(self, root: str, *, probe: bool) -> None:
        super().__init__(root, durable=False)
        self.lists = 0
        self.probe = probe

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        self.lists += 1
        return super().list(prefix, start_after)

    def version(self, prefix: str) -> tuple[float, Hashable] | None:
        return super().version(prefix) if self.probe else None


@pytest.mark.parametrize("probe", [True, False])
def test_unknown_file_lookups_do_not_list_per_request(
    tmp_path: Path, up: Upload, probe: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gitxet.server.index as index_mod

    monkeypatch.setattr(index_mod, "SETTLED", 0.0)  # the test's directory is seconds old
    backend = CountingBackend(str(tmp_path / "cas"), probe=probe)
    svc = CasService(backend, CasIndex(backend, miss_interval=0.2))
    svc.index.refresh(force=True)
    before = backend.lists

    def lookups(start: int) -> None:
        for i in range(start, start + 20):
            with pytest.raises(FileNotFoundInCASError):
                svc.file_info((i + 1).to_bytes(2, "little") * 16)

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:  # 320 lookups of unknown files, 16 at a time
        list(pool.map(lookups, range(0, 320, 20)))
    took = time.monotonic() - t0
    listings = backend.lists - before
    if probe:  # an unchanged marker directory is one stat, not a listing
        assert listings <= 1, listings
    else:  # at most one listing per miss interval, however many requests
        assert listings <= took / 0.2 + 2, (listings, took)
    # and a file another process registers is still found at the next miss
    other = CasService(LocalBackend(str(tmp_path / "cas"), durable=False))
    other.put_xorb(up.xorb.hash, up.xorb.body)
    other.put_shard(up.shard)
    assert svc.file_info(up.file_hash).file_hash == up.file_hash


def test_sha256_metadata_is_ignored_and_not_served(service: CasService, up: Upload) -> None:
    shard = parse_shard(up.shard)
    (info,) = shard.files
    lie = FileInfo(info.file_hash, info.terms, info.verification, b"\x07" * 32)
    service.put_xorb(up.xorb.hash, up.xorb.body)
    assert service.put_shard(upload_shard_for([lie], shard.xorbs)) is True  # not checked
    served = parse_shard(service.file_shard(up.file_hash))
    assert served.files[0].sha256 is None and served.files[0].terms == info.terms


def test_damaged_stored_objects_are_integrity_errors(
    service: CasService, up: Upload, backend: LocalBackend
) -> None:
    service.put_xorb(up.xorb.hash, up.xorb.body)
    path = backend.local_path(xorb_key(up.xorb.hash))
    assert path is not None
    with open(path, "r+b") as f:
        f.seek(len(up.xorb.body) + 60)  # inside the footer's chunk-hash list
        f.write(b"\xff" * 8)
    with pytest.raises(IntegrityError):
        CasIndex(backend).layout(up.xorb.hash)
    backend.put(shard_key("ab" * 32), b"not a shard")
    fresh = CasIndex(backend)
    assert fresh.refresh(force=True) == 0  # skipped, not fatal


def test_first_chunk_of_a_deduplicated_file_is_answered(service: CasService, up: Upload) -> None:
    """A file whose first term points into an older xorb (no CAS block) is still indexed."""
    service.put_xorb(up.xorb.hash, up.xorb.body)
    service.put_shard(up.shard)
    hs, sizes = up.xorb.chunk_hashes, up.xorb.chunk_sizes
    # A second file made of the old xorb's chunks 1.. : its first chunk is a middle chunk.
    term = FileTerm(up.xorb.hash, 1, len(hs), sum(sizes[1:]))
    fh = file_hash(list(zip(hs[1:], sizes[1:], strict=True)))
    service.put_shard(upload_shard_for([make_file_info(fh, [term], [hs[1:]], None)], []))
    assert service.dedup_shard(hs[1]) is not None


def test_out_of_file_descriptors_is_busy_not_an_internal_error() -> None:
    """A server at its open-file limit (more clients than 'ulimit -n' allows: warned about
    at start) could not start git for a clone: that was a 500 and a traceback per request;
    it is a 503 with Retry-After, as for any transient overload."""
    import errno
    import json as jsonlib

    from gitxet.server.app import _exc_response

    for code in (errno.EMFILE, errno.ENFILE):
        r = _exc_response(OSError(code, os.strerror(code)))
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert "out of file descriptors" in jsonlib.loads(bytes(r.body))["error"]
    assert _exc_response(OSError(errno.EIO, "io")).status_code == 500  # others unchanged
