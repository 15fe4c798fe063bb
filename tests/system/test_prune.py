"""``git xet prune``: what it removes, what it keeps (checkout, recent refs, unpushed
commits, mounts, data the remote lacks with --verify-remote), --dry-run and --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from gitxet.cli._json import SCHEMAS
from gitxet.store.cas import LocalCAS
from tests.helpers.fuse_env import require_fuse

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, f"{args}: {r.stdout}{r.stderr}"
    return r.stdout


def prune(work: Path, *args: str) -> dict[str, object]:
    out = run("git-xet", "prune", "--json", "--grace", "0", "--recent-days", "0", *args, cwd=work)
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMAS["prune"][1])
    return doc  # type: ignore[no-any-return]


def versions(work: Path, n: int, push: bool = True) -> list[bytes]:
    datas = []
    for i in range(n):
        data = os.urandom(300_000)
        (work / "f.bin").write_bytes(data)
        run("git-xet", "add", "f.bin", cwd=work)
        run("git", "commit", "-q", "-m", f"v{i}", cwd=work)
        datas.append(data)
    if push:
        run("git", "push", "-q", "origin", "HEAD:main", cwd=work)
    return datas


@pytest.fixture
def work(tmp_path: Path) -> Path:
    run("git", "init", "-q", "--bare", str(tmp_path / "remote.git"), cwd=tmp_path)
    w = tmp_path / "work"
    run("git", "init", "-q", str(w), cwd=tmp_path)
    run("git", "remote", "add", "origin", str(tmp_path / "remote.git"), cwd=w)
    run("git-xet", "init", cwd=w)
    return w


def xorbs(work: Path) -> int:
    return sum(1 for _ in LocalCAS(str(work / ".git" / "xet")).xorb_hashes())


def test_prune_removes_old_versions_and_keeps_the_checkout(work: Path) -> None:
    datas = versions(work, 3)
    assert xorbs(work) == 3
    dry = prune(work, "--dry-run")
    assert dry["dry_run"] and dry["xorbs_removed"] == 2 and dry["files_removed"] == 2
    assert xorbs(work) == 3  # nothing removed
    # young data stays whatever else holds: the default grace is an hour
    out = run("git-xet", "prune", "--json", "--recent-days", "0", cwd=work)
    assert json.loads(out)["xorbs_removed"] == 0
    done = prune(work)
    assert (done["xorbs_removed"], done["shards_removed"], done["files_removed"]) == (2, 2, 2)
    assert done["kept_files"] == {"checkout": 1, "recent": 0, "unpushed": 0, "mounted": 0}
    assert xorbs(work) == 1
    run("git-xet", "fsck", cwd=work)  # the store is consistent
    # an old version comes back from the remote
    run("git", "checkout", "-q", "HEAD~2", cwd=work)
    assert (work / "f.bin").read_bytes() == datas[0]


def test_prune_keeps_unpushed_commits_and_recent_refs(work: Path) -> None:
    versions(work, 1)
    run("git", "checkout", "-q", "-b", "side", cwd=work)
    versions(work, 2, push=False)  # two commits no remote-tracking ref reaches
    run("git", "checkout", "-q", "main", cwd=work)
    done = prune(work)
    assert done["xorbs_removed"] == 0 and done["kept_files"]["unpushed"] == 2  # type: ignore[index]
    run("git", "push", "-q", "origin", "side", cwd=work)
    # pushed now, and no ref is recent with --recent-days 0: both of side's versions go
    assert prune(work)["files_removed"] == 2
    versions(work, 1)  # main moves on: its first version is at no ref's tip any more
    run("git", "checkout", "-q", "side", cwd=work)
    # recent refs (7 days): the tips of main and side (and of origin's) stay
    doc = json.loads(run("git-xet", "prune", "--json", "--grace", "0", cwd=work))
    assert doc["kept_files"]["recent"] == 2 and doc["files_removed"] == 1
    assert prune(work)["files_removed"] == 1  # main's tip: pushed, not checked out, not recent


def test_verify_remote_keeps_what_the_remote_lacks(work: Path) -> None:
    versions(work, 1)
    (work.parent / "remote.git" / "hooks" / "pre-receive").unlink()  # as an old remote
    env = dict(os.environ, GITXET_SKIP_PREPUSH="1")  # refs pushed without their data
    versions(work, 1, push=False)
    run("git", "push", "-q", "origin", "HEAD:main", cwd=work, env=env)
    versions(work, 1)
    doc = prune(work, "--verify-remote", "--dry-run")
    assert doc["not_on_remote"] == 1 and doc["files_removed"] == 1
    assert prune(work)["files_removed"] == 2  # without asking: pushed refs are enough


@pytest.mark.fuse
def test_prune_keeps_what_a_mount_serves(work: Path, tmp_path: Path) -> None:
    require_fuse()
    datas = versions(work, 2)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run("git-xet", "mount", str(work), "HEAD~1", str(mnt), cwd=work)
    try:
        done = prune(work)
        assert done["kept_files"]["mounted"] == 1 and done["xorbs_removed"] == 0  # type: ignore[index]
        assert (mnt / "f.bin").read_bytes() == datas[0]
    finally:
        run("git-xet", "unmount", str(mnt), cwd=work)
    assert prune(work)["xorbs_removed"] == 1
