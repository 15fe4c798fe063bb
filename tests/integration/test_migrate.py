"""``git xet migrate`` with the real git and git-lfs binaries: history rewritten, bytes kept."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from gitxet.cli._json import SCHEMAS
from gitxet.formats.pointer import Pointer
from gitxet.migrate import parse_lfs_pointer

pytestmark = pytest.mark.timeout(300)

XET_HEAD = b"version https://gitxet.dev/spec/v1\n"
LFS_HEAD = b"version https://git-lfs.github.com/spec/v1\n"
ATTR_LINE = b"* filter=xet diff=xet merge=xet -text\n"

needs_lfs = pytest.mark.skipif(shutil.which("git-lfs") is None, reason="git-lfs not installed")


@pytest.fixture(autouse=True)
def gitxet_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", bindir + os.pathsep + os.environ.get("PATH", ""))


def run(
    *args: str, cwd: Path, check: bool = True, input: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    r = subprocess.run(list(args), cwd=cwd, capture_output=True, input=input, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"{args} failed ({r.returncode}):\n{r.stdout!r}\n{r.stderr!r}")
    return r


def git(*args: str, cwd: Path) -> str:
    return run("git", *args, cwd=cwd).stdout.decode()


def commit_all(work: Path, files: dict[str, bytes], message: str) -> None:
    for name, data in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(data)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", message, cwd=work)


def tree_files(repo: Path, commit: str) -> dict[str, bytes]:
    """Every regular file of ``commit`` as stored in git (pointers stay pointers)."""
    out: dict[str, bytes] = {}
    listing = run("git", "ls-tree", "-r", "-z", commit, cwd=repo).stdout
    for rec in listing.split(b"\0"):
        if rec:
            meta, _, path = rec.partition(b"\t")
            oid = meta.split()[2].decode()
            out[path.decode()] = run("git", "cat-file", "blob", oid, cwd=repo).stdout
    return out


_SMUDGED: dict[tuple[str, bytes], bytes] = {}


def smudged(repo: Path, path: str, blob: bytes) -> bytes:
    """What ``git xet`` turns a stored blob into on checkout (each blob asked once)."""
    key = (str(repo), blob)
    if key not in _SMUDGED:
        _SMUDGED[key] = run("git-xet", "smudge", "--", path, cwd=repo, input=blob).stdout
    return _SMUDGED[key]


def commits_by_message(repo: Path, *revs: str) -> dict[str, str]:
    out = git("log", "--format=%H %s", *revs, cwd=repo)
    return {line.split(" ", 1)[1]: line.split(" ", 1)[0] for line in out.splitlines()}


@needs_lfs
def test_lfs_history_migrates_byte_identical(tmp_path: Path) -> None:
    rnd = random.Random(7)
    work = tmp_path / "work"
    git("init", "-q", str(work), cwd=tmp_path)
    git("lfs", "install", "--local", cwd=work)
    git("lfs", "track", "*.bin", cwd=work)
    expected: dict[str, dict[str, bytes]] = {}

    big = rnd.randbytes(700_000)
    v1 = {
        "a.bin": big,
        "data/b c.bin": rnd.randbytes(300_000),  # a blank: quoted path in fast-export
        "tiny.bin": b"tiny lfs content\n",  # LFS-tracked but under the threshold
        "plain.dat": rnd.randbytes(400_000),  # a big file git-lfs did not track
        "notes.txt": b"hello\n",
    }
    commit_all(work, v1, "v1")
    expected["v1"] = dict(v1)
    v2 = dict(v1, **{"a.bin": big[:1000] + rnd.randbytes(5000) + big[1000:]})
    commit_all(work, {"a.bin": v2["a.bin"]}, "v2")
    expected["v2"] = v2
    git("tag", "-a", "-m", "release", "rel", cwd=work)
    git("checkout", "-q", "-b", "side", cwd=work)
    side = dict(v2, **{"side.bin": rnd.randbytes(350_000)})
    commit_all(work, {"side.bin": side["side.bin"]}, "side")
    expected["side"] = side
    git("checkout", "-q", "main", cwd=work)
    v3 = dict(v2, **{"notes.txt": b"hello again\n"})
    commit_all(work, {"notes.txt": v3["notes.txt"]}, "v3")
    expected["v3"] = v3
    git("merge", "-q", "--no-edit", "side", "-m", "merge", cwd=work)
    expected["merge"] = dict(v3, **{"side.bin": side["side.bin"]})
    # the originals really are LFS pointers in git
    assert parse_lfs_pointer(tree_files(work, "main")["a.bin"]) is not None
    git("checkout", "-q", "side", cwd=work)  # migrate a branch that is not checked out too

    # the preview: what would be converted, changing nothing
    refs_before = git("for-each-ref", cwd=work)
    info = json.loads(run("git-xet", "migrate", "info", "--everything", "--json", cwd=work).stdout)
    jsonschema.validate(info, SCHEMAS["migrate-info"][1])
    assert (info["commits"], info["lfs_missing"], info["threshold"]) == (5, 0, 256 * 1024)
    by_ext = {e["extension"]: e for e in info["extensions"]}
    assert (by_ext[".bin"]["lfs_files"], by_ext[".bin"]["plain_files"]) == (4, 0)
    assert (by_ext[".dat"]["plain_files"], by_ext[".dat"]["plain_bytes"]) == (1, 400_000)
    r = run("git-xet", "migrate", "--dry-run", "--everything", cwd=work)
    assert "would rewrite 5 commit(s) on 3 ref(s): 5 file version(s)" in r.stdout.decode()
    assert git("for-each-ref", cwd=work) == refs_before

    r = run("git-xet", "migrate", "--everything", cwd=work)
    assert b"from git-lfs" in r.stderr

    new = commits_by_message(work, "--all")
    assert set(new) == set(expected)
    for message, files in expected.items():
        stored = tree_files(work, new[message])
        attrs = stored.pop(".gitattributes")
        assert stored.pop(".xetconfig") == b"[xet]\n\tthreshold = 256k\n"  # the rules
        assert attrs.startswith(b"*.bin filter=lfs")  # the user's lines are kept ...
        assert attrs.endswith(ATTR_LINE)  # ... and ours come last, so they win
        assert set(stored) == set(files), message
        for path, blob in stored.items():
            assert not blob.startswith(LFS_HEAD), (message, path)
            if len(files[path]) >= 256 * 1024:
                ptr = Pointer.decode(blob)
                assert ptr.size == len(files[path])
            else:
                assert blob == files[path], (message, path)  # small files stay plain
            assert smudged(work, path, blob) == files[path], (message, path)

    # history shape and refs
    assert git("rev-list", "--count", "main", cwd=work).strip() == "5"
    assert git("rev-parse", "rel^{commit}", cwd=work).strip() == new["v2"]
    assert git("cat-file", "-t", "rel", cwd=work).strip() == "tag"
    # the checked-out branch was checked out again, materialized, and is clean
    assert (work / "side.bin").read_bytes() == side["side.bin"]
    assert (work / "data/b c.bin").read_bytes() == v1["data/b c.bin"]
    assert git("status", "--porcelain", cwd=work).strip() == ""

    # and the migrated repository works like any gitxet repository
    remote = tmp_path / "remote.git"
    git("init", "-q", "--bare", str(remote), cwd=tmp_path)
    git("remote", "add", "origin", str(remote), cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    clone = tmp_path / "clone"
    run("git-xet", "clone", str(remote), str(clone), cwd=tmp_path)
    for path, data in expected["merge"].items():
        assert (clone / path).read_bytes() == data, path


def test_plain_history_migrates_by_threshold(tmp_path: Path) -> None:
    rnd = random.Random(8)
    work = tmp_path / "work"
    git("init", "-q", str(work), cwd=tmp_path)
    (work / ".gitattributes").write_bytes(b"*.txt text\n")
    v1 = {
        "big.raw": rnd.randbytes(300_000),
        "mid.raw": rnd.randbytes(100_000),  # under the 200k threshold: stays a blob
        "logs/huge.keep": rnd.randbytes(250_000),  # excluded
        "x.txt": b"text\n",
    }
    commit_all(work, v1, "v1")
    v2 = dict(v1, **{"big.raw": v1["big.raw"] + rnd.randbytes(1000)})
    commit_all(work, {"big.raw": v2["big.raw"]}, "v2")
    git("rm", "-q", ".gitattributes", cwd=work)  # a commit that deletes .gitattributes
    git("commit", "-q", "-m", "v3", cwd=work)
    before = git("rev-parse", "main", cwd=work)

    run("git-xet", "migrate", "--threshold", "200k", "-X", "*.keep", cwd=work)
    assert git("rev-parse", "main", cwd=work) != before
    # the threshold travels with the commits (.xetconfig), not in the local config
    assert git("config", "--file", ".xetconfig", "xet.threshold", cwd=work).strip() == "200k"
    assert run("git", "config", "xet.threshold", cwd=work, check=False).returncode == 1
    new = commits_by_message(work, "main")
    block = b"* filter=xet diff=xet merge=xet -text\n*.keep !filter !diff !merge\n"
    for message, files in (("v1", v1), ("v2", v2), ("v3", v2)):
        stored = tree_files(work, new[message])
        attrs = stored.pop(".gitattributes")
        assert stored.pop(".xetconfig") == b"[xet]\n\tthreshold = 200k\n"
        assert attrs.endswith(block)
        assert attrs.startswith(b"*.txt text\n") == (message != "v3")
        assert stored.keys() == files.keys()
        assert Pointer.decode(stored["big.raw"]).size == len(files["big.raw"])
        assert stored["mid.raw"] == files["mid.raw"]
        assert stored["logs/huge.keep"] == files["logs/huge.keep"]
        assert smudged(work, "big.raw", stored["big.raw"]) == files["big.raw"]
    assert (work / "big.raw").read_bytes() == v2["big.raw"]
    assert git("status", "--porcelain", cwd=work).strip() == ""
    # the filter agrees with the migration: re-adding the files changes nothing
    (work / "big.raw").write_bytes(v2["big.raw"])
    git("add", "-A", cwd=work)
    assert git("status", "--porcelain", cwd=work).strip() == ""
    # migrating again the same way changes nothing (pointers stay pointers, and the
    # attributes block is not appended twice)
    again_before = git("rev-parse", "main", cwd=work)
    run("git-xet", "migrate", "-X", "*.keep", cwd=work)
    assert git("rev-parse", "main", cwd=work) == again_before


def test_dirty_tree_bad_refs_and_missing_lfs_objects_change_nothing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    git("init", "-q", str(work), cwd=tmp_path)
    commit_all(work, {"a.raw": random.Random(9).randbytes(300_000)}, "one")
    head = git("rev-parse", "HEAD", cwd=work)

    (work / "a.raw").write_bytes(b"changed")
    r = run("git-xet", "migrate", cwd=work, check=False)
    assert r.returncode != 0 and b"uncommitted" in r.stderr and b"a.raw" in r.stderr
    assert b"Traceback" not in r.stderr
    git("checkout", "--", "a.raw", cwd=work)

    r = run("git-xet", "migrate", "nosuchbranch", cwd=work, check=False)
    assert r.returncode != 0 and b"nosuchbranch" in r.stderr and b"Traceback" not in r.stderr

    # an LFS pointer whose object is nowhere: one clear line, refs untouched
    oid = "ab" * 32
    ptr = f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize 5000\n"
    commit_all(work, {"ghost.bin": ptr.encode()}, "two")
    head = git("rev-parse", "HEAD", cwd=work)
    r = run("git-xet", "migrate", cwd=work, check=False)
    assert r.returncode != 0, r.stderr
    assert oid.encode() in r.stderr and b"ghost.bin" in r.stderr and b"git lfs fetch" in r.stderr
    assert b"Traceback" not in r.stderr
    assert git("rev-parse", "HEAD", cwd=work) == head
    assert list((work / ".git").glob("fast_import_crash_*")) == []

    # an LFS object whose bytes do not match its pointer: integrity error, refs untouched
    obj = work / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
    obj.parent.mkdir(parents=True)
    obj.write_bytes(b"x" * 5000)
    r = run("git-xet", "migrate", cwd=work, check=False)
    assert r.returncode == 3 and b"integrity" in r.stderr and oid.encode() in r.stderr
    assert git("rev-parse", "HEAD", cwd=work) == head


def test_post_checkout_and_post_merge_hooks_are_harmless(tmp_path: Path) -> None:
    from gitxet.git import hooks

    work = tmp_path / "work"
    git("init", "-q", str(work), cwd=tmp_path)
    changes = hooks.install_hooks(work, names=("post-checkout", "post-merge"), program="git-xet")
    assert [c.action for c in changes] == ["created", "created"]
    commit_all(work, {"a.txt": b"a\n"}, "one")
    git("checkout", "-q", "-b", "b2", cwd=work)
    commit_all(work, {"b.txt": b"b\n"}, "two")
    git("checkout", "-q", "main", cwd=work)
    for args in (("merge", "--no-edit", "b2"), ("checkout", "b2")):
        r = run("git", *args, cwd=work)  # the hooks ran (git-xet is on PATH) and said nothing
        assert b"not found" not in r.stderr and b"Usage" not in r.stderr, r.stderr
    assert run("git-xet", "post-checkout", "0" * 40, "1" * 40, "1", cwd=work).returncode == 0


def test_bare_repository_migrates_every_branch_and_tag(tmp_path: Path) -> None:
    work = tmp_path / "work"
    git("init", "-q", str(work), cwd=tmp_path)
    data = random.Random(11).randbytes(300_000)
    commit_all(work, {"a.raw": data, "s.txt": b"s\n"}, "one")
    git("tag", "t1", cwd=work)
    git("branch", "other", cwd=work)
    bare = tmp_path / "bare.git"
    git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path)
    run("git-xet", "migrate", "--everything", cwd=bare)
    for ref in ("main", "other", "t1"):
        ptr = Pointer.decode(run("git", "show", f"{ref}:a.raw", cwd=bare).stdout)
        assert ptr.size == len(data)
    assert git("rev-parse", "t1", cwd=bare) == git("rev-parse", "main", cwd=bare)
    blob = run("git", "show", "main:a.raw", cwd=bare).stdout
    assert smudged(bare, "a.raw", blob) == data


def test_export_undoes_an_import(tmp_path: Path) -> None:
    """migrate export: pointers become the files again, gitxet's rules leave the history."""
    rnd = random.Random(11)
    work = tmp_path / "work"
    git("init", "-q", str(work), cwd=tmp_path)
    (work / ".gitattributes").write_bytes(b"*.txt text\n")
    v1 = {"big.raw": rnd.randbytes(300_000), "keep/k.raw": rnd.randbytes(300_000), "x.txt": b"x\n"}
    commit_all(work, v1, "v1")
    v2 = dict(v1, **{"big.raw": rnd.randbytes(310_000)})
    commit_all(work, {"big.raw": v2["big.raw"]}, "v2")
    originals = {
        m: git("rev-parse", f"{c}^{{tree}}", cwd=work)
        for m, c in commits_by_message(work, "main").items()
    }
    run("git-xet", "migrate", cwd=work)
    head = tree_files(work, "main")
    assert Pointer.decode(head["big.raw"]).size == len(v2["big.raw"])
    # export all but keep/: those stay pointers, and so do the rules they need
    r = run("git-xet", "migrate", "export", "-X", "keep/", cwd=work)
    assert b"2 file version(s) are plain git blobs again" in r.stderr, r.stderr
    new = commits_by_message(work, "main")
    for message, files in (("v1", v1), ("v2", v2)):
        stored = tree_files(work, new[message])
        assert ".xetconfig" in stored and b"filter=xet" in stored[".gitattributes"]
        assert stored["big.raw"] == files["big.raw"]
        assert Pointer.decode(stored["keep/k.raw"]).size == len(files["keep/k.raw"])
    assert (work / "big.raw").read_bytes() == v2["big.raw"]
    # everything exported: the trees are the ones before the import, byte for byte
    run("git-xet", "migrate", "export", cwd=work)
    again = commits_by_message(work, "main")
    assert {m: git("rev-parse", f"{c}^{{tree}}", cwd=work) for m, c in again.items()} == originals
    assert git("status", "--porcelain", cwd=work).strip() == ""


