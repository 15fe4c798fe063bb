"""What ``git xet serve`` refuses to store from a push, with real git over HTTP.

Trees git itself calls invalid (``.git``, ``..`` and look-alikes, made with ``git hash-object
--literally``) are refused by git's fsck, in new and in pre-existing repositories. Commits
whose pointer files name data the CAS lacks are refused by gitxet's pre-receive hook, naming
the file; the ref does not move; ``git xet push`` then uploads the data and the push goes
through. A user's own pre-receive hook keeps running. HEAD only ever names a branch.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gitxet.formats.pointer import Pointer
from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig
from tests.helpers.proc import git, run

pytestmark = pytest.mark.timeout(300)


@dataclass
class Srv:
    host: str
    root: Path
    write: str

    def url(self, repo: str) -> str:
        return f"http://user:{self.write}@{self.host}/{repo}.git"

    def repo(self, name: str) -> Path:
        return self.root / "repos" / f"{name}.git"


@pytest.fixture
def srv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Srv]:
    root = tmp_path / "srv"
    write, _ = TokenStore(str(root)).create("write")
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("GITXET_TOKEN", write)
    monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp_path / "cache"))
    with BackgroundServer(ServerConfig(root=str(root), port=0)) as s:
        yield Srv(s.url.removeprefix("http://"), root, write)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    w = tmp_path / "work"
    git("init", "-q", str(w), cwd=tmp_path)
    (w / "a.txt").write_text("one\n")
    git("add", "a.txt", cwd=w)
    git("commit", "-qm", "first", cwd=w)
    return w


def server_ref(srv: Srv, repo: str, ref: str) -> str | None:
    r = run(
        "git",
        "--git-dir",
        str(srv.repo(repo)),
        "rev-parse",
        "-q",
        "--verify",
        ref,
        cwd=srv.root,
        check=False,
    )
    return r.stdout.strip() or None


def hostile_commit(work: Path, name: bytes) -> str:
    """A commit whose root tree has a directory ``name`` holding a ``config`` file."""

    def tree(entries: list[tuple[bytes, bytes, str]]) -> str:
        raw = b"".join(m + b" " + n + b"\0" + bytes.fromhex(oid) for m, n, oid in entries)
        r = subprocess.run(
            ["git", "hash-object", "-t", "tree", "--literally", "-w", "--stdin"],
            cwd=work,
            input=raw,
            capture_output=True,
            check=True,
        )
        return r.stdout.decode().strip()

    blob = (
        subprocess.run(
            ["git", "hash-object", "-w", "--stdin"],
            cwd=work,
            input=b"[core]\n\tfsmonitor = touch /tmp/owned\n",
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    sub = tree([(b"100644", b"config", blob)])
    root = tree([(b"40000", name, sub)])
    return git("commit-tree", root, "-m", "hostile", cwd=work)


@pytest.mark.parametrize("pre_existing", [False, True])
def test_trees_git_calls_invalid_are_refused(
    srv: Srv, work: Path, tmp_path: Path, pre_existing: bool
) -> None:
    if pre_existing:  # a repository made before the server set fsck in repo configs
        run("git", "init", "-q", "--bare", str(srv.repo("data")), cwd=tmp_path)
    git("push", "-q", srv.url("data"), "main", cwd=work)
    for name in (b".git", b"..", b".GIT", b".git.", b"git~1", b"/etc", b"a/b", b"."):
        commit = hostile_commit(work, name)
        r = run("git", "push", srv.url("data"), f"{commit}:refs/heads/evil", cwd=work, check=False)
        assert r.returncode != 0, (name, r.stderr)
        assert "fsck error" in r.stderr or "unpack failed" in r.stderr, (name, r.stderr)
        assert server_ref(srv, "data", "refs/heads/evil") is None
    gone = run(
        "git",
        "--git-dir",
        str(srv.repo("data")),
        "cat-file",
        "-e",
        commit,
        cwd=tmp_path,
        check=False,
    )
    assert gone.returncode != 0  # the quarantined objects were dropped


def pointer_commit(work: Path, path: str, size: int = 123_456) -> str:
    """Commit a pointer file (plain git, no filter) naming data no CAS has."""
    rnd = random.Random(path)
    ptr = Pointer(
        sha256=hashlib.sha256(rnd.randbytes(8)).hexdigest(),
        size=size,
        xet_hash=rnd.randbytes(32).hex(),
    )
    target = work / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(ptr.encode())
    git("add", path, cwd=work)
    git("commit", "-qm", f"pointer {path}", cwd=work)
    return git("rev-parse", "HEAD", cwd=work)


def test_dangling_pointer_is_refused_naming_the_path(srv: Srv, work: Path) -> None:
    git("push", "-q", srv.url("data"), "main", cwd=work)
    before = server_ref(srv, "data", "refs/heads/main")
    pointer_commit(work, "images/train/0001.bin")
    r = run("git", "push", srv.url("data"), "main", cwd=work, check=False)
    assert r.returncode != 0
    assert "images/train/0001.bin" in r.stderr and "push refused" in r.stderr, r.stderr
    assert "pre-receive hook declined" in r.stderr
    assert "Traceback" not in r.stderr
    assert server_ref(srv, "data", "refs/heads/main") == before
    # a new branch carrying it is refused too
    r = run("git", "push", srv.url("data"), "main:refs/heads/other", cwd=work, check=False)
    assert r.returncode != 0 and server_ref(srv, "data", "refs/heads/other") is None


def test_a_repository_made_before_the_hook_and_a_user_hook(
    srv: Srv, work: Path, tmp_path: Path
) -> None:
    bare = srv.repo("old")
    run("git", "init", "-q", "--bare", str(bare), cwd=tmp_path)
    user_hook = bare / "hooks" / "pre-receive"
    user_hook.write_text("#!/bin/sh\ncat >/dev/null\necho 'user hook ran' >&2\n")
    user_hook.chmod(0o755)
    git("push", "-q", srv.url("old"), "main", cwd=work)
    assert (bare / "hooks" / "pre-receive.gitxet-chained").exists()
    assert b"# gitxet hook" in user_hook.read_bytes()
    pointer_commit(work, "big.bin")
    r = run("git", "push", srv.url("old"), "main", cwd=work, check=False)
    assert r.returncode != 0 and "big.bin" in r.stderr and "user hook ran" in r.stderr, r.stderr


def test_git_xet_push_repairs_and_then_the_push_goes_through(srv: Srv, tmp_path: Path) -> None:
    work = tmp_path / "w"
    git("init", "-q", str(work), cwd=tmp_path)
    run("git-xet", "init", cwd=work)
    git("remote", "add", "origin", srv.url("data"), cwd=work)
    (work / "notes.txt").write_text("notes\n")
    git("add", ".", cwd=work)
    git("commit", "-qm", "one", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    data = random.Random(7).randbytes(700_000)
    (work / "sub").mkdir()
    (work / "sub" / "real.bin").write_bytes(data)
    git("add", ".", cwd=work)
    git("commit", "-qm", "two", cwd=work)
    before = server_ref(srv, "data", "refs/heads/main")
    # what a clone without the pre-push hook does: pointers go, data stays behind
    r = run(
        "git", "push", "origin", "main", cwd=work, check=False, env={"GITXET_SKIP_PREPUSH": "1"}
    )
    assert r.returncode != 0 and "sub/real.bin" in r.stderr, r.stderr
    assert server_ref(srv, "data", "refs/heads/main") == before
    run("git-xet", "push", "--all", "origin", "main", cwd=work)
    assert server_ref(srv, "data", "refs/heads/main") == git("rev-parse", "HEAD", cwd=work)
    clone = tmp_path / "clone"
    run("git-xet", "clone", srv.url("data"), str(clone), cwd=tmp_path)
    assert (clone / "sub" / "real.bin").read_bytes() == data


def test_first_push_of_a_nested_branch_points_head_at_it(srv: Srv, work: Path) -> None:
    git("branch", "-m", "main", "feature/x", cwd=work)
    git("push", "-q", srv.url("nest"), "feature/x", cwd=work)
    head = (srv.repo("nest") / "HEAD").read_text().strip()
    assert head == "ref: refs/heads/feature/x"
    git("push", "-q", srv.url("nest"), "feature/x:refs/heads/feature/y", cwd=work)
    assert (srv.repo("nest") / "HEAD").read_text().strip() == head
