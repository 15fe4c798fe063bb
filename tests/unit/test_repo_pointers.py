"""gitxet.repo.pointers: pointer blobs in trees, the index and history, on real git
repositories (plain git: no filter installed, pointer text committed as it is)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from gitxet.errors import GitObjectNotFoundError
from gitxet.formats.pointer import MAX_POINTER_SIZE, Pointer
from gitxet.repo.pointers import (
    PointerFile,
    history_pointers,
    paths_in_history,
    pointer_files,
    read_pointer_blobs,
    received_pointers,
    try_pointer,
)

Git = Callable[..., str]


def pointer_for(content: bytes) -> Pointer:
    """A pointer for ``content`` (the Xet hash need not be the real one here)."""
    digest = hashlib.sha256(content).hexdigest()
    return Pointer(sha256=digest, size=len(content), xet_hash=digest[::-1])


def commit(repo: Path, git: Git, files: dict[str, bytes], msg: str) -> str:
    for name, data in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(data)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", msg)
    return git(repo, "rev-parse", "HEAD").strip()


A = pointer_for(b"a" * 5000)
B = pointer_for(b"b" * 7000)


@pytest.fixture
def repo(git_repo: Path, run_git_cmd: Git) -> Path:
    commit(
        git_repo,
        run_git_cmd,
        {
            ".gitattributes": b"*.bin filter=xet\n",
            "data/a.bin": A.encode(),
            "b.bin": B.encode(),
            "small.txt": b"not a pointer\n",
            "big.txt": b"x" * (MAX_POINTER_SIZE + 10),
        },
        "first",
    )
    return git_repo


def test_try_pointer() -> None:
    assert try_pointer(A.encode()) == A
    assert try_pointer(b"hello") is None
    assert try_pointer(A.encode() + b" " * MAX_POINTER_SIZE) is None  # too big to be one


def test_pointer_files_of_a_revision_and_the_index(repo: Path, run_git_cmd: Git) -> None:
    found = {f.path: f for f in pointer_files(str(repo), repo)}
    assert found == {
        "data/a.bin": PointerFile("data/a.bin", A, False),  # the work tree has the text
        "b.bin": PointerFile("b.bin", B, False),
    }
    assert [f.path for f in pointer_files(str(repo), repo, "HEAD", ["data"])] == ["data/a.bin"]
    assert [f.path for f in pointer_files(str(repo), repo, "HEAD", ["*.bin"])] == [
        "b.bin",
        "data/a.bin",
    ]
    # another revision in a bare view: not checked
    assert {f.materialized for f in pointer_files(str(repo), None)} == {None}
    # the content in the work tree: materialized; a same-size other file is too (by size)
    (repo / "b.bin").write_bytes(b"b" * 7000)
    (repo / "data" / "a.bin").write_bytes(b"short")
    by_path = {f.path: f.materialized for f in pointer_files(str(repo), repo)}
    assert by_path == {"b.bin": True, "data/a.bin": False}
    # the index: what is staged, not HEAD
    run_git_cmd(repo, "rm", "-q", "--cached", "b.bin")
    assert [f.path for f in pointer_files(str(repo), repo, None)] == ["data/a.bin"]


def test_the_index_lists_only_files_git_checks_out_through_the_filter(
    repo: Path, run_git_cmd: Git
) -> None:
    """Pointer text where the index's attributes set no xet filter is a plain file to git
    (which checks it out as that text): a revision's listing has it, the index's not."""
    second = commit(repo, run_git_cmd, {"example.ptr": A.encode(), "B.BIN": B.encode()}, "two")
    in_tree = {f.path for f in pointer_files(str(repo), None, second)}
    assert in_tree == {"b.bin", "data/a.bin", "example.ptr", "B.BIN"}
    assert {f.path for f in pointer_files(str(repo), repo, None)} == {"b.bin", "data/a.bin"}
    # the index's attributes decide, not the work tree's (git's order at checkout)
    (repo / ".gitattributes").write_bytes(b"*.bin filter=xet\n*.ptr filter=xet\n")
    assert {f.path for f in pointer_files(str(repo), repo, None)} == {"b.bin", "data/a.bin"}
    run_git_cmd(repo, "add", ".gitattributes")
    listed = {f.path for f in pointer_files(str(repo), repo, None)}
    assert listed == {"b.bin", "data/a.bin", "example.ptr"}


def test_history_one_per_file_and_what_a_push_sends(repo: Path, run_git_cmd: Git) -> None:
    first = run_git_cmd(repo, "rev-parse", "HEAD").strip()
    c = pointer_for(b"c" * 9000)
    second = commit(repo, run_git_cmd, {"copy.bin": A.encode(), "c.bin": c.encode()}, "two")
    found = history_pointers(str(repo), [second])
    assert sorted(p.xet_hash for _, p in found) == sorted(x.xet_hash for x in (A, B, c))
    assert history_pointers(str(repo), []) == []
    sent = paths_in_history(str(repo), [second], [first])
    assert sent == [("c.bin", c)]  # copy.bin's blob is the same object as data/a.bin's


def test_received_pointers_are_those_no_ref_reaches(repo: Path, run_git_cmd: Git) -> None:
    d = pointer_for(b"d" * 100)
    (repo / "d.bin").write_bytes(d.encode())
    run_git_cmd(repo, "add", "d.bin")
    tree = run_git_cmd(repo, "write-tree").strip()
    head = run_git_cmd(repo, "rev-parse", "HEAD").strip()
    loose = run_git_cmd(repo, "commit-tree", tree, "-p", head, "-m", "pushed").strip()
    git_dir = str(repo / ".git")
    assert received_pointers(git_dir, [loose]) == [("d.bin", d)]
    assert received_pointers(git_dir, [head]) == []
    assert received_pointers(git_dir, []) == []


def test_read_pointer_blobs_names_a_missing_blob(repo: Path, run_git_cmd: Git) -> None:
    oid = run_git_cmd(repo, "rev-parse", "HEAD:b.bin").strip()
    small = run_git_cmd(repo, "rev-parse", "HEAD:small.txt").strip()
    assert list(read_pointer_blobs(str(repo), [(oid, b"b.bin"), (small, b"small.txt")])) == [
        (b"b.bin", B)
    ]
    with pytest.raises(GitObjectNotFoundError):
        list(read_pointer_blobs(str(repo), [("1" * 40, b"gone")]))


def test_a_path_the_file_system_cannot_hold_is_listed_not_materialized(
    repo: Path, run_git_cmd: Git
) -> None:
    """A tree may name a file whose name is longer than NAME_MAX (git checks it out with
    "File name too long"): status, ls-files and fsck still list every pointer file."""
    blob = run_git_cmd(repo, "rev-parse", "HEAD:b.bin").strip()
    long = "L" * 300 + ".bin"
    run_git_cmd(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{long}")
    run_git_cmd(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},d/{long}/x.bin")
    run_git_cmd(repo, "commit", "-qm", "long names")
    for rev in ("HEAD", None):
        found = {f.path: f.materialized for f in pointer_files(str(repo), repo, rev)}
        assert found == {
            "data/a.bin": False, "b.bin": False, long: False, f"d/{long}/x.bin": False
        }  # fmt: skip


def test_copies_of_one_blob_are_read_once(
    git_repo: Path, run_git_cmd: Git, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree of many copies of a few blobs (an attacker's 100,000 entries of one pointer):
    every path is listed, each distinct blob is asked of git and parsed once."""
    import gitxet.repo.pointers as pointers

    files = {f"flat/{i:04d}.bin": (A if i % 3 else B).encode() for i in range(600)}
    files["flat/plain.txt"] = b"not a pointer\n"
    files[".gitattributes"] = b"*.bin filter=xet\n"
    commit(git_repo, run_git_cmd, files, "copies")
    asked: list[str] = []
    real = pointers.batch_read

    def counting(cwd: object, names: list[str], max_size: int) -> object:
        asked.extend(names)
        return real(cwd, names, max_size)  # type: ignore[arg-type]

    monkeypatch.setattr(pointers, "batch_read", counting)
    for rev in ("HEAD", None):
        asked.clear()
        listed = pointer_files(str(git_repo), git_repo, rev)
        assert len(listed) == 600
        assert {f.path: f.pointer for f in listed} == {
            p: Pointer.decode(d) for p, d in files.items() if p.endswith(".bin")
        }
        assert sorted(asked) == sorted(set(asked)) and len(asked) == 4  # A, B, plain.txt, attrs
