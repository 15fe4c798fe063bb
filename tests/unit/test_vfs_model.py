"""CommitFS over real git repositories (built with the git binary) and a real LocalCAS."""

from __future__ import annotations

import errno
import io
import logging
import os
import random
import shutil
import stat
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gitxet.data.clean import Ingestor
from gitxet.errors import GitError, GitObjectNotFoundError
from gitxet.formats.pointer import VERSION_LINE, Pointer
from gitxet.git.objects import TreeRecord, loose_size, packed_size, parse_tree
from gitxet.hashing import from_hex, to_hex
from gitxet.store.cas import LocalCAS
from gitxet.util.lru import Lease
from gitxet.vfs import model
from gitxet.vfs.model import ROOT_INO, CommitFS
from gitxet.vfs.nodes import Attrs, NodeKind

# Sealed git for module-scoped fixtures, which are set up before the autouse env fixture.
GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "T",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "T",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "LC_ALL": "C",
}
T1 = 1_700_000_000
T2 = 1_700_086_400


def git(cwd: Path, *args: str, when: int = T1) -> str:
    env = {**GIT_ENV, "GIT_AUTHOR_DATE": f"@{when} +0000", "GIT_COMMITTER_DATE": f"@{when} +0000"}
    cmd = ["git", "-c", "init.defaultBranch=main", "-c", "core.autocrlf=false", *args]
    out = subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    return out.stdout.decode()


@dataclass
class World:
    """A repository with two commits, the store holding its pointer files' data."""

    repo: Path
    cas_root: Path
    c1: str
    c2: str
    files1: dict[str, bytes]  # path -> content as served (pointer files resolved)
    files2: dict[str, bytes]
    pointers: set[str]  # paths that are pointer files in both commits


def write(root: Path, rel: str, data: bytes, mode: int = 0o644) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    p.chmod(mode)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("vfs")
    repo = base / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    cas_root = base / "cas"
    cas = LocalCAS(str(cas_root), durable=False)
    rnd = random.Random(5)
    big1 = rnd.randbytes(3 << 20)
    big2 = big1[: 1 << 20] + rnd.randbytes(5000) + big1[1 << 20 :]
    small = rnd.randbytes(1000)
    plain_big = rnd.randbytes(300_000)  # a non-pointer blob above the pointer size

    def ptr(ing: Ingestor, data: bytes) -> bytes:
        r = ing.add_stream(io.BytesIO(data))
        return Pointer(sha256=r.sha256, size=r.size, xet_hash=to_hex(r.file_hash)).encode()

    fake = VERSION_LINE + b"oid sha256:nothex\nsize 1\nxet-hash 00\n"
    with Ingestor(cas) as ing:
        p_big1, p_big2, p_small = ptr(ing, big1), ptr(ing, big2), ptr(ing, small)
        ing.flush()
    cas.close()

    tree1: dict[str, tuple[bytes, int]] = {
        "README.md": (b"# dataset\n", 0o644),
        "data/train/part-0.bin": (p_big1, 0o644),
        "data/train/labels.csv": (b"id,label\n1,cat\n", 0o644),
        "data/test/deep/er/file.txt": (b"deep\n", 0o644),
        "data/small.bin": (p_small, 0o644),
        "empty.txt": (b"", 0o644),
        "tools/run.sh": (b"#!/bin/sh\necho hi\n", 0o755),
        "fake.ptr": (fake, 0o644),
        "plain.bin": (plain_big, 0o644),
    }
    for rel, (data, mode) in tree1.items():
        write(repo, rel, data, mode)
    os.symlink("data/train/part-0.bin", repo / "latest")
    git(repo, "add", "-A")
    gitlink = "1234567890abcdef1234567890abcdef12345678"
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{gitlink},vendor/sub")
    git(repo, "commit", "-q", "-m", "one", when=T1)
    c1 = git(repo, "rev-parse", "HEAD").strip()

    write(repo, "data/train/part-0.bin", p_big2)
    write(repo, "README.md", b"# dataset v2\n")
    (repo / "data/train/labels.csv").unlink()
    write(repo, "new.txt", b"new\n")
    git(repo, "add", "-A", "data", "README.md", "new.txt")  # not "vendor": no checkout there
    git(repo, "commit", "-q", "-m", "two", when=T2)
    c2 = git(repo, "rev-parse", "HEAD").strip()

    files1 = {k: v[0] for k, v in tree1.items()}
    files1["data/train/part-0.bin"] = big1
    files1["data/small.bin"] = small
    files2 = dict(files1)
    del files2["data/train/labels.csv"]
    files2.update(
        {"data/train/part-0.bin": big2, "README.md": b"# dataset v2\n", "new.txt": b"new\n"}
    )
    yield World(repo, cas_root, c1, c2, files1, files2, {"data/train/part-0.bin", "data/small.bin"})


@pytest.fixture
def cas(world: World) -> Iterator[LocalCAS]:
    store = LocalCAS(str(world.cas_root), durable=False)
    yield store
    store.close()


@pytest.fixture
def fs(world: World, cas: LocalCAS) -> Iterator[CommitFS]:
    with CommitFS(str(world.repo), world.c2, cas) as f:
        yield f


def walk(fs: CommitFS) -> dict[bytes, Attrs]:
    """Every path (relative, bytes) -> attrs, depth first."""
    out: dict[bytes, Attrs] = {}
    stack = [(b"", fs.root_ino)]
    while stack:
        prefix, ino = stack.pop()
        for name, a in fs.readdir(ino):
            path = prefix + name
            out[path] = a
            if a.kind is NodeKind.DIR:
                stack.append((path + b"/", a.ino))
    return out


def read_all(fs: CommitFS, ino: int, step: int = 1 << 20) -> bytes:
    parts, off = [], 0
    while chunk := fs.read(ino, off, step):
        parts.append(chunk)
        off += len(chunk)
    return b"".join(parts)


