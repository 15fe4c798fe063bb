"""gitxet.remote._sync_only: the HTTP client imports no async library (trio, anyio) and not
httpx's command-line tool."""

from __future__ import annotations

import subprocess
import sys


def test_the_http_client_loads_no_unused_library_and_leaves_them_importable() -> None:
    code = (
        "import sys\n"
        "import gitxet.remote.client\n"
        "import httpx\n"
        "httpx.Client().close()\n"
        "print(sorted(m for m in ('trio', 'anyio', 'httpx._main', 'rich') if m in sys.modules))\n"
        "import trio, anyio\n"  # a mount daemon imports trio itself, after the client
        "print(trio.__name__, anyio.__name__)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert r.stdout.splitlines() == ["[]", "trio anyio"], r.stderr
