"""A tree can name files with a newline, a terminal escape sequence or bytes that are not
UTF-8 (git stores any bytes). Every listing and error of ``git xet`` shows such a path
quoted, as git does, so a line stays a line and the terminal never acts on the name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gitxet.formats.pointer import Pointer
from gitxet.util.shown import one_line, shown

pytestmark = pytest.mark.timeout(300)

NAMES = [b"evil\x1b]0;owned\x07.bin", b"two\nlines.bin", b"bad\xff.bin", b'q"uo\\te.bin']
SHOWN = ['"evil\\x1b]0;owned\\a.bin"', '"two\\nlines.bin"', '"bad\\xff.bin"', '"q\\"uo\\\\te.bin"']


def test_shown_and_one_line() -> None:
    assert [shown(os.fsdecode(n)) for n in NAMES] == SHOWN
    assert shown("data/ünïcode ok.bin") == "data/ünïcode ok.bin"  # printable: as it is
    assert one_line("a\nb\x1b[2J\udcff") == "a\\nb\\x1b[2J\\xff"
    assert one_line("plain: ok") == "plain: ok"


def run(cwd: Path, *args: str | bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(args), cwd=cwd, capture_output=True, timeout=120)


def test_listings_and_errors_quote_hostile_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    work = tmp_path / "work"
    assert run(tmp_path, "git", "init", "-q", str(work)).returncode == 0
    assert run(work, "git-xet", "init").returncode == 0
    # a pointer to data nobody has, committed under each name (git never checks names out
    # here: the entries go straight into the index)
    ptr = Pointer(sha256="ab" * 32, size=5_000_000, xet_hash="cd" * 32).encode()
    blob = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"], cwd=work, input=ptr, capture_output=True
    ).stdout.strip()
    for name in NAMES:
        info = b"100644," + blob + b"," + name
        assert run(work, "git", "update-index", "--add", "--cacheinfo", info).returncode == 0
    assert run(work, "git", "commit", "-qm", "names").returncode == 0

    listed = run(work, "git-xet", "ls-files")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.decode().splitlines()
    assert sorted(line.split(" ", 2)[2] for line in lines) == sorted(SHOWN)

    status = run(work, "git-xet", "status")
    assert status.returncode == 0, status.stderr
    for want in SHOWN:
        assert f"  pointer       {want} (5,000,000 bytes)" in status.stdout.decode()

    fsck = run(work, "git-xet", "fsck")
    assert fsck.returncode == 4
    for want in SHOWN:
        assert f"missing  {want}: not in the local store" in fsck.stdout.decode()

    checkout = run(work, "git-xet", "checkout")
    assert checkout.returncode != 0
    err = checkout.stderr.decode("utf-8", "replace")
    assert len(err.splitlines()) <= 2, err  # the error and at most a hint
    for out in (listed, status, fsck, checkout):
        raw = out.stdout + out.stderr
        assert b"\x1b" not in raw and b"\x07" not in raw and b"\xff" not in raw
        assert b"two\nlines" not in raw