# ---- shape ------------------------------------------------------------------------------


def test_tree_shape_modes_and_sizes(fs: CommitFS, world: World) -> None:
    tree = walk(fs)
    files = {p.decode(): a for p, a in tree.items() if a.kind is NodeKind.FILE}
    assert {p: a.size for p, a in files.items()} == {p: len(d) for p, d in world.files2.items()}
    assert stat.S_IMODE(files["tools/run.sh"].mode) == 0o555
    assert files["tools/run.sh"].mode & stat.S_IFMT(files["tools/run.sh"].mode) == stat.S_IFREG
    assert stat.S_IMODE(files["README.md"].mode) == 0o444
    dirs = {p for p, a in tree.items() if a.kind is NodeKind.DIR}
    assert dirs == {b"data", b"data/train", b"data/test", b"data/test/deep", b"data/test/deep/er",
                    b"tools", b"vendor", b"vendor/sub"}  # fmt: skip
    for p in dirs:
        assert tree[p].mode == stat.S_IFDIR | 0o555
    assert fs.readdir(tree[b"vendor/sub"].ino) == []  # a submodule is an empty directory
    assert tree[b"vendor/sub"].nlink == 2
    assert tree[b"data"].nlink == 4  # train, test + . and ..
    link = tree[b"latest"]
    assert link.kind is NodeKind.SYMLINK and link.mode == stat.S_IFLNK | 0o777
    assert link.size == len(b"data/train/part-0.bin")
    assert fs.readlink(link.ino) == b"data/train/part-0.bin"
    assert {a.mtime_ns for a in tree.values()} == {T2 * 10**9}
    assert fs.getattr(ROOT_INO).mtime_ns == T2 * 10**9
    assert len({a.ino for a in tree.values()} | {ROOT_INO}) == len(tree) + 1


def test_readdir_sorted_by_bytes_without_dots(fs: CommitFS) -> None:
    names = [n for n, _ in fs.readdir(ROOT_INO)]
    assert names == sorted(names)
    assert b"." not in names and b".." not in names
    assert names == [b"README.md", b"data", b"empty.txt", b"fake.ptr", b"latest", b"new.txt",
                     b"plain.bin", b"tools", b"vendor"]  # fmt: skip


def test_lookup_dot_dotdot_parent_and_missing(fs: CommitFS) -> None:
    data = fs.lookup(ROOT_INO, b"data")
    train = fs.lookup(data.ino, b"train")
    assert fs.lookup(train.ino, b".") == train
    assert fs.lookup(train.ino, b"..") == data
    assert fs.lookup(ROOT_INO, b"..").ino == ROOT_INO
    assert fs.parent(train.ino) == data.ino
    assert fs.parent(data.ino) == ROOT_INO
    assert fs.parent(ROOT_INO) == ROOT_INO
    with pytest.raises(FileNotFoundError):
        fs.lookup(data.ino, b"nope")
    readme = fs.lookup(ROOT_INO, b"README.md")
    with pytest.raises(NotADirectoryError):
        fs.lookup(readme.ino, b"x")
    with pytest.raises(NotADirectoryError):
        fs.readdir(readme.ino)
    assert fs.getattr(train.ino) == train


def test_errors_for_wrong_kinds_and_stale_inodes(fs: CommitFS) -> None:
    data = fs.lookup(ROOT_INO, b"data")
    readme = fs.lookup(ROOT_INO, b"README.md")
    with pytest.raises(IsADirectoryError):
        fs.read(data.ino, 0, 10)
    with pytest.raises(OSError) as e:
        fs.readlink(readme.ino)
    assert e.value.errno == errno.EINVAL
    link = fs.lookup(ROOT_INO, b"latest")
    with pytest.raises(OSError) as e:
        fs.read(link.ino, 0, 10)
    assert e.value.errno == errno.EINVAL
    for bad in (0, 12345, -1, 2**64):
        with pytest.raises(FileNotFoundError):
            fs.getattr(bad)
        with pytest.raises(FileNotFoundError):
            fs.parent(bad)


def test_resolve_path(fs: CommitFS) -> None:
    deep = fs.resolve_path(b"data/test/deep/er/file.txt")
    assert deep.size == 5 and deep.kind is NodeKind.FILE
    assert fs.resolve_path(b"/data//test/./deep/../deep/er/file.txt") == deep
    assert fs.resolve_path(b"") == fs.getattr(ROOT_INO)
    assert fs.resolve_path(b"latest").kind is NodeKind.SYMLINK  # not followed
    with pytest.raises(FileNotFoundError):
        fs.resolve_path(b"data/none")
    with pytest.raises(NotADirectoryError):
        fs.resolve_path(b"README.md/x")


# ---- data -------------------------------------------------------------------------------


def test_whole_files_equal_the_source(fs: CommitFS, world: World) -> None:
    for path, data in world.files2.items():
        a = fs.resolve_path(path.encode())
        assert read_all(fs, a.ino, step=77_777) == data, path
    assert fs.read(fs.resolve_path(b"empty.txt").ino, 0, 100) == b""


def test_thousand_random_reads(fs: CommitFS, world: World) -> None:
    rnd = random.Random(11)
    paths = sorted(world.files2)
    inos = {p: fs.resolve_path(p.encode()).ino for p in paths}
    for _ in range(1000):
        p = rnd.choice(paths)
        data = world.files2[p]
        off = rnd.randrange(len(data) + 10)
        size = rnd.choice([0, 1, 100, 4096, 65536, 1 << 20, rnd.randrange(1, 300_000)])
        assert fs.read(inos[p], off, size) == data[off : off + size], (p, off, size)


def test_read_past_end_and_bad_arguments(fs: CommitFS, world: World) -> None:
    a = fs.resolve_path(b"data/train/part-0.bin")
    assert fs.read(a.ino, a.size, 10) == b""
    assert fs.read(a.ino, a.size + 10**9, 10) == b""
    assert fs.read(a.ino, a.size - 3, 10) == world.files2["data/train/part-0.bin"][-3:]
    with pytest.raises(OSError) as e:
        fs.read(a.ino, -1, 10)
    assert e.value.errno == errno.EINVAL


