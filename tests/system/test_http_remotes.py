"""Local clones whose data is on a real `git xet serve` (uvicorn on loopback): mounts, xet://
paths, pull, fetch and checkout read it from the server, alone or next to a path remote.

Issue 15's live bug: a mount of a local lazy clone of an http repository returned EIO where
`git checkout` in the same clone fetched the data (only path remotes were consulted).
Issue 13: data from whichever remote has it, with an http `upstream`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig
from tests.helpers.fuse_env import fuse_unavailable_reason
from tests.helpers.proc import git, run, use_interpreter

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def srv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """(base URL with a write token in it, the token); git-xet on PATH, private cache/state."""
    root = tmp_path / "srv"
    token, _ = TokenStore(str(root)).create("write")
    use_interpreter(monkeypatch, tmp_path)
    monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp_path / "cache"))
    with BackgroundServer(ServerConfig(root=str(root), port=0)) as s:
        yield s.url.replace("http://", f"http://user:{token}@"), token


def xet(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run("git-xet", *args, cwd=cwd, check=check)


def new_work(tmp: Path, **remotes: str) -> Path:
    work = tmp / "work"
    git("init", "-q", str(work), cwd=tmp)
    for name, url in remotes.items():
        git("remote", "add", name, url, cwd=work)
    xet("init", cwd=work)
    return work


def commit(work: Path, name: str, data: bytes) -> None:
    (work / name).write_bytes(data)
    xet("add", name, cwd=work)
    git("commit", "-qm", name, cwd=work)


def is_pointer(path: Path) -> bool:
    return path.read_bytes().startswith(b"version https://gitxet.dev/spec/v1\n")


def fuse_or_skip() -> None:
    reason = fuse_unavailable_reason()
    if reason:
        pytest.skip(reason)


def read_through_mount(repo: Path, tmp: Path, files: dict[str, bytes]) -> None:
    """Mount ``repo`` at main in the background and read each file (whole and a pread)."""
    mnt = tmp / "mnt"
    mnt.mkdir(exist_ok=True)
    xet("mount", str(repo), "main", str(mnt), cwd=tmp)
    try:
        for name, data in files.items():
            assert (mnt / name).read_bytes() == data, name
            fd = os.open(mnt / name, os.O_RDONLY)
            try:
                assert os.pread(fd, 5000, 777) == data[777:5777]
            finally:
                os.close(fd)
    finally:
        xet("unmount", str(mnt), cwd=tmp, check=False)


@pytest.mark.fuse
def test_mount_of_a_local_lazy_clone_of_an_http_repo_reads_the_servers_data(
    srv: tuple[str, str], tmp_path: Path
) -> None:
    base, token = srv
    url = f"{base}/data.git"
    work = new_work(tmp_path, origin=url)
    big = random.Random(15).randbytes(3 << 20)
    commit(work, "big.bin", big)
    git("push", "-q", "origin", "main", cwd=work)
    lazy = tmp_path / "lazy"
    xet("clone", "--lazy", url, str(lazy), cwd=tmp_path)
    assert is_pointer(lazy / "big.bin")
    # xet:// of the local clone reads through the same resolver (no FUSE needed)
    import fsspec

    from gitxet.fsspec import xet_url

    xfs = fsspec.filesystem("xet", token=token)
    try:
        with xfs.open(xet_url(str(lazy), "main", "big.bin"), "rb") as f:
            f.seek(1000)
            assert f.read(4000) == big[1000:5000]
    finally:
        xfs.close()
        type(xfs).clear_instance_cache()
    fuse_or_skip()
    read_through_mount(lazy, tmp_path, {"big.bin": big})
    # a full clone keeps http data in the shared chunk cache, not its store: same mount path
    full = tmp_path / "full"
    xet("clone", url, str(full), cwd=tmp_path)
    assert (full / "big.bin").read_bytes() == big
    read_through_mount(full, tmp_path, {"big.bin": big})


@pytest.fixture
def http_fork(srv: tuple[str, str], tmp_path: Path) -> dict[str, object]:
    """origin: a path remote with v1 (a.bin); upstream: the server, with v1 and v2 (b.bin)."""
    base, _ = srv
    origin, upstream = tmp_path / "origin.git", f"{base}/data.git"
    git("init", "-q", "--bare", str(origin), cwd=tmp_path)
    work = new_work(tmp_path, origin=str(origin), upstream=upstream)
    rnd = random.Random(16)
    a, b = rnd.randbytes(600_000), rnd.randbytes(700_000)
    commit(work, "a.bin", a)
    git("push", "-q", "origin", "main", cwd=work)
    git("push", "-q", "upstream", "main", cwd=work)
    commit(work, "b.bin", b)
    git("push", "-q", "upstream", "main", cwd=work)
    return {"origin": origin, "upstream": upstream, "a": a, "b": b, "tmp": tmp_path}


def clone_of_origin(fork: dict[str, object], name: str, *, lazy: bool = False) -> Path:
    tmp = Path(str(fork["tmp"]))
    clone = tmp / name
    xet("clone", *(["--lazy"] if lazy else []), str(fork["origin"]), str(clone), cwd=tmp)
    git("remote", "add", "upstream", str(fork["upstream"]), cwd=clone)
    return clone


def test_pull_from_an_http_upstream_that_alone_has_the_data(
    http_fork: dict[str, object],
) -> None:
    clone = clone_of_origin(http_fork, "clone")
    git("pull", "-q", "upstream", "main", cwd=clone)
    assert (clone / "b.bin").read_bytes() == http_fork["b"]
    assert git("status", "--porcelain", cwd=clone) == ""


def test_fetch_checkout_and_mount_with_an_http_upstream(http_fork: dict[str, object]) -> None:
    tmp = Path(str(http_fork["tmp"]))
    lazy = clone_of_origin(http_fork, "lazy", lazy=True)
    git("pull", "-q", "upstream", "main", cwd=lazy)
    assert is_pointer(lazy / "b.bin")
    out = xet("fetch", "upstream", cwd=lazy)
    assert "2 file(s)" in out.stderr, out.stderr
    xet("checkout", cwd=lazy)
    assert (lazy / "a.bin").read_bytes() == http_fork["a"]  # from origin (a path)
    assert (lazy / "b.bin").read_bytes() == http_fork["b"]  # from upstream (the server)
    # a second lazy clone, mounted: a.bin from origin's store, b.bin from the server
    lazy2 = clone_of_origin(http_fork, "lazy2", lazy=True)
    git("pull", "-q", "upstream", "main", cwd=lazy2)
    fuse_or_skip()
    read_through_mount(lazy2, tmp, {"a.bin": http_fork["a"], "b.bin": http_fork["b"]})  # type: ignore[dict-item]


def test_no_remote_has_it_names_the_server_without_its_token(
    srv: tuple[str, str], http_fork: dict[str, object]
) -> None:
    _, token = srv
    clone = clone_of_origin(http_fork, "clone")
    ptr = (
        f"version https://gitxet.dev/spec/v1\noid sha256:{'a' * 64}\nsize 9\nxet-hash {'c' * 64}\n"
    )
    (clone / "ghost.bin").write_text(ptr)
    git("add", "ghost.bin", cwd=clone)
    git("commit", "-qm", "ghost", cwd=clone)
    (clone / "ghost.bin").unlink()
    r = xet("checkout", "ghost.bin", cwd=clone, check=False)
    assert r.returncode == 4, r.stderr
    shown = str(http_fork["upstream"]).replace(f"user:{token}@", "")
    assert f"upstream {shown}: does not have it" in r.stderr, r.stderr
    assert f"origin {http_fork['origin']}: does not have it" in r.stderr
    assert token not in r.stderr


class _Requests(logging.Handler):
    """The server's access log lines (it runs in this process) as "METHOD /path"."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.mark = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        rec = json.loads(record.getMessage())
        line = f"{rec['method']} {rec['path']}"
        if line == "GET /healthz":
            self.mark.set()
        else:
            self.lines.append(line)

    def take(self, base: str) -> list[str]:
        """The lines logged so far: a line is logged after its answer is sent, so a client
        may be gone before it is; a request sent after the client ended is logged last."""
        self.mark.clear()
        assert httpx.get(f"{base}/healthz", timeout=60).status_code == 200
        assert self.mark.wait(60)
        lines, self.lines = self.lines, []
        return lines


