"""Everyday git commands on a gitxet repository, with the real git binary: after each,
the files hold their content, ``git status`` is clean and ``git xet fsck`` passes."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def gitxet_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """git calls ``git-xet`` back: make sure it is this interpreter's."""
    bindir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", bindir + os.pathsep + os.environ.get("PATH", ""))


def run(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"{args} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def git(*args: str, cwd: Path) -> str:
    return run("git", *args, cwd=cwd).stdout


def data(seed: int, size: int = 20_000) -> bytes:
    return random.Random(seed).randbytes(size)


def assert_clean(work: Path) -> None:
    """git sees no change, and fsck finds every pointer's data."""
    assert git("status", "--porcelain", cwd=work) == ""
    fsck = run("git-xet", "fsck", cwd=work, check=False)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A gitxet repository (threshold 4k, filter installed) with one pointer file."""
    work = tmp_path / "work"
    git("init", "-q", str(work), cwd=tmp_path)
    run("git-xet", "install", "--local", cwd=work)
    run("git-xet", "init", "--threshold", "4k", cwd=work)
    (work / "data").mkdir()
    (work / "data" / "a.bin").write_bytes(data(1))
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "one", cwd=work)
    return work


def test_worktree_add_reads_the_shared_store(work: Path, tmp_path: Path) -> None:
    """'git worktree add' gives the new work tree a git dir of its own: its files are
    smudged from, and its commits cleaned into, the repository's one store (the data of
    an unpushed commit is only there); each work tree stays clean."""
    git("switch", "-q", "-c", "topic", cwd=work)
    (work / "data" / "a.bin").write_bytes(data(2))
    git("commit", "-q", "-am", "local only", cwd=work)
    git("switch", "-q", "main", cwd=work)

    linked = tmp_path / "linked"
    git("worktree", "add", "-q", str(linked), "topic", cwd=work)
    assert (linked / "data" / "a.bin").read_bytes() == data(2)
    assert_clean(linked)
    assert not (work / ".git" / "worktrees" / "linked" / "xet" / "xorbs").exists()

    (linked / "data" / "b.bin").write_bytes(data(3))
    run("git-xet", "add", "data/b.bin", cwd=linked)
    git("commit", "-q", "-m", "from the linked work tree", cwd=linked)
    assert_clean(linked)
    git("merge", "-q", "topic", cwd=work)
    assert (work / "data" / "b.bin").read_bytes() == data(3)
    assert_clean(work)


def test_a_linked_work_tree_is_a_remote_and_a_dataset(work: Path, tmp_path: Path) -> None:
    """A linked work tree's '.git' is a file: cloning it (its data is in the main git dir's
    store) failed 'nowhere to be had', and a mount of it died 'not a git repository'."""
    from gitxet.dataset import open_commit

    linked = tmp_path / "linked"
    git("worktree", "add", "-q", "-b", "topic", str(linked), cwd=work)
    (linked / "data" / "b.bin").write_bytes(data(7))
    run("git-xet", "add", "data/b.bin", cwd=linked)
    git("commit", "-q", "-m", "linked", cwd=linked)

    clone = tmp_path / "clone"
    git("clone", "-q", "-b", "topic", str(linked), str(clone), cwd=tmp_path)
    run("git-xet", "checkout", cwd=clone)  # no global install here: it sets the filter up
    assert (clone / "data" / "b.bin").read_bytes() == data(7)
    assert_clean(clone)

    opened = open_commit(str(linked), "HEAD")  # the linked work tree's HEAD, not main's
    try:
        assert opened.commit == git("rev-parse", "HEAD", cwd=linked).strip()
        attrs = opened.fs.resolve_path(b"data/b.bin")
        assert opened.fs.read(attrs.ino, 0, 1 << 20) == data(7)
    finally:
        opened.close()
        opened.dataset.close()


def test_fsck_in_a_server_repository_says_its_data_is_in_the_server_store(
    tmp_path: Path,
) -> None:
    """Inside ``<root>/repos/NAME.git`` of 'git xet serve' fsck said every file was missing
    (the data is in the server's store): it says what the directory is, creates no store."""
    root = tmp_path / "srv"
    run("git-xet", "repo", "create", "--root", str(root), "data", cwd=tmp_path)
    run("git-xet", "token", "create", "--root", str(root), cwd=tmp_path)
    served = root / "repos" / "data.git"
    r = run("git-xet", "fsck", cwd=served, check=False)
    assert r.returncode == 1
    assert "repository of 'git xet serve --root" in r.stderr and "clone" in r.stderr
    assert "Traceback" not in r.stderr and not (served / "xet").exists()


def test_fsck_before_the_first_commit_is_clean(tmp_path: Path) -> None:
    git("init", "-q", "new", cwd=tmp_path)
    r = run("git-xet", "fsck", cwd=tmp_path / "new", check=False)
    assert r.returncode == 0 and "pointer files in HEAD: 0" in r.stdout, r.stderr


def test_add_with_an_index_lock_left_behind_says_what_to_do(work: Path) -> None:
    """A killed 'git xet add' leaves git's index.lock; the next add names it and says to
    remove it when no git command is running (git's own words do not mention the kill)."""
    (work / ".git" / "index.lock").write_bytes(b"")
    (work / "data" / "b.bin").write_bytes(data(4))
    r = run("git-xet", "add", "data/b.bin", cwd=work, check=False)
    assert r.returncode == 1
    ours = [line for line in r.stderr.splitlines() if line.startswith("git-xet:")]
    assert len(ours) == 1 and "index.lock" in ours[0] and "remove" in ours[0], r.stderr
    (work / ".git" / "index.lock").unlink()
    run("git-xet", "add", "data/b.bin", cwd=work)
    git("commit", "-q", "-m", "two", cwd=work)
    assert_clean(work)


def test_pull_with_include_writes_the_matching_files_of_a_lazy_clone(
    work: Path, tmp_path: Path
) -> None:
    """'git xet pull -I' in a lazy clone (xet.lazy) wrote nothing: the files it names are
    written, the others stay pointers, as 'git lfs pull -I' does with skip-smudge."""
    remote = tmp_path / "remote.git"
    git("init", "-q", "--bare", str(remote), cwd=tmp_path)
    git("remote", "add", "origin", str(remote), cwd=work)
    git("push", "-q", "-u", "origin", "main", cwd=work)
    lazy = tmp_path / "lazy"
    run("git-xet", "clone", "--lazy", str(remote), str(lazy), cwd=tmp_path)
    (work / "e").mkdir()
    (work / "e" / "wanted.bin").write_bytes(data(5))
    (work / "data" / "a.bin").write_bytes(data(6))
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "two", cwd=work)
    git("push", "-q", cwd=work)

    run("git-xet", "pull", "-I", "e/*", cwd=lazy)
    assert (lazy / "e" / "wanted.bin").read_bytes() == data(5)
    assert (lazy / "data" / "a.bin").read_bytes().startswith(b"version https://gitxet.dev/")
    assert_clean(lazy)


