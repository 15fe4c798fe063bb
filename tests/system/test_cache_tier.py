"""The cache tier (issue 17): `git xet serve --upstream` between many readers and the origin.

Real servers on loopback: the origin is `git xet serve` (uvicorn, in this process, so its
access log can be read), the tier is `git xet serve --upstream` (a subprocess, so it can be
killed) or a background tier in this process, and the readers are separate processes with
separate caches reading `xet://` paths with `cas_url=`. What is checked:

* 8 cold readers of one commit through a cold tier get identical bytes and the origin serves
  at most 1.1x the commit's xorb bytes (its access log); concurrent misses of one range make
  one origin request;
* after `git xet warmup --cas-url TIER`, 8 cold readers make the origin serve no xorb bytes;
* no token or a refused token: 401 from the tier and no data; uploads: 405; a tampered data
  URL: 403;
* a range corrupted on the origin is refused by the tier (never cached, never served) and the
  reader gets an error naming the verification failure;
* `nfs-serve --cas-url` after a warmup reads everything through the tier; the tier's counters
  are on its Prometheus endpoint (`--metrics`);
* a clone through the tier of a file corrupted on the origin fails with a clear error;
* killing the tier mid-read: readers fall back to the origin (a warning) and finish, within
  30 s; a tier that hangs mid-read: the same, after its timeout (GITXET_TIER_TIMEOUT); a
  tier restarted mid-read: readers ask it for new locations and carry on through it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gitxet.errors import RemoteError
from gitxet.formats.shard import parse_shard
from gitxet.hashing import from_hex, to_hex
from gitxet.remote.client import CASClient, RetryPolicy
from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, BackgroundTier, ServerConfig, TierConfig
from tests.conftest import seal_git_env
from tests.helpers.fuse_env import require_fuse
from tests.helpers.server_env import (
    METRICS,
    build_upload,
    logged_port,
    read_back,
    stop_process,
    wait_port,
)

pytestmark = pytest.mark.timeout(600)

FILES = {"data/a.bin": 20 << 20, "data/b.bin": 12 << 20, "c.bin": 8 << 20}  # a 40 MiB commit
CLIENTS = 8


class _AccessBytes(logging.Handler):
    """Counts what the origin's access log says it sent for xorb data."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.mu = threading.Lock()
        self.data_bytes = 0
        self.data_requests = 0

    def emit(self, record: logging.LogRecord) -> None:
        rec = json.loads(record.getMessage())
        if str(rec.get("path", "")).startswith("/xorb-data/"):
            with self.mu:
                self.data_bytes += int(rec["bytes"])
                self.data_requests += 1

    def reset(self) -> None:
        with self.mu:
            self.data_bytes = self.data_requests = 0


@dataclass
class Origin:
    server: BackgroundServer
    url: str
    write: str
    read: str
    log: _AccessBytes
    root: Path

    def xorb_bytes(self) -> int:
        """Bytes of every stored xorb body (the commit's, in a fresh origin)."""
        svc = self.server.state.service
        total = 0
        for key in svc.backend.list("xorbs/"):
            total += svc.layout(from_hex(key.rsplit("/", 1)[1])).body_size
        return total

    def xorb_paths(self) -> list[Path]:
        return sorted((self.root / "cas" / "xorbs" / "default").iterdir())


@contextlib.contextmanager
def _serve_origin(root: Path) -> Iterator[Origin]:
    """An origin server with a write and a read token, its access log counted."""
    store = TokenStore(str(root))
    write, _ = store.create("write")
    read, _ = store.create("read")
    counter = _AccessBytes()
    access = logging.getLogger("gitxet.server.access")
    old_level = access.level
    access.setLevel(logging.INFO)
    access.addHandler(counter)
    try:
        with BackgroundServer(ServerConfig(root=str(root), port=0)) as srv:
            yield Origin(srv, srv.url, write, read, counter, root)
    finally:
        access.removeHandler(counter)
        access.setLevel(old_level)


def _client_env(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> None:
    monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp / "cache"))
    monkeypatch.setenv("GITXET_STATE_DIR", str(tmp / "state"))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


@pytest.fixture
def fresh_origin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Origin]:
    """An origin of this test alone (for tests that change what it stores)."""
    _client_env(monkeypatch, tmp_path)
    with _serve_origin(tmp_path / "origin") as o:
        yield o


