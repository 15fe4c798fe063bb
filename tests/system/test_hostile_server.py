"""A hostile server answering our client: a proxy (tests/helpers/tamper.py) in front of a
real ``git xet serve`` rewrites its answers. Each failure must be a clear error in bounded
time and memory; the token never goes to another server.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gitxet.errors import RemoteError
from gitxet.remote.client import MAX_SHARD_ANSWER, CASClient, discover
from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig
from tests.helpers.proc import interpreter_path, run
from tests.helpers.server_env import Upload, build_upload
from tests.helpers.tamper import Reply, Seen, Tamper, TamperProxy, gzip_bomb

pytestmark = pytest.mark.timeout(120)


@dataclass
class Env:
    """The real server, a write token, and a file stored there."""

    server: BackgroundServer
    token: str
    up: Upload
    root: Path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("hostile-server")
    root = tmp / "srv"
    token, _ = TokenStore(str(root)).create("write")
    up = build_upload(random.Random(7).randbytes(300_000))
    with BackgroundServer(ServerConfig(root=str(root), port=0)) as s:
        with CASClient(s.url, token) as c:
            c.upload_xorb(up.xorb.hash, up.xorb.body)
            c.upload_shard(up.shard)
        yield Env(s, token, up, root)


def on(part: str, change: dict[str, object]) -> Tamper:
    """A tamper function: the answers to paths holding ``part`` get ``change``d."""

    def tamper(seen: Seen, reply: Reply) -> Reply:
        if part in seen.path and reply.status in (200, 206):
            for k, v in change.items():
                setattr(reply, k, v)
        return reply

    return tamper


def test_a_gzip_bomb_is_refused_at_the_answer_limit(env: Env) -> None:
    bomb = gzip_bomb(MAX_SHARD_ANSWER + (64 << 20))
    assert len(bomb) < 1 << 20
    with TamperProxy(env.server.url) as px:
        px.tamper = on("/v1/file-shards", {"body": bomb, "extra": {"Content-Encoding": "gzip"}})
        with CASClient(px.url, env.token) as c, pytest.raises(RemoteError, match="than 256 MiB"):
            c.get_file_blocks([env.up.file_hash])


def test_an_undecodable_body_is_a_remote_error(env: Env) -> None:
    with TamperProxy(env.server.url) as px:
        px.tamper = on(
            "/v1/file-shards", {"body": b"not gzip at all", "extra": {"Content-Encoding": "gzip"}}
        )
        with CASClient(px.url, env.token) as c, pytest.raises(RemoteError, match="decoded"):
            c.get_file_blocks([env.up.file_hash])


def test_a_server_dripping_its_answer_fails_in_bounded_time(env: Env) -> None:
    with TamperProxy(env.server.url) as px:
        px.tamper = on("/v1/file-shards", {"send": "drip", "drip": 0.2})
        with CASClient(px.url, env.token, timeout=1.0) as c:
            t = time.monotonic()
            with pytest.raises(RemoteError, match="too slow"):
                c.get_file_blocks([env.up.file_hash])
            assert time.monotonic() - t < 30


def test_a_server_dripping_xorb_bytes_fails_in_bounded_time(env: Env) -> None:
    with TamperProxy(env.server.url) as px, CASClient(px.url, env.token, timeout=1.0) as c:
        with CASClient(px.url, env.token) as patient:  # (a loaded VM may take a second)
            loc = patient.xorb_location(env.up.xorb.hash)
        px.tamper = on("/xorb-data/", {"send": "drip", "drip": 0.2})
        t = time.monotonic()
        with pytest.raises(RemoteError, match="too slow"):
            c.fetch_xorb_range(loc.url, 0, 999)
        assert time.monotonic() - t < 30


def redirect_to(location: str) -> Tamper:
    def tamper(seen: Seen, reply: Reply) -> Reply:
        if seen.path.endswith("/info/xet") and not seen.path.startswith("/moved.git/"):
            return Reply(302, [("Location", location)], b"")
        return reply

    return tamper


def test_discovery_follows_no_redirect_to_another_server(env: Env) -> None:
    with TamperProxy(env.server.url) as px, TamperProxy(env.server.url) as other:
        assert discover(f"{px.url}/data.git", token=env.token).cas_url == px.url
        # another port is another origin: the answer there would name the CAS our token
        # goes to
        for target in (f"{other.url}/data.git/info/xet", "file:///etc/passwd"):
            px.tamper = redirect_to(target)
            with pytest.raises(RemoteError, match="redirected to another server"):
                discover(f"{px.url}/data.git", token=env.token)
        assert other.seen == []
        # the same server: followed, the token kept
        px.tamper = redirect_to("/moved.git/info/xet")
        assert discover(f"{px.url}/data.git", token=env.token).access_token == env.token
        # a loop: a clear error, not an exception of the HTTP library
        px.tamper = redirect_to("/data.git/info/xet")
        with pytest.raises(RemoteError, match="more than 5 redirects"):
            discover(f"{px.url}/data.git", token=env.token)


def pushed_work_tree(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, seed: int
) -> tuple[Path, bytes]:
    """A work tree whose ``big.bin`` (random, from ``seed``) is pushed to the real server's
    ``name.git`` (its origin), with this test's git-xet, token and cache; and those bytes."""
    monkeypatch.setenv("PATH", interpreter_path())
    monkeypatch.setenv("GITXET_TOKEN", env.token)
    monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "work"
    run("git", "init", "-q", str(work), cwd=tmp_path)
    run("git-xet", "init", cwd=work)
    big = random.Random(seed).randbytes(400_000)
    (work / "big.bin").write_bytes(big)
    run("git-xet", "add", ".", cwd=work)
    run("git", "commit", "-qm", "v1", cwd=work)
    url = f"http://gitxet:{env.token}@{env.server.url.removeprefix('http://')}/{name}.git"
    run("git", "remote", "add", "origin", url, cwd=work)
    run("git", "push", "-q", "origin", "main", cwd=work)
    return work, big


