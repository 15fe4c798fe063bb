"""The filter-process server under the real git binary (clean, smudge, delayed checkout)."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("rot13_filter.py")
_spec = importlib.util.spec_from_file_location("rot13_filter", SCRIPT)
assert _spec is not None and _spec.loader is not None
_rot13_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_rot13_module)
rot13 = _rot13_module.rot13


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> bytes:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env=env).stdout


def configure_filter(repo: Path, log: Path, scope: str = "--local") -> None:
    command = " ".join(shlex.quote(x) for x in (sys.executable, str(SCRIPT), str(log)))
    git(repo, "config", scope, "filter.x.process", command)
    git(repo, "config", scope, "filter.x.required", "true")


@pytest.fixture
def repo(git_repo: Path, tmp_path: Path) -> Path:
    configure_filter(git_repo, tmp_path / "filter.log")
    (git_repo / ".gitattributes").write_text("*.txt filter=x\n*.bin filter=x\n")
    return git_repo


def test_clean_smudge_and_delayed_checkout(repo: Path, tmp_path: Path) -> None:
    files: dict[str, bytes] = {}
    for i in range(40):
        files[f"delay/file{i:02d}.txt"] = f"Delayed file number {i}\n".encode() * (i + 1)
    for i in range(5):
        files[f"now/file{i}.txt"] = f"Inline file {i}\n".encode()
    files["plain.md"] = b"Not filtered at all\n"
    files["big.bin"] = bytes(range(256)) * 12_000 + b"Tail Text"  # ~3 MB, many packets
    for name, data in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "data")

    # Clean ran: git stores rot13 for filtered files and the raw bytes for the others.
    assert git(repo, "cat-file", "blob", "HEAD:delay/file03.txt") == rot13(
        files["delay/file03.txt"]
    )
    assert git(repo, "cat-file", "blob", "HEAD:big.bin") == rot13(files["big.bin"])
    assert git(repo, "cat-file", "blob", "HEAD:plain.md") == files["plain.md"]
    assert git(repo, "status", "--porcelain") == b""

    # Switch to a branch without the files and back: git smudges everything again, and
    # delays what the filter lets it delay.
    git(repo, "checkout", "-q", "--orphan", "empty")
    git(repo, "rm", "-rfq", ".")
    git(repo, "commit", "-q", "--allow-empty", "-m", "empty")
    assert not (repo / "delay").exists()
    trace = tmp_path / "trace.log"
    env = {**os.environ, "GIT_TRACE_PACKET": str(trace)}
    git(repo, "checkout", "-q", "main", env=env)

    for name, data in files.items():
        assert (repo / name).read_bytes() == data, name
    assert git(repo, "status", "--porcelain") == b""
    packets = trace.read_text(errors="replace")
    assert "status=delayed" in packets
    assert "command=list_available_blobs" in packets
    assert packets.count("status=delayed") == 40
    log = (tmp_path / "filter.log").read_text().splitlines()
    assert sum(line.startswith("smudge delay/") for line in log) == 40 * 1


def test_clone_runs_delayed_smudge(repo: Path, tmp_path: Path) -> None:
    for i in range(12):
        path = repo / "delay" / f"c{i}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"clone me {i}\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "c")
    # A clone has no local config yet, so the filter must come from the global config.
    configure_filter(repo, tmp_path / "clone.log", scope="--global")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    for i in range(12):
        assert (clone / "delay" / f"c{i}.txt").read_text() == f"clone me {i}\n"
    assert "smudge delay/c0.txt" in (tmp_path / "clone.log").read_text()


def test_failing_clean_fails_git_add_and_keeps_going(repo: Path) -> None:
    (repo / "ok.txt").write_text("fine\n")
    (repo / "fail.txt").write_text("bad\n")
    result = subprocess.run(["git", "add", "."], cwd=repo, capture_output=True)
    assert result.returncode != 0
    assert b"fail.txt" in result.stderr
    git(repo, "add", "ok.txt")  # the filter keeps serving other files
    assert git(repo, "cat-file", "blob", ":ok.txt") == b"svar\n"


def test_failing_smudge_fails_checkout_without_partial_file(repo: Path) -> None:
    (repo / "fail-smudge.txt").write_text("content\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "x")
    (repo / "fail-smudge.txt").unlink()
    result = subprocess.run(
        ["git", "checkout", "--", "fail-smudge.txt"], cwd=repo, capture_output=True
    )
    assert result.returncode != 0
    assert b"fail-smudge.txt" in result.stderr
    # With filter.x.required, git must not write the half-smudged "half" content.
    assert not (repo / "fail-smudge.txt").exists()
