"""The generated CLI reference must match the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cli_reference_is_current() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_cli_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr


def test_version_names_the_chunker() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "gitxet", "--version"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0
    assert "chunker: native (C)" in r.stdout or "chunker: pure Python" in r.stdout


def test_usage_errors_are_one_line_not_tracebacks(tmp_path: Path) -> None:
    for args in (
        ["hash", str(tmp_path / "missing")],
        ["bogus"],
        ["mount"],
        ["hash", str(tmp_path)],
    ):
        r = subprocess.run(
            [sys.executable, "-m", "gitxet", *args], capture_output=True, text=True, timeout=60
        )
        assert r.returncode != 0
        assert "Traceback" not in r.stderr
