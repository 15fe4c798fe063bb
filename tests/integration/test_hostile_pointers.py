"""Pointer text where git would not expect content: a tree an attacker wrote, whose
``.gitattributes`` sets the xet filter on everything, ``.git*`` included, and whose
``.gitignore``, symlink and submodule entries look like pointers; a pointer whose size is
2**63-1. A clone and a checkout write only what git would, and say what is wrong."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.proc import interpreter_path, remote_and_work

pytestmark = pytest.mark.timeout(300)


def run(cwd: Path, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(args), cwd=cwd, input=data, capture_output=True, timeout=120)


def ok(cwd: Path, *args: str, data: bytes | None = None) -> str:
    r = run(cwd, *args, data=data)
    assert r.returncode == 0, f"{args}: {r.stderr.decode()}"
    return r.stdout.decode().strip()


def test_pointer_text_git_reads_or_links_is_never_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", interpreter_path())
    remote, work = remote_and_work(tmp_path, dict(os.environ))
    content = os.urandom(300_000)
    (work / "a.bin").write_bytes(content)
    ok(work, "git-xet", "add", "a.bin", ".gitattributes", ".xetconfig")
    ok(work, "git", "commit", "-qm", "base")
    ok(work, "git", "push", "-q", "origin", "main")
    ptr = run(work, "git", "cat-file", "blob", "HEAD:a.bin").stdout
    huge = ptr.replace(b"size 300000\n", b"size 9223372036854775807\n")
    ga = b"* filter=xet diff=xet merge=xet -text\n.git* filter=xet\n"

    def blob(data: bytes) -> str:
        return ok(work, "git", "hash-object", "-w", "--stdin", data=data)

    p, base = blob(ptr), ok(work, "git", "rev-parse", "HEAD")
    tree = ok(
        work,
        "git",
        "mktree",
        data=(
            f"100644 blob {blob(ga)}\t.gitattributes\n"
            f"100644 blob {p}\t.gitignore\n"
            f"100644 blob {ok(work, 'git', 'rev-parse', 'HEAD:.xetconfig')}\t.xetconfig\n"
            f"100644 blob {p}\ta.bin\n"
            f"100644 blob {blob(huge)}\thuge.bin\n"
            f"120000 blob {p}\tlink.bin\n"
            f"160000 commit {base}\tmodel.bin\n"
        ).encode(),
    )
    commit = ok(work, "git", "commit-tree", tree, "-p", "HEAD", "-m", "hostile")
    ok(work, "git", "push", "-q", "origin", f"{commit}:refs/heads/hostile")

    clone = tmp_path / "clone"
    r = run(tmp_path, "git-xet", "clone", "-b", "hostile", str(remote), str(clone))
    err = r.stderr.decode()
    assert r.returncode == 3 and "Traceback" not in err, err  # the integrity error
    assert "huge.bin: integrity error" in err and "pointer says 9223372036854775807" in err
    assert (clone / "a.bin").read_bytes() == content
    assert (clone / "huge.bin").read_bytes() == huge  # left as its pointer
    assert (clone / ".gitignore").read_bytes() == ptr  # git reads it: never content
    assert os.readlink(clone / "link.bin") == ptr.decode()  # a symlink stays one
    assert os.listdir(clone / "model.bin") == []  # a submodule git did not clone
    assert run(clone, "git", "config", "xet.cloneUnfinished").stdout == b""  # done as it can be
    listed = ok(clone, "git-xet", "ls-files").splitlines()
    assert sorted(line.split(" ", 2)[2] for line in listed) == ["a.bin", "huge.bin"]

    # a commit read without a checkout (mounts and xet:// share CommitFS) shows it the same
    import fsspec

    from gitxet.fsspec import xet_url

    xfs = fsspec.filesystem("xet", cache_dir=str(tmp_path / "cache"))
    try:
        base = xet_url(str(remote), "hostile", "")
        sizes = {os.path.basename(e["name"]): e["size"] for e in xfs.ls(base, detail=True)}
        assert sizes[".gitignore"] == len(ptr) and sizes["a.bin"] == len(content)
        assert xfs.info(xet_url(str(remote), "hostile", ".gitignore"))["size"] == len(ptr)
        with xfs.open(xet_url(str(remote), "hostile", ".gitignore"), "rb") as f:
            assert f.read() == ptr  # it was the 300,000 bytes of a.bin
        with xfs.open(xet_url(str(remote), "hostile", "a.bin"), "rb") as f:
            assert f.read() == content
    finally:
        xfs.close()
        type(xfs).clear_instance_cache()

    # git's own checkout runs the smudge filter on each of them
    plain = tmp_path / "plain"
    ok(tmp_path, "git-xet", "install")
    r = run(tmp_path, "git", "clone", "-q", "-b", "main", str(remote), str(plain))
    assert r.returncode == 0, r.stderr.decode()
    r = run(plain, "git", "checkout", "-q", "hostile")
    assert r.returncode != 0 and b"huge.bin" in r.stderr  # its smudge refused, by name
    assert (plain / ".gitignore").read_bytes() == ptr


def test_pointer_text_in_a_file_git_does_not_filter_stays_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose text is a valid pointer but whose path the xet filter does not cover
    (a pointer kept as an example, a name that differs from a tracked pattern in case) is
    a plain blob: git checks it out as that text, so clone and checkout must too (they
    wrote the pointer's content there, and restated the index so 'git status' hid it)."""
    monkeypatch.setenv("PATH", interpreter_path())
    remote, work = remote_and_work(tmp_path, dict(os.environ))
    # only *.bin goes through the filter (as in a repository migrated from git-lfs)
    (work / ".gitattributes").write_bytes(b"*.bin filter=xet diff=xet merge=xet -text\n")
    content = os.urandom(300_000)
    (work / "a.bin").write_bytes(content)
    ok(work, "git-xet", "add", "a.bin", ".gitattributes", ".xetconfig")
    ok(work, "git", "commit", "-qm", "base")
    ptr = run(work, "git", "cat-file", "blob", "HEAD:a.bin").stdout
    (work / "example.ptr").write_bytes(ptr)  # not *.bin: a plain blob of pointer text
    (work / "A.BIN").write_bytes(ptr)  # git's patterns match case-sensitively
    ok(work, "git", "add", "example.ptr", "A.BIN")
    ok(work, "git", "commit", "-qm", "pointer text as plain files")
    assert run(work, "git", "check-attr", "filter", "A.BIN").stdout.endswith(b"unspecified\n")
    ok(work, "git", "push", "-q", "origin", "main")

    clone = tmp_path / "clone"
    ok(tmp_path, "git-xet", "clone", str(remote), str(clone))
    assert (clone / "a.bin").read_bytes() == content
    assert (clone / "example.ptr").read_bytes() == ptr
    assert (clone / "A.BIN").read_bytes() == ptr
    os.utime(clone / "example.ptr")  # git re-reads what it cannot trust by stat alone
    os.utime(clone / "A.BIN")
    assert ok(clone, "git", "status", "--porcelain") == ""

    lazy = tmp_path / "lazy"
    ok(tmp_path, "git-xet", "clone", "--lazy", str(remote), str(lazy))
    ok(lazy, "git-xet", "checkout")
    assert (lazy / "a.bin").read_bytes() == content
    assert (lazy / "example.ptr").read_bytes() == ptr
    assert (lazy / "A.BIN").read_bytes() == ptr
    ok(lazy, "git-xet", "checkout", "A.BIN")  # named: still git's text
    assert (lazy / "A.BIN").read_bytes() == ptr
    os.utime(lazy / "example.ptr")
    assert ok(lazy, "git", "status", "--porcelain") == ""
