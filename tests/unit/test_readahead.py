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
    ra: CleanReadahead[object] = CleanReadahead(tmp_path)
    try:
        ra.saw("d/f000")
        assert ra.settled(60)
        assert (ra.advised, ra.hits) == (FIRST_WINDOW, 0)  # f001..f004
        ra.saw("d/f001")  # predicted: the window doubles (f001 is in it), f005..f008
        assert ra.settled(60)
        assert (ra.advised, ra.hits) == (2 * FIRST_WINDOW, 1)
        ra.saw("d/f030")  # not predicted: start over from there with a small window
        assert ra.settled(60)
        assert (ra.advised, ra.hits) == (3 * FIRST_WINDOW, 1)
        ra.saw("d/f048")  # a miss near the end: only f049 is left
        assert ra.settled(60)
        assert ra.advised == 3 * FIRST_WINDOW + 1
    finally:
        ra.close()
    ra.saw("d/f000")  # closed: ignored
    assert ra.advised == 3 * FIRST_WINDOW + 1


def test_prepared_results_are_handed_over_only_for_the_same_bytes(tmp_path: Path) -> None:
    for i in range(20):
        (tmp_path / f"f{i:02d}").write_bytes(b"%010d" % i)
    seen: list[bytes] = []

    def prepare(data: bytes) -> tuple[str, bytes]:
        seen.append(data)
        return ("prepared", data)

    ra = CleanReadahead(tmp_path, prepare=prepare)
    try:
        ra.saw("f00")
        assert ra.settled(60)
        assert ra.prepared == 0  # nobody took a result yet: nothing prepared
        assert ra.take("f00", b"%010d" % 0) is None  # asks for the next ones
        assert ra.settled(60)
        assert seen == [b"%010d" % i for i in range(1, 1 + FIRST_WINDOW)]
        ra.saw("f01")
        assert ra.take("f01", b"%010d" % 1) == ("prepared", b"%010d" % 1)
        ra.saw("f02")
        assert ra.take("f02", b"changed!!!") is None  # git sent other bytes: not used
        assert ra.take("f02", b"%010d" % 2) is None  # and the result is gone
        ra.saw("f09")
        assert ra.take("f09", b"%010d" % 9) in (None, ("prepared", b"%010d" % 9))
        assert ra.take("nowhere", b"") is None
        assert ra.settled(60)
        assert ra.taken >= 1
    finally:
        ra.close()
