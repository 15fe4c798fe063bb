"""tests/helpers/leaks.py: a subprocess left running is found, named with the test that
started it, and stopped and reaped (what the session-end hook does)."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.leaks import _describe, _running, _stop


def test_a_running_subprocess_is_found_named_and_reaped() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert proc in _running()
        said = _describe(proc)
        assert f"pid {proc.pid}" in said
        assert "test_a_running_subprocess_is_found_named_and_reaped" in said
        _stop(proc)
        assert proc.returncode is not None  # reaped: no ResourceWarning when collected
        assert proc not in _running()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
