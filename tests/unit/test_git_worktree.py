"""WorkTree: writes reach paths one directory handle at a time and never leave the tree."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from gitxet.errors import UnsafePathError
from gitxet.git.worktree import KEPT_DIRS, WorkTree
from gitxet.util.atomic import atomic_writer_at


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "wt"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "victim").write_bytes(b"precious")
    return root, outside


def write(wt: WorkTree, path: str, data: bytes, tmp_dir: str | None = None) -> os.stat_result:
    with wt.replace(path, mode=0o640, tmp_dir=tmp_dir) as (f, st):
        f.write(data)
    return st[0]


def test_writes_create_directories_and_replace_atomically(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    with WorkTree(root) as wt:
        st = write(wt, "a/b/c.bin", b"one")
        assert (root / "a/b/c.bin").read_bytes() == b"one"
        assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_size == 3
        assert st.st_ino == (root / "a/b/c.bin").stat().st_ino
        write(wt, "a/b/c.bin", b"two")
        assert (root / "a/b/c.bin").read_bytes() == b"two"
        assert wt.read_head("a/b/c.bin", 2) == b"tw"
        assert wt.lstat("a/missing") is None
    assert sorted(p.name for p in (root / "a/b").iterdir()) == ["c.bin"]  # no temp left


@pytest.mark.parametrize(
    "path",
    ["../outside/victim", "/etc/passwd", "a/../../outside/victim", ".git/config",
     ".GIT/config", "git~1/config", ".git./config", "a//b", "", "a/", ".g\u200cit/hooks/x"],
)  # fmt: skip
def test_unsafe_paths_are_refused(tree: tuple[Path, Path], path: str) -> None:
    root, outside = tree
    (root / ".git").mkdir()
    with WorkTree(root) as wt, pytest.raises(UnsafePathError) as e:
        write(wt, path, b"evil")
    assert e.value.path == path
    assert str(e.value).startswith(path + ": " if path.isprintable() else repr(path) + ": ")
    assert (outside / "victim").read_bytes() == b"precious"
    assert list((root / ".git").iterdir()) == []


def test_a_symlinked_directory_is_never_followed(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    (root / "data").symlink_to(outside)
    (root / "deep").mkdir()
    (root / "deep" / "er").symlink_to(outside)
    with WorkTree(root) as wt:
        for path in ("data/victim", "data/new", "deep/er/victim"):
            with pytest.raises(UnsafePathError, match="symlink"):
                write(wt, path, b"evil")
            with pytest.raises(UnsafePathError):  # reading through them is refused too
                wt.read_head(path, 10)
        with pytest.raises(UnsafePathError):
            wt.lstat("data/victim")
    assert sorted(os.listdir(outside)) == ["victim"]
    assert (outside / "victim").read_bytes() == b"precious"


def test_a_symlink_at_the_target_is_replaced_not_written_through(
    tree: tuple[Path, Path],
) -> None:
    root, outside = tree
    (root / "f").symlink_to(outside / "victim")
    with WorkTree(root) as wt:
        assert wt.read_head("f", 10) is None  # not followed
        st = wt.lstat("f")
        assert st is not None and stat.S_ISLNK(st.st_mode)
        write(wt, "f", b"data")
    assert not (root / "f").is_symlink() and (root / "f").read_bytes() == b"data"
    assert (outside / "victim").read_bytes() == b"precious"


def test_temp_dir_elsewhere_and_no_debris_on_failure(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    tmp = root.parent / "tmp"
    tmp.mkdir()
    with WorkTree(root) as wt:
        write(wt, "x", b"1", tmp_dir=str(tmp))
        with pytest.raises(RuntimeError), wt.replace("y", mode=0o644, tmp_dir=str(tmp)) as (f, _):
            f.write(b"half")
            raise RuntimeError("killed midway")
    assert (root / "x").read_bytes() == b"1" and not (root / "y").exists()
    assert list(tmp.iterdir()) == []


def test_a_directory_swapped_for_a_symlink_mid_walk_is_not_followed(
    tree: tuple[Path, Path],
) -> None:
    """The walk holds each directory open: swapping a component after the check cannot
    redirect the write (the race a path-based writer loses)."""
    root, outside = tree
    (root / "d").mkdir()
    with WorkTree(root) as wt, wt.parent("d/f", create=True) as (fd, name):
        os.rename(root / "d", root / "d-moved")
        (root / "d").symlink_to(outside)
        with atomic_writer_at(fd, name, durable=False) as f:
            f.write(b"safe")
    assert (root / "d-moved/f").read_bytes() == b"safe"
    assert sorted(os.listdir(outside)) == ["victim"]


def test_atomic_writer_at_refuses_paths_and_is_thread_safe(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for bad in ("a/b", "..", ".", ""):
            with pytest.raises(ValueError), atomic_writer_at(fd, bad):
                pass

        def one(i: int) -> None:
            with atomic_writer_at(fd, f"f{i % 4}", durable=False) as f:
                f.write(b"%d" % i * 1000)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os.close(fd)
    names = sorted(os.listdir(root))
    assert names == ["f0", "f1", "f2", "f3"]
    for n in names:  # each file is one writer's whole output, never a mix
        data = (root / n).read_bytes()
        i = int(data[: len(data) // 1000])
        assert i % 4 == int(n[1:]) and data == b"%d" % i * 1000


def test_replace_can_keep_an_existing_files_mode(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    (root / "a").mkdir()
    (root / "a" / "own").write_bytes(b"old")
    os.chmod(root / "a" / "own", 0o600)
    os.symlink(outside / "victim", root / "a" / "link")
    os.chmod(outside / "victim", 0o640)
    with WorkTree(root) as wt:
        for name in ("own", "link", "new"):
            with wt.replace(f"a/{name}", mode=0o755, keep_mode=True) as (f, st):
                f.write(b"data")
            assert (root / "a" / name).read_bytes() == b"data"
            assert stat.S_IMODE(st[0].st_mode) == (0o600 if name == "own" else 0o755)
    assert not (root / "a" / "link").is_symlink()
    assert (outside / "victim").read_bytes() == b"precious"


def create(wt: WorkTree, path: str, data: bytes) -> os.stat_result:
    with wt.create(path, mode=0o640) as (f, st):
        f.write(data)
    return st[0]


@pytest.mark.parametrize(
    "path", ["../outside/victim", "/etc/passwd", ".git/config", ".GIT/x", "a//b", "", "a/"]
)
def test_create_refuses_unsafe_paths_and_symlinked_directories(
    tree: tuple[Path, Path], path: str
) -> None:
    root, outside = tree
    (root / ".git").mkdir()
    (root / "data").symlink_to(outside)
    with WorkTree(root) as wt:
        with pytest.raises(UnsafePathError):
            create(wt, path, b"evil")
        for linked in ("data/new", "data/sub/new"):
            with pytest.raises(UnsafePathError, match="symlink"):
                create(wt, linked, b"evil")
    assert sorted(os.listdir(outside)) == ["victim"] and list((root / ".git").iterdir()) == []


def test_create_makes_new_files_only_from_many_threads_in_kept_directories(
    tree: tuple[Path, Path],
) -> None:
    """More directories than the work tree keeps open, files from 4 threads into each:
    every file whole, with its stat; an existing name (a file, a symlink) is never
    replaced; no handle is left open after close."""
    root, outside = tree
    (root / "d00").mkdir()
    (root / "d00" / "taken").write_bytes(b"mine")
    (root / "d00" / "link").symlink_to(outside / "victim")
    paths = [f"d{d:02}/e/f{i}" for d in range(KEPT_DIRS * 2) for i in range(8)]
    fds_before = len(os.listdir("/proc/self/fd"))
    errors: list[BaseException] = []
    with WorkTree(root) as wt:

        def work(mine: list[str]) -> None:
            try:
                for p in mine:
                    st = create(wt, p, p.encode())
                    assert st.st_size == len(p) and stat.S_IMODE(st.st_mode) == 0o640
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(paths[i::4],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for name in ("taken", "link"):
            with pytest.raises(FileExistsError):
                create(wt, f"d00/{name}", b"new")
    assert errors == []
    for p in paths:
        assert (root / p).read_bytes() == p.encode()
    assert (root / "d00" / "taken").read_bytes() == b"mine"
    assert (outside / "victim").read_bytes() == b"precious"
    assert len(os.listdir("/proc/self/fd")) <= fds_before  # none left open
