"""Batched ingest (data.staging): shared xorbs, the journal, and recovery after a crash."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from gitxet.data.audit import verify_store
from gitxet.data.clean import Hashed, Ingestor, hash_small
from gitxet.data.dedup import RemoteDedup
from gitxet.data.reconstruct import FileReader
from gitxet.data.staging import StagedIngest, journal_dir, recover
from gitxet.store.cas import LocalCAS


def _files(n: int, seed: int = 3) -> list[bytes]:
    rnd = random.Random(seed)
    return [rnd.randbytes(rnd.randrange(1, 200_000)) for _ in range(n)]


def _read(cas: LocalCAS, fh: bytes) -> bytes:
    r = FileReader(cas, fh)
    return r.read(0, r.size)


def test_small_files_share_xorbs_and_one_shard_per_batch(tmp_path: Path) -> None:
    cas = LocalCAS(str(tmp_path / "cas"), durable=False)
    datas = _files(200)
    with StagedIngest(cas) as st:
        results = [st.add(io.BytesIO(d)) for d in datas]
        assert list(cas.xorb_hashes()) == []  # staged: nothing written per file
        assert len(os.listdir(journal_dir(cas))) == 1
    assert len(list(cas.xorb_hashes())) == 1  # ~20 MB of files: one shared xorb
    assert len(list(cas.shard_names())) == 1
    assert os.listdir(journal_dir(cas)) == []  # closed: journal removed
    for d, r in zip(datas, results, strict=True):
        assert _read(cas, r.file_hash) == d


def test_files_hashed_ahead_are_stored_as_those_hashed_here(tmp_path: Path) -> None:
    datas = _files(40, seed=5)
    asked: list[bytes] = []

    def ahead(data: bytes) -> Hashed | None:
        asked.append(data)
        return hash_small(data) if len(asked) % 2 else None  # every other one known

    plain = LocalCAS(str(tmp_path / "plain"), durable=False)
    with StagedIngest(plain) as st:
        want = [st.add(io.BytesIO(d)) for d in datas]
    cas = LocalCAS(str(tmp_path / "cas"), durable=False)
    with StagedIngest(cas) as st:
        got = [st.add(io.BytesIO(d), b"", ahead) for d in datas]
    assert asked == datas  # asked with each file's whole content
    assert got == want
    for d, r in zip(datas, got, strict=True):
        assert _read(cas, r.file_hash) == d


def test_a_version_the_path_has_is_neither_journaled_nor_stored(tmp_path: Path) -> None:
    """Content hashing to a version the path has (git re-cleaning a file it checked out)
    returns that file's result without a journal record, a xorb or a request."""
    same, edited = _files(2, seed=7)

    class Server:
        def __init__(self) -> None:
            self.asked: list[bytes] = []

        def file_shard(self, file_hash: bytes) -> None:
            self.asked.append(file_hash)

        def query_chunk(self, chunk_hash: bytes) -> None:
            return None

    server = Server()
    dedup = RemoteDedup(server)
    cas = LocalCAS(str(tmp_path / "cas"), durable=False)
    h = hash_small(same)
    with StagedIngest(cas, dedup=dedup) as st:
        dedup.versions([h.file_hash])
        r = st.add(io.BytesIO(same))
        assert (r.file_hash, r.sha256, r.size, r.new_bytes) == (h.file_hash, h.sha256, len(same), 0)
        assert not os.path.exists(journal_dir(cas)) or os.listdir(journal_dir(cas)) == []
        assert server.asked == []
        dedup.versions([h.file_hash])
        st.add(io.BytesIO(edited))  # an edit: the version's chunks are asked for
        assert server.asked == [h.file_hash]
    assert cas.file_info(h.file_hash) is None
    assert cas.file_info(hash_small(edited).file_hash) is not None


def test_a_full_xorb_is_written_without_splitting_files(tmp_path: Path) -> None:
    cas = LocalCAS(str(tmp_path / "cas"), durable=False)
    datas = _files(60)
    with StagedIngest(cas, max_xorb_bytes=1 << 20) as st:  # tiny xorbs for the test
        results = [st.add(io.BytesIO(d)) for d in datas]
        assert st.flushes > 3
    for r, d in zip(results, datas, strict=True):
        info = cas.file_info(r.file_hash)
        assert info is not None and len({t.xorb_hash for t in info.terms}) == 1
        assert _read(cas, r.file_hash) == d


