"""The Docker volume plugin (the real `git xet docker-plugin` process) with volumes of a real
`git xet serve` over HTTP: a volume's own token opens it; none, or a wrong one, is a clear
error at Create, before anything is mounted.

Issue 6 promised both plugins open http(s) repositories with the volume's token; the CSI
plugin did, but the Docker plugin resolved every volume with the local-only resolver, so
each http(s) volume was refused at Create ("http(s) repositories need server access
settings") whatever its token.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig
from tests.helpers.fuse_env import mountinfo_has, require_fuse
from tests.helpers.proc import git, run, use_interpreter
from tests.helpers.server_env import stop_process
from tests.unit.test_docker_plugin import UnixHTTPConnection

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]

STEP = 30.0


class DockerPlugin:
    """`git-xet docker-plugin` as a subprocess and a client for its socket."""

    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "plugin-state"
        self.sock = str(tmp / "plugin.sock")
        self.log = tmp / "plugin.log"
        # the plugin's own environment carries no token: a volume brings its own
        env = {k: v for k, v in os.environ.items() if k != "GITXET_TOKEN"}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                ["git-xet", "docker-plugin", "--socket", self.sock, "--state-dir", str(self.state)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + STEP
        while not os.path.exists(self.sock):
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def call(self, endpoint: str, **body: Any) -> dict[str, Any]:
        conn = UnixHTTPConnection(self.sock)
        conn.timeout = 90
        try:
            conn.request("POST", endpoint, body=json.dumps(body).encode())
            answer = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        assert isinstance(answer, dict)
        return answer

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, bytes]]:
    """(repo URL without credentials, write token, the committed big file's bytes)."""
    require_fuse()
    use_interpreter(monkeypatch, tmp_path)
    monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "srv"
    token, _ = TokenStore(str(root)).create("write")
    with BackgroundServer(ServerConfig(root=str(root), port=0)) as s:
        url = f"{s.url}/data.git"
        work = tmp_path / "work"
        git("init", "-q", str(work), cwd=tmp_path)
        run("git-xet", "init", cwd=work)
        big = random.Random(61).randbytes(1 << 20)
        (work / "big.bin").write_bytes(big)
        run("git-xet", "track", "*.bin", cwd=work)
        run("git-xet", "add", ".", cwd=work)
        git("commit", "-qm", "v1", cwd=work)
        authed = url.replace("http://", f"http://user:{token}@")
        run("git", "push", "-q", authed, "main", cwd=work, env={"GITXET_TOKEN": token})
        yield url, token, big


def test_docker_volumes_of_an_http_server_open_with_their_own_token(
    served: tuple[str, str, bytes], tmp_path: Path
) -> None:
    url, token, big = served
    plugin = DockerPlugin(tmp_path)
    target = ""
    try:
        for name, opts in (("none", {}), ("wrong", {"token": "gxt_not-a-token"})):
            err = plugin.call(
                "/VolumeDriver.Create", Name=name, Opts={"repo": url, "commit": "main", **opts}
            )
            assert "refused the credentials" in err.get("Err", ""), err
            assert "\n" not in err["Err"] and "Traceback" not in err["Err"]
        ok = plugin.call(
            "/VolumeDriver.Create",
            Name="data",
            Opts={"repo": url, "commit": "main", "token": token},
        )
        assert ok.get("Err", "") == "", ok
        mounted = plugin.call("/VolumeDriver.Mount", Name="data", ID="c1")
        assert mounted.get("Err", "") == "", mounted
        target = mounted["Mountpoint"]
        assert Path(target, "big.bin").read_bytes() == big
        assert plugin.call("/VolumeDriver.Unmount", Name="data", ID="c1").get("Err", "") == ""
        assert not mountinfo_has(target)
        assert plugin.call("/VolumeDriver.Remove", Name="data").get("Err", "") == ""
        assert token not in plugin.log.read_text()
    finally:
        if target and mountinfo_has(target):
            with contextlib.suppress(Exception):
                plugin.call("/VolumeDriver.Unmount", Name="data", ID="c1")
        plugin.stop()
        if target and mountinfo_has(target):
            subprocess.run(["git-xet", "unmount", target], capture_output=True, check=False)
