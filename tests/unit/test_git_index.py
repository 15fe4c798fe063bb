"""gitxet.git.index: new stat data for rewritten files, checked by the real git binary."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gitxet.git.index import Restat, restat_entries

Git = Callable[..., str]
NAMES = ["a.bin", "dir/b.bin", "dir/sub/c d.bin", "x" * 200 + "/" + "y" * 200 + ".bin", "run.sh"]


def rewrite_in_the_past(path: Path) -> os.stat_result:
    """Rewrite a file with the same bytes (new inode), dated well before any index write.

    Files written in the same second as the index are "racily clean" to git, which then
    compares content; dating them back keeps this test about stat data only.
    """
    data = path.read_bytes()
    mode = path.stat().st_mode
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    past = time.time() - 30
    os.utime(tmp, (past, past))
    os.replace(tmp, path)
    return path.stat()


def make_repo(repo: Path, git: Git, *setup: tuple[str, ...]) -> None:
    for args in setup:
        git(repo, *args)
    for i, name in enumerate(NAMES):
        p = repo / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(f"content {i}\n".encode() * (i + 1))
    (repo / "run.sh").chmod(0o755)
    # a clean filter that leaves a trace: git must not need it after restat_entries
    git(repo, "config", "filter.trace.clean", f"sh -c 'echo x >> {repo}/.git/cleaned; cat'")
    (repo / ".git" / "info" / "attributes").write_text("*.bin filter=trace\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "v1")


def restat_all(repo: Path, git: Git) -> set[bytes]:
    files = {}
    for name in NAMES:
        blob = git(repo, "rev-parse", f":{name}").strip()
        files[name.encode()] = Restat(bytes.fromhex(blob), rewrite_in_the_past(repo / name))
    return restat_entries(repo / ".git", files)


def clean_calls(repo: Path) -> int:
    p = repo / ".git" / "cleaned"
    return len(p.read_text().splitlines()) if p.exists() else 0


@pytest.mark.parametrize(
    "setup",
    [
        (),
        (("config", "index.version", "4"),),
        (("init", "-q", "--object-format=sha256"),),
    ],
    ids=["v2", "v4", "sha256"],
)
def test_git_sees_the_rewritten_files_as_unchanged(
    git_repo: Path, run_git_cmd: Git, setup: tuple[tuple[str, ...], ...]
) -> None:
    if setup and setup[0][0] == "init":
        for p in git_repo.iterdir():
            import shutil

            shutil.rmtree(p)
    make_repo(git_repo, run_git_cmd, *setup)
    before = clean_calls(git_repo)
    assert restat_all(git_repo, run_git_cmd) == {n.encode() for n in NAMES}
    assert not (git_repo / ".git" / "index.lock").exists()
    # stat matches: no content comparison (no clean filter run), nothing modified
    assert run_git_cmd(git_repo, "status", "--porcelain") == ""
    run_git_cmd(git_repo, "diff-files", "--quiet")
    assert clean_calls(git_repo) == before
    assert "index" not in run_git_cmd(git_repo, "fsck", "--no-dangling")


def test_without_restat_git_has_to_read_the_content(git_repo: Path, run_git_cmd: Git) -> None:
    make_repo(git_repo, run_git_cmd)
    before = clean_calls(git_repo)
    for name in NAMES:
        rewrite_in_the_past(git_repo / name)
    assert run_git_cmd(git_repo, "status", "--porcelain") == ""
    assert clean_calls(git_repo) > before  # the control: this is the work restat saves


def test_extended_flags_and_other_entries_survive(git_repo: Path, run_git_cmd: Git) -> None:
    make_repo(git_repo, run_git_cmd)
    (git_repo / "later.txt").write_text("intent\n")
    run_git_cmd(git_repo, "add", "-N", "later.txt")  # intent-to-add: an extended entry (v3)
    run_git_cmd(git_repo, "update-index", "--skip-worktree", "run.sh")
    before = run_git_cmd(git_repo, "ls-files", "-s", "-v")
    assert restat_all(git_repo, run_git_cmd) == {n.encode() for n in NAMES}
    assert run_git_cmd(git_repo, "ls-files", "-s", "-v") == before
    assert "later.txt" in run_git_cmd(git_repo, "status", "--porcelain")


def test_entries_that_moved_on_are_left_to_git(git_repo: Path, run_git_cmd: Git) -> None:
    make_repo(git_repo, run_git_cmd)
    st = rewrite_in_the_past(git_repo / "a.bin")
    other = bytes.fromhex(run_git_cmd(git_repo, "rev-parse", ":run.sh").strip())
    assert restat_entries(git_repo / ".git", {b"a.bin": Restat(other, st)}) == set()
    assert restat_entries(git_repo / ".git", {b"nope.bin": Restat(other, st)}) == set()


def test_a_busy_or_split_index_is_not_touched(git_repo: Path, run_git_cmd: Git) -> None:
    make_repo(git_repo, run_git_cmd)
    index = git_repo / ".git" / "index"
    lock = git_repo / ".git" / "index.lock"
    lock.write_bytes(b"")
    before = index.read_bytes()
    assert restat_all(git_repo, run_git_cmd) == set()
    assert index.read_bytes() == before and lock.exists()
    lock.unlink()
    run_git_cmd(git_repo, "update-index", "--split-index")
    before = index.read_bytes()
    assert restat_all(git_repo, run_git_cmd) == set()
    assert index.read_bytes() == before and not lock.exists()


def test_a_damaged_index_is_not_touched(git_repo: Path, run_git_cmd: Git) -> None:
    make_repo(git_repo, run_git_cmd)
    index = git_repo / ".git" / "index"
    data = bytearray(index.read_bytes())
    data[40] ^= 0xFF  # inside the first entry: the checksum no longer matches
    index.write_bytes(bytes(data))
    assert restat_all(git_repo, run_git_cmd) == set()
    assert index.read_bytes() == bytes(data)
