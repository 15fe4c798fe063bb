"""RemoteChunkSource against a real CAS server: both fetch paths, one fetch per range."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gitxet.data.audit import missing_files, on_remote
from gitxet.data.reconstruct import FileReader
from gitxet.data.remote_source import HttpCASRemote, RemoteChunkSource
from gitxet.errors import IntegrityError
from gitxet.formats.shard import (
    FileTerm,
    Shard,
    XorbInfo,
    make_file_info,
    parse_shard,
    upload_shard_for,
)
from gitxet.formats.xorb import SerializedXorb, serialize_xorb
from gitxet.hashing import file_hash, to_hex
from gitxet.remote.client import CASClient
from gitxet.remote.protocol import XorbLocation
from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig
from gitxet.store.nodecache import NodeCache
from tests.helpers.server_env import Upload, build_upload


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Upload]]:
    """A real server on loopback holding one uploaded file: (url, read token, upload)."""
    root = tmp_path_factory.mktemp("srv")
    write, _ = TokenStore(str(root)).create("write")
    read, _ = TokenStore(str(root)).create("read")
    # compressible data: the bytes on the wire differ from the decoded bytes
    up = build_upload(
        b"".join(random.Random(5).choice([b"abcd", b"wxyz"]) * 64 for _ in range(20_000))
    )
    with BackgroundServer(ServerConfig(root=str(root), port=0)) as srv:
        with CASClient(srv.url, write) as c:
            c.upload_xorb(up.xorb.hash, up.xorb.body)
            c.upload_shard(up.shard)
        yield srv.url, read, up


def _packed(seed: int, n: int) -> tuple[SerializedXorb, list[bytes], list[bytes], bytes]:
    """``n`` small files packed in one xorb, one chunk each: (xorb, files, file hashes,
    upload shard)."""
    rng = random.Random(seed)
    files = [rng.randbytes(rng.randrange(2_000, 6_000)) for _ in range(n)]
    sx = serialize_xorb(files)
    infos, hashes = [], []
    for i, data in enumerate(files):
        fh = file_hash([(sx.chunk_hashes[i], len(data))])
        term = FileTerm(sx.hash, i, i + 1, len(data))
        infos.append(make_file_info(fh, [term], [[sx.chunk_hashes[i]]], None))
        hashes.append(fh)
    shard = upload_shard_for(
        infos, [XorbInfo.from_chunks(sx.hash, sx.chunk_hashes, sx.chunk_sizes)]
    )
    return sx, files, hashes, shard


@contextlib.contextmanager
def _own_server(root: Path, sx: SerializedXorb, shard: bytes) -> Iterator[CASClient]:
    """A server of its own at ``root`` holding ``sx`` and ``shard``; a client with write access."""
    write, _ = TokenStore(str(root)).create("write")
    with (
        BackgroundServer(ServerConfig(root=str(root), port=0)) as srv,
        CASClient(srv.url, write) as client,
    ):
        client.upload_xorb(sx.hash, sx.body)
        client.upload_shard(shard)
        yield client


def _source(client: CASClient, tmp_path: Path, **kw: Any) -> tuple[NodeCache, RemoteChunkSource]:
    """A node cache under ``tmp_path`` and a chunk source over it and ``client``."""
    cache = NodeCache(str(tmp_path / "ranges"), 1 << 30)
    return cache, RemoteChunkSource(client, cache, str(tmp_path / "shards"), **kw)


@pytest.mark.parametrize("path", ["xorb locations", "reconstruction entries"])
def test_fetched_bytes_are_the_decoded_bytes_on_either_path(
    served: tuple[str, str, Upload], tmp_path: Path, path: str
) -> None:
    url, token, up = served
    assert len(up.xorb.body) < len(up.data)  # compressed on the wire
    with CASClient(url, token) as client:
        cache, src = _source(client, tmp_path)
        src._no_locations = path == "reconstruction entries"
        assert src.warm([up.file_hash]) == len(up.data)
        assert src.fetched_bytes == len(up.data) == cache.total_bytes
        assert src.warm([up.file_hash]) == 0  # all cached now
        out = io.BytesIO()
        FileReader(src, up.file_hash).copy_to(out)
        assert out.getvalue() == up.data and src.fetched_bytes == len(up.data)
        src.close()
        cache.close()


class _AtOffsets(io.RawIOBase):
    """A positional output (``write_at``); ``fail_at`` makes that call (1-based) raise."""

    def __init__(self, size: int, fail_at: int = 0) -> None:
        self.buf = bytearray(size)
        self.calls = self.ended = 0
        self.fail_at = fail_at
        self.lock = threading.Lock()

    def write(self, data: Any) -> int:  # the in-order path must not be taken
        raise AssertionError("written in order")

    def write_at(self, offset: int, views: list[memoryview]) -> None:
        with self.lock:
            self.calls += 1
            n = self.calls
        try:
            if n == self.fail_at:
                raise OSError("disk full")
            for v in views:
                self.buf[offset : offset + len(v)] = v
                offset += len(v)
        finally:
            with self.lock:
                self.ended += 1


def test_copy_to_a_positional_output_writes_each_range_where_it_belongs(
    served: tuple[str, str, Upload], tmp_path: Path
) -> None:
    url, token, up = served
    with CASClient(url, token) as client:
        cache, src = _source(client, tmp_path, unit=1 << 20)
        out = _AtOffsets(len(up.data))
        assert FileReader(src, up.file_hash).copy_to(out) == len(up.data)  # type: ignore[arg-type]
        assert bytes(out.buf) == up.data and out.calls >= 4  # several 1 MiB ranges
        # a failed write is the copy's error; when copy_to returns no write is running
        failing = _AtOffsets(len(up.data), fail_at=2)
        with pytest.raises(OSError, match="disk full"):
            FileReader(src, up.file_hash).copy_to(failing)  # type: ignore[arg-type]
        with failing.lock:
            assert failing.ended == failing.calls >= 2
        src.close()
        cache.close()


def test_a_copy_checks_the_terms_alongside_its_first_fetches_and_writes_nothing_before(
    served: tuple[str, str, Upload], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader made for a copy checks the file's terms while the copy fetches its first
    ranges: the bytes are right when they check out, and when they do not (terms that are
    not the file's) nothing at all is written, in order or at offsets."""
    url, token, up = served
    with CASClient(url, token) as client:
        cache, src = _source(client, tmp_path, unit=1 << 20)
        good = _AtOffsets(len(up.data))
        assert FileReader(src, up.file_hash, copy=True).copy_to(good) == len(up.data)  # type: ignore[arg-type]
        assert bytes(good.buf) == up.data
        # another file hash whose description is this file's terms
        real = src.file_info
        monkeypatch.setattr(src, "file_info", lambda _h: real(up.file_hash))
        # the check ends only after a range was fetched (which would then be written)
        fetched = threading.Event()
        monkeypatch.setattr(src, "on_fetch", lambda _n, _s: fetched.set())
        check = FileReader._verify_structure

        def late_check(reader: FileReader, info: Any) -> None:
            assert fetched.wait(60)
            check(reader, info)

        monkeypatch.setattr(FileReader, "_verify_structure", late_check)
        liar = bytes(32 * [7])
        for out in (_AtOffsets(len(up.data)), io.BytesIO()):
            reader = FileReader(src, liar, copy=True)  # not checked yet
            with pytest.raises(IntegrityError, match="do not hash to the file hash"):
                reader.copy_to(out)  # type: ignore[arg-type]
            assert (out.calls if isinstance(out, _AtOffsets) else len(out.getvalue())) == 0
            fetched.clear()
        fetched.set()
        with pytest.raises(IntegrityError):  # nor is any other read served
            FileReader(src, liar, copy=True).read(0, 10)
        src.close()
        cache.close()


