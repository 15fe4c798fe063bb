"""Real git over smart HTTP against the server: tokens as basic-auth passwords, create on push."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gitxet.remote.client import discover
from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig, create_repo


@dataclass
class GitSrv:
    host: str
    root: Path
    write: str
    read: str
    other_repo_write: str

    def url(self, repo: str, token: str | None = None) -> str:
        cred = f"user:{token}@" if token else ""
        return f"http://{cred}{self.host}/{repo}.git"


@pytest.fixture
def gsrv(tmp_path: Path) -> Iterator[GitSrv]:
    root = tmp_path / "srv"
    ts = TokenStore(str(root))
    write, _ = ts.create("write")
    read, _ = ts.create("read")
    other, _ = ts.create("write", repo="other")
    with BackgroundServer(ServerConfig(root=str(root), port=0)) as s:
        yield GitSrv(s.url.removeprefix("http://"), root, write, read, other)


def git(
    *args: str, cwd: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {r.stderr}")
    return r


@pytest.fixture
def work(tmp_path: Path) -> Path:
    w = tmp_path / "work"
    git("init", "-q", str(w))
    (w / "a.txt").write_text("one\n")
    git("add", "a.txt", cwd=w)
    git("commit", "-qm", "first", cwd=w)
    return w


def test_push_creates_the_repo_and_clone_reads_it(gsrv: GitSrv, work: Path, tmp_path: Path) -> None:
    git("push", "-q", gsrv.url("data", gsrv.write), "main", cwd=work)
    assert (gsrv.root / "repos" / "data.git" / "HEAD").read_text().strip() == "ref: refs/heads/main"
    clone = tmp_path / "clone"
    git("clone", "-q", gsrv.url("data", gsrv.read), str(clone))
    assert (clone / "a.txt").read_text() == "one\n"
    # Edit, commit, push back with the write token; fetch sees it.
    (clone / "a.txt").write_text("two\n")
    git("commit", "-qam", "second", cwd=clone)
    git("push", "-q", gsrv.url("data", gsrv.write), "main", cwd=clone)
    git("pull", "-q", gsrv.url("data", gsrv.read), "main", cwd=work)
    assert (work / "a.txt").read_text() == "two\n"


def test_first_push_of_another_branch_sets_head(gsrv: GitSrv, work: Path, tmp_path: Path) -> None:
    git("branch", "-m", "main", "trunk", cwd=work)
    git("push", "-q", gsrv.url("t", gsrv.write), "trunk", cwd=work)
    clone = tmp_path / "c2"
    r = git("clone", gsrv.url("t", gsrv.read), str(clone))
    assert "warning" not in r.stderr.lower()
    assert (clone / "a.txt").exists()


def test_push_without_write_access_fails_clearly_and_stores_nothing(
    gsrv: GitSrv, work: Path
) -> None:
    r = git("push", gsrv.url("data", gsrv.read), "main", cwd=work, check=False)
    assert r.returncode != 0 and "403" in r.stderr
    # the server's reason reaches the user (git prints a text/plain error body)
    assert "remote: token" in r.stderr and "no write access to repository data" in r.stderr
    r = git("push", gsrv.url("data"), "main", cwd=work, check=False)
    assert r.returncode != 0  # 401: git cannot prompt in tests
    r = git("push", gsrv.url("data", gsrv.other_repo_write), "main", cwd=work, check=False)
    assert r.returncode != 0 and "403" in r.stderr and "no write access" in r.stderr
    r = git("push", gsrv.url("data", "gxt_000000000000_" + "A" * 43), "main", cwd=work, check=False)
    assert r.returncode != 0
    assert not (gsrv.root / "repos" / "data.git").exists()


def test_repo_scoped_token_and_missing_repos(gsrv: GitSrv, work: Path, tmp_path: Path) -> None:
    git("push", "-q", gsrv.url("other", gsrv.other_repo_write), "main", cwd=work)
    git("clone", "-q", gsrv.url("other", gsrv.other_repo_write), str(tmp_path / "o"))
    r = git("clone", gsrv.url("nope", gsrv.read), str(tmp_path / "n"), check=False)
    assert r.returncode != 0 and "not found" in r.stderr.lower()
    r = httpx.get(f"http://{gsrv.host}/data.git/info/refs?service=git-upload-pack")
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")


def test_repo_create_and_discovery(gsrv: GitSrv, tmp_path: Path) -> None:
    path = create_repo(str(gsrv.root), "made")
    assert Path(path, "HEAD").exists()
    r = git("clone", gsrv.url("made", gsrv.read), str(tmp_path / "m"))
    assert "empty repository" in r.stderr
    d = discover(f"http://{gsrv.host}/made.git")
    assert d.cas_url == f"http://{gsrv.host}" and d.access_token is None
    d = discover(f"http://{gsrv.host}/made.git", token=gsrv.read)
    assert d.access_token == gsrv.read and d.expires is not None
    with pytest.raises(Exception, match="401"):
        discover(f"http://{gsrv.host}/made.git", token="bogus")


def test_hf_xet_discovers_the_cas_through_the_repo_url(gsrv: GitSrv) -> None:
    """hf_xet's token-refresh URL can be ``<repo>/info/xet``: no endpoint configured."""
    import random

    hf_xet = pytest.importorskip("hf_xet")
    from gitxet.hashing import to_hex
    from gitxet.remote.client import CASClient
    from tests.helpers.server_env import build_upload

    up = build_upload(random.Random(3).randbytes(150_000))
    with CASClient(f"http://{gsrv.host}", gsrv.write) as c:
        c.upload_xorb(up.xorb.hash, up.xorb.body)
        c.upload_shard(up.shard)
    group = hf_xet.XetSession().new_download_stream_group(
        token_refresh_url=f"http://{gsrv.host}/data.git/info/xet",
        token_refresh_headers={"Authorization": f"Bearer {gsrv.read}"},
    )
    info = hf_xet.XetFileInfo(to_hex(up.file_hash), len(up.data))
    assert b"".join(group.download_stream(info)) == up.data


def test_hf_xet_session_uploads_through_discovery(gsrv: GitSrv) -> None:
    """hf_xet's current upload API, configured by the repo URL only; gitxet reads it back."""
    import random

    hf_xet = pytest.importorskip("hf_xet")
    from gitxet.hashing import from_hex
    from gitxet.remote.client import CASClient
    from tests.helpers.server_env import read_back

    data = random.Random(5).randbytes(900_000)
    with hf_xet.XetSession().new_upload_commit(
        token_refresh_url=f"http://{gsrv.host}/data.git/info/xet",
        token_refresh_headers={"Authorization": f"Bearer {gsrv.write}"},
    ) as commit:
        handle = commit.start_upload_bytes(data)
    info = handle.result().xet_info
    assert info.file_size == len(data)
    with CASClient(f"http://{gsrv.host}", gsrv.read) as c:
        assert read_back(c, from_hex(info.hash)) == data
