"""git-lfs verb by verb: each row of docs/cli.md's "git-lfs equivalents" table that names a
gitxet command has a test here, ``test_lfs_<verb>``, doing with gitxet what the git-lfs verb
does (issue 19). ``test_every_equivalent_row_has_a_test`` keeps the table and this file in
step."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


def run(*args: str, cwd: Path, code: int = 0, **kw: object) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        list(args),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        **kw,  # type: ignore[call-overload]
    )
    assert r.returncode == code, f"{args}: {r.stdout}{r.stderr}"
    return r  # type: ignore[no-any-return]


def xet(*args: str, cwd: Path, code: int = 0) -> subprocess.CompletedProcess[str]:
    return run("git-xet", *args, cwd=cwd, code=code)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A work tree with a.bin (a pointer file) committed and pushed to ``remote.git``."""
    run("git", "init", "-q", "--bare", str(tmp_path / "remote.git"), cwd=tmp_path)
    work = tmp_path / "work"
    run("git", "init", "-q", str(work), cwd=tmp_path)
    run("git", "remote", "add", "origin", str(tmp_path / "remote.git"), cwd=work)
    xet("init", cwd=work)
    (work / "a.bin").write_bytes(os.urandom(300_000))
    xet("add", "a.bin", ".gitattributes", ".xetconfig", cwd=work)
    run("git", "commit", "-q", "-m", "one", cwd=work)
    run("git", "push", "-q", "origin", "main", cwd=work)
    return work


def lazy_clone(repo: Path) -> Path:
    dst = repo.parent / "lazy"
    xet("clone", "--lazy", str(repo.parent / "remote.git"), str(dst), cwd=repo.parent)
    return dst


def test_lfs_checkout(repo: Path) -> None:
    lazy = lazy_clone(repo)
    assert (lazy / "a.bin").read_bytes().startswith(b"version ")
    xet("checkout", "a.bin", cwd=lazy)
    assert (lazy / "a.bin").read_bytes() == (repo / "a.bin").read_bytes()


def test_lfs_dedup(repo: Path) -> None:
    (repo / "b.bin").write_bytes((repo / "a.bin").read_bytes())
    out = xet("dedup", "a.bin", "b.bin", cwd=repo).stdout
    assert "(50.0% of the input)" in out  # the copy is stored once


def test_lfs_env(repo: Path) -> None:
    out = xet("env", cwd=repo).stdout
    assert f"repository: {repo}" in out and "remote: origin" in out


def test_lfs_fetch(repo: Path) -> None:
    lazy = lazy_clone(repo)
    assert "0 in the local store" in xet("fsck", cwd=lazy).stdout
    xet("fetch", "origin", "main", cwd=lazy)
    assert "1 in the local store" in xet("fsck", cwd=lazy).stdout


def test_lfs_fsck(repo: Path) -> None:
    out = xet("fsck", cwd=repo).stdout
    assert "0 damaged" in out and "1 in the local store" in out


def test_lfs_install(repo: Path) -> None:
    xet("install", "--local", "--skip-smudge", cwd=repo)
    assert run("git", "config", "--local", "xet.lazy", cwd=repo).stdout.strip() == "true"
    xet("install", "--local", cwd=repo)  # a plain install smudges again
    run("git", "config", "--local", "xet.lazy", cwd=repo, code=1)
    assert run("git", "config", "filter.xet.process", cwd=repo).stdout.strip()


def test_lfs_logs(repo: Path) -> None:
    lazy = lazy_clone(repo)
    shutil.move(repo.parent / "remote.git" / "xet", repo.parent / "gone")  # the data is lost
    (lazy / "a.bin").unlink()
    r = run(
        "git", "checkout", "--", "a.bin", cwd=lazy, code=128, env=dict(os.environ, GITXET_LAZY="0")
    )
    assert "a.bin" in r.stderr
    names = xet("logs", cwd=lazy).stdout.split()
    assert len(names) == 1
    last = xet("logs", "last", cwd=lazy).stdout
    assert "smudge a.bin" in last and "Traceback" in last
    assert xet("logs", "show", names[0], cwd=lazy).stdout == last
    xet("logs", "clear", cwd=lazy)
    xet("logs", "last", cwd=lazy, code=4)


def test_lfs_ls_files(repo: Path) -> None:
    out = xet("ls-files", "--size", cwd=repo).stdout
    assert re.fullmatch(r"[0-9a-f]{12} \* a\.bin \(293\.0 KiB\)\n", out), out


def test_lfs_migrate(repo: Path) -> None:
    (repo / "big.raw").write_bytes(os.urandom(200_000))
    run(
        "git",
        "-c",
        "filter.xet.process=",
        "-c",
        "filter.xet.required=false",
        "add",
        "big.raw",
        cwd=repo,
    )  # committed as a plain blob (no filter)
    run("git", "commit", "-q", "-m", "plain", cwd=repo)
    info = xet("migrate", "info", "--threshold", "100k", cwd=repo).stdout
    assert "1 plain files" in info and ".raw" in info
    xet("migrate", "--threshold", "100k", cwd=repo)
    blob = run("git", "cat-file", "-p", "HEAD:big.raw", cwd=repo).stdout
    assert blob.startswith("version https://gitxet.dev/spec/v1")
    xet("migrate", "export", cwd=repo)  # and back: plain blobs, no gitxet rules
    got = subprocess.run(
        ["git", "cat-file", "-p", "HEAD:big.raw"], cwd=repo, capture_output=True, check=True
    ).stdout
    assert got == (repo / "big.raw").read_bytes() and len(got) == 200_000
    run("git", "cat-file", "-e", "HEAD:.xetconfig", cwd=repo, code=128)