def test_a_big_file_is_stored_before_add_returns(tmp_path: Path) -> None:
    cas = LocalCAS(str(tmp_path / "cas"), durable=False)
    small, big = b"s" * 1000, random.Random(4).randbytes(3 << 20)
    with StagedIngest(cas, stage_max=1 << 20) as st:
        rs = st.add(io.BytesIO(small))
        assert cas.file_info(rs.file_hash) is None  # staged
        rb = st.add(io.BytesIO(big))
        assert cas.file_info(rb.file_hash) is not None  # stored, and the staged one with it
        assert cas.file_info(rs.file_hash) is not None
    assert _read(cas, rb.file_hash) == big


def test_a_full_batch_is_stored_in_the_background_under_its_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a full batch is being stored, the next files go to a new journal; the old one
    stays (locked: recover leaves it alone) until its batch is in the store."""
    cas = LocalCAS(str(tmp_path / "cas"), durable=False)
    d = journal_dir(cas)
    release, storing = threading.Event(), threading.Event()
    real = Ingestor.flush

    def slow_flush(self: Ingestor) -> str | None:
        if threading.current_thread().name.startswith("gitxet-staged-store"):
            storing.set()
            assert release.wait(60)
        return real(self)

    monkeypatch.setattr(Ingestor, "flush", slow_flush)
    datas = _files(25, seed=8)
    with StagedIngest(cas, batch_files=10) as st:
        results = [st.add(io.BytesIO(x)) for x in datas[:15]]  # the first 10: a full batch
        assert storing.wait(60)
        assert len([n for n in os.listdir(d) if n.endswith(".journal")]) == 2
        assert recover(cas) == 0  # both journals belong to a live session
        assert all(cas.file_info(r.file_hash) is None for r in results)
        release.set()
        results += [st.add(io.BytesIO(x)) for x in datas[15:]]  # waits for the first batch
        assert all(cas.file_info(r.file_hash) is not None for r in results[:10])
        st.flush()  # waits for the second batch, stores the third: its journal stays, empty
        assert all(cas.file_info(r.file_hash) is not None for r in results)
        assert len([n for n in os.listdir(d) if n.endswith(".journal")]) == 1
    assert os.listdir(d) == []
    for r, x in zip(results, datas, strict=True):
        assert _read(cas, r.file_hash) == x


def _disk_full_in(monkeypatch: pytest.MonkeyPatch, method: str) -> threading.Event:
    """LocalCAS.``method`` fails with ENOSPC while the returned event is set."""
    real = getattr(LocalCAS, method)
    full = threading.Event()

    def failing(self: LocalCAS, *a: object, **kw: object) -> object:
        if full.is_set():
            raise OSError(28, "No space left on device")
        return real(self, *a, **kw)

    monkeypatch.setattr(LocalCAS, method, failing)
    return full


def test_a_failed_background_store_is_raised_and_its_journal_recovered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cas = LocalCAS(str(tmp_path / "cas"), durable=False)
    failing = _disk_full_in(monkeypatch, "put_shards")
    datas = _files(12, seed=9)
    st = StagedIngest(cas, batch_files=5)
    failing.set()
    results = [st.add(io.BytesIO(x)) for x in datas[:5]]  # a full batch: stored, and fails
    with pytest.raises(OSError, match="No space"):
        for x in datas[5:]:
            results.append(st.add(io.BytesIO(x)))
    failing.clear()
    st.close()  # stores what it still holds
    assert all(cas.file_info(r.file_hash) is None for r in results[:5])
    assert recover(cas) == 5  # the failed batch's journal was left for recover
    assert os.listdir(journal_dir(cas)) == []
    for r, x in zip(results, datas, strict=False):
        assert _read(cas, r.file_hash) == x


def test_a_failed_xorb_write_stores_no_shard_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that fills while a big file's xorb is written: the session stores nothing
    more (its shard would name the missing xorb: the store refused it and the user was
    told 'malformed data: shard: references missing xorb' instead of the full disk), its
    journal stays for recover, and the next session stores the file once there is space."""
    cas = LocalCAS(str(tmp_path / "cas"), durable=False)
    full = _disk_full_in(monkeypatch, "put_serialized")
    small, big = b"s" * 1000, random.Random(6).randbytes(3 << 20)
    st = StagedIngest(cas, stage_max=1 << 20)
    rs = st.add(io.BytesIO(small))
    full.set()
    with pytest.raises(OSError, match="No space"):
        st.add(io.BytesIO(big))
    with pytest.raises(OSError, match="No space"):  # not a shard naming a missing xorb
        st.close()
    assert list(cas.shard_names()) == []
    full.clear()
    assert recover(cas) == 1  # the small file journaled before the failure
    assert _read(cas, rs.file_hash) == small
    with StagedIngest(cas, stage_max=1 << 20) as again:
        rb = again.add(io.BytesIO(big))
    assert _read(cas, rb.file_hash) == big
    assert not verify_store(cas).problems


