"""A real ``git xet serve`` process on loopback, tried as an unauthenticated attacker would.

Big and many headers, a slowloris head, a stalled body, hundreds of idle connections, and
non-ASCII values in every signed parameter. The server must answer 4xx (never 500), log no
traceback, stay small, and keep serving a normal client. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from gitxet.server.auth import TokenStore
from tests.helpers.server_env import logged_port, stop_process, wait_port

HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
MAX_CONNECTIONS = 300
XORB = "ab" * 32


@dataclass
class Server:
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    token: str

    def rss(self) -> int:
        """The server's resident set size in bytes."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def log_text(self) -> str:
        return self.log.read_text("utf-8", "replace")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("abuse")
    root = tmp / "root"
    token, _ = TokenStore(str(root)).create("write")
    log = tmp / "serve.log"
    cmd = [
        sys.executable,
        "-m",
        "gitxet",
        "serve",
        "--root",
        str(root),
        "--port",
        "0",
        "--header-timeout",
        str(HEADER_TIMEOUT),
        "--body-timeout",
        str(BODY_TIMEOUT),
        "--max-connections",
        str(MAX_CONNECTIONS),
    ]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    try:
        port = logged_port(log, proc)
        wait_port(port, 60, proc)
        yield Server(f"http://127.0.0.1:{port}", port, proc, log, token)
    finally:
        stop_process(proc)


def _connect(srv: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=10)


