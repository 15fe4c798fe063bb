"""Every ``--json`` output of the CLI validates against its documented schema
(gitxet/cli/_json.py, listed in docs/cli.md "JSON output")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from gitxet.cli._json import SCHEMAS
from tests.helpers.fuse_env import require_fuse

pytestmark = pytest.mark.timeout(300)
SEEN: set[str] = set()


@pytest.fixture(autouse=True)
def on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


def run(*args: str, cwd: Path, stdin: str | None = None) -> str:
    r = subprocess.run(
        list(args), cwd=cwd, capture_output=True, text=True, timeout=120, input=stdin
    )
    assert r.returncode == 0, f"{args}: {r.stdout}{r.stderr}"
    return r.stdout


def check(kind: str, out: str, *, lines: int | None = None) -> list[dict[str, object]]:
    """Validate ``out`` against the schema of ``kind``; returns the objects."""
    _, schema, jsonl = SCHEMAS[kind]
    docs = [json.loads(ln) for ln in out.splitlines() if ln.strip()]
    if not jsonl:
        assert len(docs) == 1, out
    if lines is not None:
        assert len(docs) == lines, out
    for doc in docs:
        jsonschema.validate(doc, schema)
    SEEN.add(kind)
    return docs


@pytest.fixture
def work(tmp_path: Path) -> Path:
    run("git", "init", "-q", "--bare", str(tmp_path / "remote.git"), cwd=tmp_path)
    w = tmp_path / "work"
    run("git", "init", "-q", str(w), cwd=tmp_path)
    run("git", "remote", "add", "origin", str(tmp_path / "remote.git"), cwd=w)
    run("git-xet", "init", cwd=w)
    for name in ("a.bin", "b.bin"):
        (w / name).write_bytes(os.urandom(300_000))
    run("git-xet", "add", "a.bin", "b.bin", cwd=w)
    run("git", "commit", "-q", "-m", "one", cwd=w)
    run("git", "push", "-q", "origin", "main", cwd=w)
    (w / "a.bin").write_bytes(os.urandom(300_000))  # modified, not staged
    (w / "c.bin").write_bytes(os.urandom(300_000))
    run("git-xet", "add", "c.bin", cwd=w)  # staged
    return w


def test_inspection_outputs_follow_their_schemas(work: Path, tmp_path: Path) -> None:
    st = check("status", run("git-xet", "status", "--json", cwd=work))[0]
    assert st["changes"] == [
        {"path": "a.bin", "staged": None, "unstaged": "M"},
        {"path": "c.bin", "staged": "A", "unstaged": None},
    ]
    assert st["remote"] == {"name": "origin", "url": str(tmp_path / "remote.git")}
    assert run("git-xet", "status", "--porcelain", cwd=work).splitlines() == [
        " M a.bin",
        "A  c.bin",
    ]
    run("git", "commit", "-q", "-m", "two", cwd=work)
    st = check("status", run("git-xet", "status", "--json", cwd=work))[0]
    assert st["to_push"] == ["c.bin"]

    files = check("ls-files", run("git-xet", "ls-files", "--json", cwd=work), lines=3)
    assert {f["path"] for f in files} == {"a.bin", "b.bin", "c.bin"}
    check("ls-files", run("git-xet", "ls-files", "--all", "--json", cwd=work), lines=3)
    check("hash", run("git-xet", "hash", "--json", "a.bin", "b.bin", cwd=work), lines=2)

    pointer = run("git", "show", "HEAD:b.bin", cwd=work)
    doc = check(
        "pointer", run("git-xet", "pointer", "--pointer", "-", "--json", cwd=work, stdin=pointer)
    )[0]
    assert doc["pointer"] == pointer and doc["matches"] is None
    doc = check(
        "pointer",
        run(
            "git-xet",
            "pointer",
            "--file",
            "b.bin",
            "--pointer",
            "-",
            "--json",
            cwd=work,
            stdin=pointer,
        ),
    )[0]
    assert doc["matches"] is True

    env = check("env", run("git-xet", "env", "--json", cwd=work))[0]
    assert env["repository"]["default_remote"] == "origin"  # type: ignore[index]
    assert check("env", run("git-xet", "env", "--json", cwd=tmp_path))[0]["repository"] is None

    check("prune", run("git-xet", "prune", "--dry-run", "--json", cwd=work))
    doc = check("prune", run("git-xet", "prune", "--cache", "--json", cwd=work))[0]
    assert doc["cache_ranges_removed"] == 0  # nothing was cached: a path remote
    doc = check("prune-cache", run("git-xet", "prune", "--cache", "--json", cwd=tmp_path))[0]
    assert doc == {"dry_run": False, "ranges": 0, "bytes": 0}


@pytest.mark.fuse
def test_transfer_summaries_follow_their_schemas(tmp_path: Path) -> None:
    """add, push (and --dry-run), fetch and migrate info/--dry-run with --json: one object
    on stdout, git's own output kept off it."""
    run("git", "init", "-q", "--bare", str(tmp_path / "remote.git"), cwd=tmp_path)
    w = tmp_path / "work"
    run("git", "init", "-q", str(w), cwd=tmp_path)
    run("git", "remote", "add", "origin", str(tmp_path / "remote.git"), cwd=w)
    run("git-xet", "init", cwd=w)
    data = os.urandom(300_000)
    (w / "a.bin").write_bytes(data)
    (w / "b.bin").write_bytes(data)  # the same content: its chunks are reused
    doc = check("add", run("git-xet", "add", "--json", "a.bin", "b.bin", ".gitattributes", cwd=w))[
        0
    ]
    assert doc["files"] == 2 and doc["new_bytes"] == 300_000 and doc["reused_bytes"] == 300_000
    run("git", "commit", "-q", "-m", "one", cwd=w)

    doc = check("push", run("git-xet", "push", "--dry-run", "--json", cwd=w))[0]
    assert doc["dry_run"] is True and doc["xorbs_uploaded"] == 0 and doc["missing"] == []
    doc = check("push", run("git-xet", "push", "--json", cwd=w))[0]
    assert doc["remote"] == "origin" and doc["xorbs_uploaded"] >= 1
    assert doc["bytes_uploaded"] > 0 and doc["missing"] == []

    lazy = tmp_path / "lazy"
    run("git-xet", "clone", "--lazy", str(tmp_path / "remote.git"), str(lazy), cwd=tmp_path)
    doc = check("fetch", run("git-xet", "fetch", "--json", cwd=lazy))[0]
    assert doc["files"] == 1 and doc["bytes"] == 300_000  # one content, two paths
    assert doc["fetched_files"] == 1 and doc["already_local"] == 0
    doc = check("fetch", run("git-xet", "fetch", "--json", cwd=lazy))[0]
    assert doc["already_local"] == 1 and doc["xorbs_fetched"] == 0

    (w / "plain.raw").write_bytes(os.urandom(200_000))
    run("git", "-c", "filter.xet.process=", "-c", "filter.xet.required=false", "add",
        "plain.raw", cwd=w)  # fmt: skip
    run("git", "commit", "-q", "-m", "plain", cwd=w)
    info = check(
        "migrate-info", run("git-xet", "migrate", "info", "--threshold", "100k", "--json", cwd=w)
    )[0]
    (raw,) = [e for e in info["extensions"] if e["extension"] == ".raw"]  # type: ignore[union-attr]
    assert raw["plain_files"] == 1 and raw["plain_bytes"] == 200_000
    dry = check(
        "migrate-info",
        run("git-xet", "migrate", "--dry-run", "--threshold", "100k", "--json", cwd=w),
    )[0]
    assert dry == info


