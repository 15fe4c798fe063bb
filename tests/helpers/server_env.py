"""Helpers for the CAS server tests: build uploads from bytes, run servers and an S3 server.

Nothing here mocks the server: :func:`build_upload` makes real xorbs and shards with
gitxet's formats, :class:`S3Server` runs moto's standalone S3 server as a subprocess on a
free loopback port, and :func:`start_server_process` runs ``gitxet.server.run.serve`` in a
real subprocess (uvicorn with its signal handling).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gitxet.chunking import Chunker
from gitxet.formats.shard import FileTerm, XorbInfo, make_file_info, upload_shard_for
from gitxet.formats.xorb import SerializedXorb, serialize_xorb
from gitxet.hashing import file_hash


@dataclass
class Upload:
    """One file as a client would upload it: one xorb and one shard."""

    data: bytes
    file_hash: bytes
    xorb: SerializedXorb
    shard: bytes


def chunk(data: bytes) -> list[bytes]:
    """Xet content-defined chunks of ``data``."""
    ch = Chunker()
    out = [bytes(c) for c in ch.feed(data)]
    out += [bytes(c) for c in ch.finish()]
    return out


def build_upload(data: bytes) -> Upload:
    """The xorb and upload shard hf_xet would send for ``data`` (one xorb, one term)."""
    chunks = chunk(data)
    sx = serialize_xorb(chunks)
    fh = file_hash(list(zip(sx.chunk_hashes, sx.chunk_sizes, strict=True)))
    term = FileTerm(sx.hash, 0, len(chunks), len(data))
    info = make_file_info(fh, [term], [sx.chunk_hashes], hashlib.sha256(data).hexdigest())
    shard = upload_shard_for(
        [info], [XorbInfo.from_chunks(sx.hash, sx.chunk_hashes, sx.chunk_sizes)]
    )
    return Upload(data, fh, sx, shard)


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago: it can be taken again before
    the caller binds it, so only where port 0 cannot be used: third-party servers that do
    not say which port they got (moto), and a mount daemon's ``--metrics`` (``git xet
    mounts`` shows the address asked for). Our servers take ``--port 0``: see
    :func:`logged_port`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: what ``git xet serve`` (and the tier) log once bound: ``listening on http://HOST:PORT``
LISTENING = re.compile(rb"listening on http://(?:\[[^\]]*\]|[^\s:/]+):(\d+)")
#: what they log for ``--metrics ADDR``: ``metrics on http://HOST:PORT/metrics``
METRICS = re.compile(rb"metrics on http://(?:\[[^\]]*\]|[^\s:/]+):(\d+)/metrics")


def logged_port(
    log: str | os.PathLike[str],
    proc: subprocess.Popen[bytes],
    timeout: float = 60.0,
    pattern: re.Pattern[bytes] = LISTENING,
) -> int:
    """The port a server of ours started with ``--port 0`` bound, read from its log file
    (the line is written once the socket listens: connections made after it queue)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError):
            m = pattern.search(Path(log).read_bytes())
            if m:
                return int(m.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening: {log}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {pattern.pattern!r} in {log} after {timeout} s")
        time.sleep(0.05)


def wait_port(
    port: int, timeout: float = 20.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Wait until something accepts connections on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port}")


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> int:
    """SIGTERM (a mount daemon then unmounts, dockerd stops its containers), wait
    ``timeout`` s, then SIGKILL and wait 10 s more; returns the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return int(proc.returncode)


S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class S3Server:
    """moto's standalone S3 server on a free loopback port (a real HTTP process)."""

    def __init__(self, tmp: str) -> None:
        exe = shutil.which("moto_server")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        cmd = (
            [exe, "-H", "127.0.0.1", "-p", str(self.port)]
            if exe
            else [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        )
        self.log = open(os.path.join(tmp, "moto.log"), "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **S3_ENV}
        )
        wait_port(self.port, 30.0, self.proc)

    def make_bucket(self, name: str) -> None:
        import boto3

        c = boto3.client("s3", endpoint_url=self.endpoint, **_boto_kw())
        c.create_bucket(Bucket=name)
        c.close()

    def url(self, bucket: str, prefix: str = "cas") -> str:
        """A ``--storage`` URL for a bucket on this server."""
        return f"s3://{bucket}/{prefix}?endpoint_url={self.endpoint}&region=us-east-1"

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


def _boto_kw() -> dict[str, str]:
    return {
        "aws_access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": S3_ENV["AWS_DEFAULT_REGION"],
    }


_SERVE_CODE = """
import logging, sys
from gitxet.server.run import ServerConfig, serve
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(message)s")
root, port, storage = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None
serve(ServerConfig(root=root, port=port, storage=storage, graceful_timeout=5))
"""


@contextlib.contextmanager
def server_process(root: str, storage: str | None, log_path: str) -> Iterator[str]:
    """Run a server in a subprocess (real uvicorn, real signals); yields its URL."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE_CODE, root, "0", storage or ""],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **S3_ENV},
        )
        try:
            yield f"http://127.0.0.1:{logged_port(log_path, proc)}"
        finally:
            stop_process(proc)


def read_back(client: Any, file_hash_: bytes, byte_range: tuple[int, int] | None = None) -> bytes:
    """A file (or bytes ``[a, b)`` of it) read from a CAS through gitxet's one remote read
    path: :class:`RemoteChunkSource` and :class:`FileReader` over a fresh node cache.
    Every chunk is verified and the file's structure is checked against its hash."""
    import io
    import tempfile

    from gitxet.data.reconstruct import FileReader
    from gitxet.data.remote_source import RemoteChunkSource
    from gitxet.store.nodecache import NodeCache

    with tempfile.TemporaryDirectory() as d:
        cache = NodeCache(os.path.join(d, "ranges"), 1 << 30)
        src = RemoteChunkSource(client, cache, os.path.join(d, "shards"))
        try:
            reader = FileReader(src, file_hash_)
            if byte_range is None:
                out = io.BytesIO()
                reader.copy_to(out)
                return out.getvalue()
            a, b = byte_range
            return reader.read(a, b - a)
        finally:
            src.close()
            cache.close()


class DataServer:
    """A plain HTTP server on 127.0.0.1 serving byte ranges of blobs (``GET path`` with a
    ``Range`` header), like a CAS's signed data URLs; ``fault(path, start, end)`` may
    return ``("status", code)``, ``("cut", n)`` (send the headers of the whole range, then
    only ``n`` bytes and close) or ``None`` (serve normally). Records each request."""

    def __init__(
        self,
        blobs: dict[str, bytes],
        fault: Any = None,
    ) -> None:
        import http.server
        import threading

        self.blobs = blobs
        self.fault = fault
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path
                rng = self.headers.get("Range", "")
                outer.requests.append((path, rng))
                blob = outer.blobs.get(path.split("?")[0])
                if blob is None:
                    self._send(404, b"no such blob")
                    return
                a, _, b = rng.removeprefix("bytes=").partition("-")
                start, end = int(a), int(b) if b else len(blob) - 1
                action = outer.fault(path, start, end) if outer.fault else None
                if action is not None and action[0] == "status":
                    self._send(action[1], b'{"error": "injected"}')
                    return
                body = blob[start : end + 1]
                self.send_response(206)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if action is not None and action[0] == "cut":
                    self.wfile.write(body[: action[1]])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def __enter__(self) -> DataServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(10)