def _read_response(s: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes (or ``timeout``)."""
    s.settimeout(timeout)
    out = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError):
        while part := s.recv(65536):
            out += part
    return out


def _status(raw: bytes) -> int:
    assert raw.startswith(b"HTTP/1.1 "), raw[:80]
    return int(raw[9:12])


def _healthy(srv: Server) -> float:
    """Seconds a normal client needs for ``/healthz`` (asserting it succeeds)."""
    t0 = time.monotonic()
    r = httpx.get(f"{srv.url}/healthz", timeout=5)
    assert r.status_code == 200
    return time.monotonic() - t0


def test_huge_header_is_431_and_costs_no_memory(server: Server) -> None:
    before = server.rss()
    s = _connect(server)
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "
    sent = threading.Event()

    def send() -> None:
        with contextlib.suppress(OSError):
            s.sendall(head + b"a" * (10 << 20) + b"\r\n\r\n")
        sent.set()

    t = threading.Thread(target=send, daemon=True)
    t.start()
    raw = _read_response(s)
    t.join(15)
    s.close()
    assert _status(raw) == 431
    assert server.rss() - before < 20 << 20
    assert _healthy(server) < 1.0


def test_too_many_headers_is_431(server: Server) -> None:
    s = _connect(server)
    lines = b"".join(b"X-H%d: v\r\n" % i for i in range(150))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n")
    assert _status(_read_response(s)) == 431
    s.close()


def test_slowloris_is_cut_off_within_the_header_timeout(server: Server) -> None:
    s = _connect(server)
    t0 = time.monotonic()
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 60
    closed_after = None
    for b in head:  # one byte a second until the server hangs up
        try:
            s.send(bytes([b]))
        except OSError:
            closed_after = time.monotonic() - t0
            break
        ready, _, _ = select.select([s], [], [], 1.0)
        if ready:
            data = _read_response(s, 2.0)
            closed_after = time.monotonic() - t0
            assert data == b"" or _status(data) == 408
            break
    s.close()
    assert closed_after is not None, "the server kept a slowloris head open"
    assert closed_after < HEADER_TIMEOUT + 1.5


def test_stalled_body_is_cut_off(server: Server) -> None:
    s = _connect(server)
    t0 = time.monotonic()
    s.sendall(b"POST /v1/telemetry HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
    _read_response(s, BODY_TIMEOUT + 5)
    took = time.monotonic() - t0
    s.close()
    assert took < BODY_TIMEOUT + 1.5


def test_idle_connections_do_not_lock_out_a_client(server: Server) -> None:
    idle: list[socket.socket] = []
    try:
        for _ in range(500):
            idle.append(_connect(server))
        # a half-sent head on some of them too
        for s in idle[:50]:
            s.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert _healthy(server) < 1.0
        assert _healthy(server) < 1.0
    finally:
        for s in idle:
            s.close()


def _signed_route_urls(srv: Server) -> list[str]:
    odd = ["²", "١٢٣", "１２", "é", "\u200b", "9" * 40, "-1", " 1", "0x10", ""]
    urls = []
    for v in odd:
        q = quote(v)
        urls += [
            f"/xorb-data/default/{XORB}?exp={q}&sig=abc",
            f"/xorb-data/default/{XORB}?exp=9999999999&sig={q}",
            f"/xorb-data/default/{quote('ab²' * 21 + 'a')}?exp=9999999999&sig={q}",
        ]
    return urls


def _grant_urls() -> list[str]:
    odd = ["²", "١", "é", "\u00b3", "9" * 40]
    urls = []
    for v in odd:
        q = quote(v)
        urls += [
            f"/xorb-upload/default/{XORB}/gid?len={q}&crc=&exp=9999999999&sig={'A' * 43}",
            f"/xorb-upload/default/{XORB}/gid?len=1&crc={q}&exp=9999999999&sig={'A' * 43}",
            f"/xorb-upload/default/{XORB}/gid?len=1&crc=&exp={q}&sig={'A' * 43}",
            f"/xorb-upload/default/{XORB}/gid?len=1&crc=&exp=9999999999&sig={q}",
            f"/xorb-upload/default/{XORB}/{q}?len=1&crc=&exp=9999999999&sig={'A' * 43}",
        ]
    return urls


def test_non_ascii_parameters_never_500(server: Server) -> None:
    statuses: dict[str, int] = {}
    with httpx.Client(base_url=server.url, timeout=10) as c:
        for url in _signed_route_urls(server):
            statuses[url] = c.get(url).status_code
        for url in _grant_urls():
            statuses[url] = c.put(url, content=b"x").status_code
        auth = {"Authorization": f"Bearer {server.token}"}
        for v in ["²", "١", "é"]:
            statuses[f"batch {v}"] = c.get(
                "/v1/reconstructions", params={"file_id": v}, headers=auth
            ).status_code
    # raw bytes httpx would refuse to send: latin-1 digits in headers (Connection: close,
    # so the server's close ends each read, not the read timeout of a kept-alive connection)
    head = b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    raw_requests = [
        b"GET /v1/reconstructions/"
        + XORB.encode()
        + head
        + b"Authorization: Bearer "
        + server.token.encode()
        + b"\r\nRange: bytes=\xb2-\xb3\r\n\r\n",
        b"GET /v1/file-shards/" + XORB.encode() + head + b"Authorization: Basic \xe9\xe9\r\n\r\n",
        b"GET /data.git/info/refs?service=git-upload-pack"
        + head
        + b"Authorization: Basic \xe9\xe9==\r\n\r\n",
        b"POST /v1/telemetry HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n",
    ]
    for i, req in enumerate(raw_requests):
        s = _connect(server)
        s.sendall(req)
        raw = _read_response(s, 5)
        s.close()
        statuses[f"raw {i}"] = _status(raw)
    bad = {k: v for k, v in statuses.items() if v >= 500}
    assert not bad, bad
    odd = {k: v for k, v in statuses.items() if not 400 <= v < 500}
    assert not odd, odd
    log = server.log_text()
    assert "Traceback" not in log, log[log.find("Traceback") - 300 :][:3000]
    assert "unhandled error" not in log


def test_server_log_has_no_tracebacks_after_the_suite(server: Server) -> None:
    assert _healthy(server) < 1.0
    assert "Traceback" not in server.log_text()
    assert server.proc.poll() is None
    assert os.path.exists(f"/proc/{server.proc.pid}")
