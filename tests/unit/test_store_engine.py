"""The local store and the ingest/reconstruct engine: dedup, exact bytes, corruption."""

from __future__ import annotations

import io
import os
import random
import select
import threading
import time

import pytest

from gitxet.chunking import chunk_bytes
from gitxet.data.clean import Ingestor
from gitxet.data.reconstruct import ChunkCache, FileReader
from gitxet.errors import FileNotFoundInCASError, IntegrityError, ShardFormatError
from gitxet.formats import shard as shardfmt
from gitxet.hashing import ZERO_HASH, chunk_hash, to_hex
from gitxet.store.cas import LocalCAS
from gitxet.util import nowait


def versions(seed: int = 1, size: int = 6 << 20, count: int = 5) -> list[bytes]:
    """A file and `count - 1` edited versions (inserts, overwrites, appends)."""
    rnd = random.Random(seed)
    cur = bytearray(rnd.randbytes(size))
    out = [bytes(cur)]
    for _ in range(count - 1):
        at = rnd.randrange(len(cur))
        cur[at:at] = rnd.randbytes(rnd.randrange(1, 5000))  # insert
        at = rnd.randrange(len(cur) - 100)
        cur[at : at + 100] = rnd.randbytes(100)  # overwrite
        cur += rnd.randbytes(rnd.randrange(1, 300_000))  # append
        out.append(bytes(cur))
    return out


def unique_chunk_bytes(datas: list[bytes]) -> int:
    seen: dict[bytes, int] = {}
    for d in datas:
        for c in chunk_bytes(d):
            seen[chunk_hash(c)] = len(c)
    return sum(seen.values())


def test_five_versions_store_only_unique_chunks(tmp_path: str) -> None:
    cas = LocalCAS(os.path.join(tmp_path, "cas"), durable=False)
    datas = versions()
    results = []
    for d in datas:  # one ingest session per version, as separate commits would do
        with Ingestor(cas) as ing:
            results.append(ing.add_stream(io.BytesIO(d)))
            assert ing.flush() is not None
    stored = cas.stats().xorb_bytes
    unique = unique_chunk_bytes(datas)
    assert stored <= 1.1 * unique, (stored, unique)
    assert results[0].reused_bytes == 0
    for r in results[1:]:
        assert r.reused_bytes > 0.9 * r.size  # small edits reuse almost everything
    # exact bytes back, whole files and random ranges
    rnd = random.Random(7)
    cache = ChunkCache()
    for d, r in zip(datas, results, strict=True):
        fr = FileReader(cas, r.file_hash, cache=cache)
        assert fr.size == len(d)
        out = io.BytesIO()
        fr.copy_to(out)
        assert out.getvalue() == d
    fr = FileReader(cas, results[-1].file_hash, cache=ChunkCache(1 << 20))
    d = datas[-1]
    for _ in range(1000):
        off = rnd.randrange(len(d) + 10)
        n = rnd.choice([0, 1, 4096, 65536, 200_000, rnd.randrange(1, 1 << 20)])
        assert fr.read(off, n) == d[off : off + n]


def test_dedup_within_one_file_and_session(tmp_path: str) -> None:
    cas = LocalCAS(str(tmp_path), durable=False)
    block = random.Random(2).randbytes(1 << 20)
    with Ingestor(cas) as ing:
        r = ing.add_stream(io.BytesIO(block * 8))
        r2 = ing.add_stream(io.BytesIO(block * 8))
        ing.flush()
    assert r.new_bytes < 1.2 * len(block)
    assert r2.new_bytes == 0
    assert r.file_hash == r2.file_hash
    fr = FileReader(cas, r.file_hash)
    assert fr.read(0, 10 << 20) == block * 8


