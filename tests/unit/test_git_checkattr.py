"""AttrQuery: git check-attr answers, asked one at a time or ahead, in any order."""

from __future__ import annotations

from pathlib import Path

from gitxet.git.checkattr import AHEAD_BYTES, AttrQuery
from tests.helpers.proc import git


def _repo(tmp_path: Path) -> Path:
    git("init", "-q", str(tmp_path), cwd=tmp_path)
    (tmp_path / ".gitattributes").write_text("*.jpg xet=always\n*.txt -xet\n")
    return tmp_path


def _want(path: str) -> str:
    return {"jpg": "always", "txt": "unset"}.get(path.rsplit(".", 1)[-1], "unspecified")


def test_answers_asked_ahead_come_back_for_any_order(tmp_path: Path) -> None:
    q = AttrQuery(_repo(tmp_path), ["xet"])
    try:
        paths = ["a.jpg", "b.txt", "d/c.jpg", "e.bin"]
        assert q.ask_ahead(paths) == 4
        assert q.ask_ahead(paths) == 0  # asked already
        for p in ["d/c.jpg", "a.jpg", "e.bin", "b.txt"]:
            assert q.get(p) == {"xet": _want(p)}
        q.prefetch("f.jpg")
        assert q.get("g.txt") == {"xet": "unset"}  # not the prefetched one
        assert q.get("f.jpg") == {"xet": "always"}
        assert q.get("a.jpg") == {"xet": "always"}  # asked again once taken
    finally:
        q.close()


def test_asking_ahead_is_bounded_and_never_blocks(tmp_path: Path) -> None:
    q = AttrQuery(_repo(tmp_path), ["xet"])
    try:
        paths = [f"dir{i // 100}/file{i}.{'jpg' if i % 3 else 'txt'}" for i in range(5000)]
        asked = q.ask_ahead(paths)
        assert 0 < asked < len(paths) and asked * 64 <= AHEAD_BYTES
        for i, p in enumerate(paths):  # asked ahead again while answers are outstanding
            assert q.get(p) == {"xet": _want(p)}
            q.ask_ahead(paths[i + 1 : i + 50])
    finally:
        q.close()