_CRASH = textwrap.dedent(
    """
    import io, os, random, sys
    from gitxet.data.staging import StagedIngest
    from gitxet.store.cas import LocalCAS
    cas = LocalCAS(sys.argv[1], durable=False)
    st = StagedIngest(cas)
    rnd = random.Random(3)
    for _ in range(int(sys.argv[2])):
        r = st.add(io.BytesIO(rnd.randbytes(rnd.randrange(1, 200_000))))
        print(r.file_hash.hex(), flush=True)
    if sys.argv[3] == "wait":
        sys.stdin.read()  # hold the session open until the test closes stdin
    os._exit(0)  # dies without closing the session: the journal stays
    """
)


def test_recover_stores_what_a_dead_session_journaled(tmp_path: Path) -> None:
    root = str(tmp_path / "cas")
    out = subprocess.run(
        [sys.executable, "-c", _CRASH, root, "40", "die"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    hashes = [bytes.fromhex(h) for h in out.stdout.split()]
    cas = LocalCAS(root, durable=False)
    assert all(cas.file_info(h) is None for h in hashes)  # never flushed
    assert recover(cas) == 40
    datas = _files(40)
    for h, d in zip(hashes, datas, strict=True):
        assert _read(cas, h) == d
    assert os.listdir(journal_dir(cas)) == []
    assert recover(cas) == 0


def test_recover_leaves_a_live_session_alone(tmp_path: Path) -> None:
    root = str(tmp_path / "cas")
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASH, root, "3", "wait"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        assert all(len(line.strip()) == 64 for line in lines)
        cas = LocalCAS(root, durable=False)
        assert recover(cas) == 0  # its lock is held
        assert len(os.listdir(journal_dir(cas))) == 1
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(60)
        assert proc.stdout is not None
        proc.stdout.close()
    assert recover(cas) == 3  # now it is dead


def test_a_torn_last_record_is_dropped(tmp_path: Path) -> None:
    cas = LocalCAS(str(tmp_path / "cas"), durable=False)
    st = StagedIngest(cas)
    r1 = st.add(io.BytesIO(b"first file"))
    st.add(io.BytesIO(b"second file"))
    assert st._journal is not None
    path = st._journal_path
    with open(path, "rb") as f:
        data = f.read()
    st._journal.close()  # the "crash": lock released, journal left behind
    st._session().close()
    with open(path, "wb") as f:
        f.write(data[:-3])  # the second record was being written
    assert recover(cas) == 1
    assert _read(cas, r1.file_hash) == b"first file"


def test_a_journal_is_locked_before_recover_can_see_it(tmp_path: Path) -> None:
    cas = LocalCAS(str(tmp_path / "cas"), durable=False)
    d = journal_dir(cas)
    os.makedirs(d)
    # a session between its open and its flock (young: left alone) and one that died there
    young, dead = os.path.join(d, "1-a.journal.new"), os.path.join(d, "2-b.journal.new")
    for p in (young, dead):
        Path(p).write_bytes(b"")
    os.utime(dead, (1, 1))
    with StagedIngest(cas) as st:
        st.add(io.BytesIO(b"x" * 100))
        (name,) = [n for n in os.listdir(d) if n.endswith(".journal")]
        assert recover(cas) == 0  # a live session's journal, locked from the start
        assert sorted(os.listdir(d)) == sorted([name, "1-a.journal.new"])
    assert os.listdir(d) == ["1-a.journal.new"]