def test_empty_and_small_files(tmp_path: str) -> None:
    cas = LocalCAS(str(tmp_path), durable=False)
    with Ingestor(cas) as ing:
        e = ing.add_stream(io.BytesIO(b""))
        s = ing.add_stream(io.BytesIO(b"Hello World!"))
        ing.flush()
    assert e.file_hash == ZERO_HASH and e.size == 0
    assert to_hex(s.file_hash) == "a9dae0ad88b060bdd7e7c87abdcf95b132c95a0414b06d4f6beb68d287b87165"
    assert FileReader(cas, e.file_hash).read(0, 10) == b""
    assert FileReader(cas, s.file_hash).read(6, 100) == b"World!"


def test_xorbs_are_cut_at_the_limits(tmp_path: str) -> None:
    cas = LocalCAS(str(tmp_path), durable=False)
    data = random.Random(3).randbytes(3 << 20)
    with Ingestor(cas, max_xorb_bytes=1 << 20) as ing:
        r = ing.add_stream(io.BytesIO(data))
        ing.flush()
    assert cas.stats().xorbs >= 3
    info = cas.file_info(r.file_hash)
    assert info is not None and len(info.terms) >= 3
    assert FileReader(cas, r.file_hash).read(0, len(data)) == data


def corrupt_one_byte(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("where", ["payload", "header", "footer"])
def test_corruption_is_detected_and_names_the_xorb(tmp_path: str, where: str) -> None:
    cas = LocalCAS(str(tmp_path), durable=False)
    data = random.Random(4).randbytes(2 << 20)
    with Ingestor(cas) as ing:
        r = ing.add_stream(io.BytesIO(data))
        ing.flush()
    (xh,) = list(cas.xorb_hashes())
    path = cas.xorb_path(xh)
    size = os.path.getsize(path)
    at = {"payload": 1000, "header": 2, "footer": size - 500}[where]
    corrupt_one_byte(path, at)
    fresh = LocalCAS(str(tmp_path), durable=False)  # no cached layouts
    with pytest.raises(IntegrityError) as ei:
        fr = FileReader(fresh, r.file_hash)
        fr.read(0, len(data))
    assert to_hex(xh) in str(ei.value)


def test_missing_file_and_shard_validation(tmp_path: str) -> None:
    cas = LocalCAS(str(tmp_path), durable=False)
    with pytest.raises(FileNotFoundInCASError):
        FileReader(cas, b"\x01" * 32)
    bogus = shardfmt.FileInfo(
        b"\x02" * 32, [shardfmt.FileTerm(b"\x03" * 32, 0, 1, 10)], [b"\x00" * 32], bytes(32)
    )
    with pytest.raises(ShardFormatError, match="missing xorb"):
        cas.put_shard(shardfmt.upload_shard_for([bogus], []))


def test_index_is_rebuildable_and_concurrent_ingest(tmp_path: str) -> None:
    root = str(tmp_path)
    datas = [random.Random(10 + i).randbytes(1 << 20) for i in range(4)]
    results: list[bytes] = []

    def work(d: bytes) -> None:
        cas = LocalCAS(root, durable=False)
        with Ingestor(cas) as ing:
            results.append(ing.add_stream(io.BytesIO(d)).file_hash)
            ing.flush()

    threads = [threading.Thread(target=work, args=(d,)) for d in datas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.unlink(os.path.join(root, "index.sqlite"))
    for suffix in ("-wal", "-shm"):
        if os.path.exists(os.path.join(root, "index.sqlite" + suffix)):
            os.unlink(os.path.join(root, "index.sqlite" + suffix))
    cas = LocalCAS(root, durable=False)
    got = {FileReader(cas, h).read(0, 1 << 21) for h in results}
    assert got == set(datas)


def _mixed_file(tmp_path: str) -> tuple[LocalCAS, bytes, bytes]:
    """A store holding one file of incompressible and highly compressible halves."""
    cas = LocalCAS(str(tmp_path), durable=False)
    rnd = random.Random(11)
    data = rnd.randbytes(1 << 20) + b"abcd" * (1 << 18)
    with Ingestor(cas) as ing:
        r = ing.add_stream(io.BytesIO(data))
        ing.flush()
    return cas, data, r.file_hash


def test_verified_parts_of_uncompressed_chunks_are_single_preads(tmp_path: str) -> None:
    cas, data, fh = _mixed_file(tmp_path)
    (xh,) = list(cas.xorb_hashes())
    lay = cas.layout(xh)
    first = lay.data_offsets[1]
    assert cas.read_verified_part(xh, 0, 0, 10) is None  # never verified: decode first
    assert cas.read_chunks(xh, 0, 1)[0] == data[:first]
    assert cas.read_verified_part(xh, 0, 100, 4196) == data[100:4196]
    assert cas.read_verified_part(xh, 0, first, first) == b""
    with pytest.raises(IndexError):
        cas.read_verified_part(xh, 0, 0, first + 1)
    # a compressed chunk is never served as raw bytes, verified or not
    last = lay.num_chunks - 1
    cas.read_chunks(xh, last, last + 1)
    assert cas.read_verified_part(xh, last, 0, 16) is None
    # a reader over the store serves every range exactly through both paths
    fr = FileReader(cas, fh, cache=ChunkCache(1 << 16))
    rnd = random.Random(12)
    for _ in range(2000):
        off = rnd.randrange(len(data))
        n = rnd.choice([1, 512, 4096, rnd.randrange(1, 100_000)])
        assert fr.read(off, n) == data[off : off + n]


def test_chunk_runs_are_the_chunks_joined_and_outlive_the_read(tmp_path: str) -> None:
    """``read_chunk_runs`` gives each run's chunks joined, stored uncompressed or not, and
    what it returned stays intact after the next read (which reuses the read's buffer);
    a run outside the read, or a corrupt chunk, is refused."""
    cas, data, _ = _mixed_file(tmp_path)
    (xh,) = list(cas.xorb_hashes())
    n = cas.layout(xh).num_chunks
    offs = cas.layout(xh).data_offsets
    assert n >= 4
    runs = [(0, 1), (1, 3), (3, n)]  # incompressible, then the compressible half last
    got = cas.read_chunk_runs(xh, 0, n, runs)
    assert got == [data[offs[a] : offs[b]] for a, b in runs]
    with nowait.nowait():  # (an event loop's read: the thread's reused buffer)
        again = cas.read_chunk_runs(xh, 0, n, runs)
        other = cas.read_chunk_runs(xh, 1, 2, [(1, 2)])
    assert again == got and other == [data[offs[1] : offs[2]]]
    with pytest.raises(IndexError):
        cas.read_chunk_runs(xh, 1, 3, [(0, 2)])
    corrupt_one_byte(cas.xorb_path(xh), cas.layout(xh).byte_offsets[1] + 100)
    fresh = LocalCAS(str(tmp_path), durable=False)
    with pytest.raises(IntegrityError):
        fresh.read_chunk_runs(xh, 0, n, runs)


def test_verified_ranges_across_chunks_are_single_preads(tmp_path: str) -> None:
    cas, data, fh = _mixed_file(tmp_path)
    (xh,) = list(cas.xorb_hashes())
    offs = cas.layout(xh).data_offsets
    assert cas.read_verified_range(xh, 0, 10) is None  # never verified: decode first
    cas.read_chunks(xh, 0, 3)
    assert cas.read_verified_range(xh, 100, offs[3] - 5) == data[100 : offs[3] - 5]
    assert cas.read_verified_range(xh, offs[1], offs[2]) == data[offs[1] : offs[2]]
    assert cas.read_verified_range(xh, 5, offs[3] + 1) is None  # chunk 3 not verified yet
    for bad in ((0, 0), (-1, 5), (0, offs[-1] + 1)):
        with pytest.raises(IndexError):
            cas.read_verified_range(xh, *bad)
    # every chunk verified: ranges inside the incompressible half are served raw, ranges
    # touching a compressed chunk never are
    cas.read_chunks(xh, 0, len(offs) - 1)
    random_end = max(o for o in offs if o <= 1 << 20)
    rnd = random.Random(13)
    for _ in range(500):
        lo = rnd.randrange(random_end - 1)
        hi = rnd.randrange(lo + 1, random_end + 1)
        assert cas.read_verified_range(xh, lo, hi) == data[lo:hi]
    assert cas.read_verified_range(xh, 0, offs[-1]) is None
    # a reader serves every range exactly, on its first (decoding) and later (raw) reads
    fr = FileReader(cas, fh, cache=ChunkCache(1 << 16))
    for _ in range(1000):
        off = rnd.randrange(len(data))
        n = rnd.choice([1, 4096, 1 << 20, rnd.randrange(1, 300_000)])
        assert fr.read(off, n) == data[off : off + n]


def test_verification_does_not_outlive_the_descriptor(tmp_path: str) -> None:
    cas, data, _ = _mixed_file(tmp_path)
    (xh,) = list(cas.xorb_hashes())
    cas.read_chunks(xh, 0, 1)
    assert cas.read_verified_part(xh, 0, 0, 8) == data[:8]
    assert cas.read_verified_range(xh, 0, 8) == data[:8]
    cas.close()  # drops the descriptors, and with them what was verified through them
    assert cas.read_verified_part(xh, 0, 0, 8) is None
    assert cas.read_verified_range(xh, 0, 8) is None
    corrupt_one_byte(cas.xorb_path(xh), 100)  # the next reader hashes again, and notices
    with pytest.raises(IntegrityError):
        cas.read_chunks(xh, 0, 1)
    assert cas.read_verified_part(xh, 0, 0, 8) is None


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_open_xorb_descriptors_stay_bounded_under_concurrent_reads(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading many more xorbs than the descriptor cache holds, from 8 threads, never holds
    more than the cache plus one descriptor per reader, and every byte is right."""
    from gitxet.store import cas as casmod

    monkeypatch.setattr(casmod, "MAX_OPEN_XORBS", 8)
    monkeypatch.setattr(casmod, "MAX_OPEN_SHARDS", 4)
    cas = LocalCAS(str(tmp_path), durable=False)
    rnd = random.Random(5)
    files: dict[bytes, bytes] = {}
    for _ in range(120):  # one session per file: one xorb each
        data = rnd.randbytes(rnd.randrange(1, 20_000))
        with Ingestor(cas) as ing:
            files[ing.add_stream(io.BytesIO(data)).file_hash] = data
            ing.flush()
    assert len(list(cas.xorb_hashes())) == 120
    cas.close()
    base = _open_fds()
    peak = [0]
    errors: list[BaseException] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _open_fds() - base)

    def work(seed: int) -> None:
        r = random.Random(seed)
        hashes = list(files)
        try:
            for _ in range(400):
                fh = r.choice(hashes)
                data = files[fh]
                off = r.randrange(len(data))
                # twice: the second read of a verified chunk is a raw pread
                for _ in range(2):
                    got = FileReader(cas, fh, cache=ChunkCache(1)).read(off, 4096)
                    assert got == data[off : off + 4096]
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    watcher.join(10)
    assert errors == []
    # 8 xorbs and 4 shards cached + one of each per reader thread (+ the sqlite files the
    # reader threads open)
    assert peak[0] <= 8 + 4 + 2 * 8 + 3 * 8, peak[0]
    cas.close()


def test_open_removes_what_killed_writers_left(tmp_path: str) -> None:
    root = os.path.join(tmp_path, "store")
    cas = LocalCAS(root, durable=False)
    sx = __import__("gitxet.formats.xorb", fromlist=["x"]).serialize_xorb([b"a" * 1000])
    cas.put_serialized(sx)
    xdir = os.path.dirname(cas.xorb_path(sx.hash))
    killed = [
        os.path.join(root, "tmp", ".tmp-killed.incomplete"),  # where writers put them now
        os.path.join(xdir, ".tmp-older.incomplete"),  # beside xorbs, as before
        os.path.join(root, "shards", ".tmp-oldest"),
    ]
    live = os.path.join(root, "tmp", ".tmp-live.incomplete")
    for p in [*killed, live]:
        with open(p, "wb") as f:
            f.write(b"half a xorb")
    for p in killed:
        os.utime(p, (1, 1))
    os.unlink(os.path.join(root, ".swept-v1"))  # a store made by an older version
    cas.close()
    LocalCAS(root, durable=False).close()
    assert [p for p in killed if os.path.exists(p)] == []
    assert os.path.exists(live)  # a writer may still be using it
    assert sorted(os.listdir(xdir)) == [to_hex(sx.hash)]


def test_write_all_resumes_short_writes(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A xorb's parts reach the file in order even when writev writes less than asked
    (stopping inside a part), more parts than one writev may carry, and parts bigger than
    one write; no call asks for more than WRITE_BATCH bytes or IOV_MAX buffers."""
    from gitxet.util import streams

    real = os.writev
    calls: list[tuple[int, int]] = []

    def short(fd: int, buffers: list[memoryview]) -> int:
        total = sum(b.nbytes for b in buffers)
        calls.append((len(buffers), total))
        cut = max(1, total // 3)  # a third of what was asked, often mid-part
        out = bytearray()
        for b in buffers:
            out += b
            if len(out) >= cut:
                break
        return real(fd, [memoryview(bytes(out[:cut]))])

    monkeypatch.setattr(streams.os, "writev", short)
    rng = random.Random(5)
    parts = [rng.randbytes(rng.randrange(1, 300)) for _ in range(2500)] + [b""]
    parts += [rng.randbytes(streams.WRITE_BATCH * 2 + 7), b"tail"]
    path = os.path.join(tmp_path, "out")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        streams.write_all(fd, parts)
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == b"".join(parts)
    assert max(n for n, _ in calls) == streams._IOV_MAX and len(calls) > 3
    assert max(size for _, size in calls) == streams.WRITE_BATCH


def test_the_sha256_of_ranges_written_at_offsets_out_of_order_is_that_of_the_file() -> None:
    """copy_to(sha256=...) hashes in file order also when ranges are written at offsets by
    several threads, in any order (the path of a clone from a server)."""
    import hashlib
    import threading
    from collections.abc import Sequence

    from gitxet.data.reconstruct import _Sha256Out

    data = random.Random(11).randbytes(1 << 20)
    buf = bytearray(len(data))

    class Positional(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write_at(self, offset: int, views: Sequence[memoryview]) -> None:
            for v in views:
                buf[offset : offset + len(v)] = v
                offset += len(v)

    hashing = _Sha256Out.around(Positional())  # type: ignore[arg-type]
    assert callable(getattr(hashing, "write_at", None))
    cuts = sorted(random.Random(3).sample(range(1, len(data)), 40))
    ranges = list(zip([0, *cuts], [*cuts, len(data)], strict=True))
    random.Random(5).shuffle(ranges)
    threads = [
        threading.Thread(
            target=hashing.write_at,  # type: ignore[attr-defined]
            args=(a, [memoryview(data)[a : (a + b) // 2], memoryview(data)[(a + b) // 2 : b]]),
        )
        for a, b in ranges
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert bytes(buf) == data
    assert hashing.hexdigest() == hashlib.sha256(data).hexdigest()
    plain = _Sha256Out.around(io.BytesIO())  # type: ignore[arg-type]
    assert not callable(getattr(plain, "write_at", None))


def _small_files(root: str, n: int) -> list[bytes]:
    """File hashes of ``n`` small files stored in one session (one shard) at ``root``."""
    rnd = random.Random(n)
    with Ingestor(LocalCAS(root, durable=False)) as ing:
        hashes = [ing.add_stream(io.BytesIO(rnd.randbytes(3000 + i))).file_hash for i in range(n)]
        ing.flush()
    return hashes


def test_describe_reads_many_files_descriptions_at_once(tmp_path: str) -> None:
    root = os.path.join(tmp_path, "cas")
    hashes = _small_files(root, 30)
    unknown = bytes(range(32))
    expected = {h: LocalCAS(root, durable=False).file_info(h) for h in hashes}
    cas = LocalCAS(root, durable=False)
    assert cas.describe([*hashes, unknown, hashes[0]]) == set(hashes)

    def no_index() -> None:
        raise AssertionError("file_info queried the index after describe")

    cas._db = no_index  # type: ignore[method-assign]  # described: answered from memory
    assert {h: cas.file_info(h) for h in hashes} == expected


def test_describe_leaves_a_hostile_block_to_file_info(tmp_path: str) -> None:
    root = os.path.join(tmp_path, "cas")
    hashes = _small_files(root, 5)
    cas = LocalCAS(root, durable=False)
    name, pos = (
        cas._db().execute("SELECT shard, pos FROM files WHERE hash = ?", (hashes[2],)).fetchone()
    )
    corrupt_one_byte(cas.shard_path(name), pos)  # the block now names another file
    cas = LocalCAS(root, durable=False)
    assert hashes[2] not in cas.describe(hashes)  # a hint: it never raises
    with pytest.raises(ShardFormatError):
        cas.file_info(hashes[2])
    assert cas.file_info(hashes[0]) == LocalCAS(root, durable=False).file_info(hashes[0])


def _many_file_shards(shards: int, files: int) -> tuple[bytes, list[bytes]]:
    """``shards`` serialized shards of ``files`` one-chunk files each, all in one xorb
    (named, not stored: callers pass it as a remote xorb)."""
    xorb = b"\x07" * 32
    rnd = random.Random(5)
    out = []
    for _ in range(shards):
        hashes = [rnd.randbytes(32) for _ in range(files)]
        infos = [
            shardfmt.FileInfo(rnd.randbytes(32), [shardfmt.FileTerm(xorb, i, i + 1, 100)])
            for i in range(files)
        ]
        chunks = shardfmt.XorbInfo.from_chunks(xorb, hashes, [100] * files)
        out.append(shardfmt.upload_shard_for(infos, [chunks]))
    return xorb, out


def test_shards_are_indexed_one_at_a_time(tmp_path: str) -> None:
    """A push stores every shard of its files at once (put_shards), and a store with no
    index re-reads them all (rebuild_index): a parsed shard is ~1 KB a file, so they
    are parsed and indexed one by one, never all held (100 MB at 100,000 files)."""
    import tracemalloc

    xorb, datas = _many_file_shards(20, 500)
    cas = LocalCAS(os.path.join(str(tmp_path), "cas"), durable=False)
    assert cas.shards_for_files([]) == set()  # the index exists before the measure
    probe = shardfmt.parse_shard(datas[7]).files[3].file_hash
    tracemalloc.start()
    try:
        parsed = shardfmt.parse_shard(datas[0])
        one = tracemalloc.get_traced_memory()[0]  # one shard parsed (500 files)
        del parsed
        tracemalloc.reset_peak()
        names = cas.put_shards(datas, remote_xorbs={xorb})
        _, stored_peak = tracemalloc.get_traced_memory()
        cas.close()
        fresh = LocalCAS(os.path.join(str(tmp_path), "cas"), durable=False)
        os.unlink(os.path.join(str(tmp_path), "cas", "index.sqlite"))
        tracemalloc.reset_peak()
        found = fresh.shards_for_files([probe])  # no index: rebuilt from the 20 shards
        _, rebuilt_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(names) == 20
    # all 20 parsed at once: 12.5 and 6.2 MB before; one by one: 0.36 and 0.44 MB (one: 0.31)
    assert stored_peak < 3 * one, (stored_peak, one)
    assert rebuilt_peak < 3 * one, (rebuilt_peak, one)
    assert found == {names[7]}


@pytest.mark.parametrize("cut", ["at a chunk", "inside a chunk"])
def test_chunks_read_ahead_in_parts_are_decoded_from_each_part(tmp_path: str, cut: str) -> None:
    """Bytes read ahead come in parts that each hold whole chunks: chunks are decoded from
    each part, never joined; a part that cuts a chunk (not what the C thread reads: a
    layout whose offsets lie) is refused, as a corrupt xorb."""
    cas, _, _ = _mixed_file(tmp_path)
    (xh,) = list(cas.xorb_hashes())
    lay = cas.layout(xh)
    n, offs = lay.num_chunks, lay.byte_offsets
    whole = cas.read_chunks(xh, 0, n)  # (one read: no parts)
    with open(cas.xorb_path(xh), "rb") as f:
        raw = memoryview(f.read())[: offs[n]]
    at = offs[2] if cut == "at a chunk" else offs[2] + 5
    cas._pre.take = lambda xf, lay, a, b: [raw[a:at], raw[at:b]]  # type: ignore[method-assign]
    with nowait.nowait():
        if cut == "at a chunk":
            assert cas.read_chunks(xh, 0, n) == whole
        else:
            with pytest.raises(IntegrityError):
                cas.read_chunks(xh, 0, n)


def test_an_event_loops_sequential_reads_use_bytes_the_c_thread_read_ahead(
    tmp_path: str,
) -> None:
    from gitxet.util import bgio, nowait
    from tests.helpers.ci import require_native

    require_native(bgio.NATIVE, "the C I/O thread (_bgio)")
    cas = LocalCAS(os.path.join(tmp_path, "cas"), durable=False)
    data = random.Random(31).randbytes(24 << 20)
    with Ingestor(cas) as ing:
        ing.add_stream(io.BytesIO(data))
        assert ing.flush() is not None
    hits = 0
    take = cas._pre.take

    def counted(*args: object) -> list[memoryview] | None:
        nonlocal hits
        got = take(*args)  # type: ignore[arg-type]
        hits += got is not None
        return got

    cas._pre.take = counted  # type: ignore[method-assign]
    poll = select.poll()
    (xh,) = list(cas.xorb_hashes())  # (one xorb: under the size limit)
    lay = cas.layout(xh)
    with open(cas.xorb_path(xh), "rb") as f:
        f.read()  # in the page cache: reads without waiting find it
    pos = 0
    for start in range(0, lay.num_chunks, 5):  # runs of 5 chunks, as batched first reads do
        end = min(start + 5, lay.num_chunks)
        with nowait.nowait():
            got = b"".join(cas.read_chunks(xh, start, end))
        assert got == data[pos : pos + len(got)]
        pos += len(got)
        # blocks end where chunks do: a read across two is decoded from both, not joined
        assert {k.start for k in cas._pre._blocks} <= set(lay.byte_offsets)
        assert {k.end for k in cas._pre._blocks} <= set(lay.byte_offsets)
        worker = cas._pre._worker
        if worker is not None and not hits and cas._pre._pending:
            poll.register(worker.fileno(), select.POLLIN)
            assert poll.poll(30_000)  # the first block read ahead is there
    assert pos == len(data)
    assert hits > 0  # (every later read inside a block read ahead of it)
    cas._pre.close()


class _Died(BaseException):
    """The process dies here (kill -9): nothing after this runs, no cleanup either."""


def test_a_prune_killed_while_removing_shards_leaves_a_usable_store(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prune killed after deleting a shard file and before re-indexing left an index
    naming a shard that was gone: every command reading the store (fsck, checkout, git's
    smudge) failed with 'no such file: .../shards/X.shard' for good. The index is now
    re-made without the removed shards first, and their files deleted after."""
    root = str(tmp_path)
    cas = LocalCAS(root, durable=False)
    old, kept = random.Random(20).randbytes(300_000), random.Random(21).randbytes(300_000)
    hashes = []
    for d in (old, kept):
        with Ingestor(cas) as ing:
            hashes.append(ing.add_stream(io.BytesIO(d)).file_hash)
            ing.flush()
    shard_of = {}
    for name in cas.shard_names():
        for f in shardfmt.parse_shard(cas.shard_bytes(name)).files:
            shard_of[f.file_hash] = name
    gone = shard_of[hashes[0]]
    real_unlink = os.unlink

    def dying_unlink(path: str, *args: object, **kwargs: object) -> None:
        if str(path).endswith(".shard"):
            real_unlink(path)
            raise _Died  # killed right after the first shard file went
        real_unlink(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", dying_unlink)
    with pytest.raises(_Died):
        cas.remove_objects([gone], [])
    monkeypatch.setattr(os, "unlink", real_unlink)

    again = LocalCAS(root, durable=False)  # the next command
    assert FileReader(again, hashes[1]).read(0, 1 << 20) == kept
    assert not again.has_file_data(hashes[0])  # gone, said as absent (fetched elsewhere)
    assert again.file_info(hashes[0]) is None


def test_a_shard_the_index_names_but_that_is_gone_is_forgotten(tmp_path: str) -> None:
    """A shard file deleted behind the index's back (by hand, or by a prune an older gitxet
    was killed in) made every read of the store fail 'no such file' until the index was
    removed by hand: its files are now absent (fetched from a remote), the rest reads."""
    root = str(tmp_path)
    cas = LocalCAS(root, durable=False)
    datas = [random.Random(30 + i).randbytes(300_000) for i in range(2)]
    hashes = []
    for d in datas:
        with Ingestor(cas) as ing:
            hashes.append(ing.add_stream(io.BytesIO(d)).file_hash)
            ing.flush()
    for name in cas.shard_names():
        files = shardfmt.parse_shard(cas.shard_bytes(name)).files
        if any(f.file_hash == hashes[0] for f in files):
            os.unlink(cas.shard_path(name))
    again = LocalCAS(root, durable=False)
    assert again.describe(hashes) == {hashes[1]}
    assert again.file_info(hashes[0]) is None and not again.has_file_data(hashes[0])
    assert again.lacking_data(hashes) == [hashes[0]]
    assert FileReader(again, hashes[1]).read(0, 1 << 20) == datas[1]
    with pytest.raises(FileNotFoundInCASError):
        FileReader(again, hashes[0])
    # and it stays forgotten: the index no longer names it
    assert LocalCAS(root, durable=False).file_info(hashes[0]) is None


def test_a_shard_file_left_without_index_rows_is_indexed_when_the_store_opens(
    tmp_path: str,
) -> None:
    """A writer killed between a shard's file and its index rows left files no reader
    found; the next open indexes such a shard once it is older than a live writer's."""
    src = LocalCAS(str(tmp_path / "src"), durable=False)
    data = random.Random(40).randbytes(300_000)
    with Ingestor(src) as ing:
        fh = ing.add_stream(io.BytesIO(data)).file_hash
        ing.flush()
    (name,) = src.shard_names()
    root = str(tmp_path / "dst")
    dst = LocalCAS(root, durable=False)
    dst.describe([])  # the index exists
    for x in src.xorb_hashes():
        os.makedirs(os.path.dirname(dst.xorb_path(x)), exist_ok=True)
        os.link(src.xorb_path(x), dst.xorb_path(x))
    path = dst.shard_path(name)
    with open(path, "wb") as f:  # the file, without its rows
        f.write(src.shard_bytes(name))
    young = LocalCAS(root, durable=False)
    assert young.file_info(fh) is None and not young.has_shard(name)  # may be a live writer's
    old = time.time() - 120
    os.utime(path, (old, old))
    from gitxet.store.locking import file_lock

    with file_lock(os.path.join(root, "locks", "prune")):  # a prune runs: its shards stay out
        assert not LocalCAS(root, durable=False).has_shard(name)
    again = LocalCAS(root, durable=False)
    assert again.has_shard(name)
    assert FileReader(again, fh).read(0, 1 << 20) == data
