#!/usr/bin/env python3
"""N readers of one commit through a cache tier, against the same N straight to the origin.

All in one run, on loopback: an origin (`git xet serve --root`, with `--metrics`, whose
`xorb-data` response bytes say what it served), a commit of incompressible files pushed to
it, and a cache tier (`git xet serve --upstream`). Each reader is a separate process with
its own empty node cache reading every file of the commit through `xet://` (fsspec), 8 MiB
at a time, and printing the files' SHA-256 (every copy must be right). Scenarios:

* ``tier cold``: N readers at once through a tier with an empty cache;
* ``origin``: the same N readers straight to the origin (the peer);
* ``tier warm, 1``: one reader alone through the now warm tier (the goal's yardstick);
* ``tier warm, N``: N readers through the warm tier.

Goals (issue 17): through a cold tier the origin serves <= 1.1x the commit's xorb bytes
(the bytes of the xorbs the origin stores), and the N readers' wall time is <= 1.5x that of
one reader alone through a warm tier.

Each row also gives the CPU seconds the readers, the tier and the origin spent, and the
*CPU floor*: those seconds over the machine's CPUs, the least wall time the work could
take here. N readers on N machines would each have their own CPUs; on one machine with
fewer CPUs than readers the N readers' wall is bound by the floor, not by the tier (the
``tier warm, N`` row shows that floor for the same work without any origin fetch).

    flock /work/heavy.lock python bench/fleet.py [--size-mib 1024] [--readers 8] [--dir D]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchlib import drop_caches, free_port, wait_port, work_env

FILE_MIB = 256  # the commit is files of this size (the last one smaller)

READER = r"""
import hashlib, json, sys
import fsspec
repo, names, tier = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
fs = fsspec.filesystem("xet", cas_url=tier or None)
out = {}
for name in names:
    h = hashlib.sha256()
    with fs.open(f"xet://{repo}@main/{name}", "rb") as f:
        while b := f.read(8 << 20):
            h.update(b)
    out[name] = h.hexdigest()
