"""GitObjects.describe / trees (one pipelined ``git cat-file --batch-command``) against the
real git binary: sizes, the small contents asked for, and every answer git can give
(missing, another type) in windows of any length."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gitxet.errors import GitError
from gitxet.git import catfile
from gitxet.git.objects import GitObjects

Git = Callable[..., str]


def _blobs(repo: Path, run_git_cmd: Git, blobs: list[bytes], tmp: Path) -> list[bytes]:
    """Store blobs (``git hash-object -w`` of files); their ids."""
    tmp.mkdir(exist_ok=True)
    paths = []
    for i, data in enumerate(blobs):
        (tmp / f"b{i}").write_bytes(data)
        paths.append(str(tmp / f"b{i}"))
    return [bytes.fromhex(x) for x in run_git_cmd(repo, "hash-object", "-w", *paths).split()]


@pytest.fixture
def objects(
    git_repo: Path, run_git_cmd: Git, tmp_path: Path
) -> tuple[GitObjects, list[bytes], list[bytes]]:
    """A repository with 700 blobs of 0..1395 bytes, some packed and some loose."""
    blobs = [(b"%05d" % i) * (i % 280) for i in range(700)]
    shas = _blobs(git_repo, run_git_cmd, blobs[:400], tmp_path / "a")
    run_git_cmd(git_repo, "repack", "-q", "-a", "-d")  # some packed, some loose
    shas += _blobs(git_repo, run_git_cmd, blobs[400:], tmp_path / "b")
    g = GitObjects(str(git_repo))
    return g, shas, blobs


@pytest.mark.parametrize("window", [catfile._WINDOW, 7])
def test_describe_gives_sizes_and_the_small_contents(
    objects: tuple[GitObjects, list[bytes], list[bytes]],
    git_repo: Path,
    run_git_cmd: Git,
    monkeypatch: pytest.MonkeyPatch,
    window: int,
) -> None:
    g, shas, blobs = objects
    monkeypatch.setattr(catfile, "_WINDOW", window)
    run_git_cmd(git_repo, "add", "-A")
    tree = bytes.fromhex(run_git_cmd(git_repo, "write-tree").strip())
    # (git_repo has no files: the empty tree, which write-tree writes as an object)
    missing = bytes.fromhex("ab" * 20)
    names = [*shas[:300], missing, tree, *shas[300:], shas[5]]
    want: list[int] = [len(b) for b in blobs[:300]] + [-1, -1]
    want += [len(b) for b in blobs[300:]] + [len(blobs[5])]
    try:
        sizes, small = g.describe(names, (192, 1024))
        assert sizes == want
        assert small == {
            i: blobs[i if i < 300 else i - 2 if i < 702 else 5]
            for i, size in enumerate(want)
            if 192 <= size <= 1024
        }
        assert g.describe([], (0, 10)) == ([], {})
        # every answer is read: the next exchange on the same process is in step
        assert g.describe([missing, shas[1]], (0, 1 << 20)) == ([-1, len(blobs[1])], {1: blobs[1]})
        assert g.trees([tree, shas[1], missing]) == [b"", None, None]
    finally:
        g.close()


def test_describe_refuses_bad_names(git_repo: Path) -> None:
    d = catfile.Describer(git_repo)
    try:
        for bad in (["a\nb"], ["ab", ""], ["a\0"]):
            with pytest.raises(GitError, match="invalid object name"):
                d.describe(bad, "blob", (0, 1))
    finally:
        d.close()