def test_lfs_prune(repo: Path) -> None:
    (repo / "a.bin").write_bytes(os.urandom(300_000))
    xet("add", "a.bin", cwd=repo)
    run("git", "commit", "-q", "-m", "two", cwd=repo)
    run("git", "push", "-q", "origin", "main", cwd=repo)
    out = xet("prune", "--grace", "0", "--recent-days", "0", cwd=repo).stderr
    assert "removed 1 xorb(s)" in out, out


def test_lfs_pull(repo: Path) -> None:
    clone = repo.parent / "clone"
    xet("clone", str(repo.parent / "remote.git"), str(clone), cwd=repo.parent)
    (repo / "a.bin").write_bytes(os.urandom(300_000))
    xet("add", "a.bin", cwd=repo)
    run("git", "commit", "-q", "-m", "two", cwd=repo)
    xet("push", cwd=repo)
    xet("pull", cwd=clone)
    assert (clone / "a.bin").read_bytes() == (repo / "a.bin").read_bytes()


def test_lfs_push(repo: Path) -> None:
    (repo / "c.bin").write_bytes(os.urandom(300_000))
    xet("add", "c.bin", cwd=repo)
    run("git", "commit", "-q", "-m", "two", cwd=repo)
    out = xet("push", cwd=repo).stderr
    assert "1 xorb(s) and 1 shard(s) uploaded" in out, out
    assert "0 missing" in xet("fsck", "--all", cwd=lazy_clone(repo)).stdout


def test_lfs_status(repo: Path) -> None:
    (repo / "a.bin").write_bytes(os.urandom(300_000))
    assert xet("status", "--porcelain", cwd=repo).stdout == " M a.bin\n"
    xet("add", "a.bin", cwd=repo)
    assert xet("status", "--porcelain", cwd=repo).stdout == "M  a.bin\n"
    assert "Large files to be committed:\n\tmodified:   a.bin" in xet("status", cwd=repo).stdout


def test_lfs_track(repo: Path) -> None:
    xet("track", "*.iso", cwd=repo)
    assert "*.iso filter=xet" in (repo / ".gitattributes").read_text()
    (repo / "small.iso").write_bytes(b"tiny but tracked\n")
    xet("add", "small.iso", cwd=repo)
    staged = run("git", "cat-file", "-p", ":small.iso", cwd=repo).stdout
    assert staged.startswith("version https://gitxet.dev/spec/v1")
    assert "*.iso" in xet("track", cwd=repo).stdout  # alone: lists the rules


def test_lfs_untrack(repo: Path) -> None:
    xet("track", "*.iso", cwd=repo)
    xet("untrack", "*.iso", cwd=repo)
    assert "*.iso" not in (repo / ".gitattributes").read_text()


def test_lfs_uninstall(repo: Path) -> None:
    xet("uninstall", "--local", cwd=repo)
    run("git", "config", "--local", "filter.xet.process", cwd=repo, code=1)


def test_lfs_update(repo: Path) -> None:
    hook = repo / ".git" / "hooks" / "pre-push"
    hook.unlink()
    xet("install", "--local", cwd=repo)  # repairs the hooks of this repository
    assert "git-xet" in hook.read_text() or "gitxet" in hook.read_text()


def test_lfs_version(repo: Path) -> None:
    assert re.match(r"git-xet \S+ \(chunker: ", xet("--version", cwd=repo).stdout)


def test_lfs_pointer(repo: Path) -> None:
    built = xet("pointer", "--file", "a.bin", cwd=repo).stdout
    assert built == run("git", "cat-file", "-p", "HEAD:a.bin", cwd=repo).stdout


def test_every_equivalent_row_has_a_test() -> None:
    """Rows of the table whose gitxet column names a command have ``test_lfs_<verb>``."""
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text.split("## git-lfs equivalents", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `git lfs ")]
    assert len(rows) >= 22  # every porcelain verb of git-lfs 3.3
    verbs = {row.split("`git lfs ", 1)[1].split("`", 1)[0] for row in rows}
    if shutil.which("git-lfs"):  # the installed git-lfs's porcelain verbs are all there
        manual = run("git", "lfs", "--help", cwd=ROOT, env=dict(os.environ, MANPAGER="cat")).stdout
        porcelain = manual.split("porcelain commands", 2)[-1].split("plumbing commands")[0]
        assert set(re.findall(r"git-lfs-([a-z-]+)\(1\)", porcelain)) <= verbs
    here = globals()
    for row in rows:
        verb = row.split("`git lfs ", 1)[1].split("`", 1)[0]
        equivalent = row.split("|")[2].strip()
        if equivalent.startswith("`git xet"):
            name = "test_lfs_" + verb.replace("-", "_")
            assert name in here, f"no {name} for the row of git lfs {verb}"