def test_every_json_option_has_a_schema() -> None:
    """Each command taking --json names its schema(s) here, and every schema of
    gitxet/cli/_json.py belongs to a command (so none is left undocumented or untested:
    a test here validates an output of each)."""
    import click
    import typer

    from gitxet.cli.app import app

    expected = {
        "add": {"add"},
        "env": {"env"},
        "fetch": {"fetch"},
        "hash": {"hash"},
        "ls-files": {"ls-files"},
        "migrate": {"migrate-info"},
        "mounts": {"mounts"},
        "pointer": {"pointer"},
        "prune": {"prune", "prune-cache"},
        "push": {"push"},
        "status": {"status"},
    }
    found: set[str] = set()

    def walk(cmd: click.Command, path: str) -> None:
        if any("--json" in getattr(p, "opts", ()) for p in cmd.params):
            found.add(path)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(typer.main.get_command(app), "")
    assert found == set(expected), found
    assert set().union(*expected.values()) == set(SCHEMAS)
    validated = set(re.findall(r'check\(\s*"([a-z-]+)"', Path(__file__).read_text()))
    assert validated == set(SCHEMAS), "a schema no test here validates an output against"


def test_mounts_json_follows_its_schema(work: Path, tmp_path: Path) -> None:
    require_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run("git-xet", "mount", str(work), "HEAD", str(mnt), cwd=work)
    try:
        (doc,) = check("mounts", run("git-xet", "mounts", "--json", cwd=work), lines=1)
        assert doc["mountpoint"] == str(mnt) and doc["state"] == "ok"
    finally:
        run("git-xet", "unmount", str(mnt), cwd=work)
