"""``git xet serve`` as a process: options wired through, body limit, logs, SIGTERM."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from gitxet.server.auth import TokenStore
from tests.helpers.server_env import logged_port, stop_process, wait_port

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
                "0",
                "--max-body",
                "1M",
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    try:
        port = logged_port(log, proc)
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


def test_serve_on_port_zero_logs_the_port_it_got(tmp_path: Path) -> None:
    """``--port 0`` picks a free port; the log must say which, or nobody can reach it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI, "serve", "--root", str(tmp_path / "root"), "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    stderr = proc.stderr
    assert stderr is not None

    def pump() -> None:
        for line in stderr:
            lines.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        seen: list[str] = []
        m = None
        deadline = time.monotonic() + 60
        while m is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            seen.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)$", line.rstrip())
        assert m, "".join(seen)
        port = int(m.group(1))
        assert port != 0
        wait_port(port, 30, proc)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").json() == {"status": "ok"}
    finally:
        stop_process(proc)
        reader.join(10)  # the pipe ends with the process
        stderr.close()