def test_a_small_copy_checks_its_terms_first_on_its_own_thread(
    served: tuple[str, str, Upload], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file under CHECK_ALONGSIDE_MIN is checked before its copy, on the copying thread
    (no thread per file in a clone of many small files); a liar still writes nothing."""
    from gitxet.data import reconstruct

    url, token, up = served
    monkeypatch.setattr(reconstruct, "CHECK_ALONGSIDE_MIN", len(up.data) + 1)
    ran_on: list[str] = []
    check = FileReader._verify_structure

    def spied(reader: FileReader, info: Any) -> None:
        ran_on.append(threading.current_thread().name)
        check(reader, info)

    monkeypatch.setattr(FileReader, "_verify_structure", spied)
    with CASClient(url, token) as client:
        cache, src = _source(client, tmp_path, unit=1 << 20)
        good = io.BytesIO()
        assert FileReader(src, up.file_hash, copy=True).copy_to(good) == len(up.data)
        assert good.getvalue() == up.data
        assert ran_on == [threading.current_thread().name]
        real = src.file_info
        monkeypatch.setattr(src, "file_info", lambda _h: real(up.file_hash))
        out = io.BytesIO()
        with pytest.raises(IntegrityError, match="do not hash to the file hash"):
            FileReader(src, bytes(32 * [7]), copy=True).copy_to(out)
        assert out.getvalue() == b""
        src.close()
        cache.close()


def test_concurrent_readers_share_each_fetch(
    served: tuple[str, str, Upload], tmp_path: Path
) -> None:
    url, token, up = served
    with CASClient(url, token) as client:
        cache, src = _source(client, tmp_path)
        reader = FileReader(src, up.file_hash)
        start = threading.Barrier(8)
        got: list[bytes] = []

        def read() -> None:
            start.wait()
            parts, off = [], 0
            while off < reader.size:
                parts.append(reader.read(off, 100_000))
                off += len(parts[-1])
            got.append(b"".join(parts))

        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert got == [up.data] * 8
        assert src.fetched_bytes == len(up.data)  # every range fetched once
        src.close()
        cache.close()


def test_small_files_sharing_a_xorb_take_its_chunk_list_once(tmp_path: Path) -> None:
    """A xorb packing many small files: each file's description is its block alone (the
    xorb's chunk list comes once, with its location), and the layout kept on disk lets a
    new, offline source read the cached data back."""
    sx, files, hashes, shard = _packed(7, 120)
    root = tmp_path / "srv"
    with _own_server(root, sx, shard) as client:
        cache, src = _source(client, tmp_path)
        blocks: list[int] = []
        locations: list[bytes] = []
        ranges: list[tuple[int, int]] = []
        get_shard, get_location = client.get_file_shard, client.xorb_location
        get_range = client.fetch_xorb_range

        def counting_range(url: str, start: int, end: int, into: Any = None) -> bytearray:
            ranges.append((start, end))
            return get_range(url, start, end, into)

        def counting_shard(fh: bytes, *, with_xorbs: bool = True) -> Shard:
            got = get_shard(fh, with_xorbs=with_xorbs)
            blocks.append(len(got.xorbs))
            return got

        def counting_location(xh: bytes) -> XorbLocation:
            locations.append(xh)
            return get_location(xh)

        client.get_file_shard = counting_shard  # type: ignore[method-assign]
        client.xorb_location = counting_location  # type: ignore[method-assign]
        client.fetch_xorb_range = counting_range  # type: ignore[method-assign]

        def copy(fh: bytes) -> bytes:
            out = io.BytesIO()
            FileReader(src, fh).copy_to(out)
            return out.getvalue()

        with ThreadPoolExecutor(8) as pool:  # eight writers, as a clone runs them
            assert list(pool.map(copy, hashes)) == files
        assert blocks == [0] * len(files)  # no file brought the xorb's chunk list
        assert locations == [sx.hash]  # the one place it came from
        # the whole xorb (0.5 MB) is one aligned range: one request for the 120 files
        assert ranges == [(0, len(sx.body) - 1)]
        assert src.warm(hashes) == 0  # and it is in the node cache
        src.close()
    # the server is gone: a new source reads the cached data from the node cache alone
    offline = RemoteChunkSource(client, cache, str(tmp_path / "shards"), offline=True)
    for fh, data in zip(hashes, files, strict=True):
        out = io.BytesIO()
        FileReader(offline, fh).copy_to(out)
        assert out.getvalue() == data
    offline.close()
    cache.close()


def test_presence_of_many_files_is_one_request(
    served: tuple[str, str, Upload], tmp_path: Path
) -> None:
    """fsck and the push checks ask a server which files it lacks in one batch, never with
    a shard download per file."""
    url, token, up = served
    unknown = [bytes([i]) * 32 for i in range(1, 200)]
    with CASClient(url, token) as client:
        remote = HttpCASRemote(client, NodeCache(str(tmp_path / "r"), 1 << 20), str(tmp_path))
        sent: list[str] = []
        request = client._request

        def counting(method: str, url: str, **kw: Any) -> Any:
            sent.append(f"{method} {url.split('/v1/')[1][:13]}")
            return request(method, url, **kw)

        client._request = counting  # type: ignore[method-assign]
        assert missing_files(remote, [up.file_hash, *unknown]) == set(unknown)
        assert on_remote(remote, up.file_hash) and not on_remote(remote, unknown[0])
        assert sent == ["POST file-presence"] * 3
        remote.cache.close()


def test_descriptions_of_many_files_come_in_batches(tmp_path: Path) -> None:
    """A clone of thousands of small files asks for their descriptions with one POST per
    1,000 files (never a GET per file); unknown files are simply not described, the
    descriptions are kept (offline reads), and the server refuses hostile batches."""
    n = 2_345
    rng = random.Random(11)
    files = [rng.randbytes(rng.randrange(100, 400)) for _ in range(n)]
    sx = serialize_xorb(files)  # each file is one chunk of one shared xorb
    infos, hashes = [], []
    for i, data in enumerate(files):
        fh = file_hash([(sx.chunk_hashes[i], len(data))])
        term = FileTerm(sx.hash, i, i + 1, len(data))
        infos.append(make_file_info(fh, [term], [[sx.chunk_hashes[i]]], None))
        hashes.append(fh)
    shard = upload_shard_for(
        infos, [XorbInfo.from_chunks(sx.hash, sx.chunk_hashes, sx.chunk_sizes)]
    )
    unknown = [bytes([i]) * 32 for i in range(1, 6)]
    root = tmp_path / "srv"
    with _own_server(root, sx, shard) as client:
        cache, src = _source(client, tmp_path)
        sent: list[str] = []
        request = client._request

        def counting(method: str, url: str, **kw: Any) -> Any:
            sent.append(f"{method} {url.split('/v1/')[1][:11]}" if "/v1/" in url else method)
            return request(method, url, **kw)

        client._request = counting  # type: ignore[method-assign]
        assert src.describe([*hashes, *unknown]) == set(hashes)
        assert sorted(sent) == ["POST file-shards"] * 3  # 2,350 hashes: 3 batches
        sent.clear()
        assert src.describe(hashes) == set(hashes) and sent == []  # known now
        with ThreadPoolExecutor(8) as pool:  # eight writers, as a clone runs them

            def copy(fh: bytes) -> bytes:
                out = io.BytesIO()
                FileReader(src, fh).copy_to(out)
                return out.getvalue()

            assert list(pool.map(copy, hashes)) == files
        assert [s for s in sent if s.startswith("GET file-shards")] == []
        assert src.warm(hashes) == 0  # the one aligned range is cached
        src.close()

        # the server checks what it is sent: no token, too many, not hashes, not JSON
        import httpx

        url = client.endpoint + "/v1/file-shards"
        write, _ = TokenStore(str(root)).create("write")
        auth = {"Authorization": f"Bearer {write}"}
        too_many = {"files": [h.hex() for h in [*hashes, *hashes][:1001]]}
        assert httpx.post(url, json={"files": []}).status_code == 401
        assert httpx.post(url, json=too_many, headers=auth).status_code == 400
        assert httpx.post(url, json={"files": ["zz"]}, headers=auth).status_code == 400
        assert httpx.post(url, content=b"{", headers=auth).status_code == 400
        r = httpx.post(url, json={"files": [unknown[0].hex()]}, headers=auth)
        assert r.status_code == 200
        assert parse_shard(r.content).files == []
    # the server is gone: a new, offline source still knows every file
    offline = RemoteChunkSource(client, cache, str(tmp_path / "shards"), offline=True)
    assert offline.describe([*hashes, *unknown]) == set(hashes)
    out = io.BytesIO()
    FileReader(offline, hashes[7]).copy_to(out)
    assert out.getvalue() == files[7]
    offline.close()
    cache.close()


def _counting(client: CASClient) -> list[str]:
    """The description requests ``client`` sends from now on (``POST``: a batch, ``GET``: a
    file alone)."""
    sent: list[str] = []
    request = client._request

    def counting(method: str, url: str, **kw: Any) -> Any:
        if "/v1/file-shards" in url:
            sent.append(method)
        return request(method, url, **kw)

    client._request = counting  # type: ignore[method-assign]
    return sent


def _read(src: RemoteChunkSource, fh: bytes) -> bytes:
    out = io.BytesIO()
    FileReader(src, fh).copy_to(out)
    return out.getvalue()


def test_descriptions_held_are_bounded_and_a_dropped_one_is_asked_for_again(
    tmp_path: Path,
) -> None:
    """A long-lived mount reading 100,000s of files holds at most ``max_files`` file
    descriptions (the least recently used go); a file whose description went is described
    again when it is read, and read right."""
    sx, files, hashes, shard = _packed(41, 6)
    with _own_server(tmp_path / "srv", sx, shard) as client:
        cache, src = _source(client, tmp_path, max_files=4)
        sent = _counting(client)
        assert src.describe(hashes[:3], keep=False) == set(hashes[:3])
        assert src.describe(hashes[3:], keep=False) == set(hashes[3:])
        assert sent == ["POST", "POST"] and len(src._files) == 4  # 0 and 1 went
        sent.clear()
        assert [_read(src, hashes[i]) for i in (5, 4)] == [files[5], files[4]]
        assert sent == []  # held
        assert _read(src, hashes[0]) == files[0]
        assert sent == ["GET"]  # dropped: asked for again (and 2, least recently used, went)
        assert _read(src, hashes[3]) == files[3] and sent == ["GET"]
        assert _read(src, hashes[2]) == files[2] and sent == ["GET", "GET"]
        assert len(src._files) == 4
        for fh, data in zip(hashes, files, strict=True):
            assert _read(src, fh) == data
        assert len(src._files) == 4
        src.close()
        cache.close()


def test_a_describe_of_more_files_than_the_bound_holds_them_for_their_readers(
    tmp_path: Path,
) -> None:
    """A clone describes all its files (2,345 here, the bound is 100), then writes them,
    eight at a time: one POST per 1,000 files and not a single GET, as without a bound."""
    sx, files, hashes, shard = _packed(43, 2_345)
    with _own_server(tmp_path / "srv", sx, shard) as client:
        cache, src = _source(client, tmp_path, max_files=100)
        sent = _counting(client)
        assert src.describe(hashes, keep=False) == set(hashes)
        assert sent == ["POST"] * 3
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(lambda fh: _read(src, fh), hashes)) == files
        assert sent == ["POST"] * 3
        src.close()
        cache.close()


class _WatchedLock:
    """A lock that sets ``waiting`` when a thread finds it held and waits for it."""

    def __init__(self, waiting: threading.Event) -> None:
        self._lock = threading.Lock()
        self._waiting = waiting

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> _WatchedLock:
        if self._lock.locked():
            self._waiting.set()
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_a_smudge_during_the_checkouts_listing_waits_for_it_and_is_described_in_a_batch(
    tmp_path: Path,
) -> None:
    """A plain `git clone` from a server: git hands the filter a second file while the
    first one's smudge is listing the checkout's pointers (a few seconds at 100,000 files).
    The second waits for the listing, then is described in the batch, never alone with a
    GET (56-90 files of 100,000 were, before). Here the listing holds until the second
    smudge has either waited for it or asked for its file alone: no sleep decides."""
    from gitxet.dataset import Remotes
    from gitxet.formats.pointer import Pointer
    from gitxet.repo.content import Content
    from gitxet.store.cas import LocalCAS

    sx, files, hashes, shard = _packed(47, 30)
    with _own_server(tmp_path / "srv", sx, shard) as client:
        repo = tmp_path / "clone"
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        subprocess.run(
            ["git", "-C", str(repo), "remote", "add", "origin", f"{client.endpoint}/data.git"],
            check=True,
        )
        cache = NodeCache(str(tmp_path / "ranges"), 1 << 30)
        remote = HttpCASRemote(client, cache, str(tmp_path / "shards"))
        content = Content(LocalCAS(str(tmp_path / "store")), Remotes(str(repo), lambda _: remote))
        pointers = [
            Pointer(sha256=hashlib.sha256(d).hexdigest(), size=len(d), xet_hash=to_hex(h))
            for d, h in zip(files, hashes, strict=True)
        ]
        listing, release, decided = threading.Event(), threading.Event(), threading.Event()
        content._listing = _WatchedLock(decided)  # type: ignore[assignment]
        sent = _counting(client)
        request = client._request

        def asking(method: str, url: str, **kw: Any) -> Any:
            if method == "GET" and "/v1/file-shards/" in url:
                decided.set()  # described alone: the listing is not waited for
            return request(method, url, **kw)

        client._request = asking  # type: ignore[method-assign]

        def list_pointers() -> list[Pointer]:
            listing.set()
            assert release.wait(30)
            return pointers

        content.expect_checkout("c0ffee", list_pointers)
        out = [io.BytesIO(), io.BytesIO()]
        first = threading.Thread(target=content.write, args=(pointers[0], out[0]))
        second = threading.Thread(target=content.write, args=(pointers[1], out[1]))
        first.start()
        assert listing.wait(30)  # the first smudge is listing the checkout
        second.start()
        assert decided.wait(30)  # the second waits for the listing (or asked alone)
        release.set()
        first.join(30)
        second.join(30)
        assert [o.getvalue() for o in out] == files[:2]
        assert sent == ["POST"]  # one batch for the checkout's 30 files, no GET
        remote.close()
        cache.close()


def test_a_batch_of_descriptions_is_kept_file_by_file_as_the_files_are_read(
    tmp_path: Path,
) -> None:
    """A mount describes a directory's files at once: no file is written per description
    of the batch (1,000 of them per directory read once cost 60% of a mount's random
    reads), only for the files then read, which an offline source still reads."""
    sx, files, hashes, shard = _packed(31, 40)
    with _own_server(tmp_path / "srv", sx, shard) as client:
        cache, src = _source(client, tmp_path)
        assert src.describe(hashes) == set(hashes)
        shards = tmp_path / "shards"
        assert list(shards.glob("*.terms")) == []
        for i in (3, 17):
            out = io.BytesIO()
            FileReader(src, hashes[i]).copy_to(out)
            assert out.getvalue() == files[i]
        assert len(list(shards.glob("*.terms"))) == 2  # (and the xorb's layout)
        src.close()
    offline = RemoteChunkSource(client, cache, str(shards), offline=True)
    assert offline.describe(hashes) == {hashes[3], hashes[17]}
    out = io.BytesIO()
    FileReader(offline, hashes[17]).copy_to(out)
    assert out.getvalue() == files[17]
    offline.close()
    cache.close()


def test_a_chunk_corrupted_on_the_server_fails_its_file_only(tmp_path: Path) -> None:
    """One file's chunk corrupted in the server's storage, inside a xorb packing 120 small
    files (one aligned range): that file fails with an IntegrityError, never wrong bytes,
    and its neighbours still read (their chunks fetched without the bad one)."""
    sx, files, hashes, shard = _packed(9, 120)
    bad = 60
    root = tmp_path / "srv"
    with _own_server(root, sx, shard) as client:
        stored = root / "cas" / "xorbs" / "default" / to_hex(sx.hash)
        with open(stored, "r+b") as f:  # the last byte of the bad file's chunk
            f.seek(sx.byte_offsets[bad + 1] - 1)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        cache, src = _source(client, tmp_path)

        def copy(i: int) -> bytes | None:
            out = io.BytesIO()
            try:
                FileReader(src, hashes[i]).copy_to(out)
            except IntegrityError:
                return None
            return out.getvalue()

        with ThreadPoolExecutor(8) as pool:  # clone's writers
            got = list(pool.map(copy, range(len(files))))
        assert got == [None if i == bad else data for i, data in enumerate(files)]
        # a mount's reads (FileReader.read) take the same way
        assert FileReader(src, hashes[bad + 1]).read(0, 1 << 20) == files[bad + 1]
        with pytest.raises(IntegrityError):
            FileReader(src, hashes[bad]).read(0, 1 << 20)
        src.close()
        cache.close()


@contextlib.contextmanager
def _four_xorb_file(root: Path, seed: int) -> Iterator[tuple[CASClient, bytes, list[bytes]]]:
    """A server of its own at ``root`` holding one file over four one-chunk xorbs: a client
    with write access, the file hash, the four parts (one per xorb, in order)."""
    rng = random.Random(seed)
    parts = [rng.randbytes(3_000 + i) for i in range(4)]
    xorbs = [serialize_xorb([part]) for part in parts]
    fh = file_hash([(x.chunk_hashes[0], len(part)) for x, part in zip(xorbs, parts, strict=True)])
    terms = [FileTerm(x.hash, 0, 1, len(part)) for x, part in zip(xorbs, parts, strict=True)]
    info = make_file_info(fh, terms, [[x.chunk_hashes[0]] for x in xorbs], None)
    shard = upload_shard_for(
        [info], [XorbInfo.from_chunks(x.hash, x.chunk_hashes, x.chunk_sizes) for x in xorbs]
    )
    write, _ = TokenStore(str(root)).create("write")
    with (
        BackgroundServer(ServerConfig(root=str(root), port=0)) as srv,
        CASClient(srv.url, write) as client,
    ):
        for x in xorbs:
            client.upload_xorb(x.hash, x.body)
        client.upload_shard(shard)
        yield client, fh, parts


def test_a_file_over_several_xorbs_asks_for_their_layouts_together(tmp_path: Path) -> None:
    """Opening a file spanning four xorbs asks for the four layouts at once, not one after
    the other (each location request here waits until all four are in flight)."""
    with _four_xorb_file(tmp_path / "srv", 11) as (client, fh, parts):
        cache, src = _source(client, tmp_path)
        together = threading.Barrier(len(parts), timeout=120)
        get_location = client.xorb_location

        def location(xh: bytes) -> XorbLocation:
            together.wait()  # broken (and the read fails) if asked one at a time
            return get_location(xh)

        client.xorb_location = location  # type: ignore[method-assign]
        out = io.BytesIO()
        FileReader(src, fh).copy_to(out)
        assert out.getvalue() == b"".join(parts)
        src.close()
        cache.close()


def test_a_sequential_first_read_fetches_while_the_other_layouts_are_asked(
    tmp_path: Path,
) -> None:
    """A reader made for a read at offset 0 starts fetching the first xorb's data before
    the other xorbs' layouts are answered (each location of those waits until a data fetch
    started); a reader made for a read elsewhere fetches nothing before its layouts and
    file hash are checked."""
    with _four_xorb_file(tmp_path / "srv", 12) as (client, fh, parts):
        first_xorb = serialize_xorb([parts[0]]).hash
        get_location, fetch = client.xorb_location, client.fetch_xorb_range
        fetching = threading.Event()
        waited: list[bool] = []

        def location(xh: bytes) -> XorbLocation:
            if xh != first_xorb:
                waited.append(fetching.wait(timeout=60))  # False: asked before any fetch
            return get_location(xh)

        def fetch_range(*a: Any, **kw: Any) -> Any:
            fetching.set()
            return fetch(*a, **kw)

        client.xorb_location = location  # type: ignore[method-assign]
        client.fetch_xorb_range = fetch_range  # type: ignore[method-assign]
        cache, src = _source(client, tmp_path / "a")
        reader = FileReader(src, fh, opening=(0, 1 << 20))
        assert waited and all(waited)
        assert reader.read(0, 1 << 20) == b"".join(parts)
        src.close()
        cache.close()

        # a first read elsewhere: nothing fetched while the reader is made
        fetching.clear()
        waited.clear()
        client.xorb_location = get_location  # type: ignore[method-assign]
        cache, src = _source(client, tmp_path / "b")
        reader = FileReader(src, fh, opening=(100, 10))
        assert not fetching.is_set()
        assert reader.read(100, 10) == b"".join(parts)[100:110] and fetching.is_set()
        src.close()
        cache.close()


def test_a_sequential_reader_through_a_tiny_cache_fetches_each_byte_about_once(
    served: tuple[str, str, Upload], tmp_path: Path
) -> None:
    # With a cap below the 8 MiB aligned ranges, no range could be cached: each 128 KiB
    # read of a sequential reader fetched its whole range again (a 10 MiB file through a
    # 1 MiB cache: 67 MiB over the network).
    url, token, up = served
    with CASClient(url, token) as client:
        cache = NodeCache(str(tmp_path / "ranges"), 1 << 20)
        src = RemoteChunkSource(client, cache, str(tmp_path / "shards"))
        reader = FileReader(src, up.file_hash)
        step = 128 << 10
        got = b"".join(reader.read(o, step) for o in range(0, len(up.data), step))
        assert got == up.data
        assert src.fetched_bytes <= 1.5 * len(up.data), src.fetched_bytes
        assert cache.total_bytes <= 1 << 20
        src.close()
        cache.close()