def _run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(
        list(args), cwd=cwd, capture_output=True, text=True, timeout=300, env=env, check=False
    )
    if r.returncode != 0:
        raise AssertionError(f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r.stdout


@dataclass
class Commit:
    repo: str  # the origin's repository URL (no credentials)
    files: dict[str, bytes]


def _push_commit(origin: Origin, tmp: Path) -> Commit:
    """A 40 MiB commit of random files pushed to ``origin``."""
    work = tmp / "work"
    repo = f"{origin.url}/data.git"
    authed = repo.replace("http://", f"http://gitxet:{origin.write}@")
    _run("git", "init", "-q", "-b", "main", str(work), cwd=tmp)
    _run("git", "remote", "add", "origin", authed, cwd=work)
    _run("git-xet", "init", cwd=work)
    rng = random.Random(17)
    files: dict[str, bytes] = {}
    for name, size in FILES.items():
        data = rng.randbytes(size)
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(data)
        files[name] = data
    _run("git-xet", "add", ".", cwd=work)
    _run("git", "commit", "-qm", "data", cwd=work)
    _run("git", "push", "-q", "origin", "main", cwd=work)
    return Commit(repo, files)


@pytest.fixture(scope="module")
def _shared_origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Origin, Commit]]:
    """One origin holding one pushed commit for the tests that only read it: pushing 40 MiB
    costs seconds, and a fresh tier (``tier``) and fresh client caches keep each test cold.
    Built in a sealed environment of its own (the per-test one does not exist yet)."""
    tmp = tmp_path_factory.mktemp("tier-origin")
    with contextlib.ExitStack() as stack:
        with pytest.MonkeyPatch.context() as mp:
            seal_git_env(mp, tmp_path_factory.mktemp("tier-origin-home"))
            _client_env(mp, tmp)
            o = stack.enter_context(_serve_origin(tmp / "origin"))
            c = _push_commit(o, tmp)
        yield o, c


@pytest.fixture
def origin(
    _shared_origin: tuple[Origin, Commit],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    _tokens_do_not_leak: list[str],
) -> Origin:
    """The shared origin, its access counters at zero; its tokens are checked after the test
    like the test's own."""
    o = _shared_origin[0]
    _client_env(monkeypatch, tmp_path)
    _tokens_do_not_leak.extend([o.write, o.read])
    o.log.reset()
    return o


@pytest.fixture
def commit(_shared_origin: tuple[Origin, Commit], origin: Origin) -> Commit:
    """The shared origin's 40 MiB commit of random files."""
    return _shared_origin[1]


class TierProcess:
    """`git xet serve --upstream` as a subprocess (so it can be killed)."""

    def __init__(self, upstream: str, cache_dir: Path, log: Path, port: int = 0) -> None:
        self.log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        argv = [sys.executable, "-m", "gitxet", "serve", "--upstream", upstream]
        argv += ["--cache-dir", str(cache_dir), "--cache-size", "1G"]
        # port 0 (any free port, read from the log; ``port``: the one a stopped tier had)
        argv += ["--port", str(port), "--log-level", "info", "--metrics", "127.0.0.1:0"]
        self.proc = subprocess.Popen(
            argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.port = logged_port(log, self.proc)
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = (
            f"http://127.0.0.1:{logged_port(log, self.proc, pattern=METRICS)}/metrics"
        )
        wait_port(self.port, 30.0, self.proc)

    def stats(self) -> dict[str, int]:
        r = httpx.get(f"{self.url}/v1/tier-stats", timeout=10)
        r.raise_for_status()
        doc: dict[str, int] = r.json()
        return doc

    def metrics(self) -> dict[str, float]:
        """The samples of its Prometheus endpoint (``--metrics``), by name and labels."""
        r = httpx.get(self.metrics_url, timeout=10)
        r.raise_for_status()
        lines = [ln for ln in r.text.splitlines() if ln and not ln.startswith("#")]
        return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in lines)}

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


@pytest.fixture
def tier(origin: Origin, tmp_path: Path) -> Iterator[TierProcess]:
    t = TierProcess(origin.url, tmp_path / "tier-cache", tmp_path / "tier.log")
    try:
        yield t
    finally:
        t.stop()


