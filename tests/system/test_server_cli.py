"""``git xet serve`` as a process: options wired through, body limit, logs, SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from gitxet.server.auth import TokenStore
from tests.helpers.server_env import free_port, stop_process, wait_port

# The root app registers these commands via gitxet.cli.serve.register; do the same here so
# the test does not depend on the assembly in gitxet/cli/app.py.
_CLI = """
import sys, typer
from gitxet.cli import serve
app = typer.Typer()
serve.register(app)
app(sys.argv[1:])
"""


def test_serve_command(tmp_path: Path) -> None:
    root = tmp_path / "root"
    token, rec = TokenStore(str(root)).create("write")
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CLI,
                "serve",
                "--root",
                str(root),
                "--port",
                str(port),
                "--max-body",
                "1M",
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_port(port, 30, proc)
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
        r = httpx.post(
            f"{url}/v1/xorbs/default/{'ab' * 32}",
            content=bytes(2 << 20),
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 413
        assert httpx.get(f"{url}/data.git/info/refs?service=git-upload-pack").status_code == 401
    finally:
        code = stop_process(proc)
    assert code in (0, -signal.SIGTERM)
    text = log.read_text()
    assert "serving" in text and "local directory" in text
    assert f'"token":"{rec.id}"' in text and token not in text
    assert "Finished server process" in text