def test_checkout_in_a_sparse_checkout_writes_only_the_checked_out_files(
    work: Path, tmp_path: Path
) -> None:
    """'git xet checkout' and 'pull' in a sparse checkout of a lazy clone write the pointer
    files git checked out, not those the sparse patterns leave out (they were written, and
    their index entries lost the skip-worktree bit: the sparse checkout was undone)."""
    (work / "other").mkdir()
    (work / "other" / "b.bin").write_bytes(data(7))
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "two", cwd=work)
    remote = tmp_path / "remote.git"
    git("init", "-q", "--bare", str(remote), cwd=tmp_path)
    git("push", "-q", str(remote), "main", cwd=work)
    lazy = tmp_path / "lazy"
    run("git-xet", "clone", "--lazy", str(remote), str(lazy), cwd=tmp_path)
    git("sparse-checkout", "set", "data", cwd=lazy)
    assert not (lazy / "other").exists()

    for command in (["checkout"], ["checkout", "."], ["pull"]):
        run("git-xet", *command, cwd=lazy)
        assert (lazy / "data" / "a.bin").read_bytes() == data(1)
        assert not (lazy / "other").exists(), command
        assert git("ls-files", "-t", "other/b.bin", cwd=lazy) == "S other/b.bin\n"
        assert_clean(lazy)
    git("sparse-checkout", "disable", cwd=lazy)  # git writes its pointer (a lazy clone)
    run("git-xet", "checkout", cwd=lazy)
    assert (lazy / "other" / "b.bin").read_bytes() == data(7)
    assert_clean(lazy)
