"""Ranged xorb GETs: gitxet's CAS server (uvicorn) against nginx serving the same files.

    python bench/server.py [--seconds 5] [--clients 16] [--xorbs 8] [--xorb-mib 32]

Builds ``--xorbs`` xorbs of incompressible chunks in a temporary server root, starts the
server (``gitxet.server.run.serve``, one process, as ``git xet serve`` runs) and nginx
(Debian's, on a free loopback port with a temporary config whose ``alias`` points at the
same stored xorb files), then runs the same load against each in turn: ``--clients``
threads in a separate process, each doing keep-alive ``GET``s with a random chunk-aligned
``Range`` of 1-64 chunks (~64 KiB to ~8 MiB, as reconstruction fetch entries are), for
``--seconds``. The server is sent signed data URLs exactly like hf_xet receives them.
Prints MB/s for both and the ratio (goal: >= 0.5x nginx).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap

from benchlib import free_port, wait_port

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gitxet.formats.xorb import Scheme, serialize_xorb
from gitxet.hashing import to_hex
from gitxet.server.backends import LocalBackend
from gitxet.server.index import xorb_key
from gitxet.server.service import CasService
from gitxet.server.signing import UrlSigner, load_or_create_key

CHUNK = 64 * 1024

# The load generator runs in its own process so that it does not share a GIL with the
# server under test. It prints one JSON line: bytes received, requests, errors.
CLIENT = textwrap.dedent(
    """
    import http.client, json, random, sys, threading, time
    from urllib.parse import urlsplit
    spec = json.loads(sys.stdin.read())
    stop = time.monotonic() + spec["seconds"]
    totals = {"bytes": 0, "requests": 0, "errors": 0}
    lock = threading.Lock()
    def worker(seed):
        rnd = random.Random(seed)
        conns = {}
        got = n = err = 0
        while time.monotonic() < stop:
            target = rnd.choice(spec["targets"])
            offs = target["offsets"]
            a = rnd.randrange(len(offs) - 1)
            b = min(len(offs) - 1, a + rnd.randint(1, 64))
            u = urlsplit(target["url"])
            c = conns.get(u.netloc)
            if c is None:
                c = conns[u.netloc] = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
            path = u.path + ("?" + u.query if u.query else "")
            try:
                c.request("GET", path, headers={"Range": f"bytes={offs[a]}-{offs[b] - 1}"})
                r = c.getresponse()
                body = r.read()
                if r.status != 206 or len(body) != offs[b] - offs[a]:
                    err += 1
                got += len(body)
                n += 1
            except OSError:
                err += 1
                conns.pop(u.netloc).close()
        with lock:
            totals["bytes"] += got; totals["requests"] += n; totals["errors"] += err
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(spec["clients"])]
    t0 = time.monotonic()
    for t in ts: t.start()
    for t in ts: t.join()
    totals["seconds"] = time.monotonic() - t0
    print(json.dumps(totals))
    """
)

SERVE = textwrap.dedent(
    """
    import sys
    from gitxet.server.run import ServerConfig, serve
    serve(ServerConfig(root=sys.argv[1], port=int(sys.argv[2])))
    """
)

NGINX_CONF = """
daemon off;
worker_processes {workers};
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    client_body_temp_path {tmp}/nginx-body;
    proxy_temp_path {tmp}/nginx-proxy;
    fastcgi_temp_path {tmp}/nginx-fastcgi;
    uwsgi_temp_path {tmp}/nginx-uwsgi;
    scgi_temp_path {tmp}/nginx-scgi;
    server {{
        listen 127.0.0.1:{port};
        location /xorb-data/default/ {{
            alias {xorbs}/;
            default_type application/octet-stream;
        }}
    }}
}}
"""


def build(root: str, count: int, mib: int) -> tuple[list[tuple[str, list[int]]], LocalBackend]:
    backend = LocalBackend(os.path.join(root, "cas"), durable=False)
    service = CasService(backend)
    rnd = random.Random(1)
    out = []
    for _ in range(count):
        chunks = [rnd.randbytes(CHUNK) for _ in range(mib * 1024 * 1024 // CHUNK)]
        sx = serialize_xorb(chunks, scheme=Scheme.NONE)
        service.put_xorb(sx.hash, sx.body)
        out.append((to_hex(sx.hash), sx.byte_offsets))
    return out, backend


def run_load(targets: list[dict[str, object]], clients: int, seconds: float) -> dict[str, float]:
    spec = json.dumps({"targets": targets, "clients": clients, "seconds": seconds})
    r = subprocess.run(
        [sys.executable, "-c", CLIENT], input=spec.encode(), capture_output=True, check=True
    )
    res: dict[str, float] = json.loads(r.stdout)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--xorbs", type=int, default=8)
    ap.add_argument("--xorb-mib", type=int, default=32)
    ap.add_argument("--nginx-workers", default="auto")
    args = ap.parse_args()
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx):
        raise SystemExit("nginx not found (apt-get install nginx-light)")

    tmp = tempfile.mkdtemp(prefix="gitxet-bench-")
    os.chmod(tmp, 0o755)  # nginx workers run as an unprivileged user
    procs: list[subprocess.Popen[bytes]] = []
    try:
        print(f"building {args.xorbs} xorbs of {args.xorb_mib} MiB ...", flush=True)
        xorbs, backend = build(tmp, args.xorbs, args.xorb_mib)
        signer = UrlSigner(load_or_create_key(backend), ttl=3600)

        port = free_port()
        log = open(os.path.join(tmp, "server.log"), "wb")  # noqa: SIM115
        procs.append(
            subprocess.Popen([sys.executable, "-c", SERVE, tmp, str(port)], stdout=log, stderr=log)
        )
        wait_port(port, procs[-1])

        nport = free_port()
        xorb_dir = os.path.dirname(backend.local_path(xorb_key(bytes(32))) or "")
        conf = os.path.join(tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write(
                NGINX_CONF.format(tmp=tmp, port=nport, xorbs=xorb_dir, workers=args.nginx_workers)
            )
        procs.append(subprocess.Popen([nginx, "-c", conf, "-p", tmp], stderr=subprocess.DEVNULL))
        wait_port(nport, procs[-1])

        ours = [
            {
                "url": f"http://127.0.0.1:{port}/xorb-data/default/{hx}?{signer.data_query(hx)}",
                "offsets": offs,
            }
            for hx, offs in xorbs
        ]
        theirs = [
            {"url": f"http://127.0.0.1:{nport}/xorb-data/default/{hx}", "offsets": offs}
            for hx, offs in xorbs
        ]
        results = {}
        for name, targets in (("gitxet", ours), ("nginx", theirs)):
            run_load(targets, args.clients, 1.0)  # warm-up: page cache, connections
            res = run_load(targets, args.clients, args.seconds)
            mbps = res["bytes"] / res["seconds"] / 1e6
            results[name] = mbps
            print(
                f"{name:>7}: {mbps:8.1f} MB/s  {res['requests'] / res['seconds']:7.1f} req/s  "
                f"errors {int(res['errors'])}",
                flush=True,
            )
        print(
            f"  ratio: {results['gitxet'] / results['nginx']:.2f}x nginx "
            f"({args.clients} clients, ranges of 1-64 x 64 KiB chunks)"
        )
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