@pytest.mark.fuse
def push_small_pointers(
    tmp: Path, url: str, count: int, seed: int
) -> tuple[Path, dict[str, bytes]]:
    """A work tree pushing ``count`` small files (1-3 KB, every one a pointer) to ``url``."""
    work = new_work(tmp, origin=url)
    xet("track", "*.bin", cwd=work)  # every .bin a pointer, however small
    rnd = random.Random(seed)
    files = {
        f"d{i % 7}/f{i:04d}.bin": rnd.randbytes(rnd.randrange(1_000, 3_000)) for i in range(count)
    }
    for name, data in files.items():
        (work / name).parent.mkdir(exist_ok=True)
        (work / name).write_bytes(data)
    git("add", "-A", cwd=work)
    git("commit", "-qm", "small files", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    return work, files


@contextlib.contextmanager
def server_requests() -> Iterator[_Requests]:
    """The in-process server's access log, as "METHOD /path" lines, while inside."""
    log = logging.getLogger("gitxet.server.access")
    seen = _Requests()
    level = log.level
    log.addHandler(seen)
    log.setLevel(logging.INFO)
    try:
        yield seen
    finally:
        log.removeHandler(seen)
        log.setLevel(level)


def test_clone_of_many_small_files_asks_for_descriptions_in_batches(
    srv: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 16 over HTTP: `git xet clone` of N small files from a server gets their
    descriptions with one POST per 1,000 files, not a GET per file, and their data with a
    ranged GET per aligned range, not per file; `git xet checkout` of a lazy clone and a
    mount reading every file of a lazy clone from the server too."""
    base, _ = srv
    url = f"{base}/small.git"
    work, files = push_small_pointers(tmp_path, url, 400, 17)
    rnd = random.Random(18)

    with server_requests() as seen:
        clone = tmp_path / "clone"
        xet("clone", url, str(clone), cwd=tmp_path)
        cloned = seen.take(base)
        monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp_path / "cache2"))  # nothing cached
        lazy = tmp_path / "lazy"
        xet("clone", "--lazy", url, str(lazy), cwd=tmp_path)
        xet("checkout", cwd=lazy)
        checked_out = seen.take(base)
        # `git pull` of 100 more into the full clone: git delays the smudges, whose
        # descriptions are then asked for together
        more = {f"e/g{i:03d}.bin": rnd.randbytes(rnd.randrange(1_000, 3_000)) for i in range(100)}
        (work / "e").mkdir()
        for name, data in more.items():
            (work / name).write_bytes(data)
        git("add", "-A", cwd=work)
        git("commit", "-qm", "more", cwd=work)
        git("push", "-q", "origin", "main", cwd=work)
        seen.take(base)
        git("pull", "-q", "origin", "main", cwd=clone)
        pulled = seen.take(base)
        for name, data in more.items():
            assert (clone / name).read_bytes() == data, name
        assert git("status", "--porcelain", cwd=clone) == ""
        # a mount of a lazy clone, nothing cached: every file read from the server
        fuse_or_skip()
        monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp_path / "cache3"))
        lazy2 = tmp_path / "lazy2"
        xet("clone", "--lazy", url, str(lazy2), cwd=tmp_path)
        seen.take(base)
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        xet("mount", str(lazy2), "main", str(mnt), cwd=tmp_path)
        try:
            with ThreadPoolExecutor(8) as pool:
                read = pool.map(lambda n: (mnt / n).read_bytes(), files)
                got = dict(zip(files, read, strict=True))
        finally:
            xet("unmount", str(mnt), cwd=tmp_path, check=False)
        assert got == files
        mounted = seen.take(base)
    for root in (clone, lazy):
        for name, data in files.items():
            assert (root / name).read_bytes() == data, name
        assert git("status", "--porcelain", cwd=root) == ""
    # (the mount asks for a directory's files in batches that double while its reads go
    # through it in order, 16, 32, then the rest of its 57: three a directory, a fourth
    # when 8 readers of the 7 directories at once jump ahead of an answer)
    # (the pull's smudges run on worker threads as git hands them over: a batch holds the
    # files git handed over by then, a few batches in all)
    phases = {"clone": cloned, "checkout": checked_out, "mount": mounted, "pull": pulled}
    for (what, lines), most in zip(phases.items(), (1, 1, 28, 50), strict=True):
        assert 1 <= lines.count("POST /v1/file-shards") <= most, (what, lines)
        assert [x for x in lines if x.startswith("GET /v1/file-shards/")] == [], (what, lines)
        # the 400 files (under 1.2 MB) share one xorb: a ranged GET or two, not 400
        assert len([x for x in lines if x.startswith("GET /xorb-data/")]) <= 2, lines


def test_plain_git_clone_of_many_pointers_asks_for_descriptions_in_batches(
    srv: tuple[str, str], tmp_path: Path
) -> None:
    """A plain `git clone` (the filter installed by `git xet install`) of more pointer files
    than git keeps delayed smudges of (128; the rest are smudged inline): the descriptions of
    the commit's files come in batches, not one GET per file. 100,000 files of 1-8 KiB took
    202 s, 100,586 requests, before."""
    base, _ = srv
    url = f"{base}/plain.git"
    xet("install", cwd=tmp_path)
    _, files = push_small_pointers(tmp_path, url, 600, 23)
    with server_requests() as seen:
        seen.take(base)
        clone = tmp_path / "clone"
        git("clone", "-q", url, str(clone), cwd=tmp_path)
        lines = seen.take(base)
    for name, data in files.items():
        assert (clone / name).read_bytes() == data, name
    assert git("status", "--porcelain", cwd=clone) == ""
    # (files described alone are not counted: besides the smudges, git re-cleans the files
    # it wrote in the same tick as its index, as many as its timing makes racy, and the
    # clean filter asks for the shard of each one's version in HEAD, to deduplicate an edit
    # against it; the 100,000-file run in docs/benchmarks.md has the numbers)
    # (delayed smudges run on worker threads while git hands the others over inline: a
    # few batches, each of up to 1,000 files)
    assert 1 <= lines.count("POST /v1/file-shards") <= 12, lines


def test_re_clean_of_unchanged_files_after_a_plain_clone_asks_the_server_nothing(
    srv: tuple[str, str], tmp_path: Path
) -> None:
    """git re-cleans the files of a plain `git clone` whose timestamps it cannot trust
    (racily clean: as many as its timing makes so, 587 of 100,000 once): a file whose
    content is its version in HEAD costs no request (each asked for its HEAD version's
    shard before, 109-525 KB each at 100,000 files); an edit still learns that shard, once,
    to deduplicate against it."""
    base, _ = srv
    url = f"{base}/reclean.git"
    xet("install", cwd=tmp_path)
    _, files = push_small_pointers(tmp_path, url, 40, 29)
    clone = tmp_path / "clone"
    git("clone", "-q", url, str(clone), cwd=tmp_path)
    assert git("status", "--porcelain", cwd=clone) == ""
    # (nothing cached: git re-cleaned some of the files it wrote during the clone already,
    # whose HEAD shards the cache then held)
    shutil.rmtree(tmp_path / "cache")
    # every file's timestamp changed, its content not: git re-cleans all of them
    for name in files:
        os.utime(clone / name, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    with server_requests() as seen:
        seen.take(base)
        assert git("status", "--porcelain", cwd=clone) == ""
        recleaned = seen.take(base)
        edited = next(iter(files))
        (clone / edited).write_bytes(files[edited] + b"0123456789")
        git("add", edited, cwd=clone)
        added = seen.take(base)
    # (the process asks once what the server is: GET <repo>/info/xet)
    print("RECLEANED", recleaned, "ADDED", added)
    assert [x for x in recleaned if not x.endswith("/info/xet")] == [], recleaned
    assert len([x for x in added if x.startswith("GET /v1/file-shards/")]) == 1, added
    assert git("status", "--porcelain", cwd=clone) == f"M  {edited}"


def test_push_to_a_new_path_remote_sends_data_only_the_server_had(
    srv: tuple[str, str], tmp_path: Path
) -> None:
    """A clone of a server streams its files from there (its store holds no xorb): a push
    to a path remote added later copies them here first, so the backup gets the data, not
    pointers without it (the push used to fail: 'xorb ... not found')."""
    base, _ = srv
    url = f"{base}/data.git"
    work = new_work(tmp_path, origin=url)
    rnd = random.Random(21)
    old, new = rnd.randbytes(400_000), rnd.randbytes(300_000)
    commit(work, "old.bin", old)
    git("push", "-q", "origin", "main", cwd=work)
    clone = tmp_path / "clone"
    xet("clone", url, str(clone), cwd=tmp_path)
    assert (clone / "old.bin").read_bytes() == old
    commit(clone, "new.bin", new)
    backup = tmp_path / "backup.git"
    git("init", "-q", "--bare", "-b", "main", str(backup), cwd=tmp_path)
    git("remote", "add", "backup", str(backup), cwd=clone)
    r = run("git", "push", "-q", "backup", "main", cwd=clone, check=False)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    # the backup alone serves both files (its clone knows no server)
    copy = tmp_path / "copy"
    xet("clone", str(backup), str(copy), cwd=tmp_path)
    assert (copy / "old.bin").read_bytes() == old
    assert (copy / "new.bin").read_bytes() == new
    xet("fsck", "--all", cwd=backup)
    # the repairing push too (it used to say 'data neither in the local store nor on ...')
    fresh = tmp_path / "fresh"
    xet("clone", url, str(fresh), cwd=tmp_path)
    second = tmp_path / "second.git"
    git("init", "-q", "--bare", "-b", "main", str(second), cwd=tmp_path)
    git("remote", "add", "second", str(second), cwd=fresh)
    r = xet("push", "--all", "second", cwd=fresh, check=False)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    out = xet("fsck", "--all", cwd=second).stdout
    assert "1 in the local store, 0 only on the remote, 0 missing" in out, out


def test_push_of_many_files_to_a_new_path_remote_asks_the_server_in_batches(
    srv: tuple[str, str], tmp_path: Path
) -> None:
    """A clone of a server's many small files pushed to a path remote added later: the
    files' descriptions come in batches and each xorb's chunk list once, not a shard per
    file (each holding its xorb's whole chunk list: 100,000 files were 100,000 requests of
    0.5 MB, over 11 minutes before it was stopped)."""
    base, _ = srv
    url = f"{base}/many.git"
    _, files = push_small_pointers(tmp_path, url, 300, 29)
    clone = tmp_path / "clone"
    xet("clone", url, str(clone), cwd=tmp_path)
    backup = tmp_path / "backup.git"
    git("init", "-q", "--bare", "-b", "main", str(backup), cwd=tmp_path)
    git("remote", "add", "backup", str(backup), cwd=clone)
    with server_requests() as seen:
        seen.take(base)
        r = run("git", "push", "-q", "backup", "main", cwd=clone, check=False)
        lines = seen.take(base)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert [x for x in lines if x.startswith("GET /v1/file-shards/")] == [], lines
    assert lines.count("POST /v1/file-shards") <= 2, lines
    # the backup alone serves every file (its clone knows no server)
    copy = tmp_path / "copy"
    xet("clone", str(backup), str(copy), cwd=tmp_path)
    for name, data in files.items():
        assert (copy / name).read_bytes() == data, name
    xet("fsck", "--all", cwd=backup)