def test_threshold_zero_never_makes_a_pointer_of_a_file_git_reads(tmp_path: Path) -> None:
    """Issue 13: whatever the threshold, every commit gitxet writes keeps the files git reads
    (at any depth) plain blobs, and a plain clone of the result shows a clean status."""
    work = tmp_path / "work"
    git("init", "-q", str(work), cwd=tmp_path)
    read_by_git = {
        ".gitattributes": b"*.txt text\n",
        ".gitignore": b"*.tmp\n",
        ".mailmap": b"A <a@example.com>\n",
        ".lfsconfig": b"[lfs]\n\turl = https://example.com\n",
        "sub/.gitattributes": b"*.csv text\n",
        "sub/.gitignore": b"build/\n",
    }
    data = {"tiny.txt": b"tiny\n", "sub/t.csv": b"a,b\n1,2\n"}
    commit_all(work, {**read_by_git, **data}, "v1")
    commit_all(work, {"tiny.txt": b"tiny, edited\n", ".gitignore": b"*.tmp\n*.log\n"}, "v2")
    run("git-xet", "migrate", "--threshold", "0", cwd=work)
    for message in ("v1", "v2"):
        stored = tree_files(work, commits_by_message(work, "main")[message])
        for name in (*read_by_git, ".xetconfig"):
            assert not stored[name].startswith(b"version "), (message, name)
        assert stored["sub/.gitattributes"] == read_by_git["sub/.gitattributes"]
        for name in data:
            assert Pointer.decode(stored[name]).size > 0, (message, name)
    assert (work / "tiny.txt").read_bytes() == b"tiny, edited\n"
    assert git("status", "--porcelain", cwd=work).strip() == ""
    run("git-xet", "install", cwd=tmp_path)
    clone = tmp_path / "clone"
    git("clone", "-q", str(work), str(clone), cwd=tmp_path)
    assert (clone / "sub" / "t.csv").read_bytes() == data["sub/t.csv"]
    assert git("status", "--porcelain", cwd=clone).strip() == ""
