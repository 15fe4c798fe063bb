"""``xet://`` through fsspec, pyarrow and pandas, on a repository pushed with ``git-xet``."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import pickle
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import gitxet
from gitxet.fsspec import XetFileSystem, format_url
from tests.helpers.loader import read_all
from tests.helpers.proc import git_env, remote_and_work

pytestmark = pytest.mark.timeout(300)

N_ROWS = 60_000
COLUMNS = ["a", "b", "c", "d"]


def _parquet_bytes(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    table = pa.table({c: rng.random(N_ROWS) for c in COLUMNS})  # 480 KB a column
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="none", row_group_size=N_ROWS // 2)
    return buf.getvalue()


def _csv_bytes(seed: int, rows: int) -> bytes:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"id": np.arange(rows), "x": rng.random(rows), "k": rng.integers(0, 9, rows)})
    return df.to_csv(index=False).encode()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A bare remote (with '@' in its name) holding main (v1, v2), a tag, and feature/x."""
    tmp = tmp_path_factory.mktemp("fsspec")
    env = git_env(tmp)

    def sh(*a: str, cwd: Path = tmp) -> str:
        r = subprocess.run(list(a), cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (a, r.stdout, r.stderr)
        return r.stdout.strip()

    remote, work = remote_and_work(tmp, env, "data@2024.git")
    rnd = random.Random(7)
    v1 = {
        "data.parquet": _parquet_bytes(1),
        "table.csv": _csv_bytes(2, 30_000),
        "blob.bin": rnd.randbytes(3 << 20),
        "small.txt": b"hello\n",
        "nested/deep/notes.md": b"# notes\n",
        "nested/odd@name %41.txt": b"odd\n",
    }
    for p, d in v1.items():
        (work / p).parent.mkdir(parents=True, exist_ok=True)
        (work / p).write_bytes(d)
    os.symlink("small.txt", work / "link.txt")
    sh("git-xet", "add", ".", cwd=work)
    sh("git", "commit", "-q", "-m", "v1", cwd=work)
    first = sh("git", "rev-parse", "HEAD", cwd=work)
    sh("git", "tag", "v1.0", cwd=work)
    sh("git", "checkout", "-q", "-b", "feature/x", cwd=work)
    (work / "feature.txt").write_bytes(b"feature\n")
    sh("git-xet", "add", ".", cwd=work)
    sh("git", "commit", "-q", "-m", "feature", cwd=work)
    sh("git", "checkout", "-q", "main", cwd=work)
    v2 = dict(v1)
    v2["table.csv"] = _csv_bytes(3, 31_000)
    (work / "table.csv").write_bytes(v2["table.csv"])
    sh("git-xet", "add", ".", cwd=work)
    sh("git", "commit", "-q", "-m", "v2", cwd=work)
    second = sh("git", "rev-parse", "HEAD", cwd=work)
    sh("git", "push", "-q", "origin", "main", "feature/x", "v1.0", cwd=work)
    # the data really is in pointers (else this tests git blobs, not Xet reads)
    assert int(sh("git", "cat-file", "-s", "main:data.parquet", cwd=remote)) < 200
    yield {"remote": remote, "v1": v1, "v2": v2, "first": first, "second": second, "env": env}
    fs = XetFileSystem()
    fs.close()
    XetFileSystem.clear_instance_cache()


def url(ds: dict[str, Any], rev: str = "main", path: str = "") -> str:
    return format_url(str(ds["remote"]), rev, path)


@pytest.fixture
def fs() -> XetFileSystem:
    return fsspec.filesystem("xet")  # type: ignore[no-any-return]


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ---- listing ---------------------------------------------------------------------------------


def test_url_escapes_at_in_repo_path(dataset: dict[str, Any]) -> None:
    u = url(dataset, "main", "small.txt")
    assert "data%402024.git@main/small.txt" in u
    assert u.startswith("xet:///")


def test_ls_info_find_glob_fetch_no_data(fs: XetFileSystem, dataset: dict[str, Any]) -> None:
    v2: dict[str, bytes] = dataset["v2"]
    root = url(dataset)
    fs.close()  # cold: nothing cached from other tests
    fs.reset_fetch_stats()
    prefix = fs._strip_protocol(root)
    names = fs.ls(root, detail=False)
    assert [n[len(prefix) + 1 :] for n in names] == [
        ".gitattributes",
        ".xetconfig",
        "blob.bin",
        "data.parquet",
        "link.txt",
        "nested",
        "small.txt",
        "table.csv",
    ]
    for p, d in v2.items():
        info = fs.info(f"{root}/{p}")
        assert info["type"] == "file" and info["size"] == len(d), p
        assert info["commit"] == dataset["second"]
    assert fs.info(root)["type"] == "directory"
    assert fs.isdir(f"{root}/nested/deep") and not fs.isfile(f"{root}/nested")
    link = fs.info(f"{root}/link.txt")
    assert link["islink"] and link["destination"] == "small.txt"
    found = fs.find(root)
    assert {f[len(prefix) + 1 :] for f in found} >= set(v2)
    assert fs.glob(f"{root}/**/*.md") == [f"{prefix}/nested/deep/notes.md"]
    assert fs.glob(f"{root}/*.csv") == [f"{prefix}/table.csv"]
    assert fs.du(f"{root}/nested") == len(v2["nested/deep/notes.md"]) + 4
    assert fs.fetch_stats.bytes == 0  # sizes come from pointers, listings from trees


def test_paths_are_literal_and_normalized(fs: XetFileSystem, dataset: dict[str, Any]) -> None:
    root = url(dataset)
    # '@' and '%41' in a file name are not escapes: paths are taken as they are
    assert fs.cat_file(f"{root}/nested/odd@name %41.txt") == b"odd\n"
    assert fs.cat_file(f"{root}//nested/./deep//notes.md") == b"# notes\n"
    assert fs.exists(f"{root}/nested/") and not fs.exists(f"{root}/nested/nope")
    with pytest.raises(ValueError, match=r"'\.\.'"):
        fs.info(f"{root}/nested/../small.txt")


# ---- pyarrow / pandas --------------------------------------------------------------------------


def test_pyarrow_reads_parquet_equal_to_committed(
    fs: XetFileSystem, dataset: dict[str, Any]
) -> None:
    committed = pq.read_table(io.BytesIO(dataset["v2"]["data.parquet"]))
    path = fs._strip_protocol(url(dataset, dataset["second"], "data.parquet"))
    assert pq.read_table(path, filesystem=fs).equals(committed)
    assert pq.ParquetFile(fs.open(path)).metadata.num_rows == N_ROWS


def test_parquet_projection_fetches_fewer_bytes(fs: XetFileSystem, dataset: dict[str, Any]) -> None:
    data: bytes = dataset["v2"]["data.parquet"]
    path = fs._strip_protocol(url(dataset, dataset["second"], "data.parquet"))
    fs.close()  # a cold chunk cache, so every byte read is counted
    fs.reset_fetch_stats()
    got = pq.read_table(path, filesystem=fs, columns=["c"])
    fetched = fs.fetch_stats
    assert got.column("c").equals(pq.read_table(io.BytesIO(data), columns=["c"]).column("c"))
    # one column of four, plus footer and whole-chunk rounding: well under half the file
    assert 0 < fetched.bytes < len(data) // 2, (fetched, len(data))
    fs.reset_fetch_stats()
    pq.read_table(path, filesystem=fs)  # the whole table: the rest of the file now
    assert fs.fetch_stats.bytes >= len(data) - fetched.bytes - (256 << 10)


def test_pandas_reads_csv_and_parquet_urls(dataset: dict[str, Any]) -> None:
    v2: dict[str, bytes] = dataset["v2"]
    df = pd.read_csv(url(dataset, dataset["second"], "table.csv"))
    pd.testing.assert_frame_equal(df, pd.read_csv(io.BytesIO(v2["table.csv"])))
    pdf = pd.read_parquet(url(dataset, "main", "data.parquet"), columns=["a", "d"])
    expect = pd.read_parquet(io.BytesIO(v2["data.parquet"]), columns=["a", "d"])
    pd.testing.assert_frame_equal(pdf, expect)


# ---- revisions, errors, entry point ------------------------------------------------------------


def test_old_commit_tag_and_branch_resolve(fs: XetFileSystem, dataset: dict[str, Any]) -> None:
    v1: dict[str, bytes] = dataset["v1"]
    v2: dict[str, bytes] = dataset["v2"]
    assert v1["table.csv"] != v2["table.csv"]
    for rev in (dataset["first"], dataset["first"][:10], "v1.0", "main~1"):
        assert sha(fs.cat_file(url(dataset, rev, "table.csv"))) == sha(v1["table.csv"]), rev
        assert fs.resolve(url(dataset, rev)) == dataset["first"]
    assert fs.cat_file(url(dataset, "main", "table.csv")) == v2["table.csv"]
    # a branch with '/' in its name: %2F in the URL
    assert url(dataset, "feature/x", "feature.txt").count("feature%2Fx") == 1
    assert fs.cat_file(url(dataset, "feature/x", "feature.txt")) == b"feature\n"
    assert fs.cat_file(url(dataset, "feature/x", "table.csv")) == v1["table.csv"]


def test_missing_path_and_bad_repo_or_revision(
    fs: XetFileSystem, dataset: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.bin"):
        fs.open(url(dataset, "main", "nope.bin"))
    with pytest.raises(FileNotFoundError):
        fs.info(url(dataset, "main", "small.txt/below"))
    with pytest.raises(FileNotFoundError, match="no revision 'no-such-branch'"):
        fs.ls(url(dataset, "no-such-branch"))
    with pytest.raises(FileNotFoundError, match="no revision"):
        fs.cat_file(url(dataset, "0" * 40, "small.txt"))
    with pytest.raises(FileNotFoundError, match="repository"):
        fs.info(format_url(str(tmp_path / "missing.git"), "main", "x"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(FileNotFoundError, match="not a git repository"):
        fs.info(format_url(str(tmp_path / "plain"), "main", "x"))
    with pytest.raises(ValueError, match="no '@'"):
        fs.info("xet:///srv/data.git/x")
    with pytest.raises(ValueError, match="absolute path"):
        fs.info("xet://relative.git@main/x")
    with pytest.raises(IsADirectoryError):
        fs.open(url(dataset, "main", "nested"))
    assert not fs.exists(url(dataset, "no-such-branch", "small.txt"))


def test_writes_raise_read_only(fs: XetFileSystem, dataset: dict[str, Any], tmp_path: Path) -> None:
    target = url(dataset, "main", "new.txt")
    local = tmp_path / "x"
    local.write_bytes(b"x")
    for attempt in (
        lambda: fs.open(target, "wb"),
        lambda: fs.open(target, "w"),
        lambda: fs.pipe(target, b"x"),
        lambda: fs.put(str(local), target),
        lambda: fs.rm(url(dataset, "main", "small.txt")),
        lambda: fs.mkdir(url(dataset, "main", "d")),
        lambda: fs.mv(url(dataset, "main", "small.txt"), target),
        lambda: fs.touch(target),
    ):
        with pytest.raises(PermissionError, match="read-only") as exc:
            attempt()
        assert exc.value.errno == errno.EROFS
    assert fs.cat_file(url(dataset, "main", "small.txt")) == b"hello\n"


def test_fsspec_open_through_entry_point_without_importing_gitxet(dataset: dict[str, Any]) -> None:
    script = (
        "import sys, hashlib, fsspec\n"
        "assert 'gitxet' not in sys.modules\n"
        "with fsspec.open(sys.argv[1]) as f:\n"
        "    print(hashlib.sha256(f.read()).hexdigest())\n"
        "with fsspec.open(sys.argv[2], 'rt') as f:\n"
        "    print(f.read().strip())\n"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            url(dataset, "main", "blob.bin"),
            url(dataset, "feature/x", "feature.txt"),
        ],
        env=dataset["env"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [sha(dataset["v2"]["blob.bin"]), "feature"]


# ---- files and ranges --------------------------------------------------------------------------


def test_open_seek_read_and_pickle(fs: XetFileSystem, dataset: dict[str, Any]) -> None:
    data: bytes = dataset["v2"]["blob.bin"]
    rnd = random.Random(3)
    with fs.open(url(dataset, "main", "blob.bin")) as f:
        assert f.seekable() and not f.writable() and f.size == len(data)
        for _ in range(50):
            off = rnd.randrange(len(data) + 10)
            n = rnd.choice([1, 100, 4096, 70_000, 1 << 20])
            f.seek(off)
            assert f.read(n) == data[off : off + n]
        f.seek(-10, os.SEEK_END)
        assert f.read() == data[-10:]
        f.seek(12345)
        g = pickle.loads(pickle.dumps(f))
        try:
            assert g.tell() == 12345 and g.read(100) == data[12345:12445]
        finally:
            g.close()
    assert pickle.loads(pickle.dumps(fs)) is fs  # fsspec's instance cache
    with pytest.raises(ValueError):
        f.read(1)


def test_sequential_reads_grow_the_read_ahead(fs: XetFileSystem, dataset: dict[str, Any]) -> None:
    data: bytes = dataset["v2"]["blob.bin"]
    with fs.open(url(dataset, "main", "blob.bin")) as f:
        parts = []
        while block := f.read(16 << 10):
            parts.append(block)
        cache = f.cache
        assert b"".join(parts) == data
        # 192 reads of 16 KiB; the window doubles up to 8 MiB, so a handful of fetches
        assert len(parts) == 192 and cache.miss_count <= 8, cache.miss_count
        assert cache.total_requested_bytes == len(data)
    with fs.open(url(dataset, "main", "blob.bin")) as f:
        for off in (2 << 20, 100, 1 << 20):  # random: no read-ahead at all
            f.seek(off)
            assert f.read(4096) == data[off : off + 4096]
        assert f.cache.total_requested_bytes == 3 * 4096


def test_cat_file_and_cat_ranges(fs: XetFileSystem, dataset: dict[str, Any]) -> None:
    v2: dict[str, bytes] = dataset["v2"]
    blob, csv = url(dataset, "main", "blob.bin"), url(dataset, "main", "table.csv")
    b, c = v2["blob.bin"], v2["table.csv"]
    assert fs.cat_file(blob, 10, 20) == b[10:20]
    assert fs.cat_file(blob, -100) == b[-100:]
    assert fs.cat_file(blob, 5, -5) == b[5:-5]
    assert fs.cat_file(blob, len(b) + 5) == b""
    assert fs.cat(url(dataset, "main", "small.txt")) == b"hello\n"
    paths = [blob, csv, blob, blob, url(dataset, "main", "nope"), csv]
    starts: list[int | None] = [0, 100, 1 << 20, 4000, 0, -50]
    ends: list[int | None] = [100, 200, (1 << 20) + 10, 5000, 10, None]
    got = fs.cat_ranges(paths, starts, ends)
    assert got[0] == b[:100] and got[1] == c[100:200] and got[2] == b[1 << 20 : (1 << 20) + 10]
    assert got[3] == b[4000:5000] and got[5] == c[-50:]
    assert isinstance(got[4], FileNotFoundError)
    with pytest.raises(FileNotFoundError):
        fs.cat_ranges(paths, starts, ends, on_error="raise")
    assert fs.cat_ranges([blob, blob], [0, 10], [5, 20], max_gap=0) == [b[:5], b[10:20]]


def test_corrupt_xorb_is_an_error_not_data(dataset: dict[str, Any], tmp_path: Path) -> None:
    remote = tmp_path / "copy.git"
    shutil.copytree(dataset["remote"], remote, symlinks=True)
    xorbs = sorted((remote / "xet" / "xorbs").rglob("*"), key=lambda p: p.stat().st_size)
    victim = [p for p in xorbs if p.is_file()][-1]
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 3] ^= 0xFF  # inside the chunk data, not the footer
    victim.write_bytes(bytes(raw))
    fs = XetFileSystem(skip_instance_cache=True, cache_bytes=1 << 20)
    try:
        with pytest.raises(OSError) as exc:
            for p in ("blob.bin", "data.parquet", "table.csv"):
                fs.cat_file(format_url(str(remote), "main", p))
        assert exc.value.errno == errno.EIO
    finally:
        fs.close()


def test_fork_child_reads_with_its_own_handles(fs: XetFileSystem, dataset: dict[str, Any]) -> None:
    data: bytes = dataset["v2"]["blob.bin"]
    f = fs.open(url(dataset, "main", "blob.bin"))
    try:
        assert f.read(10) == data[:10]
        rd, wr = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            ok = b"0"
            try:
                f.seek(3 << 19)
                same = f.read(1000) == data[3 << 19 : (3 << 19) + 1000]
                other = fs.cat_file(url(dataset, "main", "small.txt")) == b"hello\n"
                ok = b"1" if same and other else b"0"
            finally:
                os.write(wr, ok)
                os._exit(0)
        os.close(wr)
        assert os.read(rd, 1) == b"1"
        os.close(rd)
        os.waitpid(pid, 0)
        f.seek(0)
        assert f.read(10) == data[:10]  # the parent's handles still work
    finally:
        f.close()


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_loader_workers_read_exact_bytes_while_the_parent_reads(
    fs: XetFileSystem, dataset: dict[str, Any], start: str
) -> None:
    """Four workers (spawned with the pickled filesystem, or forked as torch's DataLoader
    does by default on Linux) read every file while a thread of the parent keeps reading
    too. (A fork inside SQLite or an import: tests/unit/test_sqlite_fork, test_fork_imports.)"""
    import multiprocessing
    import threading

    files: dict[str, bytes] = dataset["v2"]
    names = [url(dataset, "main", p) for p in sorted(files)]
    want = [sha(files[p]) for p in sorted(files)]
    stop = threading.Event()

    wrong: list[str] = []

    def parent_reads() -> None:
        while not stop.is_set():
            wrong.extend(n for n, w in zip(names, want, strict=True) if sha(fs.cat_file(n)) != w)

    reader = threading.Thread(target=parent_reads, daemon=True)
    reader.start()
    try:
        with multiprocessing.get_context(start).Pool(4) as pool:
            got = pool.map_async(read_all, [(fs, names)] * 8).get(timeout=120)
    finally:
        stop.set()
        reader.join(60)
    assert got == [want] * 8
    assert not wrong


# ---- the small Python API ----------------------------------------------------------------------


def test_gitxet_open_and_ls(dataset: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    remote: Path = dataset["remote"]
    monkeypatch.chdir(remote.parent)
    rel = remote.name  # a relative path is taken against the current directory
    assert gitxet.ls(rel, "main", "nested") == ["nested/deep", "nested/odd@name %41.txt"]
    detail = gitxet.ls(remote, "main", "nested/deep", detail=True)
    assert [(d["path"], d["size"], d["type"]) for d in detail] == [
        ("nested/deep/notes.md", 8, "file")
    ]
    with gitxet.open(remote, dataset["first"], "table.csv") as f:
        assert f.read() == dataset["v1"]["table.csv"]
    with gitxet.open(rel, "main", "nested/deep/notes.md", "r", encoding="utf-8") as t:
        assert t.read() == "# notes\n"
    assert gitxet.ls(remote, "main", "small.txt") == ["small.txt"]


def test_evicted_commit_stays_open_for_its_files(dataset: dict[str, Any]) -> None:
    fs = XetFileSystem(skip_instance_cache=True, max_commits=1, cache_bytes=(1 << 20) + 1)
    pool = fs._pool
    try:
        f = fs.open(url(dataset, dataset["first"], "table.csv"))
        old = f._lease.value.fs
        assert fs.cat_file(url(dataset, "main", "small.txt")) == b"hello\n"  # evicts first
        assert [k[1] for k in pool.open_commits()] == [dataset["second"]]
        assert f.read() == dataset["v1"]["table.csv"]  # still served by the evicted commit
        assert not old._git._closed
        f.close()
        assert old._git._closed  # closed by its last user
        with fs.open(url(dataset, dataset["first"], "table.csv")) as g:  # opened afresh
            assert g.read(10) == dataset["v1"]["table.csv"][:10]
    finally:
        fs.close()


def test_watch_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="do not follow a branch"):
        XetFileSystem(watch="1s", skip_instance_cache=True)
