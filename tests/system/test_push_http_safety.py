"""Pushes over HTTP that cannot lose data (issue 13): hooks in plain clones, and a push to a
CAS that stops answering is interrupted at once, leaving no ref and no temp file."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig

pytestmark = pytest.mark.timeout(300)


def run(
    *args: str, cwd: Path, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        list(args), cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    if check and r.returncode != 0:
        raise AssertionError(f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture(autouse=True)
def gitxet_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GITXET_STATE_DIR", str(tmp_path / "state"))


class Stall:
    """A hung CAS: accepts connections and never answers, except (``answer_gets``) a 404
    to each GET, so the client believes it lacks every xorb and starts uploading."""

    def __init__(self, answer_gets: bool) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.answer_gets = answer_gets
        self.stalled = threading.Event()  # a request is hanging
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.conns.append(conn)
                threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                if not (self.answer_gets and head.startswith(b"GET ")):
                    self.stalled.set()
                    while conn.recv(1 << 20):  # swallow the body, answer nothing, ever
                        pass
                    return
                conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.sock.close()


def test_plain_http_clone_gets_the_hook_and_a_plain_push_uploads(tmp_path: Path) -> None:
    root = tmp_path / "srv"
    token, _ = TokenStore(str(root)).create("write")
    tok = {"GITXET_TOKEN": token}
    with BackgroundServer(ServerConfig(root=str(root), port=0)) as srv:
        url = f"http://user:{token}@{srv.url.removeprefix('http://')}/data.git"
        work = tmp_path / "work"
        run("git", "init", "-q", str(work), cwd=tmp_path)
        run("git-xet", "init", cwd=work)
        (work / "a.bin").write_bytes(random.Random(1).randbytes(700_000))
        run("git", "add", ".", cwd=work)
        run("git", "commit", "-qm", "one", cwd=work)
        run("git", "remote", "add", "origin", url, cwd=work)
        run("git", "push", "-q", "origin", "main", cwd=work, env=tok)

        run("git-xet", "install", cwd=tmp_path)
        plain = tmp_path / "plain"
        run("git", "clone", "-q", url, str(plain), cwd=tmp_path, env=tok)
        assert b"# gitxet hook" in (plain / ".git" / "hooks" / "pre-push").read_bytes()
        new = random.Random(2).randbytes(3 << 20)
        (plain / "new.bin").write_bytes(new)
        run("git", "add", "new.bin", cwd=plain)
        run("git", "commit", "-qm", "new", cwd=plain)
        run("git", "push", "-q", "origin", "main", cwd=plain, env=tok)

        third = tmp_path / "third"
        run("git", "clone", "-q", url, str(third), cwd=tmp_path, env=tok)
        assert (third / "new.bin").read_bytes() == new


@pytest.fixture(params=["silent", "uploads-hang"])
def stalled_push(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Path, str, dict[str, str], Path, Stall]]:
    """(work repo, remote URL, env, private TMPDIR, the stall): git is served, the CAS
    never answers (anything, or the uploads)."""
    stall = Stall(answer_gets=request.param == "uploads-hang")
    root = tmp_path / "srv"
    token, _ = TokenStore(str(root)).create("write")
    cfg = ServerConfig(root=str(root), port=0, public_url=stall.url)
    try:
        with BackgroundServer(cfg) as srv:
            url = f"http://user:{token}@{srv.url.removeprefix('http://')}/data.git"
            work = tmp_path / "work"
            run("git", "init", "-q", str(work), cwd=tmp_path)
            run("git-xet", "init", cwd=work)
            for i in range(3):
                (work / f"f{i}.bin").write_bytes(random.Random(i).randbytes(2 << 20))
            run("git", "add", ".", cwd=work)
            run("git", "commit", "-qm", "data", cwd=work)
            run("git", "remote", "add", "origin", url, cwd=work)
            tmp = tmp_path / "tmp"
            tmp.mkdir()
            env = {**os.environ, "GITXET_TOKEN": token, "TMPDIR": str(tmp)}
            yield work, url, env, tmp, stall
    finally:
        stall.close()


def _session_pids(sid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, ValueError):
                if os.getsid(int(d.name)) == sid:
                    pids.append(int(d.name))
    return pids


def _pre_push_pid(sid: int) -> int | None:
    for pid in _session_pids(sid):
        with contextlib.suppress(OSError):
            if b"pre-push" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    return None


def _start_push(work: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["git", "push", "origin", "main"],
        cwd=work,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _wait_stalled(p: subprocess.Popen[bytes], stall: Stall) -> None:
    """Wait until the push hangs on the CAS."""
    while not stall.stalled.wait(0.05):
        assert p.poll() is None, p.stderr.read() if p.stderr else ""


def _assert_clean_abort(
    p: subprocess.Popen[bytes], sent: float, work: Path, url: str, tmp: Path
) -> None:
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        assert p.stderr is not None
        with p.stderr:
            err = p.stderr.read().decode()
        raise AssertionError(f"the push was still running 5 s after the signal: {err}") from None
    took = time.monotonic() - sent
    assert p.stderr is not None
    with p.stderr:
        err = p.stderr.read().decode()
    assert p.returncode != 0, err
    assert "Traceback" not in err, err
    assert took < 5, took
    end = time.monotonic() + 5
    while _session_pids(p.pid) and time.monotonic() < end:
        time.sleep(0.05)
    assert _session_pids(p.pid) == [], "a process of the push outlived it"
    assert run("git", "ls-remote", url, cwd=work).stdout.strip() == ""
    assert list(tmp.iterdir()) == []
    assert list((work / ".git" / "xet" / "tmp").iterdir()) == []


Stalled = tuple[Path, str, dict[str, str], Path, Stall]


def test_sigint_to_a_stalled_push_aborts_it(stalled_push: Stalled) -> None:
    work, url, env, tmp, stall = stalled_push
    p = _start_push(work, env)
    _wait_stalled(p, stall)
    sent = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    _assert_clean_abort(p, sent, work, url, tmp)


def test_sigterm_to_the_hook_fails_the_push(stalled_push: Stalled) -> None:
    work, url, env, tmp, stall = stalled_push
    p = _start_push(work, env)
    _wait_stalled(p, stall)
    hook = _pre_push_pid(p.pid)
    assert hook is not None
    sent = time.monotonic()
    os.kill(hook, signal.SIGTERM)  # only the hook: git must see it fail and update nothing
    _assert_clean_abort(p, sent, work, url, tmp)
    # and `git xet push` (the upload runs in-process) honours one Ctrl-C as well
    p = subprocess.Popen(
        ["git-xet", "push", "origin", "main"],
        cwd=work,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    stall.stalled.clear()
    _wait_stalled(p, stall)
    sent = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)
    _assert_clean_abort(p, sent, work, url, tmp)
