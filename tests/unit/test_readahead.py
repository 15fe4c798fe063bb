"""CleanReadahead: the files git will clean next, in git's order, read ahead in a window."""

from __future__ import annotations

import os
from pathlib import Path

from gitxet.git.readahead import FIRST_WINDOW, CleanReadahead, walk_after
from tests.helpers.proc import git


def _tree(root: Path, paths: list[str]) -> None:
    for p in paths:
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        (root / p).write_bytes(b"x" * 10)


def test_walk_follows_git_path_order(tmp_path: Path) -> None:
    root = tmp_path / "wt"
    root.mkdir()
    _tree(root, ["a/b", "a-c", "a.d/e", "a/b0/x", "ab", "b/c/d/e", ".hidden", "z", "a/bb"])
    (root / "outside").write_bytes(b"o")
    os.symlink(root / "outside", root / "a" / "link")  # not followed, not listed
    os.mkfifo(root / "a" / "fifo")  # not a regular file: never opened
    git("init", "-q", cwd=root)
    git("add", "-A", cwd=root)
    listed = git("ls-files", "-s", cwd=root).splitlines()
    order = [line.split("\t")[1].encode() for line in listed if line.startswith("100644")]
    walked = list(walk_after(os.fsencode(root), b""))
    assert walked == order  # .git skipped, files only, git's order
    assert list(walk_after(os.fsencode(root), b"a/b0/x")) == order[order.index(b"a/b0/x") + 1 :]
    assert list(walk_after(os.fsencode(root), b"a.d")) == order[order.index(b"a.d/e") :]


def test_window_grows_on_hits_and_restarts_on_a_miss(tmp_path: Path) -> None:
    _tree(tmp_path, [f"d/f{i:03d}" for i in range(50)])
    os.mkfifo(tmp_path / "d" / "f000p")  # between f000 and f001 in the walk: skipped
    ra = CleanReadahead(tmp_path)
    try:
        ra.saw("d/f000")
        assert ra.settled(60)
        assert (ra.advised, ra.hits) == (FIRST_WINDOW, 0)  # f001..f004
        ra.saw("d/f001")  # predicted: the window doubles, f005..f009 are read ahead
        assert ra.settled(60)
        assert (ra.advised, ra.hits) == (2 * FIRST_WINDOW + 1, 1)
        ra.saw("d/f030")  # not predicted: start over from there with a small window
        assert ra.settled(60)
        assert (ra.advised, ra.hits) == (3 * FIRST_WINDOW + 1, 1)
        ra.saw("d/f048")  # a miss near the end: only f049 is left
        assert ra.settled(60)
        assert ra.advised == 3 * FIRST_WINDOW + 2
    finally:
        ra.close()
    ra.saw("d/f000")  # closed: ignored
    assert ra.advised == 3 * FIRST_WINDOW + 2