print(json.dumps(out))
"""


def sh(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed: {r.stderr.strip()[-800:]}")
    return r.stdout + r.stderr


class Fleet:
    def __init__(self, work: Path, size: int, readers: int) -> None:
        self.work = work
        self.size = size
        self.readers = readers
        self.env = work_env(work, GITXET_CACHE_DIR=str(work / "cache"))
        self.env.pop("GITXET_CAS_URL", None)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.expected: dict[str, str] = {}
        self.repo = ""
        self.metrics = ""
        self.tier = ""
        self.tier_proc: subprocess.Popen[bytes] | None = None
        self.origin_proc: subprocess.Popen[bytes] | None = None

    # ---- servers ------------------------------------------------------------------------

    def _start(self, argv: list[str], log: str) -> tuple[subprocess.Popen[bytes], int]:
        port = free_port()
        out = open(self.work / log, "ab")  # noqa: SIM115 - the server's, until exit
        proc = subprocess.Popen(
            [*argv, "--port", str(port), "--log-level", "warning"],
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        wait_port(port, proc)
        return proc, port

    def start_origin(self) -> None:
        srv = self.work / "srv"
        tok = self.work / "token"
        if not tok.exists():
            out = sh("git-xet", "token", "create", "--root", str(srv), "--scope", "write")
            tok.write_text(next(w for w in out.split() if w.startswith("gxt_")))
        self.env["GITXET_TOKEN"] = tok.read_text().strip()
        mport = free_port()
        self.origin_proc, port = self._start(
            ["git-xet", "serve", "--root", str(srv), "--metrics", f"127.0.0.1:{mport}"],
            "origin.log",
        )
        self.repo = f"http://127.0.0.1:{port}/data.git"
        self.origin = f"http://127.0.0.1:{port}"
        self.metrics = f"http://127.0.0.1:{mport}/metrics"

    def start_tier(self) -> None:
        cache = self.work / "tier-cache"
        shutil.rmtree(cache, ignore_errors=True)
        argv = ["git-xet", "serve", "--upstream", self.origin, "--cache-dir", str(cache)]
        self.tier_proc, port = self._start([*argv, "--cache-size", "64G"], "tier.log")
        self.tier = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(30)

    def commit_xorb_bytes(self) -> int:
        """Bytes of the xorbs the origin stores (the one commit's)."""
        root = self.work / "srv" / "cas" / "xorbs"
        return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())

    def server_cpu(self) -> tuple[float, float]:
        """CPU seconds the origin and the tier have used so far."""

        def cpu(proc: subprocess.Popen[bytes] | None) -> float:
            if proc is None:
                return 0.0
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        return cpu(self.origin_proc), cpu(self.tier_proc)

    def origin_xorb_bytes(self) -> int:
        """xorb bytes the origin has sent since it started (its Prometheus counter)."""
        text = urllib.request.urlopen(self.metrics, timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith('gitxet_server_response_bytes_total{op="xorb-data"}'):
                return int(float(line.rsplit(" ", 1)[1]))
        return 0

    def tier_stats(self) -> dict[str, int]:
        doc: dict[str, int] = json.loads(
            urllib.request.urlopen(f"{self.tier}/v1/tier-stats", timeout=10).read()
        )
        return doc

    # ---- the commit ---------------------------------------------------------------------

    def build(self) -> None:
        env = self.env
        for k, v in (("user.name", "bench"), ("user.email", "b@b"), ("init.defaultBranch", "main")):
            sh("git", "config", "--global", k, v, env=env)
        sh("git-xet", "install", env=env)
        repo = self.work / "repo"
        stamp = self.work / f"built-{self.size}"
        names: list[str] = []
        left, i = self.size, 0
        while left:
            n = min(left, FILE_MIB << 20)
            names.append(f"part-{i:03d}.bin")
            left -= n
            i += 1
        if not stamp.exists():
            shutil.rmtree(repo, ignore_errors=True)
            sh("git", "init", "-q", str(repo), env=env)
            sh("git-xet", "init", cwd=repo, env=env)
            print(f"writing a {self.size >> 20} MiB commit ...", flush=True)
            rnd = random.Random(1)
            left = self.size
            for name in names:
                n = min(left, FILE_MIB << 20)
                with open(repo / name, "wb") as f:
                    for k in range(0, n, 16 << 20):
                        f.write(rnd.randbytes(min(16 << 20, n - k)))
                left -= n
            sh("git-xet", "add", ".", cwd=repo, env=env)
            sh("git", "commit", "-qm", "data", cwd=repo, env=env)
        if "origin" in sh("git", "remote", cwd=repo, env=env).split():
            sh("git", "remote", "set-url", "origin", self.repo, cwd=repo, env=env)
        else:
            sh("git", "remote", "add", "origin", self.repo, cwd=repo, env=env)
        print("pushing ...", flush=True)
        sh("git", "push", "-q", "origin", "main", cwd=repo, env=env)
        stamp.write_text("")
        for name in names:
            h = hashlib.sha256()
            with open(repo / name, "rb") as f:
                while b := f.read(8 << 20):
                    h.update(b)
            self.expected[name] = h.hexdigest()

    # ---- readers --------------------------------------------------------------------------

    def read(self, n: int, tier: str, tag: str) -> float:
        """Wall seconds for ``n`` cold readers at once (each checks every file's hash)."""
        dirs = [self.work / f"reader-{tag}-{i}" for i in range(n)]
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        drop_caches(quiet=True)
        names = ",".join(self.expected)
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", READER, self.repo, names, tier],
                env=dict(self.env, GITXET_CACHE_DIR=str(d)),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for d in dirs
        ]
        for p in procs:
            out, err = p.communicate(timeout=3600)
            if p.returncode != 0:
                sys.exit(f"a reader failed: {err.strip()[-800:]}")
            if json.loads(out.strip().splitlines()[-1]) != self.expected:
                sys.exit("a reader got different bytes")
        wall = time.perf_counter() - t0
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="gitxet-fleetbench-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    n = args.readers
    f = Fleet(work, args.size_mib << 20, n)
    f.start_origin()
    rows: list[tuple[str, float, int, float, float, float]] = []
    try:
        f.build()
        f.start_tier()
        commit = f.commit_xorb_bytes()

        def run(label: str, readers: int, tier: str, tag: str) -> None:
            print(f"{label} ...", flush=True)
            before = f.origin_xorb_bytes()
            cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            o0, t0 = f.server_cpu()
            wall = f.read(readers, tier, tag)
            cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            o1, t1 = f.server_cpu()
            rcpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
            served = f.origin_xorb_bytes() - before
            rows.append((label, wall, served, rcpu, t1 - t0, o1 - o0))

        run(f"{n} readers, tier cold", n, f.tier, "cold")
        stats = f.tier_stats()
        run(f"{n} readers, origin", n, "", "origin")
        run("1 reader, tier warm", 1, f.tier, "warm1")
        run(f"{n} readers, tier warm", n, f.tier, "warmn")
    finally:
        f.stop()
    mib = f.size / (1 << 20)
    cpus = os.cpu_count() or 1
    print(
        f"\n{n} readers x {mib:.0f} MiB commit ({commit / (1 << 20):.0f} MiB of xorbs), "
        f"loopback, {cpus} CPUs\n"
    )
    print(
        "| scenario | wall s | MiB/s per reader | origin served | x commit "
        "| CPU s readers / tier / origin | CPU floor s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, wall, served, rcpu, tcpu, ocpu in rows:
        print(
            f"| {label} | {wall:.1f} | {mib / wall:.0f} "
            f"| {served / (1 << 20):.0f} MiB | {served / commit:.2f} "
            f"| {rcpu:.1f} / {tcpu:.1f} / {ocpu:.1f} | {(rcpu + tcpu + ocpu) / cpus:.1f} |"
        )
    cold, origin, warm1, warmn = rows
    print(
        f"\norigin bytes, tier cold vs straight: {cold[2] / commit:.2f}x vs "
        f"{origin[2] / commit:.2f}x the commit's xorbs (goal <= 1.1x through the tier)"
    )
    print(
        f"wall, {n} through a cold tier / 1 through a warm tier: {cold[1] / warm1[1]:.2f}x "
        f"(goal <= 1.5x); / {n} through a warm tier (the same reads, no origin): "
        f"{cold[1] / warmn[1]:.2f}x; {n} straight to the origin / {n} through a cold tier: "
        f"{origin[1] / cold[1]:.2f}x"
    )
    print(
        f"tier after the cold run: {stats['origin_requests']} origin requests, "
        f"{stats['hits']} hits, {stats['misses']} misses, "
        f"{stats['served_bytes'] / (1 << 20):.0f} MiB served"
    )


if __name__ == "__main__":
    main()
