"""Private caches (``gitxet-cache-*`` in the temporary directory) that older versions
named with ``mkdtemp``'s random part alone: the next private cache made removes those that
are left over, and only those (issue: never another live process's)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from gitxet import dataset


def _old(tmp: Path, name: str, age: float) -> Path:
    d = tmp / name
    (d / "nodes").mkdir(parents=True)
    (d / "nodes" / "cache.db").write_bytes(b"x")
    t = time.time() - age
    os.utime(d, (t, t))
    return d


def test_old_style_leftovers_are_removed_and_live_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = _old(tmp_path, "gitxet-cache-abcd_123", 7200)
    open_here = _old(tmp_path, "gitxet-cache-efgh5678", 7200)  # a live process's: open
    fresh = _old(tmp_path, "gitxet-cache-ijkl9012", 60)  # just made: maybe not open yet
    other = _old(tmp_path, "gitxet-cache-notours", 7200)  # not the old pattern
    with open(open_here / "nodes" / "cache.db", "rb"):
        made = Path(dataset._private_cache_dir())
    try:
        assert not gone.exists()
        assert open_here.exists() and fresh.exists() and other.exists()
        assert made.name.startswith(f"gitxet-cache-{os.getpid()}.")
    finally:
        shutil.rmtree(made)


def test_an_old_style_cache_that_is_a_process_directory_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cwd = _old(tmp_path, "gitxet-cache-mnop3456", 7200)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], cwd=cwd, stdin=subprocess.PIPE
    )
    try:
        made = Path(dataset._private_cache_dir())
        assert cwd.exists()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)
    shutil.rmtree(made)
    made = Path(dataset._private_cache_dir())  # the process is gone: now it is a leftover
    assert not cwd.exists()
    shutil.rmtree(made)
