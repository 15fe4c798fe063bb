"""gitxet.repo.repository: XetRepo opens a repository (work tree or bare) and composes the
parts; exercised directly on real git repositories, without the CLI."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gitxet.errors import ConfigError, DataUnavailableError
from gitxet.formats.pointer import Pointer
from gitxet.repo.repository import XetRepo

Git = Callable[..., str]
DATA = os.urandom(120_000)


def test_opens_a_work_tree_and_a_bare_repository(
    git_repo: Path, tmp_path: Path, run_git_cmd: Git
) -> None:
    sub = git_repo / "deep" / "dir"
    sub.mkdir(parents=True)
    repo = XetRepo(sub)
    assert repo.worktree == git_repo.resolve()
    assert repo.git_dir == (git_repo / ".git").resolve()
    assert repo.cwd == str(git_repo.resolve())
    assert repo.cas.root == str(git_repo.resolve() / ".git" / "xet")
    assert repo.lazy is False
    bare = tmp_path / "bare.git"
    run_git_cmd(tmp_path, "init", "-q", "--bare", str(bare))
    b = XetRepo(bare)
    assert b.worktree is None and b.cwd == str(bare.resolve())
    assert b.ref_tips(False) == []  # no commit yet


def test_lazy_comes_from_git_config_unless_given(git_repo: Path, run_git_cmd: Git) -> None:
    run_git_cmd(git_repo, "config", "xet.lazy", "on")
    assert XetRepo(git_repo).lazy is True
    assert XetRepo(git_repo, lazy=False).lazy is False
    run_git_cmd(git_repo, "config", "xet.lazy", "maybe")
    repo = XetRepo(git_repo)  # read when the filter is first used, not by every command
    with pytest.raises(ConfigError):
        _ = repo.lazy


def test_the_parts_share_one_store_and_one_name_map(git_repo: Path, run_git_cmd: Git) -> None:
    repo = XetRepo(git_repo, lazy=False)
    repo.threshold = 1000
    assert repo.filter.threshold == 1000
    blob, _ = repo.clean_stream(io.BytesIO(DATA), "data/f.bin")
    ptr = Pointer.decode(blob)
    (git_repo / "data").mkdir()
    (git_repo / "data" / "f.bin").write_bytes(blob)
    run_git_cmd(git_repo, "add", "-A")
    run_git_cmd(git_repo, "commit", "-qm", "pointer")
    files = repo.pointer_files()
    assert [(f.path, f.pointer, f.materialized) for f in files] == [("data/f.bin", ptr, False)]
    assert repo.content.names[ptr.xet_hash] == "data/f.bin"  # errors name the file
    assert repo.materialize(files) == 1
    assert (git_repo / "data" / "f.bin").read_bytes() == DATA
    # the filter knows the file it wrote: its clean gives the pointer back unread
    assert repo.clean_stream(io.BytesIO(b"?" * len(DATA)), "data/f.bin")[0] == blob
    assert repo.dematerialize(repo.pointer_files()) == 1
    assert repo.history.ref_tips(False) == repo.ref_tips(False)
    # a pointer to data nobody has: named by the path it was listed at
    gone = Pointer(sha256="ab" * 32, size=9, xet_hash="cd" * 32)
    repo.content.names[gone.xet_hash] = "lost.bin"
    with pytest.raises(DataUnavailableError, match=r"lost\.bin"):
        repo.write_content(gone, io.BytesIO())