def test_git_xet_clone_from_a_redirecting_server_says_so(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: a repository pushed to the real server, cloned through the proxy whose
    discovery redirects to another server: a one-line error, no token sent there, the
    large file left a pointer (never half-written)."""
    pushed_work_tree(env, tmp_path, monkeypatch, "redir", 8)
    with TamperProxy(env.server.url) as px, TamperProxy(env.server.url) as other:
        px.tamper = redirect_to(f"{other.url}/redir.git/info/xet")
        clone = tmp_path / "clone"
        r = run("git-xet", "clone", f"{px.url}/redir.git", str(clone), cwd=tmp_path, check=False)
        assert r.returncode != 0
        assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
        assert "redirected to another server" in r.stderr, r.stderr
        assert other.seen == []
        assert (clone / "big.bin").read_bytes().startswith(b"version https://"), "not a pointer"
        assert os.path.getsize(clone / "big.bin") < 1024


def stored_xorbs(root: Path) -> list[Path]:
    return [p for p in (root / "cas" / "xorbs").rglob("*") if p.is_file()]


def test_a_xorb_the_server_lost_is_named_and_pushed_again(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server still describes a file whose xorb its storage lost: a clone says which
    server lacks what and what to run; that command (from a clone with the data) uploads
    the xorb again (it was answered "already stored"), and a new clone then works."""
    before = set(stored_xorbs(env.root))
    work, big = pushed_work_tree(env, tmp_path, monkeypatch, "lost", 9)
    lost = [p for p in stored_xorbs(env.root) if p not in before]
    assert len(lost) == 1, lost
    lost[0].unlink()

    clone = tmp_path / "clone"
    r = run("git-xet", "clone", f"{env.server.url}/lost.git", str(clone), cwd=tmp_path, check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert f"{lost[0].name} is lost from this server's storage" in r.stderr, r.stderr
    assert f"the server {env.server.url} describes data it no longer has" in r.stderr
    assert "git xet push --all" in r.stderr
    assert os.path.getsize(clone / "big.bin") < 1024  # the pointer, not half the data

    out = run("git-xet", "push", "--all", cwd=work, check=False).stderr
    assert "1 xorb(s) and" in out, out
    again = tmp_path / "again"
    run("git-xet", "clone", f"{env.server.url}/lost.git", str(again), cwd=tmp_path)
    assert (again / "big.bin").read_bytes() == big
