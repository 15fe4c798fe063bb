"""git-xet raises its soft open-file limit to the hard limit at start."""

from __future__ import annotations

import resource
import subprocess
import sys


def _limits_after(soft: int, hard: int) -> tuple[int, int]:
    code = (
        "import resource\n"
        "from gitxet.cli.entry import raise_open_file_limit\n"
        "raise_open_file_limit()\n"
        "print(*resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    out = subprocess.run(
        [sys.executable, "-c", code], preexec_fn=limit, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    a, b = out.stdout.split()
    return int(a), int(b)


def test_soft_limit_goes_up_to_the_hard_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    assert _limits_after(256, top) == (top, top)


def test_never_lowered() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = 1024 if hard == resource.RLIM_INFINITY else min(hard, 1024)
    assert _limits_after(top, top) == (top, top)
