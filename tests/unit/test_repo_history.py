"""gitxet.repo.history: refs, where the data of history is, the repairing push and what a
prune keeps, on real git repositories with a path remote (no CLI, no filter installed)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gitxet.data.clean import Ingestor
from gitxet.dataset import Remotes
from gitxet.formats.pointer import Pointer
from gitxet.hashing import from_hex, to_hex
from gitxet.repo.content import Content
from gitxet.repo.history import History
from gitxet.store.cas import LocalCAS

Git = Callable[..., str]


def ingest(cas: LocalCAS, data: bytes) -> Pointer:
    with Ingestor(cas) as ing:
        r = ing.add_bytes(data)
        ing.flush()
    return Pointer(sha256=r.sha256, size=r.size, xet_hash=to_hex(r.file_hash))


def commit(repo: Path, git: Git, name: str, ptr: Pointer) -> str:
    (repo / name).write_bytes(ptr.encode())
    git(repo, "add", name)
    git(repo, "commit", "-qm", name)
    return git(repo, "rev-parse", "HEAD").strip()


class Setup:
    def __init__(self, tmp_path: Path, git: Git) -> None:
        self.origin = tmp_path / "origin"
        self.origin.mkdir()
        git(self.origin, "init", "-q", "--bare")
        self.repo = tmp_path / "here"
        self.repo.mkdir()
        git(self.repo, "init", "-q")
        git(self.repo, "remote", "add", "origin", str(self.origin))
        self.cas = LocalCAS(str(self.repo / ".git" / "xet"))
        self.content = Content(self.cas, Remotes(str(self.repo)))
        self.history = History(str(self.repo), self.repo, self.content)
        self.a = ingest(self.cas, os.urandom(90_000))
        self.b = ingest(self.cas, os.urandom(80_000))
        self.first = commit(self.repo, git, "a.bin", self.a)
        self.second = commit(self.repo, git, "b.bin", self.b)


@pytest.fixture
def s(tmp_path: Path, run_git_cmd: Git) -> Setup:
    return Setup(tmp_path, run_git_cmd)


def test_ref_tips_and_recent_refs(s: Setup, run_git_cmd: Git) -> None:
    assert s.history.ref_tips(False) == [s.second]
    run_git_cmd(s.repo, "tag", "v1", s.first)
    assert sorted(s.history.ref_tips(True)) == sorted([s.second, s.first])
    assert s.history.recent_refs(7) == [s.second]
    assert s.history.recent_refs(7, now=time.time() + 30 * 86400) == []  # too old by then


def test_locate_unpushed_and_the_repairing_push(s: Setup) -> None:
    assert s.history.unpushed("origin") == 2
    lost = Pointer(sha256="ab" * 32, size=5, xet_hash="cd" * 32)
    where = s.history.locate([("a.bin", s.a), ("lost.bin", lost)], "origin", ask_remote=True)
    # the remote is asked only about what is not here
    assert [(d.path, d.local, d.remote) for d in where] == [
        ("a.bin", True, None),
        ("lost.bin", False, False),
    ]
    summary, missing = s.history.repair_push("origin", [s.second])
    assert summary.files == 2 and missing == []
    assert s.history.unpushed("origin") == 0
    pushed = Content(LocalCAS(str(s.origin / "xet")), Remotes(str(s.origin)))
    assert (
        History(str(s.origin), None, pushed)
        .locate([("a.bin", s.a)], None, ask_remote=False)[0]
        .local
    )  # the remote's store has it now


def test_unpushed_is_none_without_an_embedded_remote(s: Setup, run_git_cmd: Git) -> None:
    assert s.history.unpushed("nowhere") is None
    run_git_cmd(s.repo, "remote", "add", "web", "https://example.invalid/r.git")
    assert s.history.unpushed("web") is None


def test_repair_push_names_files_whose_data_is_nowhere(s: Setup, run_git_cmd: Git) -> None:
    lost = Pointer(sha256="ab" * 32, size=5, xet_hash="cd" * 32)
    third = commit(s.repo, run_git_cmd, "lost.bin", lost)
    _summary, missing = s.history.repair_push("origin", [third])
    assert [d.path for d in missing] == ["lost.bin"]


def test_files_to_keep(s: Setup, run_git_cmd: Git) -> None:
    run_git_cmd(s.repo, "rm", "-q", "b.bin")
    run_git_cmd(s.repo, "commit", "-qm", "drop b")
    keep = s.history.files_to_keep(7, commits=[s.second])
    a, b = from_hex(s.a.xet_hash), from_hex(s.b.xet_hash)
    assert keep["checkout"] == {a}
    assert keep["recent"] == {a}  # the branch tip's tree
    assert keep["unpushed"] == {a, b}  # no remote-tracking ref reaches any commit
    assert keep["commits"] == {a, b}
    run_git_cmd(s.repo, "push", "-q", "origin", "main")
    assert s.history.files_to_keep(7)["unpushed"] == set()
