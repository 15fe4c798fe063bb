"""fetch [remote] [refs...] --all --recent -I/-X, pull -I/-X and git's flags, push's git
flags and --dry-run, and the JSON summaries of add, fetch and push (issue 19)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from gitxet.cli._json import SCHEMAS

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


def run(*args: str, cwd: Path, code: int = 0) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=120)
    assert r.returncode == code, f"{args}: {r.stdout}{r.stderr}"
    return r


def xet_json(kind: str, *args: str, cwd: Path) -> dict[str, object]:
    doc = json.loads(run("git-xet", *args, "--json", cwd=cwd).stdout)
    jsonschema.validate(doc, SCHEMAS[kind][1])
    return doc  # type: ignore[no-any-return]


def write(work: Path, *names: str) -> None:
    for name in names:
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(os.urandom(300_000))


@pytest.fixture
def repos(tmp_path: Path) -> tuple[Path, Path]:
    """A work tree with main (a.bin, d/b.bin) and side (a second a.bin) pushed."""
    remote = tmp_path / "remote.git"
    work = tmp_path / "work"
    run("git", "init", "-q", "--bare", str(remote), cwd=tmp_path)
    run("git", "init", "-q", str(work), cwd=tmp_path)
    run("git", "remote", "add", "origin", str(remote), cwd=work)
    run("git-xet", "init", cwd=work)
    write(work, "a.bin", "d/b.bin")
    add = xet_json("add", "add", "a.bin", "d/b.bin", cwd=work)
    assert add == {"files": 2, "new_bytes": 600_000, "reused_bytes": 0}
    run("git", "commit", "-q", "-m", "one", cwd=work)
    pushed = xet_json("push", "push", "-u", "origin", "main", cwd=work)
    assert pushed["xorbs_uploaded"] == 1 and pushed["missing"] == []
    assert run("git", "config", "branch.main.remote", cwd=work).stdout.strip() == "origin"
    run("git", "checkout", "-q", "-b", "side", cwd=work)
    write(work, "a.bin")
    run("git-xet", "add", "a.bin", cwd=work)
    run("git", "commit", "-q", "-m", "two", cwd=work)
    r = run("git-xet", "push", "-q", "origin", "side", cwd=work)
    assert r.stderr == "" and r.stdout == ""  # -q: git's and ours
    run("git", "checkout", "-q", "main", cwd=work)
    return remote, work


def test_fetch_by_ref_all_recent_and_patterns(repos: tuple[Path, Path], tmp_path: Path) -> None:
    remote, _ = repos
    lazy = tmp_path / "lazy"
    run("git-xet", "clone", "--lazy", str(remote), str(lazy), cwd=tmp_path)
    doc = xet_json("fetch", "fetch", "origin", "origin/side", "-X", "d/", cwd=lazy)
    assert (doc["files"], doc["fetched_files"]) == (1, 1)  # side's a.bin only
    doc = xet_json("fetch", "fetch", "--all", cwd=lazy)  # main's two files are left
    assert (doc["files"], doc["already_local"], doc["fetched_files"]) == (3, 1, 2)
    doc = xet_json("fetch", "fetch", "-I", "d/*", cwd=lazy)  # HEAD's d/b.bin
    assert (doc["files"], doc["already_local"], doc["fetched_files"]) == (1, 1, 0)
    doc = xet_json("fetch", "fetch", "--recent", cwd=lazy)
    assert doc["files"] == 3 and doc["fetched_files"] == 0
    run("git-xet", "fetch", "origin", "nosuchref", cwd=lazy, code=4)


def test_pull_with_patterns_and_git_flags(repos: tuple[Path, Path], tmp_path: Path) -> None:
    remote, work = repos
    clone = tmp_path / "clone"
    run("git-xet", "clone", str(remote), str(clone), cwd=tmp_path)
    write(work, "a.bin", "d/c.bin")
    run("git-xet", "add", "a.bin", "d/c.bin", cwd=work)
    run("git", "commit", "-q", "-m", "three", cwd=work)
    run("git-xet", "push", cwd=work)
    run("git-xet", "pull", "-I", "d/*", "--ff-only", cwd=clone)
    assert (clone / "d" / "c.bin").read_bytes() == (work / "d" / "c.bin").read_bytes()
    assert (clone / "a.bin").read_bytes().startswith(b"version ")  # left a pointer
    run("git-xet", "checkout", "a.bin", cwd=clone)
    assert (clone / "a.bin").read_bytes() == (work / "a.bin").read_bytes()
    # diverged: --ff-only makes git refuse, and we say so with exit 1
    (clone / "x.txt").write_text("here\n")
    run("git", "add", "x.txt", cwd=clone)
    run("git", "commit", "-q", "-m", "local", cwd=clone)
    (work / "y.txt").write_text("there\n")
    run("git", "add", "y.txt", cwd=work)
    run("git", "commit", "-q", "-m", "remote", cwd=work)
    run("git-xet", "push", cwd=work)
    run("git-xet", "pull", "--ff-only", cwd=clone, code=1)
    run("git-xet", "pull", "--rebase", "-q", cwd=clone)
    assert (clone / "y.txt").read_text() == "there\n"


def test_push_tags_force_and_dry_run(repos: tuple[Path, Path], tmp_path: Path) -> None:
    remote, work = repos
    write(work, "t.bin")
    run("git-xet", "add", "t.bin", cwd=work)
    run("git", "commit", "-q", "-m", "tagged", cwd=work)
    run("git", "tag", "v1", cwd=work)
    run("git", "reset", "-q", "--hard", "HEAD~1", cwd=work)  # the tag alone holds t.bin
    dry = xet_json("push", "push", "--tags", "--dry-run", cwd=work)
    assert dry["dry_run"] and dry["files"] == 1
    assert run("git", "tag", cwd=remote).stdout == ""  # nothing moved
    doc = xet_json("push", "push", "--tags", cwd=work)
    assert doc["xorbs_uploaded"] == 1
    assert run("git", "tag", cwd=remote).stdout.strip() == "v1"
    run("git", "commit", "-q", "--amend", "-m", "rewritten", cwd=work)
    run("git-xet", "push", cwd=work, code=1)  # git refuses a non-fast-forward
    run("git-xet", "push", "--force", cwd=work)
    head = run("git", "rev-parse", "HEAD", cwd=work).stdout
    assert run("git", "rev-parse", "main", cwd=remote).stdout == head