def test_fake_pointer_is_plain_and_warned_once(
    world: World, cas: LocalCAS, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gitxet.vfs.model")
    with CommitFS(str(world.repo), world.c2, cas) as fs:
        a = fs.resolve_path(b"fake.ptr")
        assert a.size == len(world.files2["fake.ptr"])
        assert read_all(fs, a.ino) == world.files2["fake.ptr"]
        fs.readdir(ROOT_INO)
        fs.read(a.ino, 0, 5)
    warnings = [r for r in caplog.records if "fake.ptr" in r.getMessage()]
    assert len(warnings) == 1 and "not a valid pointer" in warnings[0].getMessage()


def test_big_plain_blob_spooled_and_served(world: World, cas: LocalCAS) -> None:
    # 1 MiB cache -> blobs over 128 KiB are spooled to a temporary file
    with CommitFS(str(world.repo), world.c2, cas, blob_cache_bytes=1 << 20) as fs:
        a = fs.resolve_path(b"plain.bin")
        data = world.files2["plain.bin"]
        rnd = random.Random(3)
        for _ in range(50):
            off = rnd.randrange(len(data))
            assert fs.read(a.ino, off, 5000) == data[off : off + 5000]
        assert read_all(fs, a.ino, 65536) == data


def test_older_commit_and_subdir(world: World, cas: LocalCAS) -> None:
    with CommitFS(str(world.repo), world.c1, cas) as old:
        assert read_all(old, old.resolve_path(b"README.md").ino) == b"# dataset\n"
        part = old.resolve_path(b"data/train/part-0.bin")
        assert read_all(old, part.ino) == world.files1["data/train/part-0.bin"]
        assert old.resolve_path(b"data/train/labels.csv").size == 15
        with pytest.raises(FileNotFoundError):
            old.resolve_path(b"new.txt")
        assert old.getattr(ROOT_INO).mtime_ns == T1 * 10**9
    with CommitFS(str(world.repo), world.c1.encode(), cas, subdir=b"data/train") as sub:
        assert [n for n, _ in sub.readdir(ROOT_INO)] == [b"labels.csv", b"part-0.bin"]
        assert sub.lookup(ROOT_INO, b"..").ino == ROOT_INO
        part2 = sub.lookup(ROOT_INO, b"part-0.bin")
        assert part2.size == len(world.files1["data/train/part-0.bin"])
        assert sub.read(part2.ino, 100, 50) == world.files1["data/train/part-0.bin"][100:150]
        with CommitFS(str(world.repo), world.c1, cas) as whole:
            # numbers come from the path in the repository, whatever the served root
            assert whole.resolve_path(b"data/train/part-0.bin").ino == part2.ino


def test_bad_subdir_commit_and_repo(world: World, cas: LocalCAS, tmp_path: Path) -> None:
    repo = str(world.repo)
    with pytest.raises(FileNotFoundError, match=r"data/nope"):
        CommitFS(repo, world.c2, cas, subdir=b"data/nope")
    with pytest.raises(NotADirectoryError, match=r"README\.md"):
        CommitFS(repo, world.c2, cas, subdir=b"README.md")
    with pytest.raises(ValueError):
        CommitFS(repo, world.c2, cas, subdir=b"data/../data")
    with pytest.raises(ValueError):
        CommitFS(repo, "HEAD", cas)
    with pytest.raises(GitObjectNotFoundError):
        CommitFS(repo, "0" * 40, cas)
    tree = git(world.repo, "rev-parse", f"{world.c2}^{{tree}}").strip()
    with pytest.raises(GitError, match="not a commit"):
        CommitFS(repo, tree, cas)
    with pytest.raises(GitError, match="not a git repository"):
        CommitFS(str(tmp_path), world.c2, cas)
    with CommitFS(repo, world.c2, cas, subdir=b"vendor/sub") as empty:  # a submodule root
        assert empty.readdir(ROOT_INO) == []


def test_annotated_tag_is_peeled(world: World, cas: LocalCAS, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "--no-local", str(world.repo), str(clone))
    git(clone, "tag", "-a", "-m", "v1", "v1", world.c1)
    tag = git(clone, "rev-parse", "v1").strip()
    assert tag != world.c1
    with CommitFS(str(clone), tag, cas) as fs:
        assert fs.resolve_path(b"data/train/labels.csv").size == 15


# ---- inode numbers ----------------------------------------------------------------------


def test_inodes_stable_per_commit_and_differ_across(world: World, cas: LocalCAS) -> None:
    with (
        CommitFS(str(world.repo), world.c2, cas) as a,
        CommitFS(str(world.repo), world.c2, cas) as b,
        CommitFS(str(world.repo), world.c1, cas) as old,
    ):
        ta, tb, told = walk(a), walk(b), walk(old)
        assert {p: x.ino for p, x in ta.items()} == {p: x.ino for p, x in tb.items()}
        assert ta[b"README.md"].ino != told[b"README.md"].ino
        assert ta[b"data/train/part-0.bin"].ino != told[b"data/train/part-0.bin"].ino
        assert all(1 < x.ino < 2**63 for x in ta.values())


def test_unknown_inode_of_same_commit_is_found_by_a_fresh_instance(
    world: World, cas: LocalCAS
) -> None:
    with CommitFS(str(world.repo), world.c2, cas) as first:
        deep = first.resolve_path(b"data/test/deep/er/file.txt")
        er = first.resolve_path(b"data/test/deep/er")
    with CommitFS(str(world.repo), world.c2, cas) as restarted:  # like a restarted server
        assert restarted.getattr(deep.ino) == deep
        assert restarted.parent(deep.ino) == er.ino
        assert restarted.read(deep.ino, 0, 100) == b"deep\n"
        with pytest.raises(FileNotFoundError):
            restarted.getattr(deep.ino ^ 1)
    # another commit's number is stale here
    with CommitFS(str(world.repo), world.c1, cas) as other, pytest.raises(FileNotFoundError):
        other.getattr(deep.ino)


def test_inode_collisions_are_probed(
    world: World, cas: LocalCAS, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(model, "inode_numbers", lambda commit, paths: [42] * len(paths))
    with CommitFS(str(world.repo), world.c2, cas) as fs:
        tree = walk(fs)
        inos = [a.ino for a in tree.values()]
        assert len(set(inos)) == len(inos) and min(inos) == 42
        for path, a in tree.items():
            assert fs.resolve_path(path) == a
            assert fs.getattr(a.ino) == a
        assert read_all(fs, tree[b"README.md"].ino) == world.files2["README.md"]
    assert "collides" in caplog.text


# ---- statfs -----------------------------------------------------------------------------


def test_statfs_counts_reported_sizes(fs: CommitFS, world: World) -> None:
    st = fs.statfs()
    tree = walk(fs)
    assert st.total_bytes == sum(a.size for a in tree.values() if a.kind is not NodeKind.DIR)
    assert st.files == len(tree) + 1  # every node and the root
    assert fs.statfs() is st


def test_statfs_of_a_subdir(world: World, cas: LocalCAS) -> None:
    with CommitFS(str(world.repo), world.c1, cas, subdir=b"data") as fs:
        st = fs.statfs()
        expected = sum(len(d) for p, d in world.files1.items() if p.startswith("data/"))
        assert st.total_bytes == expected
        assert st.files == len(walk(fs)) + 1


# ---- failures ---------------------------------------------------------------------------


def corrupt_copy(world: World, tmp_path: Path) -> Path:
    dst = tmp_path / "cas"
    shutil.copytree(world.cas_root, dst)
    return dst


def test_corrupt_store_gives_eio_not_wrong_bytes(
    world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = corrupt_copy(world, tmp_path)
    for xorb in (root / "xorbs").rglob("*"):
        if xorb.is_file():
            raw = bytearray(xorb.read_bytes())
            for i in range(200, len(raw) // 2, 4099):  # damage chunk data, not the footer
                raw[i] ^= 0xFF
            xorb.write_bytes(bytes(raw))
    store = LocalCAS(str(root), durable=False)
    try:
        with CommitFS(str(world.repo), world.c2, store) as fs:
            part = fs.resolve_path(b"data/train/part-0.bin")
            assert part.size == len(world.files2["data/train/part-0.bin"])  # metadata still fine
            failures = 0
            for off in range(0, part.size, 256 << 10):
                try:
                    got = fs.read(part.ino, off, 4096)
                except OSError as exc:
                    assert exc.errno == errno.EIO
                    assert exc.__cause__ is not None
                    failures += 1
                else:
                    assert got == world.files2["data/train/part-0.bin"][off : off + 4096]
            assert failures > 0
            # git-served files are untouched by the store's damage
            assert fs.read(fs.resolve_path(b"README.md").ino, 0, 100) == b"# dataset v2\n"
    finally:
        store.close()
    assert "data/train/part-0.bin" in caplog.text


def test_missing_xorbs_give_eio(world: World, tmp_path: Path) -> None:
    root = corrupt_copy(world, tmp_path)
    shutil.rmtree(root / "xorbs")
    (root / "xorbs").mkdir()
    store = LocalCAS(str(root), durable=False)
    try:
        with CommitFS(str(world.repo), world.c2, store) as fs:
            small = fs.resolve_path(b"data/small.bin")
            for _ in range(2):  # a failed reader is not cached as a good one
                with pytest.raises(OSError) as e:
                    fs.read(small.ino, 0, 10)
                assert e.value.errno == errno.EIO and "small.bin" in str(e.value)
    finally:
        store.close()


def test_missing_tree_object_gives_eio(world: World, cas: LocalCAS, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    shutil.copytree(world.repo, clone, symlinks=True)
    tree = git(clone, "rev-parse", f"{world.c2}:data/test").strip()
    (clone / ".git/objects" / tree[:2] / tree[2:]).unlink()
    with CommitFS(str(clone), world.c2, cas) as fs:
        data = fs.lookup(ROOT_INO, b"data")
        # the parent still lists (the broken child's link count cannot be known: 2)
        listed = dict(fs.readdir(data.ino))
        assert listed[b"test"].kind is NodeKind.DIR and listed[b"test"].nlink == 2
        with pytest.raises(OSError) as e:
            fs.readdir(listed[b"test"].ino)
        assert e.value.errno == errno.EIO
        assert fs.read(fs.resolve_path(b"README.md").ino, 0, 9) == b"# dataset"
        assert fs.statfs().files > 1  # the broken tree counts as an empty directory


def test_broken_tree_bytes_are_refused() -> None:
    sha = bytes(20)
    good = b"100644 a\0" + sha
    assert parse_tree(good, 20, "t") == [TreeRecord(b"a", 0o100644, sha)]
    for bad in (b"100644 a\0" + sha[:5], b"10x644 a\0" + sha, b"100644a" + sha, b" a\0" + sha):
        with pytest.raises(model.FormatError):
            parse_tree(bad, 20, "t")


def test_unsafe_entries_are_left_out_and_reported() -> None:
    sha = bytes(20)
    good = b"100644 a\0" + sha
    for bad in (
        b"100644 ..\0",
        b"100644 .\0",
        b"100644 a/b\0",
        b"100644 \0",
        b"40000 .git\0",
        b"40000 .GIT\0",
        b"40000 .git.\0",
        b"40000 git~1\0",
        "40000 .g\u200cit\0".encode(),
        b"120000 .gitmodules\0",
        b"100000 z\0",
        b"100644 a\0",  # a duplicate of the good entry
    ):
        hidden: list[tuple[bytes, str]] = []
        got = parse_tree(good + bad + sha, 20, "t", lambda n, why, h=hidden: h.append((n, why)))
        assert got == [TreeRecord(b"a", 0o100644, sha)]
        assert [n for n, _ in hidden] == [bad.split(b" ", 1)[1][:-1]], bad
    # a .gitmodules file (not a symlink) is fine
    assert len(parse_tree(good + b"100644 .gitmodules\0" + sha, 20, "t")) == 2


# ---- object sizes from headers ----------------------------------------------------------


def blob_sizes(repo: Path) -> dict[str, int]:
    out = git(repo, "cat-file", "--batch-all-objects", "--batch-check")
    return {sha: int(size) for sha, kind, size in (line.split() for line in out.splitlines())
            if kind == "blob"}  # fmt: skip


def test_loose_object_sizes(world: World) -> None:
    sizes = blob_sizes(world.repo)
    assert sizes
    for sha, size in sizes.items():
        assert loose_size(str(world.repo / ".git/objects" / sha[:2] / sha[2:])) == size


@pytest.mark.parametrize("ofs_delta", [True, False])
def test_packed_sizes_with_deltas(tmp_path: Path, ofs_delta: bool) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    rnd = random.Random(9)
    data = bytearray(rnd.randbytes(200_000))
    for i in range(4):  # similar versions: the packer stores deltas
        data[i * 1000 : i * 1000 + 10] = rnd.randbytes(10)
        data += rnd.randbytes(3000)
        write(repo, "big.bin", bytes(data))
        write(repo, "small.txt", f"version {i}\n".encode() * 50)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", str(i))
    flag = "true" if ofs_delta else "false"
    git(repo, "-c", f"repack.useDeltaBaseOffset={flag}", "repack", "-adfq", "--window=50")
    packs = list((repo / ".git/objects/pack").glob("*.pack"))
    assert len(packs) == 1
    verify = git(repo, "verify-pack", "-v", str(packs[0].with_suffix(".idx")))
    offsets = {}
    deltas = 0
    for line in verify.splitlines():
        f = line.split()
        if len(f) >= 5 and len(f[0]) == 40 and f[1] == "blob":
            offsets[f[0]] = int(f[4])
            deltas += len(f) == 7  # delta entries add depth and base columns
    assert deltas > 0  # the test means nothing without delta entries
    sizes = blob_sizes(repo)
    assert set(offsets) == set(sizes)
    for sha, size in sizes.items():
        assert packed_size(str(packs[0]), offsets[sha], 20) == size


def test_bare_packed_repository(world: World, cas: LocalCAS, tmp_path: Path) -> None:
    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", "--no-local", str(world.repo), str(bare))
    assert not list((bare / "objects").glob("[0-9a-f][0-9a-f]"))  # everything is packed
    with CommitFS(str(bare), world.c2, cas) as fs, CommitFS(str(world.repo), world.c2, cas) as ref:
        assert walk(fs) == walk(ref)
        for path, data in world.files2.items():
            assert read_all(fs, fs.resolve_path(path.encode()).ino) == data
    with CommitFS(str(world.repo / ".git"), world.c2, cas) as gitdir:  # the .git directory
        assert gitdir.resolve_path(b"new.txt").size == 4


# ---- concurrency ------------------------------------------------------------------------


def test_eight_threads(world: World, cas: LocalCAS) -> None:
    errors: list[BaseException] = []
    paths = sorted(world.files2)
    with CommitFS(str(world.repo), world.c2, cas, readers=2, blob_cache_bytes=1 << 20) as fs:
        start = threading.Barrier(8)

        def work(seed: int) -> None:
            rnd = random.Random(seed)
            try:
                start.wait()
                for _ in range(60):
                    p = rnd.choice(paths)
                    a = fs.resolve_path(p.encode())
                    data = world.files2[p]
                    off = rnd.randrange(len(data) + 1)
                    assert fs.read(a.ino, off, 70_000) == data[off : off + 70_000]
                    if rnd.random() < 0.2:
                        fs.readdir(fs.parent(a.ino))
                if seed == 0:
                    fs.statfs()
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors[0]


def test_a_slow_fetch_does_not_block_other_files(world: World, cas: LocalCAS) -> None:
    gate, waiting = threading.Event(), threading.Event()

    class SlowSource:
        def file_info(self, file_hash: bytes):  # type: ignore[no-untyped-def]
            return cas.file_info(file_hash)

        def layout(self, xorb_hash: bytes):  # type: ignore[no-untyped-def]
            return cas.layout(xorb_hash)

        def read_chunks(self, xorb_hash: bytes, start: int, end: int) -> list[bytes]:
            waiting.set()
            gate.wait(30)
            return cas.read_chunks(xorb_hash, start, end)

    with CommitFS(str(world.repo), world.c2, SlowSource()) as fs:
        big = fs.resolve_path(b"data/train/part-0.bin")
        out: list[bytes] = []
        t = threading.Thread(target=lambda: out.append(fs.read(big.ino, 0, 10)))
        t.start()
        try:
            assert waiting.wait(30)
            # metadata and git-served files answer while the fetch waits
            assert fs.read(fs.resolve_path(b"README.md").ino, 0, 100) == b"# dataset v2\n"
            assert len(fs.readdir(ROOT_INO)) == 9
            assert fs.statfs().files > 0
        finally:
            gate.set()
            t.join(30)
        assert out == [world.files2["data/train/part-0.bin"][:10]]


def test_inode_formula_is_pinned() -> None:
    # Handles held by NFS clients name these numbers: changing the formula makes them stale.
    assert model.inode_number("a" * 40, b"data/train/part-0.bin") == 2138237489155126550
    assert model.inode_number("b" * 40, b"data/train/part-0.bin") != 2138237489155126550


def test_blob_cache_spools_evict_only_when_unused() -> None:
    cache = model._BlobCache(8 << 10)  # spools blobs over 1 KiB, keeps 8 of them
    blobs = {bytes([i]) * 20: bytes([i]) * 5000 for i in range(12)}
    first = next(iter(blobs))
    cache.put(first, blobs[first])
    held = cache.get(first)
    assert isinstance(held, Lease) and isinstance(held.value, model._Spool)
    for sha, data in list(blobs.items())[1:]:
        cache.put(sha, data)
    assert cache.get(first) is None  # evicted from the cache...
    assert held.value.pread(10, 20) == blobs[first][10:30]  # ...but still readable while held
    held.release()
    assert held.value._file.closed
    cache.put(b"s" * 20, b"small")
    assert cache.get(b"s" * 20) == b"small"
    last = cache.get(list(blobs)[-1])
    assert isinstance(last, Lease)
    cache.close()
    assert not last.value._file.closed
    last.release()
    assert last.value._file.closed
    cache.put(b"x" * 20, b"x" * 5000)  # after close: nothing kept, nothing leaked
    assert cache.get(b"x" * 20) is None


def test_lookup_nowait_answers_from_memory_only(fs: CommitFS, world: World) -> None:
    data = fs.lookup(fs.root_ino, b"data")
    assert fs.lookup_nowait(data.ino, b"small.bin") is None  # not listed yet: would read git
    assert fs.lookup_nowait(fs.root_ino, b"..") is None
    listed = dict(fs.readdir(data.ino))
    got = fs.lookup_nowait(data.ino, b"small.bin")
    assert got == listed[b"small.bin"] == fs.lookup(data.ino, b"small.bin")
    assert got.size == len(world.files2["data/small.bin"])
    with pytest.raises(FileNotFoundError):
        fs.lookup_nowait(data.ino, b"no-such-file")
    assert fs.lookup_nowait(fs.resolve_path(b"README.md").ino, b"x") is None  # not a dir


def _page_cache(root: Path, *, keep: bool) -> None:
    for xorb in (root / "xorbs").rglob("*"):
        if xorb.is_file():
            if keep:
                xorb.read_bytes()
                continue
            fd = os.open(xorb, os.O_RDONLY)
            try:
                os.fsync(fd)  # dirty pages are not dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def test_try_read_of_a_local_store_reads_cached_pages_without_read(
    world: World, cas: LocalCAS
) -> None:
    """A store on local disk: try_read serves a pointer file never read before from the
    page cache, on the calling thread; pages not cached make it give up (None)."""
    want = world.files2["data/small.bin"]
    with CommitFS(str(world.repo), world.c2, cas) as fs:
        assert fs.inline_reads
        ino = fs.resolve_path(b"data/small.bin").ino
        fs.chunk_extent(ino, 0)  # its reconstruction and xorb layout loaded, no data read
        _page_cache(world.cas_root, keep=False)
        assert fs.try_read(ino, 0, 100) is None
        _page_cache(world.cas_root, keep=True)
        assert fs.try_read(ino, 0, 100) == want[:100]
        assert fs.try_read(ino, 10, len(want)) == want[10:]


class _Describing:
    """A store seen as a source that describes many files at once (a CAS server's, or a
    local store's with ``is_local``); ``asked`` records each batch."""

    def __init__(self, cas: LocalCAS, *, is_local: bool) -> None:
        self.cas = cas
        self.is_local = is_local
        self.asked: list[set[bytes]] = []

    def describe(self, hashes: list[bytes], *, keep: bool = True) -> set[bytes]:
        self.asked.append(set(hashes))
        return set(hashes)

    def file_info(self, file_hash: bytes):  # type: ignore[no-untyped-def]
        return self.cas.file_info(file_hash)

    def layout(self, xorb_hash: bytes):  # type: ignore[no-untyped-def]
        return self.cas.layout(xorb_hash)

    def read_chunks(self, xorb_hash: bytes, start: int, end: int) -> list[bytes]:
        return self.cas.read_chunks(xorb_hash, start, end)


def _six_image_dirs(tmp_path: Path) -> tuple[Path, str, LocalCAS, dict[str, bytes]]:
    """A commit of imgs/x0..x5 with three pointer files each (and one plain file in x0):
    (repository, commit, store, the files' bytes)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    cas = LocalCAS(str(tmp_path / "cas"), durable=False)
    rnd = random.Random(9)
    files: dict[str, bytes] = {}
    with Ingestor(cas) as ing:
        for d in range(6):
            for i in range(3):
                data = rnd.randbytes(200 + i)
                r = ing.add_stream(io.BytesIO(data))
                ptr = Pointer(sha256=r.sha256, size=r.size, xet_hash=to_hex(r.file_hash))
                write(repo, f"imgs/x{d}/f{i}.bin", ptr.encode())
                files[f"imgs/x{d}/f{i}.bin"] = data
        ing.flush()
    write(repo, "imgs/x0/notes.txt", b"plain\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "small files")
    return repo, git(repo, "rev-parse", "HEAD").strip(), cas, files


def test_first_read_from_a_server_describes_its_neighbours_at_once(tmp_path: Path) -> None:
    """A source that describes files in batches (a CAS server's) is asked, at the first
    read of a pointer file, for the pointer files of its directory and of the small
    directories after it in one call; reads in those directories then ask nothing."""
    repo, head, cas, files = _six_image_dirs(tmp_path)
    server = _Describing(cas, is_local=False)
    asked = server.asked
    try:
        with CommitFS(str(repo), head, server) as fs:
            first = fs.resolve_path(b"imgs/x2/f1.bin")
            assert fs.read(first.ino, 0, 1000) == files["imgs/x2/f1.bin"]
            # x2 and the directories after it (x0 and x1 come before it): 12 files, one call
            assert [len(a) for a in asked] == [12]
            for name in ("imgs/x5/f0.bin", "imgs/x3/f2.bin", "imgs/x2/f0.bin"):
                assert fs.read(fs.resolve_path(name.encode()).ino, 0, 1000) == files[name]
            assert len(asked) == 1
            assert (
                fs.read(fs.resolve_path(b"imgs/x0/f0.bin").ino, 0, 1000) == files["imgs/x0/f0.bin"]
            )
            assert [len(a) for a in asked] == [12, 6]  # x0 and x1 (x2... are described)
    finally:
        cas.close()


def test_scattered_reads_from_a_server_describe_a_few_files_and_a_scan_more_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first read far from the last batch of its directory describes the 16 entries
    around it, not the directory's 300 (scattered reads over HTTP paid ~95 ms of the
    server's per 1,000-file directory, ~13 ms a file); first reads going through the
    directory in order double the batch each time, up to 1,000 (a scan keeps its batches)."""
    monkeypatch.setattr(model._Prefetcher, "offer", lambda self, nodes: None)
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    cas = LocalCAS(str(tmp_path / "cas"), durable=False)
    files: dict[str, bytes] = {}
    with Ingestor(cas) as ing:
        for i in range(300):
            data = i.to_bytes(2, "big") * 50
            r = ing.add_stream(io.BytesIO(data))
            ptr = Pointer(sha256=r.sha256, size=r.size, xet_hash=to_hex(r.file_hash))
            write(repo, f"d/f{i:03d}.bin", ptr.encode())
            files[f"d/f{i:03d}.bin"] = data
        ing.flush()
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "300 files")
    server = _Describing(cas, is_local=False)
    asked = server.asked

    def read(i: int) -> None:
        name = f"d/f{i:03d}.bin"
        assert fs.read(fs.resolve_path(name.encode()).ino, 0, 1000) == files[name]

    try:
        with CommitFS(str(repo), git(repo, "rev-parse", "HEAD").strip(), server) as fs:
            for i in (150, 20, 270, 151, 25):  # scattered: 16 around each, then none
                read(i)
            assert [len(a) for a in asked] == [16, 16, 16]
            asked.clear()
            for i in range(300):  # a scan: twice the entries each time after 16, 16
                read(i)
            # ([16, 32) was described by the read of 20: the scan starts again at 32; the
            # batch of 128 from 144 holds those of 150 and 270, which a source knows)
            assert [len(a) for a in asked] == [16, 16, 32, 64, 128, 28]
    finally:
        cas.close()


def _fresh(asked: list[set[bytes]]) -> list[int]:
    """Sizes of the describe calls that asked for a file not asked for before (a batched
    first read asks again for its batch's files, which a source knows at no cost)."""
    seen: set[bytes] = set()
    out: list[int] = []
    for a in asked:
        if not a <= seen:
            out.append(len(a))
        seen |= a
    return out


def test_first_event_loop_read_from_a_local_store_describes_its_listed_neighbours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local store (reads served on the event loop, ``try_read``) is asked too, at the
    first read of a pointer file, for the pointer files around it in one call, but only
    in directories already listed: nothing is listed (no git) on an event loop."""
    # which directories are listed is the point here: no background listing may add one
    # (the prefetcher lists imgs/x3.. on its own threads, at a moment of its choosing)
    monkeypatch.setattr(model._Prefetcher, "offer", lambda self, nodes: None)
    repo, head, cas, files = _six_image_dirs(tmp_path)
    store = _Describing(cas, is_local=True)
    asked = store.asked
    try:
        with CommitFS(str(repo), head, store) as fs:
            for d in (b"imgs", b"imgs/x2"):  # listed, as a lookup lists them
                fs.readdir(fs.resolve_path(d).ino)
            first = fs.resolve_path(b"imgs/x2/f1.bin")
            listed_at = fs._busy_at
            fs.try_read(first.ino, 0, 1000)
            assert fs._busy_at > listed_at  # a first read: the background statfs waits too
            assert _fresh(asked) == [3]  # x2 only: x3... are not listed yet
            fs.try_read(fs.resolve_path(b"imgs/x2/f0.bin").ino, 0, 1000)
            assert _fresh(asked) == [3]
            fs.readdir(fs.resolve_path(b"imgs/x3").ino)
            fs.readdir(fs.resolve_path(b"imgs/x4").ino)  # listed: described with x3
            third = fs.resolve_path(b"imgs/x3/f0.bin")
            fs.try_read(third.ino, 0, 1000)
            assert _fresh(asked) == [3, 6]
            for name in ("imgs/x2/f1.bin", "imgs/x3/f0.bin", "imgs/x4/f2.bin"):
                assert fs.read(fs.resolve_path(name.encode()).ino, 0, 1000) == files[name]
            assert _fresh(asked) == [3, 6]
    finally:
        cas.close()


class _CountingReads(_Describing):
    """A local store that records each ``read_chunks`` call."""

    def __init__(self, cas: LocalCAS) -> None:
        super().__init__(cas, is_local=True)
        self.reads: list[tuple[bytes, int, int]] = []

    def read_chunks(self, xorb_hash: bytes, start: int, end: int) -> list[bytes]:
        self.reads.append((xorb_hash, start, end))
        return super().read_chunks(xorb_hash, start, end)


def _list_x2_x3_and_load_the_layout(fs: CommitFS, files: dict[str, bytes]) -> dict[str, int]:
    """List imgs, imgs/x2 and imgs/x3 of :func:`_six_image_dirs`, load the xorb's layout
    with a blocking read (the event loop never reads a footer): each file's inode."""
    for d in (b"imgs", b"imgs/x2", b"imgs/x3"):
        fs.readdir(fs.resolve_path(d).ino)
    ino = {n: fs.resolve_path(n.encode()).ino for n in files}
    assert fs.read(ino["imgs/x0/f0.bin"], 0, 1000) == files["imgs/x0/f0.bin"]
    return ino


def test_first_read_of_a_small_file_reads_the_next_listed_ones_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a local store, a small pointer file's first read (``try_read``, the event loop)
    reads the files after it in its listed directories with it, in one chunk read (they
    were added together: their chunks are adjacent); their first reads are then served
    from that batch, once each, and a directory not listed yet ends the batch."""
    monkeypatch.setattr(model._Prefetcher, "offer", lambda self, nodes: None)
    repo, head, cas, files = _six_image_dirs(tmp_path)
    store = _CountingReads(cas)
    try:
        with CommitFS(str(repo), head, store) as fs:
            ino = _list_x2_x3_and_load_the_layout(fs, files)
            store.reads.clear()
            assert fs.try_read(ino["imgs/x2/f1.bin"], 0, 1000) == files["imgs/x2/f1.bin"]
            # x2/f1, x2/f2 and x3's three files: one run of five adjacent chunks
            assert [end - start for _, start, end in store.reads] == [5]
            for name in ("imgs/x3/f2.bin", "imgs/x2/f2.bin", "imgs/x3/f0.bin"):
                assert fs.try_read(ino[name], 0, 1000) == files[name]
            assert fs.try_read(ino["imgs/x3/f1.bin"], 0, 150) == files["imgs/x3/f1.bin"][:150]
            assert len(store.reads) == 1
            # handed out once: a later first read reads it again (with the files after it
            # in listed directories: x3's), as do files past x3
            assert fs.try_read(ino["imgs/x3/f0.bin"], 0, 1000) == files["imgs/x3/f0.bin"]
            assert len(store.reads) == 2
            assert ino["imgs/x3/f1.bin"] in fs._ready
            assert fs.try_read(ino["imgs/x4/f0.bin"], 0, 1000) == files["imgs/x4/f0.bin"]
            assert len(store.reads) == 3
            assert ino["imgs/x4/f1.bin"] not in fs._ready  # (x4 is not listed)
    finally:
        cas.close()


class _Misdescribing(_CountingReads):
    """A local store whose shard describes one file with another file's reconstruction."""

    def __init__(self, cas: LocalCAS, lie: bytes, truth: bytes) -> None:
        super().__init__(cas)
        self.lie, self.truth = lie, truth

    def file_info(self, file_hash: bytes):  # type: ignore[no-untyped-def]
        return super().file_info(self.truth if file_hash == self.lie else file_hash)


def test_a_batched_first_read_checks_each_file_of_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files read with an earlier one's batch are checked there as their own reader
    checks them (reconstruction against the file hash): a file whose shard entry describes
    another file's chunks (of the same size) is never served from the batch, nor later."""
    monkeypatch.setattr(model._Prefetcher, "offer", lambda self, nodes: None)
    repo, head, cas, files = _six_image_dirs(tmp_path)

    def hash_of(name: str) -> bytes:
        return from_hex(Pointer.decode(git(repo, "show", f"HEAD:{name}").encode()).xet_hash)

    store = _Misdescribing(cas, lie=hash_of("imgs/x3/f0.bin"), truth=hash_of("imgs/x2/f0.bin"))
    try:
        with CommitFS(str(repo), head, store) as fs:
            ino = _list_x2_x3_and_load_the_layout(fs, files)
            assert fs.try_read(ino["imgs/x2/f1.bin"], 0, 1000) == files["imgs/x2/f1.bin"]
            assert ino["imgs/x3/f1.bin"] in fs._ready  # the batch reached x3
            assert ino["imgs/x3/f0.bin"] not in fs._ready
            assert fs.try_read(ino["imgs/x3/f0.bin"], 0, 1000) is None
            with pytest.raises(OSError) as err:
                fs.read(ino["imgs/x3/f0.bin"], 0, 1000)
            assert err.value.errno == errno.EIO
            assert fs.try_read(ino["imgs/x3/f1.bin"], 0, 1000) == files["imgs/x3/f1.bin"]
    finally:
        cas.close()


def test_prefetcher_queues_a_directory_once_and_takes_the_last_offers_first() -> None:
    """A walk offers the directories it reaches next again and again (a listed directory's
    subdirectories, then its next siblings): each is queued once, the newest offer first."""
    started, release, finished = threading.Event(), threading.Event(), threading.Event()
    done: list[int] = []

    def work(node: Any) -> None:
        started.set()
        release.wait(60)
        done.append(node.ino)
        if len(done) == 4:
            finished.set()

    a, b, c, d = (SimpleNamespace(ino=i, shown=f"/d{i}") for i in range(4))
    pre = model._Prefetcher(work, threads=1)
    try:
        pre.offer([a, b])
        assert started.wait(60)  # a is being listed; b waits
        pre.offer([b, c, d])  # b again: queued once
        release.set()
        assert finished.wait(60)
        assert done == [0, 2, 3, 1]
    finally:
        pre.close()


def test_broken_pointer_found_by_a_listing_is_named_by_its_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A blob of a pointer's size that starts like one but does not parse is served as is,
    and the warning names the file, not the directory whose listing read it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    good = Pointer(sha256="ab" * 32, size=12345, xet_hash="cd" * 32).encode()
    broken = good.replace(b"size 12345", b"size 1234x")  # same length, not canonical
    assert len(broken) == len(good)
    write(repo, "imgs/a.bin", b"plain\n")
    write(repo, "imgs/bad.bin", broken)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "broken pointer")
    head = git(repo, "rev-parse", "HEAD").strip()
    cas = LocalCAS(str(tmp_path / "cas"), durable=False)
    caplog.set_level(logging.WARNING, logger="gitxet.vfs.model")
    try:
        with CommitFS(str(repo), head, cas) as fs:
            names = [name for name, _ in fs.readdir(fs.resolve_path(b"imgs").ino)]
            assert b"bad.bin" in names
            node = fs.resolve_path(b"imgs/bad.bin")
            assert read_all(fs, node.ino) == broken
    finally:
        cas.close()
    warned = [r.getMessage() for r in caplog.records if "not a valid pointer" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("/imgs/bad.bin: "), warned