_READER = r"""
import hashlib, json, sys
import fsspec
repo, rev, names, tier, pause = sys.argv[1:6]
names, pause = names.split(","), int(pause)
fs = fsspec.filesystem("xet", cas_url=tier or None)
done, out = 0, {}
for name in names:
    h = hashlib.sha256()
    with fs.open(f"xet://{repo}@{rev}/{name}", "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
            done += len(b)
            if pause and done >= pause:
                pause = 0
                print("paused", flush=True)
                sys.stdin.readline()
    out[name] = h.hexdigest()
print(json.dumps(out), flush=True)
"""


def _reader(
    tmp: Path, i: int, commit: Commit, tier_url: str, token: str, pause: int = 0
) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.update(
        GITXET_CACHE_DIR=str(tmp / f"client-{i}"),
        GITXET_STATE_DIR=str(tmp / f"client-state-{i}"),
        GITXET_TOKEN=token,
    )
    env.pop("GITXET_CAS_URL", None)
    tmp.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-c", _READER, commit.repo, "main", ",".join(commit.files)]
    return subprocess.Popen(
        [*args, tier_url, str(pause)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp,
    )


def _expected(commit: Commit) -> dict[str, str]:
    return {n: hashlib.sha256(d).hexdigest() for n, d in commit.files.items()}


def _read_all(tmp: Path, commit: Commit, tier_url: str, token: str, tag: str) -> None:
    """CLIENTS cold readers at once; each must get every file right."""
    procs = [_reader(tmp / tag, i, commit, tier_url, token) for i in range(CLIENTS)]
    want = _expected(commit)
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == want


def test_eight_cold_readers_through_a_cold_tier_make_the_origin_serve_the_commit_once(
    origin: Origin, commit: Commit, tier: TierProcess, tmp_path: Path
) -> None:
    origin.log.reset()
    _read_all(tmp_path, commit, tier.url, origin.read, "cold")
    commit_bytes = origin.xorb_bytes()
    assert commit_bytes >= sum(FILES.values())
    served = origin.log.data_bytes
    assert 0 < served <= 1.1 * commit_bytes, (served, commit_bytes)
    stats = tier.stats()
    assert stats["origin_bytes"] == served
    assert stats["served_bytes"] >= CLIENTS * sum(FILES.values())
    # misses count every request that waited for an origin fetch (its own or a shared one)
    assert stats["misses"] >= stats["origin_requests"] > 0
    assert stats["hits"] > 0
    # the same counters on the tier's Prometheus endpoint (--metrics)
    m = tier.metrics()
    for key in ("hits", "misses", "origin_requests", "origin_bytes", "served_bytes"):
        assert m[f"gitxet_tier_{key}_total"] == stats[key], key
    assert m["gitxet_tier_cache_bytes"] == stats["cache_bytes"] > 0
    # the same 8 readers straight to the origin: it serves every copy
    origin.log.reset()
    _read_all(tmp_path, commit, "", origin.read, "direct")
    assert origin.log.data_bytes >= CLIENTS * sum(FILES.values())


def test_after_warmup_eight_cold_readers_make_the_origin_serve_nothing(
    origin: Origin, commit: Commit, tier: TierProcess, tmp_path: Path
) -> None:
    env = dict(os.environ, GITXET_TOKEN=origin.read, GITXET_CACHE_DIR=str(tmp_path / "warm"))
    r = subprocess.run(
        ["git-xet", "warmup", "--cas-url", tier.url, commit.repo, "main"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "through the tier" in r.stderr
    # the warming machine verified the data without keeping it
    ranges = tmp_path / "warm" / "ranges" / "data"
    assert not any(p.is_file() for p in ranges.rglob("*")) if ranges.exists() else True
    assert tier.stats()["origin_bytes"] >= sum(FILES.values())
    origin.log.reset()
    _read_all(tmp_path, commit, tier.url, origin.read, "after-warmup")
    assert origin.log.data_bytes == 0
    assert origin.log.data_requests == 0


def _warm(tier: TierProcess, commit: Commit, origin: Origin, tmp: Path) -> None:
    env = dict(os.environ, GITXET_TOKEN=origin.read, GITXET_CACHE_DIR=str(tmp / "warm"))
    r = subprocess.run(
        ["git-xet", "warmup", "--cas-url", tier.url, commit.repo, "main"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.fuse
def test_clone_and_mount_with_cas_url_read_through_the_tier(
    origin: Origin, commit: Commit, tier: TierProcess, tmp_path: Path
) -> None:
    require_fuse()
    _warm(tier, commit, origin, tmp_path)
    origin.log.reset()
    env = dict(os.environ, GITXET_TOKEN=origin.read)
    env.pop("GITXET_CAS_URL", None)
    authed = commit.repo.replace("http://", f"http://gitxet:{origin.read}@")  # for git
    _run("git-xet", "clone", "--cas-url", tier.url, authed, "cl", cwd=tmp_path, env=env)
    for name, data in commit.files.items():
        assert (tmp_path / "cl" / name).read_bytes() == data, name
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env["GITXET_CACHE_DIR"] = str(tmp_path / "mount-cache")
    _run(
        "git-xet",
        "mount",
        "--cas-url",
        tier.url,
        commit.repo,
        "main",
        str(mnt),
        cwd=tmp_path,
        env=env,
    )
    try:
        for name, data in commit.files.items():
            assert (mnt / name).read_bytes() == data, name
    finally:
        _run("git-xet", "unmount", str(mnt), cwd=tmp_path, env=env)
    # git went to the origin, every byte of data came from the tier
    assert origin.log.data_bytes == 0


@pytest.mark.nfs
def test_nfs_serve_with_cas_url_reads_through_the_tier(
    origin: Origin, commit: Commit, tier: TierProcess, tmp_path: Path
) -> None:
    if shutil.which("nfs-cat") is None:
        pytest.skip("nfs-cat (libnfs-utils) not installed")
    _warm(tier, commit, origin, tmp_path)
    origin.log.reset()
    served = tier.stats()["served_bytes"]
    env = dict(os.environ, GITXET_TOKEN=origin.read, GITXET_CACHE_DIR=str(tmp_path / "nfs"))
    env.pop("GITXET_CAS_URL", None)
    argv = ["git-xet", "nfs-serve", "--cas-url", tier.url, commit.repo, "main"]
    with subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as p:
        try:
            assert p.stdout is not None
            url = p.stdout.readline().strip()
            assert url.startswith("nfs://127.0.0.1/"), url
            base, _, query = url.partition("?")
            for name, data in commit.files.items():
                out = subprocess.run(
                    ["nfs-cat", f"{base.rstrip('/')}//{name}?{query}"],
                    capture_output=True,
                    timeout=120,
                    check=False,
                )
                assert out.returncode == 0, out.stderr
                assert out.stdout == data, name
        finally:
            p.terminate()
            p.wait(timeout=30)
    # every byte came through the tier, none from the origin
    assert origin.log.data_bytes == 0
    assert tier.stats()["served_bytes"] - served >= sum(FILES.values())


def test_a_clone_through_the_tier_of_data_corrupted_on_the_origin_fails_clearly(
    fresh_origin: Origin, tmp_path: Path
) -> None:
    origin = fresh_origin
    commit = _push_commit(origin, tmp_path)
    tier = TierProcess(origin.url, tmp_path / "tier-cache", tmp_path / "tier.log")
    try:
        _corrupted_clone_fails(origin, commit, tier, tmp_path)
    finally:
        tier.stop()


def _corrupted_clone_fails(
    origin: Origin, commit: Commit, tier: TierProcess, tmp_path: Path
) -> None:
    path = max(origin.xorb_paths(), key=lambda q: q.stat().st_size)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x5A
    path.write_bytes(bytes(raw))
    origin.log.reset()
    env = dict(os.environ, GITXET_TOKEN=origin.read, GITXET_CACHE_DIR=str(tmp_path / "c"))
    env.pop("GITXET_CAS_URL", None)
    authed = commit.repo.replace("http://", f"http://gitxet:{origin.read}@")  # for git
    r = subprocess.run(
        ["git-xet", "clone", "--cas-url", tier.url, authed, "cl"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode != 0
    assert "failed verification" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert origin.log.data_bytes > 0  # the tier did fetch it
    stats = tier.stats()
    assert stats["refused_ranges"] >= 1
    # what the tier refused it neither cached nor served: a second reader is refused too,
    # and the origin is asked again (nothing bad was kept)
    before = stats["origin_requests"]
    r = subprocess.run(
        ["git-xet", "clone", "--cas-url", tier.url, authed, "cl2"],
        cwd=tmp_path,
        env=dict(env, GITXET_CACHE_DIR=str(tmp_path / "c2")),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode != 0 and "failed verification" in r.stderr, r.stderr
    assert tier.stats()["origin_requests"] > before


def _pause_readers(
    tmp: Path, commit: Commit, tier: TierProcess, token: str, n: int
) -> list[subprocess.Popen[str]]:
    """``n`` readers through the tier, each stopped after its first 2 MiB."""
    readers = [_reader(tmp, i, commit, tier.url, token, pause=2 << 20) for i in range(n)]
    for p in readers:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "paused"
    return readers


def _resume_and_finish(readers: list[subprocess.Popen[str]], commit: Commit) -> float:
    """Let the readers go on; each must finish with the right bytes, having warned that it
    reads from the origin. Returns the seconds until the last finished."""
    t0 = time.monotonic()
    for p in readers:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    want = _expected(commit)
    for p in readers:
        out, err = p.communicate(timeout=150)
        assert p.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == want
        assert "cannot be reached" in err and "reading from the origin" in err, err
    return time.monotonic() - t0


def test_a_tier_down_mid_read_readers_fall_back_to_the_origin_within_30s(
    origin: Origin, commit: Commit, tier: TierProcess, tmp_path: Path
) -> None:
    readers = _pause_readers(tmp_path / "kill", commit, tier, origin.read, 4)
    tier.proc.send_signal(signal.SIGKILL)
    tier.proc.wait(10)
    assert _resume_and_finish(readers, commit) < 30


def test_a_tier_restarted_mid_read_readers_carry_on_through_it(
    origin: Origin, commit: Commit, tier: TierProcess, tmp_path: Path
) -> None:
    """A restarted tier (same port, same cache) no longer knows the xorbs of the data URLs
    it handed out: it answers 403, the readers ask for new locations and carry on through
    it, without falling back to the origin."""
    readers = _pause_readers(tmp_path / "restart", commit, tier, origin.read, 2)
    tier.stop()
    again = TierProcess(origin.url, tmp_path / "tier-cache", tmp_path / "tier2.log", tier.port)
    try:
        t0 = time.monotonic()
        for p in readers:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in readers:
            out, err = p.communicate(timeout=150)
            assert p.returncode == 0, err
            assert json.loads(out.strip().splitlines()[-1]) == _expected(commit)
            assert "cannot be reached" not in err, err
        assert time.monotonic() - t0 < 30
        assert again.stats()["served_bytes"] > 0
    finally:
        again.stop()


def test_a_tier_that_hangs_mid_read_readers_fall_back_to_the_origin(
    origin: Origin,
    commit: Commit,
    tier: TierProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tier that stops answering but keeps its connections open (SIGSTOP: a wedged
    process, a dead node whose packets vanish): each request waits GITXET_TIER_TIMEOUT
    (5 s here instead of the default 30 s), is tried once more, then the reader goes to the
    origin."""
    from gitxet.data.remote_source import TIER_ATTEMPTS

    timeout = 5.0
    monkeypatch.setenv("GITXET_TIER_TIMEOUT", f"{timeout:g}s")
    readers = _pause_readers(tmp_path / "hang", commit, tier, origin.read, 2)
    tier.proc.send_signal(signal.SIGSTOP)
    try:
        took = _resume_and_finish(readers, commit)
    finally:
        tier.proc.send_signal(signal.SIGKILL)
        tier.proc.send_signal(signal.SIGCONT)
    assert timeout <= took < TIER_ATTEMPTS.attempts * timeout + 30


# ---- in-process tier: authorization, integrity, single flight ------------------------------


@dataclass
class Stored:
    origin: Origin
    tier: BackgroundTier
    file_hash: bytes
    data: bytes


@pytest.fixture
def stored(fresh_origin: Origin, tmp_path: Path) -> Iterator[Stored]:
    origin = fresh_origin
    up = build_upload(random.Random(5).randbytes(24 << 20))
    with CASClient(origin.url, origin.write) as c:
        c.upload_xorb(up.xorb.hash, up.xorb.body)
        c.upload_shard(up.shard)
    cfg = TierConfig(origin.url, str(tmp_path / "tier"), 1 << 30, port=0)
    with BackgroundTier(cfg) as t:
        yield Stored(origin, t, up.file_hash, up.data)


def _fx(s: Stored) -> str:
    return to_hex(s.file_hash)


def test_no_token_or_a_refused_token_gets_401_from_the_tier_and_no_data(stored: Stored) -> None:
    t = stored.tier.url
    fx = _fx(stored)
    (xorb_path,) = stored.origin.xorb_paths()
    with httpx.Client(timeout=30) as h:
        for headers in ({}, {"Authorization": "Bearer gxt_000000000000_" + "A" * 43}):
            for path in (
                f"/v1/reconstructions/{fx}",
                f"/v2/reconstructions/{fx}",
                f"/v1/reconstructions?file_id={fx}",
                f"/v1/file-shards/{fx}",
                f"/v1/xorb-locations/{xorb_path.name}",
            ):
                r = h.get(t + path, headers=headers)
                assert r.status_code == 401, (path, r.text)
                assert "url" not in r.text and "xorb-data" not in r.text
                assert "chunk_hashes" not in r.text and "terms" not in r.text
        revoked, rec = TokenStore(str(stored.origin.root)).create("read")
        TokenStore(str(stored.origin.root)).revoke(rec.id)
        r = h.get(t + f"/v1/reconstructions/{fx}", headers={"Authorization": f"Bearer {revoked}"})
        assert r.status_code == 401
        # a good token: a tier URL, which works; tampered or unsigned: 403, no data
        ok = h.get(
            t + f"/v1/reconstructions/{fx}",
            headers={"Authorization": f"Bearer {stored.origin.read}"},
        )
        assert ok.status_code == 200
        (entries,) = ok.json()["fetch_info"].values()
        url = entries[0]["url"]
        assert url.startswith(t + "/xorb-data/")
        assert h.get(url, headers={"Range": "bytes=0-99"}).status_code == 206
        for bad in (url.replace("sig=", "sig=A"), url.split("?")[0]):
            r = h.get(bad, headers={"Range": "bytes=0-99"})
            assert r.status_code == 403 and len(r.content) < 200
        # a URL whose xorb the tier forgot (a restart): 403, and a new location works
        stored.tier.state.tier._known.clear()
        r = h.get(url, headers={"Range": "bytes=0-99"})
        assert r.status_code == 403 and "ask for a new location" in r.json()["error"]
        xhex = url.split("/xorb-data/default/")[1].split("?")[0]
        loc = h.get(
            t + f"/v1/xorb-locations/{xhex}",
            headers={"Authorization": f"Bearer {stored.origin.read}"},
        ).json()
        assert h.get(loc["url"], headers={"Range": "bytes=0-99"}).status_code == 206
        # uploads are refused, naming the origin
        auth = {"Authorization": f"Bearer {stored.origin.write}"}
        r = h.post(t + f"/v1/xorbs/default/{'0' * 64}", content=b"x", headers=auth)
        assert r.status_code == 405 and stored.origin.url in r.json()["error"]
        r = h.post(t + "/v1/shards", content=b"x", headers=auth)
        assert r.status_code == 405
    # the tier's only secret, its signing key, is its user's alone
    key = Path(stored.tier.state.tier.cache_dir) / "meta" / "url-signing.key"
    assert key.stat().st_mode & 0o777 == 0o600


def test_concurrent_misses_of_one_range_make_one_origin_request(stored: Stored) -> None:
    stored.origin.log.reset()
    results: list[bytes] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            with CASClient(stored.tier.url, stored.origin.read) as c:
                results.append(read_back(c, stored.file_hash))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(CLIENTS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(240)
    assert not errors, errors
    assert results == [stored.data] * CLIENTS
    body = stored.origin.xorb_bytes()
    assert stored.origin.log.data_bytes == body  # each byte once
    stats = stored.tier.state.tier.stats_doc()
    assert stats["origin_requests"] == stored.origin.log.data_requests == -(-body // (8 << 20))
    # the same counters in Prometheus form (what --metrics ADDR serves)
    from prometheus_client import generate_latest

    metrics = stored.tier.state.metrics
    assert metrics is not None
    text = generate_latest(metrics.registry).decode()
    values = dict(ln.rsplit(" ", 1) for ln in text.splitlines() if not ln.startswith("#"))
    assert float(values["gitxet_tier_origin_bytes_total"]) == stats["origin_bytes"]
    assert float(values["gitxet_tier_served_bytes_total"]) == stats["served_bytes"]
    assert float(values['gitxet_server_requests_total{op="xorb-data",status="206"}']) > 0


def test_a_range_corrupted_on_the_origin_is_never_cached_or_served(stored: Stored) -> None:
    (path,) = stored.origin.xorb_paths()
    raw = bytearray(path.read_bytes())
    raw[(12 << 20) + 4321] ^= 0x5A  # inside the second 8 MiB range's chunks
    path.write_bytes(bytes(raw))
    tier = stored.tier.state.tier
    fast = RetryPolicy(attempts=2, base_delay=0.05)
    with CASClient(stored.tier.url, stored.origin.read, retry=fast) as c:
        with pytest.raises(RemoteError) as exc:
            read_back(c, stored.file_hash)
        assert exc.value.status == 502
        assert "failed verification" in str(exc.value)
        # the ranges before it are fine and served
        assert read_back(c, stored.file_hash, (0, 4 << 20)) == stored.data[: 4 << 20]
    assert tier.stats_doc()["refused_ranges"] >= 1
    xorb = from_hex(path.name)
    assert tier.cache.covers(xorb, 0, 4 << 20)
    assert not tier.cache.covers(xorb, 12 << 20, (12 << 20) + 1)  # the range it is in


@pytest.mark.filterwarnings("ignore:hf_xet.*deprecated:DeprecationWarning")
def test_hf_xet_reads_compressed_xorbs_through_the_tier(
    fresh_origin: Origin, tmp_path: Path
) -> None:
    """hf_xet, the reference client, downloads through the tier (the plain framing of
    xorbs the origin stores compressed), whole and by ranges; its uploads are refused."""
    import hf_xet

    origin = fresh_origin

    rng = random.Random(8)
    words = [rng.randbytes(6).hex().encode() for _ in range(300)]
    data = b" ".join(rng.choice(words) for _ in range(400_000))  # ~5 MiB, compresses well
    src = tmp_path / "text.bin"
    src.write_bytes(data)
    expiry = int(time.time()) + 3600
    token = (origin.write, expiry)
    [info] = hf_xet.upload_files([str(src)], origin.url, token, None, None, "model")
    stored = origin.xorb_bytes()
    assert stored < len(data) * 0.8  # the origin holds it compressed
    cfg = TierConfig(origin.url, str(tmp_path / "tier"), 1 << 30, port=0)
    with BackgroundTier(cfg) as t:
        out = tmp_path / "out.bin"
        dl = hf_xet.PyXetDownloadInfo(str(out), info.hash, len(data))
        hf_xet.download_files([dl], t.url, (origin.read, expiry), None, None)
        assert out.read_bytes() == data
        group = hf_xet.XetSession().new_download_stream_group(
            endpoint=t.url, token=origin.read, token_expiry_unix_secs=expiry
        )
        fi = hf_xet.XetFileInfo(info.hash, len(data))
        for a, b in [(12_345, 2_000_000), (0, 1), (len(data) - 1, len(data))]:
            assert b"".join(group.download_stream(fi, a, b)) == data[a:b], (a, b)
        with CASClient(t.url, origin.read) as c:
            assert read_back(c, from_hex(info.hash)) == data
        stats = t.state.tier.stats_doc()
        assert stats["origin_bytes"] <= stored  # compressed from the origin, once
        assert stats["served_bytes"] >= len(data)  # plain to the clients
        with pytest.raises(Exception, match=r"405|read-only"):
            hf_xet.upload_files([str(src)], t.url, (origin.write, expiry), None, None, "model")


def test_batched_descriptions_are_forwarded_to_the_origin(
    tier: TierProcess, origin: Origin, commit: Commit
) -> None:
    """``POST /v1/file-shards`` through the tier: the origin's answer, under the client's
    token (none: the origin's 401)."""
    files = sorted(origin.server.state.service.index.files())[:50]
    assert files
    body = {"files": [to_hex(h) for h in files]}
    auth = {"Authorization": f"Bearer {origin.read}"}
    direct = httpx.post(f"{origin.url}/v1/file-shards", json=body, headers=auth, timeout=60)
    via = httpx.post(f"{tier.url}/v1/file-shards", json=body, headers=auth, timeout=60)
    assert direct.status_code == via.status_code == 200
    assert {f.file_hash for f in parse_shard(direct.content).files} == set(files)
    assert {f.file_hash for f in parse_shard(via.content).files} == set(files)
    assert [f.terms for f in parse_shard(via.content).files] == [
        f.terms for f in parse_shard(direct.content).files
    ]
    assert httpx.post(f"{tier.url}/v1/file-shards", json=body, timeout=60).status_code == 401
